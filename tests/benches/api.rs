//! HTTP API benchmark: what `zygo api` adds to a warm call, beside the same calls over the
//! control socket, in the same run. It asserts nothing about time; it exits non-zero only
//! when something could not be measured.
//!
//! Reproduce with:
//!
//! ```text
//! cargo build --release && cargo bench -p zygo-tests --bench api
//! ```
//!
//! It runs the release `zygo` beside it (or `$ZYGO_BIN`; it does not build it), starts its
//! own supervisor (`zygo up`, private runtime and state directories, a bootstrap
//! `ZYGO_API_TOKEN`) serving `def handler(event): return {"ok": True}` (min_warm 2,
//! max_warm 8), and `zygo api --listen 127.0.0.1:0` in front of it. Then for 1, 8 and 32
//! concurrent callers — each with one kept connection, calling back to back — it measures
//! the control socket (Role::Cli, `Exec`) and HTTP (`POST /fn/NAME`, keep-alive, each
//! caller with an operator token of its own, minted on the host) alternately, `ZYGO_BENCH_ROUNDS` rounds (default 2) of `ZYGO_BENCH_SECS` seconds
//! (default 2) each after 0.5 s of warm-up: calls/s, p50 and p99, and `zygo api`'s RSS
//! (its highest VmRSS seen while measuring). A call the supervisor refuses as busy (429)
//! is counted apart; its caller waits 1 ms and goes on.
//!
//! Targets (2-core machine): HTTP adds at most 0.25 ms to the p50 of one caller; at least
//! 500 calls/s through HTTP at 8 callers; the front under 10 MB RSS at 32.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use proto::front::{
    ErrorCode, ExecRequest, Hello, HelloReply, Outcome, Reply, Request, Role, FRONT_PROTOCOL,
    MAX_FRONT_FRAME,
};
use proto::{read_frame, write_frame};

const REPRODUCE: &str = "cargo build --release && cargo bench -p zygo-tests --bench api";
const HANDLER: &str = "def handler(event):\n    return {\"ok\": True}\n";
const LEVELS: [usize; 3] = [1, 8, 32];
const WARMUP: Duration = Duration::from_millis(500);
const TOKEN: &str = "zygo-bench-bootstrap-token";

type R<T> = Result<T, String>;

fn main() {
    let code = match run() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("api bench: {e}");
            2
        }
    };
    std::process::exit(code);
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn zygo_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ZYGO_BIN") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("zygo")))
        .unwrap_or_else(|| PathBuf::from("zygo"))
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn vm_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// One caller's kept connection.
trait Caller: Send {
    /// One call; `Ok(true)`: answered ok, `Ok(false)`: refused busy.
    fn call(&mut self) -> R<bool>;
}

struct Control {
    sock: UnixStream,
    name: String,
}

impl Control {
    fn connect(path: &Path, name: &str) -> R<Control> {
        let mut sock =
            UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.display()))?;
        write_frame(
            &mut sock,
            &Hello {
                protocol: FRONT_PROTOCOL,
                role: Role::Cli,
                flags: Default::default(),
            },
        )
        .map_err(|e| format!("hello: {e}"))?;
        match read_frame::<_, HelloReply>(&mut sock, MAX_FRONT_FRAME) {
            Ok(HelloReply::Welcome { .. }) => Ok(Control {
                sock,
                name: name.into(),
            }),
            Ok(HelloReply::Refused { reason }) => Err(format!("refused: {reason}")),
            Err(e) => Err(format!("hello reply: {e}")),
        }
    }
}

impl Caller for Control {
    fn call(&mut self) -> R<bool> {
        let req = Request::Exec(ExecRequest {
            name: self.name.clone(),
            event: "{}".into(),
            key: None,
            timeout_ms: None,
            stream: false,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        });
        write_frame(&mut self.sock, &req).map_err(|e| format!("send: {e}"))?;
        loop {
            match read_frame::<_, Reply>(&mut self.sock, MAX_FRONT_FRAME) {
                Ok(Reply::Event(_)) => continue,
                Ok(Reply::Answer(a)) if a.outcome == Outcome::Ok => return Ok(true),
                Ok(Reply::Answer(a)) => {
                    return Err(format!("{}: {:?}", a.outcome.as_str(), a.error))
                }
                Ok(Reply::Error {
                    code: ErrorCode::Busy,
                    ..
                }) => return Ok(false),
                Ok(other) => return Err(format!("unexpected {other:?}")),
                Err(e) => return Err(format!("receive: {e}")),
            }
        }
    }
}

struct Http {
    w: TcpStream,
    r: BufReader<TcpStream>,
    head: Vec<u8>,
}

impl Http {
    fn connect(addr: &str, name: &str, token: &str) -> R<Http> {
        let w = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        w.set_nodelay(true).map_err(|e| e.to_string())?;
        let r = BufReader::new(w.try_clone().map_err(|e| e.to_string())?);
        let head = format!(
            "POST /fn/{name} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .into_bytes();
        Ok(Http { w, r, head })
    }
}

impl Caller for Http {
    fn call(&mut self) -> R<bool> {
        self.w
            .write_all(&self.head)
            .map_err(|e| format!("send: {e}"))?;
        let mut line = String::new();
        self.r
            .read_line(&mut line)
            .map_err(|e| format!("receive: {e}"))?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {line:?}"))?;
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            self.r.read_line(&mut h).map_err(|e| e.to_string())?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v
                        .trim()
                        .parse()
                        .map_err(|_| "bad Content-Length".to_string())?;
                }
            }
        }
        let mut body = vec![0; len];
        self.r.read_exact(&mut body).map_err(|e| e.to_string())?;
        match status {
            200 => Ok(true),
            429 => Ok(false),
            s => Err(format!("{s}: {}", String::from_utf8_lossy(&body))),
        }
    }
}

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOP: u8 = 2;

#[derive(Default)]
struct Sample {
    lat: Vec<Duration>,
    busy: usize,
    failed: usize,
    first_failure: Option<String>,
}

struct Level {
    calls_per_s: f64,
    sorted: Vec<Duration>,
    busy: usize,
    failed: usize,
    first_failure: Option<String>,
}

fn measure(
    callers: usize,
    secs: u64,
    connect: &(dyn Fn() -> R<Box<dyn Caller>> + Sync),
    rss_of: Option<u32>,
    rss_max: &AtomicU64,
) -> Level {
    let phase = AtomicU8::new(WARMING);
    let mut window = Duration::ZERO;
    let samples: Vec<Sample> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|_| {
                s.spawn(|| {
                    let mut smp = Sample::default();
                    let mut c = match connect() {
                        Ok(c) => c,
                        Err(e) => {
                            smp.failed += 1;
                            smp.first_failure = Some(e);
                            return smp;
                        }
                    };
                    loop {
                        let p = phase.load(Ordering::Acquire);
                        if p == STOP {
                            return smp;
                        }
                        let t0 = Instant::now();
                        let r = c.call();
                        let dt = t0.elapsed();
                        let counted = phase.load(Ordering::Acquire) == MEASURING;
                        match r {
                            Ok(true) if counted => smp.lat.push(dt),
                            Ok(true) => {}
                            Ok(false) => {
                                if counted {
                                    smp.busy += 1;
                                }
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            Err(e) => {
                                smp.failed += 1;
                                smp.first_failure.get_or_insert(e);
                                return smp;
                            }
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(WARMUP);
        phase.store(MEASURING, Ordering::Release);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(50));
            if let Some(pid) = rss_of {
                rss_max.fetch_max(vm_rss_kb(pid), Ordering::Relaxed);
            }
        }
        phase.store(STOP, Ordering::Release);
        window = t0.elapsed();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut sorted = Vec::new();
    let (mut busy, mut failed, mut first) = (0, 0, None);
    for s in samples {
        sorted.extend(s.lat);
        busy += s.busy;
        failed += s.failed;
        first = first.or(s.first_failure);
    }
    sorted.sort_unstable();
    Level {
        calls_per_s: sorted.len() as f64 / window.as_secs_f64(),
        sorted,
        busy,
        failed,
        first_failure: first,
    }
}

struct Procs {
    sup_runtime: PathBuf,
    sup_state: PathBuf,
    bin: PathBuf,
    api: Option<Child>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        if let Some(mut api) = self.api.take() {
            // SAFETY: signalling the child this bench started.
            unsafe { libc::kill(api.id() as i32, libc::SIGTERM) };
            let _ = api.wait();
        }
        let _ = Command::new(&self.bin)
            .args(["drain", "--grace", "1s"])
            .env("ZYGO_RUNTIME_DIR", &self.sup_runtime)
            .env("ZYGO_STATE_DIR", &self.sup_state)
            .stdin(Stdio::null())
            .output();
    }
}

fn run() -> R<i32> {
    let secs = env_usize("ZYGO_BENCH_SECS", 2) as u64;
    let rounds = env_usize("ZYGO_BENCH_ROUNDS", 2);
    let bin = zygo_bin();
    println!("== zygo HTTP API benchmark ==");
    println!("reproduce: {REPRODUCE}");
    if !bin.is_file() {
        println!(
            "zygo binary: {} is missing; build it first with `cargo build --release` (or set $ZYGO_BIN)",
            bin.display()
        );
        return Ok(2);
    }
    let bin = std::fs::canonicalize(&bin).map_err(|e| e.to_string())?;
    println!(
        "zygo binary: {}; {} cpus; load {}",
        bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let dir = std::env::temp_dir().join(format!(
        "zygo-bench-api-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    ));
    let app = dir.join("app");
    std::fs::create_dir_all(&app).map_err(|e| format!("create {}: {e}", app.display()))?;
    std::fs::write(app.join("api_handler.py"), HANDLER).map_err(|e| e.to_string())?;
    let name = format!("ab{}", std::process::id());
    let toml = app.join("sandbox.toml");
    std::fs::write(
        &toml,
        format!("[fn.{name}]\nagent = \"python\"\nentry = \"api_handler.py:handler\"\nmin_warm = 2\nmax_warm = 8\n"),
    )
    .map_err(|e| e.to_string())?;
    let runtime = dir.join("run");
    let state = dir.join("state");
    let mut procs = Procs {
        sup_runtime: runtime.clone(),
        sup_state: state.clone(),
        bin: bin.clone(),
        api: None,
    };
    let out = Command::new(&bin)
        .args(["up", "-f"])
        .arg(&toml)
        .env("ZYGO_RUNTIME_DIR", &runtime)
        .env("ZYGO_STATE_DIR", &state)
        .env("ZYGO_API_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("zygo up: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "zygo up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut api = Command::new(&bin)
        .args(["api", "--listen", "127.0.0.1:0"])
        .env("ZYGO_RUNTIME_DIR", &runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("zygo api: {e}"))?;
    let stderr = api.stderr.take().ok_or("no stderr")?;
    let api_pid = api.id();
    procs.api = Some(api);
    let mut lines = BufReader::new(stderr).lines();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.map_err(|e| e.to_string())?;
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
            break;
        }
        eprintln!("zygo api: {line}");
    }
    std::thread::spawn(move || for _ in lines {});
    let addr = addr.ok_or("zygo api did not say where it listens")?;
    let sock = runtime.join("zygo.sock");
    println!(
        "zygo api: pid {api_pid} on {addr}; function {name}: {}",
        HANDLER.replace('\n', " ")
    );
    println!("zygo api RSS at start: {} kB", vm_rss_kb(api_pid));
    println!();
    println!(
        "{:>7} {:>8} {:>10} {:>10} {:>10} {:>6} {:>6}",
        "callers", "path", "calls/s", "p50 ms", "p99 ms", "busy", "failed"
    );
    // Each HTTP caller has a token of its own, as separate callers of an embedder would:
    // one credential holds at most a quarter of the front's channels.
    let tokens = mint_tokens(&bin, &runtime, LEVELS[LEVELS.len() - 1])?;
    let next_token = AtomicUsize::new(0);
    let mut p50_gap_1 = None;
    let mut http_8 = 0.0;
    let rss_max = AtomicU64::new(0);
    let mut bad = false;
    for callers in LEVELS {
        let (mut ctl, mut http) = (Vec::new(), Vec::new());
        let (mut ctl_n, mut http_n) = (0usize, 0usize);
        let (mut ctl_busy, mut http_busy, mut failed) = (0, 0, 0);
        let mut first = None;
        let (mut ctl_secs, mut http_secs) = (0.0, 0.0);
        for _ in 0..rounds {
            let c = measure(
                callers,
                secs,
                &|| Ok(Box::new(Control::connect(&sock, &name)?) as Box<dyn Caller>),
                None,
                &rss_max,
            );
            ctl_n += c.sorted.len();
            ctl_secs += c.sorted.len() as f64 / c.calls_per_s.max(1e-9);
            ctl.extend(c.sorted);
            ctl_busy += c.busy;
            failed += c.failed;
            first = first.or(c.first_failure);
            let rss_here = if callers == 32 { Some(api_pid) } else { None };
            let h = measure(
                callers,
                secs,
                &|| {
                    let t = &tokens[next_token.fetch_add(1, Ordering::Relaxed) % tokens.len()];
                    Ok(Box::new(Http::connect(&addr, &name, t)?) as Box<dyn Caller>)
                },
                rss_here,
                &rss_max,
            );
            http_n += h.sorted.len();
            http_secs += h.sorted.len() as f64 / h.calls_per_s.max(1e-9);
            http.extend(h.sorted);
            http_busy += h.busy;
            failed += h.failed;
            first = first.or(h.first_failure);
        }
        ctl.sort_unstable();
        http.sort_unstable();
        let (cps_c, cps_h) = (
            ctl_n as f64 / ctl_secs.max(1e-9),
            http_n as f64 / http_secs.max(1e-9),
        );
        println!(
            "{callers:>7} {:>8} {:>10.0} {:>10} {:>10} {:>6} {:>6}",
            "control",
            cps_c,
            ms(pct(&ctl, 0.5)),
            ms(pct(&ctl, 0.99)),
            ctl_busy,
            ""
        );
        println!(
            "{callers:>7} {:>8} {:>10.0} {:>10} {:>10} {:>6} {:>6}",
            "http",
            cps_h,
            ms(pct(&http, 0.5)),
            ms(pct(&http, 0.99)),
            http_busy,
            failed
        );
        if let Some(f) = first {
            println!("        first failure: {f}");
            bad = true;
        }
        if callers == 1 {
            p50_gap_1 = Some(pct(&http, 0.5).as_secs_f64() - pct(&ctl, 0.5).as_secs_f64());
        }
        if callers == 8 {
            http_8 = cps_h;
        }
    }
    let rss = rss_max.load(Ordering::Relaxed);
    println!();
    let gap = p50_gap_1.unwrap_or(f64::NAN) * 1000.0;
    println!(
        "HTTP adds {gap:.3} ms to the p50 of one caller (target <= 0.25): {}",
        if gap <= 0.25 { "met" } else { "NOT met" }
    );
    println!(
        "HTTP at 8 callers: {http_8:.0} calls/s (target >= 500): {}",
        if http_8 >= 500.0 { "met" } else { "NOT met" }
    );
    println!(
        "zygo api's highest RSS at 32 callers: {:.1} MB (target < 10): {}",
        rss as f64 / 1024.0,
        if rss < 10 * 1024 { "met" } else { "NOT met" }
    );
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(if bad { 1 } else { 0 })
}

/// `n` operator tokens, minted on the host (`zygo token mint --json`).
fn mint_tokens(bin: &Path, runtime: &Path, n: usize) -> R<Vec<String>> {
    (0..n)
        .map(|_| {
            let out = Command::new(bin)
                .args(["token", "mint", "--json"])
                .env("ZYGO_RUNTIME_DIR", runtime)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("zygo token mint: {e}"))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let v: serde_json::Value = text
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok())
                .ok_or_else(|| {
                    format!(
                        "zygo token mint said no JSON: {text}{}",
                        String::from_utf8_lossy(&out.stderr)
                    )
                })?;
            v["secret"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("zygo token mint: no secret in {v}"))
        })
        .collect()
}
