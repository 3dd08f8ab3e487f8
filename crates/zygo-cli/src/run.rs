//! `zygo run`: one program in a fresh one-shot sandbox, with the monitor embedded.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::Path;

use plumbing::pump::is_dev_null;
use policy::limits::Mem;
use policy::plan::OneShotArgs;
use proto::launch::Phase;
use zygo_monitor::cgroup::{self, Backend};
use zygo_monitor::oneshot::{self, Outcome, Output, Request, Stdin};

use crate::flags::{self, text};
use crate::output::clean;
use crate::{usage, usage_error};

/// The flags of `zygo run` that take a value.
const VALUED: [&str; 13] = [
    "mem", "cpu", "pids", "timeout", "scratch", "io-bps", "io-iops", "net", "allow", "image",
    "mount", "env", "stdin",
];

struct Opts {
    args: OneShotArgs,
    stdin: Option<OsString>,
    json: bool,
}

fn parse(raw: Vec<OsString>) -> Result<Option<Opts>, String> {
    use lexopt::prelude::*;
    let mut o = Opts {
        args: OneShotArgs::default(),
        stdin: None,
        json: false,
    };
    let mut p = lexopt::Parser::from_args(raw);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Long("help") | Short('h') => return Ok(None),
            Long("json") => o.json = true,
            Long("inotify") => o.args.inotify = true,
            Long(
                flag @ ("mem" | "cpu" | "pids" | "timeout" | "scratch" | "io-bps" | "io-iops"
                | "net" | "image" | "mount" | "env"),
            ) => {
                let flag = flag.to_string();
                let v = text(p.value().map_err(|e| e.to_string())?, &flag)?;
                flags::set(&mut o.args, &flag, v)?;
            }
            Long("allow") => o
                .args
                .allow
                .push(text(p.value().map_err(|e| e.to_string())?, "allow")?),
            Long("stdin") => o.stdin = Some(p.value().map_err(|e| e.to_string())?),
            Value(v) => {
                o.args.argv.push(text(v, "command")?);
                for rest in p.raw_args().map_err(|e| e.to_string())? {
                    o.args.argv.push(text(rest, "command")?);
                }
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(Some(o))
}

pub fn main(raw: Vec<OsString>) -> i32 {
    keep_freed_memory();
    let json = crate::asks_json(&raw, &VALUED, true);
    let opts = match parse(raw) {
        Ok(Some(o)) => o,
        Ok(None) => {
            say_raw!("{}", usage::RUN);
            return 0;
        }
        Err(e) => return usage_refusal(json, e),
    };
    let plan = match policy::plan::one_shot(&opts.args) {
        Ok(p) => p,
        Err(e) => return usage_refusal(opts.json, e.to_string()),
    };
    let mem_text = match plan.limits.mem {
        Mem::Limited(b) => b.to_string(),
        Mem::Unlimited => "unlimited".into(),
    };
    let timeout_text = policy::limits::Dur(plan.limits.timeout).to_string();
    let refuse = |phase: Phase, why: String| {
        let out = Outcome {
            phase: Some(phase),
            error: Some(why),
            ..Outcome::default()
        };
        report(&out, opts.json, &mem_text, &timeout_text)
    };
    let (launch, limits) = match oneshot::launch_plan(&plan) {
        Ok(x) => x,
        Err(why) => return refuse(Phase::Plan, why),
    };
    // A regular file or a pipe reaches the program as it is; a terminal or a device is
    // copied through a pipe (see `Stdin`); a directory or a socket is refused.
    let stdin = match &opts.stdin {
        Some(path) => match Stdin::open(Path::new(path)) {
            Ok(s) => s,
            Err(why) => return refuse(Phase::Plan, format!("--stdin {why}")),
        },
        None if opts.json => Stdin::Null,
        None if std::io::stdin().is_terminal() => Stdin::Forward,
        // Nothing to forward from /dev/null: the program gets its own (no copying thread).
        None if is_dev_null(libc::STDIN_FILENO) => Stdin::Null,
        None => Stdin::Forward,
    };
    let launcher = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return refuse(Phase::Plan, format!("find the zygo binary: {e}")),
    };
    let req = Request {
        plan: launch,
        limits,
        stdin,
        output: if opts.json {
            Output::Capture
        } else {
            Output::PassThrough
        },
        launcher,
        cancel: None,
        fresh: Vec::new(),
        tee: None,
    };
    // Where cgroup v2 may hold Zygo's tree, Zygo enters it before it starts any process: it
    // may have to move itself into a leaf first, which only works while it is alone. A v1
    // tree needs no move, so there the launcher starts up and creates the sandbox's
    // namespaces while this process finds its hierarchies.
    let early = if cgroup::v2_possible() {
        match Backend::detect() {
            Ok(b) => Some(b),
            Err(e) => return refuse(Phase::Plan, e.to_string()),
        }
    } else {
        None
    };
    let started = match oneshot::start(req) {
        Ok(s) => s,
        Err(out) => return report(&out, opts.json, &mem_text, &timeout_text),
    };
    let backend = match early.map_or_else(Backend::detect, Ok) {
        Ok(b) => b,
        Err(e) => {
            let out = started.abandon(Outcome {
                phase: Some(Phase::Plan),
                error: Some(e.to_string()),
                ..Outcome::default()
            });
            return report(&out, opts.json, &mem_text, &timeout_text);
        }
    };
    // Cgroups left by killed monitors are swept while the program runs.
    let out = started.finish(&backend, || backend.sweep_stale_runs());
    let code = report(&out, opts.json, &mem_text, &timeout_text);
    backend.release_root();
    code
}

/// A usage error, answered as `--json` asked: with it, the object every `zygo run --json`
/// prints (`started` false, `phase` "plan", the reason in `error`) with `code`
/// "bad_request"; without, one line on stderr. Exit code 2 either way.
fn usage_refusal(json: bool, why: String) -> i32 {
    if !json {
        return usage_error("run", why);
    }
    let out = Outcome {
        phase: Some(Phase::Plan),
        error: Some(why),
        ..Outcome::default()
    };
    let mut v = answer(&out, "", "");
    v["code"] = serde_json::json!("bad_request");
    say!("{}", crate::output::json(&v));
    2
}

/// This process lives for one sandbox, so memory it frees is better kept than handed back
/// to the kernel: each return (the heap shrunk, a large buffer unmapped) flushes the TLB of
/// every CPU the process ran on, which in a VM cost ~0.1 ms at the end of every run. glibc
/// is told never to shrink the heap and to serve allocations up to 32 MiB from it (its
/// largest setting; the biggest here are the 1 MiB output buffers).
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; it is called before this process
    // starts any thread.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

/// Why a started program was killed, in words; None when it ended by itself.
fn kill_reason(out: &Outcome, mem: &str, timeout: &str) -> Option<String> {
    if out.timed_out {
        Some(format!("exceeded its {timeout} time limit"))
    } else if out.oom_killed {
        Some(format!("ran out of memory (limit {mem})"))
    } else {
        out.signal.map(|s| format!("terminated by signal {s}"))
    }
}

fn report(out: &Outcome, json: bool, mem: &str, timeout: &str) -> i32 {
    let code = if out.started && out.error.is_none() {
        out.exit_code.unwrap_or(1)
    } else {
        1
    };
    if !json && out.output_dropped > 0 {
        // Said only if stderr takes it now: it may be the very pipe nobody reads.
        tell(&format!(
            "zygo: {} bytes of the program's output were dropped: zygo's output was not read \
             once the sandbox had been ended",
            out.output_dropped
        ));
    }
    if json {
        say!("{}", crate::output::json(&answer(out, mem, timeout)));
    } else if let Some(err) = &out.error {
        let phase = out.phase.unwrap_or(Phase::Start);
        let what = match phase {
            Phase::Plan => "refused",
            Phase::Start => "could not start the sandbox",
            Phase::Run => "sandbox failed",
        };
        eprintln!("zygo: {what}: {}", clean(err));
    } else if let Some(why) = kill_reason(out, mem, timeout) {
        if out.output_dropped > 0 {
            tell(&format!("zygo: killed: {why}"));
        } else {
            eprintln!("zygo: killed: {why}");
        }
    }
    code
}

/// One line on stderr if it has room for it now, else nothing: after output was dropped
/// for want of a reader, zygo does not wait on that reader to say so (the exit status
/// says the rest).
fn tell(line: &str) {
    let mut p = libc::pollfd {
        fd: libc::STDERR_FILENO,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let ready = unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLOUT != 0;
    if ready {
        eprintln!("{line}");
    }
}

/// The object `zygo run --json` prints.
fn answer(out: &Outcome, mem: &str, timeout: &str) -> serde_json::Value {
    let phase = out.phase.unwrap_or(Phase::Run).as_str();
    serde_json::json!({
        "started": out.started,
        "phase": phase,
        "error": out.error,
        "exit_code": out.exit_code,
        "signal": out.signal,
        "timed_out": out.timed_out,
        "oom_killed": out.oom_killed,
        "kill_reason": if out.started { kill_reason(out, mem, timeout) } else { None },
        "peak_rss_kb": out.peak_rss_kb,
        "wall_ms": proto::front::ms(out.wall_us),
        "cpu_ms": proto::front::ms(out.cpu_us),
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stdout_truncated": out.stdout_truncated,
        "stderr": String::from_utf8_lossy(&out.stderr),
        "stderr_truncated": out.stderr_truncated,
    })
}
