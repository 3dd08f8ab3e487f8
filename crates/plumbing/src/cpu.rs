//! Where a process Zygo starts first runs.
//!
//! A new process goes to the least busy CPU, which is usually an idle one. Waking an idle
//! CPU costs far more than the child's first steps when the parent is about to wait for
//! it anyway (a spawn waits for the child's exec; a launcher and its sandbox's init take
//! turns): in a virtual machine an idle vCPU may take milliseconds to be scheduled again.
//! So the parent narrows its own affinity to the CPU it runs on for the fork, the child
//! starts there, and each gives its affinity back at once: the child before it runs
//! anything of its own (the program inherits the affinity it would have had), the parent
//! right after the fork.
//!
//! Giving it back must not freeze it. Once a thread has set its affinity, the kernel keeps
//! that request and intersects every later cpuset change with it, so writing back the
//! saved set would stop a thread that never asked for a restriction from following its
//! cpuset (a CPU brought online, a cpuset widened). So the restore asks for every CPU,
//! which the kernel narrows to the cpuset, and writes the saved set only if that gives a
//! different one: the thread had a restriction of its own (`taskset`), which it keeps.

use std::mem::size_of;

const SIZE: usize = size_of::<libc::cpu_set_t>();

/// A thread's affinity before [`pin_here`] narrowed it to one CPU.
pub struct Pinned {
    saved: libc::cpu_set_t,
}

/// Every CPU: the request the kernel narrows to the cpuset, and keeps following it.
fn every_cpu() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut all: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: `cpu` is within the set's bounds.
        unsafe { libc::CPU_SET(cpu, &mut all) };
    }
    all
}

/// Narrow the calling thread's affinity to the CPU it is running on, so that a child it
/// forks starts there. `None` (nothing changed) when it is already limited to one CPU or
/// the kernel refuses.
pub fn pin_here() -> Option<Pinned> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut saved: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `saved` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, SIZE, &mut saved) } != 0 {
        return None;
    }
    // SAFETY: plain query of the calling thread's CPU.
    let here = unsafe { libc::sched_getcpu() };
    // SAFETY: `saved` is a valid cpu_set_t.
    let many = unsafe { libc::CPU_COUNT(&saved) } > 1;
    if !many || here < 0 || here as usize >= libc::CPU_SETSIZE as usize {
        return None;
    }
    // SAFETY: as above.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `here` is within the set's bounds (checked above).
    unsafe { libc::CPU_SET(here as usize, &mut one) };
    // SAFETY: `one` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, SIZE, &one) } != 0 {
        return None;
    }
    Some(Pinned { saved })
}

impl Pinned {
    /// Give the calling thread back the affinity it had: every CPU the cpuset allows when
    /// that is the set it had, else the saved set (see the module's comment). Only system
    /// calls on this value, no allocation: safe in a child that shares its parent's memory.
    pub fn restore(&self) {
        // SAFETY: a valid cpu_set_t of the size passed.
        if unsafe { libc::sched_setaffinity(0, SIZE, &every_cpu()) } == 0 {
            // SAFETY: as in pin_here.
            let mut now: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: `now` is a valid cpu_set_t of the size passed.
            let read = unsafe { libc::sched_getaffinity(0, SIZE, &mut now) } == 0;
            // SAFETY: both are valid cpu_set_t values.
            if read && unsafe { libc::CPU_EQUAL(&now, &self.saved) } {
                return;
            }
        }
        // SAFETY: `saved` is a valid cpu_set_t of the size passed. Should the cpuset no
        // longer allow it, the request for every CPU above stands.
        unsafe { libc::sched_setaffinity(0, SIZE, &self.saved) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity() -> Vec<usize> {
        // SAFETY: as in pin_here.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid cpu_set_t of the size passed.
        let r = unsafe { libc::sched_getaffinity(0, SIZE, &mut set) };
        assert_eq!(r, 0, "sched_getaffinity");
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: every index is within the set's bounds.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    #[test]
    fn pinning_narrows_to_one_cpu_and_restoring_gives_the_set_back() {
        // Threads of their own: the test harness's threads keep their affinity.
        std::thread::spawn(|| {
            let before = affinity();
            match pin_here() {
                None => assert_eq!(before.len(), 1, "pin_here refused with several CPUs"),
                Some(p) => {
                    let during = affinity();
                    assert_eq!(during.len(), 1);
                    assert!(before.contains(&during[0]));
                    p.restore();
                    assert_eq!(affinity(), before);
                }
            }
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn a_restriction_of_the_threads_own_is_kept() {
        std::thread::spawn(|| {
            let all = affinity();
            // What pin_here saves for a thread that had narrowed itself to one CPU of
            // several: asking for every CPU gives more, so the saved set is written back.
            let first = all[0];
            let mut p = Pinned {
                // SAFETY: as in pin_here.
                saved: unsafe { std::mem::zeroed() },
            };
            // SAFETY: `first` is within the set's bounds.
            unsafe { libc::CPU_SET(first, &mut p.saved) };
            p.restore();
            assert_eq!(affinity(), vec![first]);
        })
        .join()
        .expect("thread");
    }
}
