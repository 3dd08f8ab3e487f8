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
//! heartbeat for [`timers::stuck_after`]). An OOM kill is read from the request cgroup's counter.
//!
//! The work is split by job, one file each:
//! - [`registry`]: the functions served: a sandbox.toml read, each function's plan built
//!   and checked, `stop`, `warm`, and the `serve` answers that wait for zygotes;
//! - [`agents`]: the agents embedded in the binary, and the command line that starts one;
//! - [`zygotes`]: a zygote's lifecycle: its launcher started, the messages on its
//!   channel, its children parked and placed in their cgroups, frozen, thawed, killed;
//! - [`requests`]: a call's lifecycle: admitted, placed on a parked child, answered,
//!   finished, and its outcome decided;
//! - [`timers`]: deadlines, heartbeats, answered children that linger, idle zygotes;
//! - [`stats`]: what `zygo ls`, `zygo stats` and `zygo logs` show, and what each finished
//!   call adds to them and to the usage log.
//!
//! Every request a front may send has its one handler in [`Functions::handle`].

mod agents;
mod registry;
mod requests;
mod run_spec;
mod runs;
mod stats;
mod timers;
mod zygotes;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use mio::{Registry, Token};
use proto::front::{ErrorCode, Health, Outcome, Reply, Request};

use super::cgworker::Worker;
use super::SupervisorError;
use crate::cgroup::Backend;
use crate::identity::Identity;
use registry::{Function, PendingServe};
use requests::{script_in_flight, InFlight};
use zygotes::Zygote;

/// Requests one zygote serves at once.
pub const SLOTS: usize = 4;

/// Children a zygote keeps parked.
pub const SPARES: usize = 3;

/// The largest event accepted.
pub const MAX_EVENT: usize = 16 * 1024 * 1024;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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
    /// One-shot runs (see [`runs`]).
    runs: runs::Runs,
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
            runs: runs::Runs::default(),
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
        self.calls.len() + self.runs.len()
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
            Request::Logs { name, n } => Some(self.logs(&name, n)),
            Request::Stats { name } => Some(self.stats(name.as_deref())),
            Request::Warm { name, n } => Some(self.warm(&name, n as usize, cx)),
            Request::Cancel { key } => Some(self.cancel(&key)),
            Request::Drain { .. } => {
                Some(fail(ErrorCode::Internal, "drain is handled by the loop"))
            }
            Request::Health => Some(Reply::Health(Health {
                usage_log: self.usage.health(),
                stopping: false,
                below_min_warm: Vec::new(),
            })),
            Request::PutScript { source } => Some(self.put_script(&source)),
            Request::Run { spec } => self.start_run(client, &spec, None, None, cx),
            // The API role's requests: no dispatch table lets them through yet.
            Request::Api { .. }
            | Request::ServeLayer { .. }
            | Request::ScriptInfo { .. }
            | Request::DeleteScript { .. }
            | Request::CreateTenant { .. }
            | Request::ListTenants
            | Request::GetTenant { .. }
            | Request::DeleteTenant { .. }
            | Request::SetLimits { .. }
            | Request::MintToken { .. }
            | Request::ListTokens
            | Request::RevokeToken { .. }
            | Request::Version => Some(fail(
                ErrorCode::BadRequest,
                "this request is not served by this version",
            )),
        }
    }

    /// `scripts put`: store a script for calls to name by its digest.
    fn put_script(&mut self, source: &[u8]) -> Reply {
        match self.scripts.put(source, &script_in_flight(&self.calls)) {
            Ok((digest, existed)) => Reply::ScriptStored {
                digest,
                size: source.len() as u64,
                existed,
            },
            Err((code, message)) => fail(code, message),
        }
    }

    /// The end of a drain: the calls still in flight are cancelled and answered, every
    /// zygote is killed, and the folders of cgroups are removed once empty.
    pub fn shutdown(&mut self, cx: &Ctx) {
        // What the worker is still placing goes with its zygote; wait for it first.
        self.worker.finish();
        for p in self.worker.done() {
            if let Ok(cg) = p.result {
                let _ = cg.remove();
            }
        }
        self.parks.clear();
        self.runs_shutdown(cx);
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
}
