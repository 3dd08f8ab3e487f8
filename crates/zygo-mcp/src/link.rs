//! The front's end of its channel to the monitor side: numbered calls out, replies routed
//! back to whoever waits for them.
//!
//! One thread reads replies; any number of request threads send calls. A call's number is
//! chosen here, so every number is used once. When the monitor side goes away (or sends a
//! frame that does not decode), every waiting call is told so and no new call is accepted.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use proto::mcp::{McpReply, McpRequest, MAX_MCP_FRAME};
use proto::{read_frame, write_frame, ProtoError};

/// Why a call could not be made or answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("the sandbox side of zygo mcp has stopped; restart the MCP server")]
    Gone,
    #[error("the request could not be sent to the sandbox side: {0}")]
    Send(String),
}

pub struct Link {
    tx: Mutex<UnixStream>,
    pending: Mutex<HashMap<u64, SyncSender<McpReply>>>,
    next: AtomicU64,
    alive: AtomicBool,
}

/// Lock a mutex, going on with its data if a thread panicked while holding it: every
/// structure behind these locks stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Link {
    /// Wrap a connected channel and start the thread that reads replies. `rx` and `tx` are
    /// the same socket (two handles, made with `try_clone` before confinement).
    pub fn start(tx: UnixStream, rx: UnixStream) -> Arc<Link> {
        let link = Arc::new(Link {
            tx: Mutex::new(tx),
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            alive: AtomicBool::new(true),
        });
        let reader = link.clone();
        std::thread::spawn(move || reader.read_replies(rx));
        link
    }

    fn read_replies(&self, mut rx: UnixStream) {
        loop {
            match read_frame::<_, McpReply>(&mut rx, MAX_MCP_FRAME) {
                Ok(reply) => {
                    let call = reply_call(&reply);
                    let waiter = lock(&self.pending).remove(&call);
                    match waiter {
                        Some(w) => {
                            let _ = w.send(reply);
                        }
                        None => log::debug!("a reply for call {call}, which nobody waits for"),
                    }
                }
                Err(ProtoError::Closed) => {
                    log::info!("the sandbox side closed the channel");
                    break;
                }
                Err(e) => {
                    log::error!("the channel to the sandbox side broke: {e}");
                    break;
                }
            }
        }
        self.alive.store(false, Ordering::SeqCst);
        // Dropping the senders wakes every waiter with "gone".
        lock(&self.pending).clear();
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Reserve the next call number.
    pub fn next_call(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Send one call (made with the number from [`Link::next_call`]); the receiver gets
    /// its one reply, or disconnects when the sandbox side goes away.
    pub fn send(&self, req: &McpRequest) -> Result<Receiver<McpReply>, LinkError> {
        if !self.alive() {
            return Err(LinkError::Gone);
        }
        let (tx, rx) = mpsc::sync_channel(1);
        lock(&self.pending).insert(req.call(), tx);
        let sent = write_frame(&mut *lock(&self.tx), req);
        if let Err(e) = sent {
            lock(&self.pending).remove(&req.call());
            return Err(match e {
                ProtoError::Io(_) => LinkError::Gone,
                other => LinkError::Send(other.to_string()),
            });
        }
        Ok(rx)
    }

    /// Ask the sandbox side to stop one call (its sandbox is killed); the call still gets
    /// its reply.
    pub fn cancel(&self, call: u64) {
        if self.alive() {
            if let Err(e) = write_frame(&mut *lock(&self.tx), &McpRequest::Cancel { call }) {
                log::warn!("could not cancel call {call}: {e}");
            }
        }
    }

    /// Stop waiting for a call (its answer will be dropped).
    pub fn forget(&self, call: u64) {
        lock(&self.pending).remove(&call);
    }
}

fn reply_call(r: &McpReply) -> u64 {
    match r {
        McpReply::RunCode { call, .. }
        | McpReply::Functions { call, .. }
        | McpReply::Called { call, .. }
        | McpReply::Logs { call, .. }
        | McpReply::ToolError { call, .. } => *call,
    }
}
