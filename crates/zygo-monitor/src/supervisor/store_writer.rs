//! The script and blob stores' file writes, on a thread of their own: a new entry's bytes
//! (up to 16 MiB) go to a temporary file, which is synced, renamed to its digest, and its
//! folder synced. That can take a while on a busy disk, and the event loop serves every
//! tenant's calls meanwhile. The loop reserves the entry's room first (see
//! `scripts::Store::put`), hands the bytes over, and answers the caller once the writer
//! says they are durable; the writer wakes the loop for that.
//!
//! A tenant's put of bytes the store holds already for others (or is writing for others)
//! goes through the writer too, as an echo: the same bytes written to a temporary file,
//! synced, removed, and the folder synced. Its answer then takes as long as a new entry's,
//! so how fast a put is answered does not tell whether anyone else holds those bytes.
//!
//! The writer takes its holders in turn ([`crate::supervisor::turns`]): one write of each
//! holder (a tenant, or the host) that has some waiting, round and round, so one tenant's
//! queue of large puts delays another's put by at most one write of its own.
//!
//! What waits for the writer is bounded ([`Queued`]): each holder may have at most
//! [`QUEUE_PER_HOLDER`] bytes handed over and not yet written, and all together
//! [`QUEUE_TOTAL`]; a put past that is refused `busy`, to retry shortly.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::Waker;

use crate::supervisor::turns::{Holder, Shared};

/// Which store a write is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Which {
    Scripts,
    Blobs,
}

/// Bytes to be stored under their digest in `dir`.
pub struct Write {
    pub which: Which,
    pub dir: PathBuf,
    pub digest: String,
    pub bytes: Vec<u8>,
    /// Names this write among those handed over (set by whoever hands it over).
    pub ticket: u64,
    /// The store holds these bytes already: they are written to a temporary file that is
    /// synced and removed, for the time it takes (see the module's notes).
    pub echo: bool,
}

/// A write done: whether the bytes are durable, or why not.
pub struct Written {
    pub which: Which,
    pub digest: String,
    pub result: Result<(), String>,
    pub ticket: u64,
    pub echo: bool,
}

/// The most bytes one holder (a tenant, or the host) may have waiting for the writer.
pub const QUEUE_PER_HOLDER: u64 = 64 << 20;
/// A write taking this long is logged (the writes after it wait).
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_secs(5);

/// The most bytes waiting for the writer, all holders together.
pub const QUEUE_TOTAL: u64 = 256 << 20;

/// Bytes handed to the writer and not written yet, by holder (`None`: the host) and in all.
#[derive(Default)]
pub struct Queued {
    by: std::collections::HashMap<Option<String>, u64>,
    total: u64,
    tickets: std::collections::HashMap<u64, (Option<String>, u64)>,
}

impl Queued {
    /// Whether `bytes` more of `who`'s may wait for the writer: `Err` says why not.
    pub fn room(&self, who: Option<&str>, bytes: u64) -> Result<(), String> {
        let mine = self.by.get(&who.map(str::to_string)).copied().unwrap_or(0);
        if mine > 0 && mine + bytes > QUEUE_PER_HOLDER {
            return Err(format!(
                "{mine} bytes of this caller's are still being written (at most {QUEUE_PER_HOLDER} wait at once); retry shortly"
            ));
        }
        if self.total > 0 && self.total + bytes > QUEUE_TOTAL {
            return Err(format!(
                "the store is writing {} bytes already (at most {QUEUE_TOTAL} wait at once); retry shortly",
                self.total
            ));
        }
        Ok(())
    }

    /// A write of `who`'s handed over.
    pub fn add(&mut self, ticket: u64, who: Option<&str>, bytes: u64) {
        let who = who.map(str::to_string);
        *self.by.entry(who.clone()).or_default() += bytes;
        self.total += bytes;
        self.tickets.insert(ticket, (who, bytes));
    }

    /// Whether this write is still waiting for the writer.
    pub fn waiting(&self, ticket: u64) -> bool {
        self.tickets.contains_key(&ticket)
    }

    /// A write done.
    pub fn done(&mut self, ticket: u64) {
        let Some((who, bytes)) = self.tickets.remove(&ticket) else {
            return;
        };
        self.total = self.total.saturating_sub(bytes);
        if let Some(b) = self.by.get_mut(&who) {
            *b = b.saturating_sub(bytes);
            if *b == 0 {
                self.by.remove(&who);
            }
        }
    }
}

/// Do a write: the store's file, or an echo of it.
fn perform(w: &Write) -> Result<(), String> {
    if w.echo {
        echo_file(&w.dir, &w.digest, &w.bytes).map_err(|e| e.to_string())
    } else {
        write_file(&w.dir, &w.digest, &w.bytes).map_err(|e| e.to_string())
    }
}

pub struct Writer {
    shared: Arc<Shared<Write>>,
    rx: Receiver<Written>,
    handle: Option<JoinHandle<()>>,
}

impl Writer {
    pub fn start(waker: Arc<Waker>) -> std::io::Result<Writer> {
        let shared = Arc::new(Shared::<Write>::default());
        let jobs = shared.clone();
        let (done, rx) = channel::<Written>();
        let handle = std::thread::Builder::new()
            .name("store-writes".into())
            .spawn(move || {
                while let Some((_, w)) = jobs.take() {
                    let began = std::time::Instant::now();
                    let result = perform(&w);
                    let took = began.elapsed();
                    if took >= SLOW_WRITE {
                        log::warn!(
                            "store: writing {} ({} bytes) took {took:?}: the puts after it wait; is the disk of {} slow?",
                            w.digest,
                            w.bytes.len(),
                            w.dir.display()
                        );
                    }
                    let written = Written {
                        which: w.which,
                        digest: w.digest,
                        result,
                        ticket: w.ticket,
                        echo: w.echo,
                    };
                    if done.send(written).is_err() {
                        return;
                    }
                    if let Err(e) = waker.wake() {
                        log::warn!("wake the supervisor after a store write: {e}");
                    }
                }
            })?;
        Ok(Writer {
            shared,
            rx,
            handle: Some(handle),
        })
    }

    /// Hand a write of `holder`'s over. Should the thread be gone, the write is done here
    /// (the caller still gets its answer, only later).
    pub fn send(&self, w: Write, holder: Holder) -> Option<Written> {
        if self.handle.as_ref().is_some_and(|h| !h.is_finished()) {
            self.shared.push(holder, w.ticket, w);
            return None;
        }
        log::error!("the store writer is gone: writing on the event loop");
        let result = perform(&w);
        Some(Written {
            which: w.which,
            digest: w.digest,
            result,
            ticket: w.ticket,
            echo: w.echo,
        })
    }

    /// The writes done since the last call.
    pub fn done(&self) -> Vec<Written> {
        self.rx.try_iter().collect()
    }

    /// Let the writer finish what it was given, and wait for it.
    pub fn finish(&mut self) {
        self.shared.close(false);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Store `bytes` as `dir/digest`, crash-safe: a temporary file (created, never reused),
/// synced, renamed, and the folder synced. A failed write leaves no temporary file.
pub fn write_file(dir: &Path, digest: &str, bytes: &[u8]) -> std::io::Result<()> {
    let suffix = plumbing::random_hex(6)?;
    let tmp = dir.join(format!(".{digest}.{suffix}"));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(digest))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The work of [`write_file`] for bytes the store holds already, leaving nothing: a
/// temporary file written, synced and removed, and the folder synced. (Temporary files a
/// crash leaves are removed at start, as for writes.)
pub fn echo_file(dir: &Path, digest: &str, bytes: &[u8]) -> std::io::Result<()> {
    let suffix = plumbing::random_hex(6)?;
    let tmp = dir.join(format!(".{digest}.{suffix}"));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    let removed = std::fs::remove_file(&tmp);
    written?;
    removed?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_bounded_per_holder_and_in_all() {
        let mut q = Queued::default();
        // One write, however large, may always wait alone.
        assert!(q.room(Some("a"), QUEUE_PER_HOLDER + 1).is_ok());
        q.add(1, Some("a"), QUEUE_PER_HOLDER - 10);
        // a is at its bound; b and the host are not.
        assert!(q.room(Some("a"), 11).is_err());
        assert!(q.room(Some("a"), 10).is_ok());
        assert!(q.room(Some("b"), 16 << 20).is_ok());
        assert!(q.room(None, 16 << 20).is_ok());
        // All together.
        for (t, who) in [(2, "b"), (3, "c"), (4, "d")] {
            q.add(t, Some(who), QUEUE_PER_HOLDER - 10);
        }
        let e = q.room(Some("e"), 100).expect_err("past the total");
        assert!(e.contains("retry"), "{e}");
        // Written: room again.
        q.done(1);
        assert!(q.room(Some("a"), 16 << 20).is_ok());
        assert!(q.room(Some("e"), 100).is_ok());
        // A ticket counted once.
        q.done(1);
        assert_eq!(q.total, 3 * (QUEUE_PER_HOLDER - 10));
    }

    #[test]
    fn an_echo_costs_a_write_and_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!(
            "zygo-tests-echo-{}-{}",
            std::process::id(),
            plumbing::random_hex(4).expect("random")
        ));
        std::fs::create_dir(&dir).expect("a folder");
        write_file(&dir, "d", b"held").expect("write");
        echo_file(&dir, "d", b"held").expect("echo");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["d"]);
        assert_eq!(std::fs::read(dir.join("d")).expect("read"), b"held");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
