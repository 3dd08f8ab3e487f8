//! runtime ⇄ keeper: what the process that schedules calls asks of the one that holds
//! privilege, in fixed shapes.
//!
//! The runtime names nothing on the host. It never sends a path: cgroups are named by ids
//! the keeper issued ([`ZygoteId`], [`SlotId`]) and by names the keeper checks
//! ([`FnKey`], a tenant id, a slot name), from which the keeper builds every path itself.
//! A zygote's limits are those its function was served with, and a request's are only ever
//! narrowed from them (the operator's ceilings over what a function is served with are not
//! the keeper's yet). What a request may be sent in which phase is the keeper's table
//! (`zygo_monitor::keeper::table`); what may be done once per zygote, slot or run, the
//! keeper's records.
//!
//! Descriptors travel beside a message, never inside it: a cgroup's view (see
//! `zygo_cgroup::CgroupView`) with [`FromKeeper::Zygote`] and [`FromKeeper::Slot`], a
//! zygote's attach files with [`FromKeeper::Zygote`].

use serde::{Deserialize, Serialize};

/// Cap for frames on the keeper's channel: every message is small and fixed-shape.
pub const MAX_KEEPER_FRAME: usize = 64 * 1024;

/// The longest slot name a runtime may choose (it is part of a cgroup's name).
pub const MAX_SLOT_NAME: usize = 32;

/// A zygote's cgroup, as the keeper issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ZygoteId(pub u64);

/// A request cgroup (a slot: one child of a zygote), as the keeper issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlotId(pub u64);

/// A one-shot run's cgroup (`POST /run`), as the keeper issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId(pub u64);

/// A function or pool: the host's (`tenant` None) or a tenant's. The keeper checks both
/// names before it makes a path of them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FnKey {
    pub tenant: Option<String>,
    pub name: String,
}

/// A cgroup's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsMsg {
    /// `None`: no memory limit (only the operator's own functions may have none).
    pub mem_bytes: Option<u64>,
    /// Thousandths of a CPU.
    pub cpu_millis: u32,
    pub pids: u32,
    pub io_bps: u64,
    pub io_iops: u32,
}

/// What a cgroup counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageMsg {
    pub oom_kills: u64,
    pub peak_bytes: u64,
    pub cpu_usec: u64,
}

/// A request to the keeper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToKeeper {
    /// A function is served with these limits: its folder, with this memory ceiling over
    /// all its sandboxes. Its zygotes are made with these limits, and its requests'
    /// cgroups narrowed from them.
    ServeFunction {
        function: FnKey,
        limits: LimitsMsg,
        ceiling: Option<u64>,
    },
    /// A function is served no more: its kept cgroups, then its folder, are removed.
    StopFunction { function: FnKey },
    /// A new zygote's cgroup in the (served) function's folder, with the function's
    /// limits, at background weight. Answered with [`FromKeeper::Zygote`].
    MakeZygote { function: FnKey },
    /// The zygote's first process (its launcher cloned it as `pid`, and it joined its
    /// cgroup through the attach files): checked to be in the zygote's cgroup, never moved
    /// there. Once per zygote. Answered [`FromKeeper::Done`], [`FromKeeper::Gone`] or refused.
    PlaceInit { zygote: ZygoteId, pid: i32 },
    /// A child of the zygote parked itself as `pid`, under the runtime's name `slot`: a
    /// cgroup of its own with the zygote's limits, at background weight. Only a process
    /// that is the zygote's (in its cgroup) is moved. Answered at once with
    /// [`FromKeeper::Slot`] when a kept cgroup could take it, else [`FromKeeper::Placing`]
    /// and later the same [`FromKeeper::Slot`] or [`FromKeeper::PlaceFailed`] as an event.
    PlaceSpare {
        zygote: ZygoteId,
        slot: String,
        pid: i32,
    },
    /// A parked slot is given to a call of `tenant` (of a host function: moved into a
    /// cgroup of the tenant's for the function) or with narrowed `limits` (never wider
    /// than the zygote's, I/O rates as they are). Once per slot, before its call.
    /// Answered with [`FromKeeper::Slot`] (its view may be new).
    PrepareSlot {
        slot: SlotId,
        tenant: Option<String>,
        limits: Option<LimitsMsg>,
    },
    /// Kill everything in a slot's cgroup (it stays, empty). Answered with what it
    /// counted, read after the kill.
    KillSlot { slot: SlotId },
    /// A slot is closed: what is left in it is killed, and its cgroup kept for another
    /// child of the same function (and tenant) or removed.
    ReleaseSlot { slot: SlotId },
    /// A zygote is gone (its launcher was killed): its cgroup and its slots' are removed.
    /// Answered with what each slot counted last.
    RemoveZygote { zygote: ZygoteId },
    /// A tenant is deleted: its folders are removed once empty.
    ForgetTenant { tenant: String },
    /// A one-shot run's cgroup, in the folder of its caller's runs (`tenant`, or the
    /// host's), with these limits. Answered with [`FromKeeper::Run`]; its attach files
    /// come beside.
    MakeRun {
        tenant: Option<String>,
        limits: LimitsMsg,
    },
    /// The run's first process (its launcher cloned it as `pid`): checked to be in the
    /// run's cgroup, never moved there. Once per run. Answered [`FromKeeper::Done`],
    /// [`FromKeeper::Gone`] (it exited already) or refused.
    PlaceRunInit { run: RunId, pid: i32 },
    /// Kill everything in a run's cgroup (it stays).
    KillRun { run: RunId },
    /// The run is over: what is left in its cgroup is killed first when `kill`, what it
    /// counted is read, and the cgroup is removed. Answered with [`FromKeeper::Killed`].
    EndRun { run: RunId, kill: bool },
}

/// A request's kind: the keeper's table is keyed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeeperKind {
    ServeFunction,
    StopFunction,
    MakeZygote,
    PlaceInit,
    PlaceSpare,
    PrepareSlot,
    KillSlot,
    ReleaseSlot,
    RemoveZygote,
    ForgetTenant,
    MakeRun,
    PlaceRunInit,
    KillRun,
    EndRun,
}

impl ToKeeper {
    pub fn kind(&self) -> KeeperKind {
        match self {
            ToKeeper::ServeFunction { .. } => KeeperKind::ServeFunction,
            ToKeeper::StopFunction { .. } => KeeperKind::StopFunction,
            ToKeeper::MakeZygote { .. } => KeeperKind::MakeZygote,
            ToKeeper::PlaceInit { .. } => KeeperKind::PlaceInit,
            ToKeeper::PlaceSpare { .. } => KeeperKind::PlaceSpare,
            ToKeeper::PrepareSlot { .. } => KeeperKind::PrepareSlot,
            ToKeeper::KillSlot { .. } => KeeperKind::KillSlot,
            ToKeeper::ReleaseSlot { .. } => KeeperKind::ReleaseSlot,
            ToKeeper::RemoveZygote { .. } => KeeperKind::RemoveZygote,
            ToKeeper::ForgetTenant { .. } => KeeperKind::ForgetTenant,
            ToKeeper::MakeRun { .. } => KeeperKind::MakeRun,
            ToKeeper::PlaceRunInit { .. } => KeeperKind::PlaceRunInit,
            ToKeeper::KillRun { .. } => KeeperKind::KillRun,
            ToKeeper::EndRun { .. } => KeeperKind::EndRun,
        }
    }
}

/// The keeper's answer to a request, or an event (a placement finished off its loop).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromKeeper {
    Done,
    /// A valid request that breaks a rule (an unknown id, a name that is not one, limits
    /// above the zygote's) or that failed: why.
    Refused {
        why: String,
    },
    /// A zygote's cgroup was made. Its view and its attach files come beside this.
    Zygote {
        zygote: ZygoteId,
    },
    /// A slot's cgroup holds the child the runtime named `slot`. Its view comes beside.
    Slot {
        zygote: ZygoteId,
        slot: String,
        id: SlotId,
    },
    /// The child is being placed off the keeper's loop: [`FromKeeper::Slot`] or
    /// [`FromKeeper::PlaceFailed`] follows as an event.
    Placing,
    /// The child named `slot` could not be given a cgroup (it may have exited).
    PlaceFailed {
        zygote: ZygoteId,
        slot: String,
        why: String,
    },
    /// A run's cgroup was made. Its attach files come beside this.
    Run {
        run: RunId,
    },
    /// The process is gone already (it dies with its launcher).
    Gone,
    /// What a killed slot or run counted (`None`: it could not be read).
    Killed {
        usage: Option<UsageMsg>,
    },
    /// What each slot of a removed zygote counted last.
    Removed {
        slots: Vec<(SlotId, Option<UsageMsg>)>,
    },
}

/// Whether `name` may be a slot's name: 1 to [`MAX_SLOT_NAME`] ASCII letters and digits
/// (it becomes part of a cgroup's name, so nothing that could name another folder).
pub fn is_slot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SLOT_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric())
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_are_plain_words() {
        assert!(is_slot_name("s12abc"));
        for bad in [
            "",
            "..",
            "a/b",
            "s 1",
            "s\0",
            &"s".repeat(MAX_SLOT_NAME + 1),
        ] {
            assert!(!is_slot_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn every_message_survives_the_wire() {
        let limits = LimitsMsg {
            mem_bytes: Some(1 << 20),
            cpu_millis: 500,
            pids: 16,
            io_bps: 1,
            io_iops: 2,
        };
        let f = FnKey {
            tenant: Some("acme".into()),
            name: "hello".into(),
        };
        for m in [
            ToKeeper::ServeFunction {
                function: f.clone(),
                limits,
                ceiling: Some(3),
            },
            ToKeeper::MakeZygote { function: f },
            ToKeeper::PrepareSlot {
                slot: SlotId(7),
                tenant: None,
                limits: Some(limits),
            },
        ] {
            let back: ToKeeper = crate::codec::decode(&crate::codec::encode(&m).unwrap()).unwrap();
            assert_eq!(back, m);
        }
    }
}
