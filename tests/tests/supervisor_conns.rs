//! The supervisor's front connections under hostile load, on the real kernel: each test
//! starts its own supervisor and talks to its socket directly, the way a confused or
//! taken-over front (the HTTP API's workers, the MCP front) could.
//!
//! - Many connections each holding a partial frame do not grow the supervisor, which keeps
//!   answering others, and closes each of them once it has stalled mid-frame for the
//!   timeout (10 s, `FRAME_STALL` in `crates/plumbing/src/conn.rs`).
//! - A client that pipelines thousands of requests without reading its answers is held
//!   back, not buffered; it gets every answer, in order, once it reads.
//! - Past the cap on connections (256, `MAX_FRONTS`), a new one is refused with a reason.
//! - A frame as large as the cap still gets through, one after the other.
//! - A request written right behind the hello, before the welcome came back, is answered.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use proto::front::{
    ExecRequest, Hello, HelloReply, Reply, Request, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME,
};
use proto::{encode_frame, read_frame};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "conns-",
    handlers:
        "import time\n\n\ndef slow(event):\n    time.sleep(event[\"s\"])\n    return \"slept\"\n",
    defaults: "timeout = \"30s\"\nmem = \"64M\"\n",
    agents: true,
};

/// The cap on front connections (`MAX_FRONTS` in the supervisor).
const MAX_FRONTS: usize = 256;
/// How long a connection may stall mid-frame (`FRAME_STALL` in the supervisor).
const FRAME_STALL: Duration = Duration::from_secs(10);

const MB: usize = 1024 * 1024;

/// Start the test's supervisor with nothing to serve: `zygo up` in a folder with no
/// sandbox.toml. Its pid.
fn start_empty(s: &mut Sup) -> i32 {
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    assert_eq!(f.code, 0, "zygo up: {}\n{}", f.stderr_text(), s.log());
    s.find_supervisor();
    s.supervisor.expect("the supervisor's pid")
}

fn frame(req: &Request) -> Vec<u8> {
    encode_frame(req).expect("encode a request")
}

fn hello() -> Vec<u8> {
    encode_frame(&Hello {
        protocol: FRONT_PROTOCOL,
        role: Role::Cli,
        flags: Default::default(),
    })
    .expect("encode a hello")
}

/// A connection that has said hello and been welcomed.
fn welcomed(s: &Sup) -> UnixStream {
    let mut c = UnixStream::connect(s.socket()).expect("connect to the supervisor");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    c.write_all(&hello()).expect("say hello");
    match read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME) {
        Ok(HelloReply::Welcome { .. }) => c,
        other => panic!("expected a welcome, got {other:?}\n{}", s.log()),
    }
}

/// A line of `/proc/PID/status` (VmRSS, VmHWM), in KiB.
fn status_kb(pid: i32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// Whether the supervisor has closed this (non-blocking) connection.
fn is_closed(mut c: &UnixStream) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match c.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

/// `zygo ls`, which must be answered promptly.
#[track_caller]
fn ls_answers_promptly(s: &Sup, while_what: &str) {
    let t0 = Instant::now();
    let f = s.run(&["ls", "--json"]);
    let took = t0.elapsed();
    assert!(
        f.code == 0 && took < Duration::from_secs(2),
        "zygo ls {while_what}: exit {} after {took:?}: {}\n{}",
        f.code,
        f.stderr_text(),
        s.log()
    );
}

#[test]
fn stalled_partial_frames_on_200_connections_keep_the_supervisor_small() {
    let Some(mut s) = SUITE.root("stall") else {
        return;
    };
    let pid = start_empty(&mut s);
    const CONNS: usize = 200;
    const DECLARED: u32 = 24_000_000;
    const PARTIAL: usize = 4 * MB;
    // Each says hello, declares a 24 MB frame and sends 4 MB of it, as far as the
    // supervisor takes it, then stalls.
    let mut conns: Vec<(UnixStream, usize)> = (0..CONNS)
        .map(|_| {
            let mut c = welcomed(&s);
            c.write_all(&DECLARED.to_le_bytes())
                .expect("write a length");
            c.set_nonblocking(true).expect("non-blocking");
            (c, 0)
        })
        .collect();
    let started = Instant::now();
    let chunk = vec![0u8; 64 * 1024];
    while started.elapsed() < Duration::from_secs(3) {
        let mut progress = false;
        for (c, sent) in conns.iter_mut() {
            while *sent < PARTIAL {
                match c.write(&chunk[..chunk.len().min(PARTIAL - *sent)]) {
                    Ok(n) => {
                        *sent += n;
                        progress = true;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        }
        if conns.iter().all(|(_, sent)| *sent >= PARTIAL) {
            break;
        }
        if !progress {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let written: usize = conns.iter().map(|(_, n)| n).sum();
    let peak_kb = status_kb(pid, "VmHWM");
    eprintln!(
        "{CONNS} connections wrote {} MB of partial frames; supervisor peak RSS {} MB",
        written / MB,
        peak_kb / 1024
    );
    assert!(
        peak_kb < 200 * 1024,
        "the supervisor grew to {} MB holding {CONNS} partial frames ({} MB written)\n{}",
        peak_kb / 1024,
        written / MB,
        s.log()
    );
    ls_answers_promptly(&s, "while 200 connections stall mid-frame");
    // Every stalled connection is closed once the timeout has passed, and not long before.
    let open = conns.iter().filter(|(c, _)| !is_closed(c)).count();
    if started.elapsed() < FRAME_STALL / 2 {
        assert_eq!(
            open,
            CONNS,
            "connections closed after {:?}, before half the stall timeout",
            started.elapsed()
        );
    }
    wait_for(
        FRAME_STALL + Duration::from_secs(15),
        "the stalled connections to close",
        || conns.iter().all(|(c, _)| is_closed(c)),
    );
    eprintln!(
        "all {CONNS} closed {:?} after the writes began",
        started.elapsed()
    );
    let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
    let reasons = log.matches("its frame stayed incomplete for 10s").count();
    assert_eq!(
        reasons,
        CONNS,
        "each closed connection is logged once with its reason\n{}",
        s.log()
    );
    eprintln!(
        "supervisor RSS after they closed: {} MB",
        status_kb(pid, "VmRSS") / 1024
    );
    ls_answers_promptly(&s, "after the stalled connections were closed");
    s.shutdown();
}

#[test]
fn a_client_that_queues_thousands_of_requests_without_reading_cannot_grow_the_supervisor() {
    let Some(mut s) = SUITE.root("queue") else {
        return;
    };
    let names = s.up(&[("slow", "slow", "")]);
    let pid = s.supervisor.expect("the supervisor's pid");
    let mut c = welcomed(&s);
    // One call that takes a while, then thousands of requests behind it, each carrying
    // 30 KB, none of whose answers are read until every one has been written.
    c.write_all(&frame(&Request::Exec(ExecRequest {
        name: names[0].clone(),
        event: r#"{"s": 8}"#.into(),
        key: None,
        timeout_ms: None,
        stream: false,
        script: None,
        workspace: None,
        workspace_blob: None,
        out: false,
    })))
    .expect("send the call");
    let cancel = frame(&Request::Cancel {
        key: "k".repeat(30_000),
    });
    const WANT: usize = 8_000;
    let mut whole = 0usize;
    let mut partial = 0usize;
    let mut last_progress = Instant::now();
    // The first writes, while the call runs, are what the supervisor must not buffer.
    c.set_nonblocking(true).expect("non-blocking");
    while whole < WANT && last_progress.elapsed() < Duration::from_secs(2) {
        match c.write(&cancel[partial..]) {
            Ok(n) => {
                partial += n;
                if partial == cancel.len() {
                    whole += 1;
                    partial = 0;
                }
                last_progress = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("write request {whole}: {e}\n{}", s.log()),
        }
    }
    let peak_kb = status_kb(pid, "VmHWM");
    eprintln!(
        "{whole} requests ({} MB) written behind a running call; supervisor peak RSS {} MB",
        whole * cancel.len() / MB,
        peak_kb / 1024
    );
    assert!(
        peak_kb < 100 * 1024,
        "the supervisor grew to {} MB queueing {whole} requests\n{}",
        peak_kb / 1024,
        s.log()
    );
    assert!(
        whole < WANT,
        "all {WANT} requests were taken in while the first call ran: nothing held them back"
    );
    ls_answers_promptly(&s, "while a client's requests are held back");
    // Now the rest, blocking, while another thread reads every answer: each is answered,
    // in order, the call's first.
    c.set_nonblocking(false).expect("blocking");
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut r = c.try_clone().expect("clone the socket");
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..=WANT {
            match read_frame::<_, Reply>(&mut r, MAX_FRONT_FRAME) {
                Ok(reply) => got.push(reply),
                Err(e) => return (got, Some(e.to_string())),
            }
        }
        (got, None)
    });
    c.write_all(&cancel[partial..]).expect("finish a request");
    for _ in whole + 1..WANT {
        c.write_all(&cancel).expect("write a request");
    }
    let (got, err) = reader.join().expect("the reader");
    assert!(
        err.is_none() && got.len() == WANT + 1,
        "{} answers of {}: {err:?}\n{}",
        got.len(),
        WANT + 1,
        s.log()
    );
    assert!(
        matches!(&got[0], Reply::Answer(a) if a.result.as_deref() == Some("\"slept\"")),
        "the call's answer first, got {:?}",
        got[0]
    );
    assert!(
        got[1..]
            .iter()
            .all(|r| matches!(r, Reply::Cancelled { count: 0 })),
        "every request behind it answered"
    );
    drop(c);
    s.shutdown();
}

#[test]
fn connections_past_the_cap_are_refused_with_a_reason() {
    let Some(mut s) = SUITE.root("cap") else {
        return;
    };
    start_empty(&mut s);
    let mut held: Vec<UnixStream> = (0..MAX_FRONTS).map(|_| welcomed(&s)).collect();
    let mut extra = UnixStream::connect(s.socket()).expect("connect past the cap");
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    // The refusal comes whether or not the hello was written.
    let _ = extra.write_all(&hello());
    match read_frame::<_, HelloReply>(&mut extra, MAX_FRONT_FRAME) {
        Ok(HelloReply::Refused { reason }) => assert!(
            reason.contains("connections"),
            "the refusal names the cap: {reason}"
        ),
        other => panic!("expected a refusal past {MAX_FRONTS} connections, got {other:?}"),
    }
    let f = s.run(&["ls"]);
    assert!(
        f.code != 0 && f.stderr_text().contains("connections"),
        "zygo ls past the cap says why: exit {}, {}",
        f.code,
        f.stderr_text()
    );
    // One closes: a new one is welcomed.
    held.pop();
    wait_for(
        Duration::from_secs(5),
        "a connection to be welcomed",
        || {
            let mut c = UnixStream::connect(s.socket()).expect("connect");
            c.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("read timeout");
            let _ = c.write_all(&hello());
            matches!(
                read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME),
                Ok(HelloReply::Welcome { .. })
            )
        },
    );
    drop(held);
    wait_for(Duration::from_secs(5), "zygo ls to work again", || {
        s.run(&["ls"]).code == 0
    });
    s.shutdown();
}

#[test]
fn frames_at_the_cap_still_get_through_one_behind_the_other() {
    let Some(mut s) = SUITE.root("big") else {
        return;
    };
    let pid = start_empty(&mut s);
    // Two requests as large as a frame may be, written in one go.
    let big = frame(&Request::Cancel {
        key: "k".repeat(MAX_FRONT_FRAME - 64),
    });
    let mut c = welcomed(&s);
    let mut w = c.try_clone().expect("clone the socket");
    let writer = std::thread::spawn(move || {
        for _ in 0..2 {
            w.write_all(&big).expect("write a frame at the cap");
        }
    });
    for i in 0..2 {
        match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
            Ok(Reply::Cancelled { count: 0 }) => {}
            other => panic!("frame {i} at the cap: {other:?}\n{}", s.log()),
        }
    }
    writer.join().expect("the writer");
    eprintln!(
        "supervisor peak RSS after two {} MiB frames: {} MB",
        MAX_FRONT_FRAME / MB,
        status_kb(pid, "VmHWM") / 1024
    );
    drop(c);
    s.shutdown();
}

#[test]
fn a_request_pipelined_behind_the_hello_is_answered() {
    let Some(mut s) = SUITE.root("pipelined") else {
        return;
    };
    start_empty(&mut s);
    let mut both = hello();
    both.extend(frame(&Request::List));
    let mut answered = 0;
    let mut failures = Vec::new();
    for _ in 0..100 {
        let mut c = UnixStream::connect(s.socket()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        c.write_all(&both)
            .expect("write hello and request in one write");
        let welcome = read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME);
        let answer = read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME);
        match (welcome, answer) {
            (Ok(HelloReply::Welcome { .. }), Ok(Reply::Functions(_))) => answered += 1,
            other => failures.push(format!("{other:?}")),
        }
    }
    assert_eq!(
        answered,
        100,
        "requests written with the hello were dropped: {failures:?}\n{}",
        s.log()
    );
    s.shutdown();
}
