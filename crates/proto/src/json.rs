//! Strict JSON, for every JSON text Zygo reads from outside: MCP messages, the lines an
//! agent and its request processes write, events.
//!
//! Trust: none. The text may come from any MCP client, any caller, or a handler that has
//! been taken over.
//!
//! This is serde_json — its numbers, its strings, its refusal of anything after the value,
//! its nesting limit of [`MAX_DEPTH`] — with one refusal added: an object that names the
//! same key twice, at any depth, is an error (`duplicate key "id" at line 1 column 21`).
//! JSON leaves duplicates to the reader, and serde_json keeps the last one, so two readers
//! of one text can disagree about what it says: a check that reads the first `id`, an
//! answer that uses the last. Keys are compared as decoded, so `"a"` and `"\u0061"` are
//! the same key.
//!
//! How: the deserializer is wrapped, so that every object it shows the target type is read
//! through a map access that records each key as it is decoded and refuses one already
//! seen. The wrapping follows every value down, including values the target type skips
//! (serde_json would pass over them unread, so here they are walked) and values it buffers
//! first (internally tagged enums, `serde_json::Value`).
//!
//! Cost, measured against serde_json alone (release build, into a `Value`): a 100-byte
//! agent line takes ~0.65 µs instead of ~0.55; a 7 MB object of 200 000 keys, each with
//! two small objects, about twice as long (~0.4 s instead of ~0.2).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};
use serde::Deserialize;

pub use serde_json::Error;

/// How deeply arrays and objects may nest. This is serde_json's recursion limit, which no
/// parse here turns off: deeper input is an error, never a stack overflow.
pub const MAX_DEPTH: usize = 127;

/// The most characters of a duplicated key quoted in an error.
const KEY_IN_ERROR: usize = 64;
/// Up to this many keys, an object's keys are kept in a list rather than a hash set.
const FEW_KEYS: usize = 16;

/// Parse one JSON text into `T`, refusing an object with a duplicate key at any depth.
pub fn from_slice_strict<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, Error> {
    strict(serde_json::Deserializer::from_slice(bytes))
}

/// [`from_slice_strict`] for text that is already known to be UTF-8.
pub fn from_str_strict<'de, T: Deserialize<'de>>(text: &'de str) -> Result<T, Error> {
    strict(serde_json::Deserializer::from_str(text))
}

fn strict<'de, R, T>(mut de: serde_json::Deserializer<R>) -> Result<T, Error>
where
    R: serde_json::de::Read<'de>,
    T: Deserialize<'de>,
{
    let value = T::deserialize(Strict(&mut de))?;
    // Only whitespace may follow the value, as in serde_json::from_slice.
    de.end()?;
    Ok(value)
}

// --- Values --------------------------------------------------------------------------------

/// A deserializer whose every object goes through [`Map`].
struct Strict<D>(D);

/// Forwards `deserialize_*` methods to the wrapped deserializer, with the visitor wrapped.
macro_rules! forward_deserialize {
    (|$self:ident, $visitor:ident| $call:expr => $wrapped:expr;
     $($method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $method<V: Visitor<'de>>(
            $self,
            $($arg: $ty,)*
            $visitor: V,
        ) -> Result<V::Value, Self::Error> {
            $call.$method($($arg,)* $wrapped)
        }
    )*};
}

/// Every `deserialize_*` method but `deserialize_ignored_any`, with its arguments.
macro_rules! deserialize_methods {
    ($callback:ident!($($prefix:tt)*)) => {
        $callback! {
            $($prefix)*
            deserialize_any();
            deserialize_bool();
            deserialize_i8();
            deserialize_i16();
            deserialize_i32();
            deserialize_i64();
            deserialize_i128();
            deserialize_u8();
            deserialize_u16();
            deserialize_u32();
            deserialize_u64();
            deserialize_u128();
            deserialize_f32();
            deserialize_f64();
            deserialize_char();
            deserialize_str();
            deserialize_string();
            deserialize_bytes();
            deserialize_byte_buf();
            deserialize_option();
            deserialize_unit();
            deserialize_unit_struct(name: &'static str);
            deserialize_newtype_struct(name: &'static str);
            deserialize_seq();
            deserialize_tuple(len: usize);
            deserialize_tuple_struct(name: &'static str, len: usize);
            deserialize_map();
            deserialize_struct(name: &'static str, fields: &'static [&'static str]);
            deserialize_enum(name: &'static str, variants: &'static [&'static str]);
            deserialize_identifier();
        }
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    deserialize_methods!(forward_deserialize!(|self, visitor| self.0 => Wrap(visitor);));

    /// serde_json passes over an ignored value without showing it to the visitor, so an
    /// object inside it would go unchecked: it is walked like any other value instead.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(Wrap(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// Forwards `visit_*` methods that take a plain value.
macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.0.$method(v)
        }
    )*};
}

/// A visitor that hands on what it is shown, with every nested value wrapped.
struct Wrap<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }

    forward_visit! {
        visit_bool(bool);
        visit_i8(i8);
        visit_i16(i16);
        visit_i32(i32);
        visit_i64(i64);
        visit_i128(i128);
        visit_u8(u8);
        visit_u16(u16);
        visit_u32(u32);
        visit_u64(u64);
        visit_u128(u128);
        visit_f32(f32);
        visit_f64(f64);
        visit_char(char);
        visit_str(&str);
        visit_borrowed_str(&'de str);
        visit_string(String);
        visit_bytes(&[u8]);
        visit_borrowed_bytes(&'de [u8]);
        visit_byte_buf(Vec<u8>);
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_some(Strict(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_newtype_struct(Strict(d))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(Seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(Map {
            inner: map,
            keys: Keys::default(),
        })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.0.visit_enum(Enum(data))
    }
}

/// A seed whose value is read through [`Strict`].
struct Seed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Strict(d))
    }
}

/// An array's elements, each read through [`Strict`].
struct Seq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Seq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

/// An object: each key is recorded as it is decoded (a second one is an error), each value
/// is read through [`Strict`].
struct Map<'de, A> {
    inner: A,
    keys: Keys<'de>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Map<'de, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.inner.next_key_seed(KeySeed {
            seed,
            keys: &mut self.keys,
        })
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.inner.next_value_seed(Seed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// An enum (`"Variant"` or `{"Variant": ...}`): its content read through [`Strict`].
struct Enum<A>(A);

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Enum<A> {
    type Error = A::Error;
    type Variant = Variant<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Variant<A::Variant>), A::Error> {
        let (value, variant) = self.0.variant_seed(Seed(seed))?;
        Ok((value, Variant(variant)))
    }
}

struct Variant<A>(A);

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Variant<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Seed(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Wrap(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Wrap(visitor))
    }
}

// --- Keys ----------------------------------------------------------------------------------

/// The keys of one object so far, as decoded: borrowed from the input where they have no
/// escapes. A small object's are compared one by one; past [`FEW_KEYS`] they go into a hash
/// set (std's, whose random seed keeps chosen keys from colliding).
#[derive(Default)]
struct Keys<'de> {
    few: Vec<Cow<'de, [u8]>>,
    many: HashSet<Cow<'de, [u8]>>,
}

impl<'de> Keys<'de> {
    fn insert<E: de::Error>(&mut self, key: Cow<'de, [u8]>) -> Result<(), E> {
        let seen = if self.many.is_empty() {
            self.few.contains(&key)
        } else {
            self.many.contains(&key)
        };
        if seen {
            return Err(E::custom(DuplicateKey(&key)));
        }
        if !self.many.is_empty() {
            self.many.insert(key);
        } else if self.few.len() < FEW_KEYS {
            self.few.push(key);
        } else {
            self.many.extend(self.few.drain(..));
            self.many.insert(key);
        }
        Ok(())
    }
}

/// `duplicate key "id"`: the key escaped (no control character reaches a log or a
/// terminal) and cut short if long.
struct DuplicateKey<'a>(&'a [u8]);

impl fmt::Display for DuplicateKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let text = String::from_utf8_lossy(self.0);
        let mut chars = text.chars();
        let quoted: String = chars.by_ref().take(KEY_IN_ERROR).collect();
        write!(f, "duplicate key {quoted:?}")?;
        if chars.next().is_some() {
            write!(f, "… ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

/// The seed of one key: whatever the key decodes to is recorded in its object's [`Keys`].
struct KeySeed<'k, 'de, S> {
    seed: S,
    keys: &'k mut Keys<'de>,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<'_, 'de, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(KeyDe {
            de: d,
            keys: self.keys,
        })
    }
}

/// The deserializer of one key.
struct KeyDe<'k, 'de, D> {
    de: D,
    keys: &'k mut Keys<'de>,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for KeyDe<'_, 'de, D> {
    type Error = D::Error;

    deserialize_methods!(forward_deserialize!(
        |self, visitor| self.de => KeyVisitor { visitor, keys: self.keys };
    ));

    /// A key must be decoded to be recorded, even when its value is of no interest.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.de.deserialize_any(KeyVisitor {
            visitor,
            keys: self.keys,
        })
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

/// Forwards `visit_*` methods that take a plain value, recording it as a key first.
macro_rules! record_visit {
    ($($method:ident($ty:ty) => |$v:ident| $key:expr;)*) => {$(
        fn $method<E: de::Error>(self, $v: $ty) -> Result<Self::Value, E> {
            self.keys.insert($key)?;
            self.visitor.$method($v)
        }
    )*};
}

/// The visitor of one key: records the decoded key, then hands it on. A key is a string's
/// text; for a map keyed by numbers or booleans (which serde_json reads from inside the
/// quotes) it is the value as Rust prints it.
struct KeyVisitor<'k, 'de, V> {
    visitor: V,
    keys: &'k mut Keys<'de>,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for KeyVisitor<'_, 'de, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.visitor.expecting(f)
    }

    record_visit! {
        visit_bool(bool) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_i8(i8) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_i16(i16) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_i32(i32) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_i64(i64) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_i128(i128) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_u8(u8) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_u16(u16) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_u32(u32) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_u64(u64) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_u128(u128) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_f32(f32) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_f64(f64) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_char(char) => |v| Cow::Owned(v.to_string().into_bytes());
        visit_str(&str) => |v| Cow::Owned(v.as_bytes().to_vec());
        visit_borrowed_str(&'de str) => |v| Cow::Borrowed(v.as_bytes());
        visit_string(String) => |v| Cow::Owned(v.as_bytes().to_vec());
        visit_bytes(&[u8]) => |v| Cow::Owned(v.to_vec());
        visit_borrowed_bytes(&'de [u8]) => |v| Cow::Borrowed(v);
        visit_byte_buf(Vec<u8>) => |v| Cow::Owned(v.clone());
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_some(KeyDe {
            de: d,
            keys: self.keys,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.visitor.visit_newtype_struct(KeyDe {
            de: d,
            keys: self.keys,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_seq(Seq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Wrap(self.visitor).visit_map(map)
    }

    /// A map keyed by a unit enum: the variant's name is the key.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.visitor.visit_enum(KeyEnum {
            inner: data,
            keys: self.keys,
        })
    }
}

struct KeyEnum<'k, 'de, A> {
    inner: A,
    keys: &'k mut Keys<'de>,
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for KeyEnum<'_, 'de, A> {
    type Error = A::Error;
    type Variant = Variant<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Variant<A::Variant>), A::Error> {
        let (value, variant) = self.inner.variant_seed(KeySeed {
            seed,
            keys: self.keys,
        })?;
        Ok((value, Variant(variant)))
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::time::{Duration, Instant};

    use serde::Deserialize;
    use serde_json::{json, Value};

    use super::*;

    /// The error a strict parse of `text` into a `Value` gives; panics if it parses.
    fn refused(text: &str) -> String {
        match from_str_strict::<Value>(text) {
            Ok(v) => panic!("{text} was accepted as {v}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_duplicate_key_is_refused_and_named() {
        let e = refused(r#"{"jsonrpc":"2.0","id":12,"id":13,"method":"tools/list"}"#);
        assert!(
            e.starts_with(r#"duplicate key "id" at line 1 column "#),
            "{e}"
        );
        // The bytes entry point says the same.
        let e = from_slice_strict::<Value>(br#"{"a":1,"a":2}"#).unwrap_err();
        assert!(e.to_string().starts_with(r#"duplicate key "a""#), "{e}");
        // Even when the two values are the same.
        assert!(refused(r#"{"a":1,"a":1}"#).contains(r#"duplicate key "a""#));
        assert!(refused(r#"{"":1,"":1}"#).contains(r#"duplicate key """#));
    }

    #[test]
    fn a_duplicate_key_at_any_depth_is_refused() {
        for text in [
            r#"[{"a":1,"a":2}]"#,
            r#"{"x":{"a":1,"b":2,"a":3}}"#,
            r#"[1,[2,[3,{"y":[{"z":null,"z":null}]}]]]"#,
            r#"{"outer":1,"inner":{"deeper":{"k":[],"k":{}}}}"#,
        ] {
            let e = refused(text);
            assert!(e.starts_with("duplicate key "), "{text}: {e}");
        }
    }

    #[test]
    fn a_duplicate_is_found_in_objects_of_every_size() {
        // Around the switch from a list to a hash set: every size, every earlier position.
        for n in 1..=2 * FEW_KEYS + 2 {
            let keys: Vec<String> = (0..n).map(|i| format!(r#""k{i}":{i}"#)).collect();
            let text = format!("{{{}}}", keys.join(","));
            let v: Value = from_str_strict(&text).unwrap();
            assert_eq!(v.as_object().unwrap().len(), n);
            for dup in 0..n {
                let text = format!("{{{},\"k{dup}\":0}}", keys.join(","));
                let e = refused(&text);
                assert!(e.starts_with(&format!(r#"duplicate key "k{dup}""#)), "{e}");
            }
        }
    }

    #[test]
    fn the_same_key_in_different_objects_is_fine() {
        let text = r#"{"a":{"a":1},"b":{"a":2},"c":[{"a":1},{"a":2}],"d":{"b":{"a":3}}}"#;
        let strict: Value = from_str_strict(text).unwrap();
        let plain: Value = serde_json::from_str(text).unwrap();
        assert_eq!(strict, plain);
    }

    #[test]
    fn keys_that_decode_the_same_are_duplicates() {
        for text in [
            r#"{"a":1,"\u0061":2}"#,
            r#"{"\u0061":1,"a":2}"#,
            r#"{"é":1,"\u00e9":2}"#,
            r#"{"😀":1,"\ud83d\ude00":2}"#,
            r#"{"a/b":1,"a\/b":2}"#,
            r#"{"\n":1,"\u000a":2}"#,
        ] {
            let e = refused(text);
            assert!(e.starts_with("duplicate key "), "{text}: {e}");
        }
        // Keys that differ once decoded are different keys.
        let v: Value = from_str_strict(r#"{"a":1,"A":2,"a ":3,"\u00e9":4,"e\u0301":5}"#).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 5);
    }

    #[test]
    fn a_key_in_an_error_is_escaped_and_cut_short() {
        let e = refused(r#"{"\u001b]0;x\u0007":1,"\u001b]0;x\u0007":2}"#);
        assert!(e.contains(r#"duplicate key "\u{1b}]0;x\u{7}""#), "{e}");
        assert!(!e.contains('\u{1b}'), "{e:?}");
        let long = "k".repeat(1000);
        let e = refused(&format!(r#"{{"{long}":1,"{long}":2}}"#));
        assert!(
            e.starts_with(&format!(
                r#"duplicate key "{}"… (1000 bytes)"#,
                "k".repeat(64)
            )),
            "{e}"
        );
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    enum Line {
        Result { value: Value },
        Progress { text: String },
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Lenient<'a> {
        id: u32,
        #[serde(borrow)]
        name: &'a str,
        tags: Option<Vec<String>>,
        by_name: HashMap<String, i64>,
        by_number: BTreeMap<u32, bool>,
    }

    #[derive(Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
    enum Colour {
        Red,
        Green,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    enum Outer {
        Unit,
        Newtype(Value),
        Tuple(i32, Value),
        Struct { a: Value },
    }

    #[test]
    fn typed_targets_are_checked_everywhere() {
        // An internally tagged enum, which buffers the line before it reads it.
        let ok: Line = from_str_strict(r#"{"kind":"result","value":{"x":[1,{"y":2}]}}"#).unwrap();
        assert_eq!(
            ok,
            Line::Result {
                value: json!({"x": [1, {"y": 2}]})
            }
        );
        for text in [
            r#"{"kind":"result","value":{"x":1,"x":2}}"#,
            r#"{"kind":"result","value":[{"x":1,"x":2}]}"#,
            r#"{"kind":"result","value":1,"value":2}"#,
            r#"{"kind":"progress","kind":"result","value":1}"#,
            r#"{"kind":"progress","text":"a","text":"b"}"#,
        ] {
            let e = from_str_strict::<Line>(text).unwrap_err().to_string();
            assert!(e.contains("duplicate"), "{text}: {e}");
        }

        // A struct that ignores unknown fields still has their objects checked; a map
        // keyed by numbers compares the numbers.
        let text = r#"{"id":7,"name":"n","tags":null,"by_name":{"a":1,"b":2},
                       "by_number":{"1":true,"2":false},"extra":{"p":{"q":1}}}"#;
        let v: Lenient = from_str_strict(text).unwrap();
        assert_eq!((v.id, v.name, v.by_number.len()), (7, "n", 2));
        for text in [
            r#"{"id":7,"name":"n","tags":null,"by_name":{},"by_number":{},"extra":{"p":1,"p":2}}"#,
            r#"{"id":7,"name":"n","tags":null,"by_name":{},"by_number":{},"extra":[{"p":1,"p":2}]}"#,
            r#"{"id":7,"name":"n","tags":null,"by_name":{"a":1,"a":1},"by_number":{}}"#,
            r#"{"id":7,"name":"n","tags":null,"by_name":{},"by_number":{"1":true,"1":true}}"#,
            r#"{"id":7,"name":"n","tags":null,"by_name":{},"by_number":{},"zz":1,"zz":2}"#,
        ] {
            let e = from_str_strict::<Lenient>(text).unwrap_err().to_string();
            assert!(e.contains("duplicate"), "{text}: {e}");
        }

        // Maps keyed by numbers and by an enum compare the decoded keys.
        let m: BTreeMap<i64, u8> = from_str_strict(r#"{"-1":1,"1":2,"0":3}"#).unwrap();
        assert_eq!(m.len(), 3);
        for text in [r#"{"1":1,"1":2}"#, r#"{"-1":1,"0":2,"-1":3}"#] {
            let e = from_str_strict::<BTreeMap<i64, u8>>(text).unwrap_err();
            assert!(e.to_string().starts_with("duplicate key "), "{text}: {e}");
        }
        let m: BTreeMap<Colour, u8> = from_str_strict(r#"{"Red":1,"Green":2}"#).unwrap();
        assert_eq!(m.len(), 2);
        let e = from_str_strict::<BTreeMap<Colour, u8>>(r#"{"Red":1,"R\u0065d":2}"#);
        assert!(
            e.as_ref()
                .is_err_and(|e| e.to_string().starts_with(r#"duplicate key "Red""#)),
            "{e:?}"
        );

        // Externally tagged enums.
        assert_eq!(from_str_strict::<Outer>(r#""Unit""#).unwrap(), Outer::Unit);
        assert_eq!(
            from_str_strict::<Outer>(r#"{"Struct":{"a":{"b":1}}}"#).unwrap(),
            Outer::Struct { a: json!({"b": 1}) }
        );
        for text in [
            r#"{"Newtype":{"b":1,"b":2}}"#,
            r#"{"Tuple":[1,{"b":1,"b":2}]}"#,
            r#"{"Struct":{"a":{"b":1,"b":2}}}"#,
            r#"{"Struct":{"a":1,"a":2}}"#,
        ] {
            let e = from_str_strict::<Outer>(text).unwrap_err().to_string();
            assert!(e.contains("duplicate"), "{text}: {e}");
        }
    }

    #[test]
    fn everything_else_is_serde_jsons() {
        let inputs: &[&[u8]] = &[
            b"0",
            b"-0",
            b"18446744073709551615",
            b"18446744073709551616",
            b"-9223372036854775808",
            b"1.5e300",
            b"1e400",
            b"01",
            b"1.",
            b".5",
            b"NaN",
            b"Infinity",
            b"true",
            b"null",
            b"nul",
            br#""\u00e9\n\t\"\\ \/""#,
            br#""\ud83d""#,
            br#""\x""#,
            b"\"a\x01b\"",
            b"\"\xff\"",
            b"",
            b"   ",
            b" {} ",
            b"{} x",
            b"{}{}",
            b"[1,]",
            b"{\"a\":1,}",
            b"{\"a\" 1}",
            b"{1:2}",
            b"[1, 2",
            b"\"abc",
            b"{\"a\":[1,2,{\"b\":null}],\"c\":\"d\"}\n",
        ];
        for input in inputs {
            let strict = from_slice_strict::<Value>(input).map_err(|e| e.to_string());
            let plain = serde_json::from_slice::<Value>(input).map_err(|e| e.to_string());
            assert_eq!(strict, plain, "{:?}", String::from_utf8_lossy(input));
        }
        // Typed: the same numbers, and the same refusals of a wrong type.
        assert_eq!(from_str_strict::<u8>("255").unwrap(), 255);
        assert_eq!(
            from_str_strict::<u8>("256").unwrap_err().to_string(),
            serde_json::from_str::<u8>("256").unwrap_err().to_string()
        );
        assert_eq!(from_str_strict::<f64>("-2.5e-3").unwrap(), -2.5e-3);
        assert_eq!(
            from_str_strict::<i128>("-170141183460469231731687303715884105728").unwrap(),
            i128::MIN
        );
        assert_eq!(
            from_str_strict::<&str>(r#""borrowed""#).unwrap(),
            "borrowed"
        );
        assert_eq!(from_str_strict::<char>(r#""é""#).unwrap(), 'é');
        assert_eq!(from_str_strict::<()>("null").unwrap(), ());
        assert_eq!(from_str_strict::<Option<u8>>("null").unwrap(), None);
        assert_eq!(
            from_str_strict::<(u8, String)>(r#"[1,"a"]"#).unwrap(),
            (1, "a".into())
        );
    }

    /// `[` or `{"k":` repeated `n` times, then the closing brackets.
    fn nested(n: usize, object: bool) -> String {
        let (open, close) = if object {
            (r#"{"k":"#, "}")
        } else {
            ("[", "]")
        };
        format!("{}0{}", open.repeat(n), close.repeat(n))
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        for object in [false, true] {
            let at = nested(MAX_DEPTH, object);
            assert!(from_str_strict::<Value>(&at).is_ok(), "depth {MAX_DEPTH}");
            for n in [MAX_DEPTH + 1, 100_000] {
                let e = from_str_strict::<Value>(&nested(n, object)).unwrap_err();
                assert!(
                    e.to_string().starts_with("recursion limit exceeded"),
                    "{n}: {e}"
                );
            }
        }
        // A skipped field is walked, under the same limit.
        #[derive(Debug, Deserialize)]
        struct Known {
            #[serde(rename = "a")]
            _a: u8,
        }
        let deep = format!(r#"{{"a":1,"skipped":{}}}"#, nested(100_000, true));
        let e = from_str_strict::<Known>(&deep).unwrap_err();
        assert!(e.to_string().starts_with("recursion limit exceeded"), "{e}");
    }

    #[test]
    fn big_inputs_are_parsed_and_checked() {
        let keys = 200_000;
        let mut text = String::from("{");
        for i in 0..keys {
            text.push_str(&format!(r#""key{i}":[{{"a":{i}}},{{"a":"{i}"}}],"#));
        }
        text.push_str(r#""last":"#);
        text.push_str(&format!("\"{}\"}}", "x".repeat(8 << 20)));
        let t0 = Instant::now();
        let v: Value = from_str_strict(&text).unwrap();
        let took = t0.elapsed();
        assert_eq!(v.as_object().unwrap().len(), keys + 1);
        assert!(took < Duration::from_secs(10), "{took:?}");

        // The same object with one key repeated at the very end.
        text.truncate(text.len() - 1);
        text.push_str(r#","key0":1}"#);
        let e = from_str_strict::<Value>(&text).unwrap_err();
        assert!(e.to_string().starts_with(r#"duplicate key "key0""#), "{e}");
    }
}
