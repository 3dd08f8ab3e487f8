//! The commands that talk to the supervisor: up, supervisor, serve, stop, exec, ls, logs,
//! stats, warm, cancel, drain, token, secrets.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proto::front::{ExecAnswer, ExecEvent, ExecRequest, Outcome, Reply, Request};
use serde_json::json;

use crate::client::{Client, ConnectError};
use crate::output::{clean, json as json_text};
use crate::{usage, usage_refusal};

/// Common flags: `--json`, `--help`, plus whatever the command takes.
struct Args {
    json: bool,
    positional: Vec<String>,
    flags: Vec<(String, String)>,
    switches: Vec<String>,
}

/// Parse with lexopt; `valued` flags take a value, `switches` do not.
fn parse(
    cmd: &str,
    raw: Vec<OsString>,
    valued: &[&str],
    switches: &[&str],
) -> Result<Option<Args>, i32> {
    use lexopt::prelude::*;
    let json = crate::asks_json(&raw, valued, false);
    let mut a = Args {
        json: false,
        positional: Vec::new(),
        flags: Vec::new(),
        switches: Vec::new(),
    };
    let mut p = lexopt::Parser::from_args(raw);
    loop {
        let arg = match p.next() {
            Ok(Some(a)) => a,
            Ok(None) => break,
            Err(e) => return Err(usage_refusal(json, cmd, e)),
        };
        match arg {
            Long("help") | Short('h') => return Ok(None),
            Long("json") => a.json = true,
            Long(f) if valued.contains(&f) => {
                let f = f.to_string();
                match p.value().map(|v| v.into_string()) {
                    Ok(Ok(v)) => a.flags.push((f, v)),
                    Ok(Err(_)) => {
                        return Err(usage_refusal(
                            json,
                            cmd,
                            format!("--{f} is not valid UTF-8"),
                        ))
                    }
                    Err(e) => return Err(usage_refusal(json, cmd, e)),
                }
            }
            Short(c) if valued.contains(&c.to_string().as_str()) => {
                match p.value().map(|v| v.into_string()) {
                    Ok(Ok(v)) => a.flags.push((c.to_string(), v)),
                    Ok(Err(_)) => {
                        return Err(usage_refusal(json, cmd, format!("-{c} is not valid UTF-8")))
                    }
                    Err(e) => return Err(usage_refusal(json, cmd, e)),
                }
            }
            Long(f) if switches.contains(&f) => a.switches.push(f.to_string()),
            Short(c) if switches.contains(&c.to_string().as_str()) => {
                a.switches.push(c.to_string())
            }
            Value(v) => match v.into_string() {
                Ok(s) => a.positional.push(s),
                Err(_) => return Err(usage_refusal(json, cmd, "an argument is not valid UTF-8")),
            },
            other => return Err(usage_refusal(json, cmd, other.unexpected())),
        }
    }
    Ok(Some(a))
}

impl Args {
    fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.as_str())
    }
    fn has(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }
}

/// Connect to the supervisor, or answer (as `--json` asked) why not: exit code 1.
fn connect(json: bool) -> Result<Client, i32> {
    Client::connect().map_err(|e| refused(json, e.code(), &e.to_string()))
}

/// Print a refusal as one line (or JSON) and return exit code 1.
fn refused(json: bool, code: &str, message: &str) -> i32 {
    refused_retry(json, code, message, None)
}

fn refused_retry(json: bool, code: &str, message: &str, retry_after: Option<u32>) -> i32 {
    if json {
        let mut v = json!({"error": message, "code": code});
        if let Some(s) = retry_after {
            v["retry_after"] = json!(s);
        }
        say!("{}", json_text(&v));
    } else {
        let message = clean(message);
        match retry_after {
            Some(s) => eprintln!("zygo: {message} (retry after {s}s)"),
            None => eprintln!("zygo: {message}"),
        }
    }
    1
}

fn call(json: bool, req: &Request) -> Result<Reply, i32> {
    let mut c = connect(json)?;
    match c.call(req, |_| {}) {
        Ok(Reply::Error {
            code,
            message,
            retry_after,
        }) => Err(refused_retry(json, code.as_str(), &message, retry_after)),
        Ok(r) => Ok(r),
        Err(e) => Err(refused(json, "internal", &e)),
    }
}

/// Say on stderr what is wrong with the supervisor itself, if anything (after `ls` and
/// `stats`, where an operator looks). Quiet when it cannot tell (an older supervisor).
fn warn_if_degraded() {
    let Ok(mut c) = connect(true) else {
        return;
    };
    let Ok(Reply::Health(h)) = c.call(&Request::Health, |_| {}) else {
        return;
    };
    let u = &h.usage_log;
    if let Some(e) = &u.error {
        eprintln!(
            "zygo: warning: the usage log cannot be written ({}): {} record(s) are held in memory and will be written when it can be",
            clean(e),
            u.held
        );
    }
    if u.dropped > 0 {
        eprintln!(
            "zygo: warning: {} usage record(s) were dropped (too many held while the usage log could not be written)",
            u.dropped
        );
    }
}

fn sandbox_file(flag: Option<&str>, required: bool) -> Result<Option<PathBuf>, String> {
    let p = match flag {
        Some(f) => PathBuf::from(f),
        None => {
            let d = PathBuf::from("sandbox.toml");
            if !d.exists() {
                return if required {
                    Err("no sandbox.toml here; name one with -f FILE".into())
                } else {
                    Ok(None)
                };
            }
            d
        }
    };
    std::fs::canonicalize(&p)
        .map(Some)
        .map_err(|e| format!("{}: {e}", p.display()))
}

// --- supervisor / up -------------------------------------------------------------------

pub fn supervisor(raw: Vec<OsString>) -> i32 {
    match parse("supervisor", raw, &[], &[]) {
        Ok(Some(_)) => {}
        Ok(None) => {
            say_raw!("{}", usage::SUPERVISOR);
            return 0;
        }
        Err(c) => return c,
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("zygo supervisor: find the zygo binary: {e}");
            return 1;
        }
    };
    match zygo_monitor::supervisor::Supervisor::new(exe).and_then(|s| s.run()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("zygo supervisor: {e}");
            1
        }
    }
}

fn start_supervisor() -> Result<PathBuf, String> {
    use std::os::unix::process::CommandExt;
    // Enter the cgroup tree first, so that the supervisor starts inside it (on cgroup v2 a
    // process may leave the base cgroup for a leaf only while it is alone there).
    zygo_monitor::cgroup::Backend::detect().map_err(|e| e.to_string())?;
    let state = plumbing::paths::state_dir();
    plumbing::paths::make_private_dir(&state)
        .map_err(|e| format!("create {}: {e}", state.display()))?;
    let log_path = state.join("supervisor.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("open {}: {e}", log_path.display()))?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| format!("find the zygo binary: {e}"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("supervisor")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2)
        .current_dir("/");
    if std::env::var_os("ZYGO_LOG").is_none() {
        cmd.env("ZYGO_LOG", "info");
    }
    // SAFETY: setsid only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("start the supervisor: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if Client::connect().is_ok() {
            return Ok(log_path);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = text.lines().last().unwrap_or("").to_string();
            return Err(format!(
                "the supervisor exited ({status}): {last} (log: {})",
                log_path.display()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the supervisor did not start within 15s (log: {})",
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn print_served(json: bool, r: Reply) -> i32 {
    let Reply::Served { served, failed } = r else {
        return refused(json, "internal", "unexpected reply");
    };
    if json {
        let failed: Vec<_> = failed
            .iter()
            .map(|(n, e)| json!({"name": n, "error": e}))
            .collect();
        say!(
            "{}",
            json_text(&json!({"served": served, "failed": failed}))
        );
    } else {
        for s in &served {
            say!("serving {}", clean(s));
        }
        for (n, e) in &failed {
            eprintln!("zygo: {} failed to serve: {}", clean(n), clean(e));
        }
    }
    if failed.is_empty() {
        0
    } else {
        1
    }
}

/// The bootstrap token is read by the supervisor when it starts. With `ZYGO_API_TOKEN` set
/// here and a supervisor already running, ask it (as the API front would, with this token)
/// whether it knows the token: `Some(what to do)` when it does not, `None` when it does, or
/// when it cannot tell.
fn token_not_taken(file: Option<&Path>) -> Option<String> {
    let token = std::env::var("ZYGO_API_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())?;
    let mut sock = plumbing::client::connect().ok()?;
    plumbing::hello::say(&mut sock, proto::front::Role::Api, Default::default()).ok()?;
    let probe = Request::Api {
        who: proto::api::Credentials {
            token: Some(token),
            tenant: None,
        },
        request: Box::new(Request::Version),
    };
    proto::write_frame(&mut sock, &probe).ok()?;
    let reply = proto::read_frame::<_, Reply>(&mut sock, proto::front::MAX_FRONT_FRAME).ok()?;
    let Reply::Error {
        code: proto::front::ErrorCode::Unauthorized,
        ..
    } = reply
    else {
        return None;
    };
    let again = match file {
        Some(f) => format!("zygo up -f {}", f.display()),
        None => "zygo up".to_string(),
    };
    Some(format!(
        "a supervisor is already running, started without this ZYGO_API_TOKEN (with another, or none), and it reads the token only when it starts: `zygo api` in front of it would answer 401 to this one. Nothing was changed. To use this token, restart the supervisor with it exported: `zygo drain`, then `{again}` (tokens minted with `zygo token mint`, tenants, secrets and scripts are kept; functions are served again by `zygo up -f`); or unset ZYGO_API_TOKEN to keep the supervisor as it is"
    ))
}

/// The most `zygo up` waits for dependency sets to build (a build's own limit is 15
/// minutes).
const UP_WAITS_FOR_SETS: Duration = Duration::from_secs(20 * 60);

/// Whether a function failed to serve only because its dependency set is still building
/// (the supervisor's refusal says so, and is retried once the set is ready).
fn waits_for_a_set(error: &str) -> bool {
    error.contains("is still building; serve this again once it is ready")
}

pub fn up(raw: Vec<OsString>) -> i32 {
    let a = match parse("up", raw, &["f", "file"], &["no-wait"]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::UP);
            return 0;
        }
        Err(c) => return c,
    };
    let file = match sandbox_file(a.flag("f").or(a.flag("file")), false) {
        Ok(f) => f,
        Err(e) => return refused(a.json, "bad_spec", &e),
    };
    // A file that cannot be served is refused before any supervisor is started for it.
    if let Some(f) = &file {
        match crate::sandbox_file::read(f) {
            Err(e) => return refused(a.json, "bad_spec", &e),
            Ok((path, parsed)) if parsed.functions.is_empty() => {
                let e = format!("{} has no [fn.*] tables", path.display());
                return refused(a.json, "bad_spec", &e);
            }
            Ok(_) => {}
        }
    }
    match Client::connect() {
        Ok(_) => {
            // What this `zygo up` was asked to bring that a running supervisor cannot take
            // on: said, with how to restart it, and nothing is changed.
            if let Some(why) = token_not_taken(file.as_deref()) {
                return refused(a.json, "conflict", &why);
            }
            if !a.json {
                say!("a supervisor is already running");
            }
        }
        Err(ConnectError::NotRunning(_)) => match start_supervisor() {
            Ok(log) => {
                if !a.json {
                    say!("supervisor started; its log is {}", log.display());
                }
            }
            Err(e) => return refused(a.json, "internal", &e),
        },
        Err(e) => return refused(a.json, e.code(), &e.to_string()),
    }
    let Some(file) = file else {
        if a.json {
            say!("{}", json_text(&json!({"served": [], "failed": []})));
        }
        return 0;
    };
    let serve_all = Request::ServeAll {
        file: file.display().to_string(),
    };
    let no_wait = a.switches.iter().any(|s| s == "no-wait");
    let t0 = Instant::now();
    loop {
        let r = match call(a.json, &serve_all) {
            Ok(r) => r,
            Err(c) => return c,
        };
        // A function whose dependency set is still building is served again once the set
        // is ready (the build runs in the supervisor): waited for, unless --no-wait.
        let building: Vec<String> = match &r {
            Reply::Served { failed, .. } => failed
                .iter()
                .filter(|(_, e)| waits_for_a_set(e))
                .map(|(n, _)| n.clone())
                .collect(),
            _ => Vec::new(),
        };
        if building.is_empty() || no_wait || t0.elapsed() > UP_WAITS_FOR_SETS {
            return print_served(a.json, r);
        }
        if !a.json {
            eprintln!(
                "zygo up: {} waiting for {} dependency set to build ({}s so far; \
                 `zygo deps show ID` shows its log; --no-wait returns at once)",
                building
                    .iter()
                    .map(|n| clean(n))
                    .collect::<Vec<_>>()
                    .join(", "),
                if building.len() == 1 { "its" } else { "their" },
                t0.elapsed().as_secs()
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

pub fn serve(raw: Vec<OsString>) -> i32 {
    let a = match parse("serve", raw, &["f", "file", "secret"], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::SERVE);
            return 0;
        }
        Err(c) => return c,
    };
    let [name] = a.positional.as_slice() else {
        return usage_refusal(
            a.json,
            "serve",
            "name exactly one function: zygo serve NAME [-f sandbox.toml]",
        );
    };
    // --secret NAME=VALUE, or --secret NAME for the value of $NAME. No message repeats a
    // value.
    let mut secrets = Vec::new();
    for (f, v) in &a.flags {
        if f != "secret" {
            continue;
        }
        let (n, value) = match v.split_once('=') {
            Some((n, value)) => (n, value.as_bytes().to_vec()),
            None => match std::env::var_os(v) {
                Some(x) if proto::api::is_secret_name(v) => (v.as_str(), x.into_encoded_bytes()),
                _ if proto::api::is_secret_name(v) => {
                    return usage_refusal(
                        a.json,
                        "serve",
                        format!("--secret {v}: ${v} is not set (or give --secret {v}=VALUE)"),
                    )
                }
                _ => ("", Vec::new()),
            },
        };
        if !proto::api::is_secret_name(n) {
            return usage_refusal(
                a.json,
                "serve",
                "--secret takes NAME=VALUE or NAME (the value of $NAME); a name is 1 to 64 letters, digits and _, not starting with a digit",
            );
        }
        if value.len() > proto::api::MAX_SECRET_VALUE {
            return usage_refusal(
                a.json,
                "serve",
                format!(
                    "--secret {n}: the value is larger than {} bytes",
                    proto::api::MAX_SECRET_VALUE
                ),
            );
        }
        secrets.push((n.to_string(), proto::api::SecretValue(value)));
    }
    let file = match sandbox_file(a.flag("f").or(a.flag("file")), true) {
        Ok(Some(f)) => f,
        Ok(None) => return refused(a.json, "bad_spec", "no sandbox.toml"),
        Err(e) => return refused(a.json, "bad_spec", &e),
    };
    match call(
        a.json,
        &Request::Serve {
            name: name.clone(),
            file: file.display().to_string(),
            secrets,
        },
    ) {
        Ok(r) => print_served(a.json, r),
        Err(c) => c,
    }
}

pub fn stop(raw: Vec<OsString>) -> i32 {
    let a = match parse("stop", raw, &[], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::STOP);
            return 0;
        }
        Err(c) => return c,
    };
    let [name] = a.positional.as_slice() else {
        return usage_refusal(a.json, "stop", "name exactly one function: zygo stop NAME");
    };
    match call(a.json, &Request::Stop { name: name.clone() }) {
        Ok(Reply::Stopped { .. }) => {
            if a.json {
                say!("{}", json_text(&json!({"stopped": name})));
            } else {
                say!("stopped {}", clean(name));
            }
            0
        }
        Ok(_) => refused(a.json, "internal", "unexpected reply"),
        Err(c) => c,
    }
}

// --- exec --------------------------------------------------------------------------------

fn read_event(arg: Option<&str>) -> Result<String, String> {
    const MAX: u64 = 16 * 1024 * 1024;
    let text = match arg {
        None => return Ok("{}".into()),
        Some("-") => {
            let mut s = String::new();
            std::io::stdin()
                .take(MAX + 1)
                .read_to_string(&mut s)
                .map_err(|e| format!("read the event from stdin: {e}"))?;
            s
        }
        Some(a) => {
            if serde_json::from_str::<serde_json::Value>(a).is_ok() {
                return Ok(a.to_string());
            }
            let p = Path::new(a);
            if !p.is_file() {
                return Err(format!("the event {a:?} is neither JSON nor a file"));
            }
            let mut s = String::new();
            std::fs::File::open(p)
                .and_then(|f| f.take(MAX + 1).read_to_string(&mut s))
                .map_err(|e| format!("read {a}: {e}"))?;
            s
        }
    };
    if text.len() as u64 > MAX {
        return Err("the event is over 16 MiB".into());
    }
    Ok(text)
}

fn answer_json(a: &ExecAnswer) -> serde_json::Value {
    let metrics = json!({"wall_ms": proto::front::ms(a.metrics.wall_us), "cpu_ms": proto::front::ms(a.metrics.cpu_us), "peak_rss_kb": a.metrics.peak_rss_kb});
    let result: serde_json::Value = a
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(serde_json::Value::Null);
    let mut v = json!({
        "request_id": a.request_id,
        "outcome": a.outcome.as_str(),
        "result": result,
        "stdout": a.stdout,
        "stderr": a.stderr,
        "stdout_truncated": a.stdout_truncated,
        "stderr_truncated": a.stderr_truncated,
        "metrics": metrics,
    });
    if a.outcome != Outcome::Ok {
        v["error"] = json!(a.error);
        v["code"] = json!(match a.outcome {
            Outcome::Timeout => "timeout",
            Outcome::Stuck => "stuck",
            Outcome::Cancelled => "cancelled",
            _ => "handler",
        });
        v["traceback"] = json!(a.traceback);
        v["exit_code"] = json!(a.exit_code);
        v["oom_killed"] = json!(a.oom_killed);
        v["started"] = json!(a.started);
    }
    if a.stream_truncated {
        v["stream_truncated"] = json!(true);
    }
    v
}

pub fn exec(raw: Vec<OsString>) -> i32 {
    let a = match parse(
        "exec",
        raw,
        &["timeout", "key", "workspace", "out", "script", "digest"],
        &["stream"],
    ) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::EXEC);
            return 0;
        }
        Err(c) => return c,
    };
    let (name, event_arg) = match a.positional.as_slice() {
        [n] => (n.clone(), None),
        [n, e] => (n.clone(), Some(e.as_str())),
        _ => return usage_refusal(a.json, "exec", "usage: zygo exec NAME [EVENT|-|FILE]"),
    };
    let timeout_ms = match a.flag("timeout") {
        Some(t) => match policy::limits::parse_duration("--timeout", t) {
            Ok(d) => Some(d.as_millis() as u64),
            Err(e) => return usage_refusal(a.json, "exec", e),
        },
        None => None,
    };
    let event = match read_event(event_arg) {
        Ok(e) => e,
        Err(e) => return usage_refusal(a.json, "exec", e),
    };
    let stream = a.has("stream");
    let script = match (a.flag("script"), a.flag("digest")) {
        (Some(_), Some(_)) => {
            return usage_refusal(
                a.json,
                "exec",
                "give --script FILE or --digest SHA256, not both",
            )
        }
        (Some(file), None) => match read_script(file) {
            Ok(bytes) => Some(proto::front::ScriptRef::Source(bytes)),
            Err(e) => return usage_refusal(a.json, "exec", e),
        },
        (None, Some(d)) => Some(proto::front::ScriptRef::Digest(d.to_ascii_lowercase())),
        (None, None) => None,
    };
    let workspace = match a.flag("workspace") {
        Some(file) => match read_workspace(file) {
            Ok(bytes) => Some(proto::bytes::Bytes(bytes)),
            Err(e) => return usage_refusal(a.json, "exec", e),
        },
        None => None,
    };
    let out_file = a.flag("out").map(str::to_string);
    let req = Request::Exec(ExecRequest {
        name,
        event,
        key: a.flag("key").map(str::to_string),
        timeout_ms,
        stream,
        script,
        workspace,
        workspace_blob: None,
        out: out_file.is_some(),
    });
    let mut c = match connect(a.json) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let json_out = a.json;
    // What of each stream was shown as it came: if the stream was cut (this end read too
    // slowly), the rest of the kept copy is shown from there once the answer is in.
    let (mut shown_out, mut shown_err) = (0usize, 0usize);
    let reply = c.call(&req, |ev| {
        match ev {
            ExecEvent::Stdout(d) => shown_out += d.len(),
            ExecEvent::Stderr(d) => shown_err += d.len(),
            ExecEvent::Progress(_) => {}
        }
        if json_out {
            let (k, d) = match ev {
                ExecEvent::Stdout(d) => ("stdout", d),
                ExecEvent::Stderr(d) => ("stderr", d),
                ExecEvent::Progress(d) => ("progress", d),
            };
            say!("{}", json_text(&json!({"event": k, "data": d})));
        } else {
            // The handler's output, both streams, goes to stderr: stdout carries only the
            // result, so that `zygo exec … | jq` reads the value alone.
            match ev {
                ExecEvent::Stdout(d) | ExecEvent::Stderr(d) => eprint!("{}", clean(d)),
                ExecEvent::Progress(d) => eprintln!("progress: {}", clean(d)),
            }
        }
    });
    let ans = match reply {
        Ok(Reply::Answer(ans)) => ans,
        Ok(Reply::Error {
            code,
            message,
            retry_after,
        }) => return refused_retry(a.json, code.as_str(), &message, retry_after),
        Ok(_) => return refused(a.json, "internal", "unexpected reply"),
        Err(e) => return refused(a.json, "internal", &e),
    };
    // The request's directory, as its handler left it, to the file named by --out.
    let mut out_failed = false;
    let mut out_json = serde_json::Value::Null;
    if let Some(file) = &out_file {
        match &ans.workspace_out {
            Some(tar) => match std::fs::write(file, &tar[..]) {
                Ok(()) => {
                    out_json = json!({"file": file, "bytes": tar.len(), "truncated": ans.workspace_out_truncated});
                    if ans.workspace_out_truncated && !a.json {
                        eprintln!(
                            "zygo: {}: entries were left out of the request's directory: it was over the caps ({} MiB, {} entries, {} levels)",
                            clean(file),
                            proto::front::MAX_WORKSPACE_OUT >> 20,
                            10_000,
                            64
                        );
                    }
                }
                Err(e) => {
                    out_failed = true;
                    eprintln!("zygo: write {}: {e}", clean(file));
                }
            },
            None if !a.json && (ans.outcome == Outcome::Ok || ans.outcome == Outcome::Error) => {
                eprintln!(
                    "zygo: the request's directory did not come back (the handler did not answer, or replaced its directory); {} not written",
                    clean(file)
                );
            }
            None => {}
        }
    }
    if a.json {
        let mut v = answer_json(&ans);
        if out_file.is_some() {
            v["workspace_out"] = out_json;
        }
        say!("{}", json_text(&v));
    } else {
        // The handler's output on stderr (its stdout first), the result alone on stdout.
        if !stream {
            eprint!("{}", clean(&ans.stdout));
            eprint!("{}", clean(&ans.stderr));
        }
        if ans.stream_truncated {
            let rest = |text: &str, shown: usize| text.get(shown..).unwrap_or("").to_string();
            eprint!("{}", clean(&rest(&ans.stdout, shown_out)));
            eprint!("{}", clean(&rest(&ans.stderr, shown_err)));
            eprintln!(
                "zygo: the output was read too slowly to be streamed whole; what was kept of it (the first MiB of each stream) was shown in full, its end after the stream was cut"
            );
        }
        match (&ans.outcome, &ans.result) {
            (Outcome::Ok, Some(r)) => say!("{}", clean(r)),
            _ => {
                if let Some(tb) = &ans.traceback {
                    eprint!("{}", clean(tb));
                }
                eprintln!(
                    "zygo: {} ({})",
                    clean(ans.error.as_deref().unwrap_or("failed")),
                    ans.outcome.as_str()
                );
            }
        }
    }
    if ans.outcome == Outcome::Ok && !out_failed {
        0
    } else {
        1
    }
}

/// A workspace tar from a file, at most `MAX_WORKSPACE` bytes.
fn read_workspace(file: &str) -> Result<Vec<u8>, String> {
    let max = proto::front::MAX_WORKSPACE as u64;
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("read {file}: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "{file} is over {} MiB, the most a workspace may be",
            max >> 20
        ));
    }
    Ok(bytes)
}

fn read_script(file: &str) -> Result<Vec<u8>, String> {
    const MAX: u64 = 16 * 1024 * 1024;
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("read {file}: {e}"))?;
    if bytes.len() as u64 > MAX {
        return Err(format!("{file} is over 16 MiB"));
    }
    Ok(bytes)
}

/// `zygo scripts put FILE`: register a script for runtime pools; prints its digest.
pub fn scripts(raw: Vec<OsString>) -> i32 {
    let a = match parse("scripts", raw, &[], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::SCRIPTS);
            return 0;
        }
        Err(c) => return c,
    };
    let [verb, file] = a.positional.as_slice() else {
        return usage_refusal(a.json, "scripts", "usage: zygo scripts put FILE");
    };
    if verb != "put" {
        return usage_refusal(
            a.json,
            "scripts",
            format!("unknown action {verb:?}; the one action is `put`"),
        );
    }
    let source = match read_script(file) {
        Ok(b) => b,
        Err(e) => return usage_refusal(a.json, "scripts", e),
    };
    match call(a.json, &Request::PutScript { source }) {
        Ok(Reply::ScriptStored { digest, size, .. }) => {
            if a.json {
                say!("{}", json_text(&json!({"digest": digest, "size": size})));
            } else {
                say!("{}", clean(&digest));
            }
            0
        }
        Ok(_) => refused(a.json, "internal", "unexpected reply"),
        Err(c) => c,
    }
}

// --- ls, logs, stats, warm, cancel, drain ------------------------------------------------

pub fn ls(raw: Vec<OsString>) -> i32 {
    let a = match parse("ls", raw, &[], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::LS);
            return 0;
        }
        Err(c) => return c,
    };
    let fs = match call(a.json, &Request::List) {
        Ok(Reply::Functions(fs)) => fs,
        Ok(_) => return refused(a.json, "internal", "unexpected reply"),
        Err(c) => return c,
    };
    warn_if_degraded();
    if a.json {
        let v: Vec<_> = fs
            .iter()
            .map(|f| {
                json!({"name": f.name, "kind": f.kind, "state": f.state, "error": f.error,
                    "zygotes": {"ready": f.zygotes.ready, "busy": f.zygotes.busy, "frozen": f.zygotes.frozen, "starting": f.zygotes.starting},
                    "in_flight": f.in_flight, "min_warm": f.min_warm, "max_warm": f.max_warm})
            })
            .collect();
        say!("{}", json_text(&serde_json::Value::Array(v)));
        return 0;
    }
    if fs.is_empty() {
        say!("nothing is served; serve functions with `zygo up -f sandbox.toml`");
        return 0;
    }
    say!(
        "{:<20} {:<9} {:<9} {:>5} {:>5} {:>6} {:>8} {:>9}",
        "NAME",
        "KIND",
        "STATE",
        "READY",
        "BUSY",
        "FROZEN",
        "STARTING",
        "IN-FLIGHT"
    );
    for f in &fs {
        say!(
            "{:<20} {:<9} {:<9} {:>5} {:>5} {:>6} {:>8} {:>9}",
            clean(&f.name),
            clean(&f.kind),
            clean(&f.state),
            f.zygotes.ready,
            f.zygotes.busy,
            f.zygotes.frozen,
            f.zygotes.starting,
            f.in_flight
        );
        if let Some(e) = &f.error {
            for line in e.lines() {
                say!("    {}", clean(line));
            }
        }
    }
    0
}

/// How many finished requests of a function the supervisor keeps (and answers at most).
const LOGS_KEPT: u32 = 1000;

pub fn logs(raw: Vec<OsString>) -> i32 {
    let a = match parse("logs", raw, &["n"], &["f", "follow"]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::LOGS);
            return 0;
        }
        Err(c) => return c,
    };
    let [name] = a.positional.as_slice() else {
        return usage_refusal(a.json, "logs", "usage: zygo logs NAME [-n N] [-f]");
    };
    let n: u32 = match a.flag("n").map(str::parse) {
        None => 20,
        Some(Ok(n)) if n > 0 => n,
        _ => return usage_refusal(a.json, "logs", "-n takes a positive number"),
    };
    let follow = a.has("f") || a.has("follow");
    // What was there before is seen, shown or not: following prints only what comes.
    let mut seen: std::collections::HashSet<String> = Default::default();
    let mut first = true;
    loop {
        let entries = match call(
            a.json,
            &Request::Logs {
                name: name.clone(),
                // Following asks for all the supervisor keeps each time, so that every
                // request it holds is known (the first time) and none new is missed.
                n: if follow { LOGS_KEPT } else { n },
            },
        ) {
            Ok(Reply::Logs { entries, left_out }) => {
                if first && left_out > 0 {
                    eprintln!(
                        "zygo: {left_out} older entries are left out: an answer holds at most 4 MiB of a log"
                    );
                }
                entries
            }
            Ok(_) => return refused(a.json, "internal", "unexpected reply"),
            Err(c) => return c,
        };
        let shown_from = if first {
            entries.len().saturating_sub(n as usize)
        } else {
            0
        };
        first = false;
        for (i, e) in entries.into_iter().enumerate() {
            if !seen.insert(e.request_id.clone()) || i < shown_from {
                continue;
            }
            if a.json {
                let v = json!({"request_id": e.request_id, "finished_ms": e.finished_ms,
                    "outcome": e.outcome.as_str(), "wall_ms": proto::front::ms(e.wall_us), "error": e.error,
                    "stdout": e.stdout, "stderr": e.stderr});
                say!("{}", json_text(&v));
            } else {
                say!(
                    "{} {:<9} {:>9.3} ms  {}",
                    clean(&e.request_id),
                    e.outcome.as_str(),
                    proto::front::ms(e.wall_us),
                    clean(e.error.as_deref().unwrap_or(""))
                );
                for line in e.stdout.lines() {
                    say!("    out: {}", clean(line));
                }
                for line in e.stderr.lines() {
                    say!("    err: {}", clean(line));
                }
            }
        }
        let _ = std::io::stdout().flush();
        if !follow {
            return 0;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

pub fn stats(raw: Vec<OsString>) -> i32 {
    let a = match parse("stats", raw, &[], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::STATS);
            return 0;
        }
        Err(c) => return c,
    };
    let name = a.positional.first().cloned();
    let st = match call(a.json, &Request::Stats { name }) {
        Ok(Reply::Stats(st)) => st,
        Ok(_) => return refused(a.json, "internal", "unexpected reply"),
        Err(c) => return c,
    };
    warn_if_degraded();
    if a.json {
        let v: Vec<_> = st
            .iter()
            .map(|s| {
                json!({"name": s.name, "requests": s.requests,
                    "failures": {"error": s.error, "timeout": s.timeout, "cancelled": s.cancelled, "stuck": s.stuck},
                    "ok": s.ok, "p50_wall_ms": s.p50_wall_us as f64 / 1000.0, "p99_wall_ms": s.p99_wall_us as f64 / 1000.0,
                    "peak_rss_kb": s.peak_rss_kb})
            })
            .collect();
        say!("{}", json_text(&serde_json::Value::Array(v)));
        return 0;
    }
    say!(
        "{:<20} {:>8} {:>6} {:>6} {:>7} {:>9} {:>5} {:>9} {:>9} {:>10}",
        "NAME",
        "REQUESTS",
        "OK",
        "ERROR",
        "TIMEOUT",
        "CANCELLED",
        "STUCK",
        "P50 ms",
        "P99 ms",
        "PEAK RSS"
    );
    for s in &st {
        say!(
            "{:<20} {:>8} {:>6} {:>6} {:>7} {:>9} {:>5} {:>9.2} {:>9.2} {:>7} KB",
            clean(&s.name),
            s.requests,
            s.ok,
            s.error,
            s.timeout,
            s.cancelled,
            s.stuck,
            s.p50_wall_us as f64 / 1000.0,
            s.p99_wall_us as f64 / 1000.0,
            s.peak_rss_kb
        );
    }
    0
}

pub fn warm(raw: Vec<OsString>) -> i32 {
    let a = match parse("warm", raw, &[], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::WARM);
            return 0;
        }
        Err(c) => return c,
    };
    let (name, n) = match a.positional.as_slice() {
        [name] => (name.clone(), 1),
        [name, n] => match n.parse::<u32>() {
            Ok(n) if n > 0 => (name.clone(), n),
            _ => return usage_refusal(a.json, "warm", "N must be a positive number"),
        },
        _ => return usage_refusal(a.json, "warm", "usage: zygo warm NAME [N]"),
    };
    match call(a.json, &Request::Warm { name, n }) {
        Ok(Reply::Warmed { name, ready }) => {
            if a.json {
                say!("{}", json_text(&json!({"name": name, "ready": ready})));
            } else {
                say!(
                    "{}: {ready} zygote(s) ready, more starting if asked for",
                    clean(&name)
                );
            }
            0
        }
        Ok(_) => refused(a.json, "internal", "unexpected reply"),
        Err(c) => c,
    }
}

pub fn cancel(raw: Vec<OsString>) -> i32 {
    let a = match parse("cancel", raw, &[], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::CANCEL);
            return 0;
        }
        Err(c) => return c,
    };
    let [key] = a.positional.as_slice() else {
        return usage_refusal(a.json, "cancel", "usage: zygo cancel KEY");
    };
    match call(a.json, &Request::Cancel { key: key.clone() }) {
        Ok(Reply::Cancelled { count }) => {
            if a.json {
                say!("{}", json_text(&json!({"cancelled": count})));
            } else {
                say!("cancelled {count} request(s)");
            }
            0
        }
        Ok(_) => refused(a.json, "internal", "unexpected reply"),
        Err(c) => c,
    }
}

pub fn drain(raw: Vec<OsString>) -> i32 {
    let a = match parse("drain", raw, &["grace"], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::DRAIN);
            return 0;
        }
        Err(c) => return c,
    };
    let grace = match a.flag("grace") {
        Some(g) => match policy::limits::parse_duration("--grace", g) {
            Ok(d) => d,
            Err(e) => return usage_refusal(a.json, "drain", e),
        },
        None => Duration::from_secs(30),
    };
    let mut c = match connect(a.json) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let reply = match c.call(
        &Request::Drain {
            grace_ms: grace.as_millis() as u64,
        },
        |_| {},
    ) {
        Ok(Reply::Error {
            code,
            message,
            retry_after,
        }) => Err(refused_retry(a.json, code.as_str(), &message, retry_after)),
        Ok(r) => Ok(r),
        Err(e) => Err(refused(a.json, "internal", &e)),
    };
    // The answer comes just before the supervisor exits: wait until it has, so that a
    // `zygo up` right after starts a new one rather than finding this one still there.
    if matches!(reply, Ok(Reply::Drained { .. })) && !c.wait_closed(Duration::from_secs(20)) {
        eprintln!("zygo: warning: the supervisor answered the drain but had not exited 20s later");
    }
    match reply {
        Ok(Reply::Drained { finished, cut_off }) => {
            if a.json {
                say!(
                    "{}",
                    json_text(&json!({"drained": true, "finished": finished, "cut_off": cut_off}))
                );
            } else {
                say!(
                    "drained: {finished} request(s) in flight finished, {cut_off} cut off at the end of the {}s grace",
                    grace.as_secs()
                );
            }
            0
        }
        Ok(_) => refused(a.json, "internal", "unexpected reply"),
        Err(c) => c,
    }
}

// --- token ---------------------------------------------------------------------------

pub fn token(raw: Vec<OsString>) -> i32 {
    let a = match parse("token", raw, &["tenant"], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::TOKEN);
            return 0;
        }
        Err(c) => return c,
    };
    let verb = a.positional.first().map(String::as_str);
    let tenant = a.flag("tenant").map(str::to_string);
    if tenant.is_some() && verb != Some("mint") {
        return usage_refusal(a.json, "token", "--tenant goes with `zygo token mint`");
    }
    match (verb, &a.positional[1.min(a.positional.len())..]) {
        (Some("mint"), []) => {
            if let Some(t) = &tenant {
                if !proto::api::is_tenant_id(t) {
                    return usage_refusal(
                        a.json,
                        "token",
                        "--tenant: a tenant id is 1 to 63 characters of a-z, 0-9, _ and -",
                    );
                }
            }
            match call(a.json, &Request::MintToken { tenant }) {
                Ok(Reply::TokenMinted(m)) => {
                    if a.json {
                        say!(
                            "{}",
                            json_text(&json!({"id": m.id, "secret": m.secret,
                                "tenant": m.tenant, "created_ms": m.created_ms}))
                        );
                    } else {
                        say!("{}", m.secret);
                        eprintln!(
                            "zygo: minted {} ({}); the secret above is shown this once: only its hash is kept",
                            m.id,
                            m.tenant
                                .as_deref()
                                .map_or("an operator token".to_string(), |t| format!(
                                    "a token of tenant {}",
                                    clean(t)
                                ))
                        );
                    }
                    0
                }
                Ok(_) => refused(a.json, "internal", "unexpected reply"),
                Err(c) => c,
            }
        }
        (Some("ls"), []) => match call(a.json, &Request::ListTokens) {
            Ok(Reply::Tokens(ts)) => {
                if a.json {
                    let v: Vec<_> = ts
                        .iter()
                        .map(|t| {
                            json!({"id": t.id, "tenant": t.tenant, "created_ms": t.created_ms,
                                "revoked_ms": t.revoked_ms})
                        })
                        .collect();
                    say!("{}", json_text(&json!(v)));
                } else {
                    say!("{:<22} {:<24} {:<15} REVOKED", "ID", "TENANT", "CREATED_MS");
                    for t in &ts {
                        say!(
                            "{:<22} {:<24} {:<15} {}",
                            t.id,
                            clean(t.tenant.as_deref().unwrap_or("(operator)")),
                            t.created_ms,
                            t.revoked_ms.map_or("-".to_string(), |r| r.to_string())
                        );
                    }
                }
                0
            }
            Ok(_) => refused(a.json, "internal", "unexpected reply"),
            Err(c) => c,
        },
        (Some("revoke"), [id]) => match call(a.json, &Request::RevokeToken { id: id.clone() }) {
            Ok(Reply::TokenRevoked { id }) => {
                if a.json {
                    say!("{}", json_text(&json!({"id": id, "revoked": true})));
                } else {
                    say!("revoked {}", clean(&id));
                }
                0
            }
            Ok(_) => refused(a.json, "internal", "unexpected reply"),
            Err(c) => c,
        },
        _ => usage_refusal(
            a.json,
            "token",
            "usage: zygo token mint [--tenant T] | zygo token ls | zygo token revoke ID",
        ),
    }
}

// --- secrets -------------------------------------------------------------------------

/// Read a secret's value: from the terminal with echo off, or from stdin when it is not one
/// (at most the store's cap; one trailing newline removed).
fn read_secret_value(name: &str) -> Result<Vec<u8>, String> {
    let cap = proto::api::MAX_SECRET_VALUE;
    // SAFETY: isatty on fd 0 only asks.
    let tty = unsafe { libc::isatty(0) } == 1;
    let mut saved: Option<libc::termios> = None;
    if tty {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a termios we own.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) == 0 {
                saved = Some(t);
                t.c_lflag &= !libc::ECHO;
                t.c_lflag |= libc::ECHONL;
                libc::tcsetattr(0, libc::TCSAFLUSH, &t);
            }
        }
        eprint!("value of {name} (not echoed): ");
        let _ = std::io::stderr().flush();
    }
    let mut value = Vec::new();
    let read = if tty {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| {
            value = line.into_bytes();
        })
    } else {
        std::io::stdin()
            .take(cap as u64 + 2)
            .read_to_end(&mut value)
            .map(|_| ())
    };
    if let Some(t) = saved {
        // SAFETY: putting back the settings read above.
        unsafe {
            libc::tcsetattr(0, libc::TCSAFLUSH, &t);
        }
    }
    read.map_err(|e| format!("read the value: {e}"))?;
    if value.ends_with(b"\n") {
        value.pop();
        if value.ends_with(b"\r") {
            value.pop();
        }
    }
    if value.len() > cap {
        return Err(format!("the value is larger than {cap} bytes"));
    }
    if value.is_empty() {
        return Err("the value is empty; nothing was stored".into());
    }
    Ok(value)
}

pub fn secrets(raw: Vec<OsString>) -> i32 {
    let a = match parse("secrets", raw, &[], &[]) {
        Ok(Some(a)) => a,
        Ok(None) => {
            say_raw!("{}", usage::SECRETS);
            return 0;
        }
        Err(c) => return c,
    };
    let verb = a.positional.first().map(String::as_str);
    let rest = &a.positional[1.min(a.positional.len())..];
    let bad_names = |tenant: &str, name: Option<&str>| -> Option<i32> {
        if !proto::api::is_tenant_id(tenant) {
            return Some(usage_refusal(
                a.json,
                "secrets",
                "TENANT: a tenant id is 1 to 63 characters of a-z, 0-9, _ and -",
            ));
        }
        if name.is_some_and(|n| !proto::api::is_secret_name(n)) {
            return Some(usage_refusal(
                a.json,
                "secrets",
                "NAME: a secret name is 1 to 64 letters, digits and _, not starting with a digit",
            ));
        }
        None
    };
    match (verb, rest) {
        (Some("keygen"), []) => match plumbing::random_hex(32) {
            Ok(k) => {
                say!("{k}");
                0
            }
            Err(e) => refused(a.json, "internal", &e.to_string()),
        },
        (Some("set"), [tenant, name]) => {
            if let Some(c) = bad_names(tenant, Some(name)) {
                return c;
            }
            let value = match read_secret_value(name) {
                Ok(v) => v,
                Err(e) => return refused(a.json, "bad_request", &e),
            };
            let req = Request::PutSecret {
                tenant: tenant.clone(),
                name: name.clone(),
                value: proto::api::SecretValue(value),
            };
            match call(a.json, &req) {
                Ok(Reply::SecretStored {
                    tenant,
                    name,
                    replaced,
                }) => {
                    if a.json {
                        say!(
                            "{}",
                            json_text(&json!({"tenant": tenant, "name": name, "replaced": replaced}))
                        );
                    } else {
                        say!(
                            "{} secret {} of tenant {}",
                            if replaced { "replaced" } else { "stored" },
                            clean(&name),
                            clean(&tenant)
                        );
                    }
                    0
                }
                Ok(_) => refused(a.json, "internal", "unexpected reply"),
                Err(c) => c,
            }
        }
        (Some("ls"), [tenant]) => {
            if let Some(c) = bad_names(tenant, None) {
                return c;
            }
            match call(a.json, &Request::ListSecrets { tenant: tenant.clone() }) {
                Ok(Reply::Secrets { names, .. }) => {
                    if a.json {
                        say!("{}", json_text(&json!({"secrets": names})));
                    } else {
                        for n in &names {
                            say!("{}", clean(n));
                        }
                    }
                    0
                }
                Ok(_) => refused(a.json, "internal", "unexpected reply"),
                Err(c) => c,
            }
        }
        (Some("rm"), [tenant, name]) => {
            if let Some(c) = bad_names(tenant, Some(name)) {
                return c;
            }
            let req = Request::DeleteSecret {
                tenant: tenant.clone(),
                name: name.clone(),
            };
            match call(a.json, &req) {
                Ok(Reply::SecretDeleted { tenant, name }) => {
                    if a.json {
                        say!("{}", json_text(&json!({"tenant": tenant, "name": name, "deleted": true})));
                    } else {
                        say!("removed secret {} of tenant {}", clean(&name), clean(&tenant));
                    }
                    0
                }
                Ok(_) => refused(a.json, "internal", "unexpected reply"),
                Err(c) => c,
            }
        }
        _ => usage_refusal(
            a.json,
            "secrets",
            "usage: zygo secrets keygen | zygo secrets set TENANT NAME | zygo secrets ls TENANT | zygo secrets rm TENANT NAME",
        ),
    }
}
