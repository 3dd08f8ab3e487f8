//! What the running kernel's Landlock provides, and what Zygo does where it falls short.
//!
//! Landlock's rights arrive one ABI at a time (ABI 2 is Linux 5.19, as in Debian 12's 6.1;
//! ABI 3, 6.2; 4, 6.7; 5, 6.10; 6, 6.12; 7, 6.15). Each protection Zygo takes from a newer
//! ABI is listed here with what stands in for it on an older kernel: another layer that
//! holds the same line, or a refusal naming the kernel it needs. `zygo version` prints the
//! list, so nothing is silently absent.

/// The Landlock ABI this kernel offers (0 when it has none).
pub fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).unwrap_or(0)
}

/// The first Linux release with a Landlock ABI.
pub fn linux_for_abi(abi: u32) -> &'static str {
    match abi {
        0 | 1 => "5.13",
        2 => "5.19",
        3 => "6.2",
        4 => "6.7",
        5 => "6.10",
        6 => "6.12",
        _ => "6.15",
    }
}

/// How one protection is provided on this kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provided {
    /// By Landlock itself.
    Landlock,
    /// By another layer that holds the same line (named).
    Fallback(&'static str),
    /// Not at all: what needs it is refused (the text says what and how to get it).
    Refused(String),
}

/// One protection that depends on the Landlock ABI.
#[derive(Debug, Clone)]
pub struct Protection {
    /// A short name, stable for `zygo version --json`.
    pub key: &'static str,
    pub what: &'static str,
    /// The ABI that brings it.
    pub abi: u32,
    pub provided: Provided,
}

/// The variable that accepts, on a kernel without Landlock scoping, that the requests of
/// one rootless zygote can signal each other.
pub const ALLOW_UNSCOPED: &str = "ZYGO_ALLOW_UNSCOPED_REQUESTS";

/// Whether [`ALLOW_UNSCOPED`] is set to 1.
pub fn unscoped_allowed() -> bool {
    std::env::var(ALLOW_UNSCOPED).is_ok_and(|v| v.trim() == "1")
}

/// Why a rootless zygote is refused on this kernel, if it is: its requests share one uid,
/// and only Landlock's signal scoping (ABI 6) keeps them from signalling each other, the
/// children parked for later requests and the agent.
pub fn rootless_zygote_refusal(abi: u32) -> Option<String> {
    if abi >= 6 || unscoped_allowed() {
        return None;
    }
    Some(format!(
        "rootless, the requests of a zygote share one uid, and only Landlock ABI 6 (Linux 6.12 or \
         later) keeps them from signalling each other and the zygote's agent; this kernel has ABI {abi}. \
         Run the supervisor as root (each request then gets a uid of its own), use Linux 6.12 or later, \
         or accept that one function's requests can signal each other with {ALLOW_UNSCOPED}=1"
    ))
}

/// Why a function or pool with a writable mount is refused on this kernel as root, if it
/// is: its requests run as the sandbox's id 0 (which writes into the folder as its owner),
/// so they share one uid, as rootless requests do.
pub fn writable_mount_refusal(abi: u32) -> Option<String> {
    if abi >= 6 || unscoped_allowed() {
        return None;
    }
    Some(format!(
        "the requests of a function with a writable mount (rw = true) run as the sandbox's \
         root, which writes into the folder as the folder's owner, so they share one uid, and \
         only Landlock ABI 6 (Linux 6.12 or later) keeps them from signalling each other and \
         the zygote's agent; this kernel has ABI {abi}. Mount the folder read-only, use Linux \
         6.12 or later, or accept that this function's requests can signal each other with \
         {ALLOW_UNSCOPED}=1"
    ))
}

/// Every protection that depends on the ABI, as provided on a kernel with `abi`, for a
/// monitor whose zygotes give each request a uid of its own (`own_uids`: root with a
/// subordinate id range) or not (rootless).
pub fn protections(abi: u32, own_uids: bool) -> Vec<Protection> {
    let lacks = |needed: u32| abi < needed;
    let mut out = vec![Protection {
        key: "writes",
        what: "one-shot sandboxes write only under /tmp, /work and writable mounts; nothing mounts",
        abi: 1,
        provided: if lacks(1) {
            Provided::Fallback(
                "the read-only root and mounts, no capabilities, and seccomp (no mount calls)",
            )
        } else {
            Provided::Landlock
        },
    }];
    out.push(Protection {
        key: "truncate",
        what: "no truncation of files outside the writable places",
        abi: 3,
        // Zygo never relies on Landlock for it: every other mount is read-only (EROFS).
        provided: Provided::Fallback(
            "read-only mounts (truncation is EROFS everywhere but the writable places)",
        ),
    });
    out.push(Protection {
        key: "ioctl_dev",
        what: "no device ioctls on the devices a sandbox has",
        abi: 5,
        provided: if lacks(5) {
            Provided::Fallback("the only devices are null, zero, full, random and urandom, and seccomp refuses TIOCSTI")
        } else {
            Provided::Landlock
        },
    });
    out.push(Protection {
        key: "tcp",
        what: "network access",
        abi: 4,
        provided: Provided::Fallback(
            "a network namespace of the sandbox's own, with only loopback",
        ),
    });
    let scope = if !lacks(6) {
        Provided::Landlock
    } else if own_uids {
        Provided::Fallback(
            "each request of a zygote runs as a uid of its own, so it cannot signal the others",
        )
    } else {
        match rootless_zygote_refusal(abi) {
            Some(why) => Provided::Refused(format!("rootless zygotes are refused: {why}")),
            None => Provided::Refused(format!(
                "NOT HELD: {ALLOW_UNSCOPED}=1 accepts that the requests of a rootless zygote can signal each other"
            )),
        }
    };
    out.push(Protection {
        key: "scope_signals",
        what: "a zygote's requests cannot signal each other or its agent",
        abi: 6,
        provided: scope,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protection_is_provided_somehow_on_every_abi() {
        for abi in 0..=8 {
            for own_uids in [true, false] {
                for p in protections(abi, own_uids) {
                    if let Provided::Refused(why) = &p.provided {
                        assert!(!own_uids, "uids of their own need no refusal: {p:?}");
                        assert!(why.contains("6.12") || why.contains("NOT HELD"), "{why}");
                    }
                    if abi >= p.abi && p.key != "truncate" && p.key != "tcp" {
                        assert_eq!(p.provided, Provided::Landlock, "{p:?} at ABI {abi}");
                    }
                }
            }
        }
    }

    #[test]
    fn rootless_zygotes_need_abi_6_unless_accepted() {
        if unscoped_allowed() {
            return;
        }
        let why = rootless_zygote_refusal(2).expect("refused on ABI 2");
        assert!(
            why.contains("Linux 6.12") && why.contains("ABI 2") && why.contains(ALLOW_UNSCOPED)
        );
        assert!(rootless_zygote_refusal(6).is_none());
        let why = writable_mount_refusal(2).expect("refused on ABI 2");
        assert!(
            why.contains("ABI 2") && why.contains(ALLOW_UNSCOPED),
            "{why}"
        );
        assert!(writable_mount_refusal(6).is_none());
        assert!(rootless_zygote_refusal(7).is_none());
    }
}
