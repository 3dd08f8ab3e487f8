//! Who a sandbox is on the host.
//!
//! As root, a sandbox's ids map onto a subordinate host range that nothing else uses —
//! never host id 0 — so host files owned by root are `nobody` inside and readable only
//! where they are world-readable. The range is, in order of preference: `$ZYGO_SUBID`
//! (`BASE:COUNT`), the `zygo` entry of `/etc/subuid` and `/etc/subgid`, or the built-in
//! default below. As an ordinary user, id 0 inside is that user and nothing else is mapped.
//!
//! The range is laid out in three parts:
//!
//! | host ids | inside | what |
//! |---|---|---|
//! | `BASE ..+ 65536` | 0–65535 | the image's users, in every sandbox |
//! | next [`REQUEST_IDS`] | 65536 upwards | a zygote's requests, one uid each |
//! | the rest (up to [`OWNER_IDS`]) | not mapped | the sandboxes' owners, one per live sandbox |
//!
//! Request uids lie above every id an image's own users have, so no request runs as a user
//! the image knows. Each sandbox's user namespace is owned by a host id of its own (the
//! launcher picks `its pid % owners`, unique among live launchers when there are as many
//! owner ids as pids can be): the kernel counts inotify instances and watches, queued
//! signals and locked memory per owner, so one sandbox cannot use up another's allowance.
//! Id 0 inside maps onto that owner id too (ids 1..65535 onto the first part as in the
//! table): the kernel counts pipe buffers, descriptors in flight over unix sockets and
//! epoll watches per host uid of the process, and a sandbox's processes run as its id 0.
//! On disk, id 0 is one owner in a host folder whichever sandbox it is (the folder is
//! mounted idmapped): a writable folder's own owner, `BASE` in a read-only one. A zygote's
//! request uids are shared with other zygotes' requests of the same number; a function
//! with a writable mount gives its requests none.
//!
//! A smaller configured range still works, with less: fewer than 65536 + 1024 ids and
//! requests take uids 60000–65533 (above `useradd`'s range, below `nobody`); no owner ids
//! left and every sandbox is owned by `BASE`, sharing those kernel allowances.

use proto::launch::{IdMap, RequestIds};

/// Default subordinate range for root: far above the ranges `useradd` hands out
/// (100000 upwards in steps of 65536), and below 2^31 with everything it holds.
pub const DEFAULT_BASE: u32 = 2_000_000_000;
/// Ids 0..65535 inside: the image's own users.
pub const IMAGE_IDS: u32 = 65536;
/// A zygote's request uids, one per request and never reused: after this many requests the
/// zygote is replaced.
pub const REQUEST_IDS: u32 = 65536;
/// Owner ids: as many as the largest `kernel.pid_max` (2^22), so launchers' pids never
/// share one.
pub const OWNER_IDS: u32 = 1 << 22;
pub const DEFAULT_COUNT: u32 = IMAGE_IDS + REQUEST_IDS + OWNER_IDS;

/// Request ids in a range too small to hold them above the image's: above `useradd`'s
/// UID_MAX (60000) and below `nobody` (65534).
const FALLBACK_REQUEST_IDS: RequestIds = RequestIds {
    first: 60000,
    count: 65534 - 60000,
};

/// The fewest request ids worth a range of their own.
const MIN_REQUEST_IDS: u32 = 1024;

#[derive(Debug, PartialEq, Eq)]
pub struct IdentityError(pub String);

impl std::fmt::Display for IdentityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IdentityError {}

/// How this process's sandboxes map ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub ids: IdMap,
    /// The uids a zygote's requests get; `None` where only one id is mapped (rootless).
    pub request_ids: Option<RequestIds>,
}

impl Identity {
    /// What an operator should know about a range too small for the full layout, if it is:
    /// no owner ids, fewer than the pids a launcher may have (two live launchers whose pids
    /// differ by a multiple of `owners` would share one owner, and its allowances), or no
    /// room for request uids.
    pub fn shortfall(&self) -> Option<String> {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .unwrap_or(OWNER_IDS);
        match self.ids {
            IdMap::Range { count, owners, .. }
                if owners == 0
                    || owners < pid_max
                    || count < IMAGE_IDS + MIN_REQUEST_IDS =>
            {
                Some(format!(
                "the subordinate id range has {} ids; with {DEFAULT_COUNT} each sandbox gets an owner and a root of its own \
                 (its own share of per-user kernel limits) and requests get uids above the image's \
                 (ZYGO_SUBID=BASE:{DEFAULT_COUNT}, or a `zygo:BASE:{DEFAULT_COUNT}` line in /etc/subuid and /etc/subgid)",
                u64::from(count) + u64::from(owners)
            ))
            }
            _ => None,
        }
    }
}

fn parse_range(text: &str) -> Option<(u32, u32)> {
    let (b, c) = text.trim().split_once(':')?;
    let base: u32 = b.parse().ok()?;
    let count: u32 = c.parse().ok()?;
    Some((base, count))
}

fn subid_entry(file: &str) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("zygo:").and_then(parse_range))
}

fn check_range(base: u32, count: u32, origin: &str) -> Result<(u32, u32), IdentityError> {
    if base == 0 || count == 0 || base.checked_add(count).is_none() {
        return Err(IdentityError(format!(
            "{origin}: the subordinate id range {base}:{count} is not usable (it must not start at 0, be empty or overflow)"
        )));
    }
    Ok((base, count))
}

/// Lay out `count` subordinate ids starting at the two bases (see the module's table).
pub fn layout(uid_base: u32, gid_base: u32, count: u32) -> Identity {
    let mapped = count.min(IMAGE_IDS + REQUEST_IDS);
    let owners = (count - mapped).min(OWNER_IDS);
    let request_ids = if mapped >= IMAGE_IDS + MIN_REQUEST_IDS {
        Some(RequestIds {
            first: IMAGE_IDS,
            count: mapped - IMAGE_IDS,
        })
    } else if mapped >= IMAGE_IDS {
        Some(FALLBACK_REQUEST_IDS)
    } else {
        None
    };
    Identity {
        ids: IdMap::Range {
            uid_base,
            gid_base,
            count: mapped,
            owners,
        },
        request_ids,
    }
}

/// The identity of sandboxes started by this process.
pub fn identity() -> Result<Identity, IdentityError> {
    // SAFETY: these calls cannot fail.
    let (euid, uid, gid) = unsafe { (libc::geteuid(), libc::getuid(), libc::getgid()) };
    if euid != 0 {
        return Ok(Identity {
            ids: IdMap::Single { uid, gid },
            request_ids: None,
        });
    }
    if let Ok(v) = std::env::var("ZYGO_SUBID") {
        let (base, count) = parse_range(&v).ok_or_else(|| {
            IdentityError(format!(
                "ZYGO_SUBID={v:?} is not BASE:COUNT (e.g. {DEFAULT_BASE}:{DEFAULT_COUNT})"
            ))
        })?;
        let (base, count) = check_range(base, count, "ZYGO_SUBID")?;
        return Ok(layout(base, base, count));
    }
    let (uid_base, uid_count) = match subid_entry("/etc/subuid") {
        Some((b, c)) => check_range(b, c, "/etc/subuid")?,
        None => (DEFAULT_BASE, DEFAULT_COUNT),
    };
    let (gid_base, gid_count) = match subid_entry("/etc/subgid") {
        Some((b, c)) => check_range(b, c, "/etc/subgid")?,
        None => (DEFAULT_BASE, DEFAULT_COUNT),
    };
    // One count for both maps, so neither reaches past its own range.
    Ok(layout(uid_base, gid_base, uid_count.min(gid_count)))
}

/// The id map alone (one-shot sandboxes have no requests).
pub fn id_map() -> Result<IdMap, IdentityError> {
    identity().map(|i| i.ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("100000:65536"), Some((100000, 65536)));
        assert_eq!(parse_range("x:1"), None);
        assert!(check_range(0, 10, "t").is_err());
        assert!(check_range(u32::MAX - 1, 10, "t").is_err());
        assert!(check_range(5, 0, "t").is_err());
        assert!(check_range(DEFAULT_BASE, DEFAULT_COUNT, "t").is_ok());
        assert!(u64::from(DEFAULT_BASE) + u64::from(DEFAULT_COUNT) < 1 << 31);
    }

    #[test]
    fn the_default_range_gives_requests_ids_above_the_images_and_every_pid_an_owner() {
        let i = layout(DEFAULT_BASE, DEFAULT_BASE, DEFAULT_COUNT);
        assert_eq!(
            i.ids,
            IdMap::Range {
                uid_base: DEFAULT_BASE,
                gid_base: DEFAULT_BASE,
                count: IMAGE_IDS + REQUEST_IDS,
                owners: OWNER_IDS,
            }
        );
        assert_eq!(
            i.request_ids,
            Some(RequestIds {
                first: 65536,
                count: REQUEST_IDS
            })
        );
        assert_eq!(i.shortfall(), None);
    }

    #[test]
    fn a_small_range_still_keeps_requests_off_the_images_users_and_says_what_it_lacks() {
        let i = layout(100000, 100000, 65536);
        assert_eq!(i.request_ids, Some(FALLBACK_REQUEST_IDS));
        assert!(matches!(
            i.ids,
            IdMap::Range {
                count: 65536,
                owners: 0,
                ..
            }
        ));
        let why = i.shortfall().expect("a shortfall");
        assert!(why.contains(&DEFAULT_COUNT.to_string()), "{why}");
        // Owners, but fewer than the smallest pid_max the kernel allows (301): two live
        // launchers could share one.
        let i = layout(100000, 100000, IMAGE_IDS + REQUEST_IDS + 300);
        assert!(matches!(i.ids, IdMap::Range { owners: 300, .. }));
        assert!(i.shortfall().is_some());
        // Room for requests but none for owners.
        let i = layout(100000, 100000, IMAGE_IDS + REQUEST_IDS);
        assert_eq!(i.request_ids.map(|r| r.first), Some(IMAGE_IDS));
        assert!(i.shortfall().is_some());
        // Too few ids for the image's own users: nobody gets a uid of their own.
        let i = layout(100000, 100000, 1000);
        assert_eq!(i.request_ids, None);
    }
}
