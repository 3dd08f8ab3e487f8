//! Requests share nothing, and faults lose nothing: one hostile test per class of state a
//! request could reach or leave behind in a warm zygote (and the faults that must not lose
//! a cgroup or a usage record), rootful and rootless where both apply. The handlers are in
//! `tests/functions/share_nothing.py`.

use std::fs;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygo_tests::*;

const HANDLERS: &str = include_str!("../functions/share_nothing.py");

static SUITE: Suite = Suite {
    prefix: "rsn-",
    handlers: HANDLERS,
    defaults: "timeout = \"20s\"\nmem = \"128M\"\nidle_timeout = \"60s\"\n",
    agents: false,
};

/// A Python runtime pool.
const PY_POOL: &str = "agent = \"python\"";

fn results(v: &Value) -> Vec<Value> {
    v["result"].as_array().cloned().unwrap_or_default()
}

/// What one request saw of its descriptors must hold nothing of the host: fd 0 is the null
/// device, everything else a pipe or a socket, and none could be grown or truncated.
#[track_caller]
fn assert_no_host_descriptor(who: Who, seen: &[Value], what: &str) {
    assert!(
        !seen.is_empty(),
        "[{}] {what}: no descriptors reported",
        who.name()
    );
    for d in seen {
        let kind = text(d, "kind");
        let fd = d["fd"].as_i64().unwrap_or(-1);
        let allowed = match fd {
            0 => kind == "chr" && text(d, "target") == "/dev/null",
            _ => kind == "fifo" || kind == "sock",
        };
        assert!(
            allowed,
            "[{}] {what}: fd {fd} is a {kind} ({}): {d}\nall: {seen:?}",
            who.name(),
            text(d, "target")
        );
        // Sockets are left alone (one is the request channel); everything else was tried.
        if kind == "sock" {
            continue;
        }
        for op in ["truncate", "fallocate"] {
            let r = text(d, op);
            assert!(
                !r.is_empty() && r != "OK",
                "[{}] {what}: {op} of fd {fd}: {}: {d}",
                who.name(),
                if r.is_empty() {
                    "not tried"
                } else {
                    "it worked"
                }
            );
        }
    }
}

both_tests! {
    /// Item 1: no descriptor of a handler's or a pool script's process refers to anything
    /// of the host: writing, truncating, growing and reopening each reaches no host file,
    /// and nothing written lands in the supervisor's log.
    fn no_descriptor_of_a_request_reaches_a_host_file(who) {
        let mut s = SUITE.sup(who, "fds");
        let n = s.up(&[
            ("fn", "agent = \"python\"\nentry = \"fn/handlers.py:descriptors\""),
            ("pool", PY_POOL),
        ]);
        let marker = format!("FORGED-{:x}", unique());
        let log_before = fs::metadata(s.log_path()).map(|m| m.len()).unwrap_or(0);
        let (v, f) = s.exec(&n[0], Some(&json!({"marker": marker}).to_string()), &[]);
        s.assert_ok(&v, &f, "the handler");
        assert_no_host_descriptor(who, &results(&v), "a handler");
        let script = format!("{HANDLERS}\nhandler = descriptors\n");
        let path = s.file("fds.py", script.as_bytes());
        let (v, f) = s.exec(&n[1], Some(&json!({"marker": marker}).to_string()), &["--script", &path]);
        s.assert_ok(&v, &f, "the pool script");
        assert_no_host_descriptor(who, &results(&v), "a pool script");
        std::thread::sleep(Duration::from_millis(200));
        let log = fs::read_to_string(s.log_path()).unwrap_or_default();
        assert!(!log.contains(&marker), "a request wrote into the supervisor's log:\n{}", s.log());
        let grown = fs::metadata(s.log_path()).map(|m| m.len()).unwrap_or(0) - log_before;
        assert!(grown < 1 << 20, "the supervisor's log grew by {grown} bytes");
        s.shutdown();
    }

    /// Item 2: System V IPC objects (and POSIX message queues) a request makes are seen by
    /// no other request, running at the same time or later, and are gone with it: five
    /// requests that each leave a touched 90 MB segment leave nothing charged behind.
    fn ipc_objects_die_with_their_request_and_no_other_sees_them(who) {
        let mut s = SUITE.sup(who, "ipc");
        let n = s.up(&[("ipc", "ipc", "max_warm = 1")]);
        let f = &n[0];
        let empty = json!({"shm": [], "sem": [], "msg": []});
        for i in 0..5 {
            let r = s.call_ok(f, r#"{"mb": 90}"#);
            assert_eq!(r["seen_before"], empty, "call {i} saw a neighbour's IPC: {r}");
            assert!(r["semget"].as_i64() >= Some(0) && r["msgget"].as_i64() >= Some(0), "{r}");
            assert_eq!(r["seen_after"]["shm"].as_array().map(Vec::len), Some(1), "{r}");
        }
        // Nothing of those five is charged to the function any more.
        std::thread::sleep(Duration::from_millis(500));
        let held = function_memory(f);
        assert!(held < 80 << 20, "the function's cgroups still hold {} MB after five 90 MB segments", held >> 20);
        // At the same time: what one holds, the other does not see.
        let holder = s.exec_in_flight(f, r#"{"mb": 1, "hold": 3}"#, &[]);
        std::thread::sleep(Duration::from_millis(500));
        let r = s.call_ok(f, r#"{"mb": 1}"#);
        assert_eq!(r["seen_before"], empty, "saw the concurrent request's IPC: {r}");
        let h = holder.join().expect("the holder");
        s.assert_ok(&h.last_json(), &h, "the holder");
        s.shutdown();
    }

    /// Item 3: each request has a /tmp (and a /work and a /dev/shm) of its own, gone when it
    /// ends: a file
    /// one leaves is not there for the next, a /tmp filled to ENOSPC does not carry over, a
    /// unix socket one listens on cannot be reached by another running beside it, files
    /// are created 0600 (umask 077). As root, each request runs as a uid of its own, above
    /// every id the image's users have.
    fn tmp_and_work_are_the_requests_own(who) {
        let mut s = SUITE.sup(who, "tmp");
        let n = s.up(&[("tmp", "tmp", "max_warm = 1\nscratch = \"8M\"")]);
        let f = &n[0];
        let a = s.call_ok(f, r#"{"token": "first", "fill": true}"#);
        assert_eq!(a["fill"], "ENOSPC", "{a}");
        assert_eq!(a["file_mode"], "0o600", "umask: {a}");
        assert_eq!(a["tmp_before"], json!([]), "{a}");
        assert_eq!(a["shm_before"], json!([]), "{a}");
        let b = s.call_ok(f, r#"{"token": "second"}"#);
        assert_eq!(b["tmp_before"], json!([]), "the next request found the last one's /tmp: {b}");
        assert_eq!(b["shm_before"], json!([]), "the next request found the last one's /dev/shm: {b}");
        assert_eq!(b["work_before"].as_array().map(Vec::len), Some(1), "its /work holds only its own folder: {b}");
        let holder = s.exec_in_flight(f, r#"{"hold": 3}"#, &[]);
        std::thread::sleep(Duration::from_millis(500));
        let c = s.call_ok(f, r#"{"connect": true}"#);
        assert_eq!(c["connect"], "ENOENT", "reached a neighbour's socket: {c}");
        assert_eq!(c["tmp_before"], json!([]), "{c}");
        let h = holder.join().expect("the holder");
        s.assert_ok(&h.last_json(), &h, "the holder");
        let uids: Vec<i64> = [&a, &b, &c].iter().map(|r| r["uid"].as_i64().unwrap_or(-1)).collect();
        if who == Who::Root {
            assert!(uids.iter().all(|u| *u >= 65536), "request uids collide with the image's: {uids:?}");
            let mut distinct = uids.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), uids.len(), "a uid was given twice: {uids:?}");
        } else {
            assert_eq!(uids, vec![0, 0, 0]);
        }
        s.shutdown();
    }

    /// Item 9: inotify is off in sandboxes unless asked for (a watch on the shared,
    /// read-only image would see the host and other tenants open its files): ENOSYS, so
    /// programs fall back to polling.
    fn inotify_is_off_unless_asked_for(who) {
        let code = "import ctypes; l = ctypes.CDLL(None, use_errno=True); \
                    fd = l.inotify_init1(0); print(fd, ctypes.get_errno())";
        let (v, exit) = py(who, &[], code);
        assert_ok(who, &v, exit);
        assert_eq!(s(&v, "stdout").trim(), "-1 38", "{v}");
        let (v, exit) = py(who, &["--inotify"], code);
        assert_ok(who, &v, exit);
        assert!(s(&v, "stdout").trim().ends_with(" 0"), "{v}");
        let mut s = SUITE.sup(who, "inotify-off");
        let n = s.up(&[("off", "inotify", ""), ("on", "inotify", "inotify = true")]);
        let off = s.call_ok(&n[0], r#"{"max": 1}"#);
        assert_eq!(off, json!({"opened": 0, "refused": "ENOSYS"}));
        let on = s.call_ok(&n[1], r#"{"max": 1}"#);
        assert_eq!(on, json!({"opened": 1, "refused": null}));
        s.shutdown();
    }

    /// Item 4: per-user kernel counters are not shared allowances: one sandbox that opens
    /// every inotify instance it can does not leave another sandbox without one.
    fn one_sandbox_cannot_use_up_anothers_inotify_allowance(who) {
        let host_max: u64 = fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(128);
        let hog = "import ctypes, sys, time\nl = ctypes.CDLL(None, use_errno=True)\nn = 0\n\
                   while n < 100000 and l.inotify_init1(0) >= 0:\n    n += 1\n\
                   print(n, ctypes.get_errno(), flush=True)\ntime.sleep(4)\n";
        let mut c = zygo(who);
        c.args(["run", "--json", "--inotify", "--", "python3", "-c", hog]);
        let hog = std::thread::spawn(move || finish(c));
        std::thread::sleep(Duration::from_millis(1500));
        let (v, exit) = py(who, &["--inotify"], "import ctypes; l = ctypes.CDLL(None, use_errno=True); \
                                                 print(l.inotify_init1(0), ctypes.get_errno())");
        assert_ok(who, &v, exit);
        let f = hog.join().expect("the hog");
        let hv: Value = serde_json::from_slice(&f.stdout).unwrap_or(Value::Null);
        let took: u64 = s(&hv, "stdout").split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(took > 0 && took < host_max, "one sandbox took {took} of the host's {host_max}: {hv}");
        let out = s(&v, "stdout").trim().to_string();
        assert!(!out.starts_with("-1"), "[{}] another sandbox got no inotify instance while one held {took}: {out}", who.name());
    }

    /// Item 5: a pool's script space (its scratch size) evicts the scripts used least
    /// recently to make room, so distinct scripts that together overflow it all run; a
    /// script larger than the whole space is refused before anything runs, naming it.
    fn a_pools_script_space_makes_room_and_refuses_what_cannot_fit(who) {
        let mut s = SUITE.sup(who, "space");
        let n = s.up(&[
            ("roomy", format!("{PY_POOL}\nmax_warm = 1\nscratch = \"24M\"")),
            ("small", format!("{PY_POOL}\nmax_warm = 1\nscratch = \"8M\"")),
        ]);
        for i in 0..6 {
            let padding = "#".repeat(7 << 20);
            let script = format!("{padding}\ndef handler(event):\n    return {i}\n");
            let path = s.file(&format!("big{i}.py"), script.as_bytes());
            let (v, f) = s.exec(&n[0], Some("{}"), &["--script", &path]);
            s.assert_ok(&v, &f, &format!("script {i} of 7 MB in a 24 MB space"));
            assert_eq!(v["result"], i, "{v}");
        }
        let big = format!("{}\ndef handler(event):\n    return 1\n", "#".repeat(10 << 20));
        let path = s.file("toobig.py", big.as_bytes());
        let stored = s.store();
        let (v, f) = s.exec(&n[1], Some("{}"), &["--script", &path]);
        let why = s.assert_refused(&v, &f, "too_large");
        assert!(why.contains("script space"), "{why}");
        // Refused before it was stored: the store (and what it would have evicted) is as
        // it was.
        assert_eq!(s.store(), stored);
        // The pool keeps serving.
        let path = s.file("small.py", b"def handler(event):\n    return 'small'\n");
        let (v, f) = s.exec(&n[1], Some("{}"), &["--script", &path]);
        s.assert_ok(&v, &f, "a small script after a refused one");
        s.shutdown();
    }

    /// A request cannot change the limits, CPUs or priority of another process of its
    /// sandbox (rootless, they all have one uid): only its own.
    fn a_request_cannot_change_a_neighbours_limits_or_scheduling(who) {
        let mut s = SUITE.sup(who, "prlimit");
        let n = s.up(&[("p", "neighbours", "")]);
        let r = s.call_ok(&n[0], "{}");
        for k in ["prlimit_other", "affinity_other", "nice_other", "nice_user"] {
            assert_eq!(r[k], "EPERM", "[{}] {k}: {r}", who.name());
        }
        for k in ["prlimit_self", "affinity_self", "nice_self"] {
            assert_eq!(r[k], "OK", "[{}] {k}: {r}", who.name());
        }
        // The agent was not touched: the next request still starts with its usual limits.
        let again = s.call_ok(&n[0], "{}");
        assert_eq!(again["prlimit_self"], "OK", "{again}");
        s.shutdown();
    }

    /// Item 11: a function stopped right after it is served, over and over, leaves no
    /// cgroup behind (every cgroup is removed on every error path).
    fn stopping_functions_as_they_start_leaves_no_cgroup(who) {
        let mut s = SUITE.sup(who, "churn");
        let (file, names) = s.write_toml(&[("churn", "uid", "")]);
        let file = file.to_str().expect("UTF-8 path").to_string();
        let name = names[0].clone();
        let f = s.run(&["up", "-f", &file]);
        assert_eq!(f.code, 0, "{}\n{}", f.stderr_text(), s.log());
        s.find_supervisor();
        for i in 0..30 {
            let _ = s.run(&["stop", &name]);
            let f = s.run(&["serve", &name, "-f", &file]);
            assert_eq!(f.code, 0, "serve {i}: {}\n{}", f.stderr_text(), s.log());
        }
        let _ = s.run(&["stop", &name]);
        let mut left = Vec::new();
        let gone = wait_for_quietly(Duration::from_secs(10), || {
            left = fn_cgroups(&name).into_iter().filter(|d| d.exists()).collect();
            left.is_empty()
        });
        assert!(gone, "[{}] cgroups left after 30 serve/stop rounds: {left:?}", who.name());
        s.shutdown();
    }
}

/// The memory the cgroups of a function hold together (v1 hierarchical usage, or v2
/// memory.current), in bytes; 0 when its folder is gone.
fn function_memory(name: &str) -> u64 {
    for d in fn_cgroups(name) {
        for file in ["memory.usage_in_bytes", "memory.current"] {
            if let Ok(t) = fs::read_to_string(d.join(file)) {
                return t.trim().parse().unwrap_or(0);
            }
        }
    }
    0
}

/// Item 3, the last part: as root, no zygote gives a request uid twice. A zygote with 1024
/// request ids (a small subordinate range) is replaced once it has given them all (its
/// successor is a new sandbox: nothing of the old one's requests is left in it); 1100
/// calls never see one uid twice in one sandbox.
#[test]
fn no_request_uid_is_given_twice() {
    let Some(mut s) = SUITE.root("uids") else {
        return;
    };
    s.env("ZYGO_SUBID", "2000000000:66560");
    let n = s.up(&[("uid", "uid", "max_warm = 2")]);
    let f = n[0].clone();
    let s = std::sync::Arc::new(s);
    let t0 = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            let f = f.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for _ in 0..275 {
                    let (v, fin) = s.exec(&f, Some("{}"), &[]);
                    if fin.code == 0 && v["outcome"] == "ok" {
                        got.push((
                            v["result"][0].as_str().unwrap_or("").to_string(),
                            v["result"][1].as_i64().unwrap_or(-1),
                        ));
                    } else if v["code"] != "busy" {
                        panic!("a call failed: {v}\n{}", fin.stderr_text());
                    }
                }
                got
            })
        })
        .collect();
    let mut uids: Vec<(String, i64)> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("a caller"))
        .collect();
    let calls = uids.len();
    assert!(
        calls > 1024,
        "only {calls} calls answered in {:?}",
        t0.elapsed()
    );
    assert!(
        uids.iter().all(|(_, u)| (65536..65536 + 1024).contains(u)),
        "{:?}",
        &uids[..5]
    );
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), calls, "a sandbox gave a request uid twice");
    assert!(
        s.log().contains("has given every request id"),
        "no zygote was replaced:\n{}",
        s.log()
    );
    match std::sync::Arc::try_unwrap(s) {
        Ok(s) => s.shutdown(),
        Err(_) => panic!("the callers still hold the supervisor"),
    }
}

/// Item 12: with the state disk full, every call is still answered, no record is lost or
/// torn, `zygo ls` says so, and every record is written once the disk has room again.
#[test]
fn a_full_state_disk_loses_no_usage_record_and_tears_no_line() {
    let Some(s) = SUITE.root("fulldisk") else {
        return;
    };
    // The state directory on a small tmpfs of the test's own. The guard stops the
    // supervisor (whatever happens to the test) before it unmounts that tmpfs.
    struct OnSmallDisk {
        sup: Option<Sup>,
        path: std::path::PathBuf,
    }
    impl Drop for OnSmallDisk {
        fn drop(&mut self) {
            drop(self.sup.take());
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.path)
                .status();
        }
    }
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs"])
        .arg(&s.st)
        .status()
        .expect("run mount");
    assert!(mounted.success(), "mount a tmpfs on {}", s.st.display());
    let mut guard = OnSmallDisk {
        path: s.st.clone(),
        sup: Some(s),
    };
    let s = guard
        .sup
        .as_mut()
        .expect("the supervisor was just put in the guard");
    let n = s.up(&[("usage", "uid", "")]);
    let f = &n[0];
    s.call_ok(f, "{}");
    // Fill the disk.
    let filler = s.st.join("filler");
    {
        use std::io::Write;
        let mut w = fs::File::create(&filler).expect("create the filler");
        let mut size = 64 << 10;
        while size > 0 {
            while w.write_all(&vec![0u8; size]).is_ok() {}
            size /= 2;
        }
        let _ = w.sync_all();
    }
    // More records than the page the log's end sits in can take.
    for _ in 0..30 {
        s.call_ok(f, "{}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let ls = s.run(&["ls"]);
    assert_eq!(ls.code, 0, "{}", ls.stderr_text());
    assert!(
        ls.stderr_text().contains("usage log cannot be written"),
        "zygo ls did not say the usage log is failing: {}",
        ls.stderr_text()
    );
    let usage = s.st.join("usage.log");
    let check_whole = |text: &str| {
        for line in text.lines() {
            serde_json::from_str::<Value>(line)
                .unwrap_or_else(|e| panic!("a torn line ({e}): {line:?}"));
        }
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "the log ends mid-line"
        );
    };
    check_whole(&fs::read_to_string(&usage).unwrap_or_default());
    // Room again: every record arrives, whole.
    fs::remove_file(&filler).expect("remove the filler");
    s.call_ok(f, "{}");
    let mut text = String::new();
    let all = wait_for_quietly(Duration::from_secs(5), || {
        text = fs::read_to_string(&usage).unwrap_or_default();
        text.lines().filter(|l| l.contains(f.as_str())).count() >= 32
    });
    check_whole(&text);
    assert!(
        all,
        "not every usage record was written once there was room:\n{text}"
    );
    let ls = s.run(&["ls"]);
    assert!(
        !ls.stderr_text().contains("warning"),
        "{}",
        ls.stderr_text()
    );
    if let Some(s) = guard.sup.take() {
        s.shutdown();
    }
}

/// Item 5, the host side: the script store has a cap; past it the scripts used least
/// recently are evicted, and a digest evicted so is unknown (send it again).
#[test]
fn the_script_store_stays_under_its_cap() {
    let Some(mut s) = SUITE.root("store") else {
        return;
    };
    s.env("ZYGO_SCRIPT_STORE", "20M");
    let n = s.up(&[("pool", PY_POOL)]);
    let mut digests = Vec::new();
    for i in 0..4 {
        let script = format!(
            "{}\ndef handler(event):\n    return {i}\n",
            "#".repeat(6 << 20)
        );
        digests.push(s.put_script(&format!("s{i}.py"), &script));
    }
    let stored: u64 = fs::read_dir(s.st.join("scripts"))
        .expect("list the store")
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert!(
        stored <= 20 << 20,
        "the store holds {stored} bytes over its 20M cap"
    );
    let (v, f) = s.exec(&n[0], Some("{}"), &["--digest", &digests[0]]);
    let why = s.assert_refused(&v, &f, "not_found");
    assert!(why.contains("send it again"), "{why}");
    let v = s.run_ok(&n[0], "{}", &digests[3]);
    assert_eq!(v["result"], 3, "{v}");
    s.shutdown();
}

/// Item 8, in the supervisor's own log: text from a sandbox (an import error, the agent's
/// diagnostics) reaches it with its control characters escaped and its further lines
/// marked, so it can neither forge a record nor send escape sequences to whoever reads it.
#[test]
fn text_from_a_sandbox_cannot_forge_a_log_record_or_reach_the_terminal() {
    let Some(mut s) = SUITE.root("logforge") else {
        return;
    };
    s.fn_file(
        "bad.py",
        "import sys\nsys.stderr.write('\\x1b]0;owned\\x07\\n[INFO ] forged by the agent\\n')\n\
         raise RuntimeError('\\x1b[2J\\n[INFO ] forged by an import error')\n",
    );
    let (file, names) =
        s.write_toml(&[("bad", "agent = \"python\"\nentry = \"fn/bad.py:handler\"")]);
    let f = s.run(&["up", "-f", file.to_str().expect("UTF-8 path")]);
    s.find_supervisor();
    assert_ne!(f.code, 0, "a function whose import fails was served");
    let mut log = String::new();
    let seen = wait_for_quietly(Duration::from_secs(5), || {
        log = fs::read_to_string(s.log_path()).unwrap_or_default();
        log.contains("forged by the agent") && log.contains("forged by an import error")
    });
    assert!(seen, "the log does not have both texts:\n{log}");
    assert!(
        !log.contains('\x1b') && !log.contains('\x07'),
        "a control character reached the log:\n{log}"
    );
    for line in log.lines().filter(|l| l.contains("forged")) {
        assert!(
            !line.starts_with("[INFO ] forged"),
            "a forged record: {line:?}\n{log}"
        );
    }
    let _ = names;
    s.shutdown();
}
