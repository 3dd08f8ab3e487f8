//! Arbitrary text as a dependency set's inputs from a caller without deploy rights
//! (`POST /deps`): a `requirements.txt` (`policy::deps::check_requirements`), and a
//! `package.json` with its `package-lock.json` (`policy::deps::check_node`; the input is
//! split at its first NUL).
//! - no panic; a refusal names its file, a requirements line that exists (1-based), and
//!   says what it refuses without a raw C0 control character (it is shown to the caller
//!   and logged: the caller's text in it is escaped);
//! - a requirements text that is taken, read the way pip reads it (`pip/_internal/req/
//!   req_file.py`: `str.splitlines`, lines joined at a trailing backslash, comments
//!   stripped, each line split into its arguments and its options, the options with
//!   `shlex`), names registry packages only: no option but `--hash=`, and no `:`, `/`,
//!   `@`, `\` or `$` outside one (no URL, path, direct reference or variable).
#![no_main]

use libfuzzer_sys::fuzz_target;
use policy::deps::{check_node, check_requirements, Refused};

/// Python's `str.splitlines` ends a line at these, besides `\n` and `\r\n`.
/// `check_requirements` refuses them (a comment ending a line once hid what followed
/// such a break, which pip read as a line of its own: `six # \x0c--index-url ...`), so
/// texts with them are compared with pip like any other; `false` would leave them out.
const PIP_LINE_BREAKS_CHECKED: bool = true;

/// Whether a requirement's own options are compared with pip's shlex reading of them
/// (`six --hash=sha256:ab ""--global-option=x` gives pip `--global-option=x`;
/// `check_requirements` refuses quotes and backslashes among options).
const REQUIREMENT_OPTIONS_CHECKED: bool = true;

fn python_only_break(text: &str) -> bool {
    let b = text.as_bytes();
    text.char_indices().any(|(i, c)| match c {
        '\r' => b.get(i + 1) != Some(&b'\n'),
        '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}' => true,
        _ => false,
    })
}

/// Python's `str.isspace` (and `\s` in a `str` pattern).
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// `str.splitlines()`.
fn py_splitlines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut it = text.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let brk = matches!(
            c,
            '\n' | '\r'
                | '\x0b'
                | '\x0c'
                | '\x1c'
                | '\x1d'
                | '\x1e'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if !brk {
            continue;
        }
        lines.push(&text[start..i]);
        start = i + c.len_utf8();
        if c == '\r' && it.peek().is_some_and(|&(_, n)| n == '\n') {
            it.next();
            start += 1;
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// `COMMENT_RE.match(line)`: `(^|\s+)#` at the start.
fn py_comment_line(line: &str) -> bool {
    line.trim_start_matches(py_space).starts_with('#')
}

/// `COMMENT_RE.sub("", line)`: from the first `#` that starts the line or follows
/// whitespace, to the end.
fn py_strip_comment(line: &str) -> &str {
    let mut prev: Option<char> = None;
    for (i, c) in line.char_indices() {
        if c == '#' && prev.is_none_or(py_space) {
            return &line[..i];
        }
        prev = Some(c);
    }
    line
}

/// pip's logical lines: split, joined, without comments, stripped, not empty.
fn pip_lines(text: &str) -> Vec<String> {
    let mut joined = Vec::new();
    let mut pending: Option<String> = None;
    for line in py_splitlines(text) {
        if !line.ends_with('\\') || py_comment_line(line) {
            let line = if py_comment_line(line) {
                format!(" {line}")
            } else {
                line.to_string()
            };
            match pending.take() {
                Some(mut p) => {
                    p.push_str(&line);
                    joined.push(p);
                }
                None => joined.push(line),
            }
        } else {
            pending
                .get_or_insert_with(String::new)
                .push_str(line.trim_matches('\\'));
        }
    }
    joined.extend(pending);
    joined
        .iter()
        .map(|l| py_strip_comment(l).trim_matches(py_space).to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// `shlex.split` (POSIX mode, no comments) as far as it matters here: quotes group and go.
fn shlex_split(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.get_or_insert_with(String::new).push(c),
            None if matches!(c, ' ' | '\t' | '\r' | '\n') => out.extend(word.take()),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            None => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// What pip would do with one logical line, if it names anything but registry packages.
fn pip_line_refusal(line: &str) -> Option<String> {
    // `break_args_options`: the arguments end at the first token (split at spaces) that
    // starts with `-`; the rest are options, read with shlex and optparse.
    let tokens: Vec<&str> = line.split(' ').collect();
    let first_option = tokens
        .iter()
        .position(|t| t.starts_with('-'))
        .unwrap_or(tokens.len());
    let args = tokens[..first_option].join(" ");
    if let Some(c) = args
        .chars()
        .find(|c| matches!(c, ':' | '/' | '@' | '\\' | '$'))
    {
        return Some(format!("the requirement {args:?} has {c:?}"));
    }
    // A line without a requirement is a line of options for the whole file (`-r`, `-e`,
    // `--index-url`, ...); on a requirement's line only its own (`--hash`,
    // `--global-option`, `--install-option`) take effect.
    if !args.is_empty() && !REQUIREMENT_OPTIONS_CHECKED {
        return None;
    }
    let options = tokens[first_option..].join(" ");
    shlex_split(&options)
        .into_iter()
        .find(|o| o.starts_with('-') && !o.starts_with("--hash="))
        .map(|o| format!("the option {o:?}"))
}

fn well_said(r: &Refused) {
    let text = r.to_string();
    // serde_json's text of a value (quoted in some lock refusals) escapes C0 controls only.
    assert!(!text.chars().any(|c| c < ' ' || c == '\x1b'), "{text:?}");
}

fn requirements(text: &str) {
    match check_requirements(text) {
        Err(r) => {
            assert_eq!(r.file, "requirements.txt");
            assert!(r.line >= 1 && r.line <= text.lines().count().max(1), "{r}");
            well_said(&r);
        }
        Ok(()) => {
            if python_only_break(text) && !PIP_LINE_BREAKS_CHECKED {
                return;
            }
            for line in pip_lines(text) {
                if let Some(why) = pip_line_refusal(&line) {
                    panic!("{text:?} was taken, and pip reads the line {line:?}: {why}");
                }
            }
        }
    }
}

fn node(text: &str) {
    let (manifest, lock) = text.split_once('\0').unwrap_or((text, "{}"));
    if let Err(r) = check_node(manifest, lock) {
        assert!(
            matches!(r.file, "package.json" | "package-lock.json"),
            "{r}"
        );
        assert_eq!(r.line, 0);
        well_said(&r);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    requirements(text);
    node(text);
});
