//! A request process's lines on its request channel (`docs/agent-protocol.md`), checked
//! without building them.
//!
//! Trust: none. The handler runs in the process that writes these lines, and can write
//! one of its own, of any shape, up to the 20 MiB a line may have. The launcher that reads
//! it runs as root in the host's namespaces, outside every cgroup of the sandbox: no limit
//! counts what it spends on a line, so what it spends must not follow what the line says.
//! Parsed into a JSON tree, a 20 MB `result` line of small values cost it about 35 times
//! the line (650 MiB).
//!
//! So a line is read in one pass over its bytes that builds nothing. The only memory that
//! grows with the line is, while an object is open, one `u32` per key it has so far (the
//! offset of the key in the line), to refuse a key named twice; every scalar is checked in
//! place. A `result`'s value is then passed on as the bytes it was written as, with the
//! whitespace between its tokens taken out, moved to the front of the line's own buffer:
//! the launcher holds the line once, and the frame that carries it on once.
//!
//! It refuses all that parsing the line into the closed enum it replaced refused
//! (`proto::json::from_slice_strict`: serde_json and serde's derive), and takes what that
//! took, but for two shapes (below). A line must keep to:
//! - serde_json's grammar: its whitespace, its literals, its refusal of a trailing comma
//!   and of anything after the object; strings of valid UTF-8 with no control character,
//!   its escapes, `\u` surrogates in pairs; numbers of its grammar, and out of its range
//!   (`1e400`) refused by serde_json itself;
//! - nesting at most [`MAX_DEPTH`] deep, the line's own object included;
//! - a key named twice in any object of the line, compared as decoded (`"a"` and
//!   `"\u0061"` are one key), refused;
//! - a `kind` that is a string naming one of the four kinds, each with exactly its fields
//!   (`progress`: `text`, a string; `heartbeat`: none; `result`: `value`, any JSON;
//!   `error`: `message` and `traceback`, strings, and optionally `exit_code`, an integer
//!   that fits an `i32`, or null), in any order.
//!
//! The two shapes serde also took, and the protocol never had, are refused: a line that is
//! an array (`["error","m","t"]`, the kind first, then the fields in order), and a
//! `heartbeat` with fields of any name. No agent writes either.
//!
//! What a value is passed on as differs from serde_json's re-serialisation of its tree only
//! where JSON says nothing: an object's keys stay in the order they were written (a tree
//! sorted them), and strings and numbers keep the escapes and form they were written with
//! (`1e-05`, `"\u00e9"`). Every reader of the value parses it, and gets the same value.
//!
//! A handler's error `message` and `traceback` are cut here too (see [`MAX_MESSAGE`]).

use proto::json_scan::{bad, compact_to_front, quoted, Bad, KeyBytes, Scan, Span};

/// The most of a handler's error message the launcher passes on, in bytes: a longer one
/// keeps its beginning and says how much was cut (`… (N more bytes cut)`).
pub(crate) const MAX_MESSAGE: usize = 64 * 1024;
/// The most of a handler's traceback the launcher passes on, in bytes: a longer one keeps
/// its end, where the exception is, and says how much was cut before it.
pub(crate) const MAX_TRACEBACK: usize = 1024 * 1024;

/// One line of a request process, as the launcher passes it on.
#[derive(Debug, PartialEq)]
pub enum ChildMsg {
    Progress {
        text: String,
    },
    Heartbeat,
    /// The value's JSON text: as written, without whitespace between its tokens.
    Result {
        value: String,
    },
    /// Cut to [`MAX_MESSAGE`] and [`MAX_TRACEBACK`]. `exit_code`: the code the handler's
    /// process exited with, when it ended by exiting (`sys.exit(3)`, `process.exit(3)`, a
    /// warm-exec command's status).
    Error {
        message: String,
        traceback: String,
        exit_code: Option<i32>,
    },
}

/// Check one line (without its newline) and take what it says. A result's value is moved
/// to the front of `line`'s own buffer, which becomes the value's text. (Public for the
/// `agent_lines` fuzz target; the launcher is its only caller.)
pub fn parse(line: Vec<u8>) -> Result<ChildMsg, String> {
    read(line).map_err(|e| format!("bad line: {e}"))
}

/// The fields a line may have, each the span of its value in the line.
#[derive(Default)]
struct Fields {
    kind: Option<Span>,
    text: Option<Span>,
    value: Option<Span>,
    message: Option<Span>,
    traceback: Option<Span>,
    exit_code: Option<Span>,
}

const FIELD_NAMES: [&str; 6] = ["kind", "text", "value", "message", "traceback", "exit_code"];

impl Fields {
    fn slot(&mut self, name: &str) -> &mut Option<Span> {
        match name {
            "kind" => &mut self.kind,
            "text" => &mut self.text,
            "value" => &mut self.value,
            "message" => &mut self.message,
            "traceback" => &mut self.traceback,
            _ => &mut self.exit_code,
        }
    }
}

fn read(mut line: Vec<u8>) -> Result<ChildMsg, Bad> {
    // Offsets are kept as u32 (see `Scan::keys`); the reader caps a line far below this.
    if line.len() > u32::MAX as usize / 2 {
        return bad(format!("a line of {} bytes", line.len()), 0);
    }
    let mut fields = line_fields(Scan::new(&line))?;
    let end = line.len();
    let kind = match fields.kind {
        Some(k) => k,
        None => return bad("missing field `kind`", end),
    };
    if line.get(kind.start) != Some(&b'"') {
        return bad("`kind` is not a string", kind.start);
    }
    let kind_is = |name: &str| KeyBytes::new(&line, kind.start + 1).eq(name.bytes());
    // Each kind's fields, and those of them it may leave out.
    let (name, wanted, optional): (&str, &[&str], &[&str]) = if kind_is("progress") {
        ("progress", &["text"], &[])
    } else if kind_is("heartbeat") {
        ("heartbeat", &[], &[])
    } else if kind_is("result") {
        ("result", &["value"], &[])
    } else if kind_is("error") {
        (
            "error",
            &["message", "traceback", "exit_code"],
            &["exit_code"],
        )
    } else {
        return bad(
            format!(
                "unknown kind {}, expected one of `progress`, `heartbeat`, `result`, `error`",
                quoted(&line, kind.start + 1)
            ),
            kind.start,
        );
    };
    for field in &FIELD_NAMES[1..] {
        let present = fields.slot(field).is_some();
        if present && !wanted.contains(field) {
            let at = fields.slot(field).map_or(end, |s| s.start);
            let expected = match wanted {
                [] => "none".to_string(),
                w => w
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            return bad(
                format!("unknown field `{field}` in a {name} line, expected {expected}"),
                at,
            );
        }
        if !present && wanted.contains(field) && !optional.contains(field) {
            return bad(format!("missing field `{field}`"), end);
        }
    }
    match name {
        "heartbeat" => Ok(ChildMsg::Heartbeat),
        "progress" => Ok(ChildMsg::Progress {
            text: string_field(&line, fields.text, "text")?,
        }),
        "error" => {
            let message = string_field(&line, fields.message, "message")?;
            let traceback = string_field(&line, fields.traceback, "traceback")?;
            let exit_code = i32_field(&line, fields.exit_code, "exit_code")?;
            Ok(ChildMsg::Error {
                message: cut_message(message),
                traceback: cut_traceback(traceback),
                exit_code,
            })
        }
        _ => {
            let Some(v) = fields.value else {
                return bad("missing field `value`", end);
            };
            compact_to_front(&mut line, v);
            match String::from_utf8(line) {
                Ok(value) => Ok(ChildMsg::Result { value }),
                Err(e) => bad("a value that is not UTF-8", e.utf8_error().valid_up_to()),
            }
        }
    }
}

/// An optional field that is an integer an `i32` holds, or null (as serde reads an
/// `Option<i32>`: no fraction, no exponent).
fn i32_field(line: &[u8], span: Option<Span>, name: &str) -> Result<Option<i32>, Bad> {
    let Some(s) = span else {
        return Ok(None);
    };
    let text = &line[s.start..s.end];
    if text == b"null" {
        return Ok(None);
    }
    // serde_json reads `-0` as a float, which an i32 does not take.
    match std::str::from_utf8(text).ok().map(str::parse::<i32>) {
        Some(Ok(n)) if text != b"-0" => Ok(Some(n)),
        _ => bad(
            format!("`{name}` is not an integer from -2147483648 to 2147483647"),
            s.start,
        ),
    }
}

/// A field that must be a string, decoded.
fn string_field(line: &[u8], span: Option<Span>, name: &str) -> Result<String, Bad> {
    let Some(s) = span else {
        return bad(format!("missing field `{name}`"), line.len());
    };
    if line.get(s.start) != Some(&b'"') {
        return bad(format!("`{name}` is not a string"), s.start);
    }
    let mut out = Vec::with_capacity(s.end.saturating_sub(s.start + 2));
    out.extend(KeyBytes::new(line, s.start + 1));
    String::from_utf8(out).or_else(|e| {
        bad(
            "a string that is not UTF-8",
            s.start + e.utf8_error().valid_up_to(),
        )
    })
}

/// A handler's error message, at most [`MAX_MESSAGE`] bytes of it and a note of the rest.
pub(crate) fn cut_message(mut message: String) -> String {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let mut at = MAX_MESSAGE;
    while !message.is_char_boundary(at) {
        at -= 1;
    }
    let cut = message.len() - at;
    message.truncate(at);
    message.push_str(&format!(" … ({cut} more bytes cut)"));
    message.shrink_to_fit();
    message
}

/// A handler's traceback, at most the last [`MAX_TRACEBACK`] bytes of it, after a note of
/// what was cut before them.
pub(crate) fn cut_traceback(traceback: String) -> String {
    if traceback.len() <= MAX_TRACEBACK {
        return traceback;
    }
    let mut at = traceback.len() - MAX_TRACEBACK;
    while !traceback.is_char_boundary(at) {
        at += 1;
    }
    format!("({at} earlier bytes cut) …\n{}", &traceback[at..])
}

/// The line: one object whose known fields are recorded; anything after it but
/// whitespace is an error.
fn line_fields(mut s: Scan<'_>) -> Result<Fields, Bad> {
    s.skip_space();
    match s.peek() {
        Some(b'{') => {}
        None => return bad("EOF while parsing a value", s.i),
        Some(_) => return bad("a line is a JSON object with a `kind`", s.i),
    }
    s.enter()?;
    let mut fields = Fields::default();
    s.skip_space();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            let key = s.key()?;
            let name = FIELD_NAMES
                .iter()
                .find(|f| KeyBytes::new(s.b, key).eq(f.bytes()));
            let Some(name) = name else {
                return bad(format!("unknown field {}", quoted(s.b, key)), key);
            };
            if fields.slot(name).is_some() {
                return bad(format!("duplicate key \"{name}\""), s.i - 1);
            }
            s.colon()?;
            let start = s.i;
            s.value()?;
            *fields.slot(name) = Some(Span { start, end: s.i });
            if !s.next_member()? {
                break;
            }
        }
    }
    s.skip_space();
    if s.i < s.b.len() {
        return bad("trailing characters", s.i);
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use proto::json::MAX_DEPTH;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    use serde::Deserialize;
    use serde_json::{json, Value};

    use super::*;

    // --- Memory: what this thread has allocated ------------------------------------------

    /// The system allocator, counting what each thread holds and the most it held: a
    /// test measures its own thread, whatever the tests beside it do.
    struct Counting;

    thread_local! {
        static HELD: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }

    fn count(grow: usize, shrink: usize) {
        let _ = HELD.try_with(|h| {
            let now = (h.get() + grow).saturating_sub(shrink);
            h.set(now);
            let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
        });
    }

    // SAFETY: every call is passed to the system allocator as it came; the counting
    // around it allocates nothing.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size(), 0);
            // SAFETY: the caller's layout, passed on.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count(layout.size(), 0);
            // SAFETY: the caller's layout, passed on.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(0, layout.size());
            // SAFETY: the caller's pointer and layout, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size, layout.size());
            // SAFETY: the caller's pointer, layout and size, passed on.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// `f()`, and the most this thread held meanwhile beyond what it held before.
    fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let before = HELD.with(Cell::get);
        PEAK.with(|p| p.set(before));
        let out = f();
        (out, PEAK.with(Cell::get) - before)
    }

    // --- The reference: what the launcher parsed lines with before ------------------------

    #[derive(Debug, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    enum Tree {
        Progress {
            text: String,
        },
        Heartbeat,
        Result {
            value: Value,
        },
        Error {
            message: String,
            traceback: String,
            #[serde(default)]
            exit_code: Option<i32>,
        },
    }

    fn ok(line: &str) -> ChildMsg {
        parse(line.as_bytes().to_vec()).unwrap_or_else(|e| panic!("{line}: refused: {e}"))
    }

    fn refused(line: &[u8]) -> String {
        match parse(line.to_vec()) {
            Ok(m) => panic!("{}: accepted as {m:?}", String::from_utf8_lossy(line)),
            Err(e) => e,
        }
    }

    /// The shapes serde accepted and the protocol never had: a line that is an array, and
    /// a heartbeat with fields.
    fn serde_only(line: &[u8]) -> bool {
        let text = String::from_utf8_lossy(line);
        let t = text.trim_start_matches([' ', '\t', '\r']);
        t.starts_with('[')
            || matches!(
                proto::json::from_slice_strict::<Value>(line),
                Ok(Value::Object(o)) if o.get("kind") == Some(&json!("heartbeat")) && o.len() > 1
            )
    }

    /// Both readers agree on `line`: both refuse it, or both take it and say the same.
    fn agree(line: &[u8]) {
        let shown = String::from_utf8_lossy(line);
        let old = proto::json::from_slice_strict::<Tree>(line);
        let new = parse(line.to_vec());
        match (old, new) {
            (Err(_), Err(_)) => {}
            (Ok(_), Err(e)) if serde_only(line) => assert!(e.starts_with("bad line: "), "{e}"),
            (Ok(o), Err(e)) => panic!("{shown}: refused ({e}), was taken as {o:?}"),
            (Err(o), Ok(n)) => panic!("{shown}: taken as {n:?}, was refused ({o})"),
            (Ok(Tree::Result { value }), Ok(ChildMsg::Result { value: text })) => {
                let again: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{shown}: the value passed on is not JSON: {e}"));
                assert_eq!(again, value, "{shown}: {text}");
                assert_eq!(text, compact(&text), "{shown}: whitespace left in {text}");
            }
            (Ok(Tree::Progress { text: a }), Ok(ChildMsg::Progress { text: b })) => {
                assert_eq!(a, b, "{shown}")
            }
            (Ok(Tree::Heartbeat), Ok(ChildMsg::Heartbeat)) => {}
            (
                Ok(Tree::Error {
                    message: m1,
                    traceback: t1,
                    exit_code: e1,
                }),
                Ok(ChildMsg::Error {
                    message: m2,
                    traceback: t2,
                    exit_code: e2,
                }),
            ) => assert_eq!(
                (cut_message(m1), cut_traceback(t1), e1),
                (m2, t2, e2),
                "{shown}"
            ),
            (Ok(o), Ok(n)) => panic!("{shown}: taken as {n:?}, was {o:?}"),
        }
    }

    /// JSON text without the whitespace between its tokens (a plain reference version).
    fn compact(text: &str) -> String {
        let mut out = String::new();
        let (mut in_string, mut escaped) = (false, false);
        for c in text.chars() {
            if in_string {
                out.push(c);
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_string = false;
                }
            } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
                in_string = c == '"';
                out.push(c);
            }
        }
        out
    }

    /// Lines that each probe one rule, taken and refused.
    const LINES: &[&str] = &[
        r#"{"kind":"heartbeat"}"#,
        r#" {"kind" : "heartbeat" } "#,
        "\t{\"kind\":\"heartbeat\"}\r",
        r#"{"kind":"progress","text":"step 1"}"#,
        r#"{"text":"first","kind":"progress"}"#,
        r#"{"kind":"progress","text":"\u00e9\n\t\"\\ \/ \b\f\r \ud83d\ude00 é"}"#,
        r#"{"kind":"result","value":null}"#,
        r#"{"kind":"result","value":{"b":1,"a":[1,2,{"c":"d"}],"e":{}}}"#,
        r#"{"kind": "result", "value": {"b": 1, "a": [1, 2.5, -0, 1e-05, 1E+2]}}"#,
        r#"{"value":[true,false,null,"x"],"kind":"result"}"#,
        r#"{"kind":"result","value":18446744073709551616}"#,
        r#"{"kind":"result","value":-9223372036854775809}"#,
        r#"{"kind":"result","value":123456789012345678}"#,
        r#"{"kind":"result","value":1.0e-400}"#,
        r#"{"kind":"result","value":0e999999999999}"#,
        r#"{"kind":"result","value":"\u0000\u001f\u007f\ud800\udc00"}"#,
        r#"{"kind":"error","message":"ValueError: x","traceback":"Traceback ...\n"}"#,
        r#"{"traceback":"","message":"","kind":"error"}"#,
        r#"{"kind":"error","message":"SystemExit: 3","traceback":"","exit_code":3}"#,
        r#"{"exit_code":-1,"kind":"error","message":"m","traceback":"t"}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":null}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":2147483647}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":-2147483648}"#,
        r#"{"k\u0069nd":"\u0068eartbeat"}"#,
        r#"{"kind":"progress","t\u0065xt":"a"}"#,
        // Refused.
        "",
        "   ",
        "null",
        "\"heartbeat\"",
        "{}",
        "[]",
        r#"["heartbeat"]"#,
        r#"["progress","x"]"#,
        r#"["result",{"a":1}]"#,
        r#"["error","m","t"]"#,
        r#"{"kind":"heartbeat","x":1}"#,
        r#"{"kind":"heartbeat","":null}"#,
        r#"{"kind":"heartbeat","kind":"heartbeat"}"#,
        r#"{"kind":"heartbeat"}x"#,
        r#"{"kind":"heartbeat"}{}"#,
        r#"{"kind":"heartbeat",}"#,
        r#"{"kind":1}"#,
        r#"{"kind":null}"#,
        r#"{"kind":"Result","value":1}"#,
        r#"{"kind":"result"}"#,
        r#"{"kind":"result","value":1,"text":"x"}"#,
        r#"{"kind":"result","value":1,"kind":"result"}"#,
        r#"{"kind":"result","value":1,"value":2}"#,
        r#"{"kind":"result","value":[1,]}"#,
        r#"{"kind":"result","value":[,1]}"#,
        r#"{"kind":"result","value":{"a":1,}}"#,
        r#"{"kind":"result","value":{,}}"#,
        r#"{"kind":"result","value":{"a" 1}}"#,
        r#"{"kind":"result","value":{1:2}}"#,
        r#"{"kind":"result","value":[1 2]}"#,
        r#"{"kind":"result","value":01}"#,
        r#"{"kind":"result","value":-}"#,
        r#"{"kind":"result","value":1.}"#,
        r#"{"kind":"result","value":.5}"#,
        r#"{"kind":"result","value":1e}"#,
        r#"{"kind":"result","value":1e+}"#,
        r#"{"kind":"result","value":+1}"#,
        r#"{"kind":"result","value":1e400}"#,
        r#"{"kind":"result","value":-1e400}"#,
        r#"{"kind":"result","value":NaN}"#,
        r#"{"kind":"result","value":Infinity}"#,
        r#"{"kind":"result","value":tru}"#,
        r#"{"kind":"result","value":nul"#,
        r#"{"kind":"result","value":truex}"#,
        r#"{"kind":"result","value":"\ud800"}"#,
        r#"{"kind":"result","value":"\udc00"}"#,
        r#"{"kind":"result","value":"\ud800\u0041"}"#,
        r#"{"kind":"result","value":"\ud800\n"}"#,
        r#"{"kind":"result","value":"\x"}"#,
        r#"{"kind":"result","value":"\u12"}"#,
        r#"{"kind":"result","value":"\u12g4"}"#,
        r#"{"kind":"result","value":"abc"#,
        r#"{"kind":"result","value":{"a":1,"\u0061":2}}"#,
        r#"{"kind":"result","value":[{"x":[{"y":1,"y":2}]}]}"#,
        r#"{"kind":"progress","text":null}"#,
        r#"{"kind":"progress","text":1}"#,
        r#"{"kind":"progress","text":["a"]}"#,
        r#"{"kind":"progress","text":"a","t\u0065xt":"b"}"#,
        r#"{"kind":"progress","text":"x","value":1}"#,
        r#"{"kind":"error","message":"m"}"#,
        r#"{"kind":"error","message":"m","traceback":"t","traceback":"u"}"#,
        r#"{"kind":"error","message":"m","traceback":1}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":2147483648}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":3.0}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":-0}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":1e1}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":"3"}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":true}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":[3]}"#,
        r#"{"kind":"error","message":"m","traceback":"t","exit_code":3,"exit_code":4}"#,
        r#"{"kind":"result","value":1,"exit_code":3}"#,
        r#"{"kind":"progress","text":"x","exit_code":3}"#,
        r#"{"kind":"progress""text":"x"}"#,
        r#"{"kind":"progress","text":"x""#,
        r#"{"kind""#,
        r#"{"#,
    ];

    #[test]
    fn every_line_is_read_as_the_tree_parser_read_it() {
        for line in LINES {
            agree(line.as_bytes());
        }
        // Bytes no string may hold, and the UTF-8 no string may have.
        for bad in [
            &b"{\"kind\":\"progress\",\"text\":\"a\x01b\"}"[..],
            b"{\"kind\":\"progress\",\"text\":\"a\tb\"}",
            b"{\"kind\":\"progress\",\"text\":\"\xff\"}",
            b"{\"kind\":\"progress\",\"text\":\"\xc3\"}",
            b"{\"kind\":\"progress\",\"text\":\"\xc3\\n\"}",
            b"{\"kind\":\"progress\",\"text\":\"\xed\xa0\x80\"}",
            b"{\"kind\":\"progress\",\"text\":\"\xf4\x90\x80\x80\"}",
            b"{\"k\xc3\xa9\":1}",
            b"{\"kind\":\"heartbeat\"}\x00",
            b"\xef\xbb\xbf{\"kind\":\"heartbeat\"}",
        ] {
            agree(bad);
            refused(bad);
        }
        agree("{\"kind\":\"progress\",\"text\":\"\u{7f}\u{80}\u{10ffff}\"}".as_bytes());
    }

    #[test]
    fn mutated_lines_are_read_as_the_tree_parser_read_them() {
        // Small, hand-picked lines, each changed at random a byte or a few at a time, and
        // the changed lines that are taken changed again: what either reader takes, the
        // other takes and reads the same. (Run for 4 million lines once, of which 650 000
        // were taken.)
        let mut seeds: Vec<Vec<u8>> = LINES.iter().map(|l| l.as_bytes().to_vec()).collect();
        let alphabet: &[u8] =
            b"{}[]\":,\\ \t/u0123456789abcdefABCDEF.eE+-tnlrsukidvxmgp\x00\x1f\x7f\x80\xc3\xa9\xed\xf0\xff";
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..100_000 {
            let mut line = seeds[next(seeds.len())].clone();
            for _ in 0..1 + next(3) {
                let at = next(line.len() + 1);
                let byte = alphabet[next(alphabet.len())];
                match next(3) {
                    0 if at < line.len() => line[at] = byte,
                    1 if at < line.len() => {
                        line.remove(at);
                    }
                    _ => line.insert(at, byte),
                }
            }
            agree(&line);
            if seeds.len() < 5000 && line.len() < 300 && parse(line.clone()).is_ok() {
                seeds.push(line);
            }
        }
    }

    #[test]
    fn a_duplicate_key_deep_inside_a_value_is_refused_and_named() {
        let deep = format!(
            r#"{{"kind":"result","value":{}{{"k":1,"other":2,"\u006b":3}}{}}}"#,
            r#"{"a":["#.repeat(40),
            "]}".repeat(40)
        );
        let e = refused(deep.as_bytes());
        assert!(
            e.starts_with(r#"bad line: duplicate key "k" at line 1 column "#),
            "{e}"
        );
        agree(deep.as_bytes());
        // In a large object too, where keys are sorted when it closes: named at its second
        // place, wherever the first one is.
        for (first, second) in [(0, 999), (500, 501), (998, 999), (17, 3)] {
            let mut keys: Vec<String> = (0..1000).map(|i| format!(r#""key{i}":{i}"#)).collect();
            keys[second] = format!(r#""key{first}":0"#);
            let line = format!(
                r#"{{"kind":"result","value":[{{"x":{{{}}}}}]}}"#,
                keys.join(",")
            );
            let e = refused(line.as_bytes());
            // The column of its closing quote.
            let quote = line
                .rfind(&format!(r#""key{first}""#))
                .map(|i| i + 4 + first.to_string().len());
            let want = format!(
                r#"bad line: duplicate key "key{first}" at line 1 column {}"#,
                quote.unwrap_or(0) + 1
            );
            assert_eq!(e, want, "{first} {second}");
            agree(line.as_bytes());
        }
        // A key too long to quote whole.
        let long = "k".repeat(1000);
        let e =
            refused(format!(r#"{{"kind":"result","value":{{"{long}":1,"{long}":2}}}}"#).as_bytes());
        assert!(
            e.starts_with(&format!(
                r#"bad line: duplicate key "{}"… (1000 bytes)"#,
                "k".repeat(64)
            )),
            "{e}"
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
    fn nesting_past_the_limit_is_refused() {
        // The line's own object is one level: its value may nest one less than the limit.
        for object in [false, true] {
            let at = format!(
                r#"{{"kind":"result","value":{}}}"#,
                nested(MAX_DEPTH - 1, object)
            );
            assert!(matches!(ok(&at), ChildMsg::Result { .. }));
            agree(at.as_bytes());
            for n in [MAX_DEPTH, 100_000] {
                let line = format!(r#"{{"kind":"result","value":{}}}"#, nested(n, object));
                let e = refused(line.as_bytes());
                assert!(
                    e.starts_with("bad line: recursion limit exceeded"),
                    "{n}: {e}"
                );
                agree(line.as_bytes());
            }
        }
    }

    #[test]
    fn a_huge_string_value_is_taken_in_place() {
        let big = "é".repeat(8 << 20);
        let line = format!(r#"{{"kind":"result","value":"{big}"}}"#).into_bytes();
        let len = line.len();
        let (msg, extra) = peak_during(move || parse(line));
        match msg {
            Ok(ChildMsg::Result { value }) => {
                assert_eq!(value.len(), big.len() + 2);
                assert!(value.starts_with("\"éé") && value.ends_with("éé\""));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            extra < 4096,
            "{extra} bytes allocated for a {len}-byte line"
        );
    }

    #[test]
    fn what_a_large_line_allocates_does_not_follow_its_size() {
        // Ten million small values, the shape a tree costs most for; a million keys in one
        // object; each at 16 MB or so.
        let zeros = format!(r#"{{"kind":"result","value":[{}0]}}"#, "0,".repeat(8 << 20));
        let (msg, extra) = peak_during(move || parse(zeros.into_bytes()));
        assert!(matches!(msg, Ok(ChildMsg::Result { .. })), "{msg:?}");
        assert!(
            extra < 4096,
            "{extra} bytes allocated for ten million zeros"
        );

        let keys: Vec<String> = (0..1_000_000).map(|i| format!(r#""{i:x}":[]"#)).collect();
        let object = format!(
            r#"{{"value" : {{ {} }}, "kind":"result"}}"#,
            keys.join(", ")
        );
        let len = object.len();
        let (msg, extra) = peak_during(move || parse(object.into_bytes()));
        assert!(matches!(msg, Ok(ChildMsg::Result { .. })), "{msg:?}");
        // One u32 per key of the open object (and the list's growth): well under the line.
        assert!(
            extra <= 8 * 1_000_000 + 4096,
            "{extra} bytes allocated for a {len}-byte object of a million keys"
        );
    }

    #[test]
    fn a_value_is_passed_on_as_written_without_its_whitespace() {
        let value = r#"{ "b" : [ 1 , 2.50 , -0 , 1e-05 , 18446744073709551616 ] ,
            "a" : "x \" y \\ z \u00e9 \ud83d\ude00 é \/ \n" , "c" : { } , "d" : [ ] ,
            "e" : true , "f" : null }"#
            .replace('\n', " ");
        let ChildMsg::Result { value: text } =
            ok(&format!(r#"{{"kind" : "result" , "value" : {value} }}"#))
        else {
            panic!("not a result");
        };
        assert_eq!(
            text,
            r#"{"b":[1,2.50,-0,1e-05,18446744073709551616],"a":"x \" y \\ z \u00e9 \ud83d\ude00 é \/ \n","c":{},"d":[],"e":true,"f":null}"#
        );
        // The same value, to every reader that parses it.
        assert_eq!(
            serde_json::from_str::<Value>(&text).ok(),
            serde_json::from_str::<Value>(&value).ok()
        );
        // Text that is already compact comes back byte for byte, whatever its size.
        for value in [
            "0".to_string(),
            r#""""#.to_string(),
            format!(
                r#"{{"k":"{}","l":[{}1]}}"#,
                "\\\"".repeat(1000),
                "[],".repeat(1000)
            ),
        ] {
            let ChildMsg::Result { value: text } =
                ok(&format!(r#"{{"kind":"result","value":{value}}}"#))
            else {
                panic!("not a result");
            };
            assert_eq!(text, value);
        }
    }

    #[test]
    fn a_long_error_is_cut_and_says_so() {
        let message = format!("ValueError: {}", "é".repeat(MAX_MESSAGE));
        let traceback = format!(
            "Traceback (most recent call last):\n{}end\n",
            "x".repeat(3 << 20)
        );
        let line = json!({"kind": "error", "message": message, "traceback": traceback});
        let ChildMsg::Error {
            message: m,
            traceback: t,
            ..
        } = ok(&line.to_string())
        else {
            panic!("not an error");
        };
        assert!(m.starts_with("ValueError: éé"), "{}", &m[..40]);
        let kept = m.find(" … (").unwrap_or(usize::MAX);
        assert!(kept <= MAX_MESSAGE && kept > MAX_MESSAGE - 4, "{kept}");
        assert!(
            m.ends_with(&format!(" … ({} more bytes cut)", message.len() - kept)),
            "{}",
            &m[kept..]
        );
        let cut = traceback.len() - MAX_TRACEBACK;
        assert_eq!(
            t,
            format!("({cut} earlier bytes cut) …\n{}", &traceback[cut..])
        );
        assert!(t.ends_with("xxxend\n"));
        // Short ones are left alone.
        assert_eq!(
            ok(r#"{"kind":"error","message":"m","traceback":"t"}"#),
            ChildMsg::Error {
                message: "m".into(),
                traceback: "t".into(),
                exit_code: None,
            }
        );
        assert_eq!(
            ok(r#"{"kind":"error","message":"m","traceback":"t","exit_code":3}"#),
            ChildMsg::Error {
                message: "m".into(),
                traceback: "t".into(),
                exit_code: Some(3),
            }
        );
    }
}
