//! Dependency sets in the supervisor (see `crate::deps`): builds run on threads of their
//! own, off the event loop (`POST /deps`, and a served `requirements` whose set is not
//! built yet), and a function or pool naming a ready set gets it read-only at /venv.
//!
//! The loop never waits for a build. A set's state is its record on disk, which the
//! building thread writes; a function named against a set still building is refused as
//! `unavailable` (with a retry hint), not queued, and one named against a failed set is
//! refused with the build's reason.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use policy::file::{Agent, FnKind, FnSpec};
use proto::api::{DepsInfo, MAX_DEPS_LOG};
use proto::front::{ErrorCode, Reply};
use proto::launch::{BindMount, LaunchPlan};

use super::{fail, Functions};
use crate::deps::{self, Claim, Inputs, Kind, Record, State};
use crate::supervisor::api::Acting;

/// The most builds that run at once; one more is refused as busy.
const MAX_BUILDS: usize = 4;
/// The most of them one tenant's `POST /deps` may have started, so that one tenant cannot
/// take every place.
const MAX_TENANT_BUILDS: usize = 2;
/// The retry hint (seconds) of a refusal because a set is still building.
pub(super) const BUILDING_RETRY_AFTER: u32 = 5;

/// The builds this supervisor started, by set id, and which sets each tenant holds.
#[derive(Default)]
pub(super) struct Builds {
    running: HashMap<String, Build>,
    /// Each tenant's sets (the ids whose `owners.json` names it), read from disk once when
    /// first needed and kept up to date after: a tenant's list and quota never walk every
    /// set on the host. `None`: not read yet (or forgotten after a set was deleted).
    owned: Option<HashMap<String, BTreeSet<String>>>,
}

/// A build's thread, and the write end of its cancel pipe: closing it stops the build.
struct Build {
    thread: JoinHandle<()>,
    /// The tenant whose `POST /deps` started it (`None`: the host's).
    tenant: Option<String>,
    _cancel: OwnedFd,
}

impl Builds {
    /// Stop every build (each fails, its sandbox killed and its cgroup removed) and wait
    /// for their threads.
    pub(super) fn shutdown(&mut self) {
        for (id, b) in self.running.drain() {
            drop(b._cancel);
            if b.thread.join().is_err() {
                log::error!("the build of dependency set {id} panicked");
            }
        }
    }

    /// Forget who holds what (a set or a tenant was removed): read again when next needed.
    pub(super) fn forget_owners(&mut self) {
        self.owned = None;
    }

    /// The sets `tenant` holds.
    fn owned_by(&mut self, state_dir: &Path, tenant: &str) -> BTreeSet<String> {
        let owned = self.owned.get_or_insert_with(|| {
            let mut m: HashMap<String, BTreeSet<String>> = HashMap::new();
            for id in deps::list(state_dir) {
                for t in deps::owners(state_dir, &id) {
                    m.entry(t).or_default().insert(id.clone());
                }
            }
            m
        });
        owned.get(tenant).cloned().unwrap_or_default()
    }

    fn add_owned(&mut self, tenant: &str, id: &str) {
        if let Some(m) = &mut self.owned {
            m.entry(tenant.to_string())
                .or_default()
                .insert(id.to_string());
        }
    }

    fn remove_owned(&mut self, tenant: &str, id: &str) {
        if let Some(m) = &mut self.owned {
            if let Some(set) = m.get_mut(tenant) {
                set.remove(id);
            }
        }
    }

    /// Join the builds that have ended.
    fn reap(&mut self) {
        let done: Vec<String> = self
            .running
            .iter()
            .filter(|(_, b)| b.thread.is_finished())
            .map(|(id, _)| id.clone())
            .collect();
        for id in done {
            if let Some(b) = self.running.remove(&id) {
                if b.thread.join().is_err() {
                    log::error!("the build of dependency set {id} panicked");
                }
            }
        }
    }
}

/// A ready set a function gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DepsUse {
    pub(super) id: String,
    pub(super) kind: Kind,
    pub(super) tree: PathBuf,
}

/// Why a function cannot have its set now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) code: ErrorCode,
    pub(super) message: String,
    pub(super) retry_after: Option<u32>,
}

impl From<Refusal> for Reply {
    fn from(r: Refusal) -> Reply {
        Reply::Error {
            code: r.code,
            message: r.message,
            retry_after: r.retry_after,
        }
    }
}

fn refusal(code: ErrorCode, message: String) -> Refusal {
    Refusal {
        code,
        message,
        retry_after: None,
    }
}

/// The text of an image for a set's id: as sandbox.toml and `zygo deps build` write it.
fn image_text(image: &policy::Image) -> Result<String, String> {
    match image {
        policy::Image::Host => Ok("host".into()),
        policy::Image::Dir(d) => d
            .to_str()
            .map(|s| format!("dir:{s}"))
            .ok_or_else(|| format!("image path {} is not UTF-8", d.display())),
    }
}

/// Read a file a `requirements` key names (on this host), capped.
fn read_input(p: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(p).map_err(|e| format!("requirements: {}: {e}", p.display()))?;
    let mut bytes = Vec::new();
    f.take(deps::MAX_FILE as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("requirements: {}: {e}", p.display()))?;
    if bytes.len() > deps::MAX_FILE {
        return Err(format!(
            "requirements: {} is larger than {} bytes",
            p.display(),
            deps::MAX_FILE
        ));
    }
    Ok(bytes)
}

/// The inputs a `requirements` key names: a `package.json` or `package-lock.json` is a
/// Node set (the two files side by side); any other file is a Python requirements.txt.
pub(super) fn requirements_inputs(spec: &FnSpec, file: &Path) -> Result<Inputs, String> {
    let image = image_text(&spec.image)?;
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let files = if name == "package.json" || name == "package-lock.json" {
        let dir = file.parent().unwrap_or(Path::new("/"));
        vec![
            (
                "package.json".to_string(),
                read_input(&dir.join("package.json"))?,
            ),
            (
                "package-lock.json".to_string(),
                read_input(&dir.join("package-lock.json"))?,
            ),
        ]
    } else {
        vec![("requirements.txt".to_string(), read_input(file)?)]
    };
    Inputs::new(&image, files).map_err(|e| format!("requirements: {e}"))
}

impl Functions {
    /// Build `inputs` unless its set is ready or building already; the set's record as it
    /// stands (`building` for a build just started). Refused as busy when
    /// [`MAX_BUILDS`] run already, or `tenant` has [`MAX_TENANT_BUILDS`] of them.
    pub(super) fn start_deps(
        &mut self,
        inputs: Inputs,
        tenant: Option<&str>,
        narrowing: deps::Narrowing,
    ) -> Result<Record, Refusal> {
        self.deps_builds.reap();
        let id = inputs.id();
        let building = Record {
            id: id.clone(),
            image: inputs.image.clone(),
            kind: inputs.kind,
            state: State::Building,
            error: None,
            bytes: None,
        };
        if self.deps_builds.running.contains_key(&id) {
            return Ok(building);
        }
        match deps::status(&self.state_dir, &id) {
            Ok(Some(rec)) if rec.state != State::Failed => return Ok(rec),
            Ok(_) => {}
            Err(e) => return Err(refusal(ErrorCode::Internal, e)),
        }
        if let Some(t) = tenant {
            let theirs = self
                .deps_builds
                .running
                .values()
                .filter(|b| b.tenant.as_deref() == Some(t))
                .count();
            if theirs >= MAX_TENANT_BUILDS {
                return Err(Refusal {
                    code: ErrorCode::Busy,
                    message: format!(
                        "{MAX_TENANT_BUILDS} of your dependency sets are building already; send it again once one is done"
                    ),
                    retry_after: Some(BUILDING_RETRY_AFTER * 6),
                });
            }
        }
        if self.deps_builds.running.len() >= MAX_BUILDS {
            return Err(Refusal {
                code: ErrorCode::Busy,
                message: format!(
                    "{MAX_BUILDS} dependency sets are building already; send it again later"
                ),
                retry_after: Some(BUILDING_RETRY_AFTER * 6),
            });
        }
        let state_dir = self.state_dir.clone();
        let launcher = self.launcher.clone();
        let backend = self.backend.clone();
        let thread_id = id.clone();
        let (cancel_r, cancel_w) = plumbing::pipes::pipe()
            .map_err(|e| refusal(ErrorCode::Internal, format!("create a pipe: {e}")))?;
        let handle = std::thread::Builder::new()
            .name("zygo-deps".into())
            .spawn(move || {
                let rec = match deps::claim(&state_dir, &inputs) {
                    Ok(Claim::Build(lock, _)) => {
                        log::info!("building dependency set {thread_id}");
                        deps::build(
                            &state_dir,
                            &inputs,
                            lock,
                            launcher,
                            &backend,
                            Some(cancel_r),
                            &narrowing,
                        )
                    }
                    // Ready, or another process builds it.
                    Ok(Claim::Exists(_)) => return,
                    Err(e) => {
                        log::error!("dependency set {thread_id}: {e}");
                        return;
                    }
                };
                match rec.state {
                    State::Ready => log::info!("dependency set {thread_id} is ready"),
                    _ => log::warn!(
                        "dependency set {thread_id} failed: {}",
                        rec.error.as_deref().unwrap_or("no reason")
                    ),
                }
            })
            .map_err(|e| refusal(ErrorCode::Internal, format!("start a build thread: {e}")))?;
        self.deps_builds.running.insert(
            id,
            Build {
                thread: handle,
                tenant: tenant.map(str::to_string),
                _cancel: cancel_w,
            },
        );
        Ok(building)
    }

    /// The set a function names (`deps`, or the set its `requirements` make, started if it
    /// is not built), when it is ready; refused while it builds, when it failed, or when
    /// there is no such set.
    pub(super) fn deps_for(&mut self, spec: &FnSpec) -> Result<Option<DepsUse>, Refusal> {
        let refuse = refusal;
        let (id, started) = match (&spec.deps, &spec.requirements) {
            (Some(id), _) => (id.clone(), false),
            (None, Some(file)) => {
                let inputs =
                    requirements_inputs(spec, file).map_err(|e| refuse(ErrorCode::BadSpec, e))?;
                (
                    self.start_deps(inputs, None, deps::Narrowing::default())?
                        .id,
                    true,
                )
            }
            (None, None) => return Ok(None),
        };
        let rec = match deps::status(&self.state_dir, &id) {
            Ok(Some(r)) => r,
            Ok(None) if started || self.deps_builds.running.contains_key(&id) => Record {
                id: id.clone(),
                image: String::new(),
                kind: Kind::Python,
                state: State::Building,
                error: None,
                bytes: None,
            },
            Ok(None) => {
                return Err(refuse(
                    ErrorCode::NotFound,
                    format!(
                        "deps: no dependency set {id} on this host (POST /deps, or `zygo deps build`, makes one)"
                    ),
                ))
            }
            Err(e) => return Err(refuse(ErrorCode::Internal, e)),
        };
        match rec.state {
            State::Ready => Ok(Some(DepsUse {
                tree: deps::tree(&self.state_dir, &id),
                id,
                kind: rec.kind,
            })),
            State::Building => Err(Refusal {
                code: ErrorCode::Unavailable,
                message: format!(
                    "dependency set {id} is still building; serve this again once it is ready (GET /deps/{id}, or `zygo deps show {id}`)"
                ),
                retry_after: Some(BUILDING_RETRY_AFTER),
            }),
            State::Failed => Err(refuse(
                ErrorCode::BadSpec,
                format!(
                    "dependency set {id} failed to build: {} (its log: GET /deps/{id}, or `zygo deps show {id}`)",
                    rec.error.as_deref().unwrap_or("no reason recorded")
                ),
            )),
        }
    }

    /// The functions and pools (by key) served on set `id`.
    pub(super) fn deps_users(&self, id: &str) -> Vec<String> {
        self.fns
            .iter()
            .filter(|(_, f)| f.deps.as_ref().is_some_and(|d| d.id == id))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Whether the acting caller may see set `id`: the host's callers see every set, a tenant
/// those it sent.
pub(super) fn visible(state_dir: &Path, id: &str, who: &Acting) -> bool {
    match &who.tenant {
        None => true,
        Some(t) => deps::owners(state_dir, id).iter().any(|o| o == t),
    }
}

/// The answer's form of a set's record (the log of a build that failed or is under way,
/// only when asked for).
fn info(state_dir: &Path, rec: &Record, with_log: bool) -> DepsInfo {
    let log = (with_log && rec.state != State::Ready).then(|| {
        let log = deps::read_log(state_dir, &rec.id);
        let mut start = log.len().saturating_sub(MAX_DEPS_LOG);
        while !log.is_char_boundary(start) {
            start += 1;
        }
        log[start..].to_string()
    });
    DepsInfo {
        id: rec.id.clone(),
        image: rec.image.clone(),
        kind: rec.kind.as_str().into(),
        state: rec.state.as_str().into(),
        error: rec.error.clone(),
        log,
    }
}

fn not_found(id: &str) -> Reply {
    fail(
        ErrorCode::NotFound,
        format!("no dependency set {id} (POST /deps makes one)"),
    )
}

fn bad_id(id: &str) -> Option<Reply> {
    (!deps::is_id(id)).then(|| {
        fail(
            ErrorCode::BadRequest,
            format!(
                "{:?} is not a dependency set's id: deps_ and 64 lowercase hex digits",
                id.chars().take(80).collect::<String>()
            ),
        )
    })
}

impl Functions {
    /// `POST /deps`: check the files, start the set's build unless it is built or
    /// building, and record the caller as one who sent it; answered at once.
    ///
    /// A caller without deploy rights builds only on `host`, from inputs that name
    /// registry packages and nothing else (`policy::deps`). A tenant's set is its own (its
    /// id hashes the tenant's too, so another tenant's set of the same files is neither
    /// met nor told of), built within the tenant's limits (its network must reach the
    /// registries), and counted against its quota in sets and bytes; a tenant at its
    /// count has its oldest failed set removed to make room, or is refused. A refused
    /// request leaves nothing on disk.
    pub(super) fn put_deps(
        &mut self,
        image: &str,
        files: Vec<(String, String)>,
        who: &Acting,
    ) -> Reply {
        let deploy = who.gate_caller().has_deploy_rights();
        if let Err(e) = policy::deps::image_allowed(image, deploy) {
            return fail(ErrorCode::Forbidden, e);
        }
        if !deploy {
            let text = |name: &str| {
                files
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.as_str())
            };
            let checked = match (
                text("requirements.txt"),
                text("package.json"),
                text("package-lock.json"),
            ) {
                (Some(r), None, None) => policy::deps::check_requirements(r),
                (None, Some(m), Some(l)) => policy::deps::check_node(m, l),
                // Inputs::new names what is wrong with any other set of files.
                _ => Ok(()),
            };
            if let Err(e) = checked {
                return fail(ErrorCode::BadRequest, e.to_string());
            }
        }
        let files = files
            .into_iter()
            .map(|(n, t)| (n, t.into_bytes()))
            .collect();
        let mut inputs = match Inputs::new(image, files) {
            Ok(i) => i,
            Err(e) => return fail(ErrorCode::BadRequest, e),
        };
        let mut narrowing = deps::Narrowing::default();
        if let Some(t) = &who.tenant {
            inputs = inputs.for_tenant(t);
            narrowing = match self.tenant_build(t, &inputs.id(), who) {
                Ok(n) => n,
                Err(r) => return r.into(),
            };
        }
        let id = inputs.id();
        let rec = match self.start_deps(inputs, who.tenant.as_deref(), narrowing) {
            Ok(rec) => rec,
            Err(r) => return r.into(),
        };
        if let Some(t) = &who.tenant {
            if let Err(e) = deps::add_owner(&self.state_dir, &id, t) {
                return fail(ErrorCode::Internal, e);
            }
            self.deps_builds.add_owned(t, &id);
        }
        Reply::Deps(info(&self.state_dir, &rec, false))
    }

    /// What a tenant's new build may use: its limits, and what is left of its quota in
    /// bytes. Refused when its network cannot reach the registries or its quota is used
    /// (after removing its oldest failed set, if it is at its count). `id` is the set's:
    /// one the tenant holds already takes nothing more.
    fn tenant_build(
        &mut self,
        tenant: &str,
        id: &str,
        who: &Acting,
    ) -> Result<deps::Narrowing, Refusal> {
        let settings = deps::Settings::from_env().map_err(|e| refusal(ErrorCode::Internal, e))?;
        let registries: Vec<policy::file::AllowRule> = settings
            .registries
            .iter()
            .filter_map(|r| policy::file::AllowRule::parse("ZYGO_DEPS_REGISTRIES", r).ok())
            .collect();
        super::requests::tenant_egress(&registries, &who.limits).map_err(|e| {
            refusal(
                ErrorCode::Forbidden,
                format!("a dependency build reaches the package registries, and {e}"),
            )
        })?;
        let mine = self.deps_builds.owned_by(&self.state_dir, tenant);
        let records: Vec<Record> = mine
            .iter()
            .filter(|m| m.as_str() != id)
            .filter_map(|m| self.deps_record(m))
            .collect();
        let used: u64 = records.iter().filter_map(|r| r.bytes).sum();
        if !mine.contains(id) && records.len() >= settings.tenant_sets {
            // The oldest failed set makes room; a ready or building one never does.
            let oldest_failed = records
                .iter()
                .filter(|r| r.state == State::Failed)
                .min_by_key(|r| deps::modified(&self.state_dir, &r.id));
            match oldest_failed {
                Some(r) => {
                    let gone = r.id.clone();
                    if let Err(e) = deps::remove(&self.state_dir, &gone) {
                        return Err(refusal(ErrorCode::Internal, e));
                    }
                    self.deps_builds.remove_owned(tenant, &gone);
                    log::info!("dependency set {gone} (failed) removed to make room for {tenant}");
                }
                None => {
                    return Err(refusal(
                        ErrorCode::Forbidden,
                        format!(
                            "this tenant holds {} dependency sets, its quota \
                             (ZYGO_DEPS_TENANT_SETS); the operator removes sets with DELETE \
                             /deps/{{id}}",
                            settings.tenant_sets
                        ),
                    ))
                }
            }
        }
        let left = settings.tenant_bytes.saturating_sub(used);
        if left == 0 {
            return Err(refusal(
                ErrorCode::Forbidden,
                format!(
                    "this tenant's dependency sets hold {used} bytes, its quota of {} \
                     (ZYGO_DEPS_TENANT_BYTES); the operator removes sets with DELETE \
                     /deps/{{id}}",
                    settings.tenant_bytes
                ),
            ));
        }
        Ok(deps::Narrowing {
            limits: Some(who.limits.clone()),
            max_size: Some(left),
        })
    }

    /// `GET /deps`: the sets the caller may see, without logs.
    /// A tenant's are the sets it holds (a bounded list, kept in memory); the host's
    /// callers see every set on the host.
    pub(super) fn list_deps(&mut self, who: &Acting) -> Reply {
        self.deps_builds.reap();
        let ids: Vec<String> = match &who.tenant {
            Some(t) => self
                .deps_builds
                .owned_by(&self.state_dir, t)
                .into_iter()
                .collect(),
            None => deps::list(&self.state_dir),
        };
        let mut out = Vec::new();
        for id in ids {
            if let Some(rec) = self.deps_record(&id) {
                out.push(info(&self.state_dir, &rec, false));
            }
        }
        Reply::DepsList(out)
    }

    /// `GET /deps/{id}`: one set, with its log when its build failed.
    pub(super) fn deps_info(&mut self, id: &str, who: &Acting) -> Reply {
        if let Some(r) = bad_id(id) {
            return r;
        }
        self.deps_builds.reap();
        if !visible(&self.state_dir, id, who) {
            return not_found(id);
        }
        match self.deps_record(id) {
            Some(rec) => Reply::Deps(info(&self.state_dir, &rec, true)),
            None => not_found(id),
        }
    }

    /// `DELETE /deps/{id}`: refused while a function or pool is served on the set, or
    /// while it builds.
    pub(super) fn delete_deps(&mut self, id: &str) -> Reply {
        if let Some(r) = bad_id(id) {
            return r;
        }
        self.deps_builds.reap();
        let Some(rec) = self.deps_record(id) else {
            return not_found(id);
        };
        let users = self.deps_users(id);
        if !users.is_empty() {
            let shown: Vec<&str> = users
                .iter()
                .map(|k| k.rsplit('/').next().unwrap_or(k))
                .collect();
            return fail(
                ErrorCode::Conflict,
                format!(
                    "dependency set {id} is in use by {}; stop {} first",
                    shown.join(", "),
                    if shown.len() == 1 { "it" } else { "them" }
                ),
            );
        }
        if rec.state == State::Building {
            return fail(
                ErrorCode::Conflict,
                format!("dependency set {id} is still building; delete it once it has finished"),
            );
        }
        let removed = deps::remove(&self.state_dir, id);
        self.deps_builds.forget_owners();
        match removed {
            Ok(()) => Reply::DepsDeleted { id: id.to_string() },
            Err(e) => fail(ErrorCode::Internal, e),
        }
    }

    /// A set's record, with a build this supervisor runs (whose thread may not have
    /// written the record yet) as building.
    fn deps_record(&self, id: &str) -> Option<Record> {
        let rec = deps::status(&self.state_dir, id).ok().flatten();
        if self.deps_builds.running.contains_key(id) {
            return Some(match rec {
                Some(r) if r.state != State::Ready => Record {
                    state: State::Building,
                    error: None,
                    bytes: None,
                    ..r
                },
                Some(r) => r,
                None => Record {
                    id: id.to_string(),
                    image: String::new(),
                    kind: Kind::Python,
                    state: State::Building,
                    error: None,
                    bytes: None,
                },
            });
        }
        rec
    }
}

/// Give a launch plan its set: the tree read-only at /venv, and the environment pointing
/// at it. A Python set puts /venv/bin first on PATH and runs the Python agent with the
/// venv's interpreter (so handlers import what it holds); a Node set sets NODE_PATH and
/// mounts its node_modules at /node_modules as well, where an ES module's import finds it.
pub(super) fn apply(plan: &mut LaunchPlan, spec: &FnSpec, set: &DepsUse) -> Result<(), String> {
    let tree = set
        .tree
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", set.tree.display()))?;
    if spec
        .mounts
        .iter()
        .any(|m| m.dst == Path::new(deps::MOUNT) || m.dst == Path::new(deps::NODE_MODULES_MOUNT))
    {
        return Err(format!(
            "mounts: a dependency set takes {} (and {} for Node); mount elsewhere",
            deps::MOUNT,
            deps::NODE_MODULES_MOUNT
        ));
    }
    plan.mounts.push(BindMount {
        src: tree.to_string(),
        dst: deps::MOUNT.into(),
        rw: false,
        handed: false,
        fresh: false,
        owner: None,
    });
    match set.kind {
        Kind::Python => {
            let path = plan
                .env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let path = if path.is_empty() {
                format!("{}/bin", deps::MOUNT)
            } else {
                format!("{}/bin:{path}", deps::MOUNT)
            };
            set_env(&mut plan.env, "PATH", path);
            set_env(&mut plan.env, "VIRTUAL_ENV", deps::MOUNT.into());
            if matches!(
                spec.kind,
                FnKind::Agent {
                    agent: Agent::Python,
                    ..
                }
            ) {
                if let Some(first) = plan.argv.first_mut() {
                    if first == "/usr/bin/python3" {
                        *first = format!("{}/bin/python3", deps::MOUNT);
                    }
                }
            }
        }
        Kind::Node => {
            plan.mounts.push(BindMount {
                src: format!("{tree}/node_modules"),
                dst: deps::NODE_MODULES_MOUNT.into(),
                rw: false,
                handed: false,
                fresh: false,
                owner: None,
            });
            set_env(
                &mut plan.env,
                "NODE_PATH",
                format!("{}/node_modules", deps::MOUNT),
            );
        }
    }
    Ok(())
}

fn set_env(env: &mut Vec<(String, String)>, key: &str, value: String) {
    match env.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => env.push((key.to_string(), value)),
    }
}
