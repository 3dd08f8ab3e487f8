//! Warm functions end to end, on the real kernel: each test starts its own supervisor
//! (`zygo up -f <tmp>/sandbox.toml` with its own runtime and state directories), calls
//! the Python handlers of `tests/functions/handlers.py` through the CLI, and at the end
//! drains it, waits for it to exit, and checks that it left no cgroup
//! (`…/zygo/tenants/_host/<fn>`) and no process (launcher, agent, request) behind.
//!
//! Function names carry the test's name, who runs it and a unique suffix, so the tests
//! can run in parallel with each other and with other runs of the suite.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygo_tests::*;

/// One supervisor per test: its functions are served from the handlers of
/// `tests/functions/handlers.py` (copied into each test's directory), under small
/// defaults, each with its launcher and Python agent.
static SUITE: Suite = Suite {
    prefix: "",
    handlers: include_str!("../functions/handlers.py"),
    defaults: "timeout = \"2s\"\nmem = \"64M\"\nidle_timeout = \"30s\"\n",
    agents: true,
};

/// The one line every command prints when no supervisor runs.
const NO_SUPERVISOR: &str = "zygo: no supervisor is running; start one with `zygo up`";

// ---------------------------------------------------------------------------------------
// Helpers.

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
            if let Some(pp) = ppid(*p) {
                if !procs.contains(&pp) {
                    let cmd = fs::read(format!("/proc/{pp}/cmdline")).unwrap_or_default();
                    if contains(&cmd, b"__launcher") {
                        return Some(pp);
                    }
                }
            }
        }
    }
    None
}

fn sigkill(pid: i32) {
    // SAFETY: killing a process of this test's own supervisor, by pid.
    let r = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(r, 0, "kill -9 {pid}: {}", std::io::Error::last_os_error());
}

// ---------------------------------------------------------------------------------------
// Calls, rootful and rootless.

both_tests! {
    /// Once a zygote is up, its launcher's relay (which reads every agent line, request
    /// output and workspace archive) runs confined: under seccomp with no_new_privs, no
    /// capability but CAP_SETUID and CAP_SETGID (for writing as the sandbox's own ids), and,
    /// as root, as the sandbox's owner rather than root; and its mounter lives in the
    /// sandbox's mount namespace under a table of its own. Calls go on working through it.
    fn a_zygote_s_relay_is_confined_before_it_reads_the_sandbox(who) {
        let mut s = SUITE.sup(who, "relay");
        let n = s.up(&[("hello", "hello", "")]);
        assert_eq!(s.call_ok(&n[0], "{\"x\": 1}")["echo"], json!({"x": 1}), "{}", s.log());
        let sup = s.supervisor.expect("the supervisor's pid");
        let launchers: Vec<i32> = host_processes()
            .into_iter()
            .filter(|(p, cmd)| ppid(*p) == Some(sup) && contains(cmd, b"__launcher"))
            .map(|(p, _)| p)
            .collect();
        assert!(!launchers.is_empty(), "no launcher under the supervisor {sup}\n{}", s.log());
        for p in launchers {
            let st = fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            let field = |k: &str| {
                st.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("").trim().to_string()
            };
            assert_eq!(field("Seccomp:"), "2", "[{}] {st}", who.name());
            assert_eq!(field("NoNewPrivs:"), "1", "[{}] {st}", who.name());
            let eff = u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(u64::MAX);
            // CAP_SETGID (6) and CAP_SETUID (7) as root; nothing rootless.
            let want = if who == Who::Root { 1 << 6 | 1 << 7 } else { 0 };
            assert_eq!(eff, want, "[{}] CapEff {st}", who.name());
            if who == Who::Root {
                assert_eq!(field("CapBnd:"), "0000000000000000", "{st}");
                for k in ["Uid:", "Gid:"] {
                    let v = field(k);
                    let ids: Vec<&str> = v.split_whitespace().collect();
                    assert!(ids.len() == 4 && ids.iter().all(|i| *i == ids[0] && *i != "0"), "{k} {st}");
                }
            }
        }
        // Its mounter: in the sandbox's mount namespace (never the host's), under a seccomp
        // table of its own. It is the launcher's child outside the sandbox's pid namespace
        // (the sandbox's init, also the launcher's child, is inside it).
        let mounters: Vec<i32> = host_processes()
            .into_iter()
            .filter(|(p, cmd)| {
                ppid(*p).is_some_and(|pp| ppid(pp) == Some(sup))
                    && contains(cmd, b"__launcher")
                    && fs::read_to_string(format!("/proc/{p}/status"))
                        .is_ok_and(|st| st.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().count() == 2))
            })
            .map(|(p, _)| p)
            .collect();
        assert!(!mounters.is_empty(), "[{}] no mounter\n{}", who.name(), s.log());
        for p in mounters {
            let st = fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            assert!(st.contains("Seccomp:\t2") && st.contains("NoNewPrivs:\t1"), "[{}] the mounter: {st}", who.name());
            let host_mnt = fs::read_link("/proc/self/ns/mnt").expect("our mount namespace");
            assert_ne!(fs::read_link(format!("/proc/{p}/ns/mnt")).ok(), Some(host_mnt), "[{}] the mounter is in the host's mount namespace", who.name());
        }
        // Still a working relay.
        assert_eq!(s.call_ok(&n[0], "{}")["echo"], json!({}), "{}", s.log());
        s.shutdown();
    }

    /// The same for a one-shot run's launcher, once it has let the program start: it
    /// waits for the program as the sandbox's owner, under its seccomp table.
    fn a_one_shot_launcher_is_confined_once_the_program_runs(who) {
        let marker = format!("confined{}", unique());
        let mut c = zygo(who);
        c.args(["run", "--timeout", "20s", "--", "sh", "-c", &format!("echo {marker}; sleep 20")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = spawn_retrying(&mut c);
        let mut out = child.stdout.take().expect("piped stdout");
        let mut first = [0u8; 64];
        let n = std::io::Read::read(&mut out, &mut first).unwrap_or(0);
        assert!(String::from_utf8_lossy(&first[..n]).contains(&marker), "[{}] the program did not start", who.name());
        let zygo_pid = child.id() as i32;
        let launchers: Vec<i32> = host_processes()
            .into_iter()
            .filter(|(p, cmd)| ppid(*p) == Some(zygo_pid) && contains(cmd, b"__launcher"))
            .map(|(p, _)| p)
            .collect();
        // It confines itself while the program starts: give it until then.
        let read = || -> Vec<String> {
            launchers.iter().filter_map(|p| fs::read_to_string(format!("/proc/{p}/status")).ok()).collect()
        };
        let t0 = Instant::now();
        let mut status = read();
        while !status.iter().all(|st| st.lines().any(|l| l == "Seccomp:\t2")) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
            status = read();
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(status.len(), 1, "[{}] the run's launcher", who.name());
        let st = &status[0];
        let field = |k: &str| st.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("").trim().to_string();
        assert_eq!(field("Seccomp:"), "2", "[{}] {st}", who.name());
        assert_eq!(field("NoNewPrivs:"), "1", "[{}] {st}", who.name());
        let eff = u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(u64::MAX);
        let want = if who == Who::Root { 1 << 6 | 1 << 7 } else { 0 };
        assert_eq!(eff, want, "[{}] CapEff {st}", who.name());
        if who == Who::Root {
            let v = field("Uid:");
            assert!(v.split_whitespace().all(|i| i != "0"), "Uid {st}");
        }
    }
}

both_tests! {
    /// A served Python function answers `{result, request_id, stdout, stderr, metrics}`
    /// with --json; the human output is its stdout then the result; --stream delivers
    /// stdout and progress as events before the answer. The event comes as an argument,
    /// a file or stdin.
    fn basic_call(who) {
        let mut s = SUITE.sup(who, "basic");
        let n = s.up(&[("hello", "hello", ""), ("stream", "stream", "")]);
        let (hello, stream) = (&n[0], &n[1]);
        assert_eq!(s.info(hello)["state"], "serving", "{}", s.log());

        let (v, f) = s.exec(hello, Some(r#"{"a": [1, 2], "b": "é"}"#), &[]);
        assert_eq!(f.code, 0, "exec: {v} {}\n{}", f.stderr_text(), s.log());
        assert_eq!(v["outcome"], "ok", "{v}");
        assert_eq!(v["result"]["echo"], json!({"a": [1, 2], "b": "é"}), "{v}");
        let cwd = v["result"]["cwd"].as_str().unwrap_or("");
        assert!(
            cwd.strip_prefix("/work/").is_some_and(|d| is_hex(d, 32)),
            "the request's cwd is /work/<32 hex digits>: {v}"
        );
        assert!(is_hex(text(&v, "request_id"), 32), "request_id: {v}");
        assert_eq!(v["stdout"], "hello on stdout\n", "{v}");
        assert_eq!(v["stderr"], "hello on stderr\n", "{v}");
        // Times are fractional milliseconds (a fast call's wall time is not 0); the peak
        // is whole kilobytes.
        for k in ["wall_ms", "cpu_ms"] {
            assert!(v["metrics"][k].is_f64(), "metrics.{k} is a fractional number: {v}");
        }
        assert!(v["metrics"]["peak_rss_kb"].is_u64(), "{v}");
        assert!(v["metrics"]["peak_rss_kb"].as_u64() > Some(0), "peak RSS: {v}");
        let wall = v["metrics"]["wall_ms"].as_f64().unwrap_or(0.0);
        assert!(wall > 0.0 && wall < 2000.0, "wall: {v}");

        // Default event {}, a file, and stdin.
        assert_eq!(s.call_ok(hello, "{}")["echo"], json!({}));
        let (v, _) = s.exec(hello, None, &[]);
        assert_eq!(v["result"]["echo"], json!({}), "no event is {{}}: {v}");
        let ev = s.dir.file("event.json", br#"{"from": "file"}"#);
        let (v, _) = s.exec(hello, Some(ev.to_str().expect("UTF-8")), &[]);
        assert_eq!(v["result"]["echo"], json!({"from": "file"}), "{v}");
        let mut c = s.exec_cmd(hello, Some("-"), &[]);
        c.stdin(fs::File::open(&ev).expect("open the event file"));
        let f = finish(c);
        assert_eq!(f.last_json()["result"]["echo"], json!({"from": "file"}), "stdin: {}", f.stdout_text());

        // Human output: the result alone on stdout (`| jq` reads it); the handler's
        // output, its stdout then its stderr, on stderr.
        let f = s.run(&["exec", hello, r#"{"x":1}"#]);
        assert_eq!(f.code, 0, "{}", f.stderr_text());
        let out = f.stdout_text();
        let r: Value = serde_json::from_str(&out).expect("stdout is the result alone, as JSON");
        assert_eq!(r["echo"], json!({"x": 1}), "human result: {out:?}");
        let err = f.stderr_text();
        let (o, e) = (err.find("hello on stdout"), err.find("hello on stderr"));
        assert!(o.is_some() && e.is_some() && o < e, "human stderr: {err:?}");

        // --stream --json: event lines, then the answer.
        let (_, f) = s.exec(stream, None, &["--stream"]);
        assert_eq!(f.code, 0, "{}\n{}", f.stderr_text(), s.log());
        let lines = f.json_lines();
        let (answer, events) = lines.split_last().expect("at least the answer");
        assert_eq!(answer["outcome"], "ok", "the last line is the answer: {lines:?}");
        assert_eq!(answer["result"], json!({"steps": 3}));
        assert_eq!(answer["stdout"], "out 0\nout 1\nout 2\n");
        assert!(events.iter().all(|e| e.get("event").is_some() && e.get("outcome").is_none()),
            "every line before the answer is an event: {lines:?}");
        let joined = |kind: &str| -> Vec<String> {
            events.iter().filter(|e| e["event"] == kind)
                .map(|e| e["data"].as_str().unwrap_or("").to_string()).collect()
        };
        assert_eq!(joined("stdout").concat(), "out 0\nout 1\nout 2\n", "{lines:?}");
        assert_eq!(joined("progress"), ["step 0", "step 1", "step 2"], "{lines:?}");

        // --stream, human: output (on stderr) and progress as they come, then the result,
        // alone on stdout.
        let f = s.run(&["exec", stream, "--stream"]);
        assert_eq!(f.code, 0, "{}", f.stderr_text());
        assert_eq!(f.stdout_text(), "{\"steps\":3}\n");
        let err = f.stderr_text();
        let at: Vec<Option<usize>> = (0..3).map(|i| err.find(&format!("out {i}\n"))).collect();
        assert!(at.iter().all(Option::is_some) && at.is_sorted(), "{err}");
        for i in 0..3 {
            assert!(f.stderr_text().contains(&format!("progress: step {i}")), "{}", f.stderr_text());
        }
        s.shutdown();
    }

    /// A handler past its timeout is killed: outcome timeout, within timeout + 1 s; a
    /// call's --timeout narrows it; the zygote keeps serving.
    fn timeout(who) {
        let mut s = SUITE.sup(who, "timeout");
        let n = s.up(&[("nap", "nap", "timeout = \"2s\"")]);
        let nap = &n[0];
        let (v, f) = s.exec(nap, Some(r#"{"secs": 10}"#), &[]);
        s.assert_failed(&v, &f, "timeout", "timeout");
        assert!(f.elapsed < slow(Duration::from_secs(3)), "answered after {:?}", f.elapsed);
        assert!(f.elapsed >= Duration::from_millis(1900), "answered early: {:?}", f.elapsed);
        assert!(text(&v, "error").contains("2s"), "the error names the limit: {v}");
        assert_eq!(v["started"], true, "{v}");

        let (v, f) = s.exec(nap, Some(r#"{"secs": 10}"#), &["--timeout", "500ms"]);
        s.assert_failed(&v, &f, "timeout", "timeout");
        assert!(f.elapsed < slow(Duration::from_millis(1500)), "--timeout 500ms: {:?}", f.elapsed);
        assert!(text(&v, "error").contains("500ms"), "the error names the limit: {v}");

        // --timeout never widens the function's own.
        let (v, f) = s.exec(nap, Some(r#"{"secs": 10}"#), &["--timeout", "1m"]);
        s.assert_failed(&v, &f, "timeout", "timeout");
        assert!(f.elapsed < slow(Duration::from_secs(3)), "--timeout 1m: {:?}", f.elapsed);

        assert_eq!(s.call_ok(nap, r#"{"secs": 0.1}"#), json!({"slept": 0.1}));
        s.shutdown();
    }

    /// A handler that allocates 1 GiB under mem = "64M" is OOM-killed: oom_killed true
    /// and "ran out of memory (limit 64M)"; the zygote keeps serving.
    fn oom(who) {
        let mut s = SUITE.sup(who, "oom");
        let n = s.up(&[("hog", "hog", "mem = \"64M\"\ntimeout = \"10s\"")]);
        let hog = &n[0];
        let (v, f) = s.exec(hog, None, &[]);
        s.assert_failed(&v, &f, "error", "handler");
        assert_eq!(v["oom_killed"], true, "{v}");
        assert_eq!(v["error"], "ran out of memory (limit 64M)", "{v}");
        assert!(f.elapsed < slow(Duration::from_secs(8)), "OOM took {:?}", f.elapsed);
        assert_eq!(s.call_ok(hog, r#"{"bytes": 1000}"#), json!(1000));
        s.shutdown();
    }

    /// A request's cgroup may be one an earlier request of the function used (emptied and
    /// reset): its metrics and its OOM verdict are still its own. A big request, then
    /// small ones; an OOM-killed request, then small ones.
    fn metrics_are_each_requests_own(who) {
        let mut s = SUITE.sup(who, "metrics");
        let n = s.up(&[("hog", "hog", "mem = \"128M\"\ntimeout = \"10s\"\nmax_warm = 1")]);
        let hog = &n[0];
        let small = |s: &Sup, after: &str| {
            for _ in 0..6 {
                let (v, f) = s.exec(hog, Some(r#"{"bytes": 1000}"#), &[]);
                assert!(f.code == 0 && v["outcome"] == "ok", "after {after}: {v}\n{}", s.log());
                assert_ne!(v["oom_killed"], true, "after {after}: {v}");
                let peak = v["metrics"]["peak_rss_kb"].as_u64().unwrap_or(u64::MAX);
                assert!(peak < 32 << 10, "after {after}, a small request's peak: {v}");
            }
        };
        let (v, f) = s.exec(hog, Some(&json!({"bytes": 64 << 20}).to_string()), &[]);
        assert!(f.code == 0 && v["outcome"] == "ok", "{v}\n{}", s.log());
        assert!(v["metrics"]["peak_rss_kb"].as_u64() > Some(60 << 10), "64 MiB: {v}");
        small(&s, "a 64 MiB request");
        let (v, f) = s.exec(hog, None, &[]);
        s.assert_failed(&v, &f, "error", "handler");
        assert_eq!(v["oom_killed"], true, "{v}");
        small(&s, "an OOM kill");
        s.shutdown();
    }

    /// Two requests in one pool cannot see each other's /work directories or files: each
    /// request has a /work (and a /tmp) of its own, a fresh tmpfs in its own mount
    /// namespace holding only its own 0700 directory; nothing in /proc reveals a neighbour.
    fn work_isolation(who) {
        let mut s = SUITE.sup(who, "work");
        let n = s.up(&[("pool", "work", "timeout = \"8s\"\nmax_warm = 1")]);
        let pool = &n[0];
        let token = format!("secret-{:x}", unique());
        let writer = s.exec_in_flight(pool, &json!({"role": "secret", "token": token, "secs": 3}).to_string(), &[]);
        std::thread::sleep(Duration::from_millis(500));
        let snoop = s.call_ok(pool, &json!({"role": "snoop", "token": token}).to_string());
        let cwd = snoop["cwd"].as_str().unwrap_or("").to_string();
        let own = cwd.strip_prefix("/work/").unwrap_or("").to_string();
        assert_eq!(own.len(), 32, "its own directory under /work: {snoop}");
        assert_eq!(snoop["work_mode"], "0o1777", "/work: {snoop}");
        assert_eq!(snoop["cwd_mode"], "0o700", "own directory: {snoop}");
        assert_eq!(snoop["listdir_work"], json!([own]), "listing /work: {snoop}");
        assert_eq!(snoop["glob_work"], json!([cwd]), "{snoop}");
        assert_eq!(snoop["leaks"], json!([]), "found the neighbour: {snoop}");
        // /proc (hidepid) shows no other request's process: as root each has a uid of its
        // own; rootless (one uid) each has a Landlock domain of its own.
        assert_eq!(snoop["neighbours"], 0, "saw other processes: {snoop}");
        // Nor can it signal any process outside itself: another uid as root, and rootless
        // its Landlock domain is scoped (signals stay inside it). Rootless on a Landlock
        // older than ABI 6 nothing can stop it: Zygo refuses such a zygote unless
        // ZYGO_ALLOW_UNSCOPED_REQUESTS=1 accepts exactly this
        // (`rootless_zygotes_need_signal_scoping_or_consent`), which is how it got here.
        if who == Who::Rootless && landlock_abi() < 6 {
            assert_eq!(
                std::env::var("ZYGO_ALLOW_UNSCOPED_REQUESTS").as_deref(),
                Ok("1"),
                "a rootless zygote was served on Landlock ABI {} without consent",
                landlock_abi()
            );
            eprintln!(
                "[rootless] Landlock ABI {}: requests can signal each other, as accepted: {}",
                landlock_abi(),
                snoop["signalled"]
            );
        } else {
            assert_eq!(snoop["signalled"], json!([]), "signalled others: {snoop}");
        }

        let w = writer.join().expect("the writer thread");
        let wv = w.last_json();
        assert!(w.code == 0 && wv["outcome"] == "ok", "writer: {wv}\n{}", s.log());
        assert_eq!(wv["result"]["still_there"], true, "{wv}");
        let wcwd = wv["result"]["cwd"].as_str().unwrap_or("").to_string();
        assert_ne!(wcwd, cwd, "two requests shared a /work directory");
        // Neither during nor after the writer's request does another see its directory.
        let exists = s.call_ok(pool, &json!({"role": "stat", "path": wcwd}).to_string())["exists"].clone();
        assert_eq!(exists, false, "{wcwd} is visible to another request");
        s.shutdown();
    }

    /// A request process and a child it forks cannot unshare(CLONE_NEWNS) (EPERM); two
    /// requests' random and os.urandom values differ.
    fn unshare_and_random(who) {
        let mut s = SUITE.sup(who, "unshare");
        let n = s.up(&[("iso", "isolation", "")]);
        let iso = &n[0];
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..3 {
            let r = s.call_ok(iso, "{}");
            assert_eq!(r["self_unshare"], "EPERM", "call {i}: {r}");
            assert_eq!(r["child"]["unshare"], "EPERM", "call {i}, forked child: {r}");
            for v in [&r["random"], &r["getrandbits"], &r["urandom"], &r["child"]["random"], &r["child"]["urandom"]] {
                assert!(!v.is_null(), "{r}");
                assert!(seen.insert(v.to_string()), "a value repeated across requests: {v} in {r}");
            }
        }
        s.shutdown();
    }
}

// ---------------------------------------------------------------------------------------
// Handler failures and bad input (rootful).

/// A handler that raises gives outcome error with its traceback, stdout and stderr, and
/// the zygote keeps serving; a result that is not JSON-serialisable and a handler that
/// writes garbage on its request channel each get their own clear error.
#[test]
fn handler_errors() {
    let Some(mut s) = SUITE.root("errors") else {
        return;
    };
    let n = s.up(&[
        ("boom", "boom", ""),
        ("unser", "unserialisable", ""),
        ("garbage", "garbage", ""),
    ]);
    let (boom, unser, garbage) = (&n[0], &n[1], &n[2]);
    let agents = agent_pids(boom);
    assert_eq!(agents.len(), 1, "one agent for {boom}: {agents:?}");

    let (v, f) = s.exec(boom, None, &[]);
    s.assert_failed(&v, &f, "error", "handler");
    assert!(
        text(&v, "error").contains("ValueError: kaboom from the handler"),
        "{v}"
    );
    let tb = text(&v, "traceback");
    assert!(
        tb.starts_with("Traceback")
            && tb.contains("handlers.py")
            && tb.contains("raise ValueError"),
        "traceback: {v}"
    );
    assert!(
        !tb.contains("python_agent.py"),
        "the agent's own frames are trimmed: {tb}"
    );
    assert_eq!(v["stdout"], "about to fail\n", "{v}");
    assert_eq!(v["stderr"], "a warning first\n", "{v}");
    assert_eq!(v["oom_killed"], false, "{v}");
    // Human: the traceback and one line naming the error on stderr, exit 1.
    let f = s.run(&["exec", boom]);
    assert_eq!(f.code, 1);
    let err = f.stderr_text();
    assert!(
        err.contains("Traceback")
            && err.contains("zygo: ValueError: kaboom from the handler (error)"),
        "{err}"
    );
    // The same zygote serves the next call.
    assert_eq!(s.call_ok(boom, r#"{"fail": false}"#), "did not fail");
    assert_eq!(
        agent_pids(boom),
        agents,
        "the zygote was replaced after a raise"
    );

    let (v, f) = s.exec(unser, None, &[]);
    s.assert_failed(&v, &f, "error", "handler");
    assert!(
        text(&v, "error").contains("result is not JSON-serialisable")
            && text(&v, "error").contains("set"),
        "{v}"
    );

    let g_agents = agent_pids(garbage);
    let (v, f) = s.exec(garbage, None, &[]);
    s.assert_failed(&v, &f, "error", "handler");
    assert!(
        text(&v, "error").contains("protocol"),
        "garbage on the channel: {v}"
    );
    assert!(
        f.elapsed < slow(Duration::from_millis(1900)),
        "garbage answered after {:?}",
        f.elapsed
    );
    let (v, f) = s.exec(garbage, None, &[]);
    s.assert_failed(&v, &f, "error", "handler");
    assert_eq!(
        agent_pids(garbage),
        g_agents,
        "a child's garbage replaced the zygote"
    );
    assert_eq!(s.call_ok(boom, r#"{"fail": false}"#), "did not fail");
    s.shutdown();
}

/// An event that is not JSON is a usage error (argument) or a bad_request refusal
/// (stdin, file); an event over 16 MiB is refused; a bad key is refused; the supervisor
/// and the zygote keep serving.
#[test]
fn bad_events() {
    let Some(mut s) = SUITE.root("badev") else {
        return;
    };
    let n = s.up(&[("hello", "hello", "")]);
    let hello = &n[0];
    let agents = agent_pids(hello);

    // A usage error, answered (with --json) as one JSON object on stdout.
    let f = s.run(&["exec", hello, "{not json", "--json"]);
    assert_eq!(f.code, 2, "not JSON as an argument: {}", f.stderr_text());
    let v = f.last_json();
    assert_eq!(v["code"], "bad_request", "{v}");
    assert!(text(&v, "error").contains("neither JSON nor a file"), "{v}");
    let f = s.run(&["exec", hello, "{not json"]);
    assert_eq!(f.code, 2, "not JSON as an argument: {}", f.stderr_text());
    assert_eq!(f.stderr_text().lines().count(), 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains("neither JSON nor a file"),
        "{}",
        f.stderr_text()
    );

    let bad = s.dir.file("bad.json", b"{not json at all");
    let mut c = s.exec_cmd(hello, Some("-"), &[]);
    c.stdin(fs::File::open(&bad).expect("open"));
    let f = finish(c);
    let v = f.last_json();
    s.assert_refused(&v, &f, "bad_request");
    assert!(text(&v, "error").contains("not JSON"), "{v}");
    let (v, f) = s.exec(hello, Some(bad.to_str().expect("UTF-8")), &[]);
    s.assert_refused(&v, &f, "bad_request");

    // Over 16 MiB, from a file and from stdin: refused before anything runs.
    let mut big = Vec::with_capacity((16 << 20) + 8);
    big.push(b'"');
    big.resize((16 << 20) + 4, b'a');
    big.push(b'"');
    let big = s.dir.file("big.json", &big);
    let t0 = Instant::now();
    let f = s.run(&["exec", hello, big.to_str().expect("UTF-8"), "--json"]);
    assert!(
        f.code == 2 || f.last_json()["code"] == "too_large",
        "over 16 MiB: exit {} {}",
        f.code,
        f.stderr_text()
    );
    assert!(
        f.stderr_text().contains("16 MiB") || f.stdout_text().contains("16 MiB"),
        "the refusal names the limit: {}",
        f.stderr_text()
    );
    let mut c = s.exec_cmd(hello, Some("-"), &[]);
    c.stdin(fs::File::open(&big).expect("open"));
    let f = finish(c);
    assert!(
        f.code == 2 || f.last_json()["code"] == "too_large",
        "over 16 MiB on stdin: exit {} {}",
        f.code,
        f.stderr_text()
    );
    assert!(
        f.stderr_text().contains("16 MiB") || f.stdout_text().contains("16 MiB"),
        "{}",
        f.stderr_text()
    );
    assert!(t0.elapsed() < slow(Duration::from_secs(10)));

    // A key must be 1 to 256 bytes.
    let (v, f) = s.exec(hello, None, &["--key", ""]);
    s.assert_refused(&v, &f, "bad_request");
    let long = "k".repeat(257);
    let (v, f) = s.exec(hello, None, &["--key", &long]);
    s.assert_refused(&v, &f, "bad_request");

    assert_eq!(
        s.call_ok(hello, r#"{"still": "serving"}"#)["echo"],
        json!({"still": "serving"})
    );
    assert_eq!(agent_pids(hello), agents, "bad input replaced the zygote");
    s.shutdown();
}

/// Events and results between 1 MiB and 16 MiB are valid: a call with a 2 MiB event
/// and a call returning a 2 MiB result both succeed, and neither disturbs another call
/// running in the same zygote.
#[test]
fn large_event_and_result() {
    let Some(mut s) = SUITE.root("large") else {
        return;
    };
    let n = s.up(&[("big", "big", "timeout = \"10s\"\nmax_warm = 1")]);
    let big = &n[0];
    // A neighbour running in the same zygote while the big calls are made.
    let neighbour = s.exec_in_flight(big, r#"{"n": 0, "secs": 2}"#, &[]);
    let event = json!({"n": 0, "pad": "a".repeat(2 << 20)}).to_string();
    let file = s.dir.file("event.json", event.as_bytes());
    let (v, f) = s.exec(big, Some(file.to_str().expect("UTF-8")), &[]);
    assert!(
        f.code == 0 && v["result"]["event_len"].as_u64() >= Some(2 << 20),
        "a 2 MiB event: exit {} {}\n{}",
        f.code,
        truncate(&v.to_string(), 500),
        s.log()
    );
    let (v, f) = s.exec(big, Some(r#"{"n": 2000000}"#), &[]);
    assert!(
        f.code == 0 && v["result"]["big"].as_str().map(str::len) == Some(2_000_000),
        "a 2 MB result: exit {} {}\n{}",
        f.code,
        truncate(&v.to_string(), 500),
        s.log()
    );
    let nb = neighbour.join().expect("neighbour");
    assert_eq!(nb.last_json()["outcome"], "ok", "{}", nb.stdout_text());
    s.shutdown();
}

/// A handler that does not import (missing module, syntax error, missing function) makes
/// `zygo up` and `zygo serve` print the import error and exit 1; `zygo ls` shows the
/// function failed with that error; its calls are refused; the others are served.
/// Rootless, the requests of a zygote share one uid: on a kernel whose Landlock cannot
/// scope signals (ABI below 6, e.g. Debian 12's 6.1) serving a function is refused with the
/// kernel it needs named, unless `ZYGO_ALLOW_UNSCOPED_REQUESTS=1` accepts it; from ABI 6
/// on it is served.
#[test]
fn rootless_zygotes_need_signal_scoping_or_consent() {
    let mut s = SUITE.sup(Who::Rootless, "scope");
    let (file, n) = s.write_toml(&[("hello", "hello", "")]);
    let mut c = s.cmd(&["up", "-f", file.to_str().expect("UTF-8")]);
    c.env_remove("ZYGO_ALLOW_UNSCOPED_REQUESTS");
    let f = finish(c);
    s.find_supervisor();
    let version = s.run(&["version", "--json"]);
    let abi = serde_json::from_str::<Value>(version.stdout_text().trim())
        .ok()
        .and_then(|v| v["landlock_abi"].as_i64())
        .unwrap_or_else(|| panic!("zygo version --json: {}", version.stdout_text()));
    let err = f.stderr_text();
    if abi >= 6 {
        assert_eq!(
            f.code,
            0,
            "zygo up on Landlock ABI {abi}: {err}\n{}",
            s.log()
        );
        assert_eq!(s.info(&n[0])["state"], "serving");
    } else {
        assert_eq!(
            f.code,
            1,
            "zygo up on Landlock ABI {abi}: {err}\n{}",
            s.log()
        );
        assert!(
            err.contains("Linux 6.12")
                && err.contains(&format!("ABI {abi}"))
                && err.contains("ZYGO_ALLOW_UNSCOPED_REQUESTS=1"),
            "the refusal does not name the kernel and the way out: {err}"
        );
    }
    s.shutdown();
}

#[test]
fn import_failures() {
    let Some(mut s) = SUITE.root("import") else {
        return;
    };
    s.fn_file(
        "nomod.py",
        "import no_such_module_zygo\n\ndef handler(event):\n    return 1\n",
    );
    s.fn_file("syntax.py", "def handler(event:\n    return 1\n");
    let (file, n) = s.write_toml(&[
        ("good", "hello", ""),
        ("nomod", "", "entry = \"fn/nomod.py:handler\""),
        ("syntax", "", "entry = \"fn/syntax.py:handler\""),
        ("nofunc", "no_such_function", ""),
    ]);
    let file = file.to_str().expect("UTF-8").to_string();
    let (good, nomod, syntax, nofunc) = (&n[0], &n[1], &n[2], &n[3]);
    let f = s.run(&["up", "-f", &file]);
    s.find_supervisor();
    let err = f.stderr_text();
    assert_eq!(f.code, 1, "zygo up with import errors: {err}\n{}", s.log());
    assert!(
        f.stdout_text().contains(&format!("serving {good}")),
        "{}",
        f.stdout_text()
    );
    for (name, why) in [
        (
            nomod,
            "ModuleNotFoundError: No module named 'no_such_module_zygo'",
        ),
        (syntax, "SyntaxError"),
        (nofunc, "has no function 'no_such_function'"),
    ] {
        let line = err
            .lines()
            .find(|l| l.contains(&format!("{name} failed to serve")))
            .unwrap_or_else(|| panic!("zygo up does not name {name}: {err}"));
        assert!(
            line.contains(why) || err.contains(why),
            "{name}: expected {why:?} in {err}"
        );
        let info = s.info(name);
        assert_eq!(info["state"], "failed", "{info}");
        assert!(
            text(&info, "error").contains(why),
            "ls shows the error: {info}"
        );
        let (v, f) = s.exec(name, None, &[]);
        s.assert_refused(&v, &f, "unavailable");
        assert!(text(&v, "error").contains(why), "{v}");
    }
    assert_eq!(s.info(good)["state"], "serving");

    // `zygo serve` of a failing function prints its error again and exits 1.
    let f = s.run(&["serve", syntax, "-f", &file]);
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains("SyntaxError"),
        "{}",
        f.stderr_text()
    );
    let f = s.run(&["serve", nomod, "-f", &file, "--json"]);
    assert_eq!(f.code, 1);
    let v = f.last_json();
    assert!(
        v["failed"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("no_such_module_zygo")),
        "{v}"
    );
    // Serving the good one again is a no-op that succeeds.
    let f = s.run(&["serve", good, "-f", &file]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    assert_eq!(s.call_ok(good, "{}")["echo"], json!({}));
    // A failed function leaves no agent running.
    for name in [nomod, syntax, nofunc] {
        assert!(
            wait_for_quietly(Duration::from_secs(3), || agent_pids(name).is_empty()),
            "{name} has agents running"
        );
    }
    s.shutdown();
}

/// A handler that closes its stdout, one that leaves a daemon behind (killed with the
/// request's cgroup, and the call still returns promptly), and one that ignores SIGTERM
/// (its timeout still kills it).
#[test]
fn unruly_handlers() {
    let Some(mut s) = SUITE.root("unruly") else {
        return;
    };
    let n = s.up(&[
        ("closer", "close_stdout", ""),
        ("daemon", "daemon", "timeout = \"8s\""),
        ("stubborn", "stubborn", "timeout = \"2s\""),
    ]);
    let (closer, daemon, stubborn) = (&n[0], &n[1], &n[2]);

    let (v, f) = s.exec(closer, None, &[]);
    assert!(f.code == 0 && v["result"] == "closed", "{v}\n{}", s.log());
    assert_eq!(v["stdout"], "before closing\n", "{v}");
    assert!(f.elapsed < slow(Duration::from_secs(2)), "{:?}", f.elapsed);
    assert_eq!(s.call_ok(closer, "{}"), "closed");

    let marker = format!("zygo-daemon-marker-{:x}", unique());
    let (v, f) = s.exec(daemon, Some(&json!({"marker": marker}).to_string()), &[]);
    assert!(f.code == 0, "{v}\n{}", s.log());
    assert_eq!(
        v["result"]["daemon_seen"], true,
        "the daemon did not start: {v}"
    );
    assert!(
        f.elapsed < slow(Duration::from_millis(4500)),
        "the daemon held the call: {:?}",
        f.elapsed
    );
    assert!(
        v["metrics"]["wall_ms"].as_f64() < Some(4000.0),
        "the daemon held the call: {v}"
    );
    let gone = wait_for_quietly(Duration::from_secs(3), || {
        host_pids_with(marker.as_bytes()).is_empty()
    });
    assert!(
        gone,
        "the daemon outlived its request: {:?}",
        host_pids_with(marker.as_bytes())
    );

    let (v, f) = s.exec(stubborn, None, &[]);
    s.assert_failed(&v, &f, "timeout", "timeout");
    assert!(
        f.elapsed < slow(Duration::from_secs(3)),
        "SIGTERM ignored: answered after {:?}",
        f.elapsed
    );
    let (v, f) = s.exec(stubborn, None, &["--timeout", "300ms"]);
    s.assert_failed(&v, &f, "timeout", "timeout");
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Deadlines, cancels, scaling (rootful).

/// A handler that stops itself sends no heartbeat and is killed as stuck.
#[test]
fn stuck() {
    let Some(mut s) = SUITE.root("stuck") else {
        return;
    };
    s.env("ZYGO_STUCK_AFTER_MS", "1500");
    let n = s.up(&[
        ("stop", "selfstop", "timeout = \"10s\""),
        ("hello", "hello", ""),
    ]);
    let (stop, hello) = (&n[0], &n[1]);
    let (v, f) = s.exec(stop, None, &[]);
    s.assert_failed(&v, &f, "stuck", "stuck");
    assert!(text(&v, "error").contains("heartbeat"), "{v}");
    assert!(
        f.elapsed >= Duration::from_millis(1400) && f.elapsed < slow(Duration::from_secs(4)),
        "stuck after {:?}",
        f.elapsed
    );
    assert_eq!(s.call_ok(hello, "{}")["echo"], json!({}));

    // An agent that stops sending heartbeats is replaced.
    let before = agent_pids(hello);
    assert_eq!(before.len(), 1, "{before:?}");
    // SAFETY: stopping this test's own agent, by pid.
    unsafe { libc::kill(before[0], libc::SIGSTOP) };
    wait_for(
        Duration::from_secs(8),
        "a new agent to replace the stopped one",
        || {
            let now = agent_pids(hello);
            now.len() == 1 && now != before
        },
    );
    assert!(
        wait_for_quietly(Duration::from_secs(3), || !alive(before[0])),
        "the stopped agent was not killed"
    );
    let mut last = Value::Null;
    let ok = wait_for_quietly(Duration::from_secs(5), || {
        last = s.exec(hello, None, &[]).0;
        last["outcome"] == "ok"
    });
    assert!(ok, "the replacement does not serve: {last}\n{}", s.log());
    s.shutdown();
}

/// `zygo cancel KEY` kills the running call under that key: the call answers cancelled.
#[test]
fn cancel() {
    let Some(mut s) = SUITE.root("cancel") else {
        return;
    };
    let n = s.up(&[("nap", "nap", "timeout = \"15s\"")]);
    let nap = &n[0];
    let key = format!("k-{:x}", unique());
    let call = s.exec_in_flight(nap, r#"{"secs": 10}"#, &["--key", &key]);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let f = s.run(&["cancel", &key, "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    assert_eq!(f.last_json(), json!({"cancelled": 1}));
    let f = call.join().expect("the call");
    let v = f.last_json();
    s.assert_failed(&v, &f, "cancelled", "cancelled");
    assert_eq!(v["started"], true, "{v}");
    assert!(
        t0.elapsed() < slow(Duration::from_secs(2)),
        "answered {:?} after the cancel",
        t0.elapsed()
    );
    // Nothing left under that key; another key cancels nothing.
    let f = s.run(&["cancel", &key, "--json"]);
    assert_eq!(f.last_json(), json!({"cancelled": 0}));
    let f = s.run(&["cancel", "no-such-key"]);
    assert_eq!(f.code, 0);
    assert!(
        f.stdout_text().contains("cancelled 0 request(s)"),
        "{}",
        f.stdout_text()
    );
    assert_eq!(s.call_ok(nap, r#"{"secs": 0}"#), json!({"slept": 0}));
    s.shutdown();
}

/// At max_warm = 1 the one zygote takes 4 calls at once; the 5th is refused at once as
/// busy with a retry-after hint; the 4 complete.
#[test]
fn busy_at_max_warm() {
    let Some(mut s) = SUITE.root("busy") else {
        return;
    };
    let n = s.up(&[("nap", "nap", "timeout = \"15s\"\nmax_warm = 1")]);
    let nap = &n[0];
    let calls: Vec<_> = (0..4)
        .map(|_| s.exec_bg(nap, r#"{"secs": 3}"#, &[]))
        .collect();
    s.wait_in_flight(nap, 4);
    let (v, f) = s.exec(nap, Some(r#"{"secs": 0}"#), &[]);
    s.assert_refused(&v, &f, "busy");
    assert!(
        v["retry_after"].as_u64().is_some_and(|s| s >= 1),
        "a retry-after hint: {v}"
    );
    assert!(
        f.elapsed < slow(Duration::from_secs(1)),
        "refused after {:?}",
        f.elapsed
    );
    let f = s.run(&["exec", nap, r#"{"secs": 0}"#]);
    assert_eq!(f.code, 1);
    assert!(
        f.stderr_text().contains("busy") && f.stderr_text().contains("retry after"),
        "{}",
        f.stderr_text()
    );
    let info = s.info(nap);
    assert_eq!(
        info["zygotes"]["busy"].as_u64().unwrap_or(0)
            + info["zygotes"]["ready"].as_u64().unwrap_or(0)
            + info["zygotes"]["starting"].as_u64().unwrap_or(0),
        1,
        "one zygote at max_warm = 1: {info}"
    );
    for c in calls {
        let f = c.join().expect("a call");
        let v = f.last_json();
        assert!(
            f.code == 0 && v["result"] == json!({"slept": 3}),
            "an accepted call: {v}\n{}",
            s.log()
        );
    }
    assert_eq!(s.call_ok(nap, r#"{"secs": 0}"#), json!({"slept": 0}));
    s.shutdown();
}

/// Freezer state of a function's zygote cgroups, from the host: (frozen, total).
fn zygote_freezer(name: &str) -> (usize, usize) {
    let mut frozen = 0;
    let mut total = 0;
    for z in fn_subgroups(name, "z-") {
        let state = if is_cgroup_v2_host() {
            fs::read_to_string(z.join("cgroup.freeze")).map(|s| s.trim() == "1")
        } else {
            fs::read_to_string(z.join("freezer.state")).map(|s| s.trim() == "FROZEN")
        };
        if let Ok(st) = state {
            total += 1;
            frozen += usize::from(st);
        }
    }
    (frozen, total)
}

/// A zygote idle for idle_timeout is frozen (ls and the kernel's freezer say so) and
/// thawed by the next call; a zygote with a request in flight is never frozen.
#[test]
fn freeze_and_thaw() {
    let Some(mut s) = SUITE.root("freeze") else {
        return;
    };
    // Every span stretches by the slowdown: on a slow machine a call may take longer
    // than an idle_timeout of 1 s, and the zygote would be frozen again before `ls`.
    let k = slowdown();
    let idle = format!("idle_timeout = \"{k}s\"");
    let nap_spec = format!("{idle}\ntimeout = \"{}s\"", 8 * k);
    let n = s.up(&[
        ("hello", "hello", idle.as_str()),
        ("nap", "nap", nap_spec.as_str()),
    ]);
    let (hello, nap) = (&n[0], &n[1]);
    std::thread::sleep(slow(Duration::from_millis(2500)));
    let info = s.info(hello);
    assert_eq!(
        info["zygotes"]["frozen"],
        1,
        "idle for 2.5 s under idle_timeout 1s: {info}\n{}",
        s.log()
    );
    assert_eq!(info["zygotes"]["ready"], 0, "{info}");
    assert_eq!(zygote_freezer(hello), (1, 1), "the kernel's freezer state");

    let (v, f) = s.exec(hello, Some(r#"{"after": "freeze"}"#), &[]);
    assert!(
        f.code == 0 && v["result"]["echo"] == json!({"after": "freeze"}),
        "a call to a frozen zygote: {v}\n{}",
        s.log()
    );
    assert!(
        f.elapsed < slow(Duration::from_secs(2)),
        "thaw took {:?}",
        f.elapsed
    );
    let info = s.info(hello);
    assert_eq!(info["zygotes"]["frozen"], 0, "thawed by the call: {info}");

    // A 3 s call under idle_timeout 1s: busy, never frozen, completes.
    let secs = 3 * k;
    let call = s.exec_in_flight(nap, &format!(r#"{{"secs": {secs}}}"#), &[]);
    std::thread::sleep(slow(Duration::from_millis(2000)));
    let info = s.info(nap);
    assert_eq!(
        info["zygotes"]["frozen"], 0,
        "frozen with a request in flight: {info}"
    );
    assert_eq!(info["zygotes"]["busy"], 1, "{info}");
    assert_eq!(zygote_freezer(nap).0, 0, "the kernel froze a busy zygote");
    let f = call.join().expect("the call");
    let v = f.last_json();
    assert!(
        f.code == 0 && v["result"] == json!({ "slept": secs }),
        "{v}\n{}",
        s.log()
    );
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Crashes and drain (rootful).

/// Start a 5 s call, kill `victim` (found by `find`) with -9 while it runs; the call gets
/// the error `expect` at once, the supervisor survives, a new zygote serves the next call.
fn crash_mid_request(test: &str, find: fn(&str) -> Vec<i32>, expect: &str) {
    let Some(mut s) = SUITE.root(test) else {
        return;
    };
    let n = s.up(&[("nap", "nap", "timeout = \"15s\"")]);
    let nap = &n[0];
    let call = s.exec_in_flight(nap, r#"{"secs": 5}"#, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let victims = find(nap);
    assert_eq!(victims.len(), 1, "exactly one process to kill: {victims:?}");
    let agent_before = agent_pids(nap);
    let t0 = Instant::now();
    sigkill(victims[0]);
    let f = call.join().expect("the call");
    let v = f.last_json();
    eprintln!("[{test}] the in-flight call answered: {v}");
    assert!(
        f.code == 1 && v["outcome"] == "error" && text(&v, "error") == expect,
        "the in-flight call: expected the error {expect:?}, got exit {}: {v}\n{}",
        f.code,
        s.log()
    );
    assert!(
        t0.elapsed() < slow(Duration::from_secs(3)),
        "answered {:?} after the kill",
        t0.elapsed()
    );
    assert_eq!(v["started"], true, "{v}");
    // The supervisor survives and a new zygote serves.
    assert_eq!(s.info(nap)["state"], "serving", "{}", s.log());
    let mut last = Value::Null;
    let ok = wait_for_quietly(Duration::from_secs(10), || {
        let (v, _) = s.exec(nap, Some(r#"{"secs": 0}"#), &[]);
        last = v;
        last["outcome"] == "ok"
    });
    assert!(ok, "no new zygote served: {last}\n{}", s.log());
    let after = agent_pids(nap);
    assert_eq!(after.len(), 1, "one agent after the replacement: {after:?}");
    assert_ne!(after, agent_before, "the agent was not replaced");
    s.shutdown();
}

fn the_agent(name: &str) -> Vec<i32> {
    agent_pids(name)
}

fn the_launcher(name: &str) -> Vec<i32> {
    launcher_pid(name).into_iter().collect()
}

/// What a call in flight is answered when its zygote dies under it: the zygote's death is
/// named, the handler is not blamed.
const ZYGOTE_DIED: &str = "the zygote serving this request died";

/// The zygote's agent killed with -9 mid-request.
#[test]
fn agent_killed() {
    crash_mid_request("agentkill", the_agent, ZYGOTE_DIED);
}

/// The zygote's launcher killed with -9 mid-request.
#[test]
fn launcher_killed() {
    crash_mid_request("launchkill", the_launcher, ZYGOTE_DIED);
}

/// [`finish`] on a thread of its own.
fn finish_bg(cmd: std::process::Command) -> std::thread::JoinHandle<Finished> {
    std::thread::spawn(move || finish(cmd))
}

/// `zygo drain` with a call in flight: the call completes, new calls are refused as
/// unavailable, then the drain answers that the call finished, and the supervisor exits
/// and removes its socket.
#[test]
fn drain_in_flight() {
    let Some(mut s) = SUITE.root("drain") else {
        return;
    };
    let n = s.up(&[("nap", "nap", "timeout = \"10s\"")]);
    let nap = &n[0];
    let call = s.exec_in_flight(nap, r#"{"secs": 2}"#, &[]);
    let t0 = Instant::now();
    let drain = finish_bg(s.cmd(&["drain", "--grace", "10s", "--json"]));
    std::thread::sleep(Duration::from_millis(300));
    let (v, f) = s.exec(nap, Some(r#"{"secs": 0}"#), &[]);
    s.assert_refused(&v, &f, "unavailable");
    assert!(text(&v, "error").contains("draining"), "{v}");
    let f = drain.join().expect("the drain");
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    // It answered when the drain was over: the call had finished.
    assert_eq!(
        f.last_json(),
        json!({"drained": true, "finished": 1, "cut_off": 0})
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(1500),
        "answered at once"
    );
    let f = call.join().expect("the call");
    let v = f.last_json();
    assert!(
        f.code == 0 && v["result"] == json!({"slept": 2}),
        "the call in flight: {v}\n{}",
        s.log()
    );
    s.wait_gone();
    let f = s.run(&["ls"]);
    assert_eq!(f.code, 1);
    assert_eq!(
        f.stderr_text().trim_end(),
        format!(
            "{NO_SUPERVISOR} (no supervisor listens at {})",
            s.socket().display()
        )
    );
}

// ---------------------------------------------------------------------------------------
// Usage log and the other commands (rootful).

/// After N calls, usage.log holds N JSON lines with every field, the outcomes matching.
#[test]
fn usage_log() {
    let Some(mut s) = SUITE.root("usage") else {
        return;
    };
    let n = s.up(&[
        ("hello", "hello", ""),
        ("boom", "boom", ""),
        ("nap", "nap", ""),
    ]);
    let (hello, boom, nap) = (&n[0], &n[1], &n[2]);
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let mut answers = Vec::new();
    for (name, event, flags) in [
        (hello, "{}", &[][..]),
        (boom, "{}", &[][..]),
        (hello, r#"{"n": 2}"#, &[][..]),
        (nap, r#"{"secs": 5}"#, &["--timeout", "300ms"][..]),
        (boom, r#"{"fail": false}"#, &[][..]),
    ] {
        let (v, _) = s.exec(name, Some(event), flags);
        assert!(v["request_id"].is_string(), "{v}");
        answers.push((name.clone(), v));
    }
    let t1 = t0 + 60_000;
    let text = fs::read_to_string(s.st.join("usage.log")).expect("read usage.log");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("usage line ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), answers.len(), "one line per call: {text}");
    let mut keys: Vec<&str> = vec![
        "tenant",
        "function",
        "script",
        "request_id",
        "wall_ms",
        "cpu_ms",
        "peak_rss_kb",
        "outcome",
        "finished_ms",
    ];
    keys.sort_unstable();
    for ((name, ans), line) in answers.iter().zip(&lines) {
        let mut got: Vec<&str> = line
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        got.sort_unstable();
        assert_eq!(got, keys, "{line}");
        assert_eq!(line["tenant"], "_host", "{line}");
        assert_eq!(&line["function"], name, "{line}");
        assert!(line["script"].is_null(), "{line}");
        assert_eq!(line["request_id"], ans["request_id"], "{line} vs {ans}");
        assert_eq!(line["outcome"], ans["outcome"], "{line} vs {ans}");
        for k in ["wall_ms", "cpu_ms", "peak_rss_kb"] {
            assert!(line[k].is_number(), "{k}: {line}");
            assert_eq!(line[k], ans["metrics"][k], "{k}: {line} vs {ans}");
        }
        assert!(line["wall_ms"].as_f64() > Some(0.0), "{line}");
        let fin = line["finished_ms"].as_u64().unwrap_or(0);
        assert!(
            fin >= t0 && fin <= t1,
            "finished_ms {fin} not in [{t0}, {t1}]"
        );
    }
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(outcomes, ["ok", "error", "ok", "timeout", "ok"]);
    s.shutdown();
}

/// With no supervisor, every command that needs one exits 1 with the one line (with
/// --json, one `{code, error}` object instead: tests/cli_output.rs).
#[test]
fn no_supervisor() {
    let who = if am_root() { Who::Root } else { Who::Rootless };
    let s = SUITE.sup(who, "nosup");
    for args in [
        &["exec", "anything"][..],
        &["ls"],
        &["stop", "anything"],
        &["logs", "anything"],
        &["stats"],
        &["warm", "anything", "2"],
        &["cancel", "k"],
        &["drain"],
    ] {
        let f = s.run(args);
        assert_eq!(f.code, 1, "zygo {args:?}: {}", f.stderr_text());
        // One line, naming the socket it looked for.
        assert_eq!(
            f.stderr_text(),
            format!(
                "{NO_SUPERVISOR} (no supervisor listens at {})\n",
                s.socket().display()
            ),
            "zygo {args:?}"
        );
        assert!(f.stdout.is_empty(), "zygo {args:?}: {}", f.stdout_text());
    }
    assert!(!s.socket().exists());
    s.never_started();
}

/// `zygo up -f FILE` with a file that cannot be served (it does not parse, or names no
/// function) is refused before anything starts: exit 1, the fault named, and no supervisor
/// left running for nothing.
#[test]
fn up_with_a_file_it_cannot_serve_starts_nothing() {
    let who = if am_root() { Who::Root } else { Who::Rootless };
    let s = SUITE.sup(who, "upbad");
    let bad = s.file("bad.toml", b"[fn.x]\nhandler = \"h.py\"\nmem = \"lots\"\n");
    let empty = s.file("empty.toml", b"[defaults]\nmem = \"64M\"\n");
    for (file, says) in [(&bad, "mem"), (&empty, "has no [fn.*] tables")] {
        let f = s.run(&["up", "-f", file]);
        assert_eq!(f.code, 1, "{file}: {}", f.stderr_text());
        assert!(
            f.stderr_text().contains(says),
            "{file}: {}",
            f.stderr_text()
        );
        assert!(
            !f.stdout_text().contains("supervisor started"),
            "{}",
            f.stdout_text()
        );
        let f = s.run(&["up", "-f", file, "--json"]);
        assert_eq!(f.code, 1, "{file}: {}", f.stderr_text());
        assert_eq!(f.last_json()["code"], "bad_spec", "{}", f.stdout_text());
        assert!(!s.socket().exists(), "a supervisor was started for {file}");
    }
    s.never_started();
}

/// `zygo up` against a supervisor already running says what it cannot make take effect,
/// and how to restart, with a non-zero exit: a ZYGO_API_TOKEN the supervisor was not
/// started with (nothing is changed), a function whose table changed (it is left as it is).
/// The README's order (drain, then `zygo up` with the token exported) then works.
#[test]
fn up_against_a_running_supervisor_says_what_cannot_take_effect() {
    let Some(mut s) = SUITE.root("upagain") else {
        return;
    };
    let n = s.up(&[("hello", "hello", "")]);
    let hello = &n[0];
    let file = s.dir.path.join("sandbox.toml").display().to_string();
    let token = format!("test-token-{:x}", unique());
    let up_with_token = |s: &Sup, json: bool| {
        let mut args = vec!["up", "-f", file.as_str()];
        if json {
            args.push("--json");
        }
        let mut c = s.cmd(&args);
        c.env("ZYGO_API_TOKEN", &token);
        finish(c)
    };

    // A token it was not started with: refused, saying why and how to restart.
    let f = up_with_token(&s, false);
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    let err = f.stderr_text();
    for says in [
        "ZYGO_API_TOKEN",
        "Nothing was changed",
        "zygo drain",
        "zygo up -f",
    ] {
        assert!(err.contains(says), "{says:?} not said: {err}");
    }
    assert!(
        !err.contains(&token),
        "the token itself is never printed: {err}"
    );
    let f = up_with_token(&s, true);
    assert_eq!(f.code, 1);
    assert_eq!(f.last_json()["code"], "conflict", "{}", f.stdout_text());

    // The same file again: nothing differs.
    let f = s.run(&["up", "-f", &file]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    assert!(
        f.stdout_text().contains(&format!("serving {hello}")),
        "{}",
        f.stdout_text()
    );

    // The file edited: the function is left as it is, and that is said.
    s.write_toml(&[("hello", "hello", "mem = \"128M\"\ntimeout = \"9s\"")]);
    let f = s.run(&["up", "-f", &file]);
    assert_eq!(f.code, 1, "{}", f.stdout_text());
    let err = f.stderr_text();
    assert!(
        err.contains("served already with other settings (mem, timeout differ")
            && err.contains(&format!("zygo stop {hello}")),
        "{err}"
    );

    // The README's order: drain, then up with the token exported: a new supervisor that
    // takes the token, and the file as it is now.
    let f = s.run(&["drain", "--grace", "1s"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let f = up_with_token(&s, false);
    assert_eq!(f.code, 0, "{}\n{}", f.stderr_text(), s.log());
    assert!(
        f.stdout_text().contains("supervisor started"),
        "{}",
        f.stdout_text()
    );
    s.supervisor = None;
    s.find_supervisor();
    let f = up_with_token(&s, false);
    assert_eq!(f.code, 0, "the token is known now: {}", f.stderr_text());
    s.shutdown();
}

/// `zygo logs NAME -n 1 -f`: the last request, then each one as it finishes; never the
/// history before the last N again.
#[test]
fn logs_follow_shows_the_last_n_then_what_comes() {
    let Some(mut s) = SUITE.root("logsf") else {
        return;
    };
    let n = s.up(&[("hello", "hello", "")]);
    let hello = &n[0];
    let call = |i: u32| {
        let (v, f) = s.exec(hello, Some(&json!({"i": i}).to_string()), &[]);
        assert_eq!(f.code, 0, "{v}");
        text(&v, "request_id").to_string()
    };
    let before: Vec<String> = (0..3).map(call).collect();
    let mut follow = s.cmd(&["logs", hello, "-n", "1", "-f", "--json"]);
    follow.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = follow.spawn().expect("start zygo logs -f");
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let id_of = |l: &str| -> String {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        text(&v, "request_id").to_string()
    };
    let mut got = vec![id_of(
        &rx.recv_timeout(Duration::from_secs(20))
            .expect("the first line"),
    )];
    // Two polls pass (one a second): the history before the last one must not come back.
    std::thread::sleep(Duration::from_millis(2500));
    got.extend(rx.try_iter().map(|l| id_of(&l)));
    let after = call(3);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !got.contains(&after) && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            got.push(id_of(&l));
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    got.extend(rx.try_iter().map(|l| id_of(&l)));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(got, [before[2].clone(), after], "before: {before:?}");
    s.shutdown();
}

/// `zygo logs`, `stats`, `warm`, `ls`, `stop`, and an unknown function.
#[test]
fn admin_commands() {
    let Some(mut s) = SUITE.root("admin") else {
        return;
    };
    let n = s.up(&[("hello", "hello", "max_warm = 3"), ("boom", "boom", "")]);
    let (hello, boom) = (&n[0], &n[1]);
    let ids: Vec<String> = (0..3)
        .map(|i| {
            let (v, f) = s.exec(hello, Some(&json!({"i": i}).to_string()), &[]);
            assert_eq!(f.code, 0, "{v}");
            text(&v, "request_id").to_string()
        })
        .collect();
    let (_, f) = s.exec(boom, None, &[]);
    assert_eq!(f.code, 1);

    // logs: the last N, oldest first.
    let f = s.run(&["logs", hello, "-n", "2", "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let lines = f.json_lines();
    let got: Vec<&str> = lines.iter().map(|l| text(l, "request_id")).collect();
    assert_eq!(got, [ids[1].as_str(), ids[2].as_str()], "{lines:?}");
    for l in &lines {
        assert_eq!(l["outcome"], "ok", "{l}");
        assert!(text(l, "stdout").contains("hello on stdout"), "{l}");
        assert!(
            l["wall_ms"].as_f64() > Some(0.0) && l["finished_ms"].is_u64(),
            "{l}"
        );
    }
    let f = s.run(&["logs", hello]);
    assert_eq!(f.code, 0);
    for id in &ids {
        assert!(f.stdout_text().contains(id.as_str()), "{}", f.stdout_text());
    }
    let f = s.run(&["logs", boom, "--json"]);
    let l = f.last_json();
    assert_eq!(l["outcome"], "error", "{l}");
    assert!(text(&l, "error").contains("kaboom"), "{l}");
    let f = s.run(&["logs", "no-such-fn", "--json"]);
    s.assert_refused(&f.last_json(), &f, "not_found");

    // stats
    let f = s.run(&["stats", "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let all = f.last_json();
    let find = |name: &str| -> Value {
        all.as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == name).cloned())
            .unwrap_or(Value::Null)
    };
    let h = find(hello);
    assert_eq!(h["requests"], 3, "{all}");
    assert_eq!(h["ok"], 3, "{all}");
    assert!(
        h["p50_wall_ms"].as_f64() > Some(0.0)
            && h["p99_wall_ms"].as_f64() >= h["p50_wall_ms"].as_f64(),
        "{h}"
    );
    assert!(h["peak_rss_kb"].as_u64() > Some(0), "{h}");
    let b = find(boom);
    assert_eq!(b["requests"], 1, "{all}");
    assert_eq!(b["failures"]["error"], 1, "{all}");
    let f = s.run(&["stats", hello, "--json"]);
    assert_eq!(
        f.last_json().as_array().map(Vec::len),
        Some(1),
        "{}",
        f.stdout_text()
    );
    let f = s.run(&["stats"]);
    assert!(
        f.stdout_text().contains("REQUESTS") && f.stdout_text().contains(hello.as_str()),
        "{}",
        f.stdout_text()
    );
    let f = s.run(&["stats", "no-such-fn", "--json"]);
    s.assert_refused(&f.last_json(), &f, "not_found");

    // warm: a second zygote starts and becomes ready.
    let f = s.run(&["warm", hello, "2", "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let v = f.last_json();
    assert_eq!(v["name"], *hello, "{v}");
    assert!(v["ready"].is_u64(), "{v}");
    wait_for(
        Duration::from_secs(10),
        "two ready zygotes after warm 2",
        || {
            let i = s.info(hello);
            i["zygotes"]["ready"].as_u64().unwrap_or(0)
                + i["zygotes"]["frozen"].as_u64().unwrap_or(0)
                == 2
        },
    );
    assert_eq!(s.info(hello)["min_warm"], 2);
    assert_eq!(agent_pids(hello).len(), 2);
    let f = s.run(&["warm", "no-such-fn", "--json"]);
    s.assert_refused(&f.last_json(), &f, "not_found");

    // ls, human.
    let f = s.run(&["ls"]);
    assert!(
        f.stdout_text().contains(hello.as_str()) && f.stdout_text().contains("serving"),
        "{}",
        f.stdout_text()
    );

    // stop: gone from ls, its calls not found, its cgroups and agents gone.
    let f = s.run(&["stop", boom, "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    assert_eq!(f.last_json(), json!({"stopped": boom}));
    assert!(s.info(boom).is_null(), "stopped but listed");
    let (v, f) = s.exec(boom, None, &[]);
    s.assert_refused(&v, &f, "not_found");
    assert!(agent_pids(boom).is_empty(), "agents of a stopped function");
    let left = wait_for_quietly(Duration::from_secs(3), || {
        fn_cgroups(boom).iter().all(|d| !d.exists())
    });
    assert!(left, "a stopped function's cgroups remain");
    let f = s.run(&["stop", "no-such-fn", "--json"]);
    s.assert_refused(&f.last_json(), &f, "not_found");

    // An unknown function.
    let (v, f) = s.exec("no-such-fn", None, &[]);
    s.assert_refused(&v, &f, "not_found");
    let f = s.run(&["exec", "no-such-fn"]);
    assert_eq!(f.code, 1);
    assert!(
        f.stderr_text().contains("no function named \"no-such-fn\""),
        "{}",
        f.stderr_text()
    );
    assert_eq!(s.call_ok(hello, "{}")["echo"], json!({}));
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// More edges (rootful).

/// Drain whose grace runs out with a call still running: the supervisor exits at the
/// end of the grace, leaving nothing behind; with `check_answer`, the call cut off must
/// have been answered (cancelled) rather than dropped.
fn drain_grace(test: &str, check_answer: bool) {
    let Some(mut s) = SUITE.root(test) else {
        return;
    };
    let n = s.up(&[("nap", "nap", "timeout = \"15s\"")]);
    let nap = &n[0];
    let call = s.exec_in_flight(nap, r#"{"secs": 10}"#, &[]);
    let t0 = Instant::now();
    let f = s.run(&["drain", "--grace", "1s", "--json"]);
    assert_eq!(
        f.last_json(),
        json!({"drained": true, "finished": 0, "cut_off": 1})
    );
    let f = call.join().expect("the call");
    assert!(
        t0.elapsed() < slow(Duration::from_secs(4)),
        "the drain waited {:?}",
        t0.elapsed()
    );
    s.wait_gone();
    assert!(
        t0.elapsed() < slow(Duration::from_secs(5)),
        "exited after {:?}",
        t0.elapsed()
    );
    let v = f.last_json();
    assert_eq!(f.code, 1, "the call cut off: {v}");
    if check_answer {
        s.assert_failed(&v, &f, "cancelled", "cancelled");
    }
}

#[test]
fn drain_grace_expires() {
    drain_grace("grace", false);
}

#[test]
fn drain_grace_answers_the_cut_off_call() {
    drain_grace("graceans", true);
}

/// A caller that goes away mid-call: its request is killed (cancelled), not left running.
#[test]
fn caller_goes_away() {
    let Some(mut s) = SUITE.root("gone") else {
        return;
    };
    let n = s.up(&[("nap", "nap", "timeout = \"15s\"")]);
    let nap = &n[0];
    let mut c = s.exec_cmd(nap, Some(r#"{"secs": 10}"#), &[]);
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().expect("spawn zygo exec");
    s.wait_in_flight(nap, 1);
    std::thread::sleep(Duration::from_millis(300));
    child.kill().expect("kill zygo exec");
    child.wait().expect("reap zygo exec");
    wait_for(Duration::from_secs(2), "the abandoned call to end", || {
        s.info(nap)["in_flight"] == 0
    });
    let usage = fs::read_to_string(s.st.join("usage.log")).unwrap_or_default();
    assert!(
        usage.contains("\"outcome\":\"cancelled\""),
        "usage: {usage}"
    );
    assert_eq!(s.call_ok(nap, r#"{"secs": 0}"#), json!({"slept": 0}));
    s.shutdown();
}

/// Output over 1 MiB per stream is cut at 1 MiB (with `check_flag`: and flagged as
/// truncated); exactly 1 MiB is kept whole and not flagged.
fn output_cap(test: &str, check_flag: bool) {
    let Some(mut s) = SUITE.root(test) else {
        return;
    };
    let n = s.up(&[("chatty", "chatty", "timeout = \"10s\"")]);
    let chatty = &n[0];
    let (v, f) = s.exec(chatty, Some(r#"{"out": 3145728}"#), &[]);
    assert_eq!(f.code, 0, "{}\n{}", truncate(&v.to_string(), 300), s.log());
    let out = text(&v, "stdout");
    assert!(
        out.len() <= 1 << 20 && out.len() >= (1 << 20) - 65536,
        "stdout kept: {} bytes",
        out.len()
    );
    assert_eq!(v["stderr"], "small\n");
    assert_eq!(v["stderr_truncated"], false);
    if check_flag {
        assert_eq!(
            v["stdout_truncated"],
            true,
            "3 MiB of stdout cut to {} bytes, not flagged",
            out.len()
        );
    }
    let (v, _) = s.exec(chatty, Some(r#"{"out": 1048576}"#), &[]);
    assert_eq!(text(&v, "stdout").len(), 1 << 20);
    assert_eq!(v["stdout_truncated"], false);
    s.shutdown();
}

#[test]
fn output_is_capped() {
    output_cap("cap", false);
}

#[test]
fn output_truncation_is_flagged() {
    output_cap("capflag", true);
}

/// Events that are JSON but not objects reach the handler as they are.
#[test]
fn non_object_events() {
    let Some(mut s) = SUITE.root("events") else {
        return;
    };
    let n = s.up(&[("hello", "hello", "")]);
    let hello = &n[0];
    for ev in [
        "42",
        "\"text\"",
        "[1, 2]",
        "null",
        "true",
        "{\"nested\": {\"a\": [null]}}",
    ] {
        let want: Value = serde_json::from_str(ev).expect("JSON");
        assert_eq!(s.call_ok(hello, ev)["echo"], want, "event {ev}");
    }
    s.shutdown();
}

/// Under load a function grows to max_warm zygotes and serves every call that fits.
#[test]
fn scales_to_max_warm() {
    let Some(mut s) = SUITE.root("scale") else {
        return;
    };
    let n = s.up(&[("nap", "nap", "timeout = \"15s\"\nmax_warm = 2")]);
    let nap = &n[0];
    let calls: Vec<_> = (0..6)
        .map(|_| s.exec_bg(nap, r#"{"secs": 2}"#, &[]))
        .collect();
    s.wait_in_flight(nap, 6);
    wait_for(Duration::from_secs(10), "a second zygote", || {
        agent_pids(nap).len() == 2
    });
    for c in calls {
        let f = c.join().expect("a call");
        let v = f.last_json();
        assert!(
            f.code == 0 && v["result"] == json!({"slept": 2}),
            "{v}\n{}",
            s.log()
        );
    }
    let i = s.info(nap);
    let z = &i["zygotes"];
    let total: u64 = ["ready", "busy", "frozen", "starting"]
        .iter()
        .map(|k| z[k].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(total, 2, "{i}");
    s.shutdown();
}

/// `zygo stop` with a call in flight: the call is answered cancelled, the function's
/// zygotes and cgroups are gone; stopping a frozen function works too.
#[test]
fn stop_in_flight_and_frozen() {
    let Some(mut s) = SUITE.root("stop") else {
        return;
    };
    let n = s.up(&[
        ("nap", "nap", "timeout = \"15s\""),
        ("cold", "hello", "idle_timeout = \"1s\""),
    ]);
    let (nap, cold) = (&n[0], &n[1]);
    let call = s.exec_in_flight(nap, r#"{"secs": 10}"#, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let f = s.run(&["stop", nap]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let f = call.join().expect("the call");
    let v = f.last_json();
    s.assert_failed(&v, &f, "cancelled", "cancelled");
    wait_for(
        Duration::from_secs(3),
        "the stopped function's cgroups to go",
        || fn_cgroups(nap).iter().all(|d| !d.exists()),
    );
    assert!(agent_pids(nap).is_empty());

    wait_for(Duration::from_secs(5), "the idle zygote to freeze", || {
        s.info(cold)["zygotes"]["frozen"] == 1
    });
    let f = s.run(&["stop", cold]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    wait_for(
        Duration::from_secs(3),
        "the frozen function's cgroups to go",
        || fn_cgroups(cold).iter().all(|d| !d.exists()),
    );
    assert!(
        wait_for_quietly(Duration::from_secs(3), || agent_pids(cold).is_empty()),
        "a frozen zygote's agent survived stop"
    );
    s.shutdown();
}

const NODE_HELLO: &str = r#"import { execSync } from "node:child_process";
export default async function (event) {
  console.log("hello from node", event.name);
  event.progress("half way");
  const sub = execSync("echo from-subprocess; echo sub-err 1>&2").toString();
  if (event.fail) throw new Error("node says no");
  if (event.bigint) return 10n;
  return { hello: event.name, cwd: process.cwd(), sub };
}
"#;

both_tests! {
    /// A Node function: each call is served by a spare that imported the handler before
    /// the call arrived; console output and subprocesses' output are captured; a throw is
    /// an error with its stack; a value JSON cannot hold is the specific error; the spares
    /// refill behind each call.
    fn node_function(who) {
        let mut s = SUITE.sup(who, "node");
        s.fn_file("hello.mjs", NODE_HELLO);
        let n = s.up(&[("nh", "", "agent = \"node\"\nentry = \"fn/hello.mjs\"\ntimeout = \"20s\"")]);
        let nh = &n[0];
        for i in 0..4 {
            let (v, f) = s.exec(nh, Some(&format!(r#"{{"name": "n{i}"}}"#)), &[]);
            assert_eq!(f.code, 0, "exec: {v} {}\n{}", f.stderr_text(), s.log());
            assert_eq!(v["result"]["hello"], format!("n{i}"), "{v}");
            assert_eq!(v["result"]["sub"], "from-subprocess\n", "{v}");
            assert!(text(&v["result"], "cwd").starts_with("/work/"), "{v}");
            assert_eq!(v["stdout"], format!("hello from node n{i}\n"), "{v}");
            assert_eq!(v["stderr"], "sub-err\n", "{v}");
        }
        let (v, f) = s.exec(nh, Some(r#"{"name": "x", "fail": true}"#), &[]);
        assert_eq!(f.code, 1, "{v}");
        assert_eq!(v["code"], "handler", "{v}");
        assert!(text(&v, "error").contains("node says no"), "{v}");
        assert!(text(&v, "traceback").contains("hello.mjs"), "{v}");
        let (v, _) = s.exec(nh, Some(r#"{"name": "x", "bigint": true}"#), &[]);
        assert!(text(&v, "error").contains("not JSON-serialisable"), "{v}");
        s.shutdown();
    }
}

/// `event.progress` is there whatever the event's JSON type, in a Python and a Node
/// handler, and the event is still exactly what was sent (the same JSON comes back). The
/// values a language cannot give a method (null; in Python true and false too) come as they
/// are; a Node object event with a "progress" key keeps it.
#[test]
fn event_progress_whatever_the_events_type() {
    let Some(mut s) = SUITE.root("anyprogress") else {
        return;
    };
    s.fn_file(
        "any.py",
        "def handler(event):\n    if hasattr(event, 'progress'):\n        event.progress('p ' + type(event).__mro__[-2].__name__)\n    return {'event': event}\n",
    );
    s.fn_file(
        "any.mjs",
        "export default function (event) {\n  if (event !== null && typeof event.progress === 'function') event.progress('p ' + (Array.isArray(event) ? 'array' : typeof event));\n  return { event, keys: event !== null && typeof event === 'object' ? Object.keys(event) : null };\n}\n",
    );
    let n = s.up(&[
        (
            "py",
            "",
            "agent = \"python\"\nentry = \"fn/any.py:handler\"",
        ),
        (
            "js",
            "",
            "agent = \"node\"\nentry = \"fn/any.mjs\"\ntimeout = \"20s\"",
        ),
    ]);
    let (py, js) = (&n[0], &n[1]);
    let cases: [(&str, Option<&str>, Option<&str>); 8] = [
        (r#"{"a": 1}"#, Some("p dict"), Some("p object")),
        ("[1, 2]", Some("p list"), Some("p array")),
        (r#""text""#, Some("p str"), Some("p string")),
        ("7", Some("p int"), Some("p number")),
        ("1.5", Some("p float"), Some("p number")),
        ("true", None, Some("p boolean")),
        ("null", None, None),
        (r#"{"progress": 5}"#, Some("p dict"), None),
    ];
    for (event, py_says, js_says) in cases {
        for (f, says) in [(py, py_says), (js, js_says)] {
            let (v, fin) = s.exec(f, Some(event), &["--stream"]);
            let lines = fin.json_lines();
            let (answer, events) = lines.split_last().expect("the answer");
            assert_eq!(
                answer["outcome"],
                "ok",
                "{f} {event}: {answer}\n{}",
                s.log()
            );
            let sent: Value = serde_json::from_str(event).expect("JSON");
            assert_eq!(answer["result"]["event"], sent, "{f} {event}: {v}");
            let progress: Vec<&str> = events
                .iter()
                .filter(|e| e["event"] == "progress")
                .filter_map(|e| e["data"].as_str())
                .collect();
            assert_eq!(
                progress,
                says.into_iter().collect::<Vec<_>>(),
                "{f} {event}: {lines:?}"
            );
        }
    }
    // The Node object event kept its own "progress" key, and it is still enumerable.
    let (v, _) = s.exec(js, Some(r#"{"progress": 5}"#), &[]);
    assert_eq!(v["result"]["keys"], json!(["progress"]), "{v}");
    s.shutdown();
}

/// A handler error says the code its process exited with when it exited — Python's
/// `sys.exit(3)`, Node's `process.exit(4)`, a warm-exec command's `exit 5` — and null when
/// it raised.
#[test]
fn a_handler_that_exited_says_its_exit_code() {
    let Some(mut s) = SUITE.root("exitcode") else {
        return;
    };
    s.fn_file(
        "exits.py",
        "import sys\ndef handler(event):\n    print('before')\n    if event.get('raise'):\n        raise ValueError('no')\n    sys.exit(event['code'])\n",
    );
    s.fn_file(
        "exits.mjs",
        "export default function (event) {\n  console.log('before');\n  process.exit(event.code);\n}\n",
    );
    let n = s.up(&[
        ("py", "agent = \"python\"\nentry = \"fn/exits.py:handler\""),
        (
            "js",
            "agent = \"node\"\nentry = \"fn/exits.mjs\"\ntimeout = \"20s\"",
        ),
        ("sh", "cmd = [\"/bin/sh\"]"),
    ]);
    let (py, js, sh) = (&n[0], &n[1], &n[2]);
    let script = s.file("exit5.sh", b"echo before\nexit 5\n");
    for (f, event, flags, code) in [
        (py, r#"{"code": 3}"#, &[][..], 3),
        (js, r#"{"code": 4}"#, &[][..], 4),
        (sh, "{}", &["--script", script.as_str()][..], 5),
    ] {
        let (v, fin) = s.exec(f, Some(event), flags);
        assert_eq!(fin.code, 1, "{f}: {v}\n{}", s.log());
        assert_eq!(v["code"], "handler", "{f}: {v}");
        assert_eq!(v["exit_code"], code, "{f}: {v}");
        assert_eq!(v["stdout"], "before\n", "{f}: {v}");
    }
    // Exiting with 0 is answering nothing.
    let (v, _) = s.exec(js, Some(r#"{"code": 0}"#), &[]);
    assert_eq!(
        (v["outcome"].clone(), v["result"].clone()),
        (json!("ok"), Value::Null),
        "{v}"
    );
    // Raised: no exit code.
    let (v, _) = s.exec(py, Some(r#"{"raise": true}"#), &[]);
    assert_eq!(v["code"], "handler", "{v}");
    assert_eq!(v["exit_code"], Value::Null, "{v}");
    s.shutdown();
}

/// A Node handler that fails to import: `zygo up` prints why and the function is failed.
#[test]
fn node_import_failure() {
    let Some(mut s) = SUITE.root("nodeimp") else {
        return;
    };
    s.fn_file(
        "broken.mjs",
        "import \"no-such-package-zygo\";\nexport default () => 1;\n",
    );
    let (file, n) = s.write_toml(&[("nb", "", "agent = \"node\"\nentry = \"fn/broken.mjs\"")]);
    let f = s.run(&["up", "-f", file.to_str().expect("UTF-8")]);
    s.find_supervisor();
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains("no-such-package-zygo"),
        "{}",
        f.stderr_text()
    );
    assert_eq!(s.info(&n[0])["state"], "failed");
    s.shutdown();
}

/// A supervisor killed with SIGKILL cannot drain: its sandboxes die with their launchers,
/// and the next supervisor removes the cgroups it left (named after the dead pid).
#[test]
fn killed_supervisor_leftovers_are_swept() {
    let Some(mut s) = SUITE.root("swept") else {
        return;
    };
    let n = s.up(&[("hello", "hello", "")]);
    let hello = &n[0];
    assert_eq!(s.call_ok(hello, "{}")["echo"], json!({}));
    let old = s.kill_supervisor();
    assert!(
        !s.leftover_cgroups().is_empty(),
        "a killed supervisor leaves its cgroups (else this test proves nothing)"
    );
    // A supervisor killed in the middle of creating a request's cgroup leaves it in the
    // first hierarchies only; the sweep must find that too.
    let partial = fn_cgroups(hello)[0].join(format!("r-{old}-partial"));
    fs::create_dir(&partial).expect("create a partly made cgroup");
    // Beside it, the empty folder a live supervisor has just made for a function of its
    // own (about to write its memory ceiling there): not the sweep's to remove, nor, later,
    // this supervisor's as it stops.
    let live: Vec<PathBuf> = fn_cgroups(&format!("live-{:x}", unique()))
        .into_iter()
        .filter(|d| d.parent().is_some_and(Path::is_dir))
        .collect();
    for d in &live {
        fs::create_dir(d).expect("create another supervisor's function folder");
    }
    // A new supervisor for the same functions sweeps what the old one left.
    let (file, _) = s.write_toml(&[("hello", "hello", "")]);
    let f = s.run(&["up", "-f", file.to_str().expect("UTF-8")]);
    assert_eq!(f.code, 0, "{}\n{}", f.stderr_text(), s.log());
    s.find_supervisor();
    let gone: Vec<&PathBuf> = live.iter().filter(|d| !d.is_dir()).collect();
    for d in &live {
        let _ = fs::remove_dir(d);
    }
    assert!(
        gone.is_empty(),
        "the sweep removed a live supervisor's function folders: {gone:?}\n{}",
        s.log()
    );
    let stale: Vec<PathBuf> = [format!("z-{old}-"), format!("r-{old}-")]
        .iter()
        .flat_map(|prefix| fn_subgroups(hello, prefix))
        .collect();
    assert!(
        stale.is_empty(),
        "cgroups of the killed supervisor survived: {stale:?}\n{}",
        s.log()
    );
    assert_eq!(s.call_ok(hello, "{}")["echo"], json!({}));
    // A supervisor that stops removes its own functions' folders, never another's.
    for d in &live {
        fs::create_dir(d).expect("create another supervisor's function folder");
    }
    s.shutdown();
    let gone: Vec<&PathBuf> = live.iter().filter(|d| !d.is_dir()).collect();
    for d in &live {
        let _ = fs::remove_dir(d);
    }
    assert!(
        gone.is_empty(),
        "a supervisor that stopped removed another's function folders: {gone:?}"
    );
}

/// `requirements` naming a file that is not there is refused when the function is served,
/// naming the key and the file, never ignored until a call fails (the sets themselves:
/// tests/deps.rs). Nothing is built, so nothing reaches a registry.
#[test]
fn requirements_naming_no_file_are_refused_when_served() {
    let Some(mut s) = SUITE.root("notyet") else {
        return;
    };
    let (file, _) = s.write_toml(&[
        (
            "deps",
            "hello",
            "requirements = \"fn/no-such-requirements.txt\"",
        ),
        ("secret", "hello", "secrets = [\"API_KEY\"]"),
    ]);
    let f = s.run(&["up", "-f", file.to_str().expect("UTF-8 path"), "--json"]);
    s.find_supervisor();
    let v = f.last_json();
    let failed = v["failed"].to_string();
    assert!(
        failed.contains("requirements") && failed.contains("no-such-requirements.txt"),
        "{v}\n{}",
        f.stderr_text()
    );
    assert!(!failed.contains("API_KEY"), "secrets are served: {v}");
    assert!(!s.st.join("deps").exists(), "a set was started");
    s.shutdown();
}

const NODE_ECHO: &str = "export default async function (event) {\n  return { node: event };\n}\n";

both_tests! {
    /// A tenant's calls of the host's Node and Python functions and pools are all served,
    /// each in a request cgroup of the tenant's: a call's process is moved there whole,
    /// every thread of it. (On cgroup v1 a parked Node process, which has threads, was moved
    /// one thread at a time, and the threads left behind were killed: every tenant call of a
    /// Node function or pool failed, while the host's own calls, which need no move,
    /// worked.) Through the API role, as `zygo api` would ask.
    fn a_tenants_calls_of_node_and_python_are_served(who) {
        use proto::front::{ExecRequest, Reply, Request, ScriptRef};
        use zygo_tests::api::{mint, tenant_id, ApiConn};
        if !Path::new("/usr/bin/node").exists() {
            skip("no /usr/bin/node on this machine (.ci/run installs it)");
            return;
        }
        const BOOT: &str = "bootstrap-secret-for-language-tests";
        let mut s = SUITE.sup(who, "langs");
        s.env("ZYGO_API_TOKEN", BOOT);
        s.fn_file("echo.mjs", NODE_ECHO);
        let n = s.up(&[
            ("nf", "agent = \"node\"\nentry = \"fn/echo.mjs\""),
            ("np", "agent = \"node\""),
            ("pf", "agent = \"python\"\nentry = \"fn/handlers.py:hello\""),
            ("pp", "agent = \"python\""),
        ]);
        let (node_fn, node_pool, py_fn, py_pool) = (&n[0], &n[1], &n[2], &n[3]);
        let mut api = ApiConn::open(&s, proto::api::FrontFlags::default());
        let t = tenant_id("langs");
        let r = api.ask(BOOT, None, Request::CreateTenant { id: t.clone() });
        assert!(matches!(r, Reply::Tenant { .. }), "create {t}: {r:?}");
        let (_, tok) = mint(&s, Some(&t));
        let mut put = |src: &str| match api.ask(&tok, None, Request::PutScript {
            source: src.as_bytes().to_vec(),
        }) {
            Reply::ScriptStored { digest, .. } => digest,
            other => panic!("put a script: {other:?}"),
        };
        let js = put("module.exports.handler = async (e) => ({ pool: e });\n");
        let py = put("def handler(event):\n    return {\"pool\": event}\n");
        let call = |name: &str, script: Option<&str>, i: u32| {
            Request::Exec(ExecRequest {
                name: name.to_string(),
                event: i.to_string(),
                key: None,
                timeout_ms: None,
                stream: false,
                script: script.map(|d| ScriptRef::Digest(d.to_string())),
                workspace: None,
                workspace_blob: None,
                out: false,
            })
        };
        for i in 0..8u32 {
            for (what, req, want) in [
                ("the Node function", call(node_fn, None, i), json!({ "node": i })),
                ("the Node pool", call(node_pool, Some(&js), i), json!({ "pool": i })),
                ("the Python function", call(py_fn, None, i), json!(i)),
                ("the Python pool", call(py_pool, Some(&py), i), json!({ "pool": i })),
            ] {
                match api.ask(&tok, None, req) {
                    Reply::Answer(a) => {
                        let mut got: Value =
                            serde_json::from_str(a.result.as_deref().unwrap_or("null"))
                                .unwrap_or(Value::Null);
                        if what == "the Python function" {
                            got = got["echo"].clone();
                        }
                        assert_eq!(got, want, "[{}] call {i} of {what}: {a:?}\n{}", who.name(), s.log());
                    }
                    other => panic!("[{}] call {i} of {what}: {other:?}\n{}", who.name(), s.log()),
                }
            }
        }
        s.shutdown();
    }
}

/// The examples run as their READMEs say: `examples/warm-function` (a Python and a Node
/// function, served from the example's own sandbox.toml) and `examples/warm-exec` (a
/// warm-exec pool running a script sent with the call).
#[test]
fn the_examples_run_as_their_readmes_say() {
    let Some(s) = SUITE.root("examples") else {
        return;
    };
    if !Path::new("/usr/bin/node").exists() {
        skip("no /usr/bin/node on this machine (.ci/run installs it)");
        return;
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let file = |p: &str| examples.join(p).to_str().expect("UTF-8").to_string();
    let f = s.run(&["up", "-f", &file("warm-function/sandbox.toml")]);
    assert_eq!(f.code, 0, "{}\n{}", f.stderr_text(), s.log());
    let (v, f) = s.exec("greet", Some(r#"{"name": "ada"}"#), &[]);
    assert_eq!(f.code, 0, "{v}\n{}", s.log());
    assert_eq!(v["result"]["message"], "hello, ada", "{v}");
    assert_eq!(v["stdout"], "greeting ada\n", "{v}");
    let (v, f) = s.exec("shout", Some(r#"{"text": "warm"}"#), &[]);
    assert_eq!(f.code, 0, "{v}\n{}", s.log());
    assert_eq!(v["result"], json!({"shout": "WARM!"}), "{v}");
    let f = s.run(&["up", "-f", &file("warm-exec/sandbox.toml")]);
    assert_eq!(f.code, 0, "{}\n{}", f.stderr_text(), s.log());
    let (v, f) = s.exec(
        "sh",
        Some(r#"{"text": "one two three"}"#),
        &["--script", &file("warm-exec/count.sh")],
    );
    assert_eq!(f.code, 0, "{v}\n{}", s.log());
    assert_eq!(v["result"], json!({"exit_code": 0}), "{v}");
    assert_eq!(v["stdout"], "3 words\n", "{v}");
    for name in ["greet", "shout", "sh"] {
        let _ = s.run(&["stop", name]);
    }
    s.shutdown();
}
