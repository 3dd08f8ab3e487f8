//! The front's channels to the supervisor: unix socket connections opened and greeted
//! (`Hello { role: Api }`) before the front confined itself, lent to one HTTP request at a
//! time. The supervisor answers one request per channel before it reads the next, so a
//! request holds its channel until the final reply (a streamed call, until its answer).
//!
//! A channel whose exchange broke (the supervisor closed it, a frame was malformed, the
//! front gave up waiting) is shut and not lent again: closing it is also how the front
//! cancels what it started there. The confined front cannot open another, so when the last
//! one goes the front exits (a service manager restarts it against the new supervisor).

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use proto::front::{ExecEvent, Reply, Request, Role, MAX_FRONT_FRAME};
use proto::{read_frame, write_frame, ProtoError};

/// Say hello as the API role with the front's flags; `Err` says why not, in words.
pub fn hello(sock: &mut UnixStream, flags: proto::api::FrontFlags) -> Result<(), String> {
    use plumbing::hello::HelloError;
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| format!("set a timeout on the channel: {e}"))?;
    match plumbing::hello::say(sock, Role::Api, flags) {
        Ok(()) => Ok(()),
        Err(HelloError::Refused(reason)) => Err(format!("the supervisor refused: {reason}")),
        Err(HelloError::Proto(ProtoError::Closed)) => Err(
            "the supervisor closed the connection before it answered the hello; it may be stopping"
                .into(),
        ),
        Err(HelloError::Proto(e)) => Err(format!("say hello to the supervisor: {e}")),
    }
}

/// Why an exchange on a channel did not end with a reply.
#[derive(Debug)]
pub enum ChanError {
    /// No reply before the deadline; the channel was shut (cancelling what it carried).
    Timeout,
    /// The channel broke; the words say how.
    Broken(String),
}

pub struct Pool {
    free: Mutex<Vec<UnixStream>>,
    cv: Condvar,
    live: AtomicUsize,
}

impl Pool {
    pub fn new(chans: Vec<UnixStream>) -> Pool {
        Pool {
            live: AtomicUsize::new(chans.len()),
            free: Mutex::new(chans),
            cv: Condvar::new(),
        }
    }

    /// Channels still usable (lent or free).
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// A channel, waiting at most until `deadline` for one to be free.
    pub fn acquire(&self, deadline: Instant) -> Option<Lease<'_>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(sock) = free.pop() {
                return Some(Lease {
                    pool: self,
                    sock: Some(sock),
                });
            }
            let now = Instant::now();
            if now >= deadline || self.live() == 0 {
                return None;
            }
            let (g, _) = self
                .cv
                .wait_timeout(free, deadline - now)
                .unwrap_or_else(|p| p.into_inner());
            free = g;
        }
    }

    fn give_back(&self, sock: UnixStream) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.push(sock);
        drop(free);
        self.cv.notify_one();
    }

    fn lose(&self, sock: UnixStream) {
        let _ = sock.shutdown(std::net::Shutdown::Both);
        let left = self.live.fetch_sub(1, Ordering::AcqRel) - 1;
        log::warn!("a channel to the supervisor was closed; {left} left");
        self.cv.notify_all();
        if left == 0 {
            log::error!(
                "zygo api has no channel to the supervisor left (did it stop?); exiting so it can be started again"
            );
            std::process::exit(1);
        }
    }
}

/// One channel, lent to one request.
pub struct Lease<'a> {
    pool: &'a Pool,
    sock: Option<UnixStream>,
}

impl Lease<'_> {
    /// Send `req` and read replies until the final one, passing events to `on_event`,
    /// waiting at most until `deadline`. On any error the channel is shut and lost.
    pub fn call(
        &mut self,
        req: &Request,
        deadline: Instant,
        mut on_event: impl FnMut(ExecEvent),
    ) -> Result<Reply, ChanError> {
        let r = self.exchange(req, deadline, &mut on_event);
        if r.is_err() {
            if let Some(sock) = self.sock.take() {
                self.pool.lose(sock);
            }
        }
        r
    }

    fn exchange(
        &mut self,
        req: &Request,
        deadline: Instant,
        on_event: &mut impl FnMut(ExecEvent),
    ) -> Result<Reply, ChanError> {
        let sock = self
            .sock
            .as_mut()
            .ok_or_else(|| ChanError::Broken("the channel is closed".into()))?;
        let broken = |what: &str, e: ProtoError| ChanError::Broken(format!("{what}: {e}"));
        sock.set_write_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| ChanError::Broken(format!("set a timeout on the channel: {e}")))?;
        write_frame(sock, req).map_err(|e| broken("send to the supervisor", e))?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ChanError::Timeout);
            }
            sock.set_read_timeout(Some(left))
                .map_err(|e| ChanError::Broken(format!("set a timeout on the channel: {e}")))?;
            match read_frame::<_, Reply>(sock, MAX_FRONT_FRAME) {
                Ok(Reply::Event(ev)) => on_event(ev),
                Ok(reply) => return Ok(reply),
                Err(ProtoError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ChanError::Timeout)
                }
                Err(ProtoError::Closed) => {
                    return Err(ChanError::Broken(
                        "the supervisor closed the channel".into(),
                    ))
                }
                Err(e) => return Err(broken("read from the supervisor", e)),
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(sock) = self.sock.take() {
            self.pool.give_back(sock);
        }
    }
}
