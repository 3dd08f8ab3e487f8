//! What the CLI prints, made safe for the operator's terminal.
//!
//! Text that came from a sandbox or a caller — a handler's output, its result, error and
//! traceback, progress text, request ids, function states and errors, a refusal's message
//! — may hold escape sequences that would retitle, clear or rewrite the operator's terminal
//! (`\x1b]0;…\x07`, `\x1b[2J`), or a carriage return that overwrites what came before it on
//! the line. Human output shows every control character as an escape instead ([`clean`]):
//! C0 except newline and tab, a carriage return that does not end a line, DEL, and the C1
//! controls U+0080–U+009F. `--json` output keeps the exact text in its JSON strings; the
//! controls serde_json leaves as they are (DEL and C1) are written as `\u` escapes there
//! ([`json`]), so that no JSON line carries a raw control either.
//!
//! `zygo run` without `--json` is the exception by design: the program's own output passes
//! through as it is written, as if the program were run directly.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is shown escaped: C0 controls but newline, tab and carriage return (which
/// [`clean`] decides on by what follows it), DEL and C1.
fn is_control(c: char) -> bool {
    matches!(c, '\0'..='\x08' | '\x0b'..='\x0c' | '\x0e'..='\x1f' | '\x7f' | '\u{80}'..='\u{9f}')
}

/// `s` with every control character written as an escape, the way Python writes them in a
/// string: a carriage return not followed by a newline as `\r`, every other one as `\xNN`
/// (ESC as `\x1b`, BEL as `\x07`, CSI as `\x9b`). Newlines, tabs and CRLF line ends stay.
/// Borrowed when there is nothing to escape, which is nearly always.
pub fn clean(s: &str) -> Cow<'_, str> {
    let needs =
        |(i, c): (usize, char)| is_control(c) || (c == '\r' && !s[i + 1..].starts_with('\n'));
    let Some((first, _)) = s.char_indices().find(|&ic| needs(ic)) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(&s[..first]);
    for (i, c) in s[first..].char_indices() {
        if needs((first + i, c)) {
            if c == '\r' {
                out.push_str("\\r");
            } else {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `v` as one line of JSON text. serde_json escapes the C0 controls in strings but writes
/// DEL and C1 as they are; here they become `\u007f`, `\u009b`, ...: the same text once
/// decoded, and no raw control on the operator's terminal. (Outside strings JSON text is
/// ASCII punctuation, digits and words, so every such character is inside a string.)
pub fn json(v: &serde_json::Value) -> String {
    let text = v.to_string();
    if !text.chars().any(is_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_control(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        let s = "hello\tworld\nsecond line, é ü 漢字\r\n";
        assert!(matches!(clean(s), Cow::Borrowed(t) if t == s));
    }

    #[test]
    fn terminal_escapes_are_shown_not_sent() {
        let s = "a\x1b]0;owned\x07b\x1b[2Jc";
        assert_eq!(clean(s), "a\\x1b]0;owned\\x07b\\x1b[2Jc");
    }

    #[test]
    fn every_c0_control_but_newline_and_tab_is_escaped() {
        for b in 0u8..0x20 {
            let c = char::from(b);
            let got = clean(&c.to_string()).into_owned();
            match c {
                '\n' | '\t' => assert_eq!(got, c.to_string()),
                '\r' => assert_eq!(got, "\\r"),
                _ => assert_eq!(got, format!("\\x{b:02x}")),
            }
        }
    }

    #[test]
    fn del_and_c1_controls_are_escaped() {
        assert_eq!(clean("\x7f"), "\\x7f");
        assert_eq!(clean("\u{80}x\u{9b}31m\u{9f}"), "\\x80x\\x9b31m\\x9f");
        // Just past C1: printable, kept.
        assert_eq!(clean("\u{a0}"), "\u{a0}");
    }

    #[test]
    fn a_lone_carriage_return_is_escaped_and_a_line_end_kept() {
        assert_eq!(clean("ok\r\nfake\rreal"), "ok\r\nfake\\rreal");
        assert_eq!(clean("at the end\r"), "at the end\\r");
    }

    #[test]
    fn cleaned_text_holds_no_control_byte() {
        let all: String = (0u32..0x100).filter_map(char::from_u32).collect();
        let out = clean(&all);
        assert!(
            !out.chars().any(|c| is_control(c) || c == '\r'),
            "a control survived: {out:?}"
        );
    }

    #[test]
    fn json_keeps_the_exact_text_with_no_raw_control() {
        let original = "t\x1b]0;x\x07 \x1b[2J \r \x7f \u{9b}2J é";
        let v = serde_json::json!({"stdout": original, "n": 1});
        let line = json(&v);
        assert!(
            !line.chars().any(|c| c.is_control()),
            "a raw control in {line:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(back["stdout"], original);
        assert_eq!(back, v);
    }
}
