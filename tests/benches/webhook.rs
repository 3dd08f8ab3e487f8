//! Usage webhook benchmark: what `--usage-webhook` costs a warm call when the receiver is
//! slow. Two `zygo api` processes in front of one supervisor, one plain and one delivering
//! every call's usage record to a receiver on loopback that answers each POST after
//! 500 ms; one caller calls each back to back, alternately, `ZYGO_BENCH_ROUNDS` rounds
//! (default 3) of `ZYGO_BENCH_SECS` seconds (default 3): p50 and p99 of each, and how many
//! records the receiver got. It asserts nothing about time; it exits non-zero only when
//! something could not be measured.
//!
//! Reproduce with:
//!
//! ```text
//! cargo build --release && cargo bench -p zygo-tests --bench webhook
//! ```
//!
//! Target: no measurable difference in the p50 (the delivery runs in its own process,
//! fed through a non-blocking pipe).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const REPRODUCE: &str = "cargo build --release && cargo bench -p zygo-tests --bench webhook";
const HANDLER: &str = "def handler(event):\n    return {\"ok\": True}\n";
const TOKEN: &str = "zygo-bench-webhook-token";
const RECEIVER_DELAY: Duration = Duration::from_millis(500);

type R<T> = Result<T, String>;

fn main() {
    let code = match run() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("webhook bench: {e}");
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

/// A receiver that reads each POST and answers 200 after [`RECEIVER_DELAY`]; it counts the
/// records it was sent.
fn receiver(records: Arc<AtomicU64>) -> R<String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let records = records.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(c);
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let t = line.trim_end();
                    if t.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = t.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                let n = body.windows(12).filter(|w| w == b"\"request_id\"").count();
                std::thread::sleep(RECEIVER_DELAY);
                let mut c = r.into_inner();
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                records.fetch_add(n as u64, Ordering::Relaxed);
            });
        }
    });
    Ok(addr)
}

struct Procs {
    runtime: PathBuf,
    state: PathBuf,
    bin: PathBuf,
    apis: Vec<Child>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for api in &mut self.apis {
            // SAFETY: signalling a child this bench started.
            unsafe { libc::kill(api.id() as i32, libc::SIGTERM) };
            let _ = api.wait();
        }
        let _ = Command::new(&self.bin)
            .args(["drain", "--grace", "1s"])
            .env("ZYGO_RUNTIME_DIR", &self.runtime)
            .env("ZYGO_STATE_DIR", &self.state)
            .stdin(Stdio::null())
            .output();
    }
}

fn start_api(p: &mut Procs, extra: &[String]) -> R<String> {
    let mut api = Command::new(&p.bin)
        .args(["api", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env("ZYGO_RUNTIME_DIR", &p.runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("zygo api: {e}"))?;
    let stderr = api.stderr.take().ok_or("no stderr")?;
    p.apis.push(api);
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
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if !l.contains("usage webhook") {
                eprintln!("zygo api: {l}");
            }
        }
    });
    addr.ok_or_else(|| "zygo api did not say where it listens".into())
}

/// One caller, back to back, for `secs`: the latencies of the calls answered 200.
fn measure(addr: &str, name: &str, secs: u64, made: &AtomicU64) -> R<Vec<Duration>> {
    let w = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    w.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut wr = w.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(w);
    let head = format!(
        "POST /fn/{name} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let mut lat = Vec::new();
    let warm_until = Instant::now() + Duration::from_millis(300);
    let until = warm_until + Duration::from_secs(secs);
    loop {
        let t = Instant::now();
        if t >= until {
            break;
        }
        wr.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        let ok = line.split_whitespace().nth(1) == Some("200");
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).map_err(|e| e.to_string())?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).map_err(|e| e.to_string())?;
        made.fetch_add(1, Ordering::Relaxed);
        if !ok {
            return Err(format!("{line}: {}", String::from_utf8_lossy(&body)));
        }
        if t >= warm_until {
            lat.push(t.elapsed());
        }
    }
    Ok(lat)
}

fn run() -> R<i32> {
    let secs = env_usize("ZYGO_BENCH_SECS", 3) as u64;
    let rounds = env_usize("ZYGO_BENCH_ROUNDS", 3);
    let bin = zygo_bin();
    println!("== zygo usage webhook benchmark ==");
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
        "zygo-bench-webhook-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    ));
    let app = dir.join("app");
    std::fs::create_dir_all(&app).map_err(|e| format!("create {}: {e}", app.display()))?;
    std::fs::write(app.join("hook_handler.py"), HANDLER).map_err(|e| e.to_string())?;
    let name = format!("wh{}", std::process::id());
    let toml = app.join("sandbox.toml");
    std::fs::write(
        &toml,
        format!("[fn.{name}]\nagent = \"python\"\nentry = \"hook_handler.py:handler\"\nmin_warm = 2\nmax_warm = 4\n"),
    )
    .map_err(|e| e.to_string())?;
    let mut procs = Procs {
        runtime: dir.join("run"),
        state: dir.join("state"),
        bin: bin.clone(),
        apis: Vec::new(),
    };
    let out = Command::new(&bin)
        .args(["up", "-f"])
        .arg(&toml)
        .env("ZYGO_RUNTIME_DIR", &procs.runtime)
        .env("ZYGO_STATE_DIR", &procs.state)
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
    let records = Arc::new(AtomicU64::new(0));
    let hook = receiver(records.clone())?;
    let plain = start_api(&mut procs, &[])?;
    let with = start_api(
        &mut procs,
        &["--usage-webhook".into(), format!("http://{hook}/usage")],
    )?;
    println!(
        "receiver on {hook} answers each POST after {} ms",
        RECEIVER_DELAY.as_millis()
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (plain_made, made) = (AtomicU64::new(0), AtomicU64::new(0));
    for _ in 0..rounds {
        a.extend(measure(&plain, &name, secs, &plain_made)?);
        b.extend(measure(&with, &name, secs, &made)?);
    }
    a.sort_unstable();
    b.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!();
    println!(
        "{:>16} {:>8} {:>10} {:>10}",
        "zygo api", "calls", "p50 ms", "p99 ms"
    );
    println!(
        "{:>16} {:>8} {:>10.3} {:>10.3}",
        "plain",
        a.len(),
        ms(pct(&a, 0.5)),
        ms(pct(&a, 0.99))
    );
    println!(
        "{:>16} {:>8} {:>10.3} {:>10.3}",
        "--usage-webhook",
        b.len(),
        ms(pct(&b, 0.5)),
        ms(pct(&b, 0.99))
    );
    let gap = ms(pct(&b, 0.5)) - ms(pct(&a, 0.5));
    // Let the slow receiver catch up a little before counting what it got.
    std::thread::sleep(Duration::from_secs(2));
    println!();
    println!("the webhook adds {gap:.3} ms to the warm-call p50 (target: none measurable)");
    println!(
        "records the receiver had 2 s after the last call: {} (calls made through the webhook front, warm-up included: {}; the rest are queued, delivered at least once)",
        records.load(Ordering::Relaxed),
        made.load(Ordering::Relaxed)
    );
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(0)
}
