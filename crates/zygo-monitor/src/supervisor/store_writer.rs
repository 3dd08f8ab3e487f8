//! The script and blob stores' file writes, on a thread of their own: a new entry's bytes
//! (up to 16 MiB) go to a temporary file, which is synced, renamed to its digest, and its
//! folder synced. That can take a while on a busy disk, and the event loop serves every
//! tenant's calls meanwhile. The loop reserves the entry's room first (see
//! `scripts::Store::put`), hands the bytes over, and answers the caller once the writer
//! says they are durable; the writer wakes the loop for that.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::Waker;

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
}

/// A write done: whether the bytes are durable, or why not.
pub struct Written {
    pub which: Which,
    pub digest: String,
    pub result: Result<(), String>,
}

pub struct Writer {
    tx: Option<Sender<Write>>,
    rx: Receiver<Written>,
    handle: Option<JoinHandle<()>>,
}

impl Writer {
    pub fn start(waker: Arc<Waker>) -> std::io::Result<Writer> {
        let (tx, jobs) = channel::<Write>();
        let (done, rx) = channel::<Written>();
        let handle = std::thread::Builder::new()
            .name("store-writes".into())
            .spawn(move || {
                for w in jobs {
                    let result = write_file(&w.dir, &w.digest, &w.bytes).map_err(|e| e.to_string());
                    let written = Written {
                        which: w.which,
                        digest: w.digest,
                        result,
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
            tx: Some(tx),
            rx,
            handle: Some(handle),
        })
    }

    /// Hand a write over. Should the thread be gone, the write is done here (the caller
    /// still gets its answer, only later).
    pub fn send(&self, w: Write) -> Option<Written> {
        let w = match &self.tx {
            Some(tx) => match tx.send(w) {
                Ok(()) => return None,
                Err(std::sync::mpsc::SendError(w)) => w,
            },
            None => w,
        };
        log::error!("the store writer is gone: writing on the event loop");
        let result = write_file(&w.dir, &w.digest, &w.bytes).map_err(|e| e.to_string());
        Some(Written {
            which: w.which,
            digest: w.digest,
            result,
        })
    }

    /// The writes done since the last call.
    pub fn done(&self) -> Vec<Written> {
        self.rx.try_iter().collect()
    }

    /// Let the writer finish what it was given, and wait for it.
    pub fn finish(&mut self) {
        self.tx = None;
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
