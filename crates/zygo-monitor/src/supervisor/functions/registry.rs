//! The functions served: a sandbox.toml read, each function checked and its launch plan
//! built (the one plan every zygote of the function starts from), `stop`, `warm`, and the
//! `serve` answers that wait for zygotes to be ready.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Instant;

use mio::Token;
use policy::file::FnSpec;
use proto::front::{ErrorCode, Outcome, Reply};
use proto::keeper::{FromKeeper, ToKeeper};
use proto::launch::{BindMount, Image, LaunchPlan, Mode};

use super::agents::agent_argv;
use super::stats::Stats;
use super::zygotes::{thaw, ZState};
use super::{fail, Ctx, Functions, SLOTS};
use crate::cgroup::Limits;
use crate::identity::Identity;
use crate::shape::Shape;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FnState {
    /// No zygote of it has been ready yet.
    Starting,
    Serving,
    /// It cannot serve, and why.
    Failed(String),
}

pub(super) struct Function {
    pub(super) spec: FnSpec,
    pub(super) plan: LaunchPlan,
    /// The plan's handed-over mounts (see `crate::mounts`), opened when the function was
    /// served: every zygote gets its own copy of these, whatever the paths name later.
    pub(super) handed: Vec<crate::mounts::Handed>,
    pub(super) limits: Limits,
    /// Its memory limit as sandbox.toml says it, for messages.
    pub(super) mem_text: String,
    pub(super) state: FnState,
    pub(super) zygotes: Vec<Token>,
    pub(super) min_warm: usize,
    /// Calls waiting for a parked child in a zygote that has room (not a hidden queue:
    /// they are bounded by the zygotes' free slots).
    pub(super) pending: VecDeque<String>,
    /// Its last calls, kept apart by the tenant that made them (see `stats::FnLog`).
    pub(super) logs: super::stats::FnLog,
    pub(super) stats: Stats,
    /// The same counters, for each tenant's own calls.
    pub(super) tenant_stats: std::collections::HashMap<String, Stats>,
    /// Values of its secrets given at the shell (`zygo serve --secret`); they win over
    /// stored ones. Never a pool's: a pool holds no values.
    pub(super) shell_secrets: Vec<(String, proto::api::SecretValue)>,
    /// The dependency set it is served on (mounted at /venv).
    pub(super) deps: Option<super::deps::DepsUse>,
}

/// A `serve` answer waiting: the client, the functions named, and those already failed.
pub(super) type PendingServe = (Token, Vec<String>, Vec<(String, String)>);

/// What serving a function needs, built from its spec before anything is started.
struct Planned {
    plan: LaunchPlan,
    limits: Limits,
    mem_text: String,
    /// The memory ceiling of the function's folder of cgroups.
    ceiling: Option<u64>,
}

impl Functions {
    /// Whether a function's secrets can be given, when it is served: a pool's come from
    /// the calling tenants' stored values (so the host needs a key) and it takes none at
    /// the shell; a tenant's function's come from the shell, else from its tenant's store
    /// (checked now). A host function's come from the shell, else from the calling
    /// tenant's store (checked at each call).
    fn check_secrets(
        &self,
        name: &str,
        spec: &FnSpec,
        shell: &[(String, proto::api::SecretValue)],
    ) -> Result<(), String> {
        let shown = name.rsplit('/').next().unwrap_or(name);
        for (i, (n, _)) in shell.iter().enumerate() {
            if !spec.secrets.contains(n) {
                return Err(format!(
                    "--secret {n}: {shown} does not list {n} under secrets in sandbox.toml"
                ));
            }
            if shell[..i].iter().any(|(m, _)| m == n) {
                return Err(format!("--secret {n} is given twice"));
            }
        }
        if spec.secrets.is_empty() {
            return Ok(());
        }
        if is_pool(spec) {
            if !shell.is_empty() {
                return Err(format!(
                    "{shown} is a runtime pool: it holds no secret values (each call gets the calling tenant's stored ones); drop --secret"
                ));
            }
            if !self.api.has_secrets_key() {
                return Err(format!(
                    "{shown} names secrets ({}), which a pool takes from the calling tenant's store, but this supervisor has no key for the store: stop it, then start it with ZYGO_SECRETS_KEY set (`export ZYGO_SECRETS_KEY=$(zygo secrets keygen)`)",
                    spec.secrets.join(", ")
                ));
            }
            return Ok(());
        }
        let owner = name.split_once('/').map(|(t, _)| t);
        for n in &spec.secrets {
            if shell.iter().any(|(k, _)| k == n) {
                continue;
            }
            match owner {
                Some(t) if self.api.secret_names(t).contains(n) => {}
                Some(t) => {
                    return Err(format!(
                        "secret {n} has no value: tenant {t} has not stored it (PUT /tenants/{t}/secrets/{n}, or `zygo secrets set {t} {n}`)"
                    ))
                }
                None => {}
            }
        }
        Ok(())
    }

    /// `serve` and `up`: serve the functions of a sandbox.toml, or the one named. Answered
    /// at once when none is starting, else (through the outbox) once each has a ready
    /// zygote or failed.
    pub(super) fn serve_file(
        &mut self,
        client: Token,
        file: &str,
        only: Option<String>,
        shell: Vec<(String, proto::api::SecretValue)>,
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
        self.defaults = parsed.defaults.clone();
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
            // One served already with other settings is left as it is (serving again
            // changes nothing): said, so that an edited file is not taken as served.
            if let Some(f) = self
                .fns
                .get(name)
                .filter(|f| !matches!(f.state, FnState::Failed(_)))
            {
                let changed = changed_settings(&f.spec, spec);
                if !changed.is_empty() {
                    failed.push((
                        name.clone(),
                        format!(
                            "served already with other settings ({} differ from {file}), and left as it is; to serve it as the file says: zygo stop {name}, then zygo up -f {file}",
                            changed.join(", ")
                        ),
                    ));
                    continue;
                }
            }
            match self.serve_one(name.clone(), spec.clone(), shell.clone(), cx) {
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

    /// Serve one function: its plan built, its folder of cgroups given a memory ceiling,
    /// its `min_warm` zygotes started. One served already is left as it is; one that
    /// failed is replaced.
    pub(super) fn serve_one(
        &mut self,
        name: String,
        spec: FnSpec,
        shell: Vec<(String, proto::api::SecretValue)>,
        cx: &mut Ctx,
    ) -> Result<(), String> {
        self.check_secrets(&name, &spec, &shell)?;
        if let Some(f) = self
            .fns
            .get_mut(&name)
            .filter(|f| !matches!(f.state, FnState::Failed(_)))
        {
            // Already served: serving twice changes nothing but the values given at the
            // shell now, which win from the next call on.
            if !shell.is_empty() {
                f.shell_secrets = shell;
            }
            return Ok(());
        }
        if let Some(old) = self.fns.remove(&name) {
            for t in old.zygotes {
                self.kill_zygote(t, cx);
            }
        }
        let Planned {
            mut plan,
            limits,
            mem_text,
            ceiling,
        } = plan(&spec, &self.identity)?;
        // Its dependency set, when it names one: ready, or the function is not served.
        let deps = self.deps_for(&spec).map_err(|r| r.message)?;
        if let Some(set) = &deps {
            super::deps::apply(&mut plan, &spec, set)?;
        }
        let handed = crate::mounts::hand_over(&mut plan)?;
        if let FromKeeper::Refused { why } = self
            .keeper
            .call(ToKeeper::ServeFunction {
                function: crate::keeper::fn_key(&name),
                limits: crate::keeper::limits_msg(&limits),
                ceiling,
            })
            .reply
        {
            return Err(format!("make the folder of {name}'s cgroups: {why}"));
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
                logs: Default::default(),
                stats: Stats::default(),
                tenant_stats: std::collections::HashMap::new(),
                shell_secrets: shell,
                deps,
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
}

/// The settings (as sandbox.toml names them) in which two specs of one function differ.
fn changed_settings(old: &FnSpec, new: &FnSpec) -> Vec<&'static str> {
    let (a, b) = (&old.limits, &new.limits);
    let kind = |s: &FnSpec| match &s.kind {
        policy::file::FnKind::Agent { agent, .. } => Some(*agent),
        policy::file::FnKind::Cmd(_) => None,
    };
    let entry = |s: &FnSpec| match &s.kind {
        policy::file::FnKind::Agent { entry, .. } => entry.clone(),
        policy::file::FnKind::Cmd(_) => None,
    };
    let cmd = |s: &FnSpec| match &s.kind {
        policy::file::FnKind::Cmd(c) => Some(c.clone()),
        policy::file::FnKind::Agent { .. } => None,
    };
    [
        ("agent", kind(old) != kind(new)),
        ("entry", entry(old) != entry(new)),
        ("cmd", cmd(old) != cmd(new)),
        ("image", old.image != new.image),
        ("mem", a.mem != b.mem),
        ("cpu", a.cpu != b.cpu),
        ("pids", a.pids != b.pids),
        ("timeout", a.timeout != b.timeout),
        ("scratch", a.scratch != b.scratch),
        ("io_bps", a.io_bps != b.io_bps),
        ("io_iops", a.io_iops != b.io_iops),
        ("network", old.network != new.network),
        ("allow", old.allow != new.allow),
        ("idle_timeout", old.idle_timeout != new.idle_timeout),
        ("min_warm", old.min_warm != new.min_warm),
        ("max_warm", old.max_warm != new.max_warm),
        ("requirements", old.requirements != new.requirements),
        ("deps", old.deps != new.deps),
        ("mounts", old.mounts != new.mounts),
        ("secrets", old.secrets != new.secrets),
        ("env", old.env != new.env),
        ("inotify", old.inotify != new.inotify),
        ("private_net", old.private_net != new.private_net),
    ]
    .into_iter()
    .filter_map(|(k, differs)| differs.then_some(k))
    .collect()
}

/// A function's launch plan, from its spec: keys this version cannot honour refused, its
/// agent's command line, its image, mounts and limits. Paths are checked here; nothing is
/// opened or started.
fn plan(spec: &FnSpec, identity: &Identity) -> Result<Planned, String> {
    let egress = match spec.network {
        policy::plan::Network::None => None,
        // sandbox.toml's rules are the operator's and may open private addresses; an HTTP
        // layer's only when its caller may (`FnSpec::private_net`).
        policy::plan::Network::Egress => Some(crate::oneshot::egress_rules(
            &policy::egress::compile(
                "allow",
                &spec.allow,
                if spec.private_net {
                    policy::egress::PrivateNet::Allowed
                } else {
                    policy::egress::PrivateNet::Refused
                },
            )
            .map_err(|e| e.to_string())?,
            // One request's limit: the filter serves the zygote's requests with buffers
            // within a share of it.
            crate::cgroup_limits(&spec.limits).mem_bytes,
        )?),
        policy::plan::Network::Host => {
            return Err(
                "network host is not available for functions yet; use network = \"none\" \
                 or \"egress\""
                    .into(),
            )
        }
    };
    if spec.secrets.len() > proto::launch::MAX_REQUEST_SECRETS {
        return Err(format!(
            "secrets lists {} names; a function or pool takes at most {}",
            spec.secrets.len(),
            proto::launch::MAX_REQUEST_SECRETS
        ));
    }
    // Requests that may write into a host folder run as the sandbox's id 0, which writes
    // there as the folder's owner (see `proto::launch::DiskOwner`): they share that uid
    // instead of each getting one of its own, as rootless requests do.
    let writes_host = spec.mounts.iter().any(|m| m.rw);
    let request_ids = identity.request_ids.filter(|_| !writes_host);
    // Without uids of their own, requests are kept from signalling each other by
    // Landlock's scoping alone: on an older kernel that is refused unless accepted.
    if request_ids.is_none() {
        let abi = plumbing::kernel::landlock_abi();
        let refusal = if identity.request_ids.is_none() {
            plumbing::kernel::rootless_zygote_refusal(abi)
        } else {
            plumbing::kernel::writable_mount_refusal(abi)
        };
        if let Some(why) = refusal {
            return Err(why);
        }
    }
    let (argv, fn_mount, agents) = agent_argv(spec, request_ids)?;
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
        // No link is followed in a mount source (see `plumbing::resolve`).
        plumbing::resolve::open_host_path(&m.src)
            .map_err(|e| format!("mount source {}: {e}", m.src.display()))?;
        // A writable one the sandbox could not write is refused now, naming it.
        if m.rw {
            crate::mounts::check_writable(&m.src, "mount it read-only")?;
        }
        mounts.push(BindMount {
            src: m.src.to_str().ok_or("mount path is not UTF-8")?.into(),
            dst: m.dst.to_str().ok_or("mount path is not UTF-8")?.into(),
            rw: m.rw,
            handed: false,
            fresh: false,
            owner: None,
        });
    }
    if let Some(m) = fn_mount {
        if !Path::new(&m.src).is_dir() {
            return Err(format!("the entry's folder {} does not exist", m.src));
        }
        mounts.push(m);
    }
    let l = &spec.limits;
    let limits = crate::cgroup_limits(l);
    let mem_text = l.mem.to_string();
    // The function's folder of cgroups gets a memory ceiling as well: at most max_warm
    // zygotes and SLOTS requests each, all at the function's limit. Whatever a request
    // leaves charged behind it (anything that outlives its cgroup) cannot grow past it.
    let max_warm = (spec.max_warm as u64).max(1);
    let ceiling = limits
        .mem_bytes
        .map(|m| m.saturating_mul(max_warm * (1 + SLOTS as u64)));
    let plan = LaunchPlan {
        mode: Mode::Zygote,
        argv,
        env: spec.env.clone(),
        // A function starts in its own folder; a pool has none.
        cwd: if is_pool(spec) { "/work" } else { "/fn" }.into(),
        image,
        mounts,
        scratch_bytes: l.scratch.0,
        timeout_ms: l.timeout.as_millis() as u64,
        ids: identity.ids,
        hostname: "zygo".into(),
        request_ids,
        inotify: spec.inotify,
        image_handed: false,
        work_handed: false,
        work_owner: None,
        hide_pids: Shape::ZYGOTE.hide_pids,
        work_mode: Shape::ZYGOTE.work_mode,
        scripts: is_pool(spec),
        files: Vec::new(),
        agents,
        work: None,
        etc: None,
        egress,
        secrets: !spec.secrets.is_empty(),
    };
    Ok(Planned {
        plan,
        limits,
        mem_text,
        ceiling,
    })
}

impl Functions {
    /// Answer the `serve` requests whose functions are no longer starting: each has a
    /// ready zygote, or failed.
    pub(super) fn answer_serves(&mut self) {
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
        let mut still = Vec::new();
        for (client, key, shown, kind) in std::mem::take(&mut self.pending_layers) {
            let reply = match self.fns.get(&key).map(|f| f.state.clone()) {
                Some(FnState::Starting) => {
                    still.push((client, key, shown, kind));
                    continue;
                }
                Some(FnState::Serving) => Reply::ServedOne { name: shown, kind },
                Some(FnState::Failed(why)) => fail(ErrorCode::BadSpec, why),
                None => fail(
                    ErrorCode::Conflict,
                    format!("{shown} was stopped before it was ready"),
                ),
            };
            self.outbox.push((client, reply, true));
        }
        self.pending_layers = still;
    }

    /// `stop`: its calls are cancelled and answered, its zygotes killed, and its cgroups
    /// removed.
    pub(super) fn stop(&mut self, name: &str, cx: &Ctx) -> Reply {
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
                c.forced.get_or_insert(Outcome::Cancelled);
            }
        }
        for t in zs {
            self.kill_zygote(t, cx);
        }
        for id in ids {
            self.finish(&id, None, None);
        }
        self.fns.remove(name);
        // The keeper removes the cgroups it kept for the function, then its folder.
        if let FromKeeper::Refused { why } = self
            .keeper
            .call(ToKeeper::StopFunction {
                function: crate::keeper::fn_key(name),
            })
            .reply
        {
            log::warn!("remove the cgroups of {name}: {why}");
        }
        log::info!("stopped {name}");
        Reply::Stopped {
            name: name.to_string(),
        }
    }

    /// `warm`: keep `n` zygotes of it (1..=max_warm) from now on, start what is missing,
    /// and thaw the frozen ones.
    pub(super) fn warm(&mut self, name: &str, n: usize, cx: &mut Ctx) -> Reply {
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
}

/// A file's text, refused past `max` bytes.
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
pub(super) fn is_pool(spec: &FnSpec) -> bool {
    policy::gate::is_pool(spec)
}
