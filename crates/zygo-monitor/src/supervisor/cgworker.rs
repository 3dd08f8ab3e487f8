//! Cgroup work that can stall (a v1 migration may wait out an RCU grace period; an rmdir
//! waits for the memory controller) runs on one worker thread, off the event loop, so a
//! call that arrives meanwhile is never queued behind it. The loop hands out jobs and takes
//! results back when the worker wakes it.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::{Token, Waker};

use crate::cgroup::{Backend, Cgroup, Limits};

pub enum Job {
    /// Create `rel` with `limits` and move the (single-threaded) parked child `pid` in.
    Place {
        zt: Token,
        slot: String,
        pid: i32,
        rel: String,
        limits: Limits,
    },
    /// Kill what is left in a finished request's cgroup and remove it.
    Remove(Box<dyn Cgroup>),
}

pub struct Placed {
    pub zt: Token,
    pub slot: String,
    pub pid: i32,
    pub result: Result<Box<dyn Cgroup>, String>,
}

pub struct Worker {
    tx: Option<Sender<Job>>,
    rx: Receiver<Placed>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    pub fn start(backend: Arc<Backend>, waker: Arc<Waker>) -> std::io::Result<Worker> {
        let (tx, jobs) = channel::<Job>();
        let (done, rx) = channel::<Placed>();
        let handle = std::thread::Builder::new()
            .name("cgroups".into())
            .spawn(move || {
                for job in jobs {
                    match job {
                        Job::Place {
                            zt,
                            slot,
                            pid,
                            rel,
                            limits,
                        } => {
                            let result = backend
                                .create(&rel)
                                .and_then(|cg| cg.set_limits(&limits).map(|_| cg))
                                .and_then(|cg| cg.add_single_threaded(pid).map(|_| cg))
                                .map_err(|e| e.to_string());
                            if done
                                .send(Placed {
                                    zt,
                                    slot,
                                    pid,
                                    result,
                                })
                                .is_err()
                            {
                                return;
                            }
                            let _ = waker.wake();
                        }
                        Job::Remove(cg) => {
                            if let Err(e) = cg.remove() {
                                log::warn!("remove a request cgroup: {e}");
                            }
                        }
                    }
                }
            })?;
        Ok(Worker {
            tx: Some(tx),
            rx,
            handle: Some(handle),
        })
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
        // is moot, its zygote is being killed.
        if let Job::Remove(cg) = job {
            if let Err(e) = cg.remove() {
                log::warn!("remove a request cgroup: {e}");
            }
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
