//! Large events are checked off the event loop. A call's event is checked (one JSON
//! value, strictly) and made one line before it goes to a sandbox; for an event of a few
//! megabytes that takes tens of milliseconds, and on the loop every other tenant's
//! requests would wait for it. An event of up to [`ON_LOOP`] bytes is still checked on
//! the loop (no hand-over for the common small call); a larger one goes to one checker
//! thread, and its call goes on, exactly as it would have, when the checker wakes the
//! loop with the result ([`Checker::done`]).
//!
//! The checker takes its callers in turn ([`Line`]): one event of each holder (a tenant,
//! or the host) that has some waiting, round and round, so one tenant's queue of large
//! events delays another's by at most one event of its own. What waits is bounded: each
//! holder may have [`QUEUE_PER_HOLDER`] bytes handed over and not yet checked, and all
//! together [`QUEUE_TOTAL`]; a call past that is refused `busy`, to retry shortly.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use mio::Waker;

/// Events up to this many bytes are checked on the loop: a fraction of a millisecond.
pub const ON_LOOP: usize = 64 * 1024;

/// The most bytes of one holder's events waiting for the checker.
pub const QUEUE_PER_HOLDER: usize = 64 << 20;

/// The most bytes of events waiting for the checker, all holders together.
pub const QUEUE_TOTAL: usize = 192 << 20;

/// The checker's nice value: below the loop, which serves every caller's small requests.
const CHECKER_NICE: libc::c_int = 5;

/// Who an event is held for: a tenant, or the host (`None`).
pub type Holder = Option<String>;

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

/// An event checked: its ticket and what [`check`] said.
pub struct Checked {
    pub ticket: u64,
    pub result: Result<String, String>,
}

struct Job {
    ticket: u64,
    event: String,
}

/// The events waiting for the checker, by holder, and the holders' turns.
#[derive(Default)]
struct Line {
    waiting: HashMap<Holder, VecDeque<Job>>,
    /// Holders with events waiting, in the order of their next turn.
    turns: VecDeque<Holder>,
    stop: bool,
}

impl Line {
    fn push(&mut self, holder: Holder, job: Job) {
        let q = self.waiting.entry(holder.clone()).or_default();
        if q.is_empty() {
            self.turns.push_back(holder);
        }
        q.push_back(job);
    }

    /// The next holder's first event; the holder goes to the back of the line if it has
    /// more.
    fn next(&mut self) -> Option<Job> {
        let holder = self.turns.pop_front()?;
        let q = self.waiting.get_mut(&holder)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.waiting.remove(&holder);
        } else {
            self.turns.push_back(holder);
        }
        job
    }

    /// Take back a waiting event: whether it was still waiting.
    fn withdraw(&mut self, holder: &Holder, ticket: u64) -> bool {
        let Some(q) = self.waiting.get_mut(holder) else {
            return false;
        };
        let Some(i) = q.iter().position(|j| j.ticket == ticket) else {
            return false;
        };
        q.remove(i);
        if q.is_empty() {
            self.waiting.remove(holder);
            self.turns.retain(|h| h != holder);
        }
        true
    }
}

#[derive(Default)]
struct Shared {
    line: Mutex<Line>,
    ready: Condvar,
}

impl Shared {
    /// A lock poisoned by a panic still guards a valid line.
    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(|e| e.into_inner())
    }
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
                "{mine} bytes of this caller's events are still being checked (at most \
                 {} MiB wait at once); retry shortly",
                QUEUE_PER_HOLDER >> 20
            ));
        }
        if self.total > 0 && self.total + bytes > QUEUE_TOTAL {
            return Err(format!(
                "{} bytes of events are being checked already (at most {} MiB wait at \
                 once); retry shortly",
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
    shared: Arc<Shared>,
    rx: Receiver<Checked>,
    handle: Option<JoinHandle<()>>,
    counted: Counted,
    tickets: u64,
}

impl Checker {
    pub fn start(waker: Arc<Waker>) -> std::io::Result<Checker> {
        let shared = Arc::new(Shared::default());
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

    /// Hand `event` of `holder`'s over: its ticket, or why it cannot wait now (the words
    /// of a `busy`).
    pub fn send(&mut self, holder: Holder, event: String) -> Result<u64, String> {
        self.counted.room(&holder, event.len())?;
        if self.handle.is_none() {
            return Err("the supervisor is stopping".into());
        }
        self.tickets += 1;
        let ticket = self.tickets;
        self.counted.add(ticket, holder.clone(), event.len());
        self.shared.lock().push(holder, Job { ticket, event });
        self.shared.ready.notify_one();
        Ok(ticket)
    }

    /// Nobody waits for this event any more: it is taken back if it has not been begun
    /// (`true`), else its result is to be dropped when it comes.
    pub fn withdraw(&mut self, holder: &Holder, ticket: u64) -> bool {
        let taken = self.shared.lock().withdraw(holder, ticket);
        if taken {
            self.counted.done(ticket);
        }
        taken
    }

    /// The events checked since the last call.
    pub fn done(&mut self) -> Vec<Checked> {
        let done: Vec<Checked> = self.rx.try_iter().collect();
        for c in &done {
            self.counted.done(c.ticket);
        }
        done
    }

    /// Stop: events not begun are dropped (their callers are answered by whoever handed
    /// them over), the one being checked is finished, and the thread waited for.
    pub fn finish(&mut self) {
        {
            let mut line = self.shared.lock();
            line.stop = true;
            line.waiting.clear();
            line.turns.clear();
        }
        self.shared.ready.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        let _ = self.done();
    }
}

/// The checker thread: the next event in turn, checked, handed back, the loop woken.
fn work(shared: &Shared, done: &Sender<Checked>, waker: &Waker) {
    // Below the event loop: on a small machine this thread competes with it for a CPU,
    // and the loop's work is every caller's.
    // SAFETY: gettid and setpriority on this thread; failure leaves it as is.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, CHECKER_NICE);
    }
    loop {
        let job = {
            let mut line = shared.lock();
            loop {
                if line.stop {
                    return;
                }
                if let Some(job) = line.next() {
                    break job;
                }
                line = shared.ready.wait(line).unwrap_or_else(|e| e.into_inner());
            }
        };
        let checked = Checked {
            ticket: job.ticket,
            result: check(job.event),
        };
        if done.send(checked).is_err() {
            return;
        }
        if let Err(e) = waker.wake() {
            log::warn!("wake the supervisor after checking an event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(ticket: u64) -> Job {
        Job {
            ticket,
            event: String::new(),
        }
    }

    #[test]
    fn holders_take_turns() {
        let mut line = Line::default();
        let a = Some("a".to_string());
        let b = Some("b".to_string());
        for t in 1..=3 {
            line.push(a.clone(), job(t));
        }
        line.push(b.clone(), job(10));
        line.push(None, job(20));
        line.push(b.clone(), job(11));
        let order: Vec<u64> = std::iter::from_fn(|| line.next().map(|j| j.ticket)).collect();
        assert_eq!(order, [1, 10, 20, 2, 11, 3]);
        assert!(line.waiting.is_empty() && line.turns.is_empty());
    }

    #[test]
    fn a_withdrawn_event_is_not_checked() {
        let mut line = Line::default();
        let a = Some("a".to_string());
        line.push(a.clone(), job(1));
        line.push(None, job(2));
        assert!(line.withdraw(&a, 1));
        assert!(!line.withdraw(&a, 1));
        assert!(!line.withdraw(&None, 1));
        let order: Vec<u64> = std::iter::from_fn(|| line.next().map(|j| j.ticket)).collect();
        assert_eq!(order, [2]);
    }

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
