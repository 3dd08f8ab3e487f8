//! One-shot runs asked of a running supervisor (`Request::Run`, what `POST /run` sends),
//! through a real supervisor and the real kernel, as root and rootless: each test starts
//! its own supervisor (with nothing to serve) and talks to its socket as the CLI role.
//!
//! - The program's output, exit code and signal come back; a non-zero exit is an answer,
//!   not a refusal.
//! - Its deadline kills it (`timed_out`, exit 137), and the answer comes soon after.
//! - A memory limit it passes kills it (`oom_killed`, from the cgroup's counter); a pids
//!   limit stops it forking.
//! - stdin reaches it.
//! - A plan the host cannot build (an image that is not there) is answered `started:
//!   false`, phase `plan`; a spec that does not parse, names an unknown key, or asks for
//!   what only sandbox.toml may (`unlimited`, host networking) is refused `bad_spec`.
//! - A cancel under its key ends it (`error: "cancelled"`), and so does its caller leaving.
//! - Many runs at once do not hold up other requests.
//! - Past the most runs at once (64; `ZYGO_MAX_RUNS` lowers it here) one more is busy.
//! - A drain refuses new runs and cuts off the ones still going when its grace ends.
//! - Each finished run writes one usage record (`api:run`).
//! - Afterwards no run cgroup and no launcher are left ([`Sup::shutdown`] checks the
//!   processes; [`no_run_cgroups`] the cgroups).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use proto::api::RunAnswer;
use proto::front::{
    ErrorCode, Hello, HelloReply, Reply, Request, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME,
};
use proto::{encode_frame, read_frame};
use serde_json::json;
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "runs-",
    handlers: "",
    defaults: "",
    agents: false,
};

/// Start the test's supervisor with nothing to serve.
fn start(who: Who, test: &str) -> Sup {
    let mut s = SUITE.sup(who, test);
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    assert_eq!(
        f.code,
        0,
        "[{}] zygo up: {}\n{}",
        who.name(),
        f.stderr_text(),
        s.log()
    );
    s.find_supervisor();
    assert!(s.supervisor.is_some(), "no supervisor found\n{}", s.log());
    s
}

/// A connection to the supervisor that has said hello as the CLI.
fn connect(s: &Sup) -> UnixStream {
    let mut c = UnixStream::connect(s.socket()).expect("connect to the supervisor");
    c.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("read timeout");
    let hello = encode_frame(&Hello {
        protocol: FRONT_PROTOCOL,
        role: Role::Cli,
        flags: Default::default(),
    })
    .expect("encode a hello");
    c.write_all(&hello).expect("say hello");
    match read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME) {
        Ok(HelloReply::Welcome { .. }) => c,
        other => panic!("expected a welcome, got {other:?}\n{}", s.log()),
    }
}

fn send(c: &mut UnixStream, r: &Request) {
    c.write_all(&encode_frame(r).expect("encode a request"))
        .expect("send a request");
}

fn ask(s: &Sup, r: &Request) -> Reply {
    let mut c = connect(s);
    send(&mut c, r);
    read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME)
        .unwrap_or_else(|e| panic!("read the answer: {e}\n{}", s.log()))
}

/// `Request::Run` with this spec, on a connection of its own: the reply.
fn run_reply(s: &Sup, spec: &serde_json::Value) -> Reply {
    ask(
        s,
        &Request::Run {
            spec: zygo_tests::api::run_body(spec),
        },
    )
}

/// A run that must be answered with a `RunAnswer`.
#[track_caller]
fn run(s: &Sup, spec: serde_json::Value) -> RunAnswer {
    match run_reply(s, &spec) {
        Reply::RunAnswer(a) => a,
        other => panic!(
            "[{}] {spec}: expected a run's answer, got {other:?}\n{}",
            s.who.name(),
            s.log()
        ),
    }
}

/// A run that must be refused as a bad spec: the message. A body the HTTP front cannot
/// parse is refused there (its message is the answer, `bad_spec`); one it parses is sent to
/// the supervisor, which must refuse it.
#[track_caller]
fn refused(s: &Sup, spec: &str) -> String {
    let body = match zygo_front::http::bodies::run::parse(spec.as_bytes()) {
        Ok(b) => b,
        Err(message) => return message,
    };
    match ask(s, &Request::Run { spec: body }) {
        Reply::Error {
            code: ErrorCode::BadSpec,
            message,
            ..
        } => message,
        other => panic!(
            "[{}] {spec}: expected a bad_spec refusal, got {other:?}",
            s.who.name()
        ),
    }
}

/// The run cgroups of this supervisor that exist (`tenants/_host/_run/r-<pid>-…`).
fn run_cgroups(s: &Sup) -> Vec<PathBuf> {
    let prefix = format!("r-{}-", s.supervisor.expect("the supervisor's pid"));
    zygo_cgroup_roots()
        .into_iter()
        .map(|r| r.join("tenants/_host/_run"))
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

/// No run cgroup of this supervisor is left (they go off the loop, a moment after the
/// answer).
#[track_caller]
fn no_run_cgroups(s: &Sup) {
    let mut left = Vec::new();
    wait_for_quietly(Duration::from_secs(5), || {
        left = run_cgroups(s);
        left.is_empty()
    });
    assert!(
        left.is_empty(),
        "[{}] run cgroups left behind: {left:?}\n{}",
        s.who.name(),
        s.log()
    );
}

/// Drain the supervisor and check that nothing of it or its runs is left.
fn end(s: Sup) {
    no_run_cgroups(&s);
    let pid = s.supervisor;
    s.shutdown();
    // The folder of the runs goes with the last supervisor that used it; this one's are
    // gone in any case.
    if let Some(pid) = pid {
        let prefix = format!("r-{pid}-");
        for r in zygo_cgroup_roots() {
            let d = r.join("tenants/_host/_run");
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                assert!(
                    !e.file_name().to_string_lossy().starts_with(&prefix),
                    "{} left after the drain",
                    e.path().display()
                );
            }
        }
    }
}

#[track_caller]
fn assert_is_request_id(a: &RunAnswer) {
    assert!(is_hex(&a.request_id, 32), "request id {:?}", a.request_id);
}

/// The usage record of one run (written once its answer has gone out): there must be
/// exactly one.
#[track_caller]
fn usage_record(s: &Sup, request_id: &str) -> serde_json::Value {
    let usage = s.st.join("usage.log");
    let mut line = serde_json::Value::Null;
    wait_for(Duration::from_secs(5), "the run's usage record", || {
        let text = std::fs::read_to_string(&usage).unwrap_or_default();
        let found: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|v: &serde_json::Value| v["request_id"] == request_id)
            .collect();
        assert!(found.len() <= 1, "{found:?}");
        line = found.into_iter().next().unwrap_or_default();
        !line.is_null()
    });
    line
}

fn output_and_exit_code(who: Who) {
    let s = start(who, "out");
    let a = run(
        &s,
        json!({"cmd": ["sh", "-c", "echo out; echo err >&2; echo $GREETING"],
               "env": {"GREETING": "hi"}, "timeout": "20s"}),
    );
    assert!(a.started, "{a:?}\n{}", s.log());
    assert_eq!(a.phase, "run");
    assert_eq!(a.error, None, "{a:?}");
    assert_eq!((a.exit_code, a.signal), (Some(0), None), "{a:?}");
    assert_eq!(a.stdout, "out\nhi\n");
    assert_eq!(a.stderr, "err\n");
    assert!(!a.stdout_truncated && !a.stderr_truncated);
    assert!(!a.timed_out && !a.oom_killed);
    assert!(a.wall_us > 0, "{a:?}");
    assert!(a.peak_rss_kb > 0, "{a:?}");
    assert_is_request_id(&a);
    let line = usage_record(&s, &a.request_id);
    assert_eq!(line["function"], "api:run", "{line}");
    assert_eq!(line["tenant"], "_host", "{line}");
    assert_eq!(line["outcome"], "ok", "{line}");
    // A non-zero exit, and a signal, are answers too.
    let a = run(&s, json!({"cmd": ["sh", "-c", "echo bye; exit 3"]}));
    assert!(a.started && a.error.is_none(), "{a:?}");
    assert_eq!(
        (a.exit_code, a.signal, a.stdout.as_str()),
        (Some(3), None, "bye\n")
    );
    let a = run(&s, json!({"cmd": ["sh", "-c", "kill -TERM $$"]}));
    assert_eq!((a.exit_code, a.signal), (Some(128 + 15), Some(15)), "{a:?}");
    end(s);
}

/// A supervisor alone in its cgroup (a base of the test's own, `$ZYGO_CGROUP`) takes
/// Zygo's whole tree with it when it stops: its runs' folders, their caller's folder and
/// `tenants` (the caller's folder and `tenants` were once left behind, so Zygo's root in
/// every hierarchy stayed after `zygo down`).
#[test]
fn a_supervisor_alone_leaves_no_cgroup_when_it_stops() {
    if !root_only() {
        return;
    }
    let t = OwnRoot::make();
    let mut s = SUITE.sup(Who::Root, "alone");
    s.env("ZYGO_CGROUP", &t.env);
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    assert_eq!(f.code, 0, "zygo up: {}\n{}", f.stderr_text(), s.log());
    s.find_supervisor();
    assert!(s.supervisor.is_some(), "no supervisor found\n{}", s.log());
    let a = run(&s, json!({"cmd": ["true"]}));
    assert_eq!(a.exit_code, Some(0), "{a:?}");
    let runs: Vec<PathBuf> = t
        .roots
        .iter()
        .map(|r| r.join("tenants/_host/_run"))
        .collect();
    assert!(
        runs.iter().all(|d| d.is_dir()),
        "the runs' folder is not where the test looks: {runs:?}"
    );
    s.shutdown();
    let left = t.left();
    assert!(
        left.is_empty(),
        "left after the supervisor stopped: {left:?}"
    );
}

fn output_past_the_cap_is_cut_and_marked(who: Who) {
    let s = start(who, "cap");
    let a = run(
        &s,
        json!({"cmd": ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a; echo tail >&2"]}),
    );
    assert_eq!(a.exit_code, Some(0), "{a:?}");
    assert_eq!(a.stdout.len(), 1024 * 1024);
    assert!(a.stdout.bytes().all(|b| b == b'a'));
    assert!(a.stdout_truncated);
    assert_eq!((a.stderr.as_str(), a.stderr_truncated), ("tail\n", false));
    end(s);
}

/// Past the cap, output is drained into `/dev/null` a chunk at a time at a bounded
/// pace, not read as fast as the program writes: a program writing without end waits on
/// its full pipe rather than making the supervisor's loop (every tenant's) move its bytes.
/// Here the program writes for 1.5 s and says how much it got through: drained at the
/// loop's speed that was hundreds of megabytes; now it is a few.
fn output_past_the_cap_is_drained_at_a_bounded_pace(who: Who) {
    let s = start(who, "drainpace");
    let program = "import os, sys, time\n\
                   chunk = b'x' * 65536\n\
                   n, t0 = 0, time.time()\n\
                   while time.time() - t0 < 1.5:\n    n += os.write(1, chunk)\n\
                   sys.stderr.write(str(n))\n";
    let a = run(
        &s,
        json!({"cmd": ["python3", "-c", program], "timeout": "30s"}),
    );
    assert_eq!(a.exit_code, Some(0), "{a:?}");
    assert_eq!(a.stdout.len(), 1024 * 1024);
    assert!(a.stdout_truncated);
    let written: u64 = a.stderr.trim().parse().unwrap_or_else(|_| panic!("{a:?}"));
    eprintln!(
        "[{}] the program wrote {written} bytes in 1.5 s",
        who.name()
    );
    assert!(
        written > 1024 * 1024 && written < 32 << 20,
        "[{}] the program wrote {written} bytes in 1.5 s",
        who.name()
    );
    end(s);
}

fn the_deadline_kills_it(who: Who) {
    let s = start(who, "deadline");
    let t0 = Instant::now();
    let a = run(
        &s,
        json!({"cmd": ["sh", "-c", "echo before; sleep 60"], "timeout": "1s"}),
    );
    let took = t0.elapsed();
    assert!(
        a.started && a.timed_out && !a.oom_killed,
        "{a:?}\n{}",
        s.log()
    );
    assert_eq!(a.exit_code, Some(137), "{a:?}\n{}", s.log());
    assert_eq!(a.stdout, "before\n");
    assert!(
        (1_000_000..3_000_000).contains(&a.wall_us),
        "wall {} µs for a 1 s limit",
        a.wall_us
    );
    // The answer follows the deadline closely (the bound is loose: the machine is shared).
    eprintln!("a run with a 1 s limit was answered after {took:?}");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert_eq!(usage_record(&s, &a.request_id)["outcome"], "timeout");
    end(s);
}

fn a_memory_limit_kills_it_as_oom(who: Who) {
    let s = start(who, "oom");
    let a = run(
        &s,
        json!({"cmd": ["python3", "-c", "x = b'x' * (256 * 1024 * 1024)\nprint('survived')"],
               "mem": "64M", "timeout": "30s"}),
    );
    assert!(a.started, "{a:?}\n{}", s.log());
    assert!(a.oom_killed && !a.timed_out, "{a:?}");
    assert_eq!(a.exit_code, Some(137), "{a:?}");
    assert!(!a.stdout.contains("survived"));
    assert_eq!(usage_record(&s, &a.request_id)["outcome"], "error");
    assert!(a.peak_rss_kb <= 64 * 1024 + 1024, "{a:?}");
    end(s);
}

fn a_pids_limit_stops_it_forking(who: Who) {
    let s = start(who, "pids");
    let code = "import os, time\nn = 0\ntry:\n    while n < 50:\n        if os.fork() == 0:\n            time.sleep(10)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)\n";
    let a = run(
        &s,
        json!({"cmd": ["python3", "-c", code], "pids": 4, "timeout": "30s"}),
    );
    assert!(a.started && a.exit_code == Some(0), "{a:?}\n{}", s.log());
    let n: u32 = a.stdout.trim().parse().expect("a count");
    assert!(n < 4, "forked {n} children under a limit of 4 processes");
    end(s);
}

fn stdin_reaches_it(who: Who) {
    let s = start(who, "stdin");
    let a = run(
        &s,
        json!({"cmd": ["sh", "-c", "cat; echo; wc -c < /dev/stdin"], "stdin": "hello\nwörld"}),
    );
    assert_eq!(a.exit_code, Some(0), "{a:?}\n{}", s.log());
    // Read from its start each time it is opened: the whole text again.
    assert_eq!(a.stdout, "hello\nwörld\n12\n");
    // Without stdin, end of file.
    let a = run(&s, json!({"cmd": ["sh", "-c", "cat; echo end"]}));
    assert_eq!(a.stdout, "end\n");
    // A program cannot change what it was given: the file is sealed.
    let a = run(
        &s,
        json!({"cmd": ["sh", "-c", "echo x >/dev/stdin && echo wrote"], "stdin": "abc"}),
    );
    assert!(!a.stdout.contains("wrote"), "{a:?}");
    end(s);
}

fn a_plan_the_host_cannot_build_is_not_started(who: Who) {
    let s = start(who, "plan");
    let a = run(
        &s,
        json!({"cmd": ["true"], "image": "dir:/nonexistent/zygo-test-image"}),
    );
    assert!(!a.started, "{a:?}");
    assert_eq!(a.phase, "plan");
    let error = a.error.clone().unwrap_or_default();
    assert!(error.contains("/nonexistent/zygo-test-image"), "{error}");
    assert_eq!(
        (a.exit_code, a.timed_out, a.oom_killed),
        (None, false, false)
    );
    assert_is_request_id(&a);
    assert_eq!(usage_record(&s, &a.request_id)["outcome"], "error");
    // A program that is not there: the sandbox was built, the program did not start.
    let a = run(&s, json!({"cmd": ["/no/such/program"]}));
    assert!(!a.started, "{a:?}");
    assert_eq!(a.phase, "start", "{a:?}");
    assert!(
        a.error
            .as_deref()
            .is_some_and(|e| e.contains("/no/such/program")),
        "{a:?}"
    );
    end(s);
}

fn bad_specs_are_refused(who: Who) {
    let s = start(who, "spec");
    let m = refused(&s, r#"{"cmd": ["true"], "nope": 1}"#);
    assert!(m.contains("unknown key \"nope\""), "{m}");
    let m = refused(&s, r#"{"cmd": ["true"], "mem": "unlimited"}"#);
    assert!(m.contains("only in sandbox.toml"), "{m}");
    let m = refused(&s, r#"{"cmd": ["true"], "timeout": "unlimited"}"#);
    assert!(m.contains("only in sandbox.toml"), "{m}");
    let m = refused(&s, r#"{"cmd": ["true"], "network": "host"}"#);
    assert!(m.contains("only in sandbox.toml"), "{m}");
    let m = refused(&s, r#"{"cmd": ["true"], "allow": ["pypi.org:443"]}"#);
    assert!(m.contains("--net egress"), "{m}");
    let m = refused(
        &s,
        r#"{"cmd": ["true"], "network": "egress", "allow": ["[2001:db8::1]:443"]}"#,
    );
    assert!(m.contains("IPv4 only"), "{m}");
    let m = refused(&s, r#"{"cmd": ["true"], "cmd": ["false"]}"#);
    assert!(m.contains("duplicate key"), "{m}");
    let m = refused(&s, r#"{"cmd": []}"#);
    assert!(m.contains("cmd is empty"), "{m}");
    let m = refused(&s, "not json");
    assert!(m.contains("not valid JSON"), "{m}");
    let m = refused(&s, r#"{"cmd": ["true"], "mounts": []}"#);
    assert!(m.contains("mounts are not accepted"), "{m}");
    // The supervisor goes on serving.
    let a = run(&s, json!({"cmd": ["true"]}));
    assert_eq!(a.exit_code, Some(0), "{a:?}");
    end(s);
}

fn a_cancel_under_its_key_ends_it(who: Who) {
    let s = start(who, "cancel");
    let key = format!("run-key-{}", unique());
    let mut c = connect(&s);
    let spec = json!({"cmd": ["sleep", "60"], "key": key, "timeout": "60s"});
    send(
        &mut c,
        &Request::Run {
            spec: zygo_tests::api::run_body(&spec),
        },
    );
    // Let it start, then cancel it from another connection.
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    match ask(&s, &Request::Cancel { key: key.clone() }) {
        Reply::Cancelled { count: 1 } => {}
        other => panic!("cancel: {other:?}\n{}", s.log()),
    }
    let a = match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
        Ok(Reply::RunAnswer(a)) => a,
        other => panic!("expected the run's answer, got {other:?}\n{}", s.log()),
    };
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(a.error.as_deref(), Some("cancelled"), "{a:?}");
    assert!(a.started && !a.timed_out, "{a:?}");
    assert_eq!(a.exit_code, Some(137), "{a:?}");
    assert_eq!(usage_record(&s, &a.request_id)["outcome"], "cancelled");
    // Nothing is left under the key.
    match ask(&s, &Request::Cancel { key }) {
        Reply::Cancelled { count: 0 } => {}
        other => panic!("a second cancel: {other:?}"),
    }
    no_run_cgroups(&s);
    // A caller that leaves takes its run with it.
    let mut c = connect(&s);
    send(
        &mut c,
        &Request::Run {
            spec: zygo_tests::api::run_body(&json!({"cmd": ["sleep", "60"], "timeout": "60s"})),
        },
    );
    wait_for(Duration::from_secs(10), "the run's cgroup", || {
        !run_cgroups(&s).is_empty()
    });
    drop(c);
    no_run_cgroups(&s);
    end(s);
}

fn many_runs_at_once_do_not_hold_up_other_requests(who: Who) {
    let s = start(who, "many");
    const N: usize = 12;
    let mut conns = Vec::new();
    for i in 0..N {
        let mut c = connect(&s);
        let spec = json!({"cmd": ["sh", "-c", format!("sleep 3; echo {i}")], "timeout": "60s"});
        send(
            &mut c,
            &Request::Run {
                spec: zygo_tests::api::run_body(&spec),
            },
        );
        conns.push(c);
    }
    // While they run, other requests are answered at once.
    wait_for(Duration::from_secs(10), "the runs' cgroups", || {
        run_cgroups(&s).len() >= N / 2
    });
    for _ in 0..3 {
        let t0 = Instant::now();
        match ask(&s, &Request::List) {
            Reply::Functions(_) => {}
            other => panic!("list: {other:?}"),
        }
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "a list took {took:?} while runs were going\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (i, mut c) in conns.into_iter().enumerate() {
        match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
            Ok(Reply::RunAnswer(a)) => {
                assert_eq!(a.exit_code, Some(0), "run {i}: {a:?}\n{}", s.log());
                assert_eq!(a.stdout, format!("{i}\n"));
            }
            other => panic!("run {i}: {other:?}\n{}", s.log()),
        }
    }
    end(s);
}

fn a_drain_ends_the_runs_it_cuts_off(who: Who) {
    let mut s = start(who, "drain");
    let mut c = connect(&s);
    send(
        &mut c,
        &Request::Run {
            spec: zygo_tests::api::run_body(&json!({"cmd": ["sleep", "60"], "timeout": "60s"})),
        },
    );
    wait_for(Duration::from_secs(10), "the run's cgroup", || {
        !run_cgroups(&s).is_empty()
    });
    // The run going is cut off at the grace's end; a new one meanwhile is refused.
    let waiter = std::thread::spawn(move || read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME));
    let pid = s.supervisor;
    let mut d = connect(&s);
    send(&mut d, &Request::Drain { grace_ms: 1500 });
    std::thread::sleep(Duration::from_millis(300));
    match run_reply(&s, &json!({"cmd": ["true"]})) {
        Reply::Error {
            code: ErrorCode::Unavailable,
            ..
        } => {}
        other => panic!("[{}] a run while draining: {other:?}", who.name()),
    }
    match read_frame::<_, Reply>(&mut d, MAX_FRONT_FRAME) {
        Ok(Reply::Drained { cut_off: 1, .. }) => {}
        other => panic!("[{}] the drain: {other:?}\n{}", who.name(), s.log()),
    }
    s.wait_gone();
    let a = match waiter.join().expect("the waiting thread") {
        Ok(Reply::RunAnswer(a)) => a,
        other => panic!("[{}] expected the run's answer, got {other:?}", who.name()),
    };
    assert_eq!(
        a.error.as_deref(),
        Some("the supervisor stopped before the run ended"),
        "{a:?}"
    );
    assert!(a.started && !a.timed_out, "{a:?}");
    // Its cgroup went with the supervisor (the checks of `shutdown` cover its launcher).
    let prefix = format!("r-{}-", pid.expect("the supervisor's pid"));
    for r in zygo_cgroup_roots() {
        for e in std::fs::read_dir(r.join("tenants/_host/_run"))
            .into_iter()
            .flatten()
            .flatten()
        {
            assert!(
                !e.file_name().to_string_lossy().starts_with(&prefix),
                "{} left after the drain",
                e.path().display()
            );
        }
    }
}

fn past_the_most_runs_at_once_one_more_is_busy(who: Who) {
    let mut s = SUITE.sup(who, "busy");
    s.env("ZYGO_MAX_RUNS", "2");
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    assert_eq!(f.code, 0, "zygo up: {}\n{}", f.stderr_text(), s.log());
    s.find_supervisor();
    let mut going = Vec::new();
    for _ in 0..2 {
        let mut c = connect(&s);
        send(
            &mut c,
            &Request::Run {
                spec: zygo_tests::api::run_body(&json!({"cmd": ["sleep", "2"], "timeout": "30s"})),
            },
        );
        going.push(c);
    }
    wait_for(Duration::from_secs(10), "two runs' cgroups", || {
        run_cgroups(&s).len() >= 2
    });
    match run_reply(&s, &json!({"cmd": ["true"]})) {
        Reply::Error {
            code: ErrorCode::Busy,
            retry_after: Some(_),
            message,
        } => assert!(message.contains("2 runs are going"), "{message}"),
        other => panic!("[{}] a third run: {other:?}", who.name()),
    }
    for mut c in going {
        match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
            Ok(Reply::RunAnswer(a)) => assert_eq!(a.exit_code, Some(0), "{a:?}"),
            other => panic!("{other:?}"),
        }
    }
    // Room again.
    assert_eq!(run(&s, json!({"cmd": ["true"]})).exit_code, Some(0));
    end(s);
}

root_and_rootless!(
    past_the_most_runs_at_once_one_more_is_busy,
    a_drain_ends_the_runs_it_cuts_off,
    output_and_exit_code,
    output_past_the_cap_is_cut_and_marked,
    output_past_the_cap_is_drained_at_a_bounded_pace,
    the_deadline_kills_it,
    a_memory_limit_kills_it_as_oom,
    a_pids_limit_stops_it_forking,
    stdin_reaches_it,
    a_plan_the_host_cannot_build_is_not_started,
    bad_specs_are_refused,
    a_cancel_under_its_key_ends_it,
    many_runs_at_once_do_not_hold_up_other_requests,
);
