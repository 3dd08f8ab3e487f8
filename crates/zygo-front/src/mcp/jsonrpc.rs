//! JSON-RPC 2.0 on a byte stream, one message per line: the line reader with its hard cap,
//! request ids, and the shapes of answers.

use std::io::{self, BufRead};

use serde_json::{json, Map, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// MCP 2026-07-28: the request's `_meta` names a protocol version this server does not
/// speak statelessly.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The longest line (one message) accepted: 20 MiB. Longer lines are skipped without
/// being buffered whole, and answered with an error.
pub const MAX_LINE: usize = 20 * 1024 * 1024;

/// A request id: a string or an integer (MCP forbids null, JSON-RPC discourages fractions).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Id {
    Int(i64),
    UInt(u64),
    Str(String),
}

impl Id {
    /// The id of a message, if it is one MCP accepts.
    pub fn from_value(v: &Value) -> Option<Id> {
        match v {
            Value::String(s) => Some(Id::Str(s.clone())),
            Value::Number(n) => n.as_i64().map(Id::Int).or_else(|| n.as_u64().map(Id::UInt)),
            _ => None,
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            Id::Int(n) => json!(n),
            Id::UInt(n) => json!(n),
            Id::Str(s) => json!(s),
        }
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Int(n) => write!(f, "{n}"),
            Id::UInt(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A successful answer.
pub fn result(id: &Id, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.to_value(), "result": result})
}

/// An error answer. `id` is None when the request's id could not be read.
pub fn error(id: Option<&Id>, code: i64, message: impl Into<String>, data: Option<Value>) -> Value {
    let mut e = Map::new();
    e.insert("code".into(), json!(code));
    e.insert("message".into(), json!(message.into()));
    if let Some(d) = data {
        e.insert("data".into(), d);
    }
    json!({
        "jsonrpc": "2.0",
        "id": id.map_or(Value::Null, Id::to_value),
        "error": Value::Object(e),
    })
}

/// What the line reader found next.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// One whole line, without its newline (and without a trailing `\r`).
    Message(Vec<u8>),
    /// A line longer than the cap; its bytes were read and dropped. `len` is its length.
    TooLong { len: usize },
    /// The input ended in the middle of a line (`len` bytes since the last newline).
    Truncated { len: usize },
    /// The input ended cleanly.
    Eof,
}

/// Reads newline-delimited messages, holding at most `max` bytes of one line.
pub struct LineReader<R> {
    inner: R,
    max: usize,
}

impl<R: BufRead> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        LineReader { inner, max }
    }

    pub fn next_line(&mut self) -> io::Result<Line> {
        let mut line: Vec<u8> = Vec::new();
        let mut len = 0usize;
        let mut too_long = false;
        loop {
            let buf = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                return Ok(if len == 0 {
                    Line::Eof
                } else {
                    Line::Truncated { len }
                });
            }
            let (chunk, found) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], true),
                None => (buf, false),
            };
            len = len.saturating_add(chunk.len());
            if !too_long {
                if len > self.max {
                    too_long = true;
                    line = Vec::new();
                } else {
                    line.extend_from_slice(chunk);
                }
            }
            let used = chunk.len() + usize::from(found);
            self.inner.consume(used);
            if found {
                if too_long {
                    return Ok(Line::TooLong { len });
                }
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(Line::Message(line));
            }
        }
    }
}

/// A short, printable excerpt of untrusted text for a log line or an error message.
pub fn excerpt(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    format!("{out:?}")
}

/// The JSON type of a value, in words.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    fn lines(input: &[u8], max: usize, cap: usize) -> Vec<Line> {
        let mut r = LineReader::new(BufReader::with_capacity(cap, input), max);
        let mut out = Vec::new();
        loop {
            let l = r.next_line().unwrap();
            let end = matches!(l, Line::Eof | Line::Truncated { .. });
            out.push(l);
            if end {
                return out;
            }
        }
    }

    #[test]
    fn splits_lines_and_strips_cr() {
        assert_eq!(
            lines(b"a\r\nbc\n\nd", 10, 2),
            vec![
                Line::Message(b"a".to_vec()),
                Line::Message(b"bc".to_vec()),
                Line::Message(Vec::new()),
                Line::Truncated { len: 1 },
            ]
        );
    }

    #[test]
    fn long_lines_are_skipped_not_kept() {
        let mut input = vec![b'x'; 100];
        input.extend_from_slice(b"\nok\n");
        assert_eq!(
            lines(&input, 10, 7),
            vec![
                Line::TooLong { len: 100 },
                Line::Message(b"ok".to_vec()),
                Line::Eof
            ]
        );
        // Exactly at the cap is accepted.
        assert_eq!(
            lines(b"0123456789\n", 10, 3),
            vec![Line::Message(b"0123456789".to_vec()), Line::Eof]
        );
    }

    #[test]
    fn ids() {
        assert_eq!(Id::from_value(&json!(5)), Some(Id::Int(5)));
        assert_eq!(Id::from_value(&json!(u64::MAX)), Some(Id::UInt(u64::MAX)));
        assert_eq!(Id::from_value(&json!("a")), Some(Id::Str("a".into())));
        for bad in [json!(null), json!(1.5), json!([1]), json!({}), json!(true)] {
            assert_eq!(Id::from_value(&bad), None, "{bad}");
        }
        let e = error(None, PARSE_ERROR, "x", None);
        assert_eq!(e["id"], Value::Null);
        assert_eq!(e["error"]["code"], -32700);
    }
}
