//! The last steps before the program runs, in this order: rlimits, drop every capability,
//! no_new_privs, Landlock. (The seccomp filter is installed after these, by init on itself
//! right before it starts the program: see `seccomp`.)

use std::path::Path;

use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::sys::{self, fail, step, Result};

/// The newest Landlock ABI whose rights this code was written and tested against.
const LANDLOCK_ABI: ABI = ABI::V6;

/// What one uid inside a sandbox may use of the kernel's per-user allowances: an eighth.
const SHARE_OF_A_USERS_ALLOWANCE: u64 = 8;

/// Cap what the kernel counts per user (inotify instances and watches) for every uid of
/// this sandbox at an eighth of the host's per-user limit, in the sandbox's own user
/// namespace: a sandbox's (or, where requests have uids of their own, a request's) use
/// then leaves the rest to everyone else owned by the same host user. As root each sandbox
/// also has an owner of its own, whose allowance the host's limit bounds; rootless, every
/// sandbox of the user shares that user's. Written while init still holds
/// CAP_SYS_RESOURCE in the namespace (the values are the namespace's own, read and written
/// through `/proc/sys/user`); nothing in the sandbox can raise them again.
pub fn user_counters() -> Result<()> {
    for (host, ours) in [
        (
            "/proc/sys/fs/inotify/max_user_instances",
            "/proc/sys/user/max_inotify_instances",
        ),
        (
            "/proc/sys/fs/inotify/max_user_watches",
            "/proc/sys/user/max_inotify_watches",
        ),
    ] {
        let text = match std::fs::read_to_string(host) {
            // A kernel built without inotify has neither file: nothing to share out.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            other => step(other, || format!("read {host}"))?,
        };
        let limit: u64 = text.trim().parse().map_err(|_| {
            fail(
                format!("read {host}"),
                std::io::Error::other("not a number"),
            )
        })?;
        let share = (limit / SHARE_OF_A_USERS_ALLOWANCE).max(1);
        step(std::fs::write(ours, share.to_string()), || {
            format!("write {share} to {ours}")
        })?;
    }
    Ok(())
}

/// Limits that are per process rather than per cgroup.
pub fn rlimits() -> Result<()> {
    // No core dumps: a crashing program must not write its memory anywhere.
    step(sys::set_rlimit(libc::RLIMIT_CORE, 0, 0), || {
        "set RLIMIT_CORE".into()
    })?;
    // Enough descriptors for an interpreter, few enough to keep a leak contained.
    let (_, hard) = step(sys::get_rlimit(libc::RLIMIT_NOFILE), || {
        "read RLIMIT_NOFILE".into()
    })?;
    let n = hard.min(4096);
    step(sys::set_rlimit(libc::RLIMIT_NOFILE, n, n), || {
        "set RLIMIT_NOFILE".into()
    })?;
    // Queued signals and locked memory are counted per user, and checked against these
    // limits of the process that queues or locks: an eighth of what the host allows, so
    // one uid of a sandbox cannot take a user's whole allowance (see `user_counters`).
    for (resource, name) in [
        (libc::RLIMIT_SIGPENDING, "RLIMIT_SIGPENDING"),
        (libc::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK"),
    ] {
        let (_, hard) = step(sys::get_rlimit(resource), || format!("read {name}"))?;
        if hard != libc::RLIM_INFINITY {
            let share = (hard / SHARE_OF_A_USERS_ALLOWANCE).max(1);
            step(sys::set_rlimit(resource, share, share), || {
                format!("set {name}")
            })?;
        }
    }
    Ok(())
}

/// What a sandbox's program keeps of init's capabilities (in the sandbox's own user
/// namespace: none of them reaches the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// A one-shot program: nothing.
    Nothing,
    /// A zygote's agent: CAP_SYS_ADMIN, to give each request's process a mount and an IPC
    /// namespace of its own (the seccomp filter lets `unshare` through with those two flags
    /// only, and Landlock refuses every mount, so the launcher places the request's `/tmp`
    /// and `/work` from outside); each request's process drops it before it registers.
    Agent,
    /// The agent of a zygote whose requests get uids of their own: also CAP_SETUID and
    /// CAP_SETGID, which a request's move to its uid strips along with the rest (the
    /// securebits keep the kernel's uid-change fixup for that).
    AgentWithIds,
}

/// Drop every capability from every set but what `keep` names, lock the securebits so
/// that uid 0 inside the sandbox gets none back on exec, and set no_new_privs. What is kept
/// reaches the program through the ambient set.
pub fn drop_privileges(keep: Keep) -> Result<()> {
    use caps::{CapSet, Capability};
    let kept: &[Capability] = match keep {
        Keep::Nothing => &[],
        Keep::Agent => &[Capability::CAP_SYS_ADMIN],
        Keep::AgentWithIds => &[
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_SETUID,
            Capability::CAP_SETGID,
        ],
    };
    let keep_setid = keep == Keep::AgentWithIds;
    // NOROOT (+lock), KEEP_CAPS locked off, NO_CAP_AMBIENT_RAISE (+lock); NO_SETUID_FIXUP
    // too (+lock) when nothing is kept, else its lock alone (the fixup stays on).
    const NOROOT: libc::c_ulong = 0x01 | 0x02;
    const NO_SETUID_FIXUP: libc::c_ulong = 0x04;
    const NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 0x08;
    const KEEP_CAPS_LOCKED: libc::c_ulong = 0x20;
    const NO_AMBIENT_RAISE: libc::c_ulong = 0x40 | 0x80;
    let fixup = if keep_setid {
        NO_SETUID_FIXUP_LOCKED
    } else {
        NO_SETUID_FIXUP | NO_SETUID_FIXUP_LOCKED
    };
    step(
        sys::prctl(libc::PR_SET_SECUREBITS, NOROOT | fixup | KEEP_CAPS_LOCKED),
        || "lock the securebits".into(),
    )?;
    let cap_err = |what: String| {
        move |e: caps::errors::CapsError| fail(what, std::io::Error::other(e.to_string()))
    };
    for cap in caps::all() {
        if !kept.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(cap_err(format!("drop {cap} from the bounding set")))?;
        }
    }
    let keep: caps::CapsHashSet = kept.iter().copied().collect();
    caps::clear(None, CapSet::Ambient).map_err(cap_err("clear the ambient set".into()))?;
    caps::set(None, CapSet::Inheritable, &keep)
        .map_err(cap_err("set the inheritable set".into()))?;
    for cap in kept {
        caps::raise(None, CapSet::Ambient, *cap)
            .map_err(cap_err(format!("raise ambient {cap}")))?;
    }
    step(
        sys::prctl(
            libc::PR_SET_SECUREBITS,
            NOROOT | fixup | KEEP_CAPS_LOCKED | NO_AMBIENT_RAISE,
        ),
        || "lock the securebits".into(),
    )?;
    caps::set(None, CapSet::Effective, &keep).map_err(cap_err("set the effective set".into()))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(cap_err("set the permitted set".into()))?;
    step(sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1), || {
        "set no_new_privs".into()
    })?;
    Ok(())
}

/// The Landlock ABI this kernel offers (0 when it has none).
pub fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no ruleset pointer and size 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        0
    } else {
        r
    }
}

/// Where Landlock confines a sandbox's filesystem writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes<'a> {
    /// A one-shot sandbox: writes only under `/tmp`, `/work` and these writable mounts
    /// (plus the harmless devices).
    Under(&'a [&'a str]),
    /// A zygote: its mounts decide. Each request's `/tmp` and `/work` are mounts the
    /// launcher places over the sandbox's in that request's own mount namespace, and
    /// Landlock ignores a rule on a directory once a mount covers it (it checks the
    /// directories a path passes through, never a covered mount point), so no rule could
    /// grant writes there. Every other mount of a zygote is read-only but `/proc` (where a
    /// process can write only its own settings) and the plan's writable mounts; a pool's
    /// `/run/script` too is read-only inside, the launcher writing through a mount of its
    /// own (`hand_over_script_dir`).
    ByMounts,
}

/// Confine filesystem writes as `writes` says; reads and execution anywhere in the
/// (already minimal) root. Where the kernel supports it, also scope signals and abstract
/// unix sockets to the sandbox.
///
/// The ruleset handles only the rights that change something (write, create, remove,
/// link, device ioctls): a right it does not handle is allowed everywhere, which is what
/// reading and executing are here. That keeps Landlock off the path of every open for
/// reading: with a read right or `Truncate` handled, each `open` walks the file's path up
/// to the root to find the rules that apply (~1 µs per open here, a third of its cost).
/// Reads are then not confined to paths under the sandbox's root either, which changes
/// nothing while no descriptor from outside reaches the program (its stdio are pipes and
/// `/dev/null`; init closes everything else).
///
/// Truncation, by path or by an open with `O_TRUNC` (even one for reading), is left to the
/// mounts: every writable mount but `/proc` is one Landlock grants anyway, `/proc` ignores
/// a change of size, and everything else is read-only (EROFS;
/// `read_only_binds_cannot_be_truncated` in tests/escape.rs).
///
/// On a kernel without Landlock this does nothing and says so: the mount namespace and the
/// read-only root still hold; `zygo version` reports the missing layer.
pub fn landlock(writes: Writes<'_>) -> Result<bool> {
    let abi = LANDLOCK_ABI;
    let io =
        |e: landlock::RulesetError| fail("set up Landlock", std::io::Error::other(e.to_string()));
    let path = |p: &str| {
        PathFd::new(Path::new(p)).map_err(|e| {
            fail(
                format!("open {p} for Landlock"),
                std::io::Error::other(e.to_string()),
            )
        })
    };
    let writable: &[&str] = match writes {
        Writes::Under(w) => w,
        Writes::ByMounts => &[],
    };
    // By mounts, only the device-making rights are handled (no one in a sandbox has
    // CAP_MKNOD anyway): a domain needs one handled right to scope signals and sockets.
    let written = match writes {
        Writes::Under(_) => AccessFs::from_write(abi) & !AccessFs::Truncate,
        Writes::ByMounts => AccessFs::MakeChar | AccessFs::MakeBlock,
    };
    let handled = written;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)
        .map_err(io)?
        .scope(Scope::from_all(abi))
        .map_err(io)?
        .create()
        .map_err(io)?;
    if writes == Writes::ByMounts {
        let status = ruleset.restrict_self().map_err(io)?;
        return Ok(status.ruleset != RulesetStatus::NotEnforced);
    }
    for w in ["/tmp", "/work", "/dev/shm"].iter().chain(writable.iter()) {
        ruleset = ruleset
            .add_rule(PathBeneath::new(path(w)?, handled))
            .map_err(io)?;
    }
    let dev_rights = AccessFs::WriteFile | AccessFs::IoctlDev;
    for d in [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
    ] {
        ruleset = ruleset
            .add_rule(PathBeneath::new(path(d)?, dev_rights))
            .map_err(io)?;
    }
    let status = ruleset.restrict_self().map_err(io)?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}
