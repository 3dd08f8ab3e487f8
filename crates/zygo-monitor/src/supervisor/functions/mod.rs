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
mod blobs;
mod checking;
mod deps;
mod registry;
mod requests;
pub(crate) mod run_spec;
mod runs;
mod stats;
mod store_puts;
mod tenancy;
mod timers;
mod zygotes;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use mio::{Registry, Token};
use proto::front::{ErrorCode, Outcome, Reply, Request};

use super::api::Acting;
use super::SupervisorError;
use crate::cgroup::Backend;
use crate::identity::Identity;
use crate::keeper::LocalKeeper;
use registry::{Function, PendingServe};
use requests::{script_in_flight, InFlight};
use zygotes::Zygote;

/// Requests one zygote serves at once.
pub const SLOTS: usize = 4;

/// Children a zygote keeps parked.
pub const SPARES: usize = 3;

/// The largest event accepted.
pub const MAX_EVENT: usize = 16 * 1024 * 1024;

/// How many more script-owner records than scripts are kept before the records of
/// evicted scripts are forgotten.
pub(super) const SCRIPT_OWNERS_SLACK: usize = 1024;

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where the content-addressed stores keep their files.
pub struct StoreDirs {
    pub scripts: PathBuf,
    pub blobs: PathBuf,
    /// The state directory, whose `deps/` holds the dependency sets (see `crate::deps`).
    pub state: PathBuf,
}

pub struct Functions {
    /// What needs privilege: every cgroup, behind the keeper's table.
    keeper: LocalKeeper,
    /// The cgroup tree, for what is not behind the keeper's table yet (one-shot runs and
    /// dependency builds).
    backend: Arc<Backend>,
    identity: Identity,
    launcher: PathBuf,
    /// The usage log (see `usage`).
    usage: super::usage::UsageLog,
    /// The content-addressed script store: `<state>/scripts/<sha256 hex>`.
    scripts: super::scripts::Store,
    /// The content-addressed blob store: `<state>/blobs/<sha256 hex>` (see `blobs`).
    blobs: super::scripts::Store,
    /// Writes their new entries, off the event loop.
    writer: super::store_writer::Writer,
    /// Callers waiting for a store write, by store and digest (see `store_puts`).
    store_waits: HashMap<(super::store_writer::Which, String), Vec<store_puts::StoreWait>>,
    /// Callers waiting for the echo of a put (see `store_puts`), by the echo's ticket.
    echo_waits: HashMap<u64, store_puts::EchoWait>,
    /// What waits for the writer, bounded (see `store_writer`).
    queued: super::store_writer::Queued,
    /// Checks large events off the loop (see `event_check`).
    checker: super::event_check::Checker,
    /// Calls waiting for their event's check, by ticket (see [`checking`]).
    checking: HashMap<u64, checking::Waiting>,
    /// Puts waiting for the checker to name their bytes, by ticket (see [`store_puts`]).
    naming: HashMap<u64, store_puts::Naming>,
    /// The last write's ticket.
    write_tickets: u64,
    /// Answers of calls waiting for the store write of the script they carried, by ticket.
    after_write: HashMap<u64, Vec<(Token, Reply, bool)>>,
    fns: BTreeMap<String, Function>,
    zygotes: HashMap<Token, Zygote>,
    calls: HashMap<String, InFlight>,
    outbox: Vec<(Token, Reply, bool)>,
    /// `serve`/`up` answers waiting for functions to become ready or fail.
    pending_serves: Vec<PendingServe>,
    /// Layers served over the API waiting likewise: (client, key, name shown, kind).
    pending_layers: Vec<(Token, String, String, proto::api::ServeKind)>,
    /// Tokens, tenants and script owners (the API's state).
    pub(super) api: super::api::Api,
    /// A drain has begun (health says `stopping`).
    draining: bool,
    /// The `[defaults]` of the sandbox.toml served last: what a layer served over the API
    /// is merged over.
    defaults: policy::file::Layer,
    /// Zygotes whose spare is to be replaced when the loop has nothing more urgent.
    parks: VecDeque<Token>,
    /// Slots whose request was answered: their child is exiting, which is work in the
    /// background again (their cgroup's weight goes back down once the answer is out).
    settling: Vec<(Token, String)>,
    counter: u64,
    /// One-shot runs (see [`runs`]).
    runs: runs::Runs,
    /// The state directory (dependency sets live in its `deps/`).
    state_dir: PathBuf,
    /// Dependency sets building (see [`deps`]).
    deps_builds: deps::Builds,
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
        stores: StoreDirs,
        api: super::api::Api,
    ) -> Result<Functions, SupervisorError> {
        let usage = super::usage::UsageLog::open(usage_path.clone())
            .map_err(|e| SupervisorError(format!("open {}: {e}", usage_path.display())))?;
        use super::scripts::{BLOBS, SCRIPTS};
        let StoreDirs {
            scripts,
            blobs,
            state: state_dir,
        } = stores;
        let cap = super::scripts::cap_from_env(&SCRIPTS).map_err(SupervisorError)?;
        let share = super::scripts::share_from_env(cap).map_err(SupervisorError)?;
        let mut scripts = super::scripts::Store::open(&SCRIPTS, scripts.clone(), cap, share)
            .map_err(|e| {
                SupervisorError(format!("open the script store {}: {e}", scripts.display()))
            })?;
        let cap = super::scripts::cap_from_env(&BLOBS).map_err(SupervisorError)?;
        let share = super::scripts::share_from_env(cap).map_err(SupervisorError)?;
        let mut blobs =
            super::scripts::Store::open(&BLOBS, blobs.clone(), cap, share).map_err(|e| {
                SupervisorError(format!("open the blob store {}: {e}", blobs.display()))
            })?;
        // Who holds what, from the owner records: each tenant's share counts from here.
        for (d, tenants, host) in api.script_owners() {
            scripts.adopt(d, tenants, host);
        }
        for (d, tenants, host) in api.blob_owners() {
            blobs.adopt(d, tenants, host);
        }
        let writer = super::store_writer::Writer::start(waker.clone())
            .map_err(|e| SupervisorError(format!("start the store writer: {e}")))?;
        let checker = super::event_check::Checker::start(waker.clone())
            .map_err(|e| SupervisorError(format!("start the event checker: {e}")))?;
        let keeper = LocalKeeper::start(backend, waker)
            .map_err(|e| SupervisorError(format!("start the cgroup worker: {e}")))?;
        let backend = match keeper.backend() {
            Some(b) => b.clone(),
            None => return Err(SupervisorError("the keeper has no cgroup tree".into())),
        };
        Ok(Functions {
            keeper,
            backend,
            identity,
            launcher,
            usage,
            scripts,
            blobs,
            writer,
            store_waits: HashMap::new(),
            echo_waits: HashMap::new(),
            queued: Default::default(),
            checker,
            checking: HashMap::new(),
            naming: HashMap::new(),
            after_write: HashMap::new(),
            write_tickets: 0,
            fns: BTreeMap::new(),
            zygotes: HashMap::new(),
            calls: HashMap::new(),
            outbox: Vec::new(),
            pending_serves: Vec::new(),
            pending_layers: Vec::new(),
            api,
            draining: false,
            defaults: policy::file::Layer::default(),
            parks: VecDeque::new(),
            settling: Vec::new(),
            counter: 0,
            runs: runs::Runs::default(),
            state_dir,
            deps_builds: deps::Builds::default(),
        })
    }

    /// Remove what supervisors that are gone left in the tree (see
    /// [`LocalKeeper::sweep_stale`]).
    pub fn sweep_stale(&self) {
        self.keeper.sweep_stale();
    }

    /// Remove Zygo's cgroup root if this supervisor leaves it empty (see
    /// `Backend::release_root`).
    pub fn release_cgroup_root(&self) {
        self.keeper.release_root();
    }

    pub fn backend_root(&self) -> String {
        self.keeper.describe()
    }

    /// The drain began: no new function is served (the keeper refuses one from now on).
    pub fn begin_drain(&mut self) {
        self.draining = true;
        self.keeper.begin_drain();
    }

    pub fn in_flight(&self) -> usize {
        self.calls.len() + self.runs.len()
    }

    pub fn take_outbox(&mut self) -> Vec<(Token, Reply, bool)> {
        std::mem::take(&mut self.outbox)
    }

    /// One request from a front, made by `who`. `None` means the answer comes later
    /// (through the outbox). The API role's requests are scoped to the caller here: names
    /// resolve to the acting tenant's own functions or the host's, never another tenant's.
    pub fn handle(
        &mut self,
        client: Token,
        req: Request,
        who: &Acting,
        cx: &mut Ctx,
    ) -> Option<Reply> {
        match req {
            Request::ServeAll { file } => self.serve_file(client, &file, None, Vec::new(), cx),
            Request::Serve {
                name,
                file,
                secrets,
            } => self.serve_file(client, &file, Some(name), secrets, cx),
            Request::Stop { name } => Some(self.stop_as(&name, who, cx)),
            Request::Exec(e) => self.exec_as(client, e, who, cx, None),
            Request::List => Some(Reply::Functions(self.list(who))),
            Request::Logs { name, n } => Some(self.logs_as(&name, n, who)),
            Request::Stats { name } => Some(self.stats(name.as_deref(), who)),
            Request::Warm { name, n } => Some(self.warm_as(&name, n as usize, who, cx)),
            Request::Cancel { key } => Some(self.cancel(&key, who)),
            Request::Drain { .. } => {
                Some(fail(ErrorCode::Internal, "drain is handled by the loop"))
            }
            Request::Health => Some(Reply::Health(self.health(who))),
            Request::PutScript { source } => self.put_script(client, source, who),
            Request::Api { .. } => Some(fail(
                ErrorCode::BadRequest,
                "an Api request may not carry another Api request",
            )),
            Request::ServeLayer {
                name,
                kind,
                layer,
                base_dir,
            } => self.serve_layer(client, &name, kind, &layer, base_dir.as_deref(), who, cx),
            // A one-shot run: over the API, in the acting tenant's name and narrowed by its
            // limits.
            Request::Run { spec } => self.start_run(
                client,
                &spec,
                who.tenant.as_deref(),
                who.tenant.as_ref().map(|_| &who.limits),
                who.private_net(),
                cx,
            ),
            Request::ScriptInfo { digest } => Some(self.script_info(&digest, who)),
            Request::DeleteScript { digest } => Some(self.delete_script(&digest)),
            Request::CreateTenant { id } => Some(self.create_tenant(&id)),
            Request::ListTenants => Some(Reply::Tenants(
                self.api
                    .tenants
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .iter()
                    .map(|t| self.tenant_info(t))
                    .collect(),
            )),
            Request::GetTenant { id } => Some(self.get_tenant(&id, who)),
            Request::DeleteTenant { id } => Some(self.delete_tenant(&id, cx)),
            Request::SetLimits { id, limits } => Some(self.set_limits(&id, &limits, who)),
            Request::MintToken { tenant } => Some(self.api.mint(tenant)),
            Request::ListTokens => Some(self.api.list_tokens()),
            Request::RevokeToken { id } => Some(self.api.revoke(&id)),
            Request::Version => Some(self.version(who)),
            Request::PutSecret {
                tenant,
                name,
                value,
            } => Some(self.api.put_secret(&tenant, &name, &value.0)),
            Request::DeleteSecret { tenant, name } => Some(self.api.delete_secret(&tenant, &name)),
            Request::ListSecrets { tenant } => Some(self.api.list_secrets(&tenant)),
            // The API's own request and error counts (unnamed series, every caller's
            // traffic) are on every caller's page, as the API's specification has them;
            // the functions are scoped to the caller.
            Request::Metrics => Some(Reply::Metrics {
                functions: self.metrics(who),
                process_counts: true,
            }),
            Request::RecordUsage(rec) => Some(self.record_outside(rec, who)),
            Request::PutBlob { bytes } => self.put_blob(client, bytes.into_vec(), who),
            Request::DeleteBlob { digest } => Some(self.delete_blob(&digest)),
            Request::PutDeps { image, files } => Some(self.put_deps(&image, files, who)),
            Request::ListDeps => Some(self.list_deps(who)),
            Request::DepsInfo { id } => Some(self.deps_info(&id, who)),
            Request::DeleteDeps { id } => Some(self.delete_deps(&id)),
        }
    }

    /// At start: forget the owners of every script the store no longer holds.
    pub fn forget_evicted_script_owners(&mut self) {
        self.prune_script_owners(0);
        let store = &self.blobs;
        self.api
            .prune_blobs(&|d| store.held(d).is_some(), store.count(), 0);
    }

    /// Forget the owners of scripts the store has evicted, once there are `slack` more
    /// records than scripts.
    pub(super) fn prune_script_owners(&mut self, slack: usize) {
        let store = &self.scripts;
        self.api
            .prune_scripts(&|d| store.held(d).is_some(), store.count(), slack);
    }

    /// The end of a drain: the calls still in flight are cancelled and answered, every
    /// zygote is killed, and the folders of cgroups are removed once empty.
    pub fn shutdown(&mut self, cx: &Ctx) {
        // Calls still waiting for their event's check never started: refused as calls
        // that came during the drain.
        self.checking_shutdown();
        self.naming_shutdown();
        // The store writes handed over are finished, and answered.
        self.writer.finish();
        self.store_written();
        self.parks.clear();
        self.runs_shutdown(cx);
        self.deps_builds.shutdown();
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
        // What the keeper's worker is still placing goes with its zygote; then the
        // folders.
        self.keeper.shutdown(self.fns.keys());
    }
}
