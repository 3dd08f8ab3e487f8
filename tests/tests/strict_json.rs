//! Duplicate JSON keys fail every boundary where Zygo reads JSON it did not write: a line a
//! handler's process writes on its request channel, an event, an MCP message. serde_json
//! alone keeps the last of two equal keys, so `{"id":12,"id":13}` was read as 13; each test
//! here was answered (as the last duplicate) before `proto::json` refused them. Also here,
//! what other lines a handler forges cost: a huge result line, a flood of heartbeats.

use std::fs;
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
import signal
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


def beats(event):
    """`n` heartbeat (or progress) lines on its own request channel, as fast as it can,
    then a value."""
    if event.get("progress"):
        line = b'{"kind": "progress", "text": "x"}\n'
    else:
        line = b'{"kind": "heartbeat"}\n'
    _request_channel().sendall(line * event["n"])
    return "done"


def forge_big(event):
    """A terminal line of `bytes` bytes (newline included), written by the handler itself:
    `{"kind":"result","value":[0,0,...,0]}`, the shape that costs a parser building a
    tree the most per byte. The agent's heartbeat timer is stopped first: its line would
    land in the middle of this one."""
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    head, tail = b'{"kind":"result","value":[', b'0]}\n'
    line = head + b"0," * ((event["bytes"] - len(head) - len(tail)) // 2) + tail
    _request_channel().sendall(line)
    os._exit(0)
"#;

static SUITE: Suite = Suite {
    prefix: "sj-",
    handlers: HANDLERS,
    defaults: "timeout = \"2s\"\nmem = \"64M\"\nidle_timeout = \"30s\"\n",
    agents: true,
};

root_and_rootless!(
    a_flood_of_heartbeat_lines_reaches_the_supervisor_as_a_few_frames,
    a_result_line_with_a_duplicate_key_fails_the_call_with_a_protocol_error,
    an_event_with_a_duplicate_key_is_refused_before_anything_runs,
    a_huge_result_line_costs_the_launcher_little_more_than_its_size,
);

/// The bytes a process has read (`rchar` of /proc/PID/io).
fn bytes_read(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A handler that writes heartbeat lines in a loop (40,000 of them, 880 KB) costs the
/// supervisor, whose loop serves everyone, a few frames: the launcher sends a child's
/// heartbeats up at most once a quarter second. (Each line was a frame of its own, about
/// 1.2 MB for the supervisor to read and decode.) So do progress lines of a call whose
/// caller does not take progress as it comes: for it they only say the handler is alive.
/// The call is answered as ever.
fn a_flood_of_heartbeat_lines_reaches_the_supervisor_as_a_few_frames(who: Who) {
    let mut s = SUITE.sup(who, "beats");
    let n = s.up(&[("beats", "beats", "max_warm = 1\ntimeout = \"20s\"")]);
    let beats = &n[0];
    assert_eq!(s.call_ok(beats, r#"{"n": 1}"#), json!("done"));
    let pid = s.supervisor.expect("the supervisor's pid");
    for event in [r#"{"n": 40000}"#, r#"{"n": 40000, "progress": true}"#] {
        let before = bytes_read(pid);
        assert_eq!(s.call_ok(beats, event), json!("done"));
        let read = bytes_read(pid) - before;
        eprintln!("[{}] {event}: the supervisor read {read} bytes", who.name());
        assert!(
            read < 300_000,
            "[{}] {event}: the supervisor read {read} bytes for the call",
            who.name()
        );
    }
    s.shutdown();
}

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

/// The launcher of a function's (one) zygote: the parent of the sandbox's init, which is
/// the process in the zygote's cgroup whose parent is not.
fn launcher_pid(name: &str) -> Option<i32> {
    for z in fn_subgroups(name, "z-") {
        let procs: Vec<i32> = fs::read_to_string(z.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for p in &procs {
            let Some(pp) = ppid(*p).filter(|pp| !procs.contains(pp)) else {
                continue;
            };
            let cmd = fs::read(format!("/proc/{pp}/cmdline")).unwrap_or_default();
            if contains(&cmd, b"__launcher") {
                return Some(pp);
            }
        }
    }
    None
}

/// A process's peak resident memory so far (`VmHWM`), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status: {status}"))
}

/// The forged line: 20 000 000 bytes, just under the 20 MiB a line may have.
const HUGE_LINE: u64 = 20_000_000;

/// A handler writes its own terminal line of 20 MB (an array of ten million zeros) straight
/// to its request channel. The launcher, which runs outside every cgroup of the sandbox,
/// checks it and relays it without building a tree of it: its peak resident memory grows
/// by less than twice and a half the line (the line itself and the frame that carries the
/// value on), where parsing it into a JSON tree cost it about 35 times the line. The call
/// is answered with the value, and the zygote keeps serving.
fn a_huge_result_line_costs_the_launcher_little_more_than_its_size(who: Who) {
    let mut s = SUITE.sup(who, "huge");
    let n = s.up(&[(
        "big",
        "forge_big",
        "mem = \"256M\"\ntimeout = \"30s\"\nmax_warm = 1",
    )]);
    let big = &n[0];
    // A small forged line first: the way in works, and the launcher has relayed a call.
    assert_eq!(s.call_ok(big, r#"{"bytes": 100}"#), json!(vec![0; 36]));
    let launcher = launcher_pid(big).expect("the zygote's launcher");
    let before = peak_rss(launcher);

    let (v, f) = s.exec(big, Some(&format!(r#"{{"bytes": {HUGE_LINE}}}"#)), &[]);
    s.assert_ok(&v, &f, "a 20 MB result line");
    let zeros = v["result"].as_array().map(Vec::len).unwrap_or(0) as u64;
    assert_eq!(zeros, (HUGE_LINE - 30) / 2 + 1, "the value came whole");
    assert_eq!(
        launcher_pid(big),
        Some(launcher),
        "the same launcher served both calls"
    );
    let after = peak_rss(launcher);
    let grew = after.saturating_sub(before);
    eprintln!(
        "[{}] launcher peak RSS: {} MiB before, {} MiB after a {} MB line (+{:.2}x the line)",
        who.name(),
        before >> 20,
        after >> 20,
        HUGE_LINE / 1_000_000,
        grew as f64 / HUGE_LINE as f64
    );
    assert!(
        grew < HUGE_LINE * 5 / 2,
        "[{}] the launcher's peak RSS grew by {} MiB (from {} MiB) for a {} MB line",
        who.name(),
        grew >> 20,
        before >> 20,
        HUGE_LINE / 1_000_000
    );
    assert_eq!(
        s.call_ok(big, r#"{"bytes": 40}"#),
        json!([0, 0, 0, 0, 0, 0])
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
