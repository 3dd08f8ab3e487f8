//! The front's channels to the supervisor: unix socket connections opened and greeted
//! (`Hello { role: Api }`) before the front confined itself, lent to one HTTP request at a
//! time. The supervisor answers one request per channel before it reads the next, so a
//! request holds its channel until the final reply (a streamed call, until its answer).
//!
//! A channel whose exchange broke (the supervisor closed it, a frame was malformed, the
//! front gave up waiting) is shut and not lent again: closing it is also how the front
//! cancels what it started there. The confined front cannot open another, so when the last
//! one goes the front exits 1, saying why (a service manager restarts it against the new
//! supervisor). Idle channels are looked at every [`WATCH_EVERY`] ([`Pool::watch`]): the
//! supervisor never writes on one unasked, so one that is readable was closed by it (it
//! drained and exited, or it died) and is lost too. Without that, a supervisor gone while
//! nobody called would leave the front answering 503 to every request until each of its
//! channels had been tried.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use proto::front::{ExecEvent, Reply, Request, Role, MAX_FRONT_FRAME};

use super::fair::Share;
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
    /// No reply before the deadline. The request goes on in the supervisor; its reply is
    /// read (and dropped) in the background, and the channel is then lent again.
    Timeout,
    /// The channel broke; the words say how. It is shut and not lent again.
    Broken(String),
}

/// How long past its request's deadline the background read of an abandoned request's
/// reply may wait. The supervisor answers every request by its deadline (a call's is
/// kept on the supervisor's clock; everything else is answered at once): one that has not
/// answered by then is not going to, and the channel is closed (which cancels what the
/// supervisor still does for it) rather than kept from every other caller.
pub const RECOVER_GRACE: Duration = Duration::from_secs(30);
/// Once a frame has begun to arrive, the most its remaining bytes may take.
const FRAME_TIME: Duration = Duration::from_secs(30);
/// How often the idle channels are looked at for a supervisor that closed them.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

pub struct Pool {
    free: Mutex<Vec<UnixStream>>,
    cv: Condvar,
    live: AtomicUsize,
    /// Channels reading the reply of a request whose caller stopped waiting.
    recovering: AtomicUsize,
    /// [`RECOVER_GRACE`] (shorter in tests).
    grace: Duration,
}

impl Pool {
    pub fn new(chans: Vec<UnixStream>) -> Arc<Pool> {
        Pool::with_grace(chans, RECOVER_GRACE)
    }

    fn with_grace(chans: Vec<UnixStream>, grace: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            live: AtomicUsize::new(chans.len()),
            free: Mutex::new(chans),
            cv: Condvar::new(),
            recovering: AtomicUsize::new(0),
            grace,
        })
    }

    /// Channels still usable (lent, free, or reading an abandoned reply).
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Channels reading the reply of a request whose caller stopped waiting.
    pub fn recovering(&self) -> usize {
        self.recovering.load(Ordering::Acquire)
    }

    /// A channel, waiting at most until `deadline` for one to be free.
    pub fn acquire(self: &Arc<Self>, deadline: Instant) -> Option<Lease> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(sock) = free.pop() {
                return Some(Lease {
                    pool: self.clone(),
                    sock: Some(sock),
                    pending: false,
                    deadline: None,
                    held: None,
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

    fn lose(&self, sock: UnixStream, why: &str) {
        let _ = sock.shutdown(std::net::Shutdown::Both);
        drop(sock);
        self.lost(why);
    }

    /// A channel was closed: one fewer; with none left the front exits.
    fn lost(&self, why: &str) {
        let left = self.live.fetch_sub(1, Ordering::AcqRel) - 1;
        log::warn!("a channel to the supervisor was closed ({why}); {left} left");
        self.cv.notify_all();
        if left == 0 {
            log::error!(
                "zygo api has no channel to the supervisor left: the supervisor stopped or closed them all; exiting (status 1) so that a service manager starts zygo api again once a supervisor runs"
            );
            std::process::exit(1);
        }
    }

    /// Look at the idle channels every [`WATCH_EVERY`], on a thread of its own, and lose
    /// each the supervisor closed (or wrote to unasked): the front exits once none is left,
    /// whether or not anyone calls.
    pub fn watch(self: &Arc<Self>) -> Result<(), String> {
        let pool = self.clone();
        std::thread::Builder::new()
            .name("chan-watch".into())
            .spawn(move || loop {
                std::thread::sleep(WATCH_EVERY);
                pool.sweep();
            })
            .map(|_| ())
            .map_err(|e| format!("start the thread that watches the supervisor's channels: {e}"))
    }

    fn sweep(&self) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = Vec::new();
        let mut i = 0;
        while i < free.len() {
            if stirred(&free[i]) {
                closed.push(free.swap_remove(i));
            } else {
                i += 1;
            }
        }
        drop(free);
        for sock in closed {
            self.lose(sock, "the supervisor closed it while it was idle");
        }
    }
}

/// Whether an idle channel is readable or hung up: its peer closed it, or wrote to it
/// unasked (which leaves it out of step just the same).
fn stirred(sock: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd of a descriptor we hold, without waiting.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents != 0
}

/// Wait until `sock` has bytes to read (or its peer closed), at most until `deadline`.
/// Nothing is read: a deadline that passes leaves the channel in step.
fn readable(sock: &UnixStream, deadline: Instant) -> Result<bool, ChanError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: poll on one valid pollfd of a descriptor we hold.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            return Ok(true);
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(ChanError::Broken(format!("wait for the supervisor: {e}")));
            }
        }
    }
}

/// Read one reply whose first byte is waiting: the rest must come within [`FRAME_TIME`].
fn read_reply(sock: &mut UnixStream) -> Result<Reply, ChanError> {
    sock.set_read_timeout(Some(FRAME_TIME))
        .map_err(|e| ChanError::Broken(format!("set a timeout on the channel: {e}")))?;
    read_frame::<_, Reply>(sock, MAX_FRONT_FRAME).map_err(|e| match e {
        ProtoError::Closed => ChanError::Broken("the supervisor closed the channel".into()),
        e => ChanError::Broken(format!("read from the supervisor: {e}")),
    })
}

/// One channel, lent to one request.
pub struct Lease {
    pool: Arc<Pool>,
    sock: Option<UnixStream>,
    /// A request was sent and its final reply not read yet.
    pending: bool,
    /// The deadline of the request sent last.
    deadline: Option<Instant>,
    /// The caller's share of the channels this lease counts against: given back with the
    /// channel, so a request its caller stopped waiting for still counts against that
    /// caller until its channel is free again.
    held: Option<Share>,
}

impl Lease {
    /// Count this channel against `share` (its caller's) until the channel is free again.
    pub fn hold(&mut self, share: Share) {
        self.held = Some(share);
    }

    /// Send `req` and read replies until the final one, passing events to `on_event`,
    /// waiting at most until `deadline`. A broken channel is shut and lost; a deadline that
    /// passes leaves the request running and its reply to be read in the background.
    pub fn call(
        &mut self,
        req: &Request,
        deadline: Instant,
        mut on_event: impl FnMut(ExecEvent),
    ) -> Result<Reply, ChanError> {
        let r = self.exchange(req, deadline, &mut on_event);
        if let Err(ChanError::Broken(why)) = &r {
            self.pending = false;
            if let Some(sock) = self.sock.take() {
                self.pool.lose(sock, why);
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
        sock.set_write_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| ChanError::Broken(format!("set a timeout on the channel: {e}")))?;
        self.deadline = Some(deadline);
        write_frame(sock, req)
            .map_err(|e| ChanError::Broken(format!("send to the supervisor: {e}")))?;
        self.pending = true;
        loop {
            if !readable(sock, deadline)? {
                return Err(ChanError::Timeout);
            }
            match read_reply(sock)? {
                Reply::Event(ev) => on_event(ev),
                reply => {
                    self.pending = false;
                    return Ok(reply);
                }
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(mut sock) = self.sock.take() else {
            return;
        };
        if !self.pending {
            self.pool.give_back(sock);
            return;
        }
        // The caller stopped waiting; the supervisor still answers, by the request's
        // deadline. Read that answer in the background so the channel is in step again,
        // then lend it again; one that has not come within the grace past the deadline
        // closes the channel. Meanwhile the channel still counts against its caller.
        let pool = self.pool.clone();
        let held = self.held.take();
        let until = self.deadline.unwrap_or_else(Instant::now) + pool.grace;
        pool.recovering.fetch_add(1, Ordering::AcqRel);
        let recover = move || {
            let _held = held;
            let lost = loop {
                match readable(&sock, until) {
                    Ok(true) => match read_reply(&mut sock) {
                        Ok(Reply::Event(_)) => continue,
                        Ok(_) => break None,
                        Err(_) => break Some("an abandoned reply broke"),
                    },
                    Ok(false) => {
                        break Some(
                            "the supervisor did not answer an abandoned request by its deadline and the grace",
                        )
                    }
                    Err(_) => break Some("an abandoned reply broke"),
                }
            };
            pool.recovering.fetch_sub(1, Ordering::AcqRel);
            match lost {
                None => pool.give_back(sock),
                Some(why) => pool.lose(sock, why),
            }
        };
        let spawned = std::thread::Builder::new()
            .name("chan-recover".into())
            .spawn(recover);
        if let Err(e) = spawned {
            // The thread (and the channel it held) is gone: nothing reads that answer.
            log::warn!("read an abandoned reply in the background: {e}; the channel is closed");
            self.pool.recovering.fetch_sub(1, Ordering::AcqRel);
            self.pool.lost("its reader could not be started");
        }
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::fair::{Party, Shares};

    /// A pool of two channels with a short grace, and the supervisor's ends.
    fn pool(grace: Duration) -> (Arc<Pool>, Vec<UnixStream>) {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let (a, b) = UnixStream::pair().unwrap();
            ours.push(a);
            theirs.push(b);
        }
        (Pool::with_grace(ours, grace), theirs)
    }

    fn who() -> Party {
        Party::Tenant("t".into())
    }

    /// A request its caller stops waiting for (its deadline passes): its channel is
    /// read in the background and counts against the caller meanwhile.
    fn abandon(pool: &Arc<Pool>, shares: &Shares, deadline: Duration) {
        let mut lease = pool.acquire(Instant::now() + deadline).unwrap();
        lease.hold(shares.take(&who(), None).unwrap());
        let r = lease.call(&Request::List, Instant::now() + deadline, |_| {});
        assert!(matches!(r, Err(ChanError::Timeout)), "{r:?}");
        drop(lease);
        assert!(
            shares.take(&who(), None).is_none(),
            "the abandoned channel no longer counts against its caller"
        );
        assert_eq!(pool.recovering(), 1);
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !cond() {
            assert!(t0.elapsed() < Duration::from_secs(5), "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn an_abandoned_channel_answered_late_is_lent_again_and_counted_until_then() {
        let (pool, sup) = pool(Duration::from_secs(2));
        let shares = Shares::new(1);
        abandon(&pool, &shares, Duration::from_millis(100));
        // The supervisor answers after the caller's deadline, within the grace, on the
        // channel the request came on.
        let mut end = sup
            .into_iter()
            .find(|s| readable(s, Instant::now() + Duration::from_millis(50)).is_ok_and(|r| r))
            .unwrap();
        let asked = proto::read_frame::<_, Request>(&mut end, MAX_FRONT_FRAME).unwrap();
        assert_eq!(asked, Request::List);
        std::thread::sleep(Duration::from_millis(300));
        proto::write_frame(&mut end, &Reply::Cancelled { count: 0 }).unwrap();
        wait_until("the channel back", || pool.recovering() == 0);
        assert_eq!(pool.live(), 2);
        assert!(shares.take(&who(), None).is_some());
    }

    #[test]
    fn an_abandoned_channel_never_answered_is_closed_at_its_deadline_and_the_grace() {
        let grace = Duration::from_millis(300);
        let (pool, _sup) = pool(grace);
        let shares = Shares::new(1);
        let t0 = Instant::now();
        abandon(&pool, &shares, Duration::from_millis(100));
        wait_until("the channel closed", || pool.live() == 1);
        assert!(t0.elapsed() >= Duration::from_millis(100) + grace);
        assert_eq!(pool.recovering(), 0);
        assert!(shares.take(&who(), None).is_some());
    }
}
