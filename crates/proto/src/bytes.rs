//! [`Bytes`]: a byte buffer that crosses a channel as one length and one copy.
//!
//! serde serialises a `Vec<u8>` as a sequence, one call per byte, both ways; a workspace of
//! 64 MiB would cost tens of milliseconds of that at each hop. `Bytes` says "these are
//! bytes" to serde instead (`serialize_bytes`, `deserialize_byte_buf`), which the codec
//! writes as a length and the bytes, and reads back with one allocation and one copy.

use serde::de::{Error, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes on the wire as a length and the bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes(v)
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// Only the length: a workspace printed whole into a log line would be megabytes of it.
impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.0.len())
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bytes")
    }

    fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes(v.to_vec()))
    }

    fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes(v))
    }

    /// A sequence of numbers 0..=255 (how a self-describing format may carry bytes).
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(Bytes(v))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_byte_buf(BytesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::Bytes;
    use crate::codec;

    #[test]
    fn bytes_cross_the_codec_as_a_length_and_the_bytes() {
        let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        let b = Bytes(data.clone());
        let enc = codec::encode(&b).expect("encode");
        // A varint length (5 bytes for 100 000) and the bytes themselves, nothing per byte.
        assert_eq!(enc.len(), data.len() + 5);
        assert_eq!(&enc[5..], &data[..]);
        let back: Bytes = codec::decode(&enc).expect("decode");
        assert_eq!(back, b);
        // Inside an Option, as the messages carry it.
        let some = Some(Bytes(vec![1, 2, 3]));
        let back: Option<Bytes> = codec::decode(&codec::encode(&some).expect("enc")).expect("dec");
        assert_eq!(back, some);
        assert_eq!(format!("{b:?}"), "Bytes(100000 bytes)");
    }

    #[test]
    fn a_length_past_the_bytes_there_is_refused() {
        let mut enc = codec::encode(&Bytes(vec![7; 10])).expect("encode");
        enc[0] = 200; // claims 200 bytes; 10 follow
        assert!(codec::decode::<Bytes>(&enc).is_err());
    }
}
