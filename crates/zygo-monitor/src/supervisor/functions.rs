//! Functions, their zygotes, and the requests running in them.
//!
//! A function is served by 1..=max_warm zygotes. Each zygote keeps [`SPARES`] children
//! parked — forked ahead, each already in a fresh cgroup of its own with the function's
//! limits — and serves at most [`SLOTS`] requests at once. A call takes a parked child
//! (never one that served before), so on the request path there is no fork and no cgroup
//! to create. When every zygote is at its limit and there are max_warm of them, the call
//! is refused as busy at once: there is no hidden queue.
//!
//! Each request ends with exactly one outcome word, decided here: `ok`, `error`,
//! `timeout` (its deadline passed and its cgroup was killed), `cancelled`, or `stuck` (no
//! heartbeat for [`stuck_after`]). An OOM kill is read from the request cgroup's counter.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::{Interest, Registry, Token};
use policy::file::{Agent, FnKind, FnSpec};
use proto::front::{
    ErrorCode, ExecAnswer, ExecEvent, ExecRequest, FunctionInfo, FunctionStats, Health, LogEntry,
    Metrics, Outcome, Reply, Request, ScriptRef, ZygoteCounts,
};
use proto::launch::{
    BindMount, FromLauncher, Image, InjectedFile, LaunchPlan, Mode, Script, Stream, ToLauncher,
    MAX_LAUNCH_FRAME,
};

use super::cgworker::{Job, Placed, Worker};
use super::conn::Conn;
use super::SupervisorError;
use crate::cgroup::{Backend, Cgroup, Limits, Weight};
use crate::identity::Identity;
use crate::shape::Shape;
use std::sync::Arc;

/// Requests one zygote serves at once.
pub const SLOTS: usize = 4;
/// Children a zygote keeps parked.
pub const SPARES: usize = 3;
/// The largest event accepted.
pub const MAX_EVENT: usize = 16 * 1024 * 1024;
/// Output kept per stream per request.
const OUTPUT_CAP: usize = 1024 * 1024;
/// Finished requests remembered per function for `zygo logs`.
const LOG_KEEP: usize = 1000;
/// Wall-time samples kept per function for percentiles.
const SAMPLES: usize = 10_000;

const PYTHON_AGENT: &[u8] = include_bytes!("../../../zygo-launcher/agents/python_agent.py");
const PYTHON_BOOT: &[u8] = include_bytes!("../../../zygo-launcher/agents/python_boot.py");
/// Where the Python agent is written in a zygote's sandbox.
const AGENT_SCRIPT: &str = "/run/zygo/python_agent.py";
const NODE_AGENT: &[u8] = include_bytes!("../../../zygo-launcher/agents/node_agent.mjs");

/// A request with no heartbeat for this long is killed as stuck
/// (`$ZYGO_STUCK_AFTER_MS` overrides it, for tests).
fn stuck_after() -> Duration {
    std::env::var("ZYGO_STUCK_AFTER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(60), Duration::from_millis)
}

pub(super) fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: filling our own buffer from the kernel's random source.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n > 0 {
            got += n as usize;
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZState {
    Starting,
    Ready,
    Dead,
}

struct Slot {
    cgroup: Box<dyn Cgroup>,
    request: Option<String>,
    /// When its request was answered: the child should exit at once; past a grace it
    /// is killed with its cgroup.
    answered: Option<Instant>,
}

/// How long a child may linger after its answer before its cgroup is killed.
const LINGER: Duration = Duration::from_secs(2);

struct Zygote {
    func: String,
    conn: Conn,
    child: crate::spawn::Launcher,
    cgroup: Box<dyn Cgroup>,
    state: ZState,
    /// Parked or busy children, by slot name.
    slots: HashMap<String, Slot>,
    /// Slots asked to park that have not registered yet, or whose cgroup is being made.
    parking: Vec<String>,
    /// Slots registered, their cgroup being made by the worker.
    placing: Vec<String>,
    last_used: Instant,
    last_beat: Instant,
    frozen: bool,
    /// Children it may still park, where each request takes a uid that is never given
    /// twice (see `identity`): at 0 the zygote is spent, serves the children it has, and is
    /// replaced. `None`: no limit (every request runs as the sandbox's one uid).
    parks_left: Option<u32>,
    /// A spent zygote whose replacement has been started.
    replaced: bool,
}

impl Zygote {
    /// Whether it may park no more children.
    fn spent(&self) -> bool {
        self.parks_left == Some(0)
    }
    /// How many more requests it can take: a spent zygote only those its children can.
    fn room(&self) -> usize {
        if self.spent() {
            self.parked() + self.parking.len() + self.placing.len()
        } else {
            SLOTS - self.busy().min(SLOTS)
        }
    }
    /// Children serving a request that has not been answered yet. (An answered child is
    /// on its way out: it no longer counts against the zygote's slots.)
    fn busy(&self) -> usize {
        self.slots
            .values()
            .filter(|s| s.request.is_some() && s.answered.is_none())
            .count()
    }
    fn parked(&self) -> usize {
        self.slots.values().filter(|s| s.request.is_none()).count()
    }
    fn free_slot(&self) -> Option<String> {
        self.slots
            .iter()
            .find(|(_, s)| s.request.is_none())
            .map(|(k, _)| k.clone())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum FnState {
    Starting,
    Serving,
    Failed(String),
}

#[derive(Default)]
struct Stats {
    requests: u64,
    by_outcome: [u64; 5],
    walls_us: VecDeque<u64>,
    peak_rss_kb: u64,
}

struct Function {
    spec: FnSpec,
    plan: LaunchPlan,
    /// The plan's handed-over mounts (see `crate::mounts`), opened when the function was
    /// served: every zygote gets its own copy of these, whatever the paths name later.
    handed: Vec<OwnedFd>,
    limits: Limits,
    mem_text: String,
    state: FnState,
    zygotes: Vec<Token>,
    min_warm: usize,
    /// Calls waiting for a parked child in a zygote that has room (not a hidden queue:
    /// they are bounded by the zygotes' free slots).
    pending: VecDeque<String>,
    logs: VecDeque<LogEntry>,
    stats: Stats,
}

enum Terminal {
    Returned(String),
    Raised { message: String, traceback: String },
}

struct Capped {
    text: String,
    truncated: bool,
}

impl Capped {
    fn new() -> Capped {
        Capped {
            text: String::new(),
            truncated: false,
        }
    }
    fn push(&mut self, s: &str) {
        let room = OUTPUT_CAP.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
        } else {
            let mut cut = room;
            while cut > 0 && !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.text.push_str(&s[..cut]);
            self.truncated = true;
        }
    }
}

struct InFlight {
    client: Token,
    func: String,
    /// Set once the call has a child: (zygote, slot).
    at: Option<(Token, String)>,
    event: String,
    key: Option<String>,
    stream: bool,
    received: Instant,
    started: Option<Instant>,
    timeout: Duration,
    last_beat: Instant,
    stdout: Capped,
    stderr: Capped,
    terminal: Option<Terminal>,
    forced: Option<Outcome>,
    /// A pool's script, handed to the launcher with the call.
    script: Option<Script>,
    /// Its digest, for the usage log.
    script_digest: Option<String>,
}

/// A `serve` answer waiting: the client, the functions named, and those already failed.
type PendingServe = (Token, Vec<String>, Vec<(String, String)>);

/// How a function's agent is started: its argv, the mount of its entry's folder, and
/// the files injected into the sandbox.
type AgentLaunch = (Vec<String>, Option<BindMount>, Vec<InjectedFile>);

pub struct Functions {
    backend: Arc<Backend>,
    worker: Worker,
    identity: Identity,
    launcher: PathBuf,
    /// The usage log (see `usage`).
    usage: super::usage::UsageLog,
    /// The content-addressed script store: `<state>/scripts/<sha256 hex>`.
    scripts: super::scripts::Store,
    fns: BTreeMap<String, Function>,
    zygotes: HashMap<Token, Zygote>,
    calls: HashMap<String, InFlight>,
    outbox: Vec<(Token, Reply, bool)>,
    /// `serve`/`up` answers waiting for functions to become ready or fail.
    pending_serves: Vec<PendingServe>,
    /// Zygotes whose spare is to be replaced when the loop has nothing more urgent.
    parks: VecDeque<Token>,
    /// Slots whose request was answered: their child is exiting, which is work in the
    /// background again (their cgroup's weight goes back down once the answer is out).
    settling: Vec<(Token, String)>,
    counter: u64,
}

/// What the event loop lends the functions for one call into them: its registry, where a
/// new launcher's channel is registered (and a killed one's removed), and its token
/// counter, which names that channel among the loop's other sources.
pub struct Ctx<'a> {
    reg: &'a Registry,
    next_token: &'a mut usize,
}

impl<'a> Ctx<'a> {
    pub fn new(reg: &'a Registry, next_token: &'a mut usize) -> Ctx<'a> {
        Ctx { reg, next_token }
    }

    /// A token no source of the loop has had.
    fn token(&mut self) -> Token {
        *self.next_token += 1;
        Token(*self.next_token)
    }
}

/// Why something was refused, before it becomes a reply.
type Refusal = (ErrorCode, String);

fn fail(code: ErrorCode, message: impl Into<String>) -> Reply {
    Reply::Error {
        code,
        message: message.into(),
        retry_after: None,
    }
}

impl Functions {
    pub fn new(
        backend: Backend,
        waker: Arc<mio::Waker>,
        identity: Identity,
        launcher: PathBuf,
        usage_path: PathBuf,
        scripts: PathBuf,
    ) -> Result<Functions, SupervisorError> {
        let usage = super::usage::UsageLog::open(usage_path.clone())
            .map_err(|e| SupervisorError(format!("open {}: {e}", usage_path.display())))?;
        let backend = Arc::new(backend);
        let cap = super::scripts::cap_from_env().map_err(SupervisorError)?;
        let scripts = super::scripts::Store::open(scripts.clone(), cap).map_err(|e| {
            SupervisorError(format!("open the script store {}: {e}", scripts.display()))
        })?;
        let worker = Worker::start(backend.clone(), waker)
            .map_err(|e| SupervisorError(format!("start the cgroup worker: {e}")))?;
        Ok(Functions {
            backend,
            worker,
            identity,
            launcher,
            usage,
            scripts,
            fns: BTreeMap::new(),
            zygotes: HashMap::new(),
            calls: HashMap::new(),
            outbox: Vec::new(),
            pending_serves: Vec::new(),
            parks: VecDeque::new(),
            settling: Vec::new(),
            counter: 0,
        })
    }

    /// Remove what supervisors that are gone (killed before they could drain) left in the
    /// tree: `tenants/_host/<fn>/z-<pid>-…` and `r-<pid>-…` whose process does not exist.
    /// Whatever still runs in such a cgroup is killed first.
    pub fn sweep_stale(&self) {
        for func in self.backend.child_names_of("tenants/_host") {
            let base = format!("tenants/_host/{func}");
            for name in self.backend.child_names_of(&base) {
                let pid = name
                    .strip_prefix("z-")
                    .or_else(|| name.strip_prefix("r-"))
                    .and_then(|r| r.split('-').next())
                    .and_then(|p| p.parse::<u32>().ok());
                let Some(pid) = pid else { continue };
                if pid == std::process::id() || crate::cgroup::process_alive(pid) {
                    continue;
                }
                log::info!("removing {base}/{name}, left by a supervisor that is gone");
                // `open` finishes a cgroup that was only partly created or removed itself.
                if let Some(cg) = self.backend.open(&format!("{base}/{name}")) {
                    if let Err(e) = cg.remove() {
                        log::warn!("remove {base}/{name}: {e}");
                    }
                }
            }
            self.backend.prune(&base);
        }
    }

    pub fn backend_root(&self) -> String {
        format!("{} {}", self.backend.name(), self.backend.root())
    }

    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    pub fn take_outbox(&mut self) -> Vec<(Token, Reply, bool)> {
        std::mem::take(&mut self.outbox)
    }

    /// One request from a front. `None` means the answer comes later (through the outbox).
    pub fn handle(&mut self, client: Token, req: Request, cx: &mut Ctx) -> Option<Reply> {
        match req {
            Request::ServeAll { file } => self.serve_file(client, &file, None, cx),
            Request::Serve { name, file } => self.serve_file(client, &file, Some(name), cx),
            Request::Stop { name } => Some(self.stop(&name, cx)),
            Request::Exec(e) => self.exec(client, e, cx),
            Request::List => Some(Reply::Functions(self.list())),
            Request::Logs { name, n } => Some(match self.fns.get(&name) {
                Some(f) => {
                    let n = (n as usize).clamp(1, LOG_KEEP);
                    let skip = f.logs.len().saturating_sub(n);
                    Reply::Logs(f.logs.iter().skip(skip).cloned().collect())
                }
                None => fail(
                    ErrorCode::NotFound,
                    format!("no function named {name:?} is served"),
                ),
            }),
            Request::Stats { name } => Some(self.stats(name.as_deref())),
            Request::Warm { name, n } => Some(self.warm(&name, n as usize, cx)),
            Request::Cancel { key } => Some(self.cancel(&key)),
            Request::Drain { .. } => {
                Some(fail(ErrorCode::Internal, "drain is handled by the loop"))
            }
            Request::Health => Some(Reply::Health(Health {
                usage_log: self.usage.health(),
            })),
            Request::PutScript { source } => Some(match self.store_script(&source) {
                Ok(digest) => Reply::ScriptStored {
                    digest,
                    size: source.len() as u64,
                },
                Err((code, message)) => fail(code, message),
            }),
        }
    }

    // --- serving -------------------------------------------------------------------------

    fn serve_file(
        &mut self,
        client: Token,
        file: &str,
        only: Option<String>,
        cx: &mut Ctx,
    ) -> Option<Reply> {
        let path = Path::new(file);
        let text = match read_capped(path, policy::file::MAX_FILE_BYTES as u64) {
            Ok(t) => t,
            Err(e) => return Some(fail(ErrorCode::BadSpec, format!("{file}: {e}"))),
        };
        let parsed = match policy::file::parse_sandbox_toml(&text, path) {
            Ok(p) => p,
            Err(e) => return Some(fail(ErrorCode::BadSpec, e.to_string())),
        };
        let mut names: Vec<String> = parsed.functions.keys().cloned().collect();
        if let Some(n) = &only {
            if !parsed.functions.contains_key(n) {
                return Some(fail(ErrorCode::NotFound, format!("{file} has no [fn.{n}]")));
            }
            names = vec![n.clone()];
        }
        if names.is_empty() {
            return Some(fail(
                ErrorCode::BadSpec,
                format!("{file} has no [fn.*] tables"),
            ));
        }
        let mut failed = Vec::new();
        let mut waiting = false;
        for name in &names {
            let Some(spec) = parsed.functions.get(name) else {
                continue;
            };
            match self.serve_one(spec.clone(), cx) {
                Ok(()) => {
                    if self
                        .fns
                        .get(name)
                        .is_some_and(|f| f.state == FnState::Starting)
                    {
                        waiting = true;
                    }
                }
                Err(e) => failed.push((name.clone(), e)),
            }
        }
        if waiting {
            // Answered when every function named has a ready zygote or failed.
            self.pending_serves.push((client, names, failed));
            return None;
        }
        let served = names
            .into_iter()
            .filter(|n| !failed.iter().any(|(f, _)| f == n))
            .collect();
        Some(Reply::Served { served, failed })
    }
}

fn read_capped(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mut text = String::new();
    f.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(text)
}

/// A runtime pool: an agent without a handler, or a command (warm-exec); each call names
/// a script.
fn is_pool(spec: &FnSpec) -> bool {
    matches!(
        spec.kind,
        FnKind::Agent { entry: None, .. } | FnKind::Cmd(_)
    )
}

/// The folder holding an entry file (bound at /fn) and the file's name in it.
fn entry_parts(file: &Path) -> Result<(String, String), String> {
    let dir = file
        .parent()
        .and_then(|d| d.to_str())
        .ok_or_else(|| format!("entry {} has no usable folder", file.display()))?;
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("entry {} has no usable file name", file.display()))?;
    Ok((dir.to_string(), name.to_string()))
}

/// The Python agent and its bootstrap, written into every zygote's sandbox at /run/zygo.
fn python_agent_files() -> Vec<InjectedFile> {
    vec![
        InjectedFile {
            path: AGENT_SCRIPT.into(),
            contents: PYTHON_AGENT.to_vec(),
        },
        InjectedFile {
            path: "/run/zygo/python_boot.py".into(),
            contents: PYTHON_BOOT.to_vec(),
        },
    ]
}

/// The Node spare, written next to it for Node functions and pools.
fn node_agent_file() -> InjectedFile {
    InjectedFile {
        path: "/run/zygo/node_agent.mjs".into(),
        contents: NODE_AGENT.to_vec(),
    }
}

/// `python3 -I /run/zygo/python_boot.py /run/zygo/python_agent.py ARGS...`: every zygote's
/// agent, compiled in a throwaway fork so that the agent (and so every request's fork of
/// it) does not carry the compiler's leftover memory (python_boot.py says more).
fn agent_cmd<S: AsRef<str>>(args: &[S]) -> Vec<String> {
    let mut argv: Vec<String> = [
        "/usr/bin/python3",
        "-I",
        "/run/zygo/python_boot.py",
        AGENT_SCRIPT,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(args.iter().map(|a| a.as_ref().to_string()));
    argv
}

/// The function's entry folder, mounted read-only at /fn.
fn entry_mount(dir: String) -> Option<BindMount> {
    Some(BindMount {
        src: dir,
        dst: "/fn".into(),
        rw: false,
        handed: false,
    })
}

/// The agent's command line and the extra mounts for a function's entry.
fn agent_argv(spec: &FnSpec) -> Result<AgentLaunch, String> {
    match &spec.kind {
        FnKind::Agent {
            agent: Agent::Python,
            entry: Some(entry),
        } => {
            let (dir, name) = entry_parts(&entry.file)?;
            let func = entry.func.clone().unwrap_or_else(|| "handler".into());
            Ok((
                agent_cmd(&[format!("/fn/{name}"), func]),
                entry_mount(dir),
                python_agent_files(),
            ))
        }
        FnKind::Agent {
            agent: Agent::Node,
            entry: Some(entry),
        } => {
            // Node cannot fork: the Python agent keeps the zygote, and each parked child
            // execs a Node spare that has imported the handler before its request arrives.
            let (dir, name) = entry_parts(&entry.file)?;
            Ok((
                agent_cmd(&[
                    "--node".into(),
                    format!("/fn/{name}"),
                    entry.func.clone().unwrap_or_default(),
                ]),
                entry_mount(dir),
                [python_agent_files(), vec![node_agent_file()]].concat(),
            ))
        }
        FnKind::Agent {
            agent: Agent::Python,
            entry: None,
        } => Ok((agent_cmd(&["--pool"]), None, python_agent_files())),
        // A Node runtime pool: each parked child execs a Node spare that waits for its
        // request and imports the script it names.
        FnKind::Agent {
            agent: Agent::Node,
            entry: None,
        } => Ok((
            agent_cmd(&["--node-pool"]),
            None,
            [python_agent_files(), vec![node_agent_file()]].concat(),
        )),
        // Warm-exec: the sandbox is held by the agent, and each call starts the command with
        // the script's path as its last argument and the event on stdin.
        FnKind::Cmd(cmd) => {
            let mut args = vec!["--exec".to_string()];
            args.extend(cmd.iter().cloned());
            Ok((agent_cmd(&args), None, python_agent_files()))
        }
    }
}

/// Start a zygote's launcher with its cgroup's attach files and its plan: the launcher
/// process, its connection (registered with the loop) and the connection's token. Whatever
/// was started is stopped again if a later step fails.
fn start_launcher(
    launcher: &Path,
    cg: &dyn Cgroup,
    plan: LaunchPlan,
    handed: &[OwnedFd],
    cx: &mut Ctx,
) -> Result<(crate::spawn::Launcher, Conn, Token), String> {
    let (mon, launcher_end) = StdUnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    let launcher_end = OwnedFd::from(launcher_end);
    // The agent's own stdout and stderr (not the requests') go to the supervisor's log.
    let log_out = std::io::stderr()
        .as_fd_dup()
        .map_err(|e| format!("dup stderr: {e}"))?;
    let log_err = std::io::stderr()
        .as_fd_dup()
        .map_err(|e| format!("dup stderr: {e}"))?;
    let (out_hi, sock_hi, err_hi) = match (
        crate::oneshot::high(&log_out),
        crate::oneshot::high(&launcher_end),
        crate::oneshot::high(&log_err),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return Err(format!("prepare descriptors: {e}"))
        }
    };
    let attach = cg
        .attach_files()
        .map_err(|e| format!("open the zygote's cgroup: {e}"))?;
    let fds = crate::spawn::LauncherFds {
        stdin: None,
        stdout: &out_hi,
        channel: &sock_hi,
        program_stderr: &err_hi,
    };
    let mut child = crate::spawn::spawn_launcher(launcher, fds)
        .map_err(|e| format!("start the launcher: {e}"))?;
    drop((out_hi, sock_hi, err_hi, log_out, launcher_end, log_err));
    let mut stop = |why: String| {
        let _ = child.kill();
        let _ = child.wait();
        why
    };
    // The launcher's first frame, on a fresh socket: it cannot block.
    if let Err(e) = crate::oneshot::send_cgroup_files(&mon, &attach) {
        return Err(stop(format!(
            "send the zygote's cgroup to the launcher: {e}"
        )));
    }
    drop(attach);
    if let Err(e) = crate::mounts::send(&mon, handed) {
        return Err(stop(format!("send the mounts to the launcher: {e}")));
    }
    if let Err(e) = mon.set_nonblocking(true) {
        return Err(stop(e.to_string()));
    }
    let mut stream = mio::net::UnixStream::from_std(mon);
    let t = cx.token();
    if let Err(e) = cx
        .reg
        .register(&mut stream, t, Interest::READABLE | Interest::WRITABLE)
    {
        return Err(stop(format!("register the launcher: {e}")));
    }
    let mut conn = Conn::new(stream, MAX_LAUNCH_FRAME);
    conn.send(&ToLauncher::Start(plan));
    Ok((child, conn, t))
}

impl Functions {
    fn serve_one(&mut self, spec: FnSpec, cx: &mut Ctx) -> Result<(), String> {
        let name = spec.name.clone();
        if self
            .fns
            .get(&name)
            .is_some_and(|f| !matches!(f.state, FnState::Failed(_)))
        {
            return Ok(()); // already served: serving twice is a no-op
        }
        if let Some(old) = self.fns.remove(&name) {
            for t in old.zygotes {
                self.kill_zygote(t, cx);
            }
        }
        if spec.network != policy::plan::Network::None {
            return Err(format!(
                "network {} is not available yet; use network = \"none\"",
                spec.network
            ));
        }
        // Keys this version reads but cannot honour are refused, never ignored: a function
        // that looked for its dependencies or its secrets would fail only when called.
        if let Some(r) = &spec.requirements {
            return Err(format!(
                "requirements = {:?} is not available in this version (dependency sets are not built yet); remove the key",
                r.display().to_string()
            ));
        }
        if !spec.secrets.is_empty() {
            return Err(format!(
                "secrets = {:?} is not available in this version (secrets are not delivered yet); remove the key",
                spec.secrets
            ));
        }
        let (mut argv, fn_mount, files) = agent_argv(&spec)?;
        // Where the sandbox maps a range of ids for requests, each request runs as a uid of
        // its own (the launcher leaves the agent CAP_SETUID/CAP_SETGID for that, see
        // zygo_launcher::harden::Keep), never one the image's users have, never twice.
        if let Some(r) = self.identity.request_ids {
            // The agent's first arguments, right after its own path.
            let at = argv
                .iter()
                .position(|a| a == AGENT_SCRIPT)
                .map_or(argv.len(), |i| i + 1);
            argv.insert(at, "--per-request-uids".into());
            argv.insert(at + 1, format!("{}:{}", r.first, r.count));
        }
        let image = match &spec.image {
            policy::plan::Image::Host => Image::Host,
            policy::plan::Image::Dir(d) => {
                if !d.is_dir() {
                    return Err(format!("image directory {} does not exist", d.display()));
                }
                Image::Dir(d.to_str().ok_or("image path is not UTF-8")?.into())
            }
        };
        let mut mounts = Vec::new();
        for m in &spec.mounts {
            if !m.src.exists() {
                return Err(format!("mount source {} does not exist", m.src.display()));
            }
            mounts.push(BindMount {
                src: m.src.to_str().ok_or("mount path is not UTF-8")?.into(),
                dst: m.dst.to_str().ok_or("mount path is not UTF-8")?.into(),
                rw: m.rw,
                handed: false,
            });
        }
        if let Some(m) = fn_mount {
            if !Path::new(&m.src).is_dir() {
                return Err(format!("the entry's folder {} does not exist", m.src));
            }
            mounts.push(m);
        }
        let l = &spec.limits;
        let limits = Limits::from_policy(l);
        let mem_text = l.mem.to_string();
        // The function's folder of cgroups gets a memory ceiling as well: at most max_warm
        // zygotes and SLOTS requests each, all at the function's limit. Whatever a request
        // leaves charged behind it (anything that outlives its cgroup) cannot grow past it.
        let max_warm = (spec.max_warm as u64).max(1);
        let ceiling = limits
            .mem_bytes
            .map(|m| m.saturating_mul(max_warm * (1 + SLOTS as u64)));
        let mut plan = LaunchPlan {
            mode: Mode::Zygote,
            argv,
            env: spec.env.clone(),
            // A function starts in its own folder; a pool has none.
            cwd: if is_pool(&spec) { "/work" } else { "/fn" }.into(),
            image,
            mounts,
            scratch_bytes: l.scratch.0,
            timeout_ms: l.timeout.as_millis() as u64,
            ids: self.identity.ids,
            hostname: "zygo".into(),
            request_ids: self.identity.request_ids,
            inotify: spec.inotify,
            image_handed: false,
            work_handed: false,
            hide_pids: Shape::ZYGOTE.hide_pids,
            work_mode: Shape::ZYGOTE.work_mode,
            scripts: is_pool(&spec),
            files,
            work: None,
            etc: None,
        };
        let handed = crate::mounts::hand_over(&mut plan)?;
        let folder = format!("tenants/_host/{name}");
        self.worker.remember(&name);
        if let Err(e) = self.backend.set_ceiling(&folder, ceiling) {
            self.worker.forget(&name, folder);
            return Err(format!("write the memory ceiling of {name}'s cgroups: {e}"));
        }
        let min_warm = (spec.min_warm as usize).max(1);
        self.fns.insert(
            name.clone(),
            Function {
                spec,
                plan,
                handed,
                limits,
                mem_text,
                state: FnState::Starting,
                zygotes: Vec::new(),
                min_warm,
                pending: VecDeque::new(),
                logs: VecDeque::new(),
                stats: Stats::default(),
            },
        );
        for _ in 0..min_warm {
            if let Err(e) = self.spawn_zygote(&name, cx) {
                if let Some(f) = self.fns.get_mut(&name) {
                    f.state = FnState::Failed(e.clone());
                }
                return Err(e);
            }
        }
        log::info!("serving {name} ({} zygote(s) starting)", min_warm);
        Ok(())
    }

    fn spawn_zygote(&mut self, name: &str, cx: &mut Ctx) -> Result<(), String> {
        let f = self.fns.get(name).ok_or("no such function")?;
        let cg = self
            .backend
            .create(&format!(
                "tenants/_host/{name}/z-{}-{}",
                std::process::id(),
                random_hex(6)
            ))
            .map_err(|e| e.to_string())?;
        // On any error below, dropping `cg` removes it.
        if let Err(e) = cg
            .set_limits(&f.limits)
            .and_then(|_| cg.set_weight(Weight::Background))
        {
            return Err(format!("write the zygote's limits: {e}"));
        }
        let mut plan = f.plan.clone();
        if plan.image == Image::Host {
            plan.etc = crate::etc_cache::prepare();
        }
        let launcher = self.launcher.clone();
        let handed = f
            .handed
            .iter()
            .map(crate::mounts::copy)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("copy the function's mounts: {e}"))?;
        let (child, conn, t) = start_launcher(&launcher, &*cg, plan, &handed, cx)?;
        let now = Instant::now();
        self.zygotes.insert(
            t,
            Zygote {
                func: name.to_string(),
                conn,
                child,
                cgroup: cg.keep(),
                state: ZState::Starting,
                slots: HashMap::new(),
                parking: Vec::new(),
                placing: Vec::new(),
                last_used: now,
                last_beat: now,
                frozen: false,
                parks_left: self.identity.request_ids.map(|r| r.count),
                replaced: false,
            },
        );
        if let Some(f) = self.fns.get_mut(name) {
            f.zygotes.push(t);
        }
        Ok(())
    }

    fn park(&mut self, zt: Token) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        if z.state != ZState::Ready {
            return;
        }
        let room = SLOTS.saturating_sub(z.busy() + z.parked() + z.parking.len() + z.placing.len());
        let want = SPARES
            .saturating_sub(z.parked() + z.parking.len() + z.placing.len())
            .min(room)
            .min(z.parks_left.map_or(usize::MAX, |n| n as usize));
        for _ in 0..want {
            self.counter += 1;
            let slot = format!("s{}{}", self.counter, random_hex(3));
            if let Some(z) = self.zygotes.get_mut(&zt) {
                z.parking.push(slot.clone());
                if let Some(n) = z.parks_left.as_mut() {
                    *n -= 1;
                }
                z.conn.send(&ToLauncher::Park { slot });
            }
        }
    }

    /// A spent zygote (see `Zygote::parks_left`) gets a replacement as soon as it is spent,
    /// and is ended once its last child is gone: no request id is ever given twice.
    fn retire_if_spent(&mut self, zt: Token, cx: &mut Ctx) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        if !z.spent() || z.state != ZState::Ready {
            return;
        }
        let name = z.func.clone();
        if !z.replaced {
            z.replaced = true;
            log::info!("a zygote of {name} has given every request id it had; replacing it");
            if let Err(e) = self.spawn_zygote(&name, cx) {
                log::error!("replace a spent zygote of {name}: {e}");
            }
        }
        let Some(z) = self.zygotes.get(&zt) else {
            return;
        };
        if z.slots.is_empty() && z.parking.is_empty() && z.placing.is_empty() {
            self.kill_zygote(zt, cx);
        }
    }

    /// Kill a zygote: its launcher, every cgroup it had, and fail its calls.
    fn kill_zygote(&mut self, zt: Token, cx: &Ctx) {
        let Some(mut z) = self.zygotes.remove(&zt) else {
            return;
        };
        z.conn.send(&ToLauncher::Kill);
        let _ = cx.reg.deregister(&mut z.conn.stream);
        let _ = z.child.kill();
        let _ = z.child.wait();
        let _ = z.cgroup.thaw();
        for (slot, s) in z.slots.drain() {
            let _ = s.cgroup.thaw();
            if let Some(id) = s.request {
                if let Some(c) = self.calls.get_mut(&id) {
                    c.forced.get_or_insert(Outcome::Error);
                    c.terminal.get_or_insert(Terminal::Raised {
                        message: "the zygote serving this request died".into(),
                        traceback: String::new(),
                    });
                }
                let usage = s.cgroup.usage().ok();
                let _ = s.cgroup.remove();
                self.finish(&id, usage, None);
            } else {
                let _ = s.cgroup.remove();
            }
            let _ = slot;
        }
        if let Err(e) = z.cgroup.remove() {
            log::warn!("remove a zygote's cgroup: {e}");
        }
        if let Some(f) = self.fns.get_mut(&z.func) {
            f.zygotes.retain(|t| *t != zt);
        }
    }
}

trait DupFd {
    fn as_fd_dup(&self) -> std::io::Result<OwnedFd>;
}

impl DupFd for std::io::Stderr {
    fn as_fd_dup(&self) -> std::io::Result<OwnedFd> {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned()
    }
}

impl Functions {
    /// Something happened on a launcher's channel.
    pub fn zygote_event(&mut self, zt: Token, cx: &mut Ctx) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        z.conn.flush();
        let (msgs, end) = match z.conn.receive::<FromLauncher>() {
            Ok((m, eof)) => (
                m,
                if eof {
                    Some("its launcher closed the channel".to_string())
                } else {
                    None
                },
            ),
            Err(e) => (Vec::new(), Some(format!("launcher channel: {e}"))),
        };
        for m in msgs {
            if let Err(why) = self.launcher_msg(zt, m, cx) {
                log::error!("zygote protocol: {why}; replacing the zygote");
                self.zygote_died(zt, &why, cx);
                return;
            }
        }
        if let Some(why) = end {
            self.zygote_died(zt, &why, cx);
        }
    }

    fn zygote_died(&mut self, zt: Token, why: &str, cx: &mut Ctx) {
        let Some(z) = self.zygotes.get(&zt) else {
            return;
        };
        let name = z.func.clone();
        let was_ready = z.state == ZState::Ready;
        if z.state != ZState::Dead {
            log::warn!("a zygote of {name} ended: {why}");
        }
        self.kill_zygote(zt, cx);
        let Some(f) = self.fns.get_mut(&name) else {
            return;
        };
        if f.state == FnState::Starting && !was_ready && f.zygotes.is_empty() {
            f.state = FnState::Failed(why.to_string());
            self.fail_pending(&name);
            return;
        }
        if matches!(f.state, FnState::Failed(_)) {
            return;
        }
        // Replace it, so the function keeps min_warm zygotes.
        if f.zygotes.len() < f.min_warm {
            if let Err(e) = self.spawn_zygote(&name, cx) {
                log::error!("replace a zygote of {name}: {e}");
            }
        }
    }

    fn launcher_msg(&mut self, zt: Token, m: FromLauncher, cx: &mut Ctx) -> Result<(), String> {
        let z = self.zygotes.get_mut(&zt).ok_or("no such zygote")?;
        match m {
            FromLauncher::Cloned { pid } if z.state == ZState::Starting => {
                let placed = z.cgroup.contains(pid).unwrap_or(false);
                let reply = match if placed {
                    Ok(())
                } else {
                    z.cgroup.add_pid(pid)
                } {
                    Ok(()) => ToLauncher::Proceed,
                    Err(e) => {
                        log::error!("place a zygote in its cgroup: {e}");
                        ToLauncher::Kill
                    }
                };
                z.conn.send(&reply);
            }
            FromLauncher::Started if z.state == ZState::Starting => {}
            FromLauncher::Ready if z.state == ZState::Starting => {
                z.state = ZState::Ready;
                z.last_beat = Instant::now();
                let name = z.func.clone();
                if let Some(f) = self.fns.get_mut(&name) {
                    if f.state == FnState::Starting {
                        log::info!("{name} is serving");
                    }
                    f.state = FnState::Serving;
                }
                self.park(zt);
            }
            FromLauncher::ImportError { message, traceback } if z.state == ZState::Starting => {
                let name = z.func.clone();
                z.state = ZState::Dead;
                let text = if traceback.is_empty() {
                    message
                } else {
                    format!("{message}\n{traceback}")
                };
                log::error!("{name} failed to serve: {text}");
                if let Some(f) = self.fns.get_mut(&name) {
                    f.state = FnState::Failed(text);
                }
                self.fail_pending(&name);
            }
            FromLauncher::Failed { phase, reason } => {
                let name = z.func.clone();
                z.state = ZState::Dead;
                let text = format!(
                    "the sandbox could not be built ({}): {reason}",
                    phase.as_str()
                );
                if let Some(f) = self.fns.get_mut(&name) {
                    if f.state == FnState::Starting {
                        f.state = FnState::Failed(text.clone());
                    }
                }
                self.fail_pending(&name);
                return Err(text);
            }
            FromLauncher::Heartbeat if z.state == ZState::Ready => z.last_beat = Instant::now(),
            FromLauncher::Parked { slot, pid } => {
                let pos = z
                    .parking
                    .iter()
                    .position(|s| *s == slot)
                    .ok_or("a slot nobody asked to park")?;
                z.parking.remove(pos);
                // The pid is the number the kernel gave for the registration's sender, which
                // may have exited since and its number gone to any process on the host. Only
                // a process that is still this zygote's (in its cgroup, where its agent
                // forked it) is moved, held by a pidfd meanwhile so its number cannot change
                // hands between the check and the move.
                let pidfd = crate::spawn::pidfd_open(pid);
                let ours = pidfd.as_ref().is_some_and(|fd| {
                    z.cgroup.contains(pid).unwrap_or(false) && crate::spawn::pidfd_alive(fd)
                });
                let Some(pidfd) = pidfd.filter(|_| ours) else {
                    log::warn!(
                        "a zygote of {} registered a process ({pid}) that is not in its cgroup; dropping the slot",
                        z.func
                    );
                    z.conn.send(&ToLauncher::Reap { slot });
                    self.parks.push_back(zt);
                    return Ok(());
                };
                z.placing.push(slot.clone());
                let func = z.func.clone();
                let limits = self.fns.get(&func).map(|f| f.limits).ok_or("no function")?;
                // Usually into a cgroup kept from an earlier request, here and now.
                if let Some(cg) = self.worker.place_kept(&func, &limits, pid, &pidfd) {
                    self.placed(Placed {
                        zt,
                        slot,
                        result: Ok(cg),
                    });
                    return Ok(());
                }
                // Otherwise a new cgroup is made off the loop; `placed` takes the result.
                self.worker.send(Job::Place {
                    zt,
                    rel: format!("tenants/_host/{func}/r-{}-{slot}", std::process::id()),
                    pool: func,
                    slot,
                    pid,
                    pidfd,
                    limits,
                });
            }
            FromLauncher::ScriptRefused {
                slot,
                too_large,
                message,
            } => {
                // Nothing ran: the call is refused as if before dispatch.
                if let Some(id) = slot_request(z, &slot) {
                    if let Some(c) = self.calls.remove(&id) {
                        let reply = if too_large {
                            fail(ErrorCode::TooLarge, message)
                        } else {
                            Reply::Error {
                                code: ErrorCode::Busy,
                                message,
                                retry_after: Some(1),
                            }
                        };
                        self.outbox.push((c.client, reply, true));
                    }
                }
            }
            FromLauncher::ParkFailed { slot, message } => {
                z.parking.retain(|s| *s != slot);
                log::warn!("a zygote of {} could not park a child: {message}", z.func);
                self.retire_if_spent(zt, cx);
            }
            FromLauncher::Output { slot, stream, data } => {
                if let Some(id) = slot_request(z, &slot) {
                    if let Some(c) = self.calls.get_mut(&id) {
                        c.last_beat = Instant::now();
                        if c.stream {
                            let ev = match stream {
                                Stream::Stdout => ExecEvent::Stdout(data.clone()),
                                Stream::Stderr => ExecEvent::Stderr(data.clone()),
                            };
                            self.outbox.push((c.client, Reply::Event(ev), false));
                        }
                        match stream {
                            Stream::Stdout => c.stdout.push(&data),
                            Stream::Stderr => c.stderr.push(&data),
                        }
                    }
                }
            }
            FromLauncher::Progress { slot, text } => {
                if let Some(id) = slot_request(z, &slot) {
                    if let Some(c) = self.calls.get_mut(&id) {
                        c.last_beat = Instant::now();
                        if c.stream {
                            self.outbox.push((
                                c.client,
                                Reply::Event(ExecEvent::Progress(text)),
                                false,
                            ));
                        }
                    }
                }
            }
            FromLauncher::ChildHeartbeat { slot } => {
                if let Some(id) = slot_request(z, &slot) {
                    if let Some(c) = self.calls.get_mut(&id) {
                        c.last_beat = Instant::now();
                    }
                }
            }
            // The terminal line: every output line came before it on the same channel, so
            // the caller is answered now; the child's exit and its cgroup's removal follow
            // off the request path.
            FromLauncher::Returned { slot, value } => {
                self.answer_now(zt, &slot, Terminal::Returned(value));
            }
            FromLauncher::Raised {
                slot,
                message,
                traceback,
            } => {
                self.answer_now(zt, &slot, Terminal::Raised { message, traceback });
            }
            FromLauncher::SlotClosed { slot, violation } => {
                let zygote_dead = z.state == ZState::Dead;
                let Some(s) = z.slots.remove(&slot) else {
                    z.parking.retain(|p| *p != slot);
                    z.placing.retain(|p| *p != slot);
                    return Ok(());
                };
                // The launcher has dropped the child already; the agent cleans up after it
                // when it exits.
                // A call still waiting for its answer (killed, died, out of memory) reads
                // what its cgroup counted now; the cgroup itself (and whatever the child
                // left in it) goes later, off the request path.
                let unanswered = s
                    .request
                    .as_ref()
                    .is_some_and(|id| self.calls.contains_key(id));
                let usage = if unanswered {
                    let _ = s.cgroup.kill_all();
                    s.cgroup.usage().ok()
                } else {
                    None
                };
                let func = z.func.clone();
                match self.fns.get(&func) {
                    Some(f) => self.worker.send(Job::Release {
                        pool: func,
                        limits: f.limits,
                        cg: s.cgroup,
                    }),
                    None => self.worker.send(Job::Remove(s.cgroup)),
                }
                self.parks.push_back(zt);
                if let Some(id) = s.request {
                    if zygote_dead {
                        if let Some(c) = self.calls.get_mut(&id) {
                            c.terminal.get_or_insert(Terminal::Raised {
                                message: "the zygote serving this request died".into(),
                                traceback: String::new(),
                            });
                        }
                    }
                    self.finish(&id, usage, violation);
                }
                if let Some(z) = self.zygotes.get(&zt) {
                    let func = z.func.clone();
                    self.dispatch_pending(&func);
                }
                self.retire_if_spent(zt, cx);
            }
            FromLauncher::Exited { .. } => {
                z.state = ZState::Dead;
            }
            other => return Err(format!("unexpected {other:?}")),
        }
        Ok(())
    }
}

impl Functions {
    /// Put a script in the store (see `scripts`); its digest.
    fn store_script(&mut self, source: &[u8]) -> Result<String, Refusal> {
        let calls = &self.calls;
        self.scripts.put(source, &|d| {
            calls
                .values()
                .any(|c| c.script_digest.as_deref() == Some(d))
        })
    }

    /// The script a call names, from the store (a source sent with the call is stored first).
    fn resolve_script(&mut self, r: ScriptRef) -> Result<Script, Refusal> {
        match r {
            ScriptRef::Source(source) => {
                let digest = self.store_script(&source)?;
                Ok(Script { digest, source })
            }
            ScriptRef::Digest(digest) => {
                let source = self.scripts.get(&digest)?;
                Ok(Script { digest, source })
            }
        }
    }

    /// A request's handler returned or raised: answer its caller at once.
    fn answer_now(&mut self, zt: Token, slot: &str, t: Terminal) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        let Some(s) = z.slots.get_mut(slot) else {
            return;
        };
        let Some(id) = s.request.clone() else { return };
        if s.answered.is_some() {
            return;
        }
        s.answered = Some(Instant::now());
        let usage = s.cgroup.usage().ok();
        self.settling.push((zt, slot.to_string()));
        match self.calls.get_mut(&id) {
            Some(c) if c.forced.is_none() => {
                c.terminal.get_or_insert(t);
            }
            // Already being killed (timeout, cancel): that outcome stands, answered when
            // the channel closes.
            _ => return,
        }
        self.finish(&id, usage, None);
    }
}

fn slot_request(z: &Zygote, slot: &str) -> Option<String> {
    z.slots.get(slot).and_then(|s| s.request.clone())
}

impl Functions {
    fn exec(&mut self, client: Token, e: ExecRequest, cx: &mut Ctx) -> Option<Reply> {
        if e.event.len() > MAX_EVENT {
            return Some(fail(
                ErrorCode::TooLarge,
                format!("the event is over {} MiB", MAX_EVENT >> 20),
            ));
        }
        let event = match proto::json::from_str_strict::<serde_json::Value>(&e.event) {
            Ok(v) => v.to_string(),
            Err(err) => {
                return Some(fail(
                    ErrorCode::BadRequest,
                    format!("the event is not JSON: {err}"),
                ))
            }
        };
        if e.key
            .as_ref()
            .is_some_and(|k| k.is_empty() || k.len() > 256)
        {
            return Some(fail(
                ErrorCode::BadRequest,
                "a request key must be 1 to 256 bytes",
            ));
        }
        let Some(f) = self.fns.get(&e.name) else {
            return Some(fail(
                ErrorCode::NotFound,
                format!("no function named {:?} is served; see `zygo ls`", e.name),
            ));
        };
        if let FnState::Failed(why) = &f.state {
            return Some(fail(
                ErrorCode::Unavailable,
                format!("{} failed to serve: {why}", e.name),
            ));
        }
        // A pool runs the script named with the call; a function runs its own handler.
        let pool = is_pool(&f.spec);
        let script = match (pool, e.script) {
            (true, None) => {
                return Some(fail(
                    ErrorCode::BadRequest,
                    format!(
                    "{} is a runtime pool: name a script to run (--script FILE or --digest SHA256)",
                    e.name
                ),
                ))
            }
            (false, Some(_)) => {
                return Some(fail(
                    ErrorCode::BadRequest,
                    format!(
                        "{} is a function with its own handler; scripts are run by runtime pools",
                        e.name
                    ),
                ))
            }
            (false, None) => None,
            (true, Some(r)) => match self.resolve_script(r) {
                Ok(s) => Some(s),
                Err((code, message)) => return Some(fail(code, message)),
            },
        };
        let Some(f) = self.fns.get(&e.name) else {
            return Some(fail(
                ErrorCode::NotFound,
                format!("no function named {:?} is served", e.name),
            ));
        };
        // A pool's scripts live in a tmpfs of its scratch size (`/run/script`): one that
        // cannot fit there is refused now, naming the limit.
        if let Some(s) = &script {
            let space = f.plan.scratch_bytes;
            if s.source.len() as u64 + 8192 > space {
                return Some(fail(
                    ErrorCode::TooLarge,
                    format!(
                        "a script of {} bytes does not fit {}'s script space of {} (its scratch size; raise scratch in sandbox.toml)",
                        s.source.len(),
                        e.name,
                        policy::limits::Bytes(space)
                    ),
                ));
            }
        }
        let mut timeout = f.spec.limits.timeout;
        if let Some(ms) = e.timeout_ms {
            timeout = timeout.min(Duration::from_millis(ms.max(1)));
        }
        let id = random_hex(16);
        let now = Instant::now();
        self.calls.insert(
            id.clone(),
            InFlight {
                client,
                func: e.name.clone(),
                at: None,
                event,
                key: e.key,
                stream: e.stream,
                received: now,
                started: None,
                timeout,
                last_beat: now,
                stdout: Capped::new(),
                stderr: Capped::new(),
                terminal: None,
                forced: None,
                script_digest: script.as_ref().map(|s| s.digest.clone()),
                script,
            },
        );
        if self.try_dispatch(&id) {
            return None;
        }
        // No parked child right now. Wait for one only where a zygote has room for it.
        let name = e.name;
        let f = self.fns.get(&name)?;
        let live: Vec<&Zygote> = f
            .zygotes
            .iter()
            .filter_map(|t| self.zygotes.get(t))
            .filter(|z| z.state != ZState::Dead)
            .collect();
        let room: usize = live.iter().map(|z| z.room()).sum();
        let max_warm = (f.spec.max_warm as usize).max(1);
        let can_grow = f.zygotes.len() < max_warm;
        if room > f.pending.len() {
            if let Some(f) = self.fns.get_mut(&name) {
                f.pending.push_back(id);
            }
            return None;
        }
        if can_grow {
            if let Err(err) = self.spawn_zygote(&name, cx) {
                self.calls.remove(&id);
                return Some(fail(
                    ErrorCode::Unavailable,
                    format!("start another zygote of {name}: {err}"),
                ));
            }
            if let Some(f) = self.fns.get_mut(&name) {
                f.pending.push_back(id);
            }
            return None;
        }
        self.calls.remove(&id);
        Some(Reply::Error {
            code: ErrorCode::Busy,
            message: format!(
                "{name} is busy: all {max_warm} zygote(s) are serving {SLOTS} requests each; retry shortly"
            ),
            retry_after: Some(1),
        })
    }

    /// Give a call a parked child, if one is free. True when it was sent.
    fn try_dispatch(&mut self, id: &str) -> bool {
        let Some(c) = self.calls.get(id) else {
            return false;
        };
        let Some(f) = self.fns.get(&c.func) else {
            return false;
        };
        let mut best: Option<(Token, String, bool)> = None;
        for t in &f.zygotes {
            let Some(z) = self.zygotes.get(t) else {
                continue;
            };
            if z.state != ZState::Ready || z.busy() >= SLOTS {
                continue;
            }
            if let Some(slot) = z.free_slot() {
                // Prefer a zygote that is not frozen.
                if best.as_ref().is_none_or(|b| b.2 && !z.frozen) {
                    best = Some((*t, slot, z.frozen));
                }
            }
        }
        let Some((zt, slot, frozen)) = best else {
            return false;
        };
        let now = Instant::now();
        let Some(c) = self.calls.get_mut(id) else {
            return false;
        };
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return false;
        };
        if frozen {
            thaw(z);
        }
        if let Some(s) = z.slots.get_mut(&slot) {
            s.request = Some(id.to_string());
            // From now on this child is what a caller waits for.
            if let Err(e) = s.cgroup.set_weight(Weight::Foreground) {
                log::warn!("raise a request's CPU weight: {e}");
            }
        }
        c.at = Some((zt, slot.clone()));
        c.started = Some(now);
        c.last_beat = now;
        z.last_used = now;
        let event = std::mem::take(&mut c.event);
        let script = c.script.take();
        z.conn.send(&ToLauncher::Call {
            slot,
            request_id: id.to_string(),
            event,
            script,
        });
        // The spare this call used is replaced now, so the next call finds one: the new
        // child works at the background weight, so it does not slow this request down.
        self.park(zt);
        true
    }

    fn dispatch_pending(&mut self, name: &str) {
        loop {
            let Some(id) = self.fns.get(name).and_then(|f| f.pending.front().cloned()) else {
                return;
            };
            if !self.try_dispatch(&id) {
                return;
            }
            if let Some(f) = self.fns.get_mut(name) {
                f.pending.pop_front();
            }
        }
    }

    /// The function cannot serve: every call waiting for it is refused.
    fn fail_pending(&mut self, name: &str) {
        let Some(f) = self.fns.get_mut(name) else {
            return;
        };
        let why = match &f.state {
            FnState::Failed(w) => w.clone(),
            _ => "its zygote ended".into(),
        };
        let ids: Vec<String> = f.pending.drain(..).collect();
        for id in ids {
            if let Some(c) = self.calls.remove(&id) {
                self.outbox.push((
                    c.client,
                    fail(
                        ErrorCode::Unavailable,
                        format!("{name} failed to serve: {why}"),
                    ),
                    true,
                ));
            }
        }
    }

    /// A call is over: answer it, log it, count it.
    fn finish(&mut self, id: &str, usage: Option<crate::cgroup::Usage>, violation: Option<String>) {
        let Some(c) = self.calls.remove(id) else {
            return;
        };
        let (mem_text, timeout) = match self.fns.get(&c.func) {
            Some(f) => (f.mem_text.clone(), c.timeout),
            None => (String::new(), c.timeout),
        };
        let oom = usage.is_some_and(|u| u.oom_kills > 0);
        let secs = policy::limits::Dur(timeout).to_string();
        let (outcome, result, error, traceback) = match (c.forced, c.terminal) {
            (Some(Outcome::Timeout), _) => (
                Outcome::Timeout,
                None,
                Some(format!("exceeded its {secs} time limit")),
                None,
            ),
            (Some(Outcome::Stuck), _) => (
                Outcome::Stuck,
                None,
                Some(format!(
                    "sent no heartbeat for {} and was killed as stuck",
                    policy::limits::Dur(stuck_after())
                )),
                None,
            ),
            (Some(Outcome::Cancelled), _) => (
                Outcome::Cancelled,
                None,
                Some("cancelled".to_string()),
                None,
            ),
            (_, Some(Terminal::Returned(v))) => (Outcome::Ok, Some(v), None, None),
            (_, Some(Terminal::Raised { message, traceback })) => (
                Outcome::Error,
                None,
                Some(message),
                (!traceback.is_empty()).then_some(traceback),
            ),
            (_, None) if oom => (
                Outcome::Error,
                None,
                Some(format!("ran out of memory (limit {mem_text})")),
                None,
            ),
            (_, None) => (
                Outcome::Error,
                None,
                Some(match violation {
                    Some(v) => format!("the handler's process broke the agent protocol: {v}"),
                    None => "the handler's process ended without answering".to_string(),
                }),
                None,
            ),
        };
        let wall = c.started.map_or(Duration::ZERO, |s| s.elapsed());
        let metrics = Metrics {
            wall_ms: wall.as_millis() as u64,
            cpu_ms: usage.map_or(0, |u| u.cpu_usec / 1000),
            peak_rss_kb: usage.map_or(0, |u| u.peak_bytes / 1024),
        };
        let answer = ExecAnswer {
            request_id: id.to_string(),
            outcome,
            result,
            error: error.clone(),
            traceback,
            started: c.started.is_some(),
            oom_killed: oom,
            stdout: c.stdout.text.clone(),
            stdout_truncated: c.stdout.truncated,
            stderr: c.stderr.text.clone(),
            stderr_truncated: c.stderr.truncated,
            metrics,
        };
        self.outbox.push((c.client, Reply::Answer(answer), true));
        let finished_ms = now_ms();
        if let Some(f) = self.fns.get_mut(&c.func) {
            f.logs.push_back(LogEntry {
                request_id: id.to_string(),
                finished_ms,
                outcome,
                wall_ms: metrics.wall_ms,
                error,
                stdout: tail(&c.stdout.text, 4096),
                stderr: tail(&c.stderr.text, 4096),
            });
            if f.logs.len() > LOG_KEEP {
                f.logs.pop_front();
            }
            let st = &mut f.stats;
            st.requests += 1;
            st.by_outcome[outcome as usize] += 1;
            st.walls_us.push_back(wall.as_micros() as u64);
            if st.walls_us.len() > SAMPLES {
                st.walls_us.pop_front();
            }
            st.peak_rss_kb = st.peak_rss_kb.max(metrics.peak_rss_kb);
        }
        {
            let line = serde_json::json!({
                "tenant": "_host",
                "function": c.func,
                "script": c.script_digest,
                "request_id": id,
                "wall_ms": metrics.wall_ms,
                "cpu_ms": metrics.cpu_ms,
                "peak_rss_kb": metrics.peak_rss_kb,
                "outcome": outcome.as_str(),
                "finished_ms": finished_ms,
            });
            // Written by `write_usage`, after the answer has gone out.
            self.usage.push(line.to_string());
        }
        let _ = c.received;
    }
}

fn tail(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut start = s.len() - n;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

fn thaw(z: &mut Zygote) {
    let _ = z.cgroup.thaw();
    for s in z.slots.values() {
        let _ = s.cgroup.thaw();
    }
    z.frozen = false;
    z.last_beat = Instant::now();
}

fn freeze(z: &mut Zygote) {
    let _ = z.cgroup.freeze();
    for s in z.slots.values() {
        let _ = s.cgroup.freeze();
    }
    z.frozen = true;
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Functions {
    /// Timers: deadlines, heartbeats, idle freezing, answers to `serve`.
    pub fn tick(&mut self, now: Instant, cx: &mut Ctx, draining: bool) {
        let stuck = stuck_after();
        let mut kill: Vec<(String, Outcome)> = Vec::new();
        let mut expired_pending: Vec<String> = Vec::new();
        for (id, c) in &self.calls {
            if c.forced.is_some() {
                continue;
            }
            match c.started {
                Some(s) if now.duration_since(s) >= c.timeout => {
                    kill.push((id.clone(), Outcome::Timeout))
                }
                Some(_) if now.duration_since(c.last_beat) >= stuck => {
                    kill.push((id.clone(), Outcome::Stuck))
                }
                None if now.duration_since(c.received) >= c.timeout => {
                    expired_pending.push(id.clone())
                }
                _ => {}
            }
        }
        for (id, outcome) in kill {
            self.force(&id, outcome);
        }
        for id in expired_pending {
            if let Some(c) = self.calls.get_mut(&id) {
                c.forced = Some(Outcome::Timeout);
            }
            for f in self.fns.values_mut() {
                f.pending.retain(|p| *p != id);
            }
            self.finish(&id, None, None);
        }
        // Children that were answered but have not exited within the grace go with their
        // cgroup (the launcher then reports the channel closed).
        for z in self.zygotes.values() {
            for s in z.slots.values() {
                if s.answered.is_some_and(|t| now.duration_since(t) >= LINGER) {
                    let _ = s.cgroup.thaw();
                    let _ = s.cgroup.kill_all();
                }
            }
        }
        // Zygotes: a silent agent is replaced; an idle one is frozen.
        let mut dead = Vec::new();
        for (t, z) in self.zygotes.iter_mut() {
            if z.state != ZState::Ready || z.frozen {
                continue;
            }
            if now.duration_since(z.last_beat) >= stuck {
                dead.push(*t);
                continue;
            }
            let idle = self
                .fns
                .get(&z.func)
                .map_or(Duration::MAX, |f| f.spec.idle_timeout);
            if !draining
                && z.busy() == 0
                && z.parking.is_empty()
                && now.duration_since(z.last_used) >= idle
            {
                log::info!("freezing an idle zygote of {}", z.func);
                freeze(z);
            }
        }
        for t in dead {
            self.zygote_died(t, "its agent stopped sending heartbeats", cx);
        }
        // `serve` answers.
        let mut still = Vec::new();
        for (client, names, mut failed) in std::mem::take(&mut self.pending_serves) {
            let starting = names.iter().any(|n| {
                self.fns
                    .get(n)
                    .is_some_and(|f| f.state == FnState::Starting)
            });
            if starting {
                still.push((client, names, failed));
                continue;
            }
            let mut served = Vec::new();
            for n in names {
                match self.fns.get(&n).map(|f| f.state.clone()) {
                    Some(FnState::Serving) => served.push(n),
                    Some(FnState::Failed(why)) if !failed.iter().any(|(f, _)| *f == n) => {
                        failed.push((n, why));
                    }
                    _ => {}
                }
            }
            self.outbox
                .push((client, Reply::Served { served, failed }, true));
        }
        self.pending_serves = still;
    }

    /// Kill a call's cgroup from outside and record why; its answer follows when the
    /// launcher reports the channel closed.
    fn force(&mut self, id: &str, outcome: Outcome) {
        let Some(c) = self.calls.get_mut(id) else {
            return;
        };
        if c.forced.is_some() {
            return;
        }
        c.forced = Some(outcome);
        match c.at.clone() {
            Some((zt, slot)) => {
                if let Some(s) = self.zygotes.get(&zt).and_then(|z| z.slots.get(&slot)) {
                    let _ = s.cgroup.thaw();
                    if let Err(e) = s.cgroup.kill_all() {
                        log::error!("kill a request's cgroup: {e}");
                    }
                }
            }
            None => {
                for f in self.fns.values_mut() {
                    f.pending.retain(|p| p != id);
                }
                self.finish(id, None, None);
            }
        }
    }

    /// The cgroup worker finished placing parked children: their slots are ready.
    pub fn worker_done(&mut self) {
        for p in self.worker.done() {
            self.placed(p);
        }
    }

    /// A parked child's placement, by the worker or the loop: its slot is ready (or, if
    /// placing it failed, the launcher lets the child go).
    fn placed(&mut self, p: Placed) {
        let waiting = self
            .zygotes
            .get(&p.zt)
            .is_some_and(|z| z.state != ZState::Dead && z.placing.contains(&p.slot));
        if !waiting {
            // Its zygote or the child went away meanwhile.
            if let Ok(cg) = p.result {
                self.worker.send(Job::Remove(cg));
            }
            return;
        }
        let Some(z) = self.zygotes.get_mut(&p.zt) else {
            return;
        };
        z.placing.retain(|s| *s != p.slot);
        match p.result {
            Ok(cg) => {
                if z.frozen {
                    let _ = cg.freeze();
                }
                z.slots.insert(
                    p.slot,
                    Slot {
                        cgroup: cg,
                        request: None,
                        answered: None,
                    },
                );
            }
            Err(e) => {
                // The launcher lets go of the child's channel, and a parked child whose
                // channel closes before a request exits (it is still in the zygote's
                // cgroup meanwhile). No kill by pid: that pid may be someone else's by now.
                log::error!("give a parked child its cgroup: {e}");
                z.conn.send(&ToLauncher::Reap { slot: p.slot });
            }
        }
        let func = z.func.clone();
        self.dispatch_pending(&func);
    }

    /// Append the usage lines of the requests answered since the last call to the usage
    /// log: whole lines in one write, so a line is never split by a crash or a reader.
    pub fn write_usage(&mut self) {
        self.usage.flush();
    }

    /// Whether background work is waiting (the loop then polls without sleeping).
    pub fn has_background(&self) -> bool {
        !self.parks.is_empty() || !self.settling.is_empty()
    }

    /// Lower the weight of what was answered, or replace one spare.
    pub fn background_step(&mut self) {
        if !self.settling.is_empty() {
            for (zt, slot) in std::mem::take(&mut self.settling) {
                let Some(s) = self.zygotes.get(&zt).and_then(|z| z.slots.get(&slot)) else {
                    continue;
                };
                if let Err(e) = s.cgroup.set_weight(Weight::Background) {
                    log::debug!("lower an answered request's CPU weight: {e}");
                }
            }
        } else if let Some(zt) = self.parks.pop_front() {
            self.park(zt);
        }
    }

    pub fn next_wake(&self, _now: Instant) -> Option<Duration> {
        if self.calls.is_empty() && self.pending_serves.is_empty() {
            Some(Duration::from_secs(1))
        } else {
            Some(Duration::from_millis(20))
        }
    }

    fn stop(&mut self, name: &str, cx: &Ctx) -> Reply {
        let Some(f) = self.fns.get(name) else {
            return fail(
                ErrorCode::NotFound,
                format!("no function named {name:?} is served"),
            );
        };
        let zs = f.zygotes.clone();
        let ids: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.func == name)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            if let Some(c) = self.calls.get_mut(id) {
                c.forced = Some(Outcome::Cancelled);
            }
        }
        for t in zs {
            self.kill_zygote(t, cx);
        }
        for id in ids {
            self.finish(&id, None, None);
        }
        self.fns.remove(name);
        // The worker removes the cgroups it kept for the function, then its folder.
        self.worker.forget(name, format!("tenants/_host/{name}"));
        log::info!("stopped {name}");
        Reply::Stopped {
            name: name.to_string(),
        }
    }

    fn warm(&mut self, name: &str, n: usize, cx: &mut Ctx) -> Reply {
        let Some(f) = self.fns.get_mut(name) else {
            return fail(
                ErrorCode::NotFound,
                format!("no function named {name:?} is served"),
            );
        };
        if let FnState::Failed(why) = &f.state {
            return fail(
                ErrorCode::Unavailable,
                format!("{name} failed to serve: {why}"),
            );
        }
        let max = (f.spec.max_warm as usize).max(1);
        f.min_warm = n.clamp(1, max);
        let want = f.min_warm;
        let have = f.zygotes.len();
        for _ in have..want {
            if let Err(e) = self.spawn_zygote(name, cx) {
                return fail(
                    ErrorCode::Internal,
                    format!("start a zygote of {name}: {e}"),
                );
            }
        }
        let zs = self
            .fns
            .get(name)
            .map(|f| f.zygotes.clone())
            .unwrap_or_default();
        for t in &zs {
            if let Some(z) = self.zygotes.get_mut(t) {
                if z.frozen {
                    thaw(z);
                }
                z.last_used = Instant::now();
            }
        }
        let ready = zs
            .iter()
            .filter(|t| {
                self.zygotes
                    .get(t)
                    .is_some_and(|z| z.state == ZState::Ready)
            })
            .count();
        Reply::Warmed {
            name: name.to_string(),
            ready: ready as u32,
        }
    }

    fn cancel(&mut self, key: &str) -> Reply {
        let ids: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.key.as_deref() == Some(key))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            self.force(id, Outcome::Cancelled);
        }
        Reply::Cancelled {
            count: ids.len() as u32,
        }
    }

    pub fn client_gone(&mut self, t: Token) {
        let ids: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.client == t)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.force(&id, Outcome::Cancelled);
        }
        self.pending_serves.retain(|(c, _, _)| *c != t);
    }

    pub fn reap_launchers(&mut self) {
        for z in self.zygotes.values_mut() {
            if let Ok(Some(_)) = z.child.try_wait() {
                z.state = ZState::Dead;
            }
        }
    }

    pub fn shutdown(&mut self, cx: &Ctx) {
        // What the worker is still placing goes with its zygote; wait for it first.
        self.worker.finish();
        for p in self.worker.done() {
            if let Ok(cg) = p.result {
                let _ = cg.remove();
            }
        }
        self.parks.clear();
        let ids: Vec<String> = self.calls.keys().cloned().collect();
        for id in &ids {
            if let Some(c) = self.calls.get_mut(id) {
                c.forced.get_or_insert(Outcome::Cancelled);
            }
        }
        let zs: Vec<Token> = self.zygotes.keys().copied().collect();
        for t in zs {
            self.kill_zygote(t, cx);
        }
        for id in ids {
            self.finish(&id, None, None);
        }
        for name in self.fns.keys() {
            self.backend.prune(&format!("tenants/_host/{name}"));
        }
        self.backend.prune("tenants/_host");
        self.backend.prune("tenants");
    }

    fn list(&self) -> Vec<FunctionInfo> {
        self.fns
            .iter()
            .map(|(name, f)| {
                let mut counts = ZygoteCounts {
                    ready: 0,
                    busy: 0,
                    frozen: 0,
                    starting: 0,
                };
                for z in f.zygotes.iter().filter_map(|t| self.zygotes.get(t)) {
                    match (z.state, z.frozen, z.busy()) {
                        (ZState::Starting, _, _) => counts.starting += 1,
                        (ZState::Ready, true, _) => counts.frozen += 1,
                        (ZState::Ready, false, 0) => counts.ready += 1,
                        (ZState::Ready, false, _) => counts.busy += 1,
                        (ZState::Dead, _, _) => {}
                    }
                }
                let (state, error) = match &f.state {
                    FnState::Starting => ("starting", None),
                    FnState::Serving => ("serving", None),
                    FnState::Failed(w) => ("failed", Some(w.clone())),
                };
                FunctionInfo {
                    name: name.clone(),
                    kind: if is_pool(&f.spec) { "pool" } else { "function" }.into(),
                    state: state.into(),
                    error,
                    zygotes: counts,
                    in_flight: self.calls.values().filter(|c| c.func == *name).count() as u32,
                    min_warm: f.min_warm as u32,
                    max_warm: f.spec.max_warm,
                }
            })
            .collect()
    }

    fn stats(&self, name: Option<&str>) -> Reply {
        if let Some(n) = name {
            if !self.fns.contains_key(n) {
                return fail(
                    ErrorCode::NotFound,
                    format!("no function named {n:?} is served"),
                );
            }
        }
        let out = self
            .fns
            .iter()
            .filter(|(n, _)| name.is_none_or(|x| x == n.as_str()))
            .map(|(n, f)| {
                let mut w: Vec<u64> = f.stats.walls_us.iter().copied().collect();
                w.sort_unstable();
                let o = &f.stats.by_outcome;
                FunctionStats {
                    name: n.clone(),
                    requests: f.stats.requests,
                    ok: o[Outcome::Ok as usize],
                    error: o[Outcome::Error as usize],
                    timeout: o[Outcome::Timeout as usize],
                    cancelled: o[Outcome::Cancelled as usize],
                    stuck: o[Outcome::Stuck as usize],
                    p50_wall_us: percentile(&w, 0.5),
                    p99_wall_us: percentile(&w, 0.99),
                    peak_rss_kb: f.stats.peak_rss_kb,
                }
            })
            .collect();
        Reply::Stats(out)
    }
}
