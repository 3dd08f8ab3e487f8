//! Writing an answer to its client, at a pace the client must keep.
//!
//! The kernel takes what fits in the socket's buffers at once; the rest goes as fast as the
//! client reads. A client that reads slowly, or never, must not hold the worker writing
//! its answer (nor the answer's bytes) for longer than the answer's size warrants, so:
//!
//! - an answer of `n` bytes must be taken within [`WRITE_GRACE`] and `n` /
//!   [`MIN_ANSWER_RATE`], and keep that pace all along: at any moment past the grace, the
//!   client has taken at least [`MIN_ANSWER_RATE`] a second on average since the answer
//!   began. A client that falls behind has its connection reset (`SO_LINGER` 0, then
//!   shut), which also frees what the kernel still held for it, and the drop is logged.
//! - each write to the socket waits at most [`WRITE_STEP`] (or less, down to what is left
//!   of the pace), so the pace is checked whatever the client does: a write timeout of its
//!   own would let a client that takes a few bytes before each timeout hold the worker for
//!   ever.
//! - an answer written before the request has a place among its caller's
//!   ([`super::fair::Places`]) — a refusal, an error in the request's head — is small, and
//!   gets [`REFUSAL_WRITE`] in all: a client whose buffers are full of answers it did not
//!   read gets its connection reset instead.
//! - a stream's lines are written while its call runs with no pace (the call holds the
//!   worker anyway, and what the client does not take is dropped, never queued without
//!   bound); once the call has answered, what is still queued is held to the pace from
//!   then on.
//!
//! What is written is bytes only: the caller encodes its answer first and lets the value
//! go, so an answer being drained holds its encoded text and nothing else.

use std::io::{self, Read, Write};
use std::os::unix::io::RawFd;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Before its pace is counted, the time an answer may take whatever its size.
pub const WRITE_GRACE: Duration = Duration::from_secs(1);
/// After [`WRITE_GRACE`], an answer must be taken at this many bytes a second on average
/// (the same pace a request body must keep).
pub const MIN_ANSWER_RATE: u64 = 64 * 1024;
/// The longest one write to a client's socket waits, so the pace is checked this often.
pub const WRITE_STEP: Duration = Duration::from_secs(1);
/// All the time an answer written without a place (a refusal, an error in the request's
/// head) may take.
pub const REFUSAL_WRITE: Duration = Duration::from_millis(100);

/// How much time an answer is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// An answer to a request that holds a place: [`WRITE_GRACE`], then
    /// [`MIN_ANSWER_RATE`].
    Answer,
    /// A refusal or an early error: [`REFUSAL_WRITE`] in all.
    Refusal,
}

/// Why a paced writer stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The client fell behind the pace: its connection was reset.
    TooSlow { taken: u64, secs: f64 },
    /// The client went away (or the socket failed): the words say how.
    Gone(String),
}

/// From when the pace counts.
enum Since {
    At(Instant),
    /// Set by someone else, later (a stream's call answering); no pace until then.
    Later(Arc<OnceLock<Instant>>),
}

/// A request's response writer, held to a pace. Every write retries until the client
/// takes the bytes or the pace is broken; after a [`Stop`] every write fails at once.
pub struct Paced {
    w: Box<dyn Write + Send>,
    fd: Option<RawFd>,
    since: Since,
    /// The grace before the pace counts, and whether a rate applies after it.
    grace: Duration,
    rated: bool,
    /// Bytes taken in all, and when the pace began, how many had been taken by then.
    taken: u64,
    taken_before: Option<u64>,
    /// The write timeout last set on the socket.
    step: Option<Duration>,
    stopped: Option<Stop>,
}

impl Paced {
    /// Take `rq`'s writer. The descriptor is used only while this writer lives (it keeps
    /// the connection's write half open).
    pub fn new(rq: tiny_http::Request, pace: Pace) -> Paced {
        Paced::with_since(rq, pace, Since::At(Instant::now()))
    }

    /// A writer whose pace begins when `answered` is set (a stream: when its call answers).
    pub fn from_when(rq: tiny_http::Request, answered: Arc<OnceLock<Instant>>) -> Paced {
        Paced::with_since(rq, Pace::Answer, Since::Later(answered))
    }

    fn with_since(rq: tiny_http::Request, pace: Pace, since: Since) -> Paced {
        let fd = rq.connection_fd();
        let (grace, rated) = match pace {
            Pace::Answer => (WRITE_GRACE, true),
            Pace::Refusal => (REFUSAL_WRITE, false),
        };
        Paced {
            w: rq.into_writer(),
            fd,
            since,
            grace,
            rated,
            taken: 0,
            taken_before: None,
            step: None,
            stopped: None,
        }
    }

    /// Why it stopped, if it did.
    pub fn stopped(&self) -> Option<&Stop> {
        self.stopped.as_ref()
    }

    /// When the pace began and how many bytes were taken since then.
    fn pace(&mut self) -> Option<(Instant, u64)> {
        let at = match &self.since {
            Since::At(at) => *at,
            Since::Later(cell) => *cell.get()?,
        };
        let before = *self.taken_before.get_or_insert(self.taken);
        Some((at, self.taken - before))
    }

    /// How long the next write may wait: [`WRITE_STEP`], or less when the pace would be
    /// broken sooner; `None` once it is broken.
    fn next_wait(&mut self) -> Option<Duration> {
        let Some((at, taken)) = self.pace() else {
            return Some(WRITE_STEP);
        };
        let allowed = if self.rated {
            self.grace + Duration::from_secs_f64(taken as f64 / MIN_ANSWER_RATE as f64)
        } else {
            self.grace
        };
        let left = allowed.checked_sub(at.elapsed())?;
        if left.is_zero() {
            return None;
        }
        Some(left.min(WRITE_STEP).max(Duration::from_millis(1)))
    }

    fn set_step(&mut self, d: Duration) {
        let Some(fd) = self.fd else { return };
        // Most writes keep the full step: the socket is told only of a change.
        if self.step == Some(d) {
            return;
        }
        set_send_timeout(fd, d);
        self.step = Some(d);
    }

    /// The client fell behind: reset its connection and fail from now on.
    fn too_slow(&mut self) -> io::Error {
        let secs = match self.pace() {
            Some((at, _)) => at.elapsed().as_secs_f64(),
            None => 0.0,
        };
        self.stop(Stop::TooSlow {
            taken: self.taken,
            secs,
        });
        io::Error::new(
            io::ErrorKind::TimedOut,
            "the client took its answer too slowly",
        )
    }

    fn stop(&mut self, why: Stop) {
        if self.stopped.is_none() {
            if let Some(fd) = self.fd {
                reset(fd);
            }
            self.stopped = Some(why);
        }
    }

    fn stopped_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            "this answer's connection was given up",
        )
    }

    /// Run one write-like step until it goes through, the client goes, or the pace breaks.
    fn step_until<T>(
        &mut self,
        mut op: impl FnMut(&mut dyn Write) -> io::Result<T>,
    ) -> io::Result<T> {
        loop {
            if self.stopped.is_some() {
                return Err(self.stopped_error());
            }
            let Some(wait) = self.next_wait() else {
                return Err(self.too_slow());
            };
            self.set_step(wait);
            match op(&mut *self.w) {
                Ok(v) => return Ok(v),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    self.stop(Stop::Gone(e.to_string()));
                    return Err(e);
                }
            }
        }
    }
}

impl Write for Paced {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.step_until(|w| w.write(buf))?;
        if n == 0 {
            self.stop(Stop::Gone("the connection took nothing more".into()));
            return Err(self.stopped_error());
        }
        self.taken += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.step_until(|w| w.flush())
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        // The next request on this connection (if it goes on) is read with the socket's
        // usual write timeout, for the answers the HTTP server writes on its own.
        if let (Some(fd), None) = (self.fd, &self.stopped) {
            if self.step.is_some_and(|s| s != WRITE_STEP) {
                set_send_timeout(fd, WRITE_STEP);
            }
        }
    }
}

/// `SO_SNDTIMEO` on a socket the caller holds open.
fn set_send_timeout(fd: RawFd, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt on a descriptor the caller keeps open, with a timeval that lives
    // across the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

/// Reset a connection the client does not read: what the kernel still holds for it is
/// dropped (`SO_LINGER` 0 makes the last close send a reset), and both directions are shut,
/// so the server's own reader of the connection sees its end at once.
fn reset(fd: RawFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt and shutdown on a descriptor the caller keeps open, with a value
    // that lives across the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Pieces of bytes read one after another, each dropped once read.
pub struct Pieces {
    pieces: std::collections::VecDeque<Vec<u8>>,
    at: usize,
}

impl Pieces {
    pub fn new(pieces: Vec<Vec<u8>>) -> Pieces {
        Pieces {
            pieces: pieces.into(),
            at: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.pieces.iter().map(Vec::len).sum::<usize>() - self.at
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while let Some(p) = self.pieces.front() {
            if self.at < p.len() {
                let n = (p.len() - self.at).min(buf.len());
                buf[..n].copy_from_slice(&p[self.at..self.at + n]);
                self.at += n;
                return Ok(n);
            }
            self.pieces.pop_front();
            self.at = 0;
        }
        Ok(0)
    }
}

/// Write a whole answer to `rq` at `pace`: status, headers (the server adds the framing
/// and its own), and `body`. Nothing to return: a client that does not take it in time
/// has its connection reset, and that is logged.
pub fn send(
    rq: tiny_http::Request,
    status: u16,
    headers: Vec<tiny_http::Header>,
    body: Vec<Vec<u8>>,
    pace: Pace,
) {
    let version = rq.http_version().clone();
    let head_only = *rq.method() == tiny_http::Method::Head;
    let request_headers = rq.headers().to_vec();
    let body = Pieces::new(body);
    let len = body.len();
    let mut r = tiny_http::Response::new(
        tiny_http::StatusCode(status),
        Vec::new(),
        body,
        Some(len),
        None,
    );
    for h in headers {
        r.add_header(h);
    }
    let mut w = Paced::new(rq, pace);
    let written = r
        .raw_print(&mut w, version, &request_headers, head_only, None)
        .and_then(|()| w.flush());
    if written.is_err() {
        log_stop(w.stopped(), len);
    }
}

/// Say why an answer was given up (a client that went away is ordinary: debug).
pub fn log_stop(stop: Option<&Stop>, len: usize) {
    match stop {
        Some(Stop::TooSlow { taken, secs }) => log::warn!(
            "dropped an answer its client took slower than {} KiB/s ({taken} of {len} bytes in {secs:.1} s); its connection was reset",
            MIN_ANSWER_RATE / 1024
        ),
        Some(Stop::Gone(e)) => log::debug!("an answer's client went away: {e}"),
        None => log::debug!("an answer could not be written"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_read_in_order_and_say_their_length() {
        let mut p = Pieces::new(vec![b"ab".to_vec(), Vec::new(), b"cde".to_vec()]);
        assert_eq!(p.len(), 5);
        let mut out = String::new();
        let mut buf = [0u8; 2];
        loop {
            let n = p.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(std::str::from_utf8(&buf[..n]).unwrap_or("?"));
        }
        assert_eq!(out, "abcde");
        assert!(p.is_empty());
    }
}
