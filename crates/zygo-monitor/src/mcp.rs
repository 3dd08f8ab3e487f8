//! `zygo mcp`'s monitor side: the privileged half of the MCP server.
//!
//! The host starts `zygo mcp`; this is that process. It holds the ceiling — the image, the
//! limits and the workspace, fixed by its own command line — and starts the confined front
//! (`zygo __mcp-front`) with the host's stdin and stdout and one end of a socketpair on
//! fd 3. From then on it only answers what the front asks over that socketpair
//! ([`McpRequest`]), checking each request as if the front were hostile:
//!
//! - `RunCode`: a fresh one-shot sandbox ([`oneshot::run`]) from the ceiling's plan, with
//!   the code written through the plan's files to `/zygo/main.{py,js,sh}` (read-only), run
//!   as `python3`/`node`/`/bin/sh` with `/work` (the workspace) as its working directory,
//!   stdin fed then closed, output captured, a cancel pipe of its own, and an outer deadline
//!   of the timeout plus 300 s on top of the launcher's own deadline;
//! - `ListFunctions`, `CallFunction`, `FunctionLogs`: a connection of its own to the running
//!   supervisor's socket as an `Mcp` front (whose dispatch table allows only List, Exec and
//!   Logs). It never starts a supervisor;
//! - `Cancel`: kills that call's sandbox (or closes its supervisor connection, which the
//!   supervisor treats as a cancel).
//!
//! Each request runs on its own thread; each reply is one frame, written whole under a
//! lock. At most [`MAX_CALLS`] run at once; more are refused with a tool error. A frame
//! that does not decode, or a call number used twice, ends the channel.
//!
//! When the front's channel closes (the host closed stdin and the front exited, or the
//! front died), or on SIGTERM, SIGINT or SIGHUP, every call is cancelled, and this process
//! exits only after every sandbox is gone and the scratch workspace is removed.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use plumbing::client::NO_SUPERVISOR;
use plumbing::hello::HelloError;
use plumbing::random_hex;
use plumbing::role::{self, Child, Role, RoleFds, Stdio};
use plumbing::signals::block_signals;
use proto::api::{UsageRecord, MCP_RUN_CODE};
use proto::front::{self, ExecRequest, Reply, Request, MAX_FRONT_FRAME};
use proto::launch::{IdMap, InjectedFile, LaunchPlan};
use proto::mcp::{Language, McpReply, McpRequest, RunCodeResult, MAX_MCP_FRAME};
use proto::{read_frame, write_frame, ProtoError};

use crate::cgroup::{Backend, Limits};
use crate::oneshot::{self, Output, Stdin};

/// The most calls running at once (sandboxes and supervisor calls together).
pub const MAX_CALLS: usize = 16;

/// The outer deadline of a `run_code` is its timeout plus this (room for an image pull on
/// a first run); the sandbox's own timeout still applies to the program.
pub const OUTER_SLACK: Duration = Duration::from_secs(300);

/// How long a front that closed its channel has to exit before it is killed.
const FRONT_EXIT_GRACE: Duration = Duration::from_secs(2);

/// `function_logs`' limit is clamped into this range.
pub const LOG_LIMIT: std::ops::RangeInclusive<u32> = 1..=200;

/// What every `run_code` sandbox is held to, decided once from `zygo mcp`'s flags.
#[derive(Debug, Clone)]
pub struct Ceiling {
    /// The plan each call starts from; its argv, files and work are set per call.
    pub plan: LaunchPlan,
    pub limits: Limits,
    /// The limits in words, for failures: "ran out of memory (limit 512M)".
    pub mem_text: String,
    /// "exceeded its 60s time limit".
    pub timeout_text: String,
    pub timeout: Duration,
}

/// The folder bound at `/work` in every `run_code` sandbox.
#[derive(Debug)]
pub struct Workspace {
    pub path: PathBuf,
    /// A scratch folder this process made, removed when it exits.
    pub scratch: bool,
}

/// The host uid that older versions of Zygo gave workspaces (the subordinate range's
/// base), whose scratch workspaces are swept too.
fn old_sandbox_owner(ids: &IdMap) -> Option<u32> {
    match ids {
        IdMap::Range { uid_base, .. } => Some(*uid_base),
        IdMap::Single { .. } => None,
    }
}

fn utf8(p: &Path) -> Result<String, String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| format!("the workspace path {} is not valid UTF-8", p.display()))
}

impl Workspace {
    /// A fresh private folder (0700) under the temporary directory, this process's user's
    /// (the sandboxes write there as its owner: see `proto::launch::DiskOwner`), removed
    /// when the server exits.
    pub fn scratch(ids: &IdMap) -> Result<Workspace, String> {
        let base = std::env::temp_dir();
        sweep_stale(&base, ids);
        let name = random_hex(8).map_err(|e| format!("name the scratch workspace: {e}"))?;
        let path = base.join(format!("zygo-mcp-{}-{name}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("create the scratch workspace {}: {e}", path.display()))?;
        let ws = Workspace {
            path,
            scratch: true,
        };
        utf8(&ws.path)?;
        Ok(ws)
    }

    /// `--workspace DIR`: made (0700, this process's user's) if it does not exist, kept
    /// when the server exits. The sandboxes write there as the folder's owner (as root; as
    /// this user rootless): one they could not write is refused, naming it.
    pub fn given(dir: &Path) -> Result<Workspace, String> {
        // Absolute, but never through a link: a link on the way (one a user of the host
        // left in a folder of theirs, say) would have the sandboxes write wherever it
        // points, as that folder's owner. The folders on the way need not let anyone else
        // through: as root the monitor opens the workspace itself and hands it over
        // (`crate::mounts`).
        let joined = if dir.is_absolute() {
            dir.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| format!("the workspace {}: the current folder: {e}", dir.display()))?
                .join(dir)
        };
        // `.` and `..` taken by their names: with no link on the way (refused below), the
        // folder `..` names is the one before it.
        let mut path = std::path::PathBuf::from("/");
        for c in joined.components() {
            match c {
                std::path::Component::ParentDir => {
                    path.pop();
                }
                std::path::Component::Normal(n) => path.push(n),
                _ => {}
            }
        }
        crate::tree::make_folders(&path, 0o700).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                match plumbing::resolve::open_host_path(&path) {
                    Err(named) => format!("--workspace {}: {named}", path.display()),
                    Ok(_) => format!("the workspace {} is not a directory", path.display()),
                }
            }
            _ => format!("create the workspace {}: {e}", path.display()),
        })?;
        utf8(&path)?;
        crate::mounts::check_writable(&path, "choose another --workspace")
            .map_err(|e| format!("--workspace: {e}"))?;
        Ok(Workspace {
            path,
            scratch: false,
        })
    }

    /// Remove a scratch workspace (a given one is kept). Sandboxes filled it: it is
    /// removed by descriptor, never through a link, at any depth, folders a program left
    /// closed (mode 0) opened first (`crate::tree::remove`).
    pub fn remove(&self) {
        if !self.scratch {
            return;
        }
        if let Err(e) = crate::tree::remove(&self.path) {
            log::error!(
                "remove the scratch workspace {}: {e}; remove it by hand",
                self.path.display()
            );
        }
    }
}

/// Remove scratch workspaces left by servers that were killed before they could clean up
/// (SIGKILL): `zygo-mcp-<pid>-<random>` whose process is gone, owned by us (or by the
/// uid older versions gave them).
fn sweep_stale(base: &Path, ids: &IdMap) {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let sandbox = old_sandbox_owner(ids);
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("zygo-mcp-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !meta.is_dir() || (meta.uid() != me && Some(meta.uid()) != sandbox) {
            continue;
        }
        let stale = Workspace {
            path: e.path(),
            scratch: true,
        };
        log::info!(
            "removing {}, the scratch workspace of a zygo mcp that is gone",
            stale.path.display()
        );
        stale.remove();
    }
}

/// Everything the monitor side needs.
pub struct Options {
    pub ceiling: Ceiling,
    pub workspace: Workspace,
    /// The `zygo` binary: the front and every launcher are started from it.
    pub exe: PathBuf,
    pub backend: Backend,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How to stop one call.
#[derive(Default)]
struct Stopper {
    cancelled: AtomicBool,
    /// The write end of a sandbox's cancel pipe: dropping it kills the sandbox.
    pipe: Mutex<Option<OwnedFd>>,
    /// A connection to the supervisor: shutting it down cancels the call there.
    sock: Mutex<Option<UnixStream>>,
}

impl Stopper {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        drop(lock(&self.pipe).take());
        if let Some(s) = lock(&self.sock).as_ref() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

struct Shared {
    opts: Options,
    out: Mutex<UnixStream>,
    calls: Mutex<HashMap<u64, Arc<Stopper>>>,
    done: Condvar,
}

impl Shared {
    fn reply(&self, r: &McpReply) {
        if let Err(e) = write_frame(&mut *lock(&self.out), r) {
            log::debug!("reply to the front: {e}");
        }
    }

    fn finish(&self, call: u64) {
        lock(&self.calls).remove(&call);
        self.done.notify_all();
    }
}

fn spawn_front(exe: &Path, chan: &UnixStream) -> Result<Child, String> {
    let fds = RoleFds {
        stdin: Stdio::Inherit,
        stdout: Stdio::Inherit,
        channel: chan.as_fd(),
        program_stderr: None,
    };
    role::spawn(exe, Role::McpFront, fds).map_err(|e| {
        format!(
            "start the front ({} {}): {e}",
            exe.display(),
            Role::McpFront.arg()
        )
    })
}

/// From here on nothing this process prints can reach the protocol stream: stdin is
/// /dev/null and stdout is stderr. The front holds the host's stdin and stdout.
fn quiet_stdio() {
    // SAFETY: opening /dev/null and moving descriptors 0 and 1; no Rust object owns
    // either (this process never reads stdin or writes stdout after this point).
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::close(null);
        }
        libc::dup2(2, 1);
    }
}

/// Run the monitor side until the front's channel closes or a signal says stop. Returns
/// the process's exit code.
pub fn serve(opts: Options) -> i32 {
    // Blocked in this thread, and so in every thread it starts after; a thread of its own
    // waits for them.
    let blocked = block_signals(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
        .map_err(|e| format!("block signals: {e}"));
    let sigset = match blocked {
        Ok(s) => s,
        Err(e) => {
            eprintln!("zygo mcp: {e}");
            opts.workspace.remove();
            return 1;
        }
    };
    let (mut chan, theirs) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("zygo mcp: create the front's channel: {e}");
            opts.workspace.remove();
            return 1;
        }
    };
    let mut front = match spawn_front(&opts.exe, &theirs) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zygo mcp: {e}");
            opts.workspace.remove();
            return 1;
        }
    };
    drop(theirs);
    quiet_stdio();
    let front_pid = front.pid();
    let stopped_by = Arc::new(AtomicI32::new(0));
    {
        let stopped_by = stopped_by.clone();
        std::thread::spawn(move || {
            let mut sig = 0;
            // SAFETY: waiting for the signals blocked above, with valid pointers.
            if unsafe { libc::sigwait(&sigset, &mut sig) } == 0 {
                log::info!("signal {sig}: stopping every sandbox and exiting");
                stopped_by.store(sig, Ordering::SeqCst);
                // SAFETY: killing our own child, the front; its channel closes and the
                // reading loop below ends.
                unsafe { libc::kill(front_pid, libc::SIGKILL) };
            }
        });
    }
    let mut broke = false;
    if let Err(e) = plumbing::hello::answer(&mut chan, Role::McpFront.front()) {
        log::error!("{e}");
        broke = true;
    }
    let out = match chan.try_clone() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("zygo mcp: duplicate the front's channel: {e}");
            let _ = front.kill();
            let _ = front.wait();
            opts.workspace.remove();
            return 1;
        }
    };
    let shared = Arc::new(Shared {
        opts,
        out: Mutex::new(out),
        calls: Mutex::new(HashMap::new()),
        done: Condvar::new(),
    });
    while !broke {
        let req = match read_frame::<_, McpRequest>(&mut chan, MAX_MCP_FRAME) {
            Ok(r) => r,
            Err(ProtoError::Closed) => break,
            // The front exited with answers of ours still unread (a call that ended just as
            // it was leaving at the end of its input): it is gone, like a close. Its exit
            // status says whether it left as it should.
            Err(ProtoError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => {
                log::error!("the MCP front broke the protocol ({e}); ending it");
                broke = true;
                break;
            }
        };
        if let McpRequest::Cancel { call } = req {
            if let Some(s) = lock(&shared.calls).get(&call) {
                log::info!("call {call} cancelled");
                s.cancel();
            }
            continue;
        }
        let call = req.call();
        let stopper = Arc::new(Stopper::default());
        {
            let mut calls = lock(&shared.calls);
            if calls.contains_key(&call) {
                log::error!("the MCP front used call number {call} twice; ending it");
                broke = true;
                break;
            }
            if calls.len() >= MAX_CALLS {
                drop(calls);
                shared.reply(&McpReply::ToolError {
                    call,
                    message: format!(
                        "{MAX_CALLS} calls are already running, the most this server runs at \
                         once; wait for one to finish and try again"
                    ),
                });
                continue;
            }
            calls.insert(call, stopper.clone());
        }
        let sh = shared.clone();
        let started = std::thread::Builder::new().spawn(move || {
            let reply = handle(&sh, req, &stopper);
            sh.finish(call);
            sh.reply(&reply);
        });
        if let Err(e) = started {
            shared.finish(call);
            shared.reply(&McpReply::ToolError {
                call,
                message: format!("could not start a thread for this call: {e}"),
            });
        }
    }
    // The front is gone (or broke the protocol, or a signal came): stop everything.
    if broke {
        let _ = front.kill();
    }
    let mut calls = lock(&shared.calls);
    if !calls.is_empty() {
        log::info!("stopping {} running call(s)", calls.len());
    }
    for s in calls.values() {
        s.cancel();
    }
    while !calls.is_empty() {
        calls = shared
            .done
            .wait_timeout(calls, Duration::from_secs(1))
            .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        for s in calls.values() {
            s.cancel();
        }
    }
    drop(calls);
    // A front that closed its channel is exiting: give it a moment to finish doing so
    // (its channel closes before it can be reaped) before it is killed.
    let exit_by = Instant::now() + FRONT_EXIT_GRACE;
    let status = loop {
        match front.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if !broke && Instant::now() < exit_by => {
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => {
                let _ = front.kill();
                break front.wait().ok();
            }
        }
    };
    shared.opts.workspace.remove();
    shared.opts.backend.release_root();
    if stopped_by.load(Ordering::SeqCst) != 0 {
        return 0;
    }
    match status {
        _ if broke => 1,
        Some(s) if s.success() => 0,
        Some(s) => {
            log::debug!("the front ended: {s}");
            1
        }
        None => 1,
    }
}

fn handle(sh: &Shared, req: McpRequest, stopper: &Arc<Stopper>) -> McpReply {
    match req {
        McpRequest::RunCode {
            call,
            language,
            code,
            stdin,
        } => McpReply::RunCode {
            call,
            result: run_code(sh, language, code, stdin, stopper),
        },
        McpRequest::ListFunctions { call } => match supervisor(Request::List, stopper) {
            Ok(Reply::Functions(functions)) => McpReply::Functions { call, functions },
            Ok(other) => tool_error(call, other),
            Err(message) => McpReply::ToolError { call, message },
        },
        McpRequest::CallFunction {
            call,
            name,
            event,
            code,
        } => {
            if let Err(e) = policy::check_fn_name(&name, None) {
                return McpReply::ToolError {
                    call,
                    message: format!("no such function: {e}"),
                };
            }
            let req = Request::Exec(ExecRequest {
                name,
                event,
                key: None,
                // The ceiling's timeout holds here too: the function's own, if shorter,
                // still wins (the supervisor takes the shorter of the two).
                timeout_ms: Some(
                    u64::try_from(sh.opts.ceiling.timeout.as_millis()).unwrap_or(u64::MAX),
                ),
                stream: false,
                // A pool's script, sent with the call (stored by digest, as every script).
                script: code.map(|c| front::ScriptRef::Source(c.into_bytes())),
                workspace: None,
                workspace_blob: None,
                out: false,
            });
            match supervisor(req, stopper) {
                Ok(Reply::Answer(answer)) => McpReply::Called { call, answer },
                Ok(other) => tool_error(call, other),
                Err(message) => McpReply::ToolError { call, message },
            }
        }
        McpRequest::FunctionLogs { call, name, limit } => {
            if let Err(e) = policy::check_fn_name(&name, None) {
                return McpReply::ToolError {
                    call,
                    message: format!("no such function: {e}"),
                };
            }
            let n = limit.clamp(*LOG_LIMIT.start(), *LOG_LIMIT.end());
            match supervisor(Request::Logs { name, n }, stopper) {
                Ok(Reply::Logs { entries, .. }) => McpReply::Logs { call, entries },
                Ok(other) => tool_error(call, other),
                Err(message) => McpReply::ToolError { call, message },
            }
        }
        McpRequest::Cancel { call } => McpReply::ToolError {
            call,
            message: "internal error: a cancel is not a call".into(),
        },
    }
}

fn tool_error(call: u64, reply: Reply) -> McpReply {
    let message = match reply {
        Reply::Error {
            message,
            retry_after: Some(s),
            ..
        } => format!("{message} (try again in {s}s)"),
        Reply::Error { message, .. } => message,
        other => format!("internal error: the supervisor answered {other:?}"),
    };
    McpReply::ToolError { call, message }
}

/// One request to the running supervisor on a connection of its own, as an `Mcp` front.
fn supervisor(req: Request, stopper: &Stopper) -> Result<Reply, String> {
    let mut sock = plumbing::client::connect().map_err(|e| match e {
        // An MCP host may start this server with little of the user's environment: say
        // where it looked, and how to point it at a supervisor elsewhere.
        plumbing::client::ReachError::NotRunning { tried } => format!(
            "{NO_SUPERVISOR} ({}; a supervisor started with ZYGO_RUNTIME_DIR set is found when the MCP host passes this server the same ZYGO_RUNTIME_DIR in its env settings)",
            plumbing::client::ReachError::tried_text(&tried)
        ),
        e => e.to_string(),
    })?;
    {
        let mut slot = lock(&stopper.sock);
        if stopper.cancelled() {
            return Err("cancelled".into());
        }
        *slot = sock.try_clone().ok();
    }
    let failed = |e: ProtoError| {
        if stopper.cancelled() {
            "cancelled".to_string()
        } else if plumbing::client::timed_out(&e) {
            "the supervisor did not answer in time; it may be stuck (its log may say why)"
                .to_string()
        } else if matches!(e, ProtoError::Closed) {
            "the supervisor closed the connection (it may be draining); try again".to_string()
        } else {
            format!("talking to the supervisor failed: {e}")
        }
    };
    sock.set_read_timeout(Some(plumbing::client::HELLO_WAIT))
        .map_err(|e| format!("set a timeout on the supervisor's socket: {e}"))?;
    match plumbing::client::hello(&mut sock, front::Role::Mcp) {
        Ok(()) => {}
        Err(HelloError::Proto(e)) => return Err(failed(e)),
        Err(HelloError::Refused(reason)) => {
            return Err(format!("the supervisor refused this server: {reason}"))
        }
    }
    sock.set_read_timeout(Some(plumbing::client::reply_wait(&req)))
        .map_err(|e| format!("set a timeout on the supervisor's socket: {e}"))?;
    write_frame(&mut sock, &req).map_err(failed)?;
    loop {
        match read_frame::<_, Reply>(&mut sock, MAX_FRONT_FRAME).map_err(failed)? {
            Reply::Event(_) => continue,
            other => return Ok(other),
        }
    }
}

fn run_code(
    sh: &Shared,
    language: Language,
    code: String,
    stdin: Option<String>,
    stopper: &Arc<Stopper>,
) -> RunCodeResult {
    let ceiling = &sh.opts.ceiling;
    let refused = |why: String| RunCodeResult {
        exit_code: None,
        timed_out: false,
        oom_killed: false,
        cancelled: false,
        stdout: String::new(),
        stdout_truncated: false,
        stderr: String::new(),
        stderr_truncated: false,
        wall_us: 0,
        error: Some(why),
    };
    let (file, argv): (&str, &[&str]) = match language {
        Language::Python => ("/zygo/main.py", &["python3", "/zygo/main.py"]),
        Language::Javascript => ("/zygo/main.js", &["node", "/zygo/main.js"]),
        Language::Sh => ("/zygo/main.sh", &["/bin/sh", "/zygo/main.sh"]),
    };
    let size = code.len() + stdin.as_ref().map_or(0, String::len);
    if size > 16 * 1024 * 1024 {
        return refused(format!(
            "code and stdin together are {size} bytes, over the 16 MiB a call may carry"
        ));
    }
    let work = match sh.opts.workspace.path.to_str() {
        Some(w) => w.to_string(),
        None => return refused("the workspace path is not valid UTF-8".into()),
    };
    let mut plan = ceiling.plan.clone();
    plan.argv = argv.iter().map(|s| s.to_string()).collect();
    plan.files = vec![InjectedFile {
        path: file.into(),
        contents: code.into_bytes(),
    }];
    plan.work = Some(work);
    plan.cwd = "/work".into();

    let (cancel_r, cancel_w) = match plumbing::pipes::pipe() {
        Ok(p) => p,
        Err(e) => return refused(format!("the sandbox could not start: create a pipe: {e}")),
    };
    {
        let mut slot = lock(&stopper.pipe);
        if stopper.cancelled() {
            let mut r = refused("cancelled before the program started".into());
            r.cancelled = true;
            return r;
        }
        *slot = Some(cancel_w);
    }
    // The outer deadline: the timeout plus OUTER_SLACK, whatever the launcher does.
    let outer = ceiling.timeout.saturating_add(OUTER_SLACK);
    let outer_hit = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    {
        let stopper = stopper.clone();
        let hit = outer_hit.clone();
        std::thread::spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = done_rx.recv_timeout(outer) {
                hit.store(true, Ordering::SeqCst);
                stopper.cancel();
            }
        });
    }
    let req = oneshot::Request {
        plan,
        limits: ceiling.limits,
        stdin: match stdin {
            Some(s) => Stdin::Bytes(s.into_bytes()),
            None => Stdin::Null,
        },
        output: Output::Capture,
        launcher: sh.opts.exe.clone(),
        cancel: Some(cancel_r),
        fresh: Vec::new(),
        tee: None,
    };
    let out = oneshot::run(&sh.opts.backend, req);
    drop(done_tx);
    record_usage(&out);
    let error = if outer_hit.load(Ordering::SeqCst) {
        Some(format!(
            "did not finish within the outer deadline of {}s (its time limit plus 300s) and \
             was stopped",
            outer.as_secs()
        ))
    } else if out.cancelled {
        Some("cancelled".to_string())
    } else if !out.started {
        Some(format!(
            "the sandbox could not start: {}",
            out.error
                .as_deref()
                .unwrap_or("the launcher gave no reason")
        ))
    } else if out.timed_out {
        Some(format!("exceeded its {} time limit", ceiling.timeout_text))
    } else if out.oom_killed {
        Some(format!("ran out of memory (limit {})", ceiling.mem_text))
    } else if let Some(e) = &out.error {
        Some(format!("the sandbox failed: {e}"))
    } else {
        out.signal
            .map(|s| format!("was killed by signal {s} ({})", signal_name(s)))
    };
    RunCodeResult {
        exit_code: if out.started { out.exit_code } else { None },
        timed_out: out.timed_out,
        oom_killed: out.oom_killed,
        cancelled: out.cancelled,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stdout_truncated: out.stdout_truncated,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stderr_truncated: out.stderr_truncated,
        wall_us: out.wall_us,
        error,
    }
}

/// A `run_code`'s usage record, in the supervisor's usage log like every other request's:
/// sent to the running supervisor, or, with none running, appended to the log file itself
/// (one whole line in one write, which appends atomically beside any other writer).
fn record_usage(out: &oneshot::Outcome) {
    let outcome = if out.cancelled {
        "cancelled"
    } else if out.timed_out {
        "timeout"
    } else if out.started && out.exit_code == Some(0) && out.error.is_none() {
        "ok"
    } else {
        "error"
    };
    let rec = UsageRecord {
        tenant: UsageRecord::HOST.into(),
        function: MCP_RUN_CODE.into(),
        script: None,
        request_id: format!("mcp-{}", random_hex(8).unwrap_or_else(|_| "unnamed".into())),
        wall_us: out.wall_us,
        cpu_us: out.cpu_us,
        peak_rss_kb: out.peak_rss_kb,
        outcome: outcome.into(),
        finished_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    };
    let sent = (|| -> Result<Reply, String> {
        let mut sock = plumbing::client::connect().map_err(|e| e.to_string())?;
        let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = sock.set_write_timeout(Some(Duration::from_secs(10)));
        plumbing::client::hello(&mut sock, front::Role::Mcp).map_err(|e| format!("{e:?}"))?;
        write_frame(&mut sock, &Request::RecordUsage(rec.clone())).map_err(|e| e.to_string())?;
        read_frame::<_, Reply>(&mut sock, MAX_FRONT_FRAME).map_err(|e| e.to_string())
    })();
    match sent {
        Ok(Reply::UsageRecorded) => return,
        Ok(other) => log::warn!("the supervisor refused a run_code usage record: {other:?}"),
        Err(e) => log::debug!(
            "no supervisor took the run_code usage record ({e}); appending it to the log"
        ),
    }
    let state = plumbing::paths::state_dir();
    let path = state.join("usage.log");
    let mut line = rec.json_line();
    line.push('\n');
    // On a machine where no supervisor ever ran, the state directory is made here, as
    // `zygo up` makes it (0700), so the record has somewhere to go.
    let wrote = plumbing::paths::make_private_dir_if_missing(&state).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()))
    });
    if let Err(e) = wrote {
        log::error!(
            "could not write a run_code usage record to {}: {e}; the record: {}",
            path.display(),
            line.trim_end()
        );
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV, a crash",
        libc::SIGABRT => "SIGABRT, an abort",
        libc::SIGBUS => "SIGBUS, a crash",
        libc::SIGFPE => "SIGFPE, an arithmetic fault",
        libc::SIGILL => "SIGILL, an illegal instruction",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGPIPE => "SIGPIPE, a closed pipe",
        libc::SIGSYS => "SIGSYS, a refused system call",
        libc::SIGXCPU => "SIGXCPU, the CPU time limit",
        libc::SIGXFSZ => "SIGXFSZ, the file size limit",
        _ => "a signal",
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn scratch_workspace_is_private_and_removed() {
        let ws = Workspace::scratch(&IdMap::Single { uid: 0, gid: 0 }).unwrap();
        let m = std::fs::metadata(&ws.path).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        std::fs::create_dir(ws.path.join("locked")).unwrap();
        std::fs::write(ws.path.join("locked/f"), b"x").unwrap();
        std::fs::set_permissions(
            ws.path.join("locked"),
            std::fs::Permissions::from_mode(0o000),
        )
        .unwrap();
        ws.remove();
        assert!(!ws.path.exists());
    }

    #[test]
    fn given_workspace_is_made_and_kept() {
        let base = std::env::temp_dir().join(format!("zygo-mcp-test-{}", random_hex(8).unwrap()));
        let dir = base.join("a/b");
        let ws = Workspace::given(&dir).unwrap();
        assert!(ws.path.is_dir() && !ws.scratch);
        ws.remove();
        assert!(ws.path.is_dir(), "a given workspace is kept");
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(Workspace::given(&file)
            .unwrap_err()
            .contains("not a directory"));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
