//! A cgroup that exists only in memory, for unit tests. What the kernel would count for it
//! (the OOM-kill counter of `memory.events`, the memory peak, CPU time) is scripted by the
//! test, and every call made on it is recorded, so a test can check what the supervisor
//! read and did to a request's cgroup, and in which order, without root or a hierarchy.
//!
//! Clones share one state: a test keeps one [`Fake`] to script and inspect, and hands the
//! code under test a [`Fake::boxed`] copy.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Cgroup, CgroupError, CgroupView, Limits, Usage, Weight};

/// One call made on a [`Fake`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    SetLimits(Limits),
    AddPid(i32),
    Usage,
    Freeze,
    Thaw,
    KillAll,
    Remove,
    SetWeight(Weight),
    LiftCpuQuota,
}

#[derive(Default)]
struct State {
    /// What `usage` answers, in turn; the last one again once the others were read.
    readings: VecDeque<Usage>,
    /// `usage` fails (as reading `memory.events` would if the cgroup was gone).
    unreadable: bool,
    /// The processes in it.
    pids: Vec<i32>,
    ops: Vec<Op>,
}

#[derive(Clone, Default)]
pub struct Fake(Arc<Mutex<State>>);

impl Fake {
    /// An empty cgroup whose usage reads as all zeros.
    pub fn new() -> Fake {
        Fake::default()
    }

    /// Its next reading is `u` (readings are given in the order they were scripted).
    pub fn reads(self, u: Usage) -> Fake {
        self.state().readings.push_back(u);
        self
    }

    /// Its next reading counts `n` OOM kills and nothing else.
    pub fn oom_killed(self, n: u64) -> Fake {
        self.reads(Usage {
            oom_kills: n,
            ..Usage::default()
        })
    }

    /// Its usage cannot be read.
    pub fn unreadable(self) -> Fake {
        self.state().unreadable = true;
        self
    }

    /// It holds process `pid`.
    pub fn holding(self, pid: i32) -> Fake {
        self.state().pids.push(pid);
        self
    }

    /// A handle for the code under test, sharing this one's state.
    pub fn boxed(&self) -> Box<dyn Cgroup> {
        Box::new(self.clone())
    }

    /// The calls made on it so far, in order.
    pub fn ops(&self) -> Vec<Op> {
        self.state().ops.clone()
    }

    /// The processes in it now.
    pub fn pids(&self) -> Vec<i32> {
        self.state().pids.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, op: Op) {
        self.state().ops.push(op);
    }
}

impl Cgroup for Fake {
    fn describe(&self) -> String {
        "a fake cgroup".into()
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        self.record(Op::SetLimits(*limits));
        Ok(())
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        self.record(Op::AddPid(pid));
        self.state().pids.push(pid);
        Ok(())
    }

    fn attach_files(&self) -> Result<Vec<std::os::fd::OwnedFd>, CgroupError> {
        Ok(Vec::new())
    }

    fn contains(&self, pid: i32) -> Result<bool, CgroupError> {
        Ok(self.state().pids.contains(&pid))
    }

    fn usage(&self) -> Result<Usage, CgroupError> {
        self.record(Op::Usage);
        let mut s = self.state();
        if s.unreadable {
            return Err(CgroupError::Io {
                what: "read".into(),
                path: "memory.events".into(),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            });
        }
        if s.readings.len() > 1 {
            return Ok(s.readings.pop_front().unwrap_or_default());
        }
        Ok(s.readings.front().copied().unwrap_or_default())
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        self.record(Op::Freeze);
        Ok(())
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        self.record(Op::Thaw);
        Ok(())
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        self.record(Op::KillAll);
        self.state().pids.clear();
        Ok(())
    }

    fn lift_cpu_quota(&self) -> Result<(), CgroupError> {
        self.record(Op::LiftCpuQuota);
        Ok(())
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(self.state().pids.is_empty())
    }

    fn remove(self: Box<Self>) -> Result<(), CgroupError> {
        self.record(Op::Remove);
        self.state().pids.clear();
        Ok(())
    }

    fn set_weight(&self, w: Weight) -> Result<(), CgroupError> {
        self.record(Op::SetWeight(w));
        Ok(())
    }

    fn view(&self) -> Result<Box<dyn CgroupView>, CgroupError> {
        Ok(Box::new(self.clone()))
    }
}

/// A fake's view shares its state: what is done through it is recorded with the rest.
impl CgroupView for Fake {
    fn describe(&self) -> String {
        Cgroup::describe(self)
    }

    fn usage(&self) -> Result<Usage, CgroupError> {
        Cgroup::usage(self)
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        Cgroup::freeze(self)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        Cgroup::thaw(self)
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Cgroup::is_empty(self)
    }

    fn set_weight(&self, w: Weight) -> Result<(), CgroupError> {
        Cgroup::set_weight(self, w)
    }

    fn follow(&self, _limits: &Limits) {}

    fn duplicate(&self) -> Result<Box<dyn CgroupView>, CgroupError> {
        Ok(Box::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_come_in_the_order_scripted_and_the_last_one_stays() {
        let fake = Fake::new().oom_killed(0).oom_killed(1);
        let cg = fake.boxed();
        assert_eq!(cg.usage().map(|u| u.oom_kills).ok(), Some(0));
        assert_eq!(cg.usage().map(|u| u.oom_kills).ok(), Some(1));
        assert_eq!(cg.usage().map(|u| u.oom_kills).ok(), Some(1));
        assert!(Fake::new().unreadable().boxed().usage().is_err());
    }

    #[test]
    fn every_call_is_recorded_and_a_kill_empties_it() {
        let fake = Fake::new().holding(7);
        let cg = fake.boxed();
        assert_eq!(cg.contains(7).ok(), Some(true));
        let _ = cg.freeze();
        let _ = cg.thaw();
        let _ = cg.kill_all();
        assert_eq!(cg.is_empty().ok(), Some(true));
        let _ = cg.add_pid(8);
        let _ = cg.set_weight(Weight::Background);
        let _ = cg.remove();
        assert_eq!(
            fake.ops(),
            [
                Op::Freeze,
                Op::Thaw,
                Op::KillAll,
                Op::AddPid(8),
                Op::SetWeight(Weight::Background),
                Op::Remove
            ]
        );
        assert!(fake.pids().is_empty());
    }
}
