//! What the filter may hold for its sandbox: the buffers of the connections it relays,
//! within a share of the sandbox's memory limit.
//!
//! The filter is not in the sandbox's memory cgroup, so nothing the kernel counts for the
//! sandbox covers what its relays hold: the receive and send queues of the accepted socket
//! inside the sandbox's network namespace and of the socket it opened outside, and the
//! bytes between them (a pipe, or the filter's own buffer when it reads what passes).
//! Left to autotuning, an outside socket grows to the host's `tcp_rmem` maximum (6 to 32
//! MiB), so a program that opens downloads and never reads them made the host hold tens
//! of MiB per connection. Instead every socket's buffers are set explicitly
//! (`SO_RCVBUF`, `SO_SNDBUF`, which also turns autotuning off), and the sum is kept
//! within [`SHARE`] of the sandbox's memory limit:
//!
//! - the accepted sockets get [`INSIDE_BUF`] each way (the sandbox's loopback needs little);
//! - each connection is granted its outside socket's buffers from the [`Pool`] when it is
//!   accepted, and gives them back when both its sockets are closed. A grant is charged as
//!   the most the connection can hold ([`cost`]); the pool grants only while the charges
//!   stay within its total, so the sum of what every relay holds stays within it too;
//! - the pool keeps the smallest charge ([`MIN_BUF`] outside) for every place it has, and
//!   gives each new connection up to half of what is left beyond that (at most
//!   [`MAX_BUF`] each way), so the first connections of a sandbox get larger windows (a
//!   download from far away needs one) without taking the places of later ones.
//!
//! The kernel doubles what `SO_RCVBUF` and `SO_SNDBUF` are set to (the doubled value is
//! what the socket may hold, bookkeeping included), and caps the setting at
//! `net.core.rmem_max` / `wmem_max`: the charges here are of the doubled values, read back
//! from the socket, so a host with small maxima gets its unused share back.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The filter's buffers for a sandbox stay within its memory limit divided by this: a
/// quarter, the share cgroup v1 gives the sandbox's own sockets.
pub const SHARE: u64 = 4;
/// The total for a sandbox without a memory limit (only an operator's sandbox.toml can ask
/// for one).
pub const UNLIMITED_TOTAL: u64 = 256 * MIB;
/// `SO_RCVBUF` and `SO_SNDBUF` of the sockets accepted inside the sandbox (the kernel
/// doubles them).
pub const INSIDE_BUF: u64 = 64 * KIB;
/// The smallest and the largest `SO_RCVBUF` and `SO_SNDBUF` of a connection's outside
/// socket (the kernel doubles them).
pub const MIN_BUF: u64 = 32 * KIB;
pub const MAX_BUF: u64 = 2 * MIB;
/// What a socket may hold beyond its buffer size: the kernel lets a queue take the packet
/// that fills it (on loopback and a veth, up to 64 KiB: a send queue was seen 29 KiB past
/// its size), and charges memory in whole pages.
pub const SLACK: u64 = 64 * KIB;
/// The most one direction of a relay holds between its two sockets: its pipe (64 KiB), or
/// the buffers the filter reads a cleartext HTTP connection's requests into.
pub const HOLD: u64 = 128 * KIB;
/// The most connections one filter relays at once, whatever the memory limit.
pub const MAX_PLACES: usize = 64;
/// The fewest places a filter has, when its total holds that many at their smallest.
pub const MIN_PLACES: usize = 16;

/// The most a connection can make the filter hold, given its outside socket's receive and
/// send buffers as the kernel reports them (already doubled): both inside buffers and
/// both outside ones, each with [`SLACK`], and what each direction holds between them.
pub fn cost(outside_rcv: u64, outside_snd: u64) -> u64 {
    2 * (2 * INSIDE_BUF + SLACK) + (outside_rcv + SLACK) + (outside_snd + SLACK) + 2 * HOLD
}

/// [`cost`] of a connection whose outside socket was given `buf` each way.
pub fn cost_of_buf(buf: u64) -> u64 {
    cost(2 * buf, 2 * buf)
}

/// The total a filter may hold for a sandbox with this memory limit (`None`: unlimited):
/// [`SHARE`] of it, and never less than one connection's smallest charge.
pub fn total_for(mem: Option<u64>) -> u64 {
    mem.map_or(UNLIMITED_TOTAL, |m| m / SHARE)
        .max(cost_of_buf(MIN_BUF))
}

/// How many connections a pool of `total` relays at once: as many as half of it holds at
/// their smallest charge (so that the other half can give early connections larger
/// buffers), at least [`MIN_PLACES`] if the whole total holds that many, at most
/// [`MAX_PLACES`]; at least one.
pub fn places_for(total: u64) -> usize {
    let min = cost_of_buf(MIN_BUF);
    let all = usize::try_from(total / min).unwrap_or(usize::MAX);
    let half = usize::try_from(total / (2 * min)).unwrap_or(usize::MAX);
    half.clamp(MIN_PLACES, MAX_PLACES).min(all).max(1)
}

/// The buffers a sandbox's connections may hold, shared by the filter's threads.
#[derive(Debug)]
pub struct Pool {
    total: u64,
    places: usize,
    state: Mutex<State>,
    returned: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// The sum of the live grants' charges.
    used: u64,
    /// How many grants are live.
    held: usize,
    /// How many connections wait for a place ([`Ticket`]).
    waiting: usize,
}

impl Pool {
    /// The pool of a sandbox with this memory limit (`None`: unlimited).
    pub fn new(mem: Option<u64>) -> Arc<Pool> {
        let total = total_for(mem);
        Arc::new(Pool {
            total,
            places: places_for(total),
            state: Mutex::new(State::default()),
            returned: Condvar::new(),
        })
    }

    /// The most the filter holds for the sandbox, in bytes.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The most connections relayed at once.
    pub fn places(&self) -> usize {
        self.places
    }

    /// Grant a connection its buffers now, if a place is free that no waiting connection
    /// is owed ([`Pool::queue`]). The grant goes back to the pool when dropped.
    pub fn grant_now(self: &Arc<Self>) -> Option<Grant> {
        let mut s = self.lock();
        if s.held + s.waiting >= self.places {
            return None;
        }
        Some(self.take(&mut s))
    }

    /// Queue a connection for the next place given back (one whose relay was just ended to
    /// make room): from now on, no connection that did not wait is granted that place.
    pub fn queue(self: &Arc<Self>) -> Ticket {
        self.lock().waiting += 1;
        Ticket {
            pool: Arc::clone(self),
            served: false,
        }
    }

    /// The state. Nothing panics while holding it, so a poisoned lock's state is whole.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take a place; the caller holds the lock and has seen one free.
    fn take(self: &Arc<Self>, s: &mut State) -> Grant {
        let min = cost_of_buf(MIN_BUF);
        // Every other free place keeps its smallest charge; this connection may have up to
        // half of what is left beyond those.
        let others = (self.places - s.held - 1) as u64 * min;
        let free = self.total.saturating_sub(s.used).saturating_sub(others);
        let mut buf = MAX_BUF;
        while buf > MIN_BUF && cost_of_buf(buf) > free / 2 {
            buf /= 2;
        }
        let charge = cost_of_buf(buf);
        s.used += charge;
        s.held += 1;
        Grant {
            pool: Arc::clone(self),
            buf,
            charge,
        }
    }

    fn give_back(&self, charge: u64, place: bool) {
        {
            let mut s = self.lock();
            s.used = s.used.saturating_sub(charge);
            if place {
                s.held = s.held.saturating_sub(1);
            }
        }
        if place {
            self.returned.notify_all();
        }
    }

    /// What the live grants are charged, in all (for tests).
    pub fn used(&self) -> u64 {
        self.lock().used
    }
}

/// A connection's place in the queue for the next place given back.
#[derive(Debug)]
pub struct Ticket {
    pool: Arc<Pool>,
    /// The ticket was turned into a grant (and has left the queue).
    served: bool,
}

impl Ticket {
    /// The connection's grant, once a place is free, or `None` after `wait`.
    pub fn wait(mut self, wait: Duration) -> Option<Grant> {
        let pool = Arc::clone(&self.pool);
        let deadline = Instant::now() + wait;
        let mut s = pool.lock();
        while s.held >= pool.places {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            s = match pool.returned.wait_timeout(s, left) {
                Ok((s, _)) => s,
                Err(e) => e.into_inner().0,
            };
        }
        s.waiting = s.waiting.saturating_sub(1);
        self.served = true;
        Some(pool.take(&mut s))
    }
}

impl Drop for Ticket {
    /// Leaving the queue without a grant.
    fn drop(&mut self) {
        if !self.served {
            let mut s = self.pool.lock();
            s.waiting = s.waiting.saturating_sub(1);
        }
    }
}

/// One connection's share of the [`Pool`]: given back when dropped.
#[derive(Debug)]
pub struct Grant {
    pool: Arc<Pool>,
    buf: u64,
    charge: u64,
}

impl Grant {
    /// What to set the outside socket's `SO_RCVBUF` and `SO_SNDBUF` to.
    pub fn buf(&self) -> u64 {
        self.buf
    }

    /// The outside socket was given these (doubled) sizes: charge for them, and give back
    /// what the grant held beyond that. A grant never grows.
    pub fn settle(&mut self, outside_rcv: u64, outside_snd: u64) {
        let actual = cost(outside_rcv, outside_snd);
        if actual < self.charge {
            self.pool.give_back(self.charge - actual, false);
            self.charge = actual;
        }
    }

    /// What the grant is charged.
    pub fn charge(&self) -> u64 {
        self.charge
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.pool.give_back(self.charge, true);
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charges_never_pass_the_total_however_the_grants_come_and_go() {
        for mem in [
            None,
            Some(MIB),
            Some(16 * MIB),
            Some(64 * MIB),
            Some(256 * MIB),
        ] {
            let pool = Pool::new(mem);
            let mut live = Vec::new();
            // Fill every place, give some back, fill again.
            for round in 0..3 {
                while let Some(g) = pool.grant_now() {
                    assert!(g.buf() >= MIN_BUF && g.buf() <= MAX_BUF);
                    live.push(g);
                    assert!(pool.used() <= pool.total(), "{mem:?} round {round}");
                }
                assert_eq!(live.len(), pool.places(), "{mem:?}");
                let keep = live.len() / 3;
                live.truncate(keep);
            }
            drop(live);
            assert_eq!(pool.used(), 0);
        }
    }

    #[test]
    fn the_places_and_the_first_buffers_follow_the_memory_limit() {
        let p = |mem: u64| Pool::new(Some(mem * MIB));
        // A quarter of 64 MiB holds 18 connections at their smallest: 16 places, and room
        // beyond them for a larger first grant.
        let small = p(64);
        assert_eq!(small.total(), 16 * MIB);
        assert_eq!(small.places(), 16);
        assert!(small.grant_now().unwrap().buf() > MIN_BUF);
        // The default (256 MiB): 36 places, the first connection at the largest buffers.
        let default = p(256);
        assert_eq!(default.places(), 36);
        assert_eq!(default.grant_now().unwrap().buf(), MAX_BUF);
        assert_eq!(p(1024).places(), MAX_PLACES);
        // Too small for 16 at their smallest: as many as fit, at least one.
        assert_eq!(p(16).places(), 4);
        let tiny = p(1);
        assert_eq!(tiny.places(), 1);
        assert_eq!(tiny.total(), cost_of_buf(MIN_BUF));
        let g = tiny.grant_now().unwrap();
        assert_eq!(g.buf(), MIN_BUF);
        assert!(tiny.grant_now().is_none());
        drop(g);
        assert!(tiny.grant_now().is_some());
    }

    #[test]
    fn a_grant_settles_for_what_the_kernel_gave() {
        let pool = Pool::new(Some(256 * MIB));
        let mut g = pool.grant_now().unwrap();
        let before = pool.used();
        // A host whose rmem_max and wmem_max are 208 KiB: the kernel gave twice that.
        g.settle(416 * KIB, 416 * KIB);
        assert_eq!(g.charge(), cost(416 * KIB, 416 * KIB));
        assert_eq!(pool.used(), before - (cost_of_buf(MAX_BUF) - g.charge()));
        // Never more than granted.
        g.settle(64 * MIB, 64 * MIB);
        assert_eq!(g.charge(), cost(416 * KIB, 416 * KIB));
        drop(g);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn a_place_given_back_goes_to_the_connection_that_waits_for_it() {
        let pool = Pool::new(Some(MIB));
        let g = pool.grant_now().unwrap();
        let ticket = pool.queue();
        let waiter = std::thread::spawn(move || ticket.wait(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(50));
        drop(g);
        // Not to a connection that comes after it without waiting.
        assert!(pool.grant_now().is_none());
        let got = waiter.join().unwrap();
        assert!(got.is_some());
        assert!(pool.grant_now().is_none());
        drop(got);
        assert!(pool.grant_now().is_some());
        // A ticket that times out leaves the queue.
        let g = pool.grant_now().unwrap();
        assert!(pool.queue().wait(Duration::ZERO).is_none());
        drop(g);
        assert!(pool.grant_now().is_some());
    }
}
