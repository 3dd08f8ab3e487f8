//! A strict JSON scan that builds nothing: a value's bytes are checked in one pass, every
//! scalar in place, and the only memory that grows with the text is, while an object is
//! open, one `u32` per key it has so far (to refuse a key named twice). It keeps to
//! serde_json's grammar and to what [`crate::json::from_slice_strict`] refuses (nesting past
//! [`MAX_DEPTH`], a key named twice anywhere, compared as decoded), so text it passes is
//! text that parses, and the same value, wherever it is parsed later.
//!
//! The launcher reads a request process's lines with it (`zygo-launcher`'s `child_line`);
//! the supervisor checks a call's event with [`check_value`] and passes it on as
//! [`compact`] makes it, never as a tree.

use std::cmp::Ordering;
use std::fmt;

use crate::json::MAX_DEPTH;

/// How many of an object's keys are compared with each other as they come; past these,
/// its keys are sorted when it closes and neighbours compared.
pub const FEW_KEYS: usize = 16;
/// The most characters of a key quoted in an error.
pub const KEY_IN_ERROR: usize = 64;

/// Why a line was refused, and where (a byte offset in the line).
#[derive(Debug)]
pub struct Bad {
    pub what: String,
    pub at: usize,
}

impl fmt::Display for Bad {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        // A line has no newline in it: serde_json's "line 1", and its column, which counts
        // the bytes up to and including the one at fault.
        write!(f, "{} at line 1 column {}", self.what, self.at + 1)
    }
}

pub fn bad<T>(what: impl Into<String>, at: usize) -> Result<T, Bad> {
    Err(Bad {
        what: what.into(),
        at,
    })
}

/// Where a value is in the line: `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

/// Move the value at `span` to the front of `line` without the whitespace between its
/// tokens, and cut the line there. The span was checked: its strings are closed, and every
/// backslash in them starts an escape. Nothing written is longer than what was read, so
/// the value is compacted in place.
pub fn compact_to_front(line: &mut Vec<u8>, span: Span) {
    let mut w = 0;
    let mut r = span.start;
    let mut in_string = false;
    while r < span.end {
        let c = line[r];
        r += 1;
        if in_string {
            line[w] = c;
            w += 1;
            if c == b'\\' && r < span.end {
                // The escaped character, a quote or a backslash among them, is copied as is.
                line[w] = line[r];
                w += 1;
                r += 1;
            } else if c == b'"' {
                in_string = false;
            }
        } else if !is_space(c) {
            in_string = c == b'"';
            line[w] = c;
            w += 1;
        }
    }
    line.truncate(w);
}

/// serde_json's whitespace.
pub fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

// --- The scan ------------------------------------------------------------------------------

pub struct Scan<'a> {
    pub b: &'a [u8],
    pub i: usize,
    /// Arrays and objects open now.
    depth: usize,
    /// The keys of the objects open now, each the offset of its first byte after the
    /// opening quote; an object's keys are the end of the list while it is open, and are
    /// taken off it when it closes.
    keys: Vec<u32>,
}

impl<'a> Scan<'a> {
    pub fn new(b: &'a [u8]) -> Scan<'a> {
        Scan {
            b,
            i: 0,
            depth: 0,
            keys: Vec::new(),
        }
    }

    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub fn skip_space(&mut self) {
        while self.peek().is_some_and(is_space) {
            self.i += 1;
        }
    }

    pub fn enter(&mut self) -> Result<(), Bad> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return bad("recursion limit exceeded", self.i);
        }
        self.i += 1;
        Ok(())
    }

    /// An object member's key, at the next non-space byte: its offset (after the quote).
    pub fn key(&mut self) -> Result<usize, Bad> {
        self.skip_space();
        match self.peek() {
            Some(b'"') => {
                let at = self.i + 1;
                self.string()?;
                Ok(at)
            }
            None => bad("EOF while parsing an object", self.i),
            Some(_) => bad("key must be a string", self.i),
        }
    }

    pub fn colon(&mut self) -> Result<(), Bad> {
        self.skip_space();
        match self.peek() {
            Some(b':') => {
                self.i += 1;
                self.skip_space();
                Ok(())
            }
            None => bad("EOF while parsing an object", self.i),
            Some(_) => bad("expected `:`", self.i),
        }
    }

    /// After an object's member: true if another follows.
    pub fn next_member(&mut self) -> Result<bool, Bad> {
        self.skip_space();
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                self.skip_space();
                if self.peek() == Some(b'}') {
                    return bad("trailing comma", self.i);
                }
                Ok(true)
            }
            Some(b'}') => {
                self.i += 1;
                self.depth -= 1;
                Ok(false)
            }
            None => bad("EOF while parsing an object", self.i),
            Some(_) => bad("expected `,` or `}`", self.i),
        }
    }

    /// Any JSON value, at the current byte.
    pub fn value(&mut self) -> Result<(), Bad> {
        match self.peek() {
            None => bad("EOF while parsing a value", self.i),
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => self.string(),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(_) => bad("expected value", self.i),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Bad> {
        let rest = &self.b[self.i..];
        if rest.starts_with(word) {
            self.i += word.len();
            return Ok(());
        }
        if word.starts_with(rest) {
            return bad("EOF while parsing a value", self.b.len());
        }
        bad("expected ident", self.i)
    }

    fn array(&mut self) -> Result<(), Bad> {
        self.enter()?;
        self.skip_space();
        if self.peek() == Some(b']') {
            self.i += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            self.value()?;
            self.skip_space();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.skip_space();
                    if self.peek() == Some(b']') {
                        return bad("trailing comma", self.i);
                    }
                }
                Some(b']') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                None => return bad("EOF while parsing a list", self.i),
                Some(_) => return bad("expected `,` or `]`", self.i),
            }
        }
    }

    fn object(&mut self) -> Result<(), Bad> {
        self.enter()?;
        let base = self.keys.len();
        self.skip_space();
        if self.peek() == Some(b'}') {
            self.i += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            let key = self.key()?;
            // The first few keys are compared as they come, and a duplicate is named where
            // it is; a larger object's are sorted when it closes.
            if self.keys.len() - base < FEW_KEYS {
                let seen = self.keys[base..]
                    .iter()
                    .any(|&k| KeyBytes::new(self.b, k as usize).eq(KeyBytes::new(self.b, key)));
                if seen {
                    return bad(format!("duplicate key {}", quoted(self.b, key)), self.i - 1);
                }
            }
            self.keys.push(key as u32);
            self.colon()?;
            self.value()?;
            if !self.next_member()? {
                break;
            }
        }
        if self.keys.len() - base > FEW_KEYS {
            self.sorted_keys_differ(base)?;
        }
        self.keys.truncate(base);
        Ok(())
    }

    /// The keys of the object that just closed (from `base` on): sorted as decoded, no two
    /// neighbours equal. A duplicate is named at its second place in the line.
    fn sorted_keys_differ(&mut self, base: usize) -> Result<(), Bad> {
        let b = self.b;
        let keys = &mut self.keys[base..];
        keys.sort_unstable_by(|&x, &y| {
            KeyBytes::new(b, x as usize).cmp(KeyBytes::new(b, y as usize))
        });
        let mut second: Option<usize> = None;
        for pair in keys.windows(2) {
            let (x, y) = (pair[0] as usize, pair[1] as usize);
            if KeyBytes::new(b, x).cmp(KeyBytes::new(b, y)) == Ordering::Equal {
                let later = x.max(y);
                second = Some(second.map_or(later, |s| s.min(later)));
            }
        }
        match second {
            Some(at) => bad(
                format!("duplicate key {}", quoted(b, at)),
                string_end(b, at).saturating_sub(1),
            ),
            None => Ok(()),
        }
    }

    /// A string, at its opening quote: valid UTF-8, no control character, serde_json's
    /// escapes with `\u` surrogates in pairs. Ends after the closing quote.
    fn string(&mut self) -> Result<(), Bad> {
        self.i += 1;
        let mut run = self.i;
        loop {
            while self
                .peek()
                .is_some_and(|c| c != b'"' && c != b'\\' && c >= 0x20)
            {
                self.i += 1;
            }
            if let Err(e) = std::str::from_utf8(&self.b[run..self.i]) {
                return bad("invalid unicode code point", run + e.valid_up_to());
            }
            match self.peek() {
                None => return bad("EOF while parsing a string", self.i),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.i += 1;
                    self.escape()?;
                    run = self.i;
                }
                Some(_) => {
                    return bad(
                        "control character (\\u0000-\\u001F) found while parsing a string",
                        self.i,
                    )
                }
            }
        }
    }

    /// After a backslash.
    fn escape(&mut self) -> Result<(), Bad> {
        let Some(c) = self.peek() else {
            return bad("EOF while parsing a string", self.i);
        };
        self.i += 1;
        match c {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(()),
            b'u' => {
                let n = self.hex4()?;
                if (0xDC00..=0xDFFF).contains(&n) {
                    return bad("lone leading surrogate in hex escape", self.i - 1);
                }
                if !(0xD800..=0xDBFF).contains(&n) {
                    return Ok(());
                }
                // A leading surrogate: its trailing one must follow, escaped.
                for want in [b'\\', b'u'] {
                    match self.peek() {
                        None => return bad("EOF while parsing a string", self.i),
                        Some(c) if c == want => self.i += 1,
                        Some(_) => return bad("unexpected end of hex escape", self.i),
                    }
                }
                let n2 = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&n2) {
                    return bad("lone leading surrogate in hex escape", self.i - 1);
                }
                Ok(())
            }
            _ => bad("invalid escape", self.i - 1),
        }
    }

    fn hex4(&mut self) -> Result<u16, Bad> {
        let Some(digits) = self.b.get(self.i..self.i + 4) else {
            return bad("EOF while parsing a string", self.b.len());
        };
        self.i += 4;
        hex4(digits).map_or_else(|| bad("invalid escape", self.i - 1), Ok)
    }

    /// A number of serde_json's grammar; one that serde_json itself may refuse (past the
    /// range of an f64) is handed to it.
    fn number(&mut self) -> Result<(), Bad> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            None => return bad("EOF while parsing a value", self.i),
            Some(_) => return bad("invalid number", self.i),
        }
        // Digits before the point (a sign aside): the number is below 10 to that power,
        // times 10 to its exponent's.
        let whole = self.i - start - usize::from(self.b[start] == b'-');
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.at_least_one_digit()?;
        }
        let mut exponent: i64 = 0;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            let negative = match self.peek() {
                Some(b'-') => {
                    self.i += 1;
                    true
                }
                Some(b'+') => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            let digits = self.i;
            self.at_least_one_digit()?;
            // Only its size matters: a long exponent is counted as a large one.
            let magnitude = self.b[digits..self.i]
                .iter()
                .try_fold(0i64, |n, &d| {
                    n.checked_mul(10)?.checked_add(i64::from(d - b'0'))
                })
                .filter(|&n| n <= 100_000)
                .unwrap_or(100_000);
            exponent = if negative { -magnitude } else { magnitude };
        }
        // Below 10^300 a number is always within an f64's range, and serde_json takes
        // every number that is (one too small for it is zero): nothing to ask it. This
        // is nearly every number, so the scan rarely leaves its loop.
        if whole as i64 + exponent <= 300 {
            return Ok(());
        }
        match serde_json::from_slice::<serde_json::Number>(&self.b[start..self.i]) {
            Ok(_) => Ok(()),
            Err(e) => {
                let text = e.to_string();
                let what = text.split(" at line ").next().unwrap_or("invalid number");
                bad(what, start + e.column().saturating_sub(1))
            }
        }
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    fn at_least_one_digit(&mut self) -> Result<(), Bad> {
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                self.digits();
                Ok(())
            }
            None => bad("EOF while parsing a value", self.i),
            Some(_) => bad("invalid number", self.i),
        }
    }
}

fn hex4(digits: &[u8]) -> Option<u16> {
    digits.iter().try_fold(0u16, |n, &d| {
        let v = (d as char).to_digit(16)?;
        Some(n << 4 | v as u16)
    })
}

/// Where the string whose content starts at `at` ends: after its closing quote.
pub fn string_end(b: &[u8], at: usize) -> usize {
    let mut i = at;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => return i + 1,
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    b.len()
}

/// A key or string quoted for an error: escaped (no control character reaches a log or a
/// terminal) and cut short if long.
pub fn quoted(b: &[u8], at: usize) -> String {
    let mut head = Vec::new();
    let mut total = 0usize;
    for byte in KeyBytes::new(b, at) {
        if head.len() < 4 * KEY_IN_ERROR {
            head.push(byte);
        }
        total += 1;
    }
    let text = String::from_utf8_lossy(&head);
    let mut chars = text.chars();
    let shown: String = chars.by_ref().take(KEY_IN_ERROR).collect();
    let mut out = format!("{shown:?}");
    if chars.next().is_some() || total > head.len() {
        out.push_str(&format!("… ({total} bytes)"));
    }
    out
}

/// The bytes of a checked string, decoded, from the first byte after its opening quote to
/// its closing quote. Its escapes were checked; should one not be, it ends there.
pub struct KeyBytes<'a> {
    b: &'a [u8],
    i: usize,
    /// What an escape decoded to and is not handed out yet.
    pending: [u8; 4],
    from: usize,
    to: usize,
}

impl<'a> KeyBytes<'a> {
    pub fn new(b: &'a [u8], at: usize) -> KeyBytes<'a> {
        KeyBytes {
            b,
            i: at,
            pending: [0; 4],
            from: 0,
            to: 0,
        }
    }

    /// The escape after the backslash at `self.i`, into `pending`; false if it is not one.
    fn unescape(&mut self) -> bool {
        let Some(&c) = self.b.get(self.i + 1) else {
            return false;
        };
        let single = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => return self.unicode(),
            _ => return false,
        };
        self.i += 2;
        self.pending[0] = single;
        self.from = 0;
        self.to = 1;
        true
    }

    fn unicode(&mut self) -> bool {
        let Some(n) = self.b.get(self.i + 2..self.i + 6).and_then(hex4) else {
            return false;
        };
        let mut code = n as u32;
        let mut len = 6;
        if (0xD800..=0xDBFF).contains(&n) {
            let Some(n2) = self
                .b
                .get(self.i + 8..self.i + 12)
                .and_then(hex4)
                .filter(|n2| (0xDC00..=0xDFFF).contains(n2))
            else {
                return false;
            };
            code = 0x10000 + ((n as u32 - 0xD800) << 10) + (n2 as u32 - 0xDC00);
            len = 12;
        }
        let Some(ch) = char::from_u32(code) else {
            return false;
        };
        self.i += len;
        self.from = 0;
        self.to = ch.encode_utf8(&mut self.pending).len();
        true
    }
}

impl Iterator for KeyBytes<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        if self.from < self.to {
            self.from += 1;
            return Some(self.pending[self.from - 1]);
        }
        match *self.b.get(self.i)? {
            b'"' => None,
            b'\\' => {
                if !self.unescape() {
                    return None;
                }
                self.from = 1;
                Some(self.pending[0])
            }
            c => {
                self.i += 1;
                Some(c)
            }
        }
    }
}

/// Check that `b` is exactly one JSON value (whitespace around it aside), strictly: the
/// grammar, nesting at most [`MAX_DEPTH`], no key named twice in any object.
pub fn check_value(b: &[u8]) -> Result<(), Bad> {
    if b.len() > u32::MAX as usize / 2 {
        return bad(format!("a text of {} bytes", b.len()), 0);
    }
    let mut scan = Scan::new(b);
    scan.skip_space();
    scan.value()?;
    scan.skip_space();
    if scan.i < b.len() {
        return bad("trailing characters", scan.i);
    }
    Ok(())
}

/// A checked value without the whitespace between its tokens: one line of JSON (a raw
/// newline can only be such whitespace), made in place.
pub fn compact(text: &mut Vec<u8>) {
    let end = text.len();
    compact_to_front(text, Span { start: 0, end });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_checked_and_made_one_line() {
        for ok in [
            &b"1"[..],
            b" {\"a\": [1, 2,\n {\"b\": \"x y\\n\"}]}\n",
            b"\"\\u00e9\"",
            b"null",
        ] {
            assert!(check_value(ok).is_ok(), "{}", String::from_utf8_lossy(ok));
        }
        for bad_text in [
            &b""[..],
            b"{\"a\":1,\"a\":2}",
            b"[1,]",
            b"1 2",
            b"{\"a\":1}, \"kind\": \"x\"",
            b"\"\xff\"",
            b"1e400",
        ] {
            assert!(
                check_value(bad_text).is_err(),
                "{}",
                String::from_utf8_lossy(bad_text)
            );
        }
        // Numbers: taken exactly where serde_json takes them.
        let long = format!("{}.5", "9".repeat(400));
        let tiny = format!("0.{}1", "0".repeat(400));
        for n in [
            "1.5",
            "-0",
            "-0.0e-0",
            "3e5",
            "1e-400",
            "1e308",
            "1.7976931348623157e308",
            "1.8e308",
            "1e309",
            "-1e309",
            "0e999999999999999999999",
            "1e99999999999999999999",
            "123456789012345678901234567890",
            &long,
            &tiny,
            "1E+2",
            "2e-0300",
            "1e-99999999999999999999",
            "-5e-400",
        ] {
            let serde = serde_json::from_str::<serde_json::Value>(n).is_ok();
            assert_eq!(check_value(n.as_bytes()).is_ok(), serde, "{n}");
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(check_value(deep.as_bytes()).is_err());
        let mut v = b" {\"a\": [1, 2,\n {\"b\": \"x y\"}]}\n".to_vec();
        compact(&mut v);
        assert_eq!(v, b"{\"a\":[1,2,{\"b\":\"x y\"}]}");
    }
}
