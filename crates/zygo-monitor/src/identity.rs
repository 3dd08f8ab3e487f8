//! Who a sandbox is on the host.
//!
//! As root, a sandbox's ids 0..count map onto a subordinate host range that nothing else
//! uses — never host id 0 — so host files owned by root are `nobody` inside and readable
//! only where they are world-readable. The range is, in order of preference:
//! `$ZYGO_SUBID` (`BASE:COUNT`), the `zygo` entry of `/etc/subuid` and `/etc/subgid`, or the
//! built-in default below. As an ordinary user, id 0 inside is that user and nothing else
//! is mapped.

use proto::launch::IdMap;

/// Default subordinate range for root: far above the ranges `useradd` hands out
/// (100000 upwards in steps of 65536) and below 2^31.
pub const DEFAULT_BASE: u32 = 2_000_000_000;
pub const DEFAULT_COUNT: u32 = 65536;

#[derive(Debug, PartialEq, Eq)]
pub struct IdentityError(pub String);

impl std::fmt::Display for IdentityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IdentityError {}

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

/// The id map for sandboxes started by this process.
pub fn id_map() -> Result<IdMap, IdentityError> {
    // SAFETY: these calls cannot fail.
    let (euid, uid, gid) = unsafe { (libc::geteuid(), libc::getuid(), libc::getgid()) };
    if euid != 0 {
        return Ok(IdMap::Single { uid, gid });
    }
    if let Ok(v) = std::env::var("ZYGO_SUBID") {
        let (base, count) = parse_range(&v).ok_or_else(|| {
            IdentityError(format!(
                "ZYGO_SUBID={v:?} is not BASE:COUNT (e.g. 2000000000:65536)"
            ))
        })?;
        let (base, count) = check_range(base, count, "ZYGO_SUBID")?;
        return Ok(IdMap::Range {
            uid_base: base,
            gid_base: base,
            count,
        });
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
    Ok(IdMap::Range {
        uid_base,
        gid_base,
        count: uid_count.min(gid_count),
    })
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
    }
}
