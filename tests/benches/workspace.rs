//! Workspace benchmark: prints the figures docs/performance.md reports for files in and
//! out of a request. It asserts nothing about time; it exits non-zero only when something
//! could not be measured.
//!
//! Reproduce with:
//!
//! ```text
//! cargo build --release && cargo bench -p zygo-tests --bench workspace
//! ```
//!
//! It runs the release `zygo` beside it (`target/x86_64-unknown-linux-gnu/release/zygo`, or
//! `$ZYGO_BIN`). What it measures:
//! - (a) the launcher's unpacker and packer alone, in this process, on a tmpfs
//!   (`/dev/shm`): a 1 MiB tar of one file, and one of 64 files of 16 KiB, unpacked into a
//!   fresh folder and that folder packed back, `ZYGO_BENCH_WS_ROUNDS` times (default 200);
//! - (b) calls through a supervisor of its own (a Python function that returns at once),
//!   on one kept connection, interleaved: the same call without a workspace, with a 1 MB
//!   workspace, and with a 1 MB workspace and out=1, `ZYGO_BENCH_WS_CALLS` each (default
//!   300, after 30 warm-ups): p50/p90 of each and the milliseconds added per MB.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proto::bytes::Bytes;
use proto::front::{
    ExecRequest, Hello, HelloReply, Outcome, Reply, Request, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME,
};
use proto::{read_frame, write_frame};
use zygo_launcher::workspace::{pack, unpack, Limits, PackLimits, MAX_DEPTH, MAX_ENTRIES};

type R<T> = Result<T, String>;

const MB: usize = 1 << 20;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn pct(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A tar of `files` files sharing `total` bytes, from the tar crate.
fn make_tar(files: usize, total: usize) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let each = total / files;
    for i in 0..files {
        let data: Vec<u8> = (0..each).map(|j| (i * 31 + j * 7) as u8).collect();
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append_data(&mut h, format!("dir{}/file{i}.bin", i % 4), &data[..])
            .expect("append");
    }
    b.into_inner().expect("finish")
}

/// (a): unpack and pack, in this process.
fn in_process(rounds: usize) -> R<()> {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let root = base.join(format!("zygo-bench-ws-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| format!("mkdir {}: {e}", root.display()))?;
    let dev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&root).map_err(|e| e.to_string())?.dev()
    };
    for (what, tar) in [
        ("1 file of 1 MiB", make_tar(1, MB)),
        ("64 files of 16 KiB", make_tar(64, MB)),
    ] {
        let mut up = Vec::new();
        let mut down = Vec::new();
        let mut packed_len = 0;
        for _ in 0..rounds {
            let w = root.join("w");
            let _ = std::fs::remove_dir_all(&w);
            std::fs::create_dir(&w).map_err(|e| e.to_string())?;
            let dir = std::fs::File::open(&w).map_err(|e| e.to_string())?;
            let t0 = Instant::now();
            unpack(
                dir.as_fd(),
                &tar,
                &Limits {
                    max_bytes: 64 * MB as u64,
                    max_entries: MAX_ENTRIES,
                    max_depth: MAX_DEPTH,
                },
            )
            .map_err(|e| format!("unpack: {e}"))?;
            up.push(t0.elapsed());
            let parent = std::fs::File::open(&root).map_err(|e| e.to_string())?;
            let t0 = Instant::now();
            let p = pack(
                parent.as_fd(),
                b"w",
                dev,
                &PackLimits {
                    max_bytes: 8 * MB,
                    max_entries: MAX_ENTRIES,
                    max_depth: MAX_DEPTH,
                },
            );
            down.push(t0.elapsed());
            packed_len = p.tar.map_or(0, |t| t.len());
        }
        let (u50, p50) = (pct(&mut up, 0.5), pct(&mut down, 0.5));
        println!(
            "(a) {what} ({} KiB tar): unpack p50 {:.3} ms ({:.0} MB/s), pack p50 {:.3} ms ({:.0} MB/s, {} KiB out); {rounds} rounds on {}",
            tar.len() / 1024,
            ms(u50),
            1.0 / u50.as_secs_f64().max(1e-9),
            ms(p50),
            1.0 / p50.as_secs_f64().max(1e-9),
            packed_len / 1024,
            base.display()
        );
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn zygo_bin() -> PathBuf {
    std::env::var_os("ZYGO_BIN").map_or_else(
        || repo_root().join("target/x86_64-unknown-linux-gnu/release/zygo"),
        PathBuf::from,
    )
}

struct Front {
    sock: UnixStream,
}

impl Front {
    fn connect(path: &Path) -> R<Front> {
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
            Ok(HelloReply::Welcome { .. }) => Ok(Front { sock }),
            Ok(HelloReply::Refused { reason }) => Err(format!("refused: {reason}")),
            Err(e) => Err(format!("hello reply: {e}")),
        }
    }

    /// One call; its wall time seen from here, and the size of the tar that came back.
    fn exec(&mut self, name: &str, workspace: Option<&Bytes>, out: bool) -> R<(Duration, usize)> {
        let req = Request::Exec(ExecRequest {
            name: name.into(),
            event: "{}".into(),
            key: None,
            timeout_ms: None,
            stream: false,
            script: None,
            workspace: workspace.cloned(),
            workspace_blob: None,
            out,
        });
        let t0 = Instant::now();
        write_frame(&mut self.sock, &req).map_err(|e| format!("send: {e}"))?;
        let reply = read_frame::<_, Reply>(&mut self.sock, MAX_FRONT_FRAME)
            .map_err(|e| format!("receive: {e}"))?;
        let took = t0.elapsed();
        match reply {
            Reply::Answer(a) if a.outcome == Outcome::Ok => {
                Ok((took, a.workspace_out.map_or(0, |t| t.len())))
            }
            Reply::Answer(a) => Err(format!("{}: {:?}", a.outcome.as_str(), a.error)),
            other => Err(format!("{other:?}")),
        }
    }
}

/// (b): calls through a supervisor.
fn calls(n: usize) -> R<()> {
    let bin = zygo_bin();
    if !bin.is_file() {
        return Err(format!(
            "no zygo at {}: cargo build --release first (or set ZYGO_BIN)",
            bin.display()
        ));
    }
    let dir = std::env::temp_dir().join(format!("zygo-bench-wscall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("fn")).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("fn/h.py"), "def handler(event):\n    return 1\n")
        .map_err(|e| e.to_string())?;
    let toml = dir.join("sandbox.toml");
    std::fs::write(
        &toml,
        "[fn.wsbench]\nagent = \"python\"\nentry = \"fn/h.py:handler\"\nmin_warm = 1\nmax_warm = 1\nscratch = \"64M\"\n",
    )
    .map_err(|e| e.to_string())?;
    let run = dir.join("run");
    let state = dir.join("state");
    let zygo = |args: &[&str]| {
        Command::new(&bin)
            .args(args)
            .env("ZYGO_RUNTIME_DIR", &run)
            .env("ZYGO_STATE_DIR", &state)
            .stdin(Stdio::null())
            .output()
    };
    let up = zygo(&["up", "-f", toml.to_str().unwrap_or_default()])
        .map_err(|e| format!("run zygo up: {e}"))?;
    let result = (|| {
        if !up.status.success() {
            return Err(format!(
                "zygo up failed: {}{}",
                String::from_utf8_lossy(&up.stdout),
                String::from_utf8_lossy(&up.stderr)
            ));
        }
        let mut f = Front::connect(&run.join("zygo.sock"))?;
        let ws = Bytes(make_tar(16, 1_000_000));
        let mut plain = Vec::new();
        let mut with_in = Vec::new();
        let mut with_both = Vec::new();
        let mut out_len = 0;
        for i in 0..30 + n {
            let a = f.exec("wsbench", None, false)?.0;
            let b = f.exec("wsbench", Some(&ws), false)?.0;
            let (c, len) = f.exec("wsbench", Some(&ws), true)?;
            out_len = len;
            if i >= 30 {
                plain.push(a);
                with_in.push(b);
                with_both.push(c);
            }
        }
        let (a50, a90) = (pct(&mut plain, 0.5), pct(&mut plain, 0.9));
        let (b50, b90) = (pct(&mut with_in, 0.5), pct(&mut with_in, 0.9));
        let (c50, c90) = (pct(&mut with_both, 0.5), pct(&mut with_both, 0.9));
        let mbs = ws.len() as f64 / 1e6;
        println!(
            "(b) {n} calls each, interleaved, one connection; workspace {} bytes (16 files), out {} bytes",
            ws.len(),
            out_len
        );
        println!(
            "    no workspace:            p50 {:.3} ms  p90 {:.3} ms",
            ms(a50),
            ms(a90)
        );
        println!(
            "    1 MB workspace:          p50 {:.3} ms  p90 {:.3} ms  (+{:.2} ms per MB)",
            ms(b50),
            ms(b90),
            (ms(b50) - ms(a50)) / mbs
        );
        println!(
            "    1 MB workspace, out=1:   p50 {:.3} ms  p90 {:.3} ms  (+{:.2} ms per MB in and out)",
            ms(c50),
            ms(c90),
            (ms(c50) - ms(a50)) / mbs
        );
        Ok(())
    })();
    let _ = zygo(&["drain", "--grace", "1s"]);
    std::thread::sleep(Duration::from_millis(500));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn main() {
    // `cargo bench` passes --bench; nothing else is taken.
    let rounds = env_usize("ZYGO_BENCH_WS_ROUNDS", 200);
    let n = env_usize("ZYGO_BENCH_WS_CALLS", 300);
    println!(
        "workspace bench: {} cpus, load {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut failed = false;
    if let Err(e) = in_process(rounds) {
        eprintln!("(a) could not be measured: {e}");
        failed = true;
    }
    if let Err(e) = calls(n) {
        eprintln!("(b) could not be measured: {e}");
        failed = true;
    }
    if failed {
        std::process::exit(1);
    }
}
