//! Bad input gets a clear refusal with the documented exit status (2 for usage errors, 1 when
//! the sandbox could not be built or started), and many sandboxes of every kind leave
//! nothing behind: no cgroup, no process, no mount, no temp file.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use zygo_tests::*;

/// Run `zygo ARGS...` (no JSON parsing: usage errors print none).
fn zygo_raw(who: Who, args: &[&str]) -> Finished {
    let mut c = zygo(who);
    c.args(args);
    finish(c)
}

/// Assert a usage error: exit 2, and either (human) nothing on stdout and exactly one line
/// on stderr that contains `mentions`, or (`--json`) exactly one JSON object on stdout,
/// `{"code": "bad_request", "error": ...}` with `mentions` in its error.
#[track_caller]
fn assert_usage_error(who: Who, f: &Finished, mentions: &str, json: bool) {
    if json {
        assert_eq!(
            f.code,
            2,
            "[{}] expected exit 2: {}",
            who.name(),
            f.stderr_text()
        );
        let out = f.stdout_text();
        assert_eq!(
            out.lines().count(),
            1,
            "[{}] not one line on stdout: {out:?}",
            who.name()
        );
        let v: Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("[{}] stdout is not JSON ({e}): {out:?}", who.name()));
        assert_eq!(v["code"], "bad_request", "[{}] {v}", who.name());
        assert!(
            s(&v, "error").contains(mentions),
            "[{}] the error does not name {mentions}: {v}",
            who.name()
        );
        return;
    }
    let err = f.stderr_text();
    assert_eq!(
        f.code,
        2,
        "[{}] expected exit 2, got {}: {err}",
        who.name(),
        f.code
    );
    assert!(
        f.stdout.is_empty(),
        "[{}] stdout on a usage error: {:?}",
        who.name(),
        String::from_utf8_lossy(&f.stdout)
    );
    assert_eq!(
        err.lines().count(),
        1,
        "[{}] expected one line on stderr: {err:?}",
        who.name()
    );
    assert!(err.ends_with('\n'), "[{}] stderr: {err:?}", who.name());
    assert!(
        err.contains(mentions),
        "[{}] stderr does not name {mentions}: {err:?}",
        who.name()
    );
}

both_tests! {
    /// An unknown flag: exit 2 and one line naming it.
    fn unknown_flag(who) {
        for json in [false, true] {
            let mut args = vec!["run"];
            if json {
                args.push("--json");
            }
            args.extend(["--bogus", "--", "true"]);
            assert_usage_error(who, &zygo_raw(who, &args), "--bogus", json);
        }
    }

    /// Malformed or out-of-range limits: exit 2 and one line naming the flag.
    fn malformed_limits(who) {
        for (flag, value) in [
            ("--mem", "12X"),
            ("--timeout", "25h"),
            ("--cpu", "abc"),
            ("--pids", "0"),
            ("--scratch", "-1"),
            ("--mem", ""),
            ("--cpu", "NaN"),
        ] {
            for json in [false, true] {
                let mut args = vec!["run"];
                if json {
                    args.push("--json");
                }
                args.extend([flag, value, "--", "true"]);
                assert_usage_error(who, &zygo_raw(who, &args), flag, json);
            }
        }
    }

    /// No command at all: exit 2.
    fn no_command(who) {
        for args in [&["run"][..], &["run", "--json"], &["run", "--json", "--"], &["run", "--mem", "64M", "--"]] {
            let f = zygo_raw(who, args);
            assert_eq!(f.code, 2, "[{}] {args:?}: {}", who.name(), f.stderr_text());
            if args.contains(&"--json") {
                let v = f.last_json();
                assert_eq!(v["code"], "bad_request", "[{}] {args:?}: {}", who.name(), f.stdout_text());
            } else {
                assert_eq!(f.stderr_text().lines().count(), 1, "[{}] {args:?}: {}", who.name(), f.stderr_text());
            }
        }
    }

    /// An image directory that does not exist: refused while planning (exit 1).
    fn missing_image_dir(who) {
        let (v, code) = run_json(who, &["--image", "dir:/nonexistent/zygo-tests-image"], &["true"]);
        assert_eq!(code, 1, "[{}] {v}", who.name());
        assert_eq!(v["started"], false, "[{}] {v}", who.name());
        assert_eq!(v["phase"], "plan", "[{}] {v}", who.name());
        assert!(s(&v, "error").contains("/nonexistent/zygo-tests-image"), "[{}] {v}", who.name());
        assert_eq!(v["exit_code"], Value::Null, "[{}] {v}", who.name());
    }

    /// A command that is not in the image: the sandbox could not start it (exit 1).
    fn command_not_found(who) {
        let (v, code) = run_json(who, &[], &["zygo-tests-no-such-command"]);
        assert_eq!(code, 1, "[{}] {v}", who.name());
        assert_eq!(v["started"], false, "[{}] {v}", who.name());
        assert_eq!(v["phase"], "start", "[{}] {v}", who.name());
        assert!(s(&v, "error").contains("zygo-tests-no-such-command"), "[{}] {v}", who.name());
        assert_eq!(v["exit_code"], Value::Null, "[{}] {v}", who.name());
    }
}

// ---------------------------------------------------------------------------------------
// Leaks.

/// One kind of sandbox in the leak test, and what its answer must say.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Normal,
    TimedOut,
    OomKilled,
    NotFound,
}

impl Kind {
    fn args(self) -> Vec<&'static str> {
        match self {
            Kind::Normal => vec!["--", "sh", "-c", "echo hi; sleep 0.01 & wait"],
            Kind::TimedOut => vec![
                "--timeout",
                "200ms",
                "--",
                "sh",
                "-c",
                "sleep 100 & while :; do :; done",
            ],
            Kind::OomKilled => vec![
                "--mem",
                "32M",
                "--",
                "python3",
                "-c",
                "b = b'x' * (1 << 30)",
            ],
            Kind::NotFound => vec!["--", "zygo-tests-no-such-command"],
        }
    }

    #[track_caller]
    fn check(self, who: Who, v: &Value, code: i32) {
        let ok = match self {
            Kind::Normal => code == 0 && v["exit_code"] == 0 && s(v, "stdout") == "hi\n",
            Kind::TimedOut => code == 137 && v["timed_out"] == true,
            Kind::OomKilled => code == 137 && v["oom_killed"] == true,
            Kind::NotFound => code == 1 && v["started"] == false && v["phase"] == "start",
        };
        assert!(ok, "[{}] {self:?} sandbox: exit {code}: {v}", who.name());
    }
}

/// The host's state that sandboxes must not change.
struct Snapshot {
    mounts: BTreeSet<String>,
    tmp: BTreeSet<String>,
}

fn snapshot() -> Snapshot {
    let mounts = fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .map(str::to_string)
        .collect();
    Snapshot {
        mounts,
        tmp: tmp_entries(),
    }
}

/// /tmp's entries, except this suite's own.
fn tmp_entries() -> BTreeSet<String> {
    fs::read_dir("/tmp")
        .expect("list /tmp")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with(TMP_PREFIX))
        .collect()
}

/// The zygo pid encoded in a per-sandbox cgroup name `run-<pid>-<n>-<time>`.
fn run_cgroup_pid(name: &str) -> Option<u32> {
    name.strip_prefix("run-")?.split('-').next()?.parse().ok()
}

/// 200 sandboxes (normal, timed out, OOM-killed, command not found), half as root and half
/// rootless, four at a time; then no cgroup, process, mount or temp entry of theirs is left.
#[test]
fn no_leaks_after_many_sandboxes() {
    const RUNS: usize = 200;
    const THREADS: usize = 4;
    let whos: Vec<Who> = both().into_iter().filter(|w| w.available()).collect();
    if whos.contains(&Who::Rootless) {
        rootless_setup();
    }
    // A private copy of the binary, so that this test's launchers (and the sandboxes' init,
    // a fork of a launcher) are told apart from anyone else's by their argv[0].
    let bin_dir = PathBuf::from(format!("/tmp/zygo-tests-bin/leak-{}", std::process::id()));
    let bin = copy_binary(&zygo_bin(), &bin_dir, "zygo");
    let bin_str = bin.to_str().expect("utf-8").to_string();

    // One sandbox each first: the first run for a user prepares the host image's /etc
    // in that user's runtime directory (for the rootless user without $XDG_RUNTIME_DIR,
    // /tmp/zygo-<uid>), which is kept for the runs after it, not left behind by one.
    for &who in &whos {
        let mut c = zygo_with(who, &bin);
        c.args(["run", "--", "true"]);
        let f = finish(c);
        assert_eq!(f.code, 0, "[{}] {}", who.name(), f.stderr_text());
    }
    let before = snapshot();
    let t0 = Instant::now();
    let next = AtomicUsize::new(0);
    let pids = Mutex::new(BTreeSet::new());
    let kinds = [
        Kind::Normal,
        Kind::TimedOut,
        Kind::OomKilled,
        Kind::NotFound,
    ];
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= RUNS {
                    break;
                }
                let who = whos[i % whos.len()];
                let kind = kinds[(i / whos.len()) % kinds.len()];
                let mut c = zygo_with(who, &bin);
                c.args(["run", "--json"]).args(kind.args());
                let f = finish(c);
                pids.lock().expect("lock").insert(f.pid as u32);
                let v: Value = serde_json::from_slice(&f.stdout).unwrap_or_else(|e| {
                    panic!(
                        "[{}] {kind:?}: not JSON ({e}): {}",
                        who.name(),
                        f.stderr_text()
                    )
                });
                kind.check(who, &v, f.code);
            });
        }
    });
    eprintln!("{RUNS} sandboxes, {THREADS} at a time: {:?}", t0.elapsed());
    let pids = pids.into_inner().expect("lock");
    assert_eq!(pids.len(), RUNS);

    // Cgroups: no `run-<one of our zygo pids>-*` under any zygo root, root's or rootless.
    let mut leaked_cgroups = Vec::new();
    for root in zygo_cgroup_roots() {
        let Ok(entries) = fs::read_dir(&root) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = run_cgroup_pid(&name) {
                if pids.contains(&pid) {
                    leaked_cgroups.push(root.join(&name));
                } else {
                    eprintln!(
                        "note: a cgroup not made by this test: {}",
                        root.join(&name).display()
                    );
                }
            }
        }
    }
    assert!(
        leaked_cgroups.is_empty(),
        "leftover cgroups: {leaked_cgroups:#?}"
    );

    // Processes: no launcher or sandbox init of ours (argv[0] is our copy, argv[1]
    // `__launcher`), and nothing still in one of our sandboxes' cgroups.
    let mut leaked_procs = Vec::new();
    for (pid, cmdline) in host_processes() {
        let ours = cmdline.starts_with(bin_str.as_bytes());
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let in_ours = pids
            .iter()
            .any(|p| cgroup.contains(&format!("/zygo/run-{p}-")));
        if (ours && contains(&cmdline, b"__launcher")) || in_ours {
            leaked_procs.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        } else if contains(&cmdline, b"__launcher") {
            eprintln!(
                "note: a launcher not started by this test: {pid} {:?}",
                String::from_utf8_lossy(&cmdline)
            );
        }
    }
    assert!(
        leaked_procs.is_empty(),
        "leftover sandbox processes: {leaked_procs:#?}"
    );

    // Mounts: the host's mount table is unchanged.
    let after = snapshot();
    let new_mounts: Vec<&String> = after.mounts.difference(&before.mounts).collect();
    assert!(new_mounts.is_empty(), "new host mounts: {new_mounts:#?}");

    // /tmp: nothing new that stays and is zygo's. Other programs on this machine create
    // and remove entries in /tmp while this runs, so an entry fails the test only if it is
    // still there a moment later and is plausibly zygo's: owned by an id the sandboxes run
    // as (the rootless user, or a subordinate id) or named like zygo's. Others are listed.
    let new_tmp: Vec<String> = after.tmp.difference(&before.tmp).cloned().collect();
    if !new_tmp.is_empty() {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    let still = tmp_entries();
    let sandbox_uids: BTreeSet<u32> = whos.iter().map(|w| sandbox_host_ids(*w).0).collect();
    let mut leaked_tmp = Vec::new();
    for name in new_tmp.into_iter().filter(|n| still.contains(n)) {
        let uid = fs::symlink_metadata(format!("/tmp/{name}")).map_or(0, |m| m.uid());
        let lower = name.to_lowercase();
        let zygo_owned = (uid != 0 && (sandbox_uids.contains(&uid) || uid >= 65536))
            || (whos.contains(&Who::Rootless) && uid == rootless_setup().uid);
        let zygo_named = ["zygo", "launcher", "sandbox", "newroot", "oldroot", "run-"]
            .iter()
            .any(|w| lower.contains(w));
        if zygo_owned || zygo_named {
            leaked_tmp.push((name, uid));
        } else {
            eprintln!(
                "note: /tmp/{name} (uid {uid}) appeared meanwhile; not zygo's by owner or name"
            );
        }
    }
    assert!(
        leaked_tmp.is_empty(),
        "new entries in /tmp (name, owner uid): {leaked_tmp:?}"
    );
    let _ = fs::remove_dir_all(&bin_dir);
}

/// A launcher killed while it builds the sandbox: `zygo run` says so in one line
/// (`started: false`, phase `start`), exits 1, and leaves no cgroup behind. The image has
/// thousands of top-level entries so that the build (one bind each) takes long enough to
/// kill the launcher in the middle of it.
#[test]
fn launcher_dies_mid_build() {
    // Root, to watch the launcher.
    if !root_only() {
        return;
    }
    let image = TempDir::new(0o755);
    for i in 0..4000 {
        fs::create_dir(PathBuf::from(image.str()).join(format!("d{i}"))).expect("mkdir");
    }
    let flag = format!("dir:{}", image.str());
    let mut cmd = zygo(Who::Root);
    cmd.args(["run", "--json", "--image", &flag, "--", "/nothing"]);
    cmd.stdout(std::process::Stdio::piped());
    cmd.stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("spawn zygo run");
    let parent = child.id() as i32;
    // Find the launcher (a child of this zygo run); once the sandbox's init (the launcher's
    // child) exists, the build is under way: kill the launcher then.
    let ppid_of = |pid: i32| -> i32 {
        fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .rsplit(") ")
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let mut killed = false;
    while Instant::now() < deadline && !killed {
        let procs = host_processes();
        let launcher = procs
            .iter()
            .find(|(pid, cmd)| contains(cmd, b"__launcher") && ppid_of(*pid) == parent)
            .map(|(pid, _)| *pid);
        if let Some(l) = launcher {
            if procs.iter().any(|(pid, _)| ppid_of(*pid) == l) {
                // SAFETY: killing the launcher this test's own zygo run started.
                unsafe { libc::kill(l, libc::SIGKILL) };
                killed = true;
            }
        }
    }
    let out = child.wait_with_output().expect("wait for zygo run");
    assert!(killed, "never saw the launcher");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "one JSON object: {e}: {:?} / {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["started"], false, "{v}");
    assert_eq!(v["phase"], "start", "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("launcher died")),
        "{v}"
    );
    // Its cgroup is gone.
    for root in zygo_cgroup_roots() {
        let leftovers: Vec<_> = fs::read_dir(&root)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| n.starts_with(&format!("run-{parent}-")))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            leftovers.is_empty(),
            "cgroups left in {}: {leftovers:?}",
            root.display()
        );
    }
}

/// A `zygo run` killed with SIGKILL cannot remove its cgroup; the next `zygo run` removes
/// such leftovers (`run-<pid>-…` whose process is gone), and only those.
#[test]
fn stale_run_cgroups_are_swept() {
    if !root_only() {
        return;
    }
    // Root's own trees (not the rootless user's). A root no Zygo process uses now is gone
    // (each removes it as it leaves when it is empty): the leftovers are planted in one
    // made here, as a killed monitor would have left it.
    let roots: Vec<PathBuf> = zygo_cgroup_roots()
        .into_iter()
        .filter(|r| !r.to_string_lossy().contains("rootless"))
        .filter(|r| r.parent().is_some_and(Path::is_dir))
        .collect();
    assert!(!roots.is_empty(), "no zygo cgroup roots found");
    for root in &roots {
        let _ = fs::create_dir(root);
    }
    // A pid that cannot exist (above pid_max), and one that does (ours).
    let stale = format!(
        "run-{}-0-sweeptest{:x}",
        4_194_305u32 + 1,
        unique() & 0xffff
    );
    let alive = format!(
        "run-{}-0-sweeptest{:x}",
        std::process::id(),
        unique() & 0xffff
    );
    for root in &roots {
        fs::create_dir(root.join(&stale)).expect("make a stale cgroup");
        fs::create_dir(root.join(&alive)).expect("make a live cgroup");
    }
    let (v, code) = run_json(Who::Root, &[], &["true"]);
    assert_eq!(code, 0, "{v}");
    for root in &roots {
        assert!(
            !root.join(&stale).exists(),
            "{} survived",
            root.join(&stale).display()
        );
        assert!(
            root.join(&alive).exists(),
            "{} was removed",
            root.join(&alive).display()
        );
    }
    for root in roots.iter().rev() {
        let _ = fs::remove_dir(root.join(&alive));
    }
}

/// Zygo's cgroup root (`<base>/zygo` in each hierarchy) is there only while a Zygo process
/// uses it: the last one to leave it empty removes it, and one that finds it gone makes it
/// again with the tree's CPU weight. (Every `zygo` invocation used to leave an empty root
/// behind.) Run in a base cgroup of the test's own (`$ZYGO_CGROUP`), so no other test's
/// sandboxes share the root.
#[test]
fn the_cgroup_root_is_there_only_while_zygo_uses_it() {
    if !root_only() {
        return;
    }
    let t = OwnRoot::make();
    let roots = &t.roots;
    let run = |secs: &str| {
        let mut c = zygo(Who::Root);
        c.env("ZYGO_CGROUP", &t.env)
            .args(["run", "--json", "--", "sleep", secs]);
        c
    };
    let left = || t.left();
    let cleanup = || t.cleanup();
    let f = finish(run("0"));
    let leftover = left();
    if f.code != 0 || !leftover.is_empty() {
        cleanup();
    }
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    assert!(leftover.is_empty(), "an empty root is left: {leftover:?}");
    // While a sandbox runs its root is there, made again with the tree's weight; another
    // run that ends meanwhile leaves it; the last one out removes it.
    let mut long = run("3");
    long.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut long = long.spawn().expect("start a long run");
    let there = wait_for_quietly(Duration::from_secs(20), || {
        roots.iter().all(|r| r.join("cgroup.procs").exists())
    });
    let weight = if is_cgroup_v2_host() {
        fs::read_to_string(roots[0].join("cpu.weight")).unwrap_or_default()
    } else {
        roots
            .iter()
            .find_map(|r| fs::read_to_string(r.join("cpu.shares")).ok())
            .unwrap_or_default()
    };
    let short = finish(run("0"));
    let during = left().len();
    let status = long.wait().expect("wait for the long run");
    let after = left();
    cleanup();
    assert!(there, "the root was not made while a sandbox ran");
    assert!(
        matches!(weight.trim(), "25" | "256"),
        "the root was made without the tree's weight: {weight:?}"
    );
    assert_eq!(short.code, 0, "{}", short.stderr_text());
    assert_eq!(
        during,
        roots.len(),
        "a run that ended removed a root in use"
    );
    assert!(status.success(), "the long run: {status:?}");
    assert!(after.is_empty(), "the last run out left {after:?}");
}

/// Runs that start and end at the same moment, with no other Zygo process holding Zygo's
/// root: each one out removes the root when it is empty, and one starting meanwhile makes
/// it again. None of them may fail for the root going under it (a run once failed with
/// "create cgroup .../zygo/run-...: No such file or directory"), and the last one out
/// leaves nothing.
#[test]
fn runs_that_start_and_end_together_share_the_root() {
    if !root_only() {
        return;
    }
    let t = OwnRoot::make();
    const THREADS: usize = 4;
    const EACH: usize = 100;
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..EACH {
                    let mut c = zygo(Who::Root);
                    c.env("ZYGO_CGROUP", &t.env).args(["run", "--", "true"]);
                    let f = finish(c);
                    if f.code != 0 {
                        failures.lock().expect("lock").push(f.stderr_text());
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("lock");
    assert!(
        failures.is_empty(),
        "{} of {} runs failed, the first: {}",
        failures.len(),
        THREADS * EACH,
        failures[0]
    );
    let left = t.left();
    assert!(left.is_empty(), "the last run out left {left:?}");
}

/// The host image's /etc is prepared once per user in the runtime directory; where that
/// cannot be done (here a file stands where its folder would go) the sandbox still gets a
/// whole /etc, assembled by its own init, and zygo says why on stderr.
#[test]
fn unusable_etc_cache_falls_back() {
    let who = Who::Rootless;
    let r = rootless_setup();
    let dir = TempDir::new(0o700);
    let blocker = dir.file("etc", b"not a folder\n");
    if am_root() {
        std::os::unix::fs::chown(&dir.path, Some(r.uid), Some(r.gid)).expect("chown");
        std::os::unix::fs::chown(&blocker, Some(r.uid), Some(r.gid)).expect("chown");
    }
    let mut c = zygo(who);
    c.env("ZYGO_RUNTIME_DIR", &dir.path).args([
        "run",
        "--json",
        "--",
        "python3",
        "-c",
        "import json, os; print(json.dumps(sorted(os.listdir('/etc'))))",
    ]);
    let f = finish(c);
    let v: Value = serde_json::from_slice(&f.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", f.stderr_text()));
    assert_eq!(v["exit_code"], 0, "{v} {}", f.stderr_text());
    let listed: Vec<String> = serde_json::from_str(v["stdout"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("listing ({e}): {v}"));
    for name in [
        "passwd",
        "group",
        "hosts",
        "ld.so.cache",
        "ssl",
        "nsswitch.conf",
    ] {
        assert!(
            listed.iter().any(|n| n == name),
            "/etc lacks {name}: {listed:?}"
        );
    }
    assert!(!listed.iter().any(|n| n == "shadow"), "{listed:?}");
    assert!(
        f.stderr_text().contains("prepare the host image's /etc"),
        "zygo did not say why: {}",
        f.stderr_text()
    );
    assert_eq!(fs::read(&blocker).expect("read"), b"not a folder\n");
}
