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
    Ok(())
}

/// Drop every capability from every set, lock the securebits so that uid 0 inside the
/// sandbox gets none back on exec, and set no_new_privs.
///
/// With `keep_setid` (a zygote whose sandbox maps a whole id range), CAP_SETUID and
/// CAP_SETGID alone survive, through the ambient set, into the agent: it uses them only to
/// give each request's process an id of its own, which also strips them (the securebits
/// keep the kernel's uid-change fixup, so moving every uid off 0 clears every capability).
pub fn drop_privileges(keep_setid: bool) -> Result<()> {
    use caps::{CapSet, Capability};
    let kept: &[Capability] = if keep_setid {
        &[Capability::CAP_SETUID, Capability::CAP_SETGID]
    } else {
        &[]
    };
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

/// Filesystem writes only under `/tmp`, `/work` and the plan's writable mounts (plus the
/// harmless devices); reads and execution anywhere in the (already minimal) root. Where the
/// kernel supports it, also scope signals and abstract unix sockets to the sandbox.
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
/// `Truncate` is handled only in a runtime pool, whose `/run/script` is a writable tmpfs
/// whose files a rootless sandbox owns (it could `chmod` one, then `truncate(2)` it by
/// path); a pool's opens therefore still take the walk. Elsewhere truncation, by path or
/// by an open with `O_TRUNC` (even one for reading), is left to the mounts: every writable
/// mount but `/proc` is one Landlock grants anyway, `/proc` ignores a change of size, and
/// everything else is read-only (EROFS; `read_only_binds_cannot_be_truncated` in
/// tests/escape.rs).
///
/// On a kernel without Landlock this does nothing and says so: the mount namespace and the
/// read-only root still hold; `zygo version` reports the missing layer.
///
/// With `unlisted` (a runtime pool's `/run/script`), no directory at or above it may be
/// listed: reading and executing stay allowed everywhere, but listing is granted only on
/// the other top-level directories, so a script cannot learn the names of the others.
pub fn landlock(writable: &[&str], unlisted: Option<&str>) -> Result<bool> {
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
    let handled = match unlisted {
        None => AccessFs::from_write(abi) & !AccessFs::Truncate,
        Some(_) => AccessFs::from_write(abi) | AccessFs::ReadDir,
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)
        .map_err(io)?
        .scope(Scope::from_all(abi))
        .map_err(io)?
        .create()
        .map_err(io)?;
    if let Some(hidden) = unlisted {
        let top = Path::new(hidden)
            .components()
            .nth(1)
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .unwrap_or_default();
        let entries = std::fs::read_dir("/").map_err(|e| fail("list / for Landlock", e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir || name == top {
                continue;
            }
            ruleset = ruleset
                .add_rule(PathBeneath::new(
                    path(&format!("/{name}"))?,
                    AccessFs::ReadDir,
                ))
                .map_err(io)?;
        }
        // The rest of that top-level directory (the agent's own folder) stays listable.
        let parent = Path::new(hidden).parent().unwrap_or(Path::new("/"));
        if let Ok(siblings) = std::fs::read_dir(parent) {
            for entry in siblings.flatten() {
                let p = entry.path();
                if p != Path::new(hidden) && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let p = p.to_string_lossy().to_string();
                    ruleset = ruleset
                        .add_rule(PathBeneath::new(path(&p)?, AccessFs::ReadDir))
                        .map_err(io)?;
                }
            }
        }
    }
    for w in ["/tmp", "/work"].iter().chain(writable.iter()) {
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
