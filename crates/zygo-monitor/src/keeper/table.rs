//! The keeper's table: every request the runtime may send, and in which phase. A request
//! outside it is a protocol violation, not a refusal: once the runtime is a process of its
//! own, it ends the channel (the runtime is then taken for compromised).

use std::fmt;

use proto::keeper::KeeperKind;

/// Where the keeper is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Serving calls: functions are served, zygotes made, children placed.
    Serving,
    /// Draining (SIGTERM, or `zygo down --all`): what runs is finished and cleared away;
    /// no new function is served.
    Draining,
}

/// The phases a request is allowed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    Serving,
    /// Serving or draining.
    Always,
}

/// One line of the table.
pub struct Entry {
    pub kind: KeeperKind,
    pub allowed: Allowed,
    /// What it does, as `docs/process-model.md` prints the table.
    pub does: &'static str,
}

/// The table. Zygotes are still made and children placed while draining: a call in flight
/// may need its zygote replaced or a child parked before the drain ends.
pub const TABLE: &[Entry] = &[
    Entry {
        kind: KeeperKind::ServeFunction,
        allowed: Allowed::Serving,
        does: "make a function's folder with its memory ceiling",
    },
    Entry {
        kind: KeeperKind::StopFunction,
        allowed: Allowed::Always,
        does: "remove a function's kept cgroups, then its folder",
    },
    Entry {
        kind: KeeperKind::MakeZygote,
        allowed: Allowed::Always,
        does: "make a zygote's cgroup with the function's limits; hand its view and attach files",
    },
    Entry {
        kind: KeeperKind::PlaceInit,
        allowed: Allowed::Always,
        does: "check a zygote's first process is in its cgroup (it is never moved there)",
    },
    Entry {
        kind: KeeperKind::PlaceSpare,
        allowed: Allowed::Always,
        does: "give a parked child of a zygote (checked by pidfd to be the zygote's) a cgroup of its own",
    },
    Entry {
        kind: KeeperKind::PrepareSlot,
        allowed: Allowed::Always,
        does: "move a parked child into a tenant's folder, or narrow its limits (never widen)",
    },
    Entry {
        kind: KeeperKind::KillSlot,
        allowed: Allowed::Always,
        does: "kill what runs in a slot's cgroup; read what it counted",
    },
    Entry {
        kind: KeeperKind::ReleaseSlot,
        allowed: Allowed::Always,
        does: "kill what is left in a closed slot; keep its cgroup for reuse or remove it",
    },
    Entry {
        kind: KeeperKind::RemoveZygote,
        allowed: Allowed::Always,
        does: "remove a gone zygote's cgroup and its slots'; read what each counted",
    },
    Entry {
        kind: KeeperKind::ForgetTenant,
        allowed: Allowed::Always,
        does: "remove a deleted tenant's folders once empty",
    },
    Entry {
        kind: KeeperKind::MakeRun,
        allowed: Allowed::Serving,
        does: "make a one-shot run's cgroup in its caller's folder; hand its attach files",
    },
    Entry {
        kind: KeeperKind::PlaceRunInit,
        allowed: Allowed::Always,
        does: "check a run's first process is in its cgroup (it is never moved there)",
    },
    Entry {
        kind: KeeperKind::KillRun,
        allowed: Allowed::Always,
        does: "kill what runs in a run's cgroup",
    },
    Entry {
        kind: KeeperKind::EndRun,
        allowed: Allowed::Always,
        does: "read what a run's cgroup counted (after a kill, if asked) and remove it",
    },
];

/// A request the table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// Not in the table at all.
    Unknown(KeeperKind),
    /// Not allowed in this phase.
    WrongPhase(KeeperKind, Phase),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Unknown(k) => write!(f, "{k:?} is not a request the keeper takes"),
            Violation::WrongPhase(k, p) => write!(f, "{k:?} is not allowed while {p:?}"),
        }
    }
}

/// Whether a request of `kind` may be taken in `phase`.
pub fn admit(phase: Phase, kind: KeeperKind) -> Result<(), Violation> {
    let entry = TABLE
        .iter()
        .find(|e| e.kind == kind)
        .ok_or(Violation::Unknown(kind))?;
    match (entry.allowed, phase) {
        (Allowed::Always, _) | (Allowed::Serving, Phase::Serving) => Ok(()),
        (Allowed::Serving, Phase::Draining) => Err(Violation::WrongPhase(kind, phase)),
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_line() {
        let kinds = [
            KeeperKind::ServeFunction,
            KeeperKind::StopFunction,
            KeeperKind::MakeZygote,
            KeeperKind::PlaceInit,
            KeeperKind::PlaceSpare,
            KeeperKind::PrepareSlot,
            KeeperKind::KillSlot,
            KeeperKind::ReleaseSlot,
            KeeperKind::RemoveZygote,
            KeeperKind::ForgetTenant,
            KeeperKind::MakeRun,
            KeeperKind::PlaceRunInit,
            KeeperKind::KillRun,
            KeeperKind::EndRun,
        ];
        assert_eq!(TABLE.len(), kinds.len());
        for k in kinds {
            assert_eq!(TABLE.iter().filter(|e| e.kind == k).count(), 1, "{k:?}");
            assert_eq!(admit(Phase::Serving, k), Ok(()));
        }
    }

    /// `docs/process-model.md` prints the table as it is.
    #[test]
    fn the_documented_table_is_this_one() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/process-model.md"
        ))
        .unwrap();
        let printed: Vec<&str> = doc
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("| `"))
            .collect();
        let ours: Vec<String> = TABLE
            .iter()
            .map(|e| {
                let allowed = match e.allowed {
                    Allowed::Serving => "serving",
                    Allowed::Always => "serving, draining",
                };
                format!("| `{:?}` | {allowed} | {} |", e.kind, e.does)
            })
            .collect();
        assert_eq!(printed, ours, "docs/process-model.md's keeper table");
    }

    #[test]
    fn no_function_is_served_while_draining() {
        assert_eq!(
            admit(Phase::Draining, KeeperKind::ServeFunction),
            Err(Violation::WrongPhase(
                KeeperKind::ServeFunction,
                Phase::Draining
            ))
        );
        assert_eq!(admit(Phase::Draining, KeeperKind::KillSlot), Ok(()));
        assert_eq!(admit(Phase::Draining, KeeperKind::ReleaseSlot), Ok(()));
    }
}
