//! The keeper: what needs privilege for the functions the supervisor serves, behind one
//! fixed-shape request table ([`proto::keeper`], [`table`]). Today it runs inside the
//! supervisor and is called in process; its requests are the ones the runtime will send
//! over a channel once it is a process of its own, and in debug builds each one is encoded
//! and decoded on the way, so that nothing but the fixed shapes can cross.
//!
//! It holds the cgroups: every zygote's and every request's (a slot's) cgroup, named to the
//! runtime only by the ids it issued. The runtime gets each cgroup's view (freeze, thaw,
//! weight, counters: see [`crate::cgroup::CgroupView`]) and never a path or a descriptor
//! that could change a limit or move a process. What it asks is checked here: a child is
//! placed only if it is in its zygote's cgroup (held by a pidfd between check and move), a
//! slot's limits are only ever narrowed, names are checked before a path is made of them.

pub mod cgworker;
pub mod table;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use proto::keeper::{FnKey, FromKeeper, LimitsMsg, RunId, SlotId, ToKeeper, UsageMsg, ZygoteId};

use crate::cgroup::{Backend, Cgroup, CgroupError, CgroupView, Limits, Usage, Weight};
use cgworker::{Job, Placed, Viewed, Worker};
use table::Phase;

/// The keeper's answer to one request (or an event): the message, and the descriptors
/// that travel beside it.
pub struct Answer {
    pub reply: FromKeeper,
    /// A cgroup's view, with [`FromKeeper::Zygote`] and [`FromKeeper::Slot`].
    pub view: Option<Box<dyn CgroupView>>,
    /// A zygote's attach files, with [`FromKeeper::Zygote`].
    pub files: Vec<OwnedFd>,
}

impl Answer {
    fn of(reply: FromKeeper) -> Answer {
        Answer {
            reply,
            view: None,
            files: Vec::new(),
        }
    }
}

/// Why a request was refused.
#[derive(Debug)]
pub enum Refusal {
    /// The table does not allow it (see [`table::Violation`]).
    Table(table::Violation),
    /// No zygote or slot of that id (never issued, or gone).
    UnknownZygote(ZygoteId),
    UnknownSlot(SlotId),
    UnknownRun(RunId),
    /// A name that cannot be part of a cgroup's path.
    BadName {
        what: &'static str,
        name: String,
    },
    /// A process that is not the zygote's, or one placed already.
    NotTheZygotes(i32),
    /// A function that is not served.
    NotServed(String),
    /// A request allowed once per zygote, slot or run, sent again.
    Again(&'static str),
    /// A message that does not cross the wire (see [`on_the_wire`]).
    Wire(String),
    /// Limits wider than the zygote's.
    Wider(&'static str),
    /// A slot of a tenant's function asked to move to a tenant's folder.
    NotAHostFunction,
    /// A cgroup operation failed.
    Cgroup {
        step: &'static str,
        source: CgroupError,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Table(v) => write!(f, "{v}"),
            Refusal::UnknownZygote(z) => write!(f, "no zygote {}", z.0),
            Refusal::UnknownSlot(s) => write!(f, "no slot {}", s.0),
            Refusal::UnknownRun(r) => write!(f, "no run {}", r.0),
            Refusal::BadName { what, name } => write!(f, "{name:?} is not a {what}"),
            Refusal::NotTheZygotes(pid) => {
                write!(f, "process {pid} is not in its zygote's cgroup")
            }
            Refusal::Wider(what) => write!(f, "the {what} asked for is above the zygote's"),
            Refusal::NotServed(key) => write!(f, "{key} is not served"),
            Refusal::Again(what) => write!(f, "{what} was done already"),
            Refusal::Wire(why) => write!(f, "the request does not cross the wire: {why}"),
            Refusal::NotAHostFunction => {
                f.write_str("only a host function's child moves into a tenant's folder")
            }
            Refusal::Cgroup { step, source } => write!(f, "{step}: {source}"),
        }
    }
}

/// A keeper made without a cgroup tree (unit tests) refuses what needs one.
fn no_tree() -> Refusal {
    Refusal::Cgroup {
        step: "reach the cgroup tree",
        source: CgroupError::Unavailable("this keeper has no cgroup tree".into()),
    }
}

fn cg_err(step: &'static str) -> impl FnOnce(CgroupError) -> Refusal {
    move |source| Refusal::Cgroup { step, source }
}

/// A zygote's cgroup and what it was made for.
struct Zygote {
    /// The function's key: `name`, or `tenant/name` for a tenant's.
    key: String,
    limits: Limits,
    cg: Box<dyn Cgroup>,
    /// Its first process was placed (once only).
    init_placed: bool,
}

/// A one-shot run's cgroup.
struct Run {
    cg: Box<dyn Cgroup>,
    /// Its first process was placed (once only).
    init_placed: bool,
}

/// A slot's cgroup, its child, and what becomes of the cgroup when it closes.
struct Slot {
    zygote: ZygoteId,
    name: String,
    cgroup: Viewed,
    pid: i32,
    /// The child, held while it is parked: moved again for a tenant's call.
    pidfd: Option<OwnedFd>,
    /// Kept on release for this key with these limits; `None` (narrowed): removed.
    keep_as: Option<(String, Limits)>,
    /// Given to a call's tenant or limits (once only, before its call).
    prepared: bool,
}

/// The cgroup tree and the worker thread that does its slow work.
struct Host {
    backend: Arc<Backend>,
    worker: Worker,
}

pub struct LocalKeeper {
    /// `None` only in unit tests, which hand the keeper fake cgroups.
    host: Option<Host>,
    phase: Phase,
    next: u64,
    /// The functions served, by key, with the limits they were served with.
    served: HashMap<String, Limits>,
    zygotes: HashMap<ZygoteId, Zygote>,
    slots: HashMap<SlotId, Slot>,
    /// Parked children being placed off the loop, by pid: each is placed once.
    placing: HashSet<i32>,
    /// One-shot runs' cgroups.
    runs: HashMap<RunId, Run>,
    /// The folders runs were made in: removed when the supervisor stops.
    run_dirs: BTreeSet<String>,
}

/// The memory, CPU and pids limits, as a message carries them.
pub fn limits_msg(l: &Limits) -> LimitsMsg {
    LimitsMsg {
        mem_bytes: l.mem_bytes,
        cpu_millis: l.cpu_millis,
        pids: l.pids,
        io_bps: l.io_bps,
        io_iops: l.io_iops,
    }
}

fn limits_of(m: &LimitsMsg) -> Limits {
    Limits {
        mem_bytes: m.mem_bytes,
        cpu_millis: m.cpu_millis,
        pids: m.pids,
        io_bps: m.io_bps,
        io_iops: m.io_iops,
    }
}

pub fn usage_msg(u: &Usage) -> UsageMsg {
    UsageMsg {
        oom_kills: u.oom_kills,
        peak_bytes: u.peak_bytes,
        cpu_usec: u.cpu_usec,
    }
}

/// The function key `name` or `tenant/name` as a message carries it.
pub fn fn_key(key: &str) -> FnKey {
    match key.split_once('/') {
        Some((t, n)) => FnKey {
            tenant: Some(t.to_string()),
            name: n.to_string(),
        },
        None => FnKey {
            tenant: None,
            name: key.to_string(),
        },
    }
}

/// A function key, checked, as the string the folders are named by.
fn checked_key(f: &FnKey) -> Result<String, Refusal> {
    if policy::file::check_fn_name(&f.name, None).is_err() {
        return Err(Refusal::BadName {
            what: "function name",
            name: f.name.clone(),
        });
    }
    match &f.tenant {
        None => Ok(f.name.clone()),
        Some(t) if proto::api::is_tenant_id(t) => Ok(format!("{t}/{}", f.name)),
        Some(t) => Err(Refusal::BadName {
            what: "tenant id",
            name: t.clone(),
        }),
    }
}

/// The key under which a tenant's calls of the host's function `name` are kept:
/// `<tenant>/@<name>`, whose folder (`tenants/<tenant>/@<name>`) no function's can be (a
/// function's name has no `@`), so a tenant's own function of the same name is apart.
fn calls_key(tenant: &str, name: &str) -> String {
    format!("{tenant}/@{name}")
}

/// The folder of a function's cgroups: `tenants/<tenant>/<name>` for a tenant's function
/// (served under the key `<tenant>/<name>`), `tenants/_host/<name>` for the host's, and
/// `tenants/<tenant>/@<name>` for a tenant's calls of the host's (see [`calls_key`]).
pub fn cg_folder(key: &str) -> String {
    match key.split_once('/') {
        Some((tenant, name)) => format!("tenants/{tenant}/{name}"),
        None => format!("tenants/_host/{key}"),
    }
}

/// Whether `pid` could be a sandbox's first process: never init, the kernel's, a group
/// (0 and negative numbers name this process or groups) or the keeper itself.
fn plausible_pid(pid: i32) -> bool {
    pid > 1 && u32::try_from(pid).is_ok_and(|p| p != std::process::id())
}

/// Where a sandbox's first process is when its launcher says it cloned it: in its cgroup
/// (it joined through the attach files before the launcher reported it), gone already, or
/// not there. The keeper never moves it: a pid it is told could be anyone's.
fn first_process(cg: &dyn Cgroup, pid: i32) -> FromKeeper {
    if cg.contains(pid).unwrap_or(false) {
        return FromKeeper::Done;
    }
    match plumbing::sys::pidfd_open(pid) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => FromKeeper::Gone,
        _ => FromKeeper::Refused {
            why: format!("process {pid} is not in its sandbox's cgroup"),
        },
    }
}

/// The folder of a caller's runs.
fn run_dir(tenant: Option<&str>) -> String {
    format!("tenants/{}/_run", tenant.unwrap_or("_host"))
}

/// Whether `asked` is within `zygote`'s limits, limit by limit.
fn within(asked: &Limits, zygote: &Limits) -> Result<(), Refusal> {
    let mem = match (asked.mem_bytes, zygote.mem_bytes) {
        (_, None) => true,
        (Some(a), Some(z)) => a <= z,
        (None, Some(_)) => false,
    };
    if !mem {
        return Err(Refusal::Wider("memory"));
    }
    if asked.cpu_millis > zygote.cpu_millis {
        return Err(Refusal::Wider("CPU"));
    }
    if asked.pids > zygote.pids {
        return Err(Refusal::Wider("process count"));
    }
    // A tenant has no I/O limits of its own; 0 would lift the throttle on v1.
    if asked.io_bps != zygote.io_bps || asked.io_iops != zygote.io_iops {
        return Err(Refusal::Wider("I/O rate"));
    }
    Ok(())
}

/// A request as it will cross the channel between processes: no larger than a keeper
/// frame, and (in debug builds) encoded and decoded on the way, so that only what the
/// fixed shapes carry arrives. One that does not cross is refused.
fn on_the_wire(req: ToKeeper) -> Result<ToKeeper, Refusal> {
    let bytes = proto::codec::encode(&req).map_err(|e| Refusal::Wire(e.to_string()))?;
    if bytes.len() > proto::keeper::MAX_KEEPER_FRAME {
        return Err(Refusal::Wire(format!(
            "{} bytes, over the {} a keeper frame holds",
            bytes.len(),
            proto::keeper::MAX_KEEPER_FRAME
        )));
    }
    if cfg!(debug_assertions) {
        let back =
            proto::codec::decode::<ToKeeper>(&bytes).map_err(|e| Refusal::Wire(e.to_string()))?;
        debug_assert_eq!(back, req, "a keeper request changed on the wire");
        return Ok(back);
    }
    Ok(req)
}

impl LocalKeeper {
    /// The keeper of `backend`'s tree, with its worker thread (which wakes the loop through
    /// `waker` when a placement is done).
    pub fn start(backend: Backend, waker: Arc<mio::Waker>) -> std::io::Result<LocalKeeper> {
        let backend = Arc::new(backend);
        let worker = Worker::start(backend.clone(), waker)?;
        Ok(LocalKeeper::with(Some(Host { backend, worker })))
    }

    /// A keeper serving, that has issued no id and holds no cgroup (`host` `None`: no
    /// cgroup tree either, for unit tests and the fuzz target).
    fn with(host: Option<Host>) -> LocalKeeper {
        LocalKeeper {
            host,
            phase: Phase::Serving,
            next: 0,
            served: HashMap::new(),
            zygotes: HashMap::new(),
            slots: HashMap::new(),
            placing: HashSet::new(),
            runs: HashMap::new(),
            run_dirs: BTreeSet::new(),
        }
    }

    /// The backend, for what is not behind the table yet (one-shot runs, dependency
    /// builds).
    pub fn backend(&self) -> Option<&Arc<Backend>> {
        self.host.as_ref().map(|h| &h.backend)
    }

    /// "v1 /sys/fs/cgroup/..." (for logs and `zygo version`).
    pub fn describe(&self) -> String {
        match &self.host {
            Some(h) => format!("{} {}", h.backend.name(), h.backend.root()),
            None => "no cgroups".into(),
        }
    }

    pub fn backend_name(&self) -> &'static str {
        self.host.as_ref().map_or("none", |h| h.backend.name())
    }

    /// The drain began: no function is served from now on.
    pub fn begin_drain(&mut self) {
        self.phase = Phase::Draining;
    }

    /// A one-shot run's cgroup, to be removed off the loop.
    pub fn remove_later(&self, cg: Box<dyn Cgroup>) {
        match &self.host {
            Some(h) => h.worker.send(Job::Remove(cg)),
            None => drop(cg.remove()),
        }
    }

    fn issue(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// One request.
    pub fn call(&mut self, req: ToKeeper) -> Answer {
        let req = match on_the_wire(req) {
            Ok(r) => r,
            Err(r) => {
                log::error!("keeper: {r}");
                return Answer::of(FromKeeper::Refused { why: r.to_string() });
            }
        };
        if let Err(v) = table::admit(self.phase, req.kind()) {
            log::error!("keeper: {v}");
            return Answer::of(FromKeeper::Refused {
                why: Refusal::Table(v).to_string(),
            });
        }
        let done = match req {
            ToKeeper::ServeFunction {
                function,
                limits,
                ceiling,
            } => self.serve_function(&function, &limits, ceiling),
            ToKeeper::StopFunction { function } => self.stop_function(&function),
            ToKeeper::MakeZygote { function } => self.make_zygote(&function),
            ToKeeper::PlaceInit { zygote, pid } => self.place_init(zygote, pid),
            ToKeeper::PlaceSpare { zygote, slot, pid } => self.place_spare(zygote, slot, pid),
            ToKeeper::PrepareSlot {
                slot,
                tenant,
                limits,
            } => self.prepare_slot(slot, tenant, limits),
            ToKeeper::KillSlot { slot } => self.kill_slot(slot),
            ToKeeper::ReleaseSlot { slot } => self.release_slot(slot),
            ToKeeper::RemoveZygote { zygote } => self.remove_zygote(zygote),
            ToKeeper::ForgetTenant { tenant } => self.forget_tenant(&tenant),
            ToKeeper::MakeRun { tenant, limits } => self.make_run(tenant.as_deref(), &limits),
            ToKeeper::PlaceRunInit { run, pid } => self.place_run_init(run, pid),
            ToKeeper::KillRun { run } => self.kill_run(run),
            ToKeeper::EndRun { run, kill } => self.end_run(run, kill),
        };
        done.unwrap_or_else(|r| Answer::of(FromKeeper::Refused { why: r.to_string() }))
    }

    fn host(&self) -> Result<&Host, Refusal> {
        self.host.as_ref().ok_or_else(no_tree)
    }

    fn serve_function(
        &mut self,
        f: &FnKey,
        limits: &LimitsMsg,
        ceiling: Option<u64>,
    ) -> Result<Answer, Refusal> {
        let key = checked_key(f)?;
        let host = self.host()?;
        let folder = cg_folder(&key);
        host.worker.remember(&key);
        if let Err(e) = host.backend.set_ceiling(&folder, ceiling) {
            host.worker.forget(&key, folder);
            return Err(Refusal::Cgroup {
                step: "write the function's memory ceiling",
                source: e,
            });
        }
        self.served.insert(key, limits_of(limits));
        Ok(Answer::of(FromKeeper::Done))
    }

    fn stop_function(&mut self, f: &FnKey) -> Result<Answer, Refusal> {
        let key = checked_key(f)?;
        self.served.remove(&key);
        // The worker removes the cgroups it kept for the function, then its folder.
        self.host()?.worker.forget(&key, cg_folder(&key));
        Ok(Answer::of(FromKeeper::Done))
    }

    fn make_zygote(&mut self, f: &FnKey) -> Result<Answer, Refusal> {
        let key = checked_key(f)?;
        let limits = *self
            .served
            .get(&key)
            .ok_or_else(|| Refusal::NotServed(key.clone()))?;
        let id = plumbing::random_hex(6).map_err(|e| Refusal::Cgroup {
            step: "name the zygote's cgroup",
            source: CgroupError::Unavailable(e.to_string()),
        })?;
        let cg = self
            .host()?
            .backend
            .create(&format!(
                "{}/z-{}-{id}",
                cg_folder(&key),
                std::process::id()
            ))
            .map_err(cg_err("make the zygote's cgroup"))?;
        // On any error below, dropping `cg` removes it.
        cg.set_limits(&limits)
            .and_then(|_| cg.set_weight(Weight::Background))
            .map_err(cg_err("write the zygote's limits"))?;
        let view = cg.view().map_err(cg_err("open the zygote's cgroup"))?;
        let files = cg
            .attach_files()
            .map_err(cg_err("open the zygote's cgroup"))?;
        let zygote = ZygoteId(self.issue());
        self.zygotes.insert(
            zygote,
            Zygote {
                key,
                limits,
                cg: cg.keep(),
                init_placed: false,
            },
        );
        Ok(Answer {
            reply: FromKeeper::Zygote { zygote },
            view: Some(view),
            files,
        })
    }

    fn place_init(&mut self, zygote: ZygoteId, pid: i32) -> Result<Answer, Refusal> {
        let z = self
            .zygotes
            .get_mut(&zygote)
            .ok_or(Refusal::UnknownZygote(zygote))?;
        if z.init_placed {
            return Err(Refusal::Again("placing the zygote's first process"));
        }
        z.init_placed = true;
        if !plausible_pid(pid) {
            return Err(Refusal::NotTheZygotes(pid));
        }
        Ok(Answer::of(first_process(&*z.cg, pid)))
    }

    fn place_spare(&mut self, zygote: ZygoteId, slot: String, pid: i32) -> Result<Answer, Refusal> {
        if !proto::keeper::is_slot_name(&slot) {
            return Err(Refusal::BadName {
                what: "slot name",
                name: slot,
            });
        }
        let z = self
            .zygotes
            .get(&zygote)
            .ok_or(Refusal::UnknownZygote(zygote))?;
        // Each child is placed once.
        if self.placing.contains(&pid) || self.slots.values().any(|s| s.pid == pid) {
            return Err(Refusal::NotTheZygotes(pid));
        }
        // The pid is the number the kernel gave for the registration's sender, which may
        // have exited since and its number gone to any process on the host. Only a process
        // that is still this zygote's (in its cgroup, where its agent forked it, and alive
        // by a pidfd taken before that check) is moved. The pidfd is checked again just
        // before the move; it does not hold the number itself, so a child its agent reaps
        // in the few writes between that check and the move frees it.
        let pidfd = plumbing::sys::pidfd_open(pid).ok();
        let ours = pidfd.as_ref().is_some_and(|fd| {
            z.cg.contains(pid).unwrap_or(false) && plumbing::sys::pidfd_alive(fd)
        });
        let Some(pidfd) = pidfd.filter(|_| ours) else {
            return Err(Refusal::NotTheZygotes(pid));
        };
        let (key, limits) = (z.key.clone(), z.limits);
        let host = self.host()?;
        // Usually into a cgroup kept from an earlier request, here and now.
        if let Some(cg) = host.worker.place_kept(&key, &limits, pid, &pidfd) {
            let keep_as = Some((key, limits));
            return self.register(zygote, slot, cg, pid, pidfd, keep_as);
        }
        // Otherwise a new cgroup is made off the loop: an event says how it went.
        self.placing.insert(pid);
        let host = self.host()?;
        host.worker.send(Job::Place {
            zygote,
            rel: format!("{}/r-{}-{slot}", cg_folder(&key), std::process::id()),
            pool: key,
            slot,
            pid,
            pidfd,
            limits,
        });
        Ok(Answer::of(FromKeeper::Placing))
    }

    /// A placed child's slot, issued; its view (a copy) goes to the runtime.
    fn register(
        &mut self,
        zygote: ZygoteId,
        name: String,
        cgroup: Viewed,
        pid: i32,
        pidfd: OwnedFd,
        keep_as: Option<(String, Limits)>,
    ) -> Result<Answer, Refusal> {
        let view = match cgroup.view.duplicate() {
            Ok(v) => v,
            Err(e) => {
                self.remove_later(cgroup.cg);
                return Err(Refusal::Cgroup {
                    step: "hold a slot's cgroup",
                    source: e,
                });
            }
        };
        let id = SlotId(self.issue());
        self.slots.insert(
            id,
            Slot {
                zygote,
                name: name.clone(),
                cgroup,
                pid,
                pidfd: Some(pidfd),
                keep_as,
                prepared: false,
            },
        );
        Ok(Answer {
            reply: FromKeeper::Slot {
                zygote,
                slot: name,
                id,
            },
            view: Some(view),
            files: Vec::new(),
        })
    }

    /// Placements the worker finished: one event each.
    pub fn events(&mut self) -> Vec<Answer> {
        let done = match &self.host {
            Some(h) => h.worker.done(),
            None => return Vec::new(),
        };
        let mut out = Vec::new();
        for Placed {
            zygote,
            slot,
            result,
            pid,
            pidfd,
        } in done
        {
            self.placing.remove(&pid);
            let Some(z) = self.zygotes.get(&zygote) else {
                // Its zygote went away meanwhile.
                if let Ok(cg) = result {
                    self.remove_later(cg.cg);
                }
                continue;
            };
            let keep_as = Some((z.key.clone(), z.limits));
            let answer = match result {
                Ok(cg) => self.register(zygote, slot.clone(), cg, pid, pidfd, keep_as),
                Err(why) => Ok(Answer::of(FromKeeper::PlaceFailed {
                    zygote,
                    slot: slot.clone(),
                    why,
                })),
            };
            out.push(answer.unwrap_or_else(|r| {
                Answer::of(FromKeeper::PlaceFailed {
                    zygote,
                    slot,
                    why: r.to_string(),
                })
            }));
        }
        out
    }

    fn prepare_slot(
        &mut self,
        id: SlotId,
        tenant: Option<String>,
        limits: Option<LimitsMsg>,
    ) -> Result<Answer, Refusal> {
        let s = self.slots.get_mut(&id).ok_or(Refusal::UnknownSlot(id))?;
        if s.prepared {
            return Err(Refusal::Again("giving the slot to a call"));
        }
        let z = self
            .zygotes
            .get(&s.zygote)
            .ok_or(Refusal::UnknownZygote(s.zygote))?;
        let asked = limits.as_ref().map(limits_of);
        if let Some(l) = &asked {
            within(l, &z.limits)?;
        }
        // Whatever happens from here, the slot is given once.
        s.prepared = true;
        let limits = asked.unwrap_or(z.limits);
        let (zkey, zlimits) = (z.key.clone(), z.limits);
        match tenant {
            Some(t) => {
                if !proto::api::is_tenant_id(&t) {
                    return Err(Refusal::BadName {
                        what: "tenant id",
                        name: t,
                    });
                }
                if zkey.contains('/') {
                    return Err(Refusal::NotAHostFunction);
                }
                let key = calls_key(&t, &zkey);
                let dir = cg_folder(&key);
                let moved = self.move_to(id, &key, &dir, &limits)?;
                // The parked cgroup it left, empty now, is kept for the function.
                let host = self.host()?;
                host.worker.send(Job::Release {
                    pool: zkey,
                    limits: zlimits,
                    cg: moved,
                });
            }
            None if asked.is_some_and(|l| l != zlimits) => {
                let s = self.slots.get_mut(&id).ok_or(Refusal::UnknownSlot(id))?;
                s.cgroup
                    .cg
                    .set_limits(&limits)
                    .map_err(cg_err("narrow a request's limits"))?;
                s.cgroup.view.follow(&limits);
                // Narrowed: removed afterwards, never kept for another request.
                s.keep_as = None;
            }
            None => {}
        }
        let s = self.slots.get(&id).ok_or(Refusal::UnknownSlot(id))?;
        let view = s
            .cgroup
            .view
            .duplicate()
            .map_err(cg_err("hold a slot's cgroup"))?;
        Ok(Answer {
            reply: FromKeeper::Slot {
                zygote: s.zygote,
                slot: s.name.clone(),
                id,
            },
            view: Some(view),
            files: Vec::new(),
        })
    }

    /// Move a parked child into a cgroup of a tenant's for one function (`key`, folder
    /// `dir`) with `limits`: one kept from the tenant's last request of it, else a new
    /// `<dir>/r-<pid>-<slot>`. The cgroup it left, empty now, is returned. On failure a new
    /// cgroup is removed (with whatever reached it).
    fn move_to(
        &mut self,
        id: SlotId,
        key: &str,
        dir: &str,
        limits: &Limits,
    ) -> Result<Viewed, Refusal> {
        let host = self.host.as_ref().ok_or_else(no_tree)?;
        let s = self.slots.get_mut(&id).ok_or(Refusal::UnknownSlot(id))?;
        let pidfd = s.pidfd.as_ref().ok_or(Refusal::NotTheZygotes(s.pid))?;
        let cg = match host.worker.place_kept(key, limits, s.pid, pidfd) {
            Some(cg) => cg,
            None => {
                let cg = host
                    .backend
                    .create(&format!("{dir}/r-{}-{}", std::process::id(), s.name))
                    .map_err(cg_err("make a tenant's request cgroup"))?;
                cg.set_limits(limits)
                    .map_err(cg_err("write a tenant's request limits"))?;
                if !plumbing::sys::pidfd_alive(pidfd) {
                    return Err(Refusal::NotTheZygotes(s.pid));
                }
                cg.add_single_threaded(s.pid)
                    .map_err(cg_err("move a child into a tenant's cgroup"))?;
                let view = cg.view().map_err(cg_err("open a request cgroup"))?;
                Viewed {
                    cg: cg.keep(),
                    view,
                }
            }
        };
        s.keep_as = Some((key.to_string(), *limits));
        Ok(std::mem::replace(&mut s.cgroup, cg))
    }

    fn kill_slot(&mut self, id: SlotId) -> Result<Answer, Refusal> {
        let s = self.slots.get(&id).ok_or(Refusal::UnknownSlot(id))?;
        let _ = s.cgroup.cg.thaw();
        if let Err(e) = s.cgroup.cg.kill_all() {
            log::warn!("kill what a request left running: {e}");
        }
        let usage = s.cgroup.view.usage().ok().map(|u| usage_msg(&u));
        Ok(Answer::of(FromKeeper::Killed { usage }))
    }

    fn release_slot(&mut self, id: SlotId) -> Result<Answer, Refusal> {
        let s = self.slots.remove(&id).ok_or(Refusal::UnknownSlot(id))?;
        // What a request's child left running after its channel closed (a process that
        // let go of it) is killed now, before another call can be given a child of this
        // zygote, not later by the worker: that call may be another tenant's. Almost
        // always the cgroup is empty by now and this is one read.
        if !s.cgroup.view.is_empty().unwrap_or(false) {
            let _ = s.cgroup.cg.thaw();
            if let Err(e) = s.cgroup.cg.kill_all() {
                log::warn!("kill what a request left running: {e}");
            }
        }
        let host = self.host()?;
        match s.keep_as {
            Some((pool, limits)) => host.worker.send(Job::Release {
                pool,
                limits,
                cg: s.cgroup,
            }),
            None => host.worker.send(Job::Remove(s.cgroup.cg)),
        }
        Ok(Answer::of(FromKeeper::Done))
    }

    fn remove_zygote(&mut self, zygote: ZygoteId) -> Result<Answer, Refusal> {
        let z = self
            .zygotes
            .remove(&zygote)
            .ok_or(Refusal::UnknownZygote(zygote))?;
        let _ = z.cg.thaw();
        let ids: Vec<SlotId> = self
            .slots
            .iter()
            .filter(|(_, s)| s.zygote == zygote)
            .map(|(id, _)| *id)
            .collect();
        let mut slots = Vec::new();
        for id in ids {
            if let Some(s) = self.slots.remove(&id) {
                let _ = s.cgroup.cg.thaw();
                let usage = s.cgroup.view.usage().ok().map(|u| usage_msg(&u));
                let _ = s.cgroup.cg.remove();
                slots.push((id, usage));
            }
        }
        if let Err(e) = z.cg.remove() {
            log::warn!("remove a zygote's cgroup: {e}");
        }
        Ok(Answer::of(FromKeeper::Removed { slots }))
    }

    fn forget_tenant(&mut self, tenant: &str) -> Result<Answer, Refusal> {
        if !proto::api::is_tenant_id(tenant) {
            return Err(Refusal::BadName {
                what: "tenant id",
                name: tenant.to_string(),
            });
        }
        let host = self.host()?;
        // The cgroups kept for its calls of the host's functions go, then its folders.
        let top = format!("tenants/{tenant}");
        for func in host.backend.child_names_of(&top) {
            host.worker
                .forget(&format!("{tenant}/{func}"), format!("{top}/{func}"));
        }
        host.backend.prune(&top);
        Ok(Answer::of(FromKeeper::Done))
    }

    fn make_run(&mut self, tenant: Option<&str>, limits: &LimitsMsg) -> Result<Answer, Refusal> {
        if let Some(t) = tenant.filter(|t| !proto::api::is_tenant_id(t)) {
            return Err(Refusal::BadName {
                what: "tenant id",
                name: t.to_string(),
            });
        }
        let dir = run_dir(tenant);
        let name = plumbing::random_hex(6).map_err(|e| Refusal::Cgroup {
            step: "name the run's cgroup",
            source: CgroupError::Unavailable(e.to_string()),
        })?;
        let host = self.host()?;
        let cg = host
            .backend
            .create(&format!("{dir}/r-{}-{name}", std::process::id()))
            .map_err(cg_err("create the run's cgroup"))?;
        self.run_dirs.insert(dir);
        // Dropping `cg` on any error below removes it: nothing has run in it.
        cg.set_limits(&limits_of(limits))
            .map_err(cg_err("write the run's limits"))?;
        let files = cg.attach_files().map_err(cg_err("open the run's cgroup"))?;
        let run = RunId(self.issue());
        self.runs.insert(
            run,
            Run {
                cg: cg.keep(),
                init_placed: false,
            },
        );
        Ok(Answer {
            reply: FromKeeper::Run { run },
            view: None,
            files,
        })
    }

    fn place_run_init(&mut self, run: RunId, pid: i32) -> Result<Answer, Refusal> {
        let r = self.runs.get_mut(&run).ok_or(Refusal::UnknownRun(run))?;
        if r.init_placed {
            return Err(Refusal::Again("placing the run's first process"));
        }
        r.init_placed = true;
        if !plausible_pid(pid) {
            return Err(Refusal::NotTheZygotes(pid));
        }
        Ok(Answer::of(first_process(&*r.cg, pid)))
    }

    fn kill_run(&mut self, run: RunId) -> Result<Answer, Refusal> {
        let r = self.runs.get(&run).ok_or(Refusal::UnknownRun(run))?;
        r.cg.kill_all().map_err(cg_err("kill a run's cgroup"))?;
        Ok(Answer::of(FromKeeper::Done))
    }

    fn end_run(&mut self, run: RunId, kill: bool) -> Result<Answer, Refusal> {
        let cg = self.runs.remove(&run).ok_or(Refusal::UnknownRun(run))?.cg;
        if kill {
            let _ = cg.kill_all();
        }
        let usage = match cg.usage() {
            Ok(u) => Some(usage_msg(&u)),
            Err(e) => {
                log::warn!("read a run's usage: {e}");
                None
            }
        };
        self.remove_later(cg);
        Ok(Answer::of(FromKeeper::Killed { usage }))
    }

    /// Remove what supervisors that are gone (killed before they could drain) left in the
    /// tree: `tenants/<owner>/<fn>/z-<pid>-…` and `r-<pid>-…` whose process does not exist.
    /// Whatever still runs in such a cgroup is killed first. A function's folder (and a
    /// tenant's) is removed with them only when something was swept from it: an empty one
    /// may be another live supervisor's, just made and about to get its memory ceiling.
    pub fn sweep_stale(&self) {
        let Some(Host { backend, .. }) = &self.host else {
            return;
        };
        for owner in backend.child_names_of("tenants") {
            let top = format!("tenants/{owner}");
            let mut swept_under_top = false;
            for func in backend.child_names_of(&top) {
                let base = format!("{top}/{func}");
                let mut swept = false;
                for name in backend.child_names_of(&base) {
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
                    swept = true;
                    // `open` finishes a cgroup that was only partly created or removed itself.
                    if let Some(cg) = backend.open(&format!("{base}/{name}")) {
                        if let Err(e) = cg.remove() {
                            log::warn!("remove {base}/{name}: {e}");
                        }
                    }
                }
                if swept {
                    swept_under_top = true;
                    backend.prune(&base);
                }
            }
            if swept_under_top && owner != "_host" {
                backend.prune(&top);
            }
        }
    }

    /// The supervisor stops: the worker finishes what it was given (what it was still
    /// placing is removed), then the folders of the functions served (`keys`) and the
    /// tenants' folders are removed where empty.
    pub fn shutdown<'a>(&mut self, keys: impl Iterator<Item = &'a String> + Clone) {
        let Some(host) = self.host.as_mut() else {
            return;
        };
        // Runs still here were never ended: removed (the worker's queue first).
        for (_, r) in self.runs.drain() {
            host.worker.send(Job::Remove(r.cg));
        }
        host.worker.finish();
        for p in host.worker.done() {
            if let Ok(cg) = p.result {
                let _ = cg.cg.remove();
            }
        }
        let backend = &host.backend;
        // The callers' folders of runs, now that their runs' cgroups are gone.
        for dir in std::mem::take(&mut self.run_dirs) {
            backend.prune(&dir);
        }
        for key in keys.clone() {
            backend.prune(&cg_folder(key));
        }
        // Tenants' function folders, for their own functions and for their calls of the
        // host's: only those of this supervisor's functions. An empty one of another name
        // may be another live supervisor's, just made and about to get its memory ceiling.
        let ours: HashSet<String> = keys
            .flat_map(|k| match k.split_once('/') {
                Some((_, name)) => vec![name.to_string()],
                None => vec![k.clone(), format!("@{k}")],
            })
            .collect();
        for owner in backend.child_names_of("tenants") {
            let top = format!("tenants/{owner}");
            for func in backend.child_names_of(&top) {
                if ours.contains(&func) {
                    backend.prune(&format!("{top}/{func}"));
                }
            }
            // An owner's folder (and `tenants`) holds no limit of its own, so it goes when
            // empty, whoever made it: a supervisor making a cgroup in it meanwhile makes the
            // folders on its way again (`Backend::create`).
            backend.prune(&top);
        }
        backend.prune("tenants");
    }

    /// Remove Zygo's cgroup root if this supervisor leaves it empty (see
    /// `Backend::release_root`).
    pub fn release_root(&self) {
        if let Some(h) = &self.host {
            h.backend.release_root();
        }
    }
}

/// Only with the `fuzzing` feature (off in every build of zygo), for the fuzz target.
#[cfg(feature = "fuzzing")]
impl LocalKeeper {
    /// A keeper with no cgroup tree, serving: it has issued no id and holds no cgroup, so
    /// every request is checked (the table, then its names and ids) and refused, and none
    /// reaches the host. A named process is never looked at: no zygote is known.
    pub fn without_tree() -> LocalKeeper {
        LocalKeeper::with(None)
    }
}

#[cfg(test)]
impl LocalKeeper {
    /// A keeper with no cgroup tree, for unit tests: cgroups are handed to it.
    pub fn detached() -> LocalKeeper {
        LocalKeeper::with(None)
    }

    /// Limits for unit tests' zygotes.
    pub const TEST_LIMITS: Limits = Limits {
        mem_bytes: Some(256 << 20),
        cpu_millis: 1000,
        pids: 64,
        io_bps: 1 << 20,
        io_iops: 100,
    };

    /// A zygote of `key` with `limits`, in the fake cgroup `cg`.
    pub fn adopt_zygote(
        &mut self,
        key: &str,
        limits: Limits,
        cg: &crate::cgroup::fake::Fake,
    ) -> ZygoteId {
        let id = ZygoteId(self.issue());
        self.zygotes.insert(
            id,
            Zygote {
                key: key.into(),
                limits,
                cg: cg.boxed(),
                init_placed: false,
            },
        );
        id
    }

    /// A parked slot of `zygote` in the fake cgroup `cg`.
    pub fn adopt_slot(&mut self, zygote: ZygoteId, cg: &crate::cgroup::fake::Fake) -> SlotId {
        self.adopt_child(zygote, cg, 0)
    }

    /// A parked slot of `zygote` in the fake cgroup `cg`, holding `pid`.
    pub fn adopt_child(
        &mut self,
        zygote: ZygoteId,
        cg: &crate::cgroup::fake::Fake,
        pid: i32,
    ) -> SlotId {
        let id = SlotId(self.issue());
        self.slots.insert(
            id,
            Slot {
                zygote,
                name: format!("s{}", id.0),
                cgroup: Viewed::fake(cg),
                pid,
                pidfd: None,
                keep_as: None,
                prepared: false,
            },
        );
        id
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::{Fake, Op};

    const LIMITS: Limits = LocalKeeper::TEST_LIMITS;

    #[test]
    fn a_slot_is_named_only_by_the_id_the_keeper_issued() {
        let mut k = LocalKeeper::detached();
        let zcg = Fake::new();
        let z = k.adopt_zygote("hello", LIMITS, &zcg);
        let cg = Fake::new().holding(7);
        let s = k.adopt_slot(z, &cg);
        let a = k.call(ToKeeper::KillSlot { slot: SlotId(999) });
        assert!(matches!(a.reply, FromKeeper::Refused { .. }));
        assert!(cg.ops().is_empty());
        let a = k.call(ToKeeper::KillSlot { slot: s });
        assert!(
            matches!(a.reply, FromKeeper::Killed { .. }),
            "{:?}",
            a.reply
        );
        assert_eq!(cg.ops(), [Op::Thaw, Op::KillAll, Op::Usage]);
    }

    #[test]
    fn limits_are_narrowed_never_widened() {
        let mut k = LocalKeeper::detached();
        let z = k.adopt_zygote("hello", LIMITS, &Fake::new());
        let cg = Fake::new();
        let s = k.adopt_slot(z, &cg);
        for wider in [
            Limits {
                mem_bytes: Some(512 << 20),
                ..LIMITS
            },
            Limits {
                mem_bytes: None,
                ..LIMITS
            },
            Limits {
                cpu_millis: 2000,
                ..LIMITS
            },
            Limits { pids: 65, ..LIMITS },
        ] {
            let a = k.call(ToKeeper::PrepareSlot {
                slot: s,
                tenant: None,
                limits: Some(limits_msg(&wider)),
            });
            assert!(
                matches!(&a.reply, FromKeeper::Refused { why } if why.contains("above")),
                "{:?}",
                a.reply
            );
        }
        assert!(cg.ops().is_empty());
        let narrower = Limits {
            cpu_millis: 500,
            ..LIMITS
        };
        let a = k.call(ToKeeper::PrepareSlot {
            slot: s,
            tenant: None,
            limits: Some(limits_msg(&narrower)),
        });
        assert!(matches!(a.reply, FromKeeper::Slot { id, .. } if id == s));
        assert!(a.view.is_some());
        assert_eq!(cg.ops(), [Op::SetLimits(narrower)]);
    }

    #[test]
    fn names_that_could_make_another_path_are_refused() {
        let mut k = LocalKeeper::detached();
        let z = k.adopt_zygote("hello", LIMITS, &Fake::new());
        for slot in ["../x", "a/b", "", "s 1"] {
            let a = k.call(ToKeeper::PlaceSpare {
                zygote: z,
                slot: slot.into(),
                pid: 1,
            });
            assert!(matches!(a.reply, FromKeeper::Refused { .. }), "{slot:?}");
        }
        let s = k.adopt_slot(z, &Fake::new());
        for tenant in ["../etc", "a/b", "Acme"] {
            let a = k.call(ToKeeper::PrepareSlot {
                slot: s,
                tenant: Some(tenant.into()),
                limits: None,
            });
            assert!(matches!(a.reply, FromKeeper::Refused { .. }), "{tenant:?}");
        }
        for name in ["../x", "a/b", ""] {
            let a = k.call(ToKeeper::MakeZygote {
                function: FnKey {
                    tenant: None,
                    name: name.into(),
                },
            });
            assert!(matches!(a.reply, FromKeeper::Refused { .. }), "{name:?}");
        }
    }

    #[test]
    fn a_process_that_is_not_the_zygotes_is_not_placed() {
        let mut k = LocalKeeper::detached();
        let z = k.adopt_zygote("hello", LIMITS, &Fake::new().holding(5));
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        let a = k.call(ToKeeper::PlaceSpare {
            zygote: z,
            slot: "s1".into(),
            pid: me,
        });
        assert!(
            matches!(&a.reply, FromKeeper::Refused { why } if why.contains("not in its zygote")),
            "{:?}",
            a.reply
        );
    }

    #[test]
    fn a_removed_zygote_takes_its_slots_and_says_what_they_counted() {
        let mut k = LocalKeeper::detached();
        let zcg = Fake::new();
        let z = k.adopt_zygote("hello", LIMITS, &zcg);
        let cg = Fake::new();
        let s = k.adopt_slot(z, &cg);
        let a = k.call(ToKeeper::RemoveZygote { zygote: z });
        assert!(
            matches!(&a.reply, FromKeeper::Removed { slots } if slots.len() == 1 && slots[0].0 == s)
        );
        assert!(cg.ops().contains(&Op::Remove));
        assert!(zcg.ops().contains(&Op::Remove));
        let a = k.call(ToKeeper::KillSlot { slot: s });
        assert!(matches!(a.reply, FromKeeper::Refused { .. }));
    }

    #[test]
    fn a_first_process_is_checked_once_never_moved_and_never_init_or_the_keeper() {
        let mut k = LocalKeeper::detached();
        let zcg = Fake::new();
        let z = k.adopt_zygote("hello", LIMITS, &zcg);
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        for pid in [1, 0, -1, me] {
            let mut k = LocalKeeper::detached();
            let z = k.adopt_zygote("hello", LIMITS, &zcg);
            let a = k.call(ToKeeper::PlaceInit { zygote: z, pid });
            assert!(matches!(a.reply, FromKeeper::Refused { .. }), "{pid}");
        }
        // One that is not in the cgroup is never moved there.
        // SAFETY: getppid cannot fail.
        let parent = unsafe { libc::getppid() };
        let a = k.call(ToKeeper::PlaceInit {
            zygote: z,
            pid: parent,
        });
        assert!(
            matches!(&a.reply, FromKeeper::Refused { why } if why.contains("not in")),
            "{:?}",
            a.reply
        );
        assert!(zcg.ops().is_empty());
        let inside = Fake::new().holding(parent);
        let z = k.adopt_zygote("hello", LIMITS, &inside);
        let a = k.call(ToKeeper::PlaceInit {
            zygote: z,
            pid: parent,
        });
        assert_eq!(a.reply, FromKeeper::Done);
        let a = k.call(ToKeeper::PlaceInit {
            zygote: z,
            pid: parent,
        });
        assert!(
            matches!(&a.reply, FromKeeper::Refused { why } if why.contains("already")),
            "{:?}",
            a.reply
        );
        assert!(inside.ops().is_empty());
    }

    #[test]
    fn a_slot_is_given_to_a_call_once_and_keeps_its_io_rates() {
        let mut k = LocalKeeper::detached();
        let z = k.adopt_zygote("hello", LIMITS, &Fake::new());
        let cg = Fake::new();
        let s = k.adopt_slot(z, &cg);
        let no_throttle = Limits {
            io_bps: 0,
            ..LIMITS
        };
        let a = k.call(ToKeeper::PrepareSlot {
            slot: s,
            tenant: None,
            limits: Some(limits_msg(&no_throttle)),
        });
        assert!(matches!(&a.reply, FromKeeper::Refused { why } if why.contains("I/O")));
        let s = k.adopt_slot(z, &cg);
        let narrower = Limits { pids: 8, ..LIMITS };
        let once = k.call(ToKeeper::PrepareSlot {
            slot: s,
            tenant: None,
            limits: Some(limits_msg(&narrower)),
        });
        assert!(matches!(once.reply, FromKeeper::Slot { .. }));
        let again = k.call(ToKeeper::PrepareSlot {
            slot: s,
            tenant: None,
            limits: Some(limits_msg(&LIMITS)),
        });
        assert!(matches!(&again.reply, FromKeeper::Refused { why } if why.contains("already")));
        assert_eq!(cg.ops(), [Op::SetLimits(narrower)]);
    }

    #[test]
    fn a_zygote_is_made_only_for_a_function_served_and_a_child_placed_once() {
        let mut k = LocalKeeper::detached();
        let a = k.call(ToKeeper::MakeZygote {
            function: fn_key("hello"),
        });
        assert!(
            matches!(&a.reply, FromKeeper::Refused { why } if why.contains("not served")),
            "{:?}",
            a.reply
        );
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        let z = k.adopt_zygote("hello", LIMITS, &Fake::new().holding(me));
        k.adopt_child(z, &Fake::new(), me);
        let a = k.call(ToKeeper::PlaceSpare {
            zygote: z,
            slot: "s2".into(),
            pid: me,
        });
        assert!(
            matches!(&a.reply, FromKeeper::Refused { why } if why.contains("not in its zygote"))
        );
    }

    #[test]
    fn a_tenants_calls_of_a_host_function_have_a_folder_no_function_has() {
        assert_eq!(cg_folder("hello"), "tenants/_host/hello");
        assert_eq!(cg_folder("acme/hello"), "tenants/acme/hello");
        assert_eq!(
            cg_folder(&calls_key("acme", "hello")),
            "tenants/acme/@hello"
        );
        assert!(policy::file::check_fn_name("@hello", None).is_err());
    }

    #[test]
    fn runs_go_in_their_callers_folder() {
        assert_eq!(run_dir(None), "tenants/_host/_run");
        assert_eq!(run_dir(Some("acme")), "tenants/acme/_run");
        let mut k = LocalKeeper::detached();
        let a = k.call(ToKeeper::MakeRun {
            tenant: Some("../x".into()),
            limits: limits_msg(&LIMITS),
        });
        assert!(matches!(&a.reply, FromKeeper::Refused { why } if why.contains("tenant id")));
    }

    #[test]
    fn no_function_is_served_while_draining() {
        let mut k = LocalKeeper::detached();
        k.begin_drain();
        let a = k.call(ToKeeper::ServeFunction {
            function: fn_key("hello"),
            limits: limits_msg(&LIMITS),
            ceiling: None,
        });
        assert!(
            matches!(&a.reply, FromKeeper::Refused { why } if why.contains("not allowed")),
            "{:?}",
            a.reply
        );
    }
}
