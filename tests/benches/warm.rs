//! Warm-function benchmark: prints the warm-call figures (latency, throughput, start-up,
//! memory) that docs/performance.md reports.
//! It asserts nothing about time; it exits non-zero only when something could not be
//! measured (no binary, a supervisor that would not start, calls that failed).
//!
//! Reproduce with:
//!
//! ```text
//! cargo build --release && cargo bench -p zygo-tests --bench warm
//! ```
//!
//! This bench does NOT build zygo: it runs the release `zygo` beside it
//! (`target/x86_64-unknown-linux-gnu/release/zygo`, or `$ZYGO_BIN`) and warns
//! when a source file under `crates/` is newer than that binary.
//!
//! What it does, in one run:
//! - (a) the floor: a warm `/usr/bin/python3` that imported json does `os.fork()` + a pipe
//!   round trip with the child, 2000 times after 200 warm-ups; it prints p50/p99 µs.
//! - starts its own supervisor (`zygo up -f sandbox.toml` with a temporary
//!   `ZYGO_RUNTIME_DIR`/`ZYGO_STATE_DIR`) serving `def handler(event): return {"ok": True}`
//!   with min_warm = 2, max_warm = 8;
//! - (b) one kept connection, 200 warm-up then ≥ 2000 sequential Exec calls: p50/p90/p99/max;
//!   then 1000 more, 2 ms apart (a call's own cost once the spares have been refilled);
//! - (c) 1, 8 and 32 concurrent callers (threads, one kept connection each), 0.5 s of warm-up
//!   then ~3 s measured per level: calls/s, p50/p99; busy refusals counted apart (a refused
//!   caller sleeps 1 ms and retries);
//! - (d) Node with spares: tries to serve a Node function; if the supervisor serves it, 50
//!   warm-up then 500 sequential calls on one kept connection, else it prints
//!   "node: not available (only python zygotes are served)" and the supervisor's reason;
//! - drains that supervisor (`zygo drain --grace 1s`) and waits for it to exit;
//! - (e) memory: a second supervisor serving 10 copies of the function (min_warm = 1): the
//!   supervisor's RSS, each idle agent's VmRSS/Pss against a bare
//!   `python3 -c 'import json, warm_handler; input()'`; then drains that one too.
//!
//! Knobs (environment): `ZYGO_BIN`, `ZYGO_BENCH_CALLS` (sequential calls, default 2000),
//! `ZYGO_BENCH_SECS` (seconds per concurrency level, default 3), `ZYGO_BENCH_NODE_CALLS`
//! (sequential Node calls, default 500).
//!
//! Comparing two builds: `ZYGO_BENCH_AB=OTHER_ZYGO` runs only (b), for both binaries at once
//! (`ZYGO_BENCH_AB_ROUNDS` rounds, default 10, of `ZYGO_BENCH_AB_CALLS` calls each, default
//! 400, alternating), and prints the ratio of their p50s: on a shared machine, figures taken
//! minutes apart differ by more than most changes do.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant, SystemTime};

use proto::front::{ErrorCode, ExecRequest, Outcome, Reply, Request, Role, MAX_FRONT_FRAME};
use proto::{read_frame, write_frame};

const REPRODUCE: &str = "cargo build --release && cargo bench -p zygo-tests --bench warm";
const WARMUP_CALLS: usize = 200;
/// Node spares are slower to refill: fewer calls keep the run short.
const NODE_WARMUP_CALLS: usize = 50;
const FORKS: usize = 2000;
/// (b) again with idle time between calls: what one call costs when the machine has had
/// the time to refill the spares (back to back, the calls wait for the CPU that refills).
const PACED_CALLS: usize = 1000;
const PACED_GAP: Duration = Duration::from_millis(2);
const FORK_WARMUP: usize = 200;
const LEVELS: [usize; 3] = [1, 8, 32];
const LEVEL_WARMUP: Duration = Duration::from_millis(500);
const MIN_WARM: u32 = 2;
const MAX_WARM: u32 = 8;
const MEM_FUNCTIONS: usize = 10;

const HANDLER: &str = "def handler(event):\n    return {\"ok\": True}\n";
const HANDLER_MODULE: &str = "warm_handler";
const NODE_HANDLER: &str = "export default async function (event) {\n  return { ok: true };\n}\n";
const AGENT_SCRIPT: &str = "/run/zygo/python_agent.py";

/// The floor: fork + pipe round trip inside a warm python that imported json.
const FLOOR_PY: &str = r#"
import json, os, sys, time

n, warm = int(sys.argv[1]), int(sys.argv[2])
to_child_r, to_child_w = os.pipe()
to_parent_r, to_parent_w = os.pipe()
rt, fk, full = [], [], []
for i in range(warm + n):
    t0 = time.perf_counter_ns()
    pid = os.fork()
    if pid == 0:
        os.read(to_child_r, 1)
        os.write(to_parent_w, b"x")
        os._exit(0)
    t1 = time.perf_counter_ns()
    os.write(to_child_w, b"x")
    os.read(to_parent_r, 1)
    t2 = time.perf_counter_ns()
    os.waitpid(pid, 0)
    t3 = time.perf_counter_ns()
    if i >= warm:
        fk.append(t1 - t0)
        rt.append(t2 - t0)
        full.append(t3 - t0)

def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round((len(s) - 1) * q)))] / 1000.0

print(f"floor: {n} forks (after {warm} warm-ups) of a python that imported json: "
      f"fork+pipe round trip p50 {pct(rt, 0.5):.0f} us, p99 {pct(rt, 0.99):.0f} us; "
      f"fork() alone p50 {pct(fk, 0.5):.0f} us; incl. exit+waitpid p50 {pct(full, 0.5):.0f} us",
      file=sys.stderr)
print(json.dumps({"n": n, "rt_p50": pct(rt, 0.5), "rt_p90": pct(rt, 0.9),
                  "rt_p99": pct(rt, 0.99), "fork_p50": pct(fk, 0.5),
                  "full_p50": pct(full, 0.5), "full_p99": pct(full, 0.99)}))
"#;

type R<T> = Result<T, String>;

fn main() {
    let code = match run() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warm bench: {e}");
            2
        }
    };
    std::process::exit(code);
}

// --- small helpers ---------------------------------------------------------------------------

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn zygo_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ZYGO_BIN") {
        return PathBuf::from(p);
    }
    // The bench runs from `<target>/<triple>/release/deps/`; the binary is in `release/`.
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("zygo")))
        .unwrap_or_else(|| PathBuf::from("zygo"))
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest source file under `dir` (Rust, Python, TOML), with its time.
fn newest_source(dir: &Path) -> Option<(PathBuf, SystemTime)> {
    let mut best: Option<(PathBuf, SystemTime)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if p.file_name().is_some_and(|n| n != "target") {
                    stack.push(p);
                }
                continue;
            }
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
            if !matches!(ext, "rs" | "py" | "toml") {
                continue;
            }
            if let Some(t) = mtime(&p) {
                if best.as_ref().is_none_or(|(_, b)| t > *b) {
                    best = Some((p, t));
                }
            }
        }
    }
    best
}

fn read_to_string(p: impl AsRef<Path>) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn first_field(path: &str, prefix: &str) -> String {
    read_to_string(path)
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

fn loadavg() -> String {
    read_to_string("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

/// CPU per call, and the call rate that much CPU allows on this machine's CPUs.
fn cpu_text((s, l, b): (f64, f64, f64)) -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let total = s + l + b;
    let cap = if total > 0.0 {
        format!("{:.0}", cpus * 1000.0 / total)
    } else {
        "?".into()
    };
    format!("{s:.2} / {l:.2} / {b:.2} ms = {total:.2} ms (cap ~{cap}/s on {cpus} cpus)")
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets"
    } else {
        "MISSES"
    }
}

// --- /proc -------------------------------------------------------------------------------------

struct Proc {
    pid: i32,
    ppid: i32,
    argv: Vec<String>,
}

fn procs() -> Vec<Proc> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmd
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        let stat = read_to_string(format!("/proc/{pid}/stat"));
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        out.push(Proc { pid, ppid, argv });
    }
    out
}

fn environ_has(pid: i32, entry: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|e| e.split(|&b| b == 0).any(|v| v == entry.as_bytes()))
        .unwrap_or(false)
}

/// Gone, or a zombie nobody reaped yet.
fn exited(pid: i32) -> bool {
    let stat = read_to_string(format!("/proc/{pid}/stat"));
    match stat.rsplit_once(')') {
        Some((_, rest)) => rest.split_whitespace().next() == Some("Z"),
        None => true,
    }
}

/// (VmRSS, Pss) in kB.
fn rss_pss(pid: i32) -> (u64, u64) {
    let kb = |text: &str, key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let status = read_to_string(format!("/proc/{pid}/status"));
    let rollup = read_to_string(format!("/proc/{pid}/smaps_rollup"));
    (kb(&status, "VmRSS:"), kb(&rollup, "Pss:"))
}

/// Private_Clean + Private_Dirty (USS) in kB: what the process alone costs.
fn private_kb(pid: i32) -> u64 {
    let rollup = read_to_string(format!("/proc/{pid}/smaps_rollup"));
    rollup
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

/// The cgroup path of a process in the memory hierarchy (v1), else its v2 path.
fn memory_cgroup(pid: i32) -> String {
    let text = read_to_string(format!("/proc/{pid}/cgroup"));
    let mut v2 = String::new();
    for l in text.lines() {
        let mut parts = l.splitn(3, ':');
        let (_, ctrl, path) = (parts.next(), parts.next(), parts.next());
        match (ctrl, path) {
            (Some(c), Some(p)) if c.split(',').any(|x| x == "memory") => return p.to_string(),
            (Some(""), Some(p)) => v2 = p.to_string(),
            _ => {}
        }
    }
    v2
}

fn descendants(all: &[Proc], root: i32) -> Vec<&Proc> {
    let mut kids: HashMap<i32, Vec<&Proc>> = HashMap::new();
    for p in all {
        kids.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for k in kids.get(&p).into_iter().flatten() {
            out.push(*k);
            stack.push(k.pid);
        }
    }
    out
}

/// CPU time (ns) used so far by a supervisor's own process, its launchers, and the
/// sandboxes under them (agents with their reaped children, plus live children).
#[derive(Clone, Copy, Default)]
struct Cpu {
    supervisor: u64,
    launchers: u64,
    sandbox: u64,
}

/// utime + stime (and cutime + cstime when `reaped`) of a process, in ns.
fn cpu_ns(pid: i32, reaped: bool) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let stat = read_to_string(format!("/proc/{pid}/stat"));
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    // After the command: state is field 3; utime, stime, cutime, cstime are fields 14-17.
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    if f.len() < 4 {
        return 0;
    }
    let ticks = f[0] + f[1] + if reaped { f[2] + f[3] } else { 0 };
    ticks * 1_000_000_000 / hz
}

fn cpu(sup: i32) -> Cpu {
    let all = procs();
    let mut c = Cpu {
        supervisor: cpu_ns(sup, false),
        ..Cpu::default()
    };
    let desc = descendants(&all, sup);
    let launchers: Vec<i32> = desc
        .iter()
        .filter(|p| p.argv.get(1).is_some_and(|a| a == "__launcher"))
        .map(|p| p.pid)
        .collect();
    for p in &desc {
        if launchers.contains(&p.pid) {
            c.launchers += cpu_ns(p.pid, false);
        } else if runs_agent(p) {
            // An agent (its parent is the sandbox's init, a launcher) counts the children
            // it reaped; a live child counts only itself.
            c.sandbox += cpu_ns(p.pid, launchers.contains(&p.ppid));
        }
    }
    c
}

/// CPU per call in ms between two snapshots: (supervisor, launchers, sandbox).
fn cpu_per_call(a: Cpu, b: Cpu, calls: usize) -> (f64, f64, f64) {
    let per = |x: u64, y: u64| y.saturating_sub(x) as f64 / 1e6 / calls.max(1) as f64;
    (
        per(a.supervisor, b.supervisor),
        per(a.launchers, b.launchers),
        per(a.sandbox, b.sandbox),
    )
}

/// Time for agents to reap the children that served (they reap at least every second).
const REAP_WAIT: Duration = Duration::from_millis(1300);

fn runs_agent(p: &Proc) -> bool {
    p.argv.first().is_some_and(|a| a.ends_with("python3"))
        && p.argv.iter().any(|a| a == AGENT_SCRIPT)
}

/// The agent of a function (not its parked children): a python3 running the agent script
/// whose memory cgroup is the zygote's own (`…/<fn>/z-…`).
fn agents_of(all: &[Proc], func: &str) -> Vec<i32> {
    let needle = format!("/{func}/z-");
    all.iter()
        .filter(|p| runs_agent(p) && memory_cgroup(p.pid).contains(&needle))
        .map(|p| p.pid)
        .collect()
}

/// Parked (or busy) request children of a function: in `…/<fn>/<slot>`, not `z-…`.
fn children_of(all: &[Proc], func: &str) -> Vec<i32> {
    let needle = format!("/{func}/");
    all.iter()
        .filter(|p| {
            let cg = memory_cgroup(p.pid);
            runs_agent(p) && cg.contains(&needle) && !cg.contains(&format!("{needle}z-"))
        })
        .map(|p| p.pid)
        .collect()
}

// --- a front connection ------------------------------------------------------------------------

struct Front {
    sock: UnixStream,
}

enum Call {
    Ok,
    Busy,
    Failed(String),
}

impl Front {
    fn connect(path: &Path) -> R<Front> {
        let mut sock =
            UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.display()))?;
        plumbing::hello::say(&mut sock, Role::Cli, Default::default())
            .map_err(|e| format!("hello: {e}"))?;
        Ok(Front { sock })
    }

    fn call(&mut self, req: &Request) -> R<Reply> {
        write_frame(&mut self.sock, req).map_err(|e| format!("send: {e}"))?;
        loop {
            match read_frame::<_, Reply>(&mut self.sock, MAX_FRONT_FRAME) {
                Ok(Reply::Event(_)) => continue,
                Ok(r) => return Ok(r),
                Err(e) => return Err(format!("receive: {e}")),
            }
        }
    }

    fn exec(&mut self, name: &str) -> Call {
        let req = Request::Exec(ExecRequest {
            name: name.to_string(),
            event: "{}".into(),
            key: None,
            timeout_ms: None,
            stream: false,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        });
        match self.call(&req) {
            Ok(Reply::Answer(a)) => {
                let good = a.outcome == Outcome::Ok
                    && a.result
                        .as_deref()
                        .and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok())
                        == Some(serde_json::json!({"ok": true}));
                if good {
                    Call::Ok
                } else {
                    Call::Failed(format!(
                        "{}: {}",
                        a.outcome.as_str(),
                        a.error.or(a.result).unwrap_or_default()
                    ))
                }
            }
            Ok(Reply::Error {
                code: ErrorCode::Busy,
                ..
            }) => Call::Busy,
            Ok(Reply::Error { code, message, .. }) => {
                Call::Failed(format!("{}: {message}", code.as_str()))
            }
            Ok(other) => Call::Failed(format!("unexpected reply {other:?}")),
            Err(e) => Call::Failed(e),
        }
    }
}

// --- a supervisor of our own -------------------------------------------------------------------

struct Supervisor {
    bin: PathBuf,
    runtime: PathBuf,
    state: PathBuf,
    pid: i32,
    drained: bool,
}

struct Drained {
    after: Duration,
    exited: bool,
    left: usize,
    said: String,
}

impl Supervisor {
    /// `zygo up -f toml` with private runtime and state directories under `dir`.
    fn up(bin: &Path, dir: &Path, toml: &Path) -> R<(Supervisor, Duration)> {
        let runtime = dir.join("run");
        let state = dir.join("state");
        let t0 = Instant::now();
        let out = Command::new(bin)
            .args(["up", "-f"])
            .arg(toml)
            .env("ZYGO_RUNTIME_DIR", &runtime)
            .env("ZYGO_STATE_DIR", &state)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run {} up: {e}", bin.display()))?;
        let took = t0.elapsed();
        let pid = find_supervisor(bin, &runtime);
        let mut sup = Supervisor {
            bin: bin.to_path_buf(),
            runtime,
            state,
            pid: pid.unwrap_or(0),
            drained: false,
        };
        if !out.status.success() {
            let log = read_to_string(sup.state.join("supervisor.log"));
            sup.drain_quietly();
            return Err(format!(
                "`zygo up -f {}` failed ({}): {}{}\nsupervisor log:\n{log}",
                toml.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if pid.is_none() {
            sup.drain_quietly();
            return Err("the supervisor started but its process was not found".into());
        }
        Ok((sup, took))
    }

    fn socket(&self) -> PathBuf {
        self.runtime.join("zygo.sock")
    }

    fn connect(&self) -> R<Front> {
        Front::connect(&self.socket())
    }

    fn env_entry(&self) -> String {
        format!("ZYGO_RUNTIME_DIR={}", self.runtime.display())
    }

    fn log_path(&self) -> PathBuf {
        self.state.join("supervisor.log")
    }

    /// `zygo drain --grace 1s`, then wait (up to 15 s) for the process to exit.
    fn drain(&mut self) -> Drained {
        self.drained = true;
        let t0 = Instant::now();
        let said = match Command::new(&self.bin)
            .args(["drain", "--grace", "1s"])
            .env("ZYGO_RUNTIME_DIR", &self.runtime)
            .env("ZYGO_STATE_DIR", &self.state)
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => format!("could not run zygo drain: {e}"),
        };
        let deadline = t0 + Duration::from_secs(15);
        let mut ok = false;
        while Instant::now() < deadline {
            if self.pid == 0 || exited(self.pid) {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let after = t0.elapsed();
        if !ok {
            self.kill();
        }
        // Give launchers a moment to go, then count what is left with our environment.
        std::thread::sleep(Duration::from_millis(100));
        let entry = self.env_entry();
        let left = procs()
            .iter()
            .filter(|p| p.pid != self.pid && environ_has(p.pid, &entry))
            .count();
        Drained {
            after,
            exited: ok,
            left,
            said,
        }
    }

    fn drain_quietly(&mut self) {
        if !self.drained {
            let _ = self.drain();
        }
    }

    fn kill(&self) {
        if self.pid > 0 && !exited(self.pid) {
            // SAFETY: plain kill(2) of the supervisor this bench started.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.drain_quietly();
    }
}

fn find_supervisor(bin: &Path, runtime: &Path) -> Option<i32> {
    let entry = format!("ZYGO_RUNTIME_DIR={}", runtime.display());
    let bin_s = bin.to_string_lossy();
    procs()
        .into_iter()
        .find(|p| {
            p.argv.get(1).is_some_and(|a| a == "supervisor")
                && p.argv
                    .first()
                    .is_some_and(|a| *a == bin_s || a.ends_with("/zygo"))
                && environ_has(p.pid, &entry)
        })
        .map(|p| p.pid)
}

// --- measurements --------------------------------------------------------------------------------

struct Floor {
    rt_p50: f64,
    rt_p99: f64,
    fork_p50: f64,
    full_p50: f64,
    line: String,
}

fn floor(dir: &Path) -> R<Floor> {
    let script = dir.join("floor.py");
    std::fs::write(&script, FLOOR_PY).map_err(|e| format!("write {}: {e}", script.display()))?;
    let out = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(FORKS.to_string())
        .arg(FORK_WARMUP.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run /usr/bin/python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the floor script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| format!("the floor script printed {text:?}: {e}"))?;
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(f64::NAN);
    Ok(Floor {
        rt_p50: f("rt_p50"),
        rt_p99: f("rt_p99"),
        fork_p50: f("fork_p50"),
        full_p50: f("full_p50"),
        line: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

struct Sequential {
    sorted: Vec<Duration>,
    failures: usize,
    busy: usize,
    first_failure: Option<String>,
    elapsed: Duration,
    /// CPU per call (ms): supervisor, launchers, sandbox.
    cpu: (f64, f64, f64),
}

/// `calls` sequential calls on one connection; with `pace`, that long apart (idle between).
fn sequential(
    sup: &Supervisor,
    name: &str,
    warmup: usize,
    calls: usize,
    pace: Duration,
) -> R<Sequential> {
    let mut c = sup.connect()?;
    let mut failures = 0;
    let mut busy = 0;
    let mut first_failure = None;
    for _ in 0..warmup {
        if let Call::Failed(e) = c.exec(name) {
            return Err(format!("a warm-up call failed: {e}"));
        }
    }
    let mut lat = Vec::with_capacity(calls);
    let cpu0 = cpu(sup.pid);
    let t0 = Instant::now();
    while lat.len() < calls {
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
        let t = Instant::now();
        match c.exec(name) {
            Call::Ok => lat.push(t.elapsed()),
            Call::Busy => busy += 1,
            Call::Failed(e) => {
                failures += 1;
                first_failure.get_or_insert(e);
                if failures > 50 {
                    break;
                }
            }
        }
    }
    let elapsed = t0.elapsed();
    std::thread::sleep(REAP_WAIT);
    let cpu = cpu_per_call(cpu0, cpu(sup.pid), lat.len());
    lat.sort_unstable();
    Ok(Sequential {
        sorted: lat,
        failures,
        busy,
        first_failure,
        elapsed,
        cpu,
    })
}

#[derive(Default)]
struct Sample {
    lat: Vec<Duration>,
    /// Every answered call, warm-up included.
    all_ok: usize,
    busy: u64,
    failed: u64,
    first_failure: Option<String>,
}

struct Level {
    callers: usize,
    ok: usize,
    window: Duration,
    sorted: Vec<Duration>,
    busy: u64,
    failed: u64,
    first_failure: Option<String>,
    zygotes: String,
    cpu: (f64, f64, f64),
}

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOP: u8 = 2;

fn worker(sup: &Supervisor, name: &str, phase: &AtomicU8) -> Sample {
    let mut s = Sample::default();
    let mut c = match sup.connect() {
        Ok(c) => c,
        Err(e) => {
            s.failed += 1;
            s.first_failure = Some(e);
            return s;
        }
    };
    loop {
        if phase.load(Ordering::Acquire) == STOP {
            return s;
        }
        let t0 = Instant::now();
        let r = c.exec(name);
        let dt = t0.elapsed();
        let counted = phase.load(Ordering::Acquire) == MEASURING;
        match r {
            Call::Ok if counted => {
                s.all_ok += 1;
                s.lat.push(dt);
            }
            Call::Ok => s.all_ok += 1,
            Call::Busy => {
                if counted {
                    s.busy += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Call::Failed(e) => {
                if counted {
                    s.failed += 1;
                    s.first_failure.get_or_insert(e);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn zygote_counts(sup: &Supervisor, name: &str) -> String {
    let Ok(mut c) = sup.connect() else {
        return "?".into();
    };
    match c.call(&Request::List) {
        Ok(Reply::Functions(fs)) => fs
            .iter()
            .find(|f| f.name == name)
            .map(|f| {
                let z = &f.zygotes;
                format!(
                    "{} zygotes ({} starting)",
                    z.ready + z.busy + z.frozen + z.starting,
                    z.starting
                )
            })
            .unwrap_or_else(|| "?".into()),
        _ => "?".into(),
    }
}

fn level(sup: &Supervisor, name: &str, callers: usize, secs: usize) -> Level {
    let phase = AtomicU8::new(WARMING);
    let window = Duration::from_secs(secs as u64);
    let mut measured = Duration::ZERO;
    let cpu0 = cpu(sup.pid);
    let samples: Vec<Sample> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|_| s.spawn(|| worker(sup, name, &phase)))
            .collect();
        std::thread::sleep(LEVEL_WARMUP);
        phase.store(MEASURING, Ordering::Release);
        let t0 = Instant::now();
        std::thread::sleep(window);
        phase.store(STOP, Ordering::Release);
        measured = t0.elapsed();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let zygotes = zygote_counts(sup, name);
    std::thread::sleep(REAP_WAIT);
    let cpu1 = cpu(sup.pid);
    let mut all = Vec::new();
    let (mut busy, mut failed, mut first, mut all_ok) = (0, 0, None, 0);
    for s in samples {
        all_ok += s.all_ok;
        all.extend(s.lat);
        busy += s.busy;
        failed += s.failed;
        if first.is_none() {
            first = s.first_failure;
        }
    }
    all.sort_unstable();
    Level {
        callers,
        ok: all.len(),
        window: measured,
        sorted: all,
        busy,
        failed,
        first_failure: first,
        zygotes,
        cpu: cpu_per_call(cpu0, cpu1, all_ok),
    }
}

struct ServerStats {
    requests: u64,
    p50_us: u64,
    p99_us: u64,
}

fn server_stats(sup: &Supervisor, name: &str) -> Option<ServerStats> {
    let mut c = sup.connect().ok()?;
    match c
        .call(&Request::Stats {
            name: Some(name.into()),
        })
        .ok()?
    {
        Reply::Stats(v) => v.into_iter().next().map(|s| ServerStats {
            requests: s.requests,
            p50_us: s.p50_wall_us,
            p99_us: s.p99_wall_us,
        }),
        _ => None,
    }
}

enum Node {
    NotAvailable(String),
    Measured(Sequential),
}

fn node(sup: &Supervisor, dir: &Path, name: &str, calls: usize) -> R<Node> {
    let app = dir.join("node");
    std::fs::create_dir_all(&app).map_err(|e| format!("create {}: {e}", app.display()))?;
    std::fs::write(app.join("warm_handler.mjs"), NODE_HANDLER).map_err(|e| e.to_string())?;
    let toml = app.join("sandbox.toml");
    std::fs::write(
        &toml,
        format!(
            "[fn.{name}]\nagent = \"node\"\nentry = \"warm_handler.mjs\"\nmin_warm = {MIN_WARM}\nmax_warm = {MAX_WARM}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut c = sup.connect()?;
    let r = c.call(&Request::Serve {
        name: name.into(),
        file: toml.display().to_string(),
    })?;
    match r {
        Reply::Served { served, failed }
            if failed.is_empty() && served.iter().any(|s| s == name) =>
        {
            Ok(Node::Measured(sequential(
                sup,
                name,
                NODE_WARMUP_CALLS,
                calls,
                Duration::ZERO,
            )?))
        }
        Reply::Served { failed, .. } => Ok(Node::NotAvailable(
            failed
                .into_iter()
                .map(|(_, why)| why)
                .collect::<Vec<_>>()
                .join("; "),
        )),
        Reply::Error { message, .. } => Ok(Node::NotAvailable(message)),
        other => Ok(Node::NotAvailable(format!("unexpected reply {other:?}"))),
    }
}

struct Memory {
    sup_rss: u64,
    sup_pss: u64,
    launchers: usize,
    launcher_rss: u64,
    launcher_pss: u64,
    agents: usize,
    agent_rss: u64,
    agent_pss: u64,
    agent_uss: u64,
    children: usize,
    child_pss: u64,
    child_uss: u64,
    bare_rss: u64,
    bare_pss: u64,
    serve_took: Duration,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// A bare python that imported the same module, idle in `input()`.
fn bare_python(app: &Path) -> R<(u64, u64)> {
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", &format!("import json, {HANDLER_MODULE}; input()")])
        .current_dir(app)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("start a bare python3: {e}"))?;
    let pid = child.id() as i32;
    // Settled when blocked in input() with an RSS that stopped moving.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = 0;
    let mut got = (0, 0);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        got = rss_pss(pid);
        let state = read_to_string(format!("/proc/{pid}/stat"));
        let sleeping = state
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.split_whitespace().next() == Some("S"));
        if sleeping && got.0 == last && last > 0 {
            break;
        }
        last = got.0;
    }
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"\n");
    }
    let _ = child.wait();
    Ok(got)
}

fn memory(bin: &Path, dir: &Path, app: &Path, tag: &str) -> R<(Memory, Drained, PathBuf)> {
    let mdir = dir.join("mem");
    std::fs::create_dir_all(&mdir).map_err(|e| e.to_string())?;
    let mut toml = String::new();
    let names: Vec<String> = (0..MEM_FUNCTIONS).map(|i| format!("{tag}_m{i}")).collect();
    for n in &names {
        let _ = write!(
            toml,
            "[fn.{n}]\nagent = \"python\"\nentry = \"{}/{HANDLER_MODULE}.py:handler\"\nmin_warm = 1\nmax_warm = 1\n\n",
            app.display()
        );
    }
    let toml_path = mdir.join("sandbox.toml");
    std::fs::write(&toml_path, toml).map_err(|e| e.to_string())?;
    let (mut sup, serve_took) = Supervisor::up(bin, &mdir, &toml_path)?;
    let log = sup.log_path();
    // Let every zygote park its children and settle.
    std::thread::sleep(Duration::from_millis(1500));
    let all = procs();
    let (sup_rss, sup_pss) = rss_pss(sup.pid);
    let desc = descendants(&all, sup.pid);
    let launchers: Vec<i32> = desc
        .iter()
        .filter(|p| p.argv.get(1).is_some_and(|a| a == "__launcher"))
        .map(|p| p.pid)
        .collect();
    let (mut launcher_rss, mut launcher_pss) = (0, 0);
    for &p in &launchers {
        let (r, s) = rss_pss(p);
        launcher_rss += r;
        launcher_pss += s;
    }
    let (mut rss, mut pss, mut uss) = (Vec::new(), Vec::new(), Vec::new());
    let (mut children, mut child_pss, mut child_uss) = (0, 0, 0);
    for n in &names {
        for a in agents_of(&all, n) {
            let (r, s) = rss_pss(a);
            rss.push(r);
            pss.push(s);
            uss.push(private_kb(a));
        }
        for c in children_of(&all, n) {
            children += 1;
            child_pss += rss_pss(c).1;
            child_uss += private_kb(c);
        }
    }
    let agents = rss.len();
    let (bare_rss, bare_pss) = bare_python(app)?;
    let drained = sup.drain();
    Ok((
        Memory {
            sup_rss,
            sup_pss,
            launchers: launchers.len(),
            launcher_rss,
            launcher_pss,
            agents,
            agent_rss: median(rss),
            agent_pss: median(pss),
            agent_uss: median(uss),
            children,
            child_pss,
            child_uss,
            bare_rss,
            bare_pss,
            serve_took,
        },
        drained,
        log,
    ))
}

// --- two builds side by side -------------------------------------------------------------------

/// `ZYGO_BENCH_AB=OTHER`: (b) only, for this binary and OTHER at once. Both supervisors serve
/// the same function; blocks of sequential calls alternate between them (the order swapped
/// every round), so that both see the same machine. Prints each one's p50 and CPU per call
/// and the ratio of p50s, per round and overall.
fn ab(bins: &[PathBuf; 2], dir: &Path, toml: &Path, name: &str) -> R<i32> {
    let rounds = env_usize("ZYGO_BENCH_AB_ROUNDS", 10);
    let block = env_usize("ZYGO_BENCH_AB_CALLS", 400);
    let mut sups = Vec::new();
    for (i, bin) in bins.iter().enumerate() {
        let (sup, _) = Supervisor::up(bin, &dir.join(format!("ab{i}")), toml)?;
        println!(
            "{}: {} (supervisor pid {})",
            ["A", "B"][i],
            bin.display(),
            sup.pid
        );
        sups.push(sup);
    }
    println!(
        "{rounds} rounds of {block} sequential calls on one connection per binary, alternating"
    );
    let mut all: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut cpu_sum = [(0.0, 0.0, 0.0); 2];
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let mut p50 = [Duration::ZERO; 2];
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let seq = sequential(&sups[i], name, 50, block, Duration::ZERO)?;
            if seq.failures > 0 {
                return Err(format!(
                    "{}: {} call(s) failed: {}",
                    bins[i].display(),
                    seq.failures,
                    seq.first_failure.unwrap_or_default()
                ));
            }
            p50[i] = pct(&seq.sorted, 0.50);
            let c = &mut cpu_sum[i];
            (c.0, c.1, c.2) = (c.0 + seq.cpu.0, c.1 + seq.cpu.1, c.2 + seq.cpu.2);
            all[i].extend(seq.sorted);
        }
        let r = p50[1].as_secs_f64() / p50[0].as_secs_f64();
        ratios.push(r);
        println!(
            "  round {round:2}: A p50 {}  B p50 {}  B/A {r:.3}",
            ms(p50[0]),
            ms(p50[1])
        );
    }
    ratios.sort_by(f64::total_cmp);
    for (i, lat) in all.iter_mut().enumerate() {
        lat.sort_unstable();
        let n = rounds as f64;
        let c = cpu_sum[i];
        println!(
            "{}: p50 {}  p90 {}  p99 {}  CPU/call {}",
            ["A", "B"][i],
            ms(pct(lat, 0.50)),
            ms(pct(lat, 0.90)),
            ms(pct(lat, 0.99)),
            cpu_text((c.0 / n, c.1 / n, c.2 / n))
        );
    }
    println!("B/A p50: median of rounds {:.3}", ratios[ratios.len() / 2]);
    for s in &mut sups {
        s.drain_quietly();
    }
    Ok(0)
}

// --- the run -------------------------------------------------------------------------------------

fn run() -> R<i32> {
    let calls = env_usize("ZYGO_BENCH_CALLS", 2000).max(2000);
    let secs = env_usize("ZYGO_BENCH_SECS", 3);
    let bin = zygo_bin();
    let root = repo_root();
    println!("== zygo warm-function benchmark ==");
    println!("reproduce: cd {} && {REPRODUCE}", root.display());
    if !bin.is_file() {
        println!(
            "zygo binary: {} is missing. This bench does not build zygo; build it first with\n    cd {} && cargo build --release\n(or point $ZYGO_BIN at a binary)",
            bin.display(),
            root.display()
        );
        return Ok(2);
    }
    let bin = std::fs::canonicalize(&bin).map_err(|e| e.to_string())?;
    println!(
        "zygo binary: {} (not built by this bench: run `cargo build --release` first)",
        bin.display()
    );
    if let (Some(built), Some((src, newer))) = (mtime(&bin), newest_source(&root.join("crates"))) {
        if newer > built {
            println!(
                "WARNING: {} is newer than the binary; the figures are for the old build \
                 (run `cargo build --release` again)",
                src.display()
            );
        }
    }
    let uname = read_to_string("/proc/sys/kernel/osrelease");
    println!(
        "machine: {} cpus, kernel {}, {}, cgroup {}, load {} (other work on this machine adds noise)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        uname.trim(),
        first_field("/proc/cpuinfo", "model name"),
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            "v2"
        } else {
            "v1"
        },
        loadavg()
    );

    let tag = format!("wb{}", std::process::id());
    let dir = std::env::temp_dir().join(format!(
        "zygo-bench-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    ));
    let app = dir.join("app");
    std::fs::create_dir_all(&app).map_err(|e| format!("create {}: {e}", app.display()))?;
    std::fs::write(app.join(format!("{HANDLER_MODULE}.py")), HANDLER).map_err(|e| e.to_string())?;
    let name = tag.clone();
    let toml = app.join("sandbox.toml");
    std::fs::write(
        &toml,
        format!(
            "[fn.{name}]\nagent = \"python\"\nentry = \"{HANDLER_MODULE}.py:handler\"\nmin_warm = {MIN_WARM}\nmax_warm = {MAX_WARM}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    println!("handler: {}", HANDLER.lines().collect::<Vec<_>>().join(" "));
    println!("work dir: {}", dir.display());
    println!();
    if let Some(other) = std::env::var_os("ZYGO_BENCH_AB") {
        let other = std::fs::canonicalize(&other)
            .map_err(|e| format!("ZYGO_BENCH_AB={}: {e}", Path::new(&other).display()))?;
        let r = ab(&[bin, other], &dir, &toml, &name);
        if matches!(r, Ok(0)) {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            println!("kept for inspection: {}", dir.display());
        }
        return r;
    }

    // (a)
    println!("(a) floor: fork + pipe round trip in a warm /usr/bin/python3 ...");
    let fl = floor(&dir)?;
    println!("    {}", fl.line);

    // The supervisor.
    let (mut sup, up_took) = Supervisor::up(&bin, &app, &toml)?;
    let log = sup.log_path();
    println!(
        "supervisor: pid {}, `zygo up -f {}` took {} ms; fn {name} min_warm={MIN_WARM} max_warm={MAX_WARM}",
        sup.pid,
        toml.display(),
        up_took.as_millis()
    );
    let rss_start = rss_pss(sup.pid).0;

    // (b)
    println!("(b) {calls} sequential calls on one connection (after {WARMUP_CALLS} warm-up) ...");
    let seq = sequential(&sup, &name, WARMUP_CALLS, calls, Duration::ZERO)?;
    let seq_stats = server_stats(&sup, &name);
    println!(
        "    {} ok in {:.2}s, {} failed, {} busy",
        seq.sorted.len(),
        seq.elapsed.as_secs_f64(),
        seq.failures,
        seq.busy
    );
    println!("(b) the same with {PACED_GAP:?} between calls, {PACED_CALLS} calls ...");
    let paced = sequential(&sup, &name, 0, PACED_CALLS, PACED_GAP)?;

    // (c)
    let mut levels = Vec::new();
    for &n in &LEVELS {
        println!("(c) {n} concurrent caller(s) for {secs}s ...");
        let l = level(&sup, &name, n, secs);
        println!(
            "    {} ok, {} busy, {} failed; {}",
            l.ok, l.busy, l.failed, l.zygotes
        );
        levels.push(l);
    }
    let rss_after = rss_pss(sup.pid).0;

    // (d)
    println!(
        "(d) node: serve a Node function; if it is served, sequential calls on one connection ..."
    );
    let node_calls = env_usize("ZYGO_BENCH_NODE_CALLS", 500);
    let nd = node(&sup, &dir, &format!("{tag}_node"), node_calls)?;

    let drained = sup.drain();
    println!(
        "drain: `zygo drain --grace 1s` said {:?}; supervisor {} after {} ms; {} process(es) left",
        drained.said,
        if drained.exited {
            "exited"
        } else {
            "DID NOT EXIT (killed)"
        },
        drained.after.as_millis(),
        drained.left
    );

    // (e)
    println!(
        "(e) memory: a second supervisor serving {MEM_FUNCTIONS} functions (min_warm = 1) ..."
    );
    let (mem, mem_drained, mem_log) = memory(&bin, &dir, &app, &tag)?;
    println!(
        "drain: supervisor {} after {} ms; {} process(es) left",
        if mem_drained.exited {
            "exited"
        } else {
            "DID NOT EXIT (killed)"
        },
        mem_drained.after.as_millis(),
        mem_drained.left
    );

    // --- the table ---
    let mut t = String::new();
    let row = |t: &mut String, what: &str, figure: &str, target: &str, v: &str| {
        let _ = writeln!(t, "| {what:<42} | {figure:<64} | {target:<18} | {v:<7} |");
    };
    let rule = format!(
        "|{}|{}|{}|{}|\n",
        "-".repeat(44),
        "-".repeat(66),
        "-".repeat(20),
        "-".repeat(9)
    );
    t.push_str(&rule);
    row(&mut t, "measurement", "figure", "target", "verdict");
    t.push_str(&rule);
    row(
        &mut t,
        "(a) floor: os.fork()+pipe round trip",
        &format!(
            "p50 {:.3} ms  p99 {:.3} ms  ({FORKS} forks)",
            fl.rt_p50 / 1000.0,
            fl.rt_p99 / 1000.0
        ),
        "(reference)",
        "-",
    );
    row(
        &mut t,
        "    fork() alone / incl. exit+waitpid",
        &format!(
            "p50 {:.3} ms / p50 {:.3} ms",
            fl.fork_p50 / 1000.0,
            fl.full_p50 / 1000.0
        ),
        "(reference)",
        "-",
    );
    let p50 = pct(&seq.sorted, 0.5);
    row(
        &mut t,
        &format!("(b) exec, 1 kept conn, {} calls", seq.sorted.len()),
        &format!(
            "p50 {}  p90 {}  p99 {}  max {} ms",
            ms(p50),
            ms(pct(&seq.sorted, 0.9)),
            ms(pct(&seq.sorted, 0.99)),
            ms(seq.sorted.last().copied().unwrap_or_default())
        ),
        "p50 <= 1 ms",
        verdict(!seq.sorted.is_empty() && p50 <= Duration::from_millis(1)),
    );
    row(
        &mut t,
        &format!("    the same, {} ms apart", PACED_GAP.as_millis()),
        &format!(
            "p50 {}  p90 {}  p99 {} ms  ({} calls)",
            ms(pct(&paced.sorted, 0.5)),
            ms(pct(&paced.sorted, 0.9)),
            ms(pct(&paced.sorted, 0.99)),
            paced.sorted.len()
        ),
        "(info)",
        "-",
    );
    if let Some(s) = &seq_stats {
        row(
            &mut t,
            "    supervisor-side wall (zygo stats)",
            &format!(
                "p50 {:.3}  p99 {:.3} ms  ({} requests)",
                s.p50_us as f64 / 1000.0,
                s.p99_us as f64 / 1000.0,
                s.requests
            ),
            "(dispatch->closed)",
            "-",
        );
    }
    row(
        &mut t,
        "    CPU/call: supervisor/launcher/sandbox",
        &cpu_text(seq.cpu),
        "(info)",
        "-",
    );
    for l in &levels {
        let rate = l.ok as f64 / l.window.as_secs_f64().max(1e-9);
        let (target, v) = if l.callers == 8 {
            ("≥ 500 calls/s", verdict(rate >= 500.0))
        } else {
            ("(info)", "-")
        };
        row(
            &mut t,
            &format!("(c) {:>2} concurrent caller(s)", l.callers),
            &format!(
                "{:>6.0} calls/s  p50 {}  p99 {} ms",
                rate,
                ms(pct(&l.sorted, 0.5)),
                ms(pct(&l.sorted, 0.99))
            ),
            target,
            v,
        );
        row(
            &mut t,
            "    busy refusals / failures",
            &format!(
                "{} busy, {} failed in {:.2}s; pool then: {}",
                l.busy,
                l.failed,
                l.window.as_secs_f64(),
                l.zygotes
            ),
            "(info)",
            "-",
        );
        row(
            &mut t,
            &format!(
                "    CPU per call{}",
                if l.callers == 32 {
                    " (incl. new zygotes)"
                } else {
                    ""
                }
            ),
            &cpu_text(l.cpu),
            "(info)",
            "-",
        );
    }
    match &nd {
        Node::NotAvailable(_) => row(
            &mut t,
            "(d) node with spares",
            "not available (only python zygotes are served)",
            "(no target)",
            "-",
        ),
        Node::Measured(s) => row(
            &mut t,
            &format!("(d) node exec, 1 kept conn, {} calls", s.sorted.len()),
            &format!(
                "p50 {}  p90 {}  p99 {}  max {} ms",
                ms(pct(&s.sorted, 0.5)),
                ms(pct(&s.sorted, 0.9)),
                ms(pct(&s.sorted, 0.99)),
                ms(s.sorted.last().copied().unwrap_or_default())
            ),
            "(no target)",
            "-",
        ),
    }
    if let Node::Measured(s) = &nd {
        row(
            &mut t,
            "    CPU/call: supervisor/launcher/sandbox",
            &cpu_text(s.cpu),
            "(info)",
            "-",
        );
    }
    let diff_rss = mem.agent_rss as i64 - mem.bare_rss as i64;
    let diff_pss = mem.agent_pss as i64 - mem.bare_pss as i64;
    row(
        &mut t,
        "(e) idle zygote agent VmRSS / Pss",
        &format!(
            "{} / {}  (private {}; median of {} agents)",
            mb(mem.agent_rss),
            mb(mem.agent_pss),
            mb(mem.agent_uss),
            mem.agents
        ),
        "(see next rows)",
        "-",
    );
    row(
        &mut t,
        "    bare python3 (json, handler) RSS/Pss",
        &format!("{} / {}", mb(mem.bare_rss), mb(mem.bare_pss)),
        "(reference)",
        "-",
    );
    row(
        &mut t,
        "    zygote - bare, VmRSS",
        &format!(
            "{:+.1} MB  (Pss {:+.1} MB)",
            diff_rss as f64 / 1024.0,
            diff_pss as f64 / 1024.0
        ),
        "≤ +3 MB",
        if mem.agent_rss == 0 || mem.bare_rss == 0 {
            "n/a"
        } else {
            verdict(diff_rss <= 3 * 1024)
        },
    );
    row(
        &mut t,
        "    parked children (all 10 functions)",
        &format!(
            "{} processes, Pss {}, private {} in total",
            mem.children,
            mb(mem.child_pss),
            mb(mem.child_uss)
        ),
        "(info)",
        "-",
    );
    row(
        &mut t,
        &format!("    supervisor RSS, {MEM_FUNCTIONS} fns served"),
        &format!("{}  (Pss {})", mb(mem.sup_rss), mb(mem.sup_pss)),
        "< 20 MB",
        if mem.sup_rss == 0 {
            "n/a"
        } else {
            verdict(mem.sup_rss < 20 * 1024)
        },
    );
    row(
        &mut t,
        "    launchers (2 per zygote), in total",
        &format!(
            "{} processes, RSS {}  Pss {}",
            mem.launchers,
            mb(mem.launcher_rss),
            mb(mem.launcher_pss)
        ),
        "(info)",
        "-",
    );
    row(
        &mut t,
        "    supervisor RSS, bench fn (start/after)",
        &format!("{} / {}", mb(rss_start), mb(rss_after)),
        "(info)",
        "-",
    );
    row(
        &mut t,
        "    zygo up of 10 fns (until served)",
        &format!("{} ms", mem.serve_took.as_millis()),
        "(info)",
        "-",
    );
    t.push_str(&rule);

    println!();
    println!("results ({}; load {}):", bin.display(), loadavg());
    print!("{t}");
    if let Node::NotAvailable(why) = &nd {
        println!("node: not available (only python zygotes are served)");
        println!("      the supervisor said: {why}");
    }
    let mut bad = false;
    if seq.failures > 0 {
        bad = true;
        println!(
            "FAILED calls in (b): {} (first: {})",
            seq.failures,
            seq.first_failure.as_deref().unwrap_or("?")
        );
    }
    for l in &levels {
        if l.failed > 0 {
            bad = true;
            println!(
                "FAILED calls in (c) at {} callers: {} (first: {})",
                l.callers,
                l.failed,
                l.first_failure.as_deref().unwrap_or("?")
            );
        }
    }
    if let Node::Measured(s) = &nd {
        if s.failures > 0 {
            bad = true;
            println!(
                "FAILED calls in (d): {} (first: {})",
                s.failures,
                s.first_failure.as_deref().unwrap_or("?")
            );
        }
    }
    if !drained.exited || !mem_drained.exited {
        bad = true;
        println!("a supervisor did not exit after `zygo drain --grace 1s`");
    }
    println!("busy refusals: a refused caller sleeps 1 ms and retries; refusals are not in calls/s or latencies.");
    println!("reproduce: cd {} && {REPRODUCE}", root.display());
    if bad {
        println!(
            "kept for inspection: {} (logs {} and {})",
            dir.display(),
            log.display(),
            mem_log.display()
        );
        return Ok(1);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(0)
}
