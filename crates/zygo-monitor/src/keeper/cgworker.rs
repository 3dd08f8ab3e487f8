//! Cgroup work that can stall (a v1 migration may wait out an RCU grace period; an rmdir
//! waits for the memory controller) runs on one worker thread, off the event loop, so a
//! call that arrives meanwhile is never queued behind it. The loop hands out jobs and takes
//! results back when the worker wakes it.
//!
//! The usual placement is not such work: a parked child (single-threaded, so its move does
//! not wait on the global threadgroup lock) goes into a request cgroup kept from an
//! earlier request, a handful of short writes. The loop does that itself
//! ([`Worker::place_kept`]), sparing a round trip through the worker per request; only
//! making a new cgroup is left to the worker.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use mio::Waker;
use proto::keeper::ZygoteId;

use crate::cgroup::{Backend, Cgroup, CgroupView, Limits, Weight};

/// The worker thread's nice value.
const WORKER_NICE: libc::c_int = 10;

pub enum Job {
    /// Move the (single-threaded) parked child `pid` into a cgroup with `limits`: one kept
    /// from an earlier request of `pool` (the function) if there is one, else `rel`, new.
    Place {
        zygote: ZygoteId,
        slot: String,
        pid: i32,
        /// The same process, checked alive through it just before the move.
        pidfd: std::os::fd::OwnedFd,
        pool: String,
        rel: String,
        limits: Limits,
    },
    /// A finished request's cgroup: what is left in it is killed, then it is kept for the
    /// next request of `pool` if it can be made as good as new, else removed.
    Release {
        pool: String,
        limits: Limits,
        cg: Viewed,
    },
    /// Kill what is left in a cgroup and remove it.
    Remove(Box<dyn Cgroup>),
    /// `pool` is served no more: remove the cgroups kept for it, then its folder (sent by
    /// [`Worker::forget`]).
    Forget { pool: String },
}

/// How many emptied cgroups are kept for each function.
const KEEP: usize = 8;

/// An emptied request cgroup and the limits written in it.
type Ready = (Limits, Viewed);

/// A request cgroup with its view, made together. A call's cgroup is frozen, thawed,
/// weighed and read through the view alone; the cgroup itself serves what needs
/// privilege (limits, moving a process in, killing, removing). A kept cgroup keeps its
/// view: the view's descriptors stay good for the cgroup's life.
pub struct Viewed {
    pub cg: Box<dyn Cgroup>,
    pub view: Box<dyn CgroupView>,
}

#[cfg(test)]
impl Viewed {
    /// A fake cgroup and its view, both recording into `fake`.
    pub fn fake(fake: &crate::cgroup::fake::Fake) -> Viewed {
        Viewed {
            cg: fake.boxed(),
            view: Box::new(fake.clone()),
        }
    }
}

/// Emptied request cgroups, by function; and the folders of functions no longer served,
/// by function, which the worker removes once the last cgroup in them is gone (a request
/// cgroup being placed when its function was stopped comes back after the function's
/// folder was first pruned).
#[derive(Default)]
struct Kept {
    cgroups: HashMap<String, Vec<Ready>>,
    forgotten: HashMap<String, String>,
}

impl Kept {
    fn take(&mut self, pool: &str, limits: &Limits) -> Option<Viewed> {
        let v = self.cgroups.get_mut(pool)?;
        let i = v.iter().position(|(l, _)| l == limits)?;
        Some(v.swap_remove(i).1)
    }

    fn has_room(&self, pool: &str) -> bool {
        !self.forgotten.contains_key(pool) && self.cgroups.get(pool).map_or(0, Vec::len) < KEEP
    }

    fn keep(&mut self, pool: String, limits: Limits, cg: Viewed) {
        self.cgroups.entry(pool).or_default().push((limits, cg));
    }

    /// Remove the folders of functions no longer served that are empty now.
    fn prune_forgotten(&mut self, backend: &Backend) {
        self.forgotten.retain(|_, dir| !backend.prune(dir));
    }
}

fn remove(cg: Box<dyn Cgroup>) {
    if let Err(e) = cg.remove() {
        log::warn!("remove a request cgroup: {e}");
    }
}

pub struct Placed {
    pub zygote: ZygoteId,
    pub slot: String,
    pub result: Result<Viewed, String>,
    /// The child, and the pidfd that holds it (to move it again for a tenant's request).
    pub pid: i32,
    pub pidfd: OwnedFd,
}

/// The kept cgroups, shared by the loop (which takes them) and the worker (which empties
/// and keeps them). A lock poisoned by a panic still guards a valid list.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Kept>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A finished request's cgroup: kept for the next request of `pool` if it can be made
    /// as good as new and there is room, else removed. The emptying (file work) is done
    /// without the lock.
    fn release(&self, pool: String, limits: Limits, cg: Viewed) {
        if self.lock().has_room(&pool) {
            match cg.cg.recycle() {
                Ok(true) => {
                    self.lock().keep(pool, limits, cg);
                    return;
                }
                Ok(false) => {}
                Err(e) => log::warn!("reuse a request cgroup: {e}"),
            }
        }
        remove(cg.cg);
    }
}

/// Put a parked child (single-threaded) in a new cgroup `rel` with `limits`, at background
/// weight. If any step fails (the child may have exited already), the new cgroup is
/// removed: it is handed on only with the child in it.
fn place_new(
    backend: &Backend,
    rel: &str,
    limits: &Limits,
    pid: i32,
    pidfd: &OwnedFd,
) -> Result<Viewed, String> {
    let cg = backend.create(rel).map_err(|e| e.to_string())?;
    cg.set_limits(limits)
        .and_then(|()| cg.set_weight(Weight::Background))
        .map_err(|e| e.to_string())?;
    if !plumbing::sys::pidfd_alive(pidfd) {
        return Err(format!("process {pid} exited before it was placed"));
    }
    cg.add_single_threaded(pid).map_err(|e| e.to_string())?;
    let view = cg.view().map_err(|e| e.to_string())?;
    Ok(Viewed {
        cg: cg.keep(),
        view,
    })
}

/// Put a parked child (single-threaded, held by `pidfd`) in a kept cgroup, at background
/// weight. On failure the cgroup comes back, to be removed: a new one is needed.
fn reuse(cg: Viewed, pid: i32, pidfd: &OwnedFd) -> Result<Viewed, Box<dyn Cgroup>> {
    if !plumbing::sys::pidfd_alive(pidfd) {
        return Err(cg.cg);
    }
    match cg
        .view
        .set_weight(Weight::Background)
        .and_then(|_| cg.cg.add_single_threaded(pid))
    {
        Ok(()) => Ok(cg),
        Err(e) => {
            log::warn!("reuse a request cgroup: {e}");
            Err(cg.cg)
        }
    }
}

pub struct Worker {
    tx: Option<Sender<Job>>,
    rx: Receiver<Placed>,
    handle: Option<JoinHandle<()>>,
    kept: Shared,
}

impl Worker {
    pub fn start(backend: Arc<Backend>, waker: Arc<Waker>) -> std::io::Result<Worker> {
        let (tx, jobs) = channel::<Job>();
        let (done, rx) = channel::<Placed>();
        let shared = Shared::default();
        let kept = shared.clone();
        let handle = std::thread::Builder::new()
            .name("cgroups".into())
            .spawn(move || {
                // Below the event loop and the requests it serves: this thread's work is
                // never on a caller's path, and on a small machine it would compete with
                // one for a CPU. (setpriority on a thread id sets that thread alone.)
                // SAFETY: gettid and setpriority on this thread; failure leaves it as is.
                unsafe {
                    let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                    libc::setpriority(libc::PRIO_PROCESS, tid, WORKER_NICE);
                }
                for job in jobs {
                    match job {
                        Job::Place {
                            zygote,
                            slot,
                            pid,
                            pidfd,
                            pool,
                            rel,
                            limits,
                        } => {
                            // A parked child works in the background until it is given
                            // a request (see `Weight`).
                            let kept_one = kept.lock().take(&pool, &limits);
                            let reused =
                                kept_one.and_then(|cg| reuse(cg, pid, &pidfd).map_err(remove).ok());
                            let result = match reused {
                                Some(cg) => Ok(cg),
                                None => place_new(&backend, &rel, &limits, pid, &pidfd),
                            };
                            let placed = Placed {
                                zygote,
                                slot,
                                result,
                                pid,
                                pidfd,
                            };
                            if done.send(placed).is_err() {
                                break;
                            }
                            let _ = waker.wake();
                        }
                        Job::Release { pool, limits, cg } => {
                            kept.release(pool, limits, cg);
                            kept.lock().prune_forgotten(&backend);
                        }
                        Job::Remove(cg) => {
                            remove(cg);
                            kept.lock().prune_forgotten(&backend);
                        }
                        Job::Forget { pool } => {
                            let gone = kept.lock().cgroups.remove(&pool).unwrap_or_default();
                            for (_, cg) in gone {
                                remove(cg.cg);
                            }
                            kept.lock().prune_forgotten(&backend);
                        }
                    }
                }
                let all: Vec<Ready> = kept.lock().cgroups.drain().flat_map(|(_, v)| v).collect();
                for (_, cg) in all {
                    remove(cg.cg);
                }
            })?;
        Ok(Worker {
            tx: Some(tx),
            rx,
            handle: Some(handle),
            kept: shared,
        })
    }

    /// Put the parked child `pid` in a cgroup kept for `pool` with these `limits`, here and
    /// now; `None` when there is none (or it could not be reused, and goes to the worker to
    /// be removed): send [`Job::Place`].
    pub fn place_kept(
        &self,
        pool: &str,
        limits: &Limits,
        pid: i32,
        pidfd: &OwnedFd,
    ) -> Option<Viewed> {
        let cg = self.kept.lock().take(pool, limits)?;
        reuse(cg, pid, pidfd)
            .map_err(|cg| self.send(Job::Remove(cg)))
            .ok()
    }

    /// `pool` is served no more: its kept cgroups are removed, and its folder `dir` as soon
    /// as it is empty (here, or after the last cgroup in it is removed).
    pub fn forget(&self, pool: &str, dir: String) {
        self.kept.lock().forgotten.insert(pool.to_string(), dir);
        self.send(Job::Forget {
            pool: pool.to_string(),
        });
    }

    /// `pool` is served (again): its folder is not to be removed. Call before making the
    /// folder, so that the worker cannot remove it after it was made.
    pub fn remember(&self, pool: &str) {
        self.kept.lock().forgotten.remove(pool);
    }

    pub fn send(&self, job: Job) {
        let job = match &self.tx {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(job)) => job,
            },
            None => job,
        };
        // The worker is gone (after shutdown began): a removal is done here; a placement
        // is moot, its zygote is being killed; what was kept went with the worker.
        match job {
            Job::Remove(cg) => remove(cg),
            Job::Release { cg, .. } => remove(cg.cg),
            Job::Place { .. } | Job::Forget { .. } => {}
        }
    }

    /// Results that have come back.
    pub fn done(&self) -> Vec<Placed> {
        self.rx.try_iter().collect()
    }

    /// Let the worker finish what it was given, and wait for it.
    pub fn finish(&mut self) {
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
