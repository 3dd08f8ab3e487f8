//! The supervisor: the monitor as a long-lived daemon.
//!
//! One thread, one mio event loop. It listens on a unix socket (mode 0600, in the runtime
//! directory) for fronts, and holds one socketpair per zygote's launcher. Every request a
//! front sends is checked against its role's dispatch table ([`allowed`]) before its one
//! handler runs; a frame that does not decode, or a request the role may not send, ends
//! the connection. Deadlines, heartbeats (stuck), cancels, idle freezing and drain are all
//! decided here, on the loop's clock.
//!
//! Work that could hold the loop, and with it every other caller, runs on threads beside
//! it that wake it with their results: the keeper's cgroup worker ([`crate::keeper::cgworker`]), the store writer
//! ([`store_writer`]) and the checker of large events ([`event_check`]).
//!
//! Fronts cannot make it hold more than a bounded amount, however many connect and
//! whatever they send (the limits and why are in [`conn`]): at most [`MAX_FRONTS`]
//! connections; exactly one frame, a few bytes, is read as the hello and every frame after
//! it is a request; a connection is read only as far as it could be served, so a client
//! that does not read its answers, or pipelines faster than its calls finish, is held
//! back in its own socket; a large frame is read only once its size is set aside from a
//! budget all connections share; a connection that stalls mid-frame is closed after
//! [`FRAME_STALL`]. Each closed connection is logged once, with the reason.
//!
//! SIGTERM and SIGINT drain: no new calls, running ones may finish within the grace
//! (25 s), then every zygote is killed and every cgroup removed. SIGCHLD reaps launchers.

pub mod api;
mod event_check;
pub(crate) mod functions;
mod scripts;
mod store_writer;
mod turns;
mod usage;

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mio::net::{UnixListener, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use plumbing::conn::{
    self, Conn, Got, InputBudget, CHUNK, FRAME_STALL, INPUT_BUDGET, MAX_FRONTS, MAX_HELLO_FRAME,
    MAX_QUEUED, MAX_QUEUED_BYTES, OUTPUT_BUDGET, OUT_LOW, SMALL_FRAME,
};
use plumbing::paths;
use proto::front::{ErrorCode, Hello, HelloReply, Reply, Request, Role, MAX_FRONT_FRAME};

use crate::cgroup::Backend;
use functions::{Ctx, Functions};

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const WAKER: Token = Token(2);
const FIRST_DYNAMIC: usize = 16;

/// The longest grace a drain asked for over the API gets.
const MAX_API_GRACE_MS: u64 = 3600 * 1000;

/// How long running requests may go on after a drain begins, unless told otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(25);

/// A connection past [`MAX_FRONTS`] is sent its refusal and shut for writing, then kept
/// this long before it is closed: closed at once, it could be reset before its peer has
/// written its hello and read why. At most [`MAX_REFUSING`] are kept so.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
const MAX_REFUSING: usize = 64;

/// Why a front's connection ended when its peer closed it between frames (not logged as a
/// problem).
const CLOSED: &str = "it closed the connection";

#[derive(Debug)]
pub struct SupervisorError(pub String);

impl std::fmt::Display for SupervisorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SupervisorError {}

/// The refusal of new work once a drain has begun.
fn draining_refusal() -> Reply {
    Reply::Error {
        code: ErrorCode::Unavailable,
        message: "the supervisor is draining and takes no new work".into(),
        retry_after: Some(5),
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> SupervisorError {
    SupervisorError(format!("{what}: {e}"))
}

/// The kinds of request, for the dispatch tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ServeAll,
    Serve,
    Stop,
    Exec,
    List,
    Logs,
    Stats,
    Warm,
    Cancel,
    Drain,
    PutScript,
    Health,
    Api,
    ServeLayer,
    Run,
    ScriptInfo,
    DeleteScript,
    CreateTenant,
    ListTenants,
    GetTenant,
    DeleteTenant,
    SetLimits,
    MintToken,
    ListTokens,
    RevokeToken,
    Version,
    PutSecret,
    DeleteSecret,
    ListSecrets,
    Metrics,
    RecordUsage,
    PutBlob,
    DeleteBlob,
    PutDeps,
    ListDeps,
    DepsInfo,
    DeleteDeps,
}

fn kind(r: &Request) -> Kind {
    match r {
        Request::ServeAll { .. } => Kind::ServeAll,
        Request::Serve { .. } => Kind::Serve,
        Request::Stop { .. } => Kind::Stop,
        Request::Exec(_) => Kind::Exec,
        Request::List => Kind::List,
        Request::Logs { .. } => Kind::Logs,
        Request::Stats { .. } => Kind::Stats,
        Request::Warm { .. } => Kind::Warm,
        Request::Cancel { .. } => Kind::Cancel,
        Request::Drain { .. } => Kind::Drain,
        Request::PutScript { .. } => Kind::PutScript,
        Request::Health => Kind::Health,
        Request::Api { .. } => Kind::Api,
        Request::ServeLayer { .. } => Kind::ServeLayer,
        Request::Run { .. } => Kind::Run,
        Request::ScriptInfo { .. } => Kind::ScriptInfo,
        Request::DeleteScript { .. } => Kind::DeleteScript,
        Request::CreateTenant { .. } => Kind::CreateTenant,
        Request::ListTenants => Kind::ListTenants,
        Request::GetTenant { .. } => Kind::GetTenant,
        Request::DeleteTenant { .. } => Kind::DeleteTenant,
        Request::SetLimits { .. } => Kind::SetLimits,
        Request::MintToken { .. } => Kind::MintToken,
        Request::ListTokens => Kind::ListTokens,
        Request::RevokeToken { .. } => Kind::RevokeToken,
        Request::Version => Kind::Version,
        Request::PutSecret { .. } => Kind::PutSecret,
        Request::DeleteSecret { .. } => Kind::DeleteSecret,
        Request::ListSecrets { .. } => Kind::ListSecrets,
        Request::Metrics => Kind::Metrics,
        Request::RecordUsage(_) => Kind::RecordUsage,
        Request::PutBlob { .. } => Kind::PutBlob,
        Request::DeleteBlob { .. } => Kind::DeleteBlob,
        Request::PutDeps { .. } => Kind::PutDeps,
        Request::ListDeps => Kind::ListDeps,
        Request::DepsInfo { .. } => Kind::DepsInfo,
        Request::DeleteDeps { .. } => Kind::DeleteDeps,
    }
}

/// What each role may ask. The CLI is the host's operator on the host's own socket; the
/// MCP front may only list, call and read logs.
const DISPATCH_CLI: &[Kind] = &[
    Kind::ServeAll,
    Kind::Serve,
    Kind::Stop,
    Kind::Exec,
    Kind::List,
    Kind::Logs,
    Kind::Stats,
    Kind::Warm,
    Kind::Cancel,
    Kind::Drain,
    Kind::PutScript,
    Kind::Health,
    Kind::Run,
    Kind::MintToken,
    Kind::ListTokens,
    Kind::RevokeToken,
    Kind::PutSecret,
    Kind::DeleteSecret,
    Kind::ListSecrets,
];
const DISPATCH_MCP: &[Kind] = &[Kind::List, Kind::Exec, Kind::Logs, Kind::RecordUsage];
/// The API front sends every request inside an envelope saying who sent it.
const DISPATCH_API: &[Kind] = &[Kind::Api];
/// What an API envelope may carry (never another envelope). Who may ask for each is the
/// deploy gate's (`policy::gate`), decided after the caller is known.
const DISPATCH_API_INNER: &[Kind] = &[
    Kind::Health,
    Kind::Version,
    Kind::List,
    Kind::ServeLayer,
    Kind::Stop,
    Kind::Exec,
    Kind::Logs,
    Kind::Stats,
    Kind::Warm,
    Kind::Run,
    Kind::PutScript,
    Kind::ScriptInfo,
    Kind::DeleteScript,
    Kind::PutBlob,
    Kind::DeleteBlob,
    Kind::PutDeps,
    Kind::ListDeps,
    Kind::DepsInfo,
    Kind::DeleteDeps,
    Kind::Cancel,
    Kind::CreateTenant,
    Kind::ListTenants,
    Kind::GetTenant,
    Kind::DeleteTenant,
    Kind::SetLimits,
    Kind::MintToken,
    Kind::ListTokens,
    Kind::RevokeToken,
    Kind::Drain,
    Kind::PutSecret,
    Kind::DeleteSecret,
    Kind::ListSecrets,
    Kind::Metrics,
];

/// The gate's row for an inner API request (`None`: the API may not ask for it).
fn gate_route(k: Kind) -> Option<policy::gate::Route> {
    use policy::gate::Route;
    Some(match k {
        Kind::Health => Route::Health,
        Kind::Version => Route::Version,
        Kind::List => Route::List,
        Kind::ServeLayer => Route::ServeLayer,
        Kind::Stop => Route::Stop,
        Kind::Exec => Route::Exec,
        Kind::Logs => Route::Logs,
        Kind::Stats => Route::Stats,
        Kind::Warm => Route::Warm,
        Kind::Run => Route::Run,
        Kind::PutScript => Route::PutScript,
        Kind::ScriptInfo => Route::ScriptInfo,
        Kind::DeleteScript => Route::DeleteScript,
        Kind::PutBlob => Route::PutBlob,
        Kind::DeleteBlob => Route::DeleteBlob,
        Kind::PutDeps => Route::PutDeps,
        Kind::ListDeps => Route::ListDeps,
        Kind::DepsInfo => Route::DepsInfo,
        Kind::DeleteDeps => Route::DeleteDeps,
        Kind::Cancel => Route::Cancel,
        Kind::CreateTenant => Route::CreateTenant,
        Kind::ListTenants => Route::ListTenants,
        Kind::GetTenant => Route::GetTenant,
        Kind::DeleteTenant => Route::DeleteTenant,
        Kind::SetLimits => Route::SetLimits,
        Kind::MintToken => Route::MintToken,
        Kind::ListTokens => Route::ListTokens,
        Kind::RevokeToken => Route::RevokeToken,
        Kind::Drain => Route::Drain,
        Kind::PutSecret => Route::PutSecret,
        Kind::DeleteSecret => Route::DeleteSecret,
        Kind::ListSecrets => Route::ListSecrets,
        Kind::Metrics => Route::Metrics,
        Kind::ServeAll | Kind::Serve | Kind::Api | Kind::RecordUsage => return None,
    })
}

fn allowed(role: Role, k: Kind) -> bool {
    let table = match role {
        Role::Cli => DISPATCH_CLI,
        Role::Mcp => DISPATCH_MCP,
        Role::Api => DISPATCH_API,
    };
    table.contains(&k)
}

struct Client {
    conn: Conn,
    role: Option<Role>,
    /// How the front was started (its hello's flags; only the API role's mean anything).
    flags: proto::api::FrontFlags,
    /// The request this client waits on (one at a time per connection).
    waiting: bool,
    /// Requests that arrived while it waited, in order, with their frames' sizes.
    queued: VecDeque<(Request, usize)>,
    queued_bytes: usize,
    /// What it holds of the input budget: the size of the large frame it is reading.
    reserved: usize,
    /// Since when the supervisor has been waiting for the rest of a frame from it (before
    /// its hello: since it was accepted). Past [`FRAME_STALL`] it is closed.
    owes_since: Option<Instant>,
}

impl Client {
    fn new(conn: Conn) -> Client {
        Client {
            conn,
            role: None,
            flags: Default::default(),
            waiting: false,
            queued: VecDeque::new(),
            queued_bytes: 0,
            reserved: 0,
            owes_since: Some(Instant::now()),
        }
    }

    /// Whether another request may be read into its queue.
    fn queue_has_room(&self) -> bool {
        self.queued.len() < MAX_QUEUED && self.queued_bytes < MAX_QUEUED_BYTES
    }

    /// Whether a request read now could start at once: it has said hello, nothing of its
    /// own runs or waits, and it has read its answers.
    fn could_start(&self) -> bool {
        self.role.is_some()
            && !self.waiting
            && self.queued.is_empty()
            && self.conn.unsent() <= OUT_LOW
    }

    /// Whether the supervisor waits on this peer: part of a frame has come, and the
    /// supervisor would read the rest now (or would, but for its turn at the input budget).
    fn owes_bytes(&self) -> bool {
        self.conn.partial()
            && match self.conn.next_size() {
                Ok(Some(size)) if size > SMALL_FRAME => self.could_start(),
                _ => self.queue_has_room(),
            }
    }
}

pub struct Supervisor {
    poll: Poll,
    listener: UnixListener,
    signal_fd: OwnedFd,
    clients: HashMap<Token, Client>,
    next_token: usize,
    fns: Functions,
    drain: Option<Instant>,
    /// Calls in flight when the drain began, and the clients waiting for its end.
    drain_from: u32,
    drain_waiters: Vec<Token>,
    /// systemd, when it started us as a `Type=notify` service.
    notify: crate::notify::Notifier,
    socket: PathBuf,
    /// The input budget large frames are read under, and its line.
    budget: InputBudget,
    /// Connections refused past the cap, until they are closed.
    refusing: VecDeque<(UnixStream, Instant)>,
    /// Refusals not logged yet, and when the last line about them was.
    refusals: u64,
    refusal_logged: Option<Instant>,
}

/// The signals the supervisor handles, blocked on this (only) thread and read from a
/// signalfd in the event loop.
fn block_signals() -> Result<OwnedFd, SupervisorError> {
    let set = plumbing::signals::block_signals(&[
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGCHLD,
        libc::SIGHUP,
    ])
    .map_err(|e| err("block signals", e))?;
    plumbing::signals::signalfd(&set).map_err(|e| err("create a signalfd", e))
}

/// The supervisor holds a few descriptors for each cgroup it keeps (five directories and
/// three counters on v1) and one socket per zygote and client: let it have as many
/// descriptors as its hard limit allows, up to a million, instead of the usual 1024.
fn raise_open_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            let want = lim.rlim_max.min(1 << 20);
            if want > lim.rlim_cur {
                lim.rlim_cur = want;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }
}

impl Supervisor {
    /// Bind the control socket and prepare the state. Fails if another supervisor answers
    /// on the socket.
    pub fn new(launcher: PathBuf) -> Result<Supervisor, SupervisorError> {
        // Read (and removed from the environment) before any thread or process starts.
        let notify = crate::notify::Notifier::from_env();
        // First of all: on cgroup v2 Zygo may have to move itself into a leaf of its
        // cgroup, which only works while it is alone there.
        let backend = Backend::detect().map_err(|e| SupervisorError(e.to_string()))?;
        raise_open_files();
        let runtime = paths::runtime_dir();
        paths::make_private_dir(&runtime)
            .map_err(|e| err(&format!("create {}", runtime.display()), e))?;
        let state = paths::state_dir();
        paths::make_private_dir(&state)
            .map_err(|e| err(&format!("create {}", state.display()), e))?;
        let socket = paths::socket_path();
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return Err(SupervisorError(format!(
                "a supervisor is already running on {}",
                socket.display()
            )));
        }
        // The API's records, and the bootstrap token taken out of the environment before
        // any thread or process is started; a record that cannot be read refuses the start
        // before the socket is bound.
        let api_store = api::store::Files::open(state.join("api"))
            .map_err(|e| SupervisorError(format!("the API's records: {e}")))?;
        let api = api::Api::open(Box::new(api_store))?;
        let _ = std::fs::remove_file(&socket);
        // The socket is created 0600 (umask), inside a 0700 directory.
        // SAFETY: umask cannot fail.
        let old = unsafe { libc::umask(0o177) };
        let listener = UnixListener::bind(&socket);
        // SAFETY: restoring the previous umask.
        unsafe { libc::umask(old) };
        let mut listener =
            listener.map_err(|e| err(&format!("listen on {}", socket.display()), e))?;
        let identity = crate::identity::identity().map_err(|e| SupervisorError(e.to_string()))?;
        if let Some(why) = identity.shortfall() {
            log::warn!("{why}");
        }
        let signal_fd = block_signals()?;
        let poll = Poll::new().map_err(|e| err("create the event loop", e))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(|e| err("register the listener", e))?;
        poll.registry()
            .register(
                &mut SourceFd(&signal_fd.as_raw_fd()),
                SIGNALS,
                Interest::READABLE,
            )
            .map_err(|e| err("register the signalfd", e))?;
        let usage_path = state.join("usage.log");
        let scripts = state.join("scripts");
        paths::make_private_dir(&scripts)
            .map_err(|e| err(&format!("create {}", scripts.display()), e))?;
        let blobs = state.join("blobs");
        paths::make_private_dir(&blobs)
            .map_err(|e| err(&format!("create {}", blobs.display()), e))?;
        let waker = std::sync::Arc::new(
            mio::Waker::new(poll.registry(), WAKER).map_err(|e| err("create a waker", e))?,
        );
        let mut fns = Functions::new(
            backend,
            waker,
            identity,
            launcher,
            usage_path,
            functions::StoreDirs {
                scripts,
                blobs,
                state: state.to_path_buf(),
            },
            api,
        )?;
        fns.sweep_stale();
        fns.forget_evicted_script_owners();
        log::info!(
            "supervisor listening on {} (cgroup {}, state {})",
            socket.display(),
            fns.backend_root(),
            state.display()
        );
        Ok(Supervisor {
            poll,
            listener,
            signal_fd,
            clients: HashMap::new(),
            next_token: FIRST_DYNAMIC,
            fns,
            drain: None,
            drain_from: 0,
            drain_waiters: Vec::new(),
            notify,
            socket,
            budget: InputBudget::new(INPUT_BUDGET),
            refusing: VecDeque::new(),
            refusals: 0,
            refusal_logged: None,
        })
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    /// Run until drained.
    pub fn run(mut self) -> Result<(), SupervisorError> {
        let mut events = Events::with_capacity(256);
        // The socket is bound and the state open: from here connections are served.
        self.notify.send(&format!(
            "READY=1\nSTATUS=serving on {} (cgroup {})",
            self.socket.display(),
            self.fns.backend_root()
        ));
        loop {
            let now = Instant::now();
            let mut timeout = if self.fns.has_background() {
                Duration::ZERO
            } else {
                self.fns
                    .next_wake(now)
                    .map_or(Duration::from_secs(1), |d| d.min(Duration::from_secs(1)))
            };
            if let Some(at) = self.next_conn_deadline() {
                timeout = timeout.min(at.saturating_duration_since(now));
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(err("wait for events", e));
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    SIGNALS => self.signals(),
                    WAKER => {
                        let mut cx = Ctx::new(self.poll.registry(), &mut self.next_token);
                        self.fns.worker_done(&mut cx);
                    }
                    t if self.clients.contains_key(&t) => self.service(t),
                    t => {
                        let mut cx = Ctx::new(self.poll.registry(), &mut self.next_token);
                        self.fns.zygote_event(t, &mut cx);
                    }
                }
            }
            // Answers first, then timers (which may answer too), then the usage log.
            self.deliver();
            let now = Instant::now();
            {
                let mut cx = Ctx::new(self.poll.registry(), &mut self.next_token);
                self.fns.tick(now, &mut cx, self.drain.is_some());
            }
            // Usage lines are written before the answers they belong to leave, so a caller
            // that reads usage.log after its answer finds its line there.
            self.fns.write_usage();
            self.deliver();
            // Stalled connections go first, so the budget they held is served at once.
            self.close_stalled(Instant::now());
            self.serve_line();
            // Background work (refilling spares; cgroups are the worker thread's) one
            // piece at a time, so a call that arrives meanwhile waits for one piece at most.
            if events.is_empty() {
                self.fns.background_step();
            }
            if let Some(deadline) = self.drain {
                if self.fns.in_flight() == 0 || now >= deadline {
                    log::info!(
                        "drain complete ({} requests still running were cancelled)",
                        self.fns.in_flight()
                    );
                    self.notify.status(&format!(
                        "drained ({} requests cut off); removing sandboxes",
                        self.fns.in_flight()
                    ));
                    break;
                }
            }
        }
        // New calls were refused while draining, so what is still in flight is what the
        // grace cut off of the calls running when it began.
        let cut_off = (self.fns.in_flight() as u32).min(self.drain_from);
        self.fns
            .shutdown(&Ctx::new(self.poll.registry(), &mut self.next_token));
        // Answer what shutdown cut off, then whoever asked for the drain, and give the
        // answers a moment to leave.
        self.deliver();
        for t in std::mem::take(&mut self.drain_waiters) {
            self.reply(
                t,
                Reply::Drained {
                    finished: self.drain_from - cut_off,
                    cut_off,
                },
            );
        }
        self.fns.write_usage();
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let mut pending = false;
            for c in self.clients.values_mut() {
                c.conn.flush();
                pending |= c.conn.pending();
            }
            if !pending {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_file(&self.socket);
        self.fns.release_cgroup_root();
        Ok(())
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if self.clients.len() >= MAX_FRONTS {
                        self.refuse(stream);
                        continue;
                    }
                    let t = self.token();
                    if let Err(e) = self.poll.registry().register(
                        &mut stream,
                        t,
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        log::warn!("register a client: {e}");
                        continue;
                    }
                    // Until its hello is taken, its first frame may be a few bytes only.
                    self.clients
                        .insert(t, Client::new(Conn::new(stream, MAX_HELLO_FRAME)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("accept: {e}");
                    return;
                }
            }
        }
    }

    fn signals(&mut self) {
        let mut info = [0u8; 128];
        loop {
            // SAFETY: reading signalfd_siginfo records into a buffer of the right size.
            let n = unsafe {
                libc::read(
                    self.signal_fd.as_raw_fd(),
                    info.as_mut_ptr().cast(),
                    info.len(),
                )
            };
            if n <= 0 {
                break;
            }
            let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]) as i32;
            match signo {
                libc::SIGTERM | libc::SIGINT | libc::SIGHUP => self.begin_drain(DEFAULT_GRACE),
                libc::SIGCHLD => self.fns.reap_launchers(),
                _ => {}
            }
        }
    }

    fn begin_drain(&mut self, grace: Duration) {
        if self.drain.is_none() {
            self.drain_from = self.fns.in_flight() as u32;
            log::info!(
                "draining: no new calls; {} running may finish within {}s",
                self.fns.in_flight(),
                grace.as_secs()
            );
            let now = Instant::now();
            // However long the grace asked for, the deadline is a time the clock can hold.
            self.drain = Some(
                now.checked_add(grace)
                    .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600)),
            );
            self.fns.begin_drain();
            self.notify.send(&format!(
                "STOPPING=1\nSTATUS=draining: {} requests running may finish within {}s",
                self.fns.in_flight(),
                grace.as_secs()
            ));
        }
    }

    /// A connection past [`MAX_FRONTS`]: told why, shut for writing so its peer reads the
    /// refusal and then the end, and closed for good a moment later. Logged at most once
    /// a second, with how many were refused.
    fn refuse(&mut self, mut stream: UnixStream) {
        let reason =
            format!("the supervisor has {MAX_FRONTS} connections open, its limit; try again later");
        if let Ok(f) = proto::encode_frame(&HelloReply::Refused { reason }) {
            // A new socket's buffer is empty: these few bytes go in one write or not at all.
            let _ = stream.write(&f);
        }
        let _ = stream.shutdown(Shutdown::Write);
        if self.refusing.len() >= MAX_REFUSING {
            self.refusing.pop_front();
        }
        let now = Instant::now();
        self.refusing.push_back((stream, now + REFUSAL_LINGER));
        self.refusals += 1;
        if self
            .refusal_logged
            .is_none_or(|at| now >= at + Duration::from_secs(1))
        {
            log::warn!(
                "refused {} front connection(s): {MAX_FRONTS} are open, the limit",
                self.refusals
            );
            self.refusals = 0;
            self.refusal_logged = Some(now);
        }
    }

    /// Everything a front's connection is ready for: whole frames taken (the hello, then
    /// requests) while there is room for them, the next request started, answers written,
    /// and more read, as far as its limits allow. Called on each of its events and again
    /// whenever something that held it back has changed (its call ended, the input budget
    /// came free): readiness is edge-triggered, so a connection that was held back with
    /// bytes waiting in its socket is read again only because of such a call.
    fn service(&mut self, t: Token) {
        let end = loop {
            if let Err(why) = self.take_frames(t) {
                break Some(why);
            }
            self.pump_client(t);
            let Some(c) = self.clients.get_mut(&t) else {
                return;
            };
            c.conn.flush();
            if let Some(why) = c.conn.closed.take() {
                break Some(why);
            }
            match self.read_more(t) {
                Ok(true) => continue,
                Ok(false) => break None,
                Err(why) => break Some(why),
            }
        };
        match end {
            Some(why) => self.drop_client(t, &why),
            None => {
                if let Some(c) = self.clients.get_mut(&t) {
                    // Before the hello, the clock runs from the accept until it is taken.
                    if c.role.is_some() {
                        if c.owes_bytes() {
                            c.owes_since.get_or_insert_with(Instant::now);
                        } else {
                            c.owes_since = None;
                        }
                    }
                }
            }
        }
    }

    /// Take the whole frames a front has sent, while its queue has room: the first is its
    /// hello, exactly one; every frame after it, read with it or later, is a request,
    /// checked against the role's dispatch table as it is taken.
    fn take_frames(&mut self, t: Token) -> Result<(), String> {
        loop {
            let Some(c) = self.clients.get_mut(&t) else {
                return Ok(());
            };
            let Some(role) = c.role else {
                let hello = c
                    .conn
                    .take::<Hello>()
                    .map_err(|e| format!("its hello: {e}"))?;
                let Some(h) = hello else {
                    return Ok(());
                };
                let role = match plumbing::hello::check(&h, None) {
                    Ok(role) => role,
                    Err(reason) => {
                        c.conn.send(&HelloReply::Refused {
                            reason: reason.clone(),
                        });
                        return Err(format!("its hello was refused: {reason}"));
                    }
                };
                c.role = Some(role);
                if role == Role::Api {
                    c.flags = h.flags;
                }
                c.owes_since = None;
                c.conn.set_max_frame(MAX_FRONT_FRAME);
                c.conn.send(&plumbing::hello::welcome());
                continue;
            };
            if !c.queue_has_room() {
                return Ok(());
            }
            let Some(size) = c.conn.next_size().map_err(|e| e.to_string())? else {
                return Ok(());
            };
            let Some(req) = c.conn.take::<Request>().map_err(|e| e.to_string())? else {
                return Ok(());
            };
            c.owes_since = None;
            if c.reserved > 0 {
                self.budget.give_back(c.reserved);
                c.reserved = 0;
            }
            if !allowed(role, kind(&req)) {
                return Err(format!("a {role:?} front may not ask for {:?}", kind(&req)));
            }
            c.queued_bytes += size;
            c.queued.push_back((req, size));
        }
    }

    /// Read once more from a front, if its limits allow. `Ok(true)` when bytes came.
    ///
    /// A frame up to [`SMALL_FRAME`] is read whenever the queue has room. A larger one is
    /// read only when it could start at once, and only once its whole size is set aside
    /// from the input budget (all or nothing, so that connections each holding part of
    /// the budget cannot wait on each other); it is read up to its end and no further.
    fn read_more(&mut self, t: Token) -> Result<bool, String> {
        let Some(c) = self.clients.get_mut(&t) else {
            return Ok(false);
        };
        let buffered = c.conn.buffered();
        let want = match c.conn.next_size().map_err(|e| e.to_string())? {
            Some(size) if size > SMALL_FRAME => {
                if buffered >= size || !c.could_start() {
                    // Held back for its own sake (its call runs, its answers are unread):
                    // it is out of the line until it could start.
                    self.budget.leave(t);
                    return Ok(false);
                }
                if c.reserved == 0 {
                    if !self.budget.take(t, size) {
                        return Ok(false);
                    }
                    c.reserved = size;
                }
                size - buffered
            }
            _ => {
                if !c.queue_has_room() || buffered >= SMALL_FRAME {
                    return Ok(false);
                }
                SMALL_FRAME - buffered
            }
        };
        match c
            .conn
            .read_some(want.min(CHUNK))
            .map_err(|e| e.to_string())?
        {
            Got::Bytes => Ok(true),
            Got::Nothing => Ok(false),
            Got::End => Err(match c.conn.end_of_stream() {
                Ok(()) => CLOSED.to_string(),
                Err(e) => e.to_string(),
            }),
        }
    }

    /// Give the input budget's line its turn: a connection waiting for its share has its
    /// bytes in its socket already, and no event would come to read them.
    fn serve_line(&mut self) {
        while let Some(t) = self.budget.first() {
            if !self.clients.contains_key(&t) {
                self.budget.leave(t);
                continue;
            }
            self.service(t);
            if self.budget.first() == Some(t) {
                // Still not enough free: the next release tries again.
                return;
            }
        }
    }

    /// Close the connections the supervisor has waited on for [`FRAME_STALL`] (a hello
    /// that did not come, a frame that stopped mid-way), and the refused ones whose
    /// moment has passed.
    fn close_stalled(&mut self, now: Instant) {
        let late: Vec<(Token, String)> = self
            .clients
            .iter()
            .filter_map(|(t, c)| {
                let since = c.owes_since?;
                if now < since + FRAME_STALL {
                    return None;
                }
                let secs = FRAME_STALL.as_secs();
                let why = match (c.role, c.conn.next_size()) {
                    (None, _) => format!("it sent no hello within {secs}s"),
                    (Some(_), Ok(Some(size))) if size > SMALL_FRAME && c.reserved == 0 => {
                        format!(
                            "its frame stayed incomplete for {secs}s ({} of {size} bytes): \
                             it waited in line for the input budget all that time",
                            c.conn.buffered()
                        )
                    }
                    (Some(_), size) => format!(
                        "its frame stayed incomplete for {secs}s ({} of {} bytes): it stopped \
                         sending",
                        c.conn.buffered(),
                        size.ok().flatten().map_or("?".into(), |s| s.to_string())
                    ),
                };
                Some((*t, why))
            })
            .collect();
        for (t, why) in late {
            self.drop_client(t, &why);
        }
        while self.refusing.front().is_some_and(|(_, at)| now >= *at) {
            self.refusing.pop_front();
        }
    }

    /// When the next connection's deadline passes, if any does.
    fn next_conn_deadline(&self) -> Option<Instant> {
        let stall = self
            .clients
            .values()
            .filter_map(|c| c.owes_since)
            .min()
            .map(|since| since + FRAME_STALL);
        let refusal = self.refusing.front().map(|(_, at)| *at);
        stall.into_iter().chain(refusal).min()
    }

    /// Start the next queued request of a client if it is not waiting on one, and has
    /// read its answers: one that does not read stops being served, and so read.
    fn pump_client(&mut self, t: Token) {
        loop {
            let Some(c) = self.clients.get_mut(&t) else {
                return;
            };
            if c.waiting || c.conn.unsent() > OUT_LOW || c.conn.closed.is_some() {
                return;
            }
            let Some((req, size)) = c.queued.pop_front() else {
                return;
            };
            c.queued_bytes -= size;
            let (role, flags) = (c.role, c.flags);
            let draining = self.drain.is_some();
            let (req, who) = match req {
                Request::Api { who, request } if role == Some(Role::Api) => {
                    match self.admit_api(&who, *request, flags) {
                        Ok(x) => x,
                        Err(refusal) => {
                            self.reply(t, refusal.into());
                            continue;
                        }
                    }
                }
                other if role == Some(Role::Mcp) => (other, api::Acting::mcp()),
                other => (other, api::Acting::host()),
            };
            match req {
                Request::Drain { grace_ms } => {
                    // Answered when the drain is over (see `run`). Over the API the grace
                    // is at most an hour.
                    let grace_ms = if who.api() {
                        grace_ms.min(MAX_API_GRACE_MS)
                    } else {
                        grace_ms
                    };
                    self.begin_drain(Duration::from_millis(grace_ms));
                    self.drain_waiters.push(t);
                    if let Some(c) = self.clients.get_mut(&t) {
                        c.waiting = true;
                    }
                    return;
                }
                Request::Exec(_)
                | Request::Serve { .. }
                | Request::ServeAll { .. }
                | Request::ServeLayer { .. }
                | Request::Warm { .. }
                | Request::Run { .. }
                    if draining =>
                {
                    self.reply(t, draining_refusal());
                }
                other => {
                    let mut cx = Ctx::new(self.poll.registry(), &mut self.next_token);
                    match self.fns.handle(t, other, &who, &mut cx) {
                        Some(reply) => self.reply(t, reply),
                        None => {
                            if let Some(c) = self.clients.get_mut(&t) {
                                c.waiting = true;
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// An API envelope: the inner request checked against what the API may ask, the caller
    /// found from the credentials the front forwarded, and the gate applied. The inner
    /// request and who makes it, or the refusal to answer with (the connection goes on).
    fn admit_api(
        &self,
        who: &proto::api::Credentials,
        inner: Request,
        flags: proto::api::FrontFlags,
    ) -> Result<(Request, api::Acting), api::Refusal> {
        let k = kind(&inner);
        let route = match gate_route(k) {
            Some(r) if DISPATCH_API_INNER.contains(&k) => r,
            _ => {
                return Err(api::no(
                    ErrorCode::BadRequest,
                    format!("the API may not ask for {k:?}"),
                ))
            }
        };
        // `/healthz` needs no token: whatever was sent, it is answered as the host's
        // condition, without names of tenants' functions.
        if route == policy::gate::Route::Health {
            let anyone = api::Acting {
                who: api::Who::Bootstrap,
                tenant: None,
                limits: Default::default(),
                flags,
                all_logs: false,
            };
            return Ok((inner, anyone));
        }
        let acting = self.fns.api.resolve(who, flags)?;
        match policy::gate::decide(route, acting.gate_caller()) {
            policy::gate::Decision::Allow => Ok((inner, acting)),
            policy::gate::Decision::Refuse(why) => Err(api::no(ErrorCode::Forbidden, why)),
        }
    }

    fn reply(&mut self, t: Token, r: Reply) {
        self.send_to(t, &r);
    }

    /// Queue a reply for a front. Past [`OUTPUT_BUDGET`] unread by all fronts together, a
    /// front that has not read what it was sent is dropped instead; one that has still
    /// gets its answer.
    fn send_to(&mut self, t: Token, r: &Reply) {
        let behind = self.clients.get(&t).map_or(0, |c| c.conn.unsent());
        if behind > OUT_LOW {
            let total: usize = self.clients.values().map(|c| c.conn.unsent()).sum();
            if total > OUTPUT_BUDGET {
                if let Some(c) = self.clients.get_mut(&t) {
                    c.conn.closed.get_or_insert_with(|| {
                        format!(
                            "it left {} MiB of answers unread while all fronts' unread answers \
                             were over the {} MiB budget",
                            behind >> 20,
                            OUTPUT_BUDGET >> 20
                        )
                    });
                }
                return;
            }
        }
        if let Some(c) = self.clients.get_mut(&t) {
            match r {
                // An event is a chunk of output, small; a final reply that cannot be sent
                // is answered `too_large` instead, so the front is never left waiting.
                Reply::Event(_) => c.conn.send(r),
                _ => c.conn.send_frame(&conn::final_reply_frame(
                    r,
                    proto::frame::PREFIX + MAX_FRONT_FRAME,
                )),
            }
        }
    }

    /// Hand out what the functions produced for clients (events, deferred answers); a
    /// client whose call ended goes on with what it queued and is read again.
    fn deliver(&mut self) {
        let mut ended = Vec::new();
        for (t, r, last) in self.fns.take_outbox() {
            // A streamed call's events have a budget of their own: once its front is more
            // than [`OUT_LOW`] behind, no more of them are queued (the call's answer, with
            // its capped output, still is). A client that reads slowly costs its own
            // stream, never the shared output budget.
            if !last && matches!(r, Reply::Event(_)) {
                let behind = self.clients.get(&t).map_or(0, |c| c.conn.unsent());
                if behind > OUT_LOW {
                    self.fns.stream_behind(t);
                    continue;
                }
            }
            self.send_to(t, &r);
            if last {
                if let Some(c) = self.clients.get_mut(&t) {
                    c.waiting = false;
                }
                ended.push(t);
            }
        }
        for t in ended {
            self.service(t);
        }
        let closed: Vec<(Token, String)> = self
            .clients
            .iter()
            .filter_map(|(t, c)| Some((*t, c.conn.closed.clone()?)))
            .collect();
        for (t, why) in closed {
            self.drop_client(t, &why);
        }
    }

    /// End a front's connection, logged once with the reason (a peer that closed between
    /// frames only at debug level: every CLI command does). What it held is given back,
    /// and the calls it was waiting on are cancelled: nobody is listening any more.
    fn drop_client(&mut self, t: Token, why: &str) {
        let Some(mut c) = self.clients.remove(&t) else {
            return;
        };
        self.budget.give_back(c.reserved);
        self.budget.leave(t);
        c.conn.flush();
        let _ = self.poll.registry().deregister(&mut c.conn.stream);
        let who = c
            .role
            .map_or_else(|| "a front".to_string(), |r| format!("a {r:?} front"));
        if why == CLOSED {
            log::debug!("{who} closed its connection");
        } else {
            log::warn!("closed {who}'s connection: {why}");
        }
        self.fns.client_gone(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the API may carry and the deploy gate's rows are the same set: an inner kind
    /// without a row, or a row no inner kind reaches, is a table out of step.
    #[test]
    fn the_api_tables_and_the_gate_agree() {
        let mut routes = Vec::new();
        for k in DISPATCH_API_INNER {
            let r = gate_route(*k).unwrap_or_else(|| panic!("{k:?} has no gate row"));
            assert!(!routes.contains(&r), "{r:?} twice");
            routes.push(r);
        }
        for rule in policy::gate::RULES {
            assert!(
                routes.contains(&rule.route),
                "{:?} is not reachable",
                rule.route
            );
        }
        assert!(!DISPATCH_API_INNER.contains(&Kind::Api));
        assert!(!DISPATCH_API_INNER.contains(&Kind::ServeAll));
        assert!(!DISPATCH_API_INNER.contains(&Kind::Serve));
        assert_eq!(DISPATCH_API, &[Kind::Api]);
    }
}
