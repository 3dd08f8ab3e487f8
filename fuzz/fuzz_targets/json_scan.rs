//! Arbitrary bytes through the one-pass strict JSON check (`proto::json_scan`), against the
//! strict parser it stands in for (`proto::json::from_slice_strict` into a `Value`):
//! - `check_value` takes exactly the texts the parser takes (ok iff ok), and a refusal
//!   points inside the text;
//! - for a text both take, `compact` makes one line with no whitespace between tokens (no
//!   raw newline, carriage return or tab at all: inside strings they are refused), which
//!   the check takes again, which `compact` leaves as it is, and which parses to the same
//!   value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::json_scan::{check_value, compact};
use serde_json::Value;

/// Whether a checked text has a space outside its strings.
fn space_between_tokens(text: &[u8]) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    for &c in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
        } else if c == b' ' {
            return true;
        } else {
            in_string = c == b'"';
        }
    }
    false
}

fuzz_target!(|data: &[u8]| {
    let scan = check_value(data);
    let strict = proto::json::from_slice_strict::<Value>(data);
    let shown = String::from_utf8_lossy(data);
    let value = match (scan, strict) {
        (Ok(()), Ok(v)) => v,
        (Err(e), Err(_)) => {
            assert!(
                e.at <= data.len(),
                "{shown:?}: refused at {} of {}",
                e.at,
                data.len()
            );
            return;
        }
        (Ok(()), Err(e)) => panic!("{shown:?}: the scan takes it, the parser refuses it: {e}"),
        (Err(e), Ok(v)) => panic!("{shown:?}: the scan refuses it ({e}), the parser takes it: {v}"),
    };
    let mut text = data.to_vec();
    compact(&mut text);
    assert!(text.len() <= data.len());
    assert!(
        !text.iter().any(|c| matches!(c, b'\n' | b'\r' | b'\t')),
        "{shown:?}: compacted to {:?}",
        String::from_utf8_lossy(&text)
    );
    assert!(!space_between_tokens(&text), "{shown:?}");
    assert!(check_value(&text).is_ok(), "{shown:?}");
    let mut again = text.clone();
    compact(&mut again);
    assert_eq!(again, text, "{shown:?}: compact is not idempotent");
    let reparsed: Value = proto::json::from_slice_strict(&text).unwrap_or_else(|e| {
        panic!(
            "{shown:?}: compacted to {:?}, which does not parse: {e}",
            String::from_utf8_lossy(&text)
        )
    });
    assert_eq!(reparsed, value, "{shown:?}");
});
