//! Zygo patch: the limits a server facing a hostile network needs, and the small pieces
//! that enforce them (see `ZYGO-PATCHES.md` at the crate's root).

use std::io::{Read, Result as IoResult, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::connection::Connection;
use crate::{HTTPVersion, Header, Response, StatusCode};

/// What one connection and one request head may take.
#[derive(Clone)]
pub struct Limits {
    /// Connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Connections from one peer address served at once (0: no such cap); one more from
    /// that address is answered 503 and closed. Unix socket peers have no address and are
    /// not counted.
    pub max_per_peer: usize,
    /// The longest one read of the socket may wait: an idle keep-alive connection is
    /// closed after this long without a byte.
    pub idle_timeout: Duration,
    /// From a request's first byte to the end of its head (request line and headers).
    pub head_timeout: Duration,
    /// The longest one write to the socket may wait (a client that stops reading).
    pub write_timeout: Duration,
    /// The longest request line or header line, in bytes.
    pub max_line: usize,
    /// The most header lines in one request.
    pub max_headers: usize,
    /// How much of a body the handler left unread is read and dropped so the connection can
    /// serve its next request; past this the connection is closed instead.
    pub max_drain: usize,
    /// Headers added to every response the server writes on its own (its errors).
    pub own_headers: fn() -> Vec<Header>,
}

fn no_headers() -> Vec<Header> {
    Vec::new()
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 1024,
            max_per_peer: 0,
            idle_timeout: Duration::from_secs(30),
            head_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_line: 8 * 1024,
            max_headers: 100,
            max_drain: 64 * 1024,
            own_headers: no_headers,
        }
    }
}

/// Counts a connection as live until dropped.
pub(crate) struct LiveGuard(Arc<AtomicUsize>);

impl LiveGuard {
    pub(crate) fn new(live: Arc<AtomicUsize>) -> LiveGuard {
        live.fetch_add(1, Ordering::AcqRel);
        LiveGuard(live)
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Connections open per peer address.
pub(crate) type PeerCounts =
    Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// Counts a connection against its peer address until dropped.
pub(crate) struct PeerGuard(PeerCounts, std::net::IpAddr);

impl PeerGuard {
    /// Count one more connection from `ip`, unless `cap` are already open from there.
    pub(crate) fn take(counts: &PeerCounts, ip: std::net::IpAddr, cap: usize) -> Option<PeerGuard> {
        let mut m = counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(PeerGuard(counts.clone(), ip))
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// Zygo patch: the open connections that are waiting for a request's head (a new one, or
/// a keep-alive one between requests), with the time each began to wait and a handle to
/// close it. At the connection cap the one that has waited longest is closed to make room
/// for a new one, instead of the new one being refused: connections that trickle a head
/// (or open and send nothing) cannot hold the server, while a connection whose request is
/// being answered is never taken.
#[derive(Default)]
pub(crate) struct Waiting {
    next: std::sync::atomic::AtomicU64,
    open:
        std::sync::Mutex<std::collections::HashMap<u64, (Option<std::time::Instant>, Connection)>>,
}

impl Waiting {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<u64, (Option<std::time::Instant>, Connection)>,
    > {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Register a connection (`handle`: a clone of its socket), waiting from now; its id.
    pub(crate) fn add(&self, handle: Connection) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .insert(id, (Some(std::time::Instant::now()), handle));
        id
    }

    /// The connection waits for a request's head (`true`: since now, unless it waited
    /// already), or has one being answered.
    pub(crate) fn set(&self, id: u64, waiting: bool) {
        if let Some(e) = self.lock().get_mut(&id) {
            if !waiting {
                e.0 = None;
            } else if e.0.is_none() {
                e.0 = Some(std::time::Instant::now());
            }
        }
    }

    /// The connection is gone.
    pub(crate) fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Close the connection that has waited longest for a head, if one waits; whether one
    /// was closed. Its thread sees the end of its socket and lets it go.
    pub(crate) fn close_longest(&self) -> bool {
        let mut m = self.lock();
        let oldest = m
            .iter()
            .filter_map(|(id, (since, _))| since.map(|t| (t, *id)))
            .min()
            .map(|(_, id)| id);
        match oldest.and_then(|id| m.remove(&id)) {
            Some((_, handle)) => {
                let _ = handle.shutdown(std::net::Shutdown::Both);
                true
            }
            None => false,
        }
    }
}

/// Whether an accept error is a shortage (descriptors, memory) worth pausing for rather
/// than a connection that went away before it was taken.
pub(crate) fn accept_error_needs_pause(e: &std::io::Error) -> bool {
    const SHORTAGES: [i32; 4] = [
        24,  /* EMFILE */
        23,  /* ENFILE */
        105, /* ENOBUFS */
        12,  /* ENOMEM */
    ];
    e.raw_os_error().is_some_and(|n| SHORTAGES.contains(&n))
}

/// Whether an accept error means the listener itself is gone (shut down for reading, or
/// closed): the accept loop ends instead of spinning on it.
pub(crate) fn accept_error_ends(e: &std::io::Error) -> bool {
    const ENDS: [i32; 2] = [22 /* EINVAL */, 9 /* EBADF */];
    e.raw_os_error().is_some_and(|n| ENDS.contains(&n))
}

/// A response the server writes on its own: `{"error", "code"}` JSON, the own headers,
/// `Connection: close`.
pub(crate) fn own_error(
    limits: &Limits,
    status: u16,
    code: &str,
    message: &str,
) -> Response<std::io::Cursor<Vec<u8>>> {
    let body = format!(
        "{{\"error\":\"{}\",\"code\":\"{}\"}}",
        message.replace('\\', "\\\\").replace('"', "\\\""),
        code
    );
    let mut r = Response::from_data(body.into_bytes()).with_status_code(StatusCode(status));
    for h in (limits.own_headers)() {
        r.add_header(h);
    }
    if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
        r.add_header(h);
    }
    if let Ok(h) = Header::from_bytes(&b"Connection"[..], &b"close"[..]) {
        r.add_header(h);
    }
    r
}

/// Past the connection cap: a 503 with `Retry-After`, then the connection is closed.
pub(crate) fn refuse_over_cap(mut sock: Connection, limits: &Limits) {
    let mut r = own_error(
        limits,
        503,
        "unavailable",
        "too many connections are open; retry in a moment",
    );
    if let Ok(h) = Header::from_bytes(&b"Retry-After"[..], &b"1"[..]) {
        r.add_header(h);
    }
    let _ = r.raw_print(&mut sock, HTTPVersion(1, 1), &[], false, None);
    let _ = sock.flush();
    let _ = sock.shutdown(std::net::Shutdown::Both);
}

/// Sits under the reader of a connection's request heads and bodies: once set, every read
/// fails, so a connection whose last body was left unread is closed instead of reading
/// that body as its next request.
pub(crate) struct PoisonCheck<R> {
    pub(crate) inner: R,
    pub(crate) poisoned: Arc<AtomicBool>,
}

impl<R: Read> Read for PoisonCheck<R> {
    fn read(&mut self, buf: &mut [u8]) -> IoResult<usize> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the previous request's body was not read",
            ));
        }
        self.inner.read(buf)
    }
}

/// A request's body: what the handler leaves unread is read and dropped, up to
/// `max_drain` bytes; past that the connection is poisoned (closed after the answer).
pub(crate) struct BodyGuard {
    pub(crate) inner: Box<dyn Read + Send + 'static>,
    pub(crate) done: bool,
    pub(crate) poisoned: Arc<AtomicBool>,
    pub(crate) max_drain: usize,
    /// The handler said it will not read the body: drain none of it, close instead.
    pub(crate) unwanted: Arc<AtomicBool>,
}

impl Read for BodyGuard {
    fn read(&mut self, buf: &mut [u8]) -> IoResult<usize> {
        if self.done {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.done = true;
        }
        Ok(n)
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.unwanted.load(Ordering::Acquire) {
            self.poisoned.store(true, Ordering::Release);
            return;
        }
        let mut chunk = [0u8; 8192];
        let mut left = self.max_drain;
        while left > 0 {
            let want = left.min(chunk.len());
            match self.inner.read(&mut chunk[..want]) {
                Ok(0) => return,
                Ok(n) => left -= n,
                Err(_) => break,
            }
        }
        self.poisoned.store(true, Ordering::Release);
    }
}
