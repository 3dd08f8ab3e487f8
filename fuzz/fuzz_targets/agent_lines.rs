//! Arbitrary bytes as the lines a sandbox writes to the launcher (`docs/agent-protocol.md`),
//! cut at the first newline as the launcher's reader cuts them:
//! - a request process's line, through the launcher's one-pass check
//!   (`zygo_launcher::child_line::parse`), against what it replaced: strict serde into the
//!   closed enum of the four kinds. Both refuse it, or both take it and say the same (but
//!   for the two shapes serde also took and the protocol never had: an array, a heartbeat
//!   with fields, which the check refuses). A `result`'s value is passed on as text that
//!   parses strictly to the same value and has no whitespace between its tokens; a refusal
//!   is one line without a control character (it reaches the logs);
//! - an agent's control line and a registration datagram, parsed as the launcher parses
//!   them (`proto::json::from_slice_strict` into `zygote::AgentMsg` and `Registration`):
//!   no panic, a line taken is strict JSON, and a registration's slot is the one written.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use serde_json::{json, Value};
use zygo_launcher::child_line::{parse, ChildMsg};
use zygo_launcher::zygote::{AgentMsg, Registration};

/// `child_line`'s caps on an error's message and traceback (MAX_MESSAGE, MAX_TRACEBACK):
/// below them, both pass unchanged.
const MAX_MESSAGE: usize = 64 * 1024;
const MAX_TRACEBACK: usize = 1024 * 1024;

/// The reference: what the launcher parsed a request process's lines with before.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum Tree {
    Progress { text: String },
    Heartbeat,
    Result { value: Value },
    Error {
        message: String,
        traceback: String,
        #[serde(default)]
        exit_code: Option<i32>,
    },
}

/// The shapes serde took and the protocol never had: a line that is an array, and a
/// heartbeat with fields.
fn serde_only(line: &[u8], strict: &Option<Value>) -> bool {
    let first = line.iter().find(|c| !matches!(c, b' ' | b'\t' | b'\r'));
    first == Some(&b'[')
        || matches!(strict, Some(Value::Object(o))
            if o.get("kind") == Some(&json!("heartbeat")) && o.len() > 1)
}

fn request_line(line: &[u8], strict: &Option<Value>) {
    let shown = String::from_utf8_lossy(line);
    let old = proto::json::from_slice_strict::<Tree>(line);
    let new = parse(line.to_vec());
    if let Err(e) = &new {
        assert!(e.starts_with("bad line: "), "{e}");
        assert!(!e.chars().any(char::is_control), "{shown:?}: {e:?}");
    }
    match (old, new) {
        (Err(_), Err(_)) => {}
        (Ok(_), Err(_)) if serde_only(line, strict) => {}
        (Ok(o), Err(e)) => panic!("{shown:?}: refused ({e}), was taken as {o:?}"),
        (Err(o), Ok(n)) => panic!("{shown:?}: taken as {n:?}, was refused ({o})"),
        (Ok(Tree::Result { value }), Ok(ChildMsg::Result { value: text })) => {
            let again: Value =
                proto::json::from_slice_strict(text.as_bytes()).unwrap_or_else(|e| {
                    panic!("{shown:?}: the value passed on ({text}) is not JSON: {e}")
                });
            assert_eq!(again, value, "{shown:?}: {text}");
            let mut compacted = text.clone().into_bytes();
            proto::json_scan::compact(&mut compacted);
            assert_eq!(
                compacted,
                text.as_bytes(),
                "{shown:?}: whitespace left in {text}"
            );
        }
        (Ok(Tree::Progress { text: a }), Ok(ChildMsg::Progress { text: b })) => {
            assert_eq!(a, b, "{shown:?}")
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
        ) => {
            assert_eq!(e1, e2, "{shown:?}");
            if m1.len() <= MAX_MESSAGE {
                assert_eq!(m1, m2, "{shown:?}");
            } else {
                assert!(m2.len() < m1.len(), "{shown:?}");
            }
            if t1.len() <= MAX_TRACEBACK {
                assert_eq!(t1, t2, "{shown:?}");
            } else {
                assert!(t2.len() < t1.len(), "{shown:?}");
            }
        }
        (Ok(o), Ok(n)) => panic!("{shown:?}: taken as {n:?}, was {o:?}"),
    }
}

fn control_line(line: &[u8], strict: &Option<Value>) {
    // serde's internally tagged enums also take an array, the kind first: the launcher's
    // control lines still do (no agent writes one).
    let shown = String::from_utf8_lossy(line);
    if let Ok(m) = proto::json::from_slice_strict::<AgentMsg>(line) {
        assert!(strict.is_some(), "{shown:?}: taken as {m:?}");
    }
    if let Ok(r) = proto::json::from_slice_strict::<Registration>(line) {
        let Registration::Register { slot } = &r;
        let named = match strict {
            Some(Value::Object(o)) => o.get("slot"),
            Some(Value::Array(a)) => a.get(1),
            _ => None,
        };
        assert_eq!(named, Some(&json!(slot)), "{shown:?}: taken as {r:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let line = data.split(|&c| c == b'\n').next().unwrap_or_default();
    let strict = proto::json::from_slice_strict::<Value>(line).ok();
    request_line(line, &strict);
    control_line(line, &strict);
});
