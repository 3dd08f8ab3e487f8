//! `zygo deps`: dependency sets on this host, built with the monitor embedded (as
//! `zygo run` is), under this user's state directory.

use std::ffi::OsString;
use std::path::Path;

use serde_json::json;
use zygo_monitor::cgroup::Backend;
use zygo_monitor::deps::{self, Claim, Inputs, Record, State};

use crate::output::clean;
use crate::{usage, usage_refusal};

pub fn main(raw: Vec<OsString>) -> i32 {
    use lexopt::prelude::*;
    let json = crate::asks_json(&raw, &[], false);
    let mut positional: Vec<String> = Vec::new();
    let mut p = lexopt::Parser::from_args(raw);
    loop {
        let arg = match p.next() {
            Ok(Some(a)) => a,
            Ok(None) => break,
            Err(e) => return usage_refusal(json, "deps", e),
        };
        match arg {
            Long("help") | Short('h') => {
                say_raw!("{}", usage::DEPS);
                return 0;
            }
            Long("json") => {}
            Value(v) => match v.into_string() {
                Ok(s) => positional.push(s),
                Err(_) => return usage_refusal(json, "deps", "an argument is not UTF-8"),
            },
            other => return usage_refusal(json, "deps", other.unexpected()),
        }
    }
    let state_dir = plumbing::paths::state_dir();
    match positional.split_first() {
        Some((verb, rest)) if verb == "build" => build(json, &state_dir, rest),
        Some((verb, [id])) if verb == "show" => show(json, &state_dir, id),
        Some((verb, [])) if verb == "ls" => ls(json, &state_dir),
        _ => usage_refusal(
            json,
            "deps",
            "usage: zygo deps build IMAGE FILE..., zygo deps show ID or zygo deps ls",
        ),
    }
}

fn build(json: bool, state_dir: &Path, rest: &[String]) -> i32 {
    let Some((image, files)) = rest.split_first() else {
        return usage_refusal(json, "deps", "usage: zygo deps build IMAGE FILE...");
    };
    let mut sent = Vec::new();
    for f in files {
        let path = Path::new(f);
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            return usage_refusal(json, "deps", format!("{f} names no file"));
        };
        match std::fs::metadata(path) {
            Ok(m) if m.len() > deps::MAX_FILE as u64 => {
                return usage_refusal(
                    json,
                    "deps",
                    format!("{f} is larger than {} bytes", deps::MAX_FILE),
                )
            }
            Ok(_) => {}
            Err(e) => return usage_refusal(json, "deps", format!("{f}: {e}")),
        }
        match std::fs::read(path) {
            Ok(b) => sent.push((name.to_string(), b)),
            Err(e) => return usage_refusal(json, "deps", format!("{f}: {e}")),
        }
    }
    let inputs = match Inputs::new(image, sent) {
        Ok(i) => i,
        Err(e) => return usage_refusal(json, "deps", e),
    };
    let launcher = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return refused(json, &format!("find the zygo binary: {e}")),
    };
    let rec = match deps::claim(state_dir, &inputs) {
        Ok(Claim::Build(lock, _)) => {
            let backend = match Backend::detect() {
                Ok(b) => b,
                Err(e) => return refused(json, &e.to_string()),
            };
            if !json {
                eprintln!("zygo: building {} ...", inputs.id());
            }
            let follower =
                (!json).then(|| follow_log(deps::dir(state_dir, &inputs.id()).join("build.log")));
            let rec = deps::build(
                state_dir,
                &inputs,
                lock,
                launcher,
                &backend,
                None,
                &deps::Narrowing::default(),
            );
            backend.release_root();
            if let Some(f) = follower {
                f.finish();
            }
            return report(json, state_dir, &rec, !json);
        }
        Ok(Claim::Exists(rec)) if rec.state == State::Building => {
            // Another process builds it: its outcome is this one's.
            if !json {
                eprintln!(
                    "zygo: {} is being built by another process; its log:",
                    rec.id
                );
            }
            let follower =
                (!json).then(|| follow_log(deps::dir(state_dir, &rec.id).join("build.log")));
            let waited = deps::Lock::wait_for(&deps::dir(state_dir, &rec.id));
            if let Some(f) = follower {
                f.finish();
            }
            if let Err(e) = waited {
                return refused(json, &e);
            }
            let rec = match deps::status(state_dir, &rec.id) {
                Ok(Some(r)) => r,
                Ok(None) => return refused(json, "the set disappeared while it was built"),
                Err(e) => return refused(json, &e),
            };
            return report(json, state_dir, &rec, !json);
        }
        Ok(Claim::Exists(rec)) => rec,
        Err(e) => return refused(json, &e),
    };
    report(json, state_dir, &rec, false)
}

/// A thread printing a build's log on stderr as it grows (terminal escapes shown
/// escaped), until [`Follower::finish`] prints what is left and stops it.
struct Follower {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Follower {
    fn finish(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

/// Follow `path` by name from its start: the log is replaced at the end of the build by
/// the whole of it, with the same beginning and Zygo's last lines after it.
fn follow_log(path: std::path::PathBuf) -> Follower {
    use std::io::{Read, Seek, SeekFrom};
    use std::sync::atomic::Ordering;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let mut shown: u64 = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // The last pass runs after the build has ended, so what it wrote last is shown.
            let last = flag.load(Ordering::SeqCst);
            if let Ok(mut f) = std::fs::File::open(&path) {
                if f.seek(SeekFrom::Start(shown)).is_ok() {
                    while let Ok(n) = f.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        shown += n as u64;
                        eprint!("{}", clean(&String::from_utf8_lossy(&buf[..n])));
                    }
                }
            }
            if last {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    });
    Follower { stop, thread }
}

fn show(json: bool, state_dir: &Path, id: &str) -> i32 {
    if !deps::is_id(id) {
        return usage_refusal(
            json,
            "deps",
            format!("{id:?} is not a dependency set's id (deps_ and 64 hex digits)"),
        );
    }
    match deps::status(state_dir, id) {
        Ok(Some(rec)) => report(json, state_dir, &rec, false),
        Ok(None) => {
            let msg = format!("no dependency set {id} on this host");
            if json {
                say!(
                    "{}",
                    crate::output::json(&json!({"code": "not_found", "error": msg}))
                );
            } else {
                eprintln!("zygo: {msg}");
            }
            1
        }
        Err(e) => refused(json, &e),
    }
}

fn ls(json: bool, state_dir: &Path) -> i32 {
    let mut sets = Vec::new();
    for id in deps::list(state_dir) {
        if let Ok(Some(rec)) = deps::status(state_dir, &id) {
            sets.push(rec);
        }
    }
    if json {
        let v: Vec<_> = sets.iter().map(record_json).collect();
        say!("{}", crate::output::json(&json!({ "deps": v })));
    } else {
        for r in &sets {
            say!(
                "{}  {:<8}  {:<6}  {}",
                r.id,
                r.state.as_str(),
                r.kind.as_str(),
                clean(&r.image)
            );
        }
    }
    0
}

fn record_json(r: &Record) -> serde_json::Value {
    json!({
        "id": r.id,
        "image": r.image,
        "kind": r.kind.as_str(),
        "state": r.state.as_str(),
        "building": r.state == State::Building,
        "error": r.error,
    })
}

/// A set's state: its id on stdout (and, failed, its reason and log on stderr; building,
/// its log so far); exit 0 unless it failed. `log_shown`: the log was printed as it grew.
fn report(json: bool, state_dir: &Path, rec: &Record, log_shown: bool) -> i32 {
    let log = if rec.state != State::Ready {
        deps::read_log(state_dir, &rec.id)
    } else {
        String::new()
    };
    if json {
        let mut v = record_json(rec);
        if rec.state != State::Ready {
            v["log"] = json!(log);
        }
        say!("{}", crate::output::json(&v));
    } else {
        match rec.state {
            State::Failed => {
                if !log_shown {
                    eprint!("{}", clean(&log));
                }
                eprintln!(
                    "zygo: the dependency set {} failed: {}",
                    rec.id,
                    clean(rec.error.as_deref().unwrap_or("no reason recorded"))
                );
            }
            State::Building => {
                eprint!("{}", clean(&log));
                eprintln!(
                    "zygo: {} is still building (its log so far is above)",
                    rec.id
                )
            }
            State::Ready => {}
        }
        say!("{}", rec.id);
    }
    i32::from(rec.state == State::Failed)
}

fn refused(json: bool, why: &str) -> i32 {
    if json {
        say!(
            "{}",
            crate::output::json(&json!({"code": "internal", "error": why}))
        );
    } else {
        eprintln!("zygo deps: {}", clean(why));
    }
    1
}
