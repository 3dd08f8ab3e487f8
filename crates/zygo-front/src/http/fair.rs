//! What one caller may hold of the front, so that no caller (with a token or without one)
//! can take what every other caller needs:
//!
//! - [`Shares`]: the channels to the supervisor one caller may hold at once: a tenant,
//!   however it is named (any of its tokens, with or without `X-Zygo-Tenant` naming it,
//!   or an operator acting for it), or, acting for no tenant, a token. Past its share a
//!   caller is answered 429 at once.
//! - [`Readers`]: the request bodies being read at once from one peer address.
//! - [`AuthCache`]: which credentials the supervisor recently said it knows, so that a
//!   body is read only for a caller the supervisor knows (and the check costs a channel
//!   round trip at most once every few seconds per credential). The supervisor still
//!   judges every request itself: the cache only decides whether a body is worth reading.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use proto::api::Credentials;

/// A credential as the front receives it: the token and the tenant header.
type Key = (Option<String>, Option<String>);

fn key(who: &Credentials) -> Key {
    (who.token.clone(), who.tenant.clone())
}

/// Whom a share of the channels belongs to, as the supervisor says who a credential is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Party {
    /// A tenant, however it is named.
    Tenant(String),
    /// The host's callers: each token (or no token, on a `--no-auth` front) its own.
    Host(Option<String>),
}

impl Party {
    /// The party of `who`, given the tenant the supervisor says it acts for.
    pub fn of(who: &Credentials, tenant: Option<String>) -> Party {
        match tenant {
            Some(t) => Party::Tenant(t),
            None => Party::Host(who.token.clone()),
        }
    }
}

/// Channels held per caller.
pub struct Shares {
    inner: Arc<Held>,
}

struct Held {
    held: Mutex<HashMap<Party, usize>>,
    cv: Condvar,
    per: usize,
}

/// One of a caller's leases; given back when dropped. It may outlive the request that
/// took it: a channel whose caller stopped waiting holds it until the channel is free
/// again (see `channel::Lease::hold`).
pub struct Share {
    shares: Arc<Held>,
    key: Party,
}

impl Shares {
    /// `per`: how many channels one caller may hold at once (at least 1).
    pub fn new(per: usize) -> Shares {
        Shares {
            inner: Arc::new(Held {
                held: Mutex::new(HashMap::new()),
                cv: Condvar::new(),
                per: per.max(1),
            }),
        }
    }

    pub fn per(&self) -> usize {
        self.inner.per
    }

    /// One of `who`'s leases. `wait_until`: `None` refuses at once when `who` holds its
    /// share; `Some` waits (for the caller's own leases to end) until then.
    pub fn take(&self, who: &Party, wait_until: Option<Instant>) -> Option<Share> {
        let k = who.clone();
        let s = &self.inner;
        let mut held = s.held.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let n = held.entry(k.clone()).or_insert(0);
            if *n < s.per {
                *n += 1;
                return Some(Share {
                    shares: s.clone(),
                    key: k,
                });
            }
            let until = wait_until?;
            let now = Instant::now();
            if now >= until {
                return None;
            }
            held =
                s.cv.wait_timeout(held, until - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
        drop(held);
        self.shares.cv.notify_all();
    }
}

/// Bodies being read per peer address.
pub struct Readers {
    open: Mutex<HashMap<IpAddr, usize>>,
    per: usize,
}

/// One body being read; given back when dropped.
pub struct Reading {
    readers: std::sync::Arc<Readers>,
    ip: IpAddr,
}

impl Readers {
    pub fn new(per: usize) -> Readers {
        Readers {
            open: Mutex::new(HashMap::new()),
            per: per.max(1),
        }
    }

    pub fn per(&self) -> usize {
        self.per
    }

    /// A place to read one more body from `ip`, unless `per` are being read from there.
    pub fn take(this: &std::sync::Arc<Readers>, ip: IpAddr) -> Option<Reading> {
        let mut open = this.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= this.per {
            return None;
        }
        *n += 1;
        Some(Reading {
            readers: this.clone(),
            ip,
        })
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut open = self.readers.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// How long the supervisor's "I know this caller" is taken as still true for reading a
/// body (never for deciding anything: every request is judged again by the supervisor).
pub const AUTH_FRESH: Duration = Duration::from_secs(5);
/// Credentials remembered at most; past it the oldest half is forgotten.
const AUTH_KEEP: usize = 4096;

/// Credentials the supervisor recently said it knows, and whose they are.
#[derive(Default)]
pub struct AuthCache {
    known: Mutex<HashMap<Key, (Instant, Party)>>,
}

impl AuthCache {
    /// Whose `who` is, if the supervisor said it knows it within [`AUTH_FRESH`].
    pub fn fresh(&self, who: &Credentials) -> Option<Party> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known
            .get(&key(who))
            .filter(|(at, _)| at.elapsed() < AUTH_FRESH)
            .map(|(_, party)| party.clone())
    }

    /// The supervisor knows `who`, as of now, as `party`'s.
    pub fn known(&self, who: &Credentials, party: Party) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= AUTH_KEEP {
            known.retain(|_, (at, _)| at.elapsed() < AUTH_FRESH);
            if known.len() >= AUTH_KEEP {
                known.clear();
            }
        }
        known.insert(key(who), (Instant::now(), party));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn who(t: &str) -> Credentials {
        Credentials {
            token: Some(t.into()),
            tenant: None,
        }
    }

    fn party(t: &str) -> Party {
        Party::of(&who(t), None)
    }

    #[test]
    fn a_caller_holds_at_most_its_share_and_others_are_not_affected() {
        let s = Shares::new(2);
        let who = party;
        let a1 = s.take(&who("a"), None).unwrap();
        let _a2 = s.take(&who("a"), None).unwrap();
        assert!(s.take(&who("a"), None).is_none());
        let _b = s.take(&who("b"), None).unwrap();
        let waited = Instant::now();
        assert!(s
            .take(&who("a"), Some(Instant::now() + Duration::from_millis(50)))
            .is_none());
        assert!(waited.elapsed() >= Duration::from_millis(50));
        drop(a1);
        assert!(s.take(&who("a"), None).is_some());
    }

    #[test]
    fn bodies_read_per_peer_are_capped_and_given_back() {
        let r = std::sync::Arc::new(Readers::new(1));
        let ip: IpAddr = [127, 0, 0, 2].into();
        let g = Readers::take(&r, ip).unwrap();
        assert!(Readers::take(&r, ip).is_none());
        assert!(Readers::take(&r, [127, 0, 0, 1].into()).is_some());
        drop(g);
        assert!(Readers::take(&r, ip).is_some());
    }

    #[test]
    fn the_auth_cache_remembers_only_what_it_was_told() {
        let c = AuthCache::default();
        assert_eq!(c.fresh(&who("a")), None);
        c.known(&who("a"), party("a"));
        assert_eq!(c.fresh(&who("a")), Some(party("a")));
        assert_eq!(c.fresh(&who("b")), None);
        let other_tenant = Credentials {
            token: Some("a".into()),
            tenant: Some("t".into()),
        };
        assert_eq!(c.fresh(&other_tenant), None);
    }

    #[test]
    fn a_tenant_has_one_share_however_it_is_named() {
        let s = Shares::new(1);
        // Its token alone, its token naming it, another of its tokens, an operator acting
        // for it: one tenant, one share.
        let named = [
            (Some("tok-a"), None),
            (Some("tok-a"), Some("acme")),
            (Some("tok-b"), None),
            (Some("operator"), Some("acme")),
        ];
        let held = s
            .take(&Party::of(&who("tok-a"), Some("acme".into())), None)
            .unwrap();
        for (token, header) in named {
            let w = Credentials {
                token: token.map(str::to_string),
                tenant: header.map(str::to_string),
            };
            assert!(
                s.take(&Party::of(&w, Some("acme".into())), None).is_none(),
                "{w:?} took a second share"
            );
        }
        // The host's callers: a share per token.
        assert!(s.take(&Party::of(&who("operator"), None), None).is_some());
        drop(held);
        assert!(s
            .take(&Party::of(&who("operator"), Some("acme".into())), None)
            .is_some());
    }
}
