//! The supervisor: the monitor as a long-lived daemon.
//!
//! One thread, one mio event loop. It listens on a unix socket (mode 0600, in the runtime
//! directory) for fronts, and holds one socketpair per zygote's launcher. Every request a
//! front sends is checked against its role's dispatch table ([`allowed`]) before its one
//! handler runs; a frame that does not decode, or a request the role may not send, ends
//! the connection. Deadlines, heartbeats (stuck), cancels, idle freezing and drain are all
//! decided here, on the loop's clock.
//!
//! SIGTERM and SIGINT drain: no new calls, running ones may finish within the grace
//! (25 s), then every zygote is killed and every cgroup removed. SIGCHLD reaps launchers.

mod cgworker;
mod conn;
mod functions;
mod scripts;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mio::net::UnixListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use proto::front::{
    ErrorCode, Hello, HelloReply, Reply, Request, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME,
};

use crate::cgroup::Backend;
use crate::paths;
use conn::Conn;
use functions::Functions;

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const WAKER: Token = Token(2);
const FIRST_DYNAMIC: usize = 16;

/// How long running requests may go on after a drain begins, unless told otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(25);

#[derive(Debug)]
pub struct SupervisorError(pub String);

impl std::fmt::Display for SupervisorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SupervisorError {}

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
];
const DISPATCH_MCP: &[Kind] = &[Kind::List, Kind::Exec, Kind::Logs];
const DISPATCH_API: &[Kind] = &[];

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
    /// The request this client waits on (one at a time per connection).
    waiting: bool,
    /// Requests that arrived while it waited, in order.
    queued: std::collections::VecDeque<Request>,
}

pub struct Supervisor {
    poll: Poll,
    listener: UnixListener,
    signal_fd: OwnedFd,
    clients: HashMap<Token, Client>,
    next_token: usize,
    fns: Functions,
    drain: Option<Instant>,
    socket: PathBuf,
}

fn block_signals() -> Result<OwnedFd, SupervisorError> {
    // SAFETY: building a signal set and blocking it on this (only) thread, then creating a
    // signalfd for it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(err("block signals", std::io::Error::last_os_error()));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(err("create a signalfd", std::io::Error::last_os_error()));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
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
        let _ = std::fs::remove_file(&socket);
        // The socket is created 0600 (umask), inside a 0700 directory.
        // SAFETY: umask cannot fail.
        let old = unsafe { libc::umask(0o177) };
        let listener = UnixListener::bind(&socket);
        // SAFETY: restoring the previous umask.
        unsafe { libc::umask(old) };
        let mut listener =
            listener.map_err(|e| err(&format!("listen on {}", socket.display()), e))?;
        let backend = Backend::detect().map_err(|e| SupervisorError(e.to_string()))?;
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
        let waker = std::sync::Arc::new(
            mio::Waker::new(poll.registry(), WAKER).map_err(|e| err("create a waker", e))?,
        );
        let fns = Functions::new(backend, waker, identity, launcher, usage_path, scripts)?;
        fns.sweep_stale();
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
            socket,
        })
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    /// Run until drained.
    pub fn run(mut self) -> Result<(), SupervisorError> {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = if self.fns.has_background() {
                Some(Duration::ZERO)
            } else {
                self.fns
                    .next_wake(Instant::now())
                    .map(|d| d.min(Duration::from_secs(1)))
            };
            if let Err(e) = self
                .poll
                .poll(&mut events, Some(timeout.unwrap_or(Duration::from_secs(1))))
            {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(err("wait for events", e));
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    SIGNALS => self.signals(),
                    WAKER => self.fns.worker_done(),
                    t if self.clients.contains_key(&t) => self.client_event(t),
                    t => {
                        let registry = self.poll.registry();
                        let mut new_tokens = || {
                            self.next_token += 1;
                            Token(self.next_token)
                        };
                        self.fns.zygote_event(t, registry, &mut new_tokens);
                    }
                }
            }
            // Answers first, then timers (which may answer too), then the usage log.
            self.deliver();
            let now = Instant::now();
            {
                let registry = self.poll.registry();
                let next = &mut self.next_token;
                let mut new_tokens = || {
                    *next += 1;
                    Token(*next)
                };
                self.fns
                    .tick(now, registry, &mut new_tokens, self.drain.is_some());
            }
            self.deliver();
            self.fns.write_usage();
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
                    break;
                }
            }
        }
        self.fns.shutdown(self.poll.registry());
        // Answer what shutdown cut off, and give the answers a moment to leave.
        self.deliver();
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
        Ok(())
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let t = self.token();
                    if let Err(e) = self.poll.registry().register(
                        &mut stream,
                        t,
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        log::warn!("register a client: {e}");
                        continue;
                    }
                    self.clients.insert(
                        t,
                        Client {
                            conn: Conn::new(stream, MAX_FRONT_FRAME),
                            role: None,
                            waiting: false,
                            queued: Default::default(),
                        },
                    );
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
            log::info!(
                "draining: no new calls; {} running may finish within {}s",
                self.fns.in_flight(),
                grace.as_secs()
            );
            self.drain = Some(Instant::now() + grace);
        }
    }

    fn client_event(&mut self, t: Token) {
        let Some(c) = self.clients.get_mut(&t) else {
            return;
        };
        c.conn.flush();
        let mut msgs: Vec<Request> = Vec::new();
        let mut end: Option<String> = None;
        if c.role.is_none() {
            match c.conn.receive::<Hello>() {
                Ok((hellos, eof)) => {
                    if let Some(h) = hellos.first() {
                        if h.protocol != FRONT_PROTOCOL {
                            c.conn.send(&HelloReply::Refused {
                                reason: format!("protocol {} is not {FRONT_PROTOCOL}", h.protocol),
                            });
                            end = Some("wrong protocol".into());
                        } else {
                            c.role = Some(h.role);
                            c.conn.send(&HelloReply::Welcome {
                                version: env!("CARGO_PKG_VERSION").into(),
                            });
                        }
                        if hellos.len() > 1 {
                            end = Some("frames before the hello was answered".into());
                        }
                    }
                    if eof {
                        end.get_or_insert_with(|| "closed".into());
                    }
                }
                Err(e) => end = Some(e.to_string()),
            }
            // Requests pipelined behind the hello are read on the next readiness event;
            // read again now so edge-triggered readiness is not lost.
        }
        if end.is_none() && c.role.is_some() {
            match c.conn.receive::<Request>() {
                Ok((m, eof)) => {
                    msgs = m;
                    if eof {
                        end = Some("closed".into());
                    }
                }
                Err(e) => end = Some(e.to_string()),
            }
        }
        let role = c.role;
        for m in msgs {
            let Some(role) = role else { break };
            if !allowed(role, kind(&m)) {
                log::warn!(
                    "a {role:?} front asked for {:?}, which its role may not; ending it",
                    kind(&m)
                );
                end = Some("request not allowed for role".into());
                break;
            }
            if let Some(c) = self.clients.get_mut(&t) {
                c.queued.push_back(m);
            }
        }
        self.pump_client(t);
        if let Some(why) = end {
            if why != "closed" {
                log::warn!("ending a front connection: {why}");
            }
            self.drop_client(t);
        }
    }

    /// Start the next queued request of a client if it is not waiting on one.
    fn pump_client(&mut self, t: Token) {
        loop {
            let Some(c) = self.clients.get_mut(&t) else {
                return;
            };
            if c.waiting {
                return;
            }
            let Some(req) = c.queued.pop_front() else {
                return;
            };
            let draining = self.drain.is_some();
            match req {
                Request::Drain { grace_ms } => {
                    let n = self.fns.in_flight() as u32;
                    self.begin_drain(Duration::from_millis(grace_ms));
                    self.reply(t, Reply::Draining { in_flight: n });
                }
                Request::Exec(_)
                | Request::Serve { .. }
                | Request::ServeAll { .. }
                | Request::Warm { .. }
                    if draining =>
                {
                    self.reply(
                        t,
                        Reply::Error {
                            code: ErrorCode::Unavailable,
                            message: "the supervisor is draining and takes no new work".into(),
                            retry_after: Some(5),
                        },
                    );
                }
                other => {
                    let registry = self.poll.registry();
                    let next = &mut self.next_token;
                    let mut new_tokens = || {
                        *next += 1;
                        Token(*next)
                    };
                    match self.fns.handle(t, other, registry, &mut new_tokens) {
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

    fn reply(&mut self, t: Token, r: Reply) {
        if let Some(c) = self.clients.get_mut(&t) {
            c.conn.send(&r);
        }
    }

    /// Hand out what the functions produced for clients (events, deferred answers).
    fn deliver(&mut self) {
        for (t, r, last) in self.fns.take_outbox() {
            if let Some(c) = self.clients.get_mut(&t) {
                c.conn.send(&r);
                if last {
                    c.waiting = false;
                }
            }
            if last {
                self.pump_client(t);
            }
        }
        let closed: Vec<Token> = self
            .clients
            .iter()
            .filter(|(_, c)| c.conn.closed)
            .map(|(t, _)| *t)
            .collect();
        for t in closed {
            self.drop_client(t);
        }
    }

    fn drop_client(&mut self, t: Token) {
        if let Some(mut c) = self.clients.remove(&t) {
            c.conn.flush();
            let _ = self.poll.registry().deregister(&mut c.conn.stream);
            // Nobody is listening any more: calls it was waiting on are cancelled.
            self.fns.client_gone(t);
        }
    }
}
