//! A line of jobs where holders take turns: the threads beside the event loop (the checker
//! of large events, the store writer) take one job of each holder that has some waiting,
//! round and round, so one tenant's queue of large jobs delays another tenant's job by at
//! most one job of its own.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Who a job is done for: a tenant, or the host (`None`).
pub type Holder = Option<String>;

/// Jobs waiting, by holder, and the holders' turns.
pub struct Turns<J> {
    waiting: HashMap<Holder, VecDeque<(u64, J)>>,
    /// Holders with jobs waiting, in the order of their next turn.
    order: VecDeque<Holder>,
    /// No more jobs are taken: the thread ends once the line is empty.
    closed: bool,
}

impl<J> Default for Turns<J> {
    fn default() -> Self {
        Turns {
            waiting: HashMap::new(),
            order: VecDeque::new(),
            closed: false,
        }
    }
}

impl<J> Turns<J> {
    /// Queue `job` (named by `ticket`) behind `holder`'s others.
    pub fn push(&mut self, holder: Holder, ticket: u64, job: J) {
        let q = self.waiting.entry(holder.clone()).or_default();
        if q.is_empty() {
            self.order.push_back(holder);
        }
        q.push_back((ticket, job));
    }

    /// The next holder's first job; the holder goes to the back of the line if it has
    /// more.
    pub fn next(&mut self) -> Option<(u64, J)> {
        let holder = self.order.pop_front()?;
        let q = self.waiting.get_mut(&holder)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.waiting.remove(&holder);
        } else {
            self.order.push_back(holder);
        }
        job
    }

    /// Take back a waiting job: whether it was still waiting.
    pub fn withdraw(&mut self, holder: &Holder, ticket: u64) -> bool {
        let Some(q) = self.waiting.get_mut(holder) else {
            return false;
        };
        let Some(i) = q.iter().position(|(t, _)| *t == ticket) else {
            return false;
        };
        q.remove(i);
        if q.is_empty() {
            self.waiting.remove(holder);
            self.order.retain(|h| h != holder);
        }
        true
    }

    /// Drop every waiting job.
    pub fn clear(&mut self) {
        self.waiting.clear();
        self.order.clear();
    }
}

/// A line shared by the loop, which pushes, and one thread, which takes.
pub struct Shared<J> {
    line: Mutex<Turns<J>>,
    ready: Condvar,
}

impl<J> Default for Shared<J> {
    fn default() -> Self {
        Shared {
            line: Mutex::new(Turns::default()),
            ready: Condvar::new(),
        }
    }
}

impl<J> Shared<J> {
    /// A lock poisoned by a panic still guards a valid line.
    pub fn lock(&self) -> MutexGuard<'_, Turns<J>> {
        self.line.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue a job and wake the thread.
    pub fn push(&self, holder: Holder, ticket: u64, job: J) {
        self.lock().push(holder, ticket, job);
        self.ready.notify_one();
    }

    /// No more jobs: the thread takes what is waiting (unless `drop_waiting`), then ends.
    pub fn close(&self, drop_waiting: bool) {
        {
            let mut line = self.lock();
            line.closed = true;
            if drop_waiting {
                line.clear();
            }
        }
        self.ready.notify_all();
    }

    /// For the thread: the next job in turn, waiting for one; `None` once the line is
    /// closed and empty.
    pub fn take(&self) -> Option<(u64, J)> {
        let mut line = self.lock();
        loop {
            if let Some(job) = line.next() {
                return Some(job);
            }
            if line.closed {
                return None;
            }
            line = self.ready.wait(line).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_take_turns() {
        let mut line = Turns::default();
        let a = Some("a".to_string());
        let b = Some("b".to_string());
        for t in 1..=3 {
            line.push(a.clone(), t, ());
        }
        line.push(b.clone(), 10, ());
        line.push(None, 20, ());
        line.push(b.clone(), 11, ());
        let order: Vec<u64> = std::iter::from_fn(|| line.next().map(|(t, _)| t)).collect();
        assert_eq!(order, [1, 10, 20, 2, 11, 3]);
        assert!(line.waiting.is_empty() && line.order.is_empty());
    }

    #[test]
    fn a_withdrawn_job_is_not_taken() {
        let mut line = Turns::default();
        let a = Some("a".to_string());
        line.push(a.clone(), 1, ());
        line.push(None, 2, ());
        assert!(line.withdraw(&a, 1));
        assert!(!line.withdraw(&a, 1));
        assert!(!line.withdraw(&None, 1));
        let order: Vec<u64> = std::iter::from_fn(|| line.next().map(|(t, _)| t)).collect();
        assert_eq!(order, [2]);
    }

    #[test]
    fn a_closed_line_is_emptied_then_ends() {
        let s = Shared::default();
        s.push(None, 1, "one");
        s.push(Some("a".into()), 2, "two");
        s.close(false);
        assert_eq!(s.take(), Some((1, "one")));
        assert_eq!(s.take(), Some((2, "two")));
        assert_eq!(s.take(), None);
        let s = Shared::default();
        s.push(None, 1, "one");
        s.close(true);
        assert_eq!(s.take(), None);
    }
}
