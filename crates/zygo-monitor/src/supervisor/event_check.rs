//! Large events are checked, and large puts hashed, off the event loop. A call's event is
//! checked (one JSON value, strictly) and made one line before it goes to a sandbox; a
//! script or blob put is named by its SHA-256. For a few megabytes either takes tens of
//! milliseconds, and on the loop every other tenant's requests would wait for it. Up to
//! [`ON_LOOP`] bytes are still done on the loop (no hand-over for the common small
//! request); more go to one checker thread, and the request goes on, exactly as it would
//! have, when the checker wakes the loop with the result ([`Checker::done`]).
//!
//! The checker takes its callers in turn ([`crate::supervisor::turns`]): one job of each
//! holder (a tenant, or the host) that has some waiting, round and round, so one tenant's
//! queue of large events or puts delays another's by at most one job of its own. What
//! waits is bounded: each holder may have [`QUEUE_PER_HOLDER`] bytes handed over and not
//! yet done, and all together [`QUEUE_TOTAL`]; a request past that is refused `busy`, to
//! retry shortly.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::Waker;

pub use crate::supervisor::turns::Holder;
use crate::supervisor::turns::Shared;

/// Events up to this many bytes are checked on the loop: a fraction of a millisecond.
pub const ON_LOOP: usize = 64 * 1024;

/// The most bytes of one holder's events waiting for the checker.
pub const QUEUE_PER_HOLDER: usize = 64 << 20;

/// The most bytes of events waiting for the checker, all holders together.
pub const QUEUE_TOTAL: usize = 192 << 20;

/// The checker's nice value: below the loop, which serves every caller's small requests.
const CHECKER_NICE: libc::c_int = 5;

/// Check `event` as one JSON value (strictly) and make it one line: the text for the
/// agent's protocol, or why not (the words of a `bad_request`).
pub fn check(event: String) -> Result<String, String> {
    let mut bytes = event.into_bytes();
    if let Err(err) = proto::json_scan::check_value(&bytes) {
        return Err(format!(
            "the event is not JSON: {} at byte {}",
            err.what, err.at
        ));
    }
    proto::json_scan::compact(&mut bytes);
    String::from_utf8(bytes).map_err(|_| "the event is not UTF-8".to_string())
}

/// The SHA-256 of `bytes`, in lowercase hex: the name of a script or blob.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the checker is asked to do.
pub enum Job {
    /// Check a call's event ([`check`]).
    Event(String),
    /// Name bytes put in a store ([`digest`]).
    Digest(Vec<u8>),
}

impl Job {
    fn len(&self) -> usize {
        match self {
            Job::Event(e) => e.len(),
            Job::Digest(b) => b.len(),
        }
    }
}

/// What the checker did.
pub enum Done {
    /// The event, checked and made one line, or why not (the words of a `bad_request`).
    Event(Result<String, String>),
    /// The bytes, and their digest.
    Digest { bytes: Vec<u8>, digest: String },
}

/// A job done: its ticket and the result.
pub struct Checked {
    pub ticket: u64,
    pub done: Done,
}

/// Bytes handed to the checker and not yet come back, by holder and in all (kept by the
/// loop: counted from the hand-over until the result is taken, or the event withdrawn).
#[derive(Default)]
struct Counted {
    by: HashMap<Holder, usize>,
    total: usize,
    tickets: HashMap<u64, (Holder, usize)>,
}

impl Counted {
    fn room(&self, holder: &Holder, bytes: usize) -> Result<(), String> {
        let mine = self.by.get(holder).copied().unwrap_or(0);
        if mine > 0 && mine + bytes > QUEUE_PER_HOLDER {
            return Err(format!(
                "{mine} bytes of this caller's events and puts are still being checked \
                 (at most {} MiB wait at once); retry shortly",
                QUEUE_PER_HOLDER >> 20
            ));
        }
        if self.total > 0 && self.total + bytes > QUEUE_TOTAL {
            return Err(format!(
                "{} bytes of events and puts are being checked already (at most {} MiB \
                 wait at once); retry shortly",
                self.total,
                QUEUE_TOTAL >> 20
            ));
        }
        Ok(())
    }

    fn add(&mut self, ticket: u64, holder: Holder, bytes: usize) {
        *self.by.entry(holder.clone()).or_default() += bytes;
        self.total += bytes;
        self.tickets.insert(ticket, (holder, bytes));
    }

    fn done(&mut self, ticket: u64) {
        let Some((holder, bytes)) = self.tickets.remove(&ticket) else {
            return;
        };
        self.total = self.total.saturating_sub(bytes);
        if let Some(b) = self.by.get_mut(&holder) {
            *b = b.saturating_sub(bytes);
            if *b == 0 {
                self.by.remove(&holder);
            }
        }
    }
}

pub struct Checker {
    shared: Arc<Shared<Job>>,
    rx: Receiver<Checked>,
    handle: Option<JoinHandle<()>>,
    counted: Counted,
    tickets: u64,
}

impl Checker {
    pub fn start(waker: Arc<Waker>) -> std::io::Result<Checker> {
        let shared = Arc::new(Shared::<Job>::default());
        let (done, rx) = channel::<Checked>();
        let theirs = shared.clone();
        let handle = std::thread::Builder::new()
            .name("event-check".into())
            .spawn(move || work(&theirs, &done, &waker))?;
        Ok(Checker {
            shared,
            rx,
            handle: Some(handle),
            counted: Counted::default(),
            tickets: 0,
        })
    }

    /// Hand a job of `holder`'s over: its ticket, or why it cannot wait now (the words of
    /// a `busy`).
    pub fn send(&mut self, holder: Holder, job: Job) -> Result<u64, String> {
        self.counted.room(&holder, job.len())?;
        if self.handle.is_none() {
            return Err("the supervisor is stopping".into());
        }
        self.tickets += 1;
        let ticket = self.tickets;
        self.counted.add(ticket, holder.clone(), job.len());
        self.shared.push(holder, ticket, job);
        Ok(ticket)
    }

    /// Nobody waits for this job any more: it is taken back if it has not been begun
    /// (`true`), else its result is to be dropped when it comes.
    pub fn withdraw(&mut self, holder: &Holder, ticket: u64) -> bool {
        let taken = self.shared.lock().withdraw(holder, ticket);
        if taken {
            self.counted.done(ticket);
        }
        taken
    }

    /// The jobs done since the last call.
    pub fn done(&mut self) -> Vec<Checked> {
        let done: Vec<Checked> = self.rx.try_iter().collect();
        for c in &done {
            self.counted.done(c.ticket);
        }
        done
    }

    /// Stop: jobs not begun are dropped (their callers are answered by whoever handed
    /// them over), the one being done is finished, and the thread waited for.
    pub fn finish(&mut self) {
        self.shared.close(true);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let _ = self.done();
    }
}

/// The checker thread: the next job in turn, done, handed back, the loop woken.
fn work(shared: &Shared<Job>, done: &Sender<Checked>, waker: &Waker) {
    // Below the event loop: on a small machine this thread competes with it for a CPU,
    // and the loop's work is every caller's.
    // SAFETY: gettid and setpriority on this thread; failure leaves it as is.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, CHECKER_NICE);
    }
    while let Some((ticket, job)) = shared.take() {
        let done_now = match job {
            Job::Event(event) => Done::Event(check(event)),
            Job::Digest(bytes) => Done::Digest {
                digest: digest(&bytes),
                bytes,
            },
        };
        if done
            .send(Checked {
                ticket,
                done: done_now,
            })
            .is_err()
        {
            return;
        }
        if let Err(e) = waker.wake() {
            log::warn!("wake the supervisor after a check: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_waits_is_bounded_per_holder_and_in_all() {
        let mut c = Counted::default();
        let a = Some("a".to_string());
        // One event, however large, may always wait alone.
        assert!(c.room(&a, QUEUE_PER_HOLDER + 1).is_ok());
        c.add(1, a.clone(), QUEUE_PER_HOLDER - 10);
        assert!(c.room(&a, 11).is_err());
        assert!(c.room(&a, 10).is_ok());
        assert!(c.room(&None, 16 << 20).is_ok());
        c.add(2, Some("b".into()), QUEUE_PER_HOLDER);
        c.add(3, Some("c".into()), QUEUE_PER_HOLDER);
        let e = c
            .room(&Some("d".into()), 16 << 20)
            .expect_err("past the total");
        assert!(e.contains("retry"), "{e}");
        c.done(1);
        c.done(1);
        assert!(c.room(&a, 16 << 20).is_ok());
        assert_eq!(c.total, 2 * QUEUE_PER_HOLDER);
    }

    #[test]
    fn a_digest_is_lowercase_hex_sha256() {
        assert_eq!(
            digest(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_words_are_those_of_the_loop() {
        assert_eq!(
            check(" [1, {\"a\": 2}]\n".into()).as_deref(),
            Ok("[1,{\"a\":2}]")
        );
        let e = check("{\"a\":1,\"a\":2}".into()).expect_err("a key twice");
        assert!(e.starts_with("the event is not JSON: "), "{e}");
        assert!(e.contains(" at byte "), "{e}");
    }
}
