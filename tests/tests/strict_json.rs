//! Duplicate JSON keys fail every boundary where Zygo reads JSON it did not write: a line a
//! handler's process writes on its request channel, an event, an MCP message. serde_json
//! alone keeps the last of two equal keys, so `{"id":12,"id":13}` was read as 13; each test
//! here was answered (as the last duplicate) before `proto::json` refused them.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygo_tests::*;

/// The handlers: `forge` writes the line its event names on its own request channel, found
/// the way any handler could find it (the one unix stream socket the process holds), then
/// waits; `echo` returns its event.
const HANDLERS: &str = r#"
import os
import socket
import stat
import time


def _request_channel():
    found = {}
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        try:
            st = os.fstat(fd)
        except OSError:
            continue  # the listing's own descriptor
        if not stat.S_ISSOCK(st.st_mode) or st.st_ino in found:
            continue
        s = socket.socket(fileno=os.dup(fd))
        if s.family == socket.AF_UNIX and s.type == socket.SOCK_STREAM:
            found[st.st_ino] = s
        else:
            s.close()
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} unix stream sockets, not one")
    return next(iter(found.values()))


def forge(event):
    _request_channel().sendall(event["line"].encode() + b"\n")
    time.sleep(1)
    return "should not get here"


def echo(event):
    return event
"#;

static SUITE: Suite = Suite {
    prefix: "sj-",
    handlers: HANDLERS,
    defaults: "timeout = \"2s\"\nmem = \"64M\"\nidle_timeout = \"30s\"\n",
    agents: true,
};

root_and_rootless!(
    a_result_line_with_a_duplicate_key_fails_the_call_with_a_protocol_error,
    an_event_with_a_duplicate_key_is_refused_before_anything_runs,
);

/// A handler writes a terminal line whose only fault is a key named twice inside its value
/// (or in a value nested deeper): the call fails with a protocol error naming the key, at
/// once, instead of being answered with the last duplicate; the zygote keeps serving.
fn a_result_line_with_a_duplicate_key_fails_the_call_with_a_protocol_error(who: Who) {
    let mut s = SUITE.sup(who, "result");
    let n = s.up(&[("forge", "forge", ""), ("echo", "echo", "")]);
    let (forge, echo) = (&n[0], &n[1]);
    let agents = agent_pids(forge);

    // The same line without the duplicate is answered: the channel was found, the line is
    // the protocol.
    let ok = json!({"line": r#"{"kind":"result","value":{"answer":1,"other":{"answer":2}}}"#});
    let v = s.call_ok(forge, &ok.to_string());
    assert_eq!(v, json!({"answer": 1, "other": {"answer": 2}}), "{v}");

    for (line, key) in [
        (
            r#"{"kind":"result","value":{"answer":1,"answer":2}}"#,
            "answer",
        ),
        (
            r#"{"kind":"result","value":[0,{"a":{"b":1,"\u0062":2}}]}"#,
            "b",
        ),
        (r#"{"kind":"progress","text":"x","text":"y"}"#, "text"),
    ] {
        let event = json!({ "line": line }).to_string();
        let (v, f) = s.exec(forge, Some(&event), &[]);
        s.assert_failed(&v, &f, "error", "handler");
        let error = text(&v, "error");
        assert!(
            error.contains("protocol") && error.contains(&format!("duplicate key \"{key}\"")),
            "[{}] {line}: {v}",
            who.name()
        );
        assert!(
            f.elapsed < Duration::from_millis(1900),
            "{line}: answered after {:?}, not when the line arrived",
            f.elapsed
        );
    }
    assert_eq!(
        agent_pids(forge),
        agents,
        "a child's bad line replaced the zygote"
    );
    assert_eq!(
        s.call_ok(echo, r#"{"still":"serving"}"#)["still"],
        "serving"
    );
    s.shutdown();
}

/// `zygo exec f '{"a":1,"a":2}'` is refused as a bad request naming the key (as an
/// argument, on stdin, nested deeper, or as keys equal only once decoded), and the handler
/// never sees it; the same key in two different objects is fine.
fn an_event_with_a_duplicate_key_is_refused_before_anything_runs(who: Who) {
    let mut s = SUITE.sup(who, "event");
    let n = s.up(&[("echo", "echo", "")]);
    let echo = &n[0];

    for (event, key) in [
        (r#"{"a":1,"a":2}"#, "a"),
        (r#"{"x":[{"a":1,"a":2}]}"#, "a"),
        (r#"{"id":12,"\u0069d":13}"#, "id"),
    ] {
        let (v, f) = s.exec(echo, Some(event), &[]);
        let error = s.assert_refused(&v, &f, "bad_request");
        assert!(
            error.contains(&format!("duplicate key \"{key}\"")),
            "[{}] {event}: {v}",
            who.name()
        );
    }
    let mut c = s.exec_cmd(echo, Some("-"), &[]);
    let file = s.file("dup.json", br#"{"a":1,"a":2}"#);
    c.stdin(std::fs::File::open(&file).expect("open the event file"));
    let f = finish(c);
    let error = s.assert_refused(&f.last_json(), &f, "bad_request");
    assert!(error.contains("duplicate key \"a\""), "stdin: {error}");
    // Human output: one line on stderr naming the key, exit 1.
    let f = s.run(&["exec", echo, r#"{"a":1,"a":2}"#]);
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains("duplicate key \"a\""),
        "{}",
        f.stderr_text()
    );
    assert_eq!(
        s.call_ok(echo, r#"{"a":{"a":1},"b":[{"a":2}]}"#),
        json!({"a": {"a": 1}, "b": [{"a": 2}]})
    );
    s.shutdown();
}

/// The real `zygo mcp`: `{"jsonrpc":"2.0","id":12,"id":13,"method":"tools/list"}` gets the
/// parse error with a null id, never an answer as 12 or 13, and the server keeps serving.
#[test]
fn an_mcp_message_with_a_duplicate_id_is_a_parse_error_not_an_answer() {
    let runtime = TempDir::new(0o700);
    let state = TempDir::new(0o700);
    let mut c = Command::new(zygo_bin());
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/root")
        .env("ZYGO_RUNTIME_DIR", runtime.str())
        .env("ZYGO_STATE_DIR", state.str())
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for key in ["ZYGO_LOG", "ZYGO_SUBID"] {
        if let Some(v) = std::env::var_os(key) {
            c.env(key, v);
        }
    }
    let mut child = c.spawn().expect("start zygo mcp");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let mut ask = |line: &str| -> Value {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .expect("write to zygo mcp");
        let answer = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("an answer within 30 s");
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"))
    };

    let r = ask(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                   "clientInfo": {"name": "raw", "version": "1"}}})
    .to_string());
    assert!(r["result"]["protocolVersion"].is_string(), "{r}");
    let r = ask(r#"{"jsonrpc":"2.0","id":12,"id":13,"method":"tools/list"}"#);
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert_eq!(r["id"], Value::Null, "{r}");
    assert!(r.get("result").is_none(), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("duplicate key \"id\"")),
        "{r}"
    );
    // The next answer is the next request's: nothing was answered as 12 or 13.
    let r = ask(r#"{"jsonrpc":"2.0","id":14,"method":"tools/list"}"#);
    assert_eq!(r["id"], 14, "{r}");
    assert!(r["result"]["tools"].is_array(), "{r}");

    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().expect("wait for zygo mcp").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("zygo mcp did not exit when its input closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
