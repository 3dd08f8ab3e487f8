//! The monitor: the privileged side of Zygo and the only process that decides.
//!
//! It owns the cgroup tree, every sandbox's lifecycle and deadline, and the identity a
//! sandbox runs as. It trusts the `policy` crate's verdicts and nothing it reads from a
//! launcher or a front: every message is checked against what the monitor itself granted.
//! One-shot commands (`zygo run`) embed it; the supervisor runs it as a daemon. In the
//! supervisor, what needs privilege for the functions it serves sits behind the
//! [`keeper`]'s request table.

/// The cgroup backends (their own crate, `zygo-cgroup`), under the name the monitor has
/// always used.
pub use zygo_cgroup as cgroup;

/// The cgroup limits of a policy decision.
pub fn cgroup_limits(l: &policy::limits::ResolvedLimits) -> cgroup::Limits {
    cgroup::Limits {
        mem_bytes: match l.mem {
            policy::limits::Mem::Limited(b) => Some(b.0),
            policy::limits::Mem::Unlimited => None,
        },
        cpu_millis: l.cpu.millis(),
        pids: l.pids,
        io_bps: l.io_bps.0,
        io_iops: l.io_iops,
    }
}
pub mod deps;
pub mod etc_cache;
pub mod identity;
pub mod keeper;
pub mod mcp;
pub mod mounts;
pub mod notify;
pub mod oneshot;
pub mod shape;
pub mod spawn;
pub mod supervisor;
pub mod tree;

#[cfg(test)]
mod tests {
    /// `policy` imports nothing of ours, so the longest duration is written twice: what
    /// limits accept, and what the channel's side waits for.
    #[test]
    fn policy_and_proto_agree_on_the_longest_duration() {
        assert_eq!(policy::limits::MAX_DURATION, proto::front::MAX_DURATION);
    }
}
