//! Resource limits, enforced by the kernel and reported by `zygo run --json`: memory (OOM),
//! the wall-clock deadline (the whole process tree dies), pids (fork bombs), scratch space,
//! output caps, CPU bandwidth; and the plumbing of exit codes, stdin and stderr.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use zygo_tests::*;

/// Poll the host's process table in a thread until stopped: how many processes whose
/// command line starts with `prefix` were seen at once, at most.
struct Watch {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicUsize>,
    handle: std::thread::JoinHandle<()>,
}

impl Watch {
    fn start(prefix: String) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(0));
        let (s, p) = (stop.clone(), peak.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let n = host_pids_starting_with(prefix.as_bytes()).len();
                p.fetch_max(n, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Watch { stop, peak, handle }
    }

    /// Stop watching; the peak count.
    fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("watch thread");
        self.peak.load(Ordering::Relaxed)
    }
}

/// Assert that no host process's command line starts with `prefix` (allowing the kernel a
/// moment to reap).
#[track_caller]
fn assert_gone(who: Who, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = host_pids_starting_with(prefix.as_bytes());
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "[{}] processes started inside the sandbox outlived it: {left:?} ({prefix:?})",
            who.name()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

both_tests! {
    /// POSIX shared memory works (`multiprocessing.Pool`, which needs /dev/shm), and what a
    /// program puts in /dev/shm counts in its memory limit: filling it past --mem is an OOM
    /// kill, not memory the host pays for.
    fn shared_memory_works_and_counts_in_mem(who) {
        let pool = "import multiprocessing as mp\n\
                    def sq(x):\n    return x * x\n\
                    if __name__ == '__main__':\n    \
                    with mp.Pool(2) as p:\n        print(sum(p.map(sq, range(10))))";
        let (v, code) = py(who, &["--mem", "256M", "--pids", "32"], pool);
        assert_ok(who, &v, code);
        assert_eq!(s(&v, "stdout").trim(), "285", "[{}] {v}", who.name());
        let fill = "f = open('/dev/shm/big', 'wb')\n\
                    for _ in range(200):\n    f.write(b'x' * (1 << 20))\n    f.flush()\n\
                    print('wrote 200 MiB')";
        let (v, code) = py(who, &["--mem", "64M", "--scratch", "1G"], fill);
        assert_eq!(v["oom_killed"], true, "[{}] /dev/shm past --mem: {v}", who.name());
        assert_eq!(code, 137, "[{}] {v}", who.name());
    }

    /// Allocating 1 GiB under --mem 64M: the kernel's OOM killer ends it, and zygo says so.
    fn oom_is_reported(who) {
        let (v, code) = py(who, &["--mem", "64M"], "b = b'x' * (1 << 30)\nprint(len(b))");
        assert_eq!(v["started"], true, "[{}] {v}", who.name());
        assert_eq!(v["oom_killed"], true, "[{}] {v}", who.name());
        assert_eq!(v["timed_out"], false, "[{}] {v}", who.name());
        assert_eq!(v["exit_code"], 137, "[{}] {v}", who.name());
        assert_eq!(code, 137, "[{}] {v}", who.name());
        assert!(s(&v, "kill_reason").contains("memory"), "[{}] {v}", who.name());
        assert!(v["peak_rss_kb"].as_u64().unwrap_or(0) <= 64 * 1024, "[{}] {v}", who.name());
    }

    /// A busy loop under --timeout 1s is killed on time: timed_out, exit 137, and zygo
    /// itself returns promptly.
    fn timeout_kills_a_busy_loop(who) {
        let (v, f) = run_json_full(who, &["--timeout", "1s"], &["python3", "-c", "while True: pass"]);
        eprintln!("[{}] --timeout 1s busy loop: zygo returned after {:?} (wall_ms {})",
                  who.name(), f.elapsed, v["wall_ms"]);
        assert_eq!(v["timed_out"], true, "[{}] {v}", who.name());
        assert_eq!(v["oom_killed"], false, "[{}] {v}", who.name());
        assert_eq!(v["exit_code"], 137, "[{}] {v}", who.name());
        assert_eq!(f.code, 137, "[{}] {v}", who.name());
        assert!(s(&v, "kill_reason").contains("time limit"), "[{}] {v}", who.name());
        assert!(v["wall_ms"].as_f64().unwrap_or(0.0) >= 950.0, "[{}] killed early: {v}", who.name());
        // 2 s is the target; this machine is small and busy, so allow 4 s.
        assert!(f.elapsed < slow(Duration::from_secs(4)), "[{}] zygo took {:?}", who.name(), f.elapsed);
    }

    /// The deadline kills the whole tree: a busy loop in a child process, and a background
    /// `sleep` started next to it, are both gone when zygo returns.
    fn timeout_kills_the_whole_tree(who) {
        let marker = format!("1000.{}", unique() % 1_000_000_000);
        let sleep = format!("sleep\0{marker}");
        let watch = Watch::start(sleep.clone());
        let script = format!("sleep {marker} & python3 -c 'while True: pass' & wait");
        // The children must be running before the deadline: on a slow machine it is later.
        let timeout = format!("{}s", slowdown());
        let (v, f) = run_json_full(who, &["--timeout", &timeout], &["sh", "-c", &script]);
        let seen = watch.finish();
        eprintln!("[{}] busy child: zygo returned after {:?}", who.name(), f.elapsed);
        assert_eq!(v["timed_out"], true, "[{}] {v}", who.name());
        assert_eq!(v["exit_code"], 137, "[{}] {v}", who.name());
        assert!(f.elapsed < slow(Duration::from_secs(4)), "[{}] zygo took {:?}", who.name(), f.elapsed);
        assert!(seen >= 1, "[{}] the background sleep was never seen running", who.name());
        assert_gone(who, &sleep);
    }

    /// When the program exits, whatever it left behind dies with it: a background job and
    /// a daemon in its own session.
    fn exit_kills_leftovers(who) {
        let marker = format!("1000.{}", unique() % 1_000_000_000);
        let sleep = format!("sleep\0{marker}");
        let watch = Watch::start(sleep.clone());
        let script = format!("sleep {marker} & (setsid sleep {marker} &) ; sleep 0.5; exit 0");
        let (v, code) = run_json(who, &[], &["sh", "-c", &script]);
        let seen = watch.finish();
        assert_ok(who, &v, code);
        assert!(seen >= 2, "[{}] the leftovers were never seen running ({seen})", who.name());
        assert_gone(who, &sleep);
    }

    /// A fork bomb under --pids 32 is contained: never more than 32 of its processes, the
    /// host stays responsive, and it ends at the deadline with nothing left.
    fn fork_bomb_is_contained(who) {
        let marker = format!("bomb-{:x}", unique());
        let code = format!(
            "# {marker}\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
        );
        let bomb = format!("python3\0-c\0# {marker}\n");
        let watch = Watch::start(bomb.clone());
        let slowest = Arc::new(std::sync::Mutex::new(Duration::ZERO));
        let slowest_seen = slowest.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let pinger = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            while !stop2.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = Command::new("true").status().is_ok_and(|s| s.success());
                let d = t.elapsed();
                assert!(ok, "host `true` failed during the fork bomb");
                let mut m = slowest_seen.lock().expect("lock");
                *m = (*m).max(d);
                drop(m);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        // Python must start and fork before the deadline: on a slow machine it is later.
        let timeout = format!("{}s", 3 * slowdown());
        let (v, f) = run_json_full(who, &["--pids", "32", "--timeout", &timeout], &["python3", "-c", &code]);
        stop.store(true, Ordering::Relaxed);
        pinger.join().expect("the host stayed usable");
        let peak = watch.finish();
        let slowest = *slowest.lock().expect("lock");
        eprintln!(
            "[{}] fork bomb: peak {peak} processes, slowest host `true` {slowest:?}, \
             zygo returned after {:?}",
            who.name(),
            f.elapsed
        );
        assert_eq!(v["started"], true, "[{}] {v}", who.name());
        assert_eq!(v["timed_out"], true, "[{}] {v}", who.name());
        assert!(peak <= 32, "[{}] {peak} fork-bomb processes at once under --pids 32", who.name());
        assert!(peak >= 2, "[{}] the fork bomb never forked ({peak})", who.name());
        assert!(slowest < slow(Duration::from_secs(1)), "[{}] host `true` took {slowest:?}", who.name());
        assert!(f.elapsed < slow(Duration::from_secs(7)), "[{}] zygo took {:?}", who.name(), f.elapsed);
        assert_gone(who, &bomb);
    }

    /// The program may run on every CPU zygo may: the CPU mask init gives the thread that
    /// makes the network namespace (another CPU than its own) stays with that thread, and
    /// the one-CPU mask each parent takes for a fork (so the child starts on its CPU) is
    /// given back before the child runs anything.
    fn program_keeps_every_cpu(who) {
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid cpu_set_t of the size passed.
        let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(r, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
        // SAFETY: set was filled above.
        let host = unsafe { libc::CPU_COUNT(&set) };
        let r = probe(who, &[], "done(cpus=sorted(os.sched_getaffinity(0)))");
        let cpus = r["cpus"].as_array().map_or(0, Vec::len);
        assert_eq!(cpus as i32, host, "[{}] the program's CPUs: {r}", who.name());
    }

    /// The program starts with every signal at its default and none blocked, even when
    /// zygo itself was started with some ignored and some blocked (as `nohup` or a shell's
    /// background job leaves them): an ignored signal would otherwise stay ignored through
    /// every exec down to the program. `grep` reports its own status: it changes no signal.
    fn program_starts_with_default_signals(who) {
        use std::os::unix::process::CommandExt;
        let mut c = zygo(who);
        c.args(["run", "--json", "--", "grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"]);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(|| {
                for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGUSR1, libc::SIGTERM] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR2);
                libc::sigaddset(&mut set, libc::SIGALRM);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                Ok(())
            });
        }
        let f = finish(c);
        let text = String::from_utf8_lossy(&f.stdout);
        let v: Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("[{}] not JSON ({e}): {text}\n{}", who.name(), f.stderr_text()));
        assert_eq!(v["exit_code"], 0, "[{}] {v}", who.name());
        assert_eq!(
            s(&v, "stdout"),
            "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n",
            "[{}] {v}",
            who.name()
        );
    }

    /// `zygo run` returns only once everything it started is gone and reaped: run under a
    /// child subreaper (which inherits whatever a process leaves unreaped), it leaves that
    /// subreaper no child at all, running or a zombie, even when the program left a
    /// background job behind.
    fn run_leaves_nothing_to_reap(who) {
        let bin = match who {
            Who::Root => zygo_bin(),
            Who::Rootless => rootless_setup().bin.clone(),
        };
        let reaper = r#"
import ctypes, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl failed: " + os.strerror(ctypes.get_errno()))
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
try:
    pid, status = os.waitpid(-1, os.WNOHANG)
except ChildProcessError:
    sys.exit(code)
print("left behind: pid %d (%s)" % (pid, "still running" if pid == 0 else "a zombie"))
sys.exit(99)
"#;
        for program in [&["true"][..], &["sh", "-c", "sleep 30 & exit 0"][..]] {
            let mut c = zygo_with(who, std::path::Path::new("/usr/bin/python3"));
            c.arg("-c").arg(reaper).arg(&bin).args(["run", "--"]).args(program);
            let f = finish(c);
            assert_eq!(
                f.code,
                0,
                "[{}] {program:?}: {}{}",
                who.name(),
                String::from_utf8_lossy(&f.stdout),
                f.stderr_text()
            );
        }
    }

    /// The host image's /etc has what glibc reads for locale names (`locale.alias`; Debian's
    /// `/usr/share/locale/locale.alias` is a link to it), the same as the host's; on a host
    /// without one (Debian's `locales` package is not installed) it has none either.
    fn host_image_has_locale_aliases(who) {
        let host = match std::fs::read_to_string("/etc/locale.alias") {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("read the host's /etc/locale.alias: {e}"),
        };
        let mut c = zygo(who);
        c.args(["run", "--json", "--", "cat", "/etc/locale.alias"]);
        let f = finish(c);
        let text = String::from_utf8_lossy(&f.stdout);
        let v: Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("[{}] not JSON ({e}): {text}\n{}", who.name(), f.stderr_text()));
        match host {
            Some(host) => {
                assert_eq!(v["exit_code"], 0, "[{}] {v}", who.name());
                assert_eq!(s(&v, "stdout"), host, "[{}] {v}", who.name());
            }
            None => {
                assert_eq!(v["exit_code"], 1, "[{}] cat found one: {v}", who.name());
                assert!(s(&v, "stderr").contains("No such file"), "[{}] {v}", who.name());
            }
        }
    }

    /// /tmp and /work are each capped at --scratch: writing past 16M fails with ENOSPC.
    fn scratch_is_capped(who) {
        let r = probe(who, &["--scratch", "16M"], r#"
def fill(d):
    n = 0
    try:
        with open(d + "/fill", "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1 << 20))
                f.flush()
                n += 1
        return ["OK", n]
    except OSError as e:
        return [ename(e.errno), n]
done(tmp=fill("/tmp"), work=fill("/work"))"#);
        for key in ["tmp", "work"] {
            assert_eq!(r[key][0], "ENOSPC", "[{}] {key}: {r}", who.name());
            assert!(r[key][1].as_u64().unwrap_or(99) <= 16, "[{}] {key}: {r}", who.name());
        }
    }

    /// 200 MB of output: exactly 1 MiB is kept, the rest drained, and zygo's memory stays
    /// small.
    fn stdout_is_capped(who) {
        let (v, f) = run_json_full(who, &[], &["head", "-c", "200000000", "/dev/zero"]);
        eprintln!("[{}] 200 MB of stdout: zygo max RSS {} KiB, {:?}", who.name(), f.max_rss_kb, f.elapsed);
        assert_ok(who, &v, f.code);
        assert_eq!(v["stdout_truncated"], true, "[{}]", who.name());
        let out = s(&v, "stdout");
        assert_eq!(out.len(), 1 << 20, "[{}] kept {} bytes of stdout", who.name(), out.len());
        assert!(out.bytes().all(|b| b == 0), "[{}] stdout is not the NULs written", who.name());
        assert_eq!(v["stderr_truncated"], false, "[{}]", who.name());
        assert!(f.max_rss_kb > 0 && f.max_rss_kb < 64 * 1024, "[{}] zygo max RSS {} KiB", who.name(), f.max_rss_kb);
    }

    /// The program's exit code is both `exit_code` and zygo's own exit status.
    fn exit_code_is_passed_through(who) {
        let (v, code) = py(who, &[], "import sys; sys.exit(7)");
        assert_eq!(v["exit_code"], 7, "[{}] {v}", who.name());
        assert_eq!(code, 7, "[{}] {v}", who.name());
        assert_eq!(v["timed_out"], false, "[{}] {v}", who.name());
        assert_eq!(v["oom_killed"], false, "[{}] {v}", who.name());
        assert_eq!(v["signal"], Value::Null, "[{}] {v}", who.name());
        assert_eq!(v["kill_reason"], Value::Null, "[{}] {v}", who.name());
    }

    /// --stdin FILE reaches the program's stdin.
    fn stdin_is_delivered(who) {
        let dir = TempDir::new(0o755);
        let input = dir.file("input", b"line one\nline two\n");
        let flags = ["--stdin", input.to_str().expect("utf-8")];
        let (v, code) = py(who, &flags, "import sys; d = sys.stdin.read(); print(len(d)); print(d.upper(), end='')");
        assert_ok(who, &v, code);
        assert_eq!(s(&v, "stdout"), "18\nLINE ONE\nLINE TWO\n", "[{}] {v}", who.name());
    }

    /// stdout and stderr are captured separately.
    fn stderr_is_captured_separately(who) {
        let (v, code) = py(who, &[], "import sys\nprint('to stdout')\nsys.stderr.write('to stderr\\n')");
        assert_ok(who, &v, code);
        assert_eq!(s(&v, "stdout"), "to stdout\n", "[{}] {v}", who.name());
        assert_eq!(s(&v, "stderr"), "to stderr\n", "[{}] {v}", who.name());
    }

    /// --cpu 0.5: a busy loop for 1 s of wall time gets at most about half a CPU, and not
    /// much less than the same loop without a limit gets in the same moment (a loaded
    /// machine lowers both; a low reading is retried). The loop measures its own CPU and
    /// wall time: the run's `cpu_ms` also counts building the sandbox and starting python,
    /// which its `wall_ms` (from the program's start) does not, and on a slow machine (the
    /// emulated guest) that made a limited run look like 0.76 of a CPU.
    fn cpu_bandwidth_is_limited(who) {
        let code = "import time\nt = time.monotonic(); c = time.process_time()\n\
                    while time.monotonic() - t < 1.0:\n    pass\n\
                    print((time.process_time() - c) / (time.monotonic() - t))";
        let ratio_of = |flags: &[&str]| {
            let (v, c) = py(who, flags, code);
            assert_ok(who, &v, c);
            let ratio = s(&v, "stdout").trim().parse::<f64>().unwrap_or(f64::NAN);
            (ratio, v)
        };
        let mut seen = Vec::new();
        for _ in 0..3 {
            let (free, _) = ratio_of(&[]);
            let (ratio, v) = ratio_of(&["--cpu", "0.5"]);
            eprintln!("[{}] --cpu 0.5: {ratio:.2} of a CPU (unlimited, just before: {free:.2})", who.name());
            assert!(ratio <= 0.7, "[{}] --cpu 0.5 got {ratio:.2} of a CPU: {v}", who.name());
            seen.push((ratio, free));
            if ratio >= 0.3 || ratio >= 0.25 * free {
                return;
            }
        }
        panic!(
            "[{}] --cpu 0.5 busy loop got too little CPU every time (limited, unlimited): {seen:?}",
            who.name()
        );
    }

    /// The output cap is exact: 1 MiB is kept whole and not marked truncated; one byte more
    /// is. The same cap applies to stderr.
    fn output_cap_is_exact(who) {
        for (n, truncated) in [(1 << 20, false), ((1 << 20) + 1, true)] {
            let code = format!("import sys; sys.stdout.write('o' * {n}); sys.stderr.write('e' * {n})");
            let (v, c) = py(who, &[], &code);
            assert_ok(who, &v, c);
            for stream in ["stdout", "stderr"] {
                assert_eq!(s(&v, stream).len(), 1 << 20, "[{}] {n} bytes: {stream} length", who.name());
                let flag = format!("{stream}_truncated");
                assert_eq!(v[&flag], truncated, "[{}] {n} bytes: {flag}", who.name());
            }
        }
    }

    /// A program killed by a signal: 128+N, with the signal reported and nothing blamed on
    /// a limit.
    fn signal_exit_is_reported(who) {
        let (v, code) = py(who, &[], "import os, signal; os.kill(os.getpid(), signal.SIGTERM)");
        assert_eq!(code, 143, "[{}] {v}", who.name());
        assert_eq!(v["exit_code"], 143, "[{}] {v}", who.name());
        assert_eq!(v["signal"], 15, "[{}] {v}", who.name());
        assert_eq!(v["timed_out"], false, "[{}] {v}", who.name());
        assert_eq!(v["oom_killed"], false, "[{}] {v}", who.name());
    }

    /// Without --json: stdout and stderr pass through, stdin is forwarded, the exit code is
    /// the program's, and a kill is explained on stderr.
    fn plain_mode_passes_through(who) {
        let dir = TempDir::new(0o755);
        let input = dir.file("input", b"forwarded\n");
        let mut c = zygo(who);
        c.args(["run", "--", "sh", "-c", "cat; echo to-err >&2; exit 3"])
            .stdin(std::fs::File::open(&input).expect("open input"));
        let f = finish(c);
        assert_eq!(f.code, 3, "[{}] {}", who.name(), f.stderr_text());
        assert_eq!(String::from_utf8_lossy(&f.stdout), "forwarded\n", "[{}]", who.name());
        assert_eq!(f.stderr_text(), "to-err\n", "[{}]", who.name());

        let mut c = zygo(who);
        c.args(["run", "--timeout", "300ms", "--", "sleep", "30"]);
        let f = finish(c);
        assert_eq!(f.code, 137, "[{}] {}", who.name(), f.stderr_text());
        assert!(f.stdout.is_empty(), "[{}]", who.name());
        let err = f.stderr_text();
        assert!(err.starts_with("zygo: killed:") && err.contains("time limit") && err.lines().count() == 1,
                "[{}] stderr: {err:?}", who.name());
    }

    /// TCP socket buffers count against --mem: a sandbox under --mem 64M cannot park
    /// 256 MB of data in loopback TCP connections. (Socket memory is charged to a v1 memory
    /// cgroup only once `memory.kmem.tcp.limit_in_bytes` is written; v2 always charges it.)
    fn tcp_buffers_count_against_mem(who) {
        let (v, code) = guarded_py(who, &["--mem", "64M", "--timeout", "20s"], r#"
import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(128)
port = srv.getsockname()[1]
conns, total, chunk = [], 0, b"x" * 65536
while total < 256 << 20 and len(conns) < 400:
    c = socket.create_connection(("127.0.0.1", port))
    s, _ = srv.accept()
    c.setblocking(False)
    try:
        while total < 256 << 20:
            total += c.send(chunk)
    except BlockingIOError:
        pass
    conns.append((c, s))
done(buffered_mb=total >> 20, conns=len(conns))"#);
        eprintln!("[{}] TCP buffers under --mem 64M: exit {code}: {}", who.name(), s(&v, "stdout").trim());
        if v["oom_killed"] == true {
            return; // charged to the cgroup: the kernel stopped it
        }
        assert_ok(who, &v, code);
        let r: Value = serde_json::from_str(s(&v, "stdout").trim()).expect("probe json");
        let mb = r["buffered_mb"].as_u64().unwrap_or(u64::MAX);
        assert!(
            mb <= 128,
            "[{}] {mb} MB parked in TCP buffers under --mem 64M, not charged to the sandbox: {r}",
            who.name()
        );
    }

    /// A sandbox cannot take the host's whole Linux AIO budget (fs.aio-max-nr is one
    /// counter for the machine): while it holds all it can get, the host can still
    /// io_setup.
    fn host_aio_budget_survives(who) {
        let code = r#"
total, last = 0, "OK"
ctxs = []
for n in [1 << k for k in range(16, -1, -1)]:
    while True:
        ctx = ctypes.c_ulong(0)
        r, e = raw(206, n, ctypes.byref(ctx))
        if r != 0:
            last = ename(e)
            break
        ctxs.append(ctx)
        total += n
hold()
done(events=total, last=last)"#;
        let host = hold_and_check(who, code, || {
            let mut ctx: libc::c_ulong = 0;
            // SAFETY: io_setup with a valid out-pointer; the context is destroyed at once.
            let r = unsafe { libc::syscall(libc::SYS_io_setup, 1, &mut ctx) };
            if r != 0 {
                return Err(format!("host io_setup(1): {}", std::io::Error::last_os_error()));
            }
            // SAFETY: destroying the context just created.
            unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
            Ok(())
        });
        assert!(host.is_ok(), "[{}] while the sandbox held its AIO contexts: {host:?}", who.name());
    }
}

/// Run `code` in a sandbox with a shared directory at /sync, where the probe's `hold()`
/// creates `full` and then waits for `done`. In between, `check` runs on the host; its
/// answer is returned after the sandbox has ended. `check` must also pass before.
fn hold_and_check(
    who: Who,
    code: &str,
    check: impl Fn() -> Result<(), String>,
) -> Result<(), String> {
    // One at a time: two of these holding the same budget would blame each other.
    static HOST_BUDGET: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = HOST_BUDGET.lock().unwrap_or_else(|e| e.into_inner());
    let sync = TempDir::new(0o777);
    let mount = format!("{}:/sync:rw", sync.str());
    let script = format!(
        r#"
import time
def hold():
    open("/sync/full", "w").close()
    t = time.monotonic()
    while not os.path.exists("/sync/done") and time.monotonic() - t < 10:
        time.sleep(0.01)
{code}"#
    );
    let before = check();
    assert!(
        before.is_ok(),
        "[{}] inconclusive: the host check fails even before the sandbox: {before:?}",
        who.name()
    );
    let sandbox = std::thread::scope(|scope| {
        let h = scope.spawn(|| guarded_py(who, &["--mount", &mount, "--timeout", "20s"], &script));
        let t0 = Instant::now();
        while !sync.path.join("full").exists()
            && t0.elapsed() < slow(Duration::from_secs(15))
            && !h.is_finished()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let during = if sync.path.join("full").exists() {
            Some(check())
        } else {
            None
        };
        std::fs::write(sync.path.join("done"), b"").expect("signal done");
        let (v, c) = h.join().expect("sandbox thread");
        (v, c, during)
    });
    let (v, c, during) = sandbox;
    eprintln!("[{}] sandbox: {}", who.name(), s(&v, "stdout").trim());
    assert_ok(who, &v, c);
    during.unwrap_or_else(|| panic!("[{}] the probe never reached hold(): {v}", who.name()))
}

/// A sandbox cannot exhaust host root's inotify instances. inotify instances are counted
/// per user along the user-namespace chain; a sandbox's namespace is owned by the user who
/// created it, so a root-started sandbox's instances count against host root's
/// fs.inotify.max_user_instances (128 here).
mod host_inotify_budget_survives {
    use super::*;

    const CODE: &str = r#"
fds = []
while len(fds) < 4000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
last = ename(ctypes.get_errno())
hold()
done(instances=len(fds), last=last)"#;

    fn body(who: Who) {
        // Both halves check that host root can still make an instance: as root.
        if !root_only() {
            return;
        }
        let host = hold_and_check(who, CODE, || {
            // SAFETY: plain inotify_init1; the descriptor is closed at once.
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            if fd < 0 {
                return Err(format!(
                    "host root's inotify_init1: {}",
                    std::io::Error::last_os_error()
                ));
            }
            // SAFETY: closing the descriptor just opened.
            unsafe { libc::close(fd) };
            Ok(())
        });
        assert!(
            host.is_ok(),
            "[{}] while the sandbox held its inotify instances: {host:?}",
            who.name()
        );
    }

    #[test]
    fn root() {
        body(Who::Root)
    }

    #[test]
    fn rootless() {
        body(Who::Rootless)
    }
}
