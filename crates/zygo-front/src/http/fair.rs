//! What one caller may hold of the front, so that no caller (with a token or without one)
//! can take what every other caller needs:
//!
//! - [`Shares`]: the channels to the supervisor one caller may hold at once: a tenant,
//!   however it is named (any of its tokens, with or without `X-Zygo-Tenant` naming it,
//!   or an operator acting for it), or, acting for no tenant, a token. Past its share a
//!   caller's request waits, in turn behind that caller's other waiting requests, for one
//!   of its own channels to be free (for a bounded time: see `handlers::SHARE_WAIT`); one
//!   that waited in vain is answered 429, and one whose client hung up leaves the line
//!   unsent. A waiting request holds one of its caller's [`Places`], so the requests one
//!   caller has waiting are bounded by those.
//! - [`Places`]: the requests being served at once (from the head's arrival until the
//!   answer is written: reading the body, waiting on the supervisor, writing the answer),
//!   per caller (a tenant however its tokens and headers name it, or a token), per peer
//!   address, for callers not known yet (a small pool of their own, so a flood of made-up
//!   tokens takes no known caller's place), and in all. Past a share a request is refused at
//!   once (429; 503 past the total), so a caller that trickles bodies or does not read its
//!   answers holds at most its share of the workers and another caller always finds one.
//! - [`AnswerBudgets`]: the bytes of batch answers one caller's batches hold at once, all
//!   of them together: a caller that sends many large batches at once holds one batch's
//!   worth of the front's memory, not one per batch (past it a batch is refused 429).
//! - [`AuthCache`]: which credentials the supervisor recently said it knows, so that a
//!   body is read only for a caller the supervisor knows (and the check costs a channel
//!   round trip at most once every few seconds per credential). The supervisor still
//!   judges every request itself: the cache only decides whether a body is worth reading.

use std::collections::{HashMap, VecDeque};
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

/// Channels held per caller, and the requests of each caller waiting, in turn, for one of
/// its own to be free.
pub struct Shares {
    inner: Arc<Held>,
}

struct Held {
    state: Mutex<SharesState>,
    cv: Condvar,
    per: usize,
}

#[derive(Default)]
struct SharesState {
    parties: HashMap<Party, PartyShare>,
    /// The next waiting request's ticket.
    next: u64,
}

/// What one caller holds, and its requests waiting for a share, first come first.
#[derive(Default)]
struct PartyShare {
    held: usize,
    waiting: VecDeque<u64>,
}

impl SharesState {
    /// Forget `who` once it holds nothing and nobody of it waits.
    fn tidy(&mut self, who: &Party) {
        if self
            .parties
            .get(who)
            .is_some_and(|p| p.held == 0 && p.waiting.is_empty())
        {
            self.parties.remove(who);
        }
    }
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
                state: Mutex::new(SharesState::default()),
                cv: Condvar::new(),
                per: per.max(1),
            }),
        }
    }

    pub fn per(&self) -> usize {
        self.inner.per
    }

    /// One of `who`'s leases. `wait_until`: `None` refuses at once when `who` holds its
    /// share (or has requests waiting for one, which go first); `Some` waits in turn
    /// behind them (for the caller's own leases to end, never another caller's) until
    /// then. `None` when no lease came.
    pub fn take(&self, who: &Party, wait_until: Option<Instant>) -> Option<Share> {
        self.take_unless(who, wait_until, &|| false)
    }

    /// [`Shares::take`], leaving the line early once `gone()` says the request's client
    /// hung up (asked every [`GONE_EVERY`] while it waits): a request nobody waits for
    /// is not sent later.
    pub fn take_unless(
        &self,
        who: &Party,
        wait_until: Option<Instant>,
        gone: &dyn Fn() -> bool,
    ) -> Option<Share> {
        let s = &self.inner;
        let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut ticket: Option<u64> = None;
        loop {
            let next = st.next;
            let p = st.parties.entry(who.clone()).or_default();
            let turn = match ticket {
                None => p.waiting.is_empty(),
                Some(t) => p.waiting.front() == Some(&t),
            };
            if turn && p.held < s.per {
                if ticket.is_some() {
                    p.waiting.pop_front();
                }
                p.held += 1;
                // Two leases may have ended at once: the next in line looks again.
                let more = p.held < s.per && !p.waiting.is_empty();
                drop(st);
                if more {
                    s.cv.notify_all();
                }
                return Some(Share {
                    shares: s.clone(),
                    key: who.clone(),
                });
            }
            let now = Instant::now();
            let until = match wait_until {
                Some(until) if now < until && !(ticket.is_some() && gone()) => until,
                _ => {
                    if let Some(t) = ticket {
                        p.waiting.retain(|w| *w != t);
                    }
                    st.tidy(who);
                    drop(st);
                    // Whoever was behind this request may be first now.
                    if ticket.is_some() {
                        s.cv.notify_all();
                    }
                    return None;
                }
            };
            if ticket.is_none() {
                p.waiting.push_back(next);
                ticket = Some(next);
                st.next = next.wrapping_add(1);
            }
            st =
                s.cv.wait_timeout(st, (until - now).min(GONE_EVERY))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut st = self.shares.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = st.parties.get_mut(&self.key) {
            p.held = p.held.saturating_sub(1);
        }
        st.tidy(&self.key);
        drop(st);
        self.shares.cv.notify_all();
    }
}

/// How often a request waiting for its caller's share looks whether its client hung up.
pub const GONE_EVERY: Duration = Duration::from_millis(200);

/// Requests being served per caller, per peer address, and in all.
pub struct Places {
    held: Mutex<PlacesHeld>,
    per_caller: usize,
    per_address: usize,
    all: usize,
    unknown: usize,
}

#[derive(Default)]
struct PlacesHeld {
    callers: HashMap<Party, usize>,
    addresses: HashMap<IpAddr, usize>,
    unknown: usize,
    all: usize,
}

/// Whom a request's place is counted against, besides its address and the total.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    /// A caller the supervisor has said it knows: its party's share (a tenant's however
    /// its tokens and headers name it).
    Known(&'a Party),
    /// A credential not known yet (a token never seen, or none): the small pool all such
    /// requests share, so that a flood of made-up tokens cannot take the places of callers
    /// the front knows.
    Unknown,
    /// A route that needs no caller (`/healthz`, `/version` without a token).
    Anyone,
}

/// One request's place; given back when dropped.
pub struct Place {
    places: std::sync::Arc<Places>,
    caller: Option<Party>,
    unknown: bool,
    ip: Option<IpAddr>,
}

/// Which share a request found full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Its caller has this many requests being served.
    Caller(usize),
    /// Its peer address has this many.
    Address(usize),
    /// Callers not known yet have this many, their most.
    Unknown(usize),
    /// The front serves this many, its most.
    All(usize),
}

impl Full {
    /// The status and words of the refusal.
    pub fn refusal(self) -> (u16, &'static str, String) {
        match self {
            Full::Caller(n) => (
                429,
                "busy",
                format!("this caller has {n} requests being served by zygo api already (its share of the front's workers); retry when one is done"),
            ),
            Full::Address(n) => (
                429,
                "busy",
                format!("{n} requests from this address are being served by zygo api already (its share of the front's workers); retry when one is done"),
            ),
            Full::Unknown(n) => (
                503,
                "unavailable",
                format!("zygo api is serving {n} requests of callers it does not know yet, its most; retry in a moment"),
            ),
            Full::All(n) => (
                503,
                "unavailable",
                format!("zygo api is serving {n} requests, its most; retry in a moment"),
            ),
        }
    }
}

impl Places {
    /// `per_caller`, `per_address`, `all`, `unknown`: the most requests served at once for
    /// one caller, from one address, in all, and for callers not known yet (each at
    /// least 1).
    pub fn new(per_caller: usize, per_address: usize, all: usize, unknown: usize) -> Places {
        Places {
            held: Mutex::new(PlacesHeld::default()),
            per_caller: per_caller.max(1),
            per_address: per_address.max(1),
            all: all.max(1),
            unknown: unknown.max(1),
        }
    }

    /// A place for one request of `caller` from `ip`. Unix socket peers have no address.
    pub fn take(
        this: &std::sync::Arc<Places>,
        caller: Caller<'_>,
        ip: Option<IpAddr>,
    ) -> Result<Place, Full> {
        let mut held = this.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.all >= this.all {
            return Err(Full::All(this.all));
        }
        match caller {
            Caller::Known(k) if held.callers.get(k).copied().unwrap_or(0) >= this.per_caller => {
                return Err(Full::Caller(this.per_caller));
            }
            Caller::Unknown if held.unknown >= this.unknown => {
                return Err(Full::Unknown(this.unknown));
            }
            _ => {}
        }
        if let Some(ip) = ip {
            if held.addresses.get(&ip).copied().unwrap_or(0) >= this.per_address {
                return Err(Full::Address(this.per_address));
            }
        }
        held.all += 1;
        let known = match caller {
            Caller::Known(k) => {
                *held.callers.entry(k.clone()).or_insert(0) += 1;
                Some(k.clone())
            }
            Caller::Unknown => {
                held.unknown += 1;
                None
            }
            Caller::Anyone => None,
        };
        if let Some(ip) = ip {
            *held.addresses.entry(ip).or_insert(0) += 1;
        }
        Ok(Place {
            places: this.clone(),
            caller: known,
            unknown: matches!(caller, Caller::Unknown),
            ip,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.places.held.lock().unwrap_or_else(|p| p.into_inner());
        held.all = held.all.saturating_sub(1);
        if self.unknown {
            held.unknown = held.unknown.saturating_sub(1);
        }
        if let Some(k) = self.caller.take() {
            release(&mut held.callers, &k);
        }
        if let Some(ip) = self.ip {
            release(&mut held.addresses, &ip);
        }
    }
}

/// One count of `k` given back; a count of zero is forgotten.
fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, k: &K) {
    if let Some(n) = counts.get_mut(k) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(k);
        }
    }
}

/// Refusals for want of a place are logged at most this often.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// The bytes of batch answers each caller's batches hold at once, together: at most `per`.
pub struct AnswerBudgets {
    per: usize,
    used: Mutex<HashMap<Party, usize>>,
}

impl AnswerBudgets {
    pub fn new(per: usize) -> AnswerBudgets {
        AnswerBudgets {
            per,
            used: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Party, usize>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Set aside `bytes` for a batch of `party`'s: what the batch holds, or (when the
    /// party's batches hold too much already to make room) how much they hold.
    pub fn take(self: &Arc<Self>, party: &Party, bytes: usize) -> Result<AnswerShare, usize> {
        let mut used = self.lock();
        let mine = used.get(party).copied().unwrap_or(0);
        if mine + bytes > self.per {
            return Err(mine);
        }
        used.insert(party.clone(), mine + bytes);
        Ok(AnswerShare {
            budgets: self.clone(),
            party: party.clone(),
            bytes,
        })
    }

    /// What `party`'s batches hold now.
    pub fn used(&self, party: &Party) -> usize {
        self.lock().get(party).copied().unwrap_or(0)
    }
}

/// What one batch holds of its caller's budget; given back when dropped (once its
/// answer is written).
pub struct AnswerShare {
    budgets: Arc<AnswerBudgets>,
    party: Party,
    bytes: usize,
}

impl AnswerShare {
    /// What the caller's budget has free, beyond what this batch holds.
    pub fn free(&self) -> usize {
        self.budgets
            .per
            .saturating_sub(self.budgets.used(&self.party))
    }

    /// This batch holds `bytes` now (more, within [`AnswerShare::free`], or less).
    pub fn set(&mut self, bytes: usize) {
        let mut used = self.budgets.lock();
        let mine = used.entry(self.party.clone()).or_default();
        *mine = (*mine + bytes).saturating_sub(self.bytes);
        self.bytes = bytes;
    }

    /// What this batch holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for AnswerShare {
    fn drop(&mut self) {
        let mut used = self.budgets.lock();
        if let Some(mine) = used.get_mut(&self.party) {
            *mine = mine.saturating_sub(self.bytes);
            if *mine == 0 {
                used.remove(&self.party);
            }
        }
    }
}

/// Refusals, logged at most once every [`REFUSAL_LOG_EVERY`], each line saying how many
/// there were since the last: a caller refused in a loop cannot make the front spend its
/// time (or its log's room) on lines about it.
#[derive(Default)]
pub struct RefusalLog {
    state: Mutex<(Option<Instant>, usize)>,
}

impl RefusalLog {
    /// One more refusal; `line` makes the log line, given how many refusals it tells of.
    pub fn note(&self, line: impl FnOnce(usize) -> String) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.1 += 1;
        if st.0.is_some_and(|at| at.elapsed() < REFUSAL_LOG_EVERY) {
            return;
        }
        let n = std::mem::take(&mut st.1);
        st.0 = Some(Instant::now());
        drop(st);
        let text = line(n);
        log::warn!("{text}");
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

#[allow(clippy::unwrap_used)]
#[cfg(test)]
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
    fn a_callers_batches_share_one_answer_budget() {
        let b = Arc::new(AnswerBudgets::new(100));
        let (a, other) = (party("a"), party("b"));
        let mut first = b.take(&a, 60).expect("room");
        assert!(b.take(&a, 41).is_err(), "past the caller's budget");
        let second = b.take(&a, 40).expect("the rest");
        assert_eq!(first.free(), 0);
        // Another caller is not affected.
        let theirs = b.take(&other, 100).expect("its own budget");
        // A batch that used less gives the rest back at once.
        first.set(10);
        assert_eq!(b.used(&a), 50);
        assert_eq!(second.free(), 50);
        drop(first);
        drop(second);
        assert_eq!(b.used(&a), 0);
        assert!(
            b.lock().get(&a).is_none(),
            "nothing kept for a caller holding nothing"
        );
        drop(theirs);
        assert!(b.lock().is_empty());
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
    fn a_caller_over_its_share_waits_for_its_own_lease() {
        let s = Arc::new(Shares::new(1));
        let held = s.take(&party("a"), None).unwrap();
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.take(&party("a"), Some(Instant::now() + Duration::from_secs(60)))
                    .is_some()
            })
        };
        // Another caller's lease neither helps nor hinders it.
        wait_until_waiting(&s, &party("a"), 1);
        drop(s.take(&party("b"), None).unwrap());
        assert!(!waiter.is_finished());
        drop(held);
        assert!(waiter.join().unwrap());
        assert!(s.inner.state.lock().unwrap().parties.is_empty());
    }

    #[test]
    fn waiting_callers_are_served_in_turn() {
        let s = Arc::new(Shares::new(1));
        let held = s.take(&party("a"), None).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let (shares, order) = (s.clone(), order.clone());
            waiters.push(std::thread::spawn(move || {
                let share = shares
                    .take(&party("a"), Some(Instant::now() + Duration::from_secs(60)))
                    .unwrap();
                order.lock().unwrap().push(i);
                drop(share);
            }));
            // Each is in line before the next comes.
            wait_until_waiting(&s, &party("a"), i + 1);
        }
        drop(held);
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
        assert!(s.inner.state.lock().unwrap().parties.is_empty());
    }

    #[test]
    fn a_request_that_would_not_wait_does_not_pass_those_in_line() {
        let s = Arc::new(Shares::new(1));
        let held = s.take(&party("a"), None).unwrap();
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.take(&party("a"), Some(Instant::now() + Duration::from_secs(60)))
                    .is_some()
            })
        };
        wait_until_waiting(&s, &party("a"), 1);
        // The lease ends without the one in line being told yet: a request that came
        // now, not waiting, is still refused (the one in line goes first).
        std::mem::forget(held);
        s.inner
            .state
            .lock()
            .unwrap()
            .parties
            .get_mut(&party("a"))
            .unwrap()
            .held = 0;
        assert!(s.take(&party("a"), None).is_none());
        s.inner.cv.notify_all();
        assert!(waiter.join().unwrap());
        assert!(s.inner.state.lock().unwrap().parties.is_empty());
    }

    #[test]
    fn a_wait_that_ends_in_vain_leaves_the_line() {
        let s = Arc::new(Shares::new(1));
        let held = s.take(&party("a"), None).unwrap();
        // The first in line gives up; the one behind it is served once a lease ends.
        let first = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.take(
                    &party("a"),
                    Some(Instant::now() + Duration::from_millis(100)),
                )
                .is_some()
            })
        };
        wait_until_waiting(&s, &party("a"), 1);
        let second = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.take(&party("a"), Some(Instant::now() + Duration::from_secs(60)))
                    .is_some()
            })
        };
        assert!(!first.join().unwrap());
        drop(held);
        assert!(second.join().unwrap());
        assert!(s.inner.state.lock().unwrap().parties.is_empty());
    }

    #[test]
    fn a_request_whose_client_hung_up_leaves_the_line() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let s = Arc::new(Shares::new(1));
        let held = s.take(&party("a"), None).unwrap();
        let hung_up = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (s, hung_up) = (s.clone(), hung_up.clone());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let got = s.take_unless(
                    &party("a"),
                    Some(Instant::now() + Duration::from_secs(60)),
                    &|| hung_up.load(Ordering::Acquire),
                );
                (got.is_some(), t0.elapsed())
            })
        };
        wait_until_waiting(&s, &party("a"), 1);
        hung_up.store(true, Ordering::Release);
        let (got, waited) = waiter.join().unwrap();
        assert!(!got);
        assert!(waited < Duration::from_secs(30), "{waited:?}");
        drop(held);
        assert!(s.inner.state.lock().unwrap().parties.is_empty());
    }

    /// Wait until `n` of `who`'s requests are in line.
    fn wait_until_waiting(s: &Shares, who: &Party, n: usize) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting = s
                .inner
                .state
                .lock()
                .unwrap()
                .parties
                .get(who)
                .map_or(0, |p| p.waiting.len());
            if waiting == n {
                return;
            }
            assert!(Instant::now() < until, "{waiting} waiting, not {n}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn places_are_capped_per_caller_per_address_and_in_all_and_given_back() {
        let p = std::sync::Arc::new(Places::new(2, 3, 7, 2));
        let (ip1, ip2, ip3): (IpAddr, IpAddr, IpAddr) = (
            [127, 0, 0, 1].into(),
            [127, 0, 0, 2].into(),
            [127, 0, 0, 3].into(),
        );
        let (a, b) = (party("a"), party("b"));
        // One caller from two addresses: its share, whichever address.
        let a1 = Places::take(&p, Caller::Known(&a), Some(ip1)).unwrap();
        let _a2 = Places::take(&p, Caller::Known(&a), Some(ip2)).unwrap();
        assert_eq!(
            Places::take(&p, Caller::Known(&a), Some(ip3)).err(),
            Some(Full::Caller(2))
        );
        // One address, many callers (or none): its share.
        let _b = Places::take(&p, Caller::Known(&b), Some(ip1)).unwrap();
        let _n = Places::take(&p, Caller::Anyone, Some(ip1)).unwrap();
        assert_eq!(
            Places::take(&p, Caller::Unknown, Some(ip1)).err(),
            Some(Full::Address(3))
        );
        // Callers not known yet share a pool of their own.
        let _u1 = Places::take(&p, Caller::Unknown, Some(ip3)).unwrap();
        let _u2 = Places::take(&p, Caller::Unknown, Some(ip3)).unwrap();
        assert_eq!(
            Places::take(&p, Caller::Unknown, None).err(),
            Some(Full::Unknown(2))
        );
        // In all.
        let _d = Places::take(&p, Caller::Known(&party("d")), None).unwrap();
        assert_eq!(
            Places::take(&p, Caller::Known(&party("e")), None).err(),
            Some(Full::All(7))
        );
        // Given back.
        drop(a1);
        let _a3 = Places::take(&p, Caller::Known(&a), Some(ip3)).unwrap();
        assert_eq!(p.held.lock().unwrap().all, 7);
        let (st, code, _) = Full::All(7).refusal();
        assert_eq!((st, code), (503, "unavailable"));
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_second_with_their_count() {
        let log = RefusalLog::default();
        let mut lines = Vec::new();
        for _ in 0..3 {
            log.note(|n| {
                lines.push(n);
                String::new()
            });
        }
        assert_eq!(lines, [1]);
        log.state.lock().unwrap().0 = Some(Instant::now() - REFUSAL_LOG_EVERY);
        log.note(|n| {
            lines.push(n);
            String::new()
        });
        assert_eq!(lines, [1, 3]);
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
