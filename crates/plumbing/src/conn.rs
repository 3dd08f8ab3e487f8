//! A non-blocking, frame-oriented connection (a front or a launcher) for the event loop,
//! and the limits that keep what fronts can make the supervisor hold bounded.
//!
//! A launcher's channel is read whole on every event ([`Conn::receive`]): the launcher is
//! ours and what it relays is capped inside it. A front's channel is read only as far as
//! the supervisor is ready to take it ([`Conn::read_some`]); the decisions (how far, when
//! to stop, when a connection has stalled) are the supervisor's, with these limits.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use mio::Token;
use proto::frame::PREFIX;
use proto::front::{ErrorCode, Reply, MAX_FRONT_FRAME};
use proto::{encode_frame, FrameBuf, ProtoError};
use serde::{de::DeserializeOwned, Serialize};

/// The most we buffer for a peer that does not read; past it the peer is dropped. Room for
/// a few frames at the cap: a launcher may be handed several calls with large workspaces
/// at once, and reads them one after the other (what fronts may leave unread is bounded
/// by [`OUTPUT_BUDGET`] first).
const MAX_OUT: usize = 3 * proto::frame::MAX_FRAME;

/// The most read from the socket at once.
pub const CHUNK: usize = 64 * 1024;

// --- Limits on front connections -------------------------------------------------------
//
// The control socket is the operator's (0600), but the HTTP front holds one connection per
// worker and the MCP front one more: a confused or taken-over front must not be able to
// make the supervisor hold memory without bound, nor starve the other connections. At
// worst the fronts together make it hold about
// MAX_FRONTS × (SMALL_FRAME + MAX_QUEUED_BYTES + SMALL_FRAME) + INPUT_BUDGET + OUTPUT_BUDGET,
// about 370 MiB, whatever they send (plus, past the output budget, one answer each to
// fronts that have read everything they were sent).

/// Front connections open at once (before or after their hello). One past it is sent a
/// refusal and closed.
pub const MAX_FRONTS: usize = 256;

/// A hello is a few bytes (room is left for flags): a first frame declaring more ends
/// the connection at once.
pub const MAX_HELLO_FRAME: usize = 4096;

/// A frame of up to this many bytes (prefix included) is read without asking: each
/// connection may hold one, partial, however many connections there are. Most requests
/// are this small.
pub const SMALL_FRAME: usize = 64 * 1024;

/// Requests read and waiting their turn behind the one running, per connection (count
/// and bytes). Past either, the connection is not read until one has started: its peer's
/// writes wait in the socket.
pub const MAX_QUEUED: usize = 16;
pub const MAX_QUEUED_BYTES: usize = 64 * 1024;

/// Larger frames (a big event, a script; up to the frame cap) are read only when their
/// connection could start them at once, and only once the bytes for the whole frame are
/// set aside from this budget, shared by every connection. A connection waits in line
/// for its share. Two frames at the cap (a call carrying a 64 MiB workspace) fit at once.
pub const INPUT_BUDGET: usize = 192 * 1024 * 1024;
const _: () = assert!(INPUT_BUDGET >= 2 * (PREFIX + MAX_FRONT_FRAME));

/// Answers unread by every front together. Past it, a front that has not read what it
/// was sent is dropped; one that has read everything still gets its answer.
pub const OUTPUT_BUDGET: usize = 128 * 1024 * 1024;

/// A front's next request is not started while more than this of its answers is unread:
/// a client that does not read its answers stops being read itself.
pub const OUT_LOW: usize = 256 * 1024;

/// How long a frame may take to arrive whole once its first byte has (and a hello, once
/// the connection was accepted), while the supervisor is ready to read it. A peer that
/// stalls longer is closed and what it held given back. Time a connection spends held
/// back for its own sake (its call running, its queue full, its answers unread) does not
/// count; time spent waiting in line for the input budget does.
pub const FRAME_STALL: Duration = Duration::from_secs(10);

/// A front's final reply as a frame of at most `cap` bytes (prefix included). One that
/// cannot be made one (its encoding fails, or is over the cap) is answered with a small
/// `too_large` error saying how large it was instead, so that the front always gets the
/// one final reply it waits for. (Every reply is built well below the cap: a call's answer
/// holds at most about 31 MiB, a function's logs 4 MiB (`stats::LOGS_REPLY_BUDGET` in the
/// monitor's supervisor); this is the guard behind those budgets.)
pub fn final_reply_frame(r: &Reply, cap: usize) -> Vec<u8> {
    let why = match encode_frame(r) {
        Ok(f) if f.len() <= cap => return f,
        Ok(f) => format!(
            "the answer is {} MiB, over the {} MiB a frame to a front may carry",
            f.len().div_ceil(1 << 20),
            cap >> 20
        ),
        Err(e) => format!("the answer could not be encoded ({e})"),
    };
    log::warn!("a front's answer was not sent: {why}; it was answered too_large instead");
    let refusal = Reply::Error {
        code: ErrorCode::TooLarge,
        message: format!(
            "{why}; it was not sent. Ask for less (fewer log entries, a smaller result or output)"
        ),
        retry_after: None,
    };
    // A few hundred bytes: this always encodes, and always fits.
    encode_frame(&refusal).unwrap_or_default()
}

/// What one read of a connection brought.
pub enum Got {
    Bytes,
    /// The peer closed its end.
    End,
    /// Nothing to read now; readiness will be signalled when there is.
    Nothing,
}

pub struct Conn {
    pub stream: mio::net::UnixStream,
    inbuf: FrameBuf,
    out: Vec<u8>,
    sent: usize,
    /// Why the connection is finished, once it is: the caller drops it.
    pub closed: Option<String>,
}

impl Conn {
    pub fn new(stream: mio::net::UnixStream, max_frame: usize) -> Conn {
        Conn {
            stream,
            inbuf: FrameBuf::new(max_frame),
            out: Vec::new(),
            sent: 0,
            closed: None,
        }
    }

    /// Queue one message and write as much as the socket takes now.
    pub fn send<T: Serialize>(&mut self, msg: &T) {
        match encode_frame(msg) {
            Ok(f) => self.send_frame(&f),
            Err(e) => log::error!("encode a message: {e}"),
        }
    }

    /// Queue one whole frame and write as much as the socket takes now.
    pub fn send_frame(&mut self, f: &[u8]) {
        if self.closed.is_some() {
            return;
        }
        if self.unsent() + f.len() > MAX_OUT {
            self.closed = Some(format!(
                "it does not read what it is sent ({} MiB unread)",
                self.unsent() >> 20
            ));
            return;
        }
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        }
        self.out.extend_from_slice(f);
        self.flush();
    }

    /// Bytes queued that have not reached the socket yet.
    pub fn unsent(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Whether queued bytes have not reached the socket yet.
    pub fn pending(&self) -> bool {
        self.closed.is_none() && self.unsent() > 0
    }

    pub fn flush(&mut self) {
        while self.sent < self.out.len() {
            match self.stream.write(&self.out[self.sent..]) {
                Ok(0) => {
                    self.closed = Some("it stopped reading (write returned 0)".into());
                    return;
                }
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.closed = Some(format!("write: {e}"));
                    return;
                }
            }
        }
        // Everything went out: a buffer that held a large answer is given back.
        self.out.clear();
        self.sent = 0;
        if self.out.capacity() > 2 * CHUNK {
            self.out = Vec::new();
        }
    }

    /// Read everything available. Returns the messages that completed; an error (a bad
    /// frame, or end of stream mid-frame) ends the connection. `Ok((msgs, true))` means the
    /// peer closed cleanly after these.
    pub fn receive<T: DeserializeOwned>(&mut self) -> Result<(Vec<T>, bool), ProtoError> {
        let mut msgs = Vec::new();
        loop {
            match self.read_some(CHUNK)? {
                Got::Bytes => {
                    // Whole frames are taken as they complete, so the buffer holds one
                    // frame at a time however much is waiting in the socket.
                    while let Some(m) = self.inbuf.next_frame::<T>()? {
                        msgs.push(m);
                    }
                }
                Got::Nothing => return Ok((msgs, false)),
                Got::End => return self.end_of_stream().map(|()| (msgs, true)),
            }
        }
    }

    /// One read of at most `max` bytes (never past the end of a frame larger than that).
    pub fn read_some(&mut self, max: usize) -> Result<Got, ProtoError> {
        match self.inbuf.read_from(self.stream.as_raw_fd(), max) {
            Ok(0) => Ok(Got::End),
            Ok(_) => Ok(Got::Bytes),
            Err(ProtoError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                Ok(Got::Nothing)
            }
            Err(e) => Err(e),
        }
    }

    /// The next whole frame, decoded, if it has arrived.
    pub fn take<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ProtoError> {
        self.inbuf.next_frame()
    }

    /// The size (prefix included) the next frame declares, once its prefix has arrived.
    pub fn next_size(&self) -> Result<Option<usize>, ProtoError> {
        Ok(self.inbuf.next_len()?.map(|len| PREFIX + len))
    }

    /// Bytes read and not taken.
    pub fn buffered(&self) -> usize {
        self.inbuf.buffered()
    }

    /// Whether part of a frame has arrived but not the whole of it.
    pub fn partial(&self) -> bool {
        self.inbuf.partial()
    }

    /// Why the peer's end of stream came where it did: cleanly between frames, or not.
    pub fn end_of_stream(&self) -> Result<(), ProtoError> {
        match self.inbuf.finish() {
            Err(ProtoError::Closed) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A new cap for the frames not read yet (raised once the hello has been taken).
    pub fn set_max_frame(&mut self, max: usize) {
        self.inbuf.set_max(max);
    }
}

/// The input budget ([`INPUT_BUDGET`]) and the line of connections waiting for a share
/// of it, served in order so that a large frame is not passed over forever by smaller
/// ones.
pub struct InputBudget {
    free: usize,
    line: std::collections::VecDeque<Token>,
}

impl InputBudget {
    pub fn new(total: usize) -> InputBudget {
        InputBudget {
            free: total,
            line: Default::default(),
        }
    }

    /// Set `size` bytes aside for `t`, if it is its turn and they are free; otherwise put
    /// it in line (once) and say no.
    pub fn take(&mut self, t: Token, size: usize) -> bool {
        let first = self.line.front().is_none_or(|f| *f == t);
        if first && size <= self.free {
            if self.line.front() == Some(&t) {
                self.line.pop_front();
            }
            self.free -= size;
            return true;
        }
        if !self.line.contains(&t) {
            self.line.push_back(t);
        }
        false
    }

    pub fn give_back(&mut self, size: usize) {
        self.free += size;
    }

    /// `t` no longer waits (it was dropped, or stopped for another reason).
    pub fn leave(&mut self, t: Token) {
        self.line.retain(|w| *w != t);
    }

    /// The connection whose turn it is.
    pub fn first(&self) -> Option<Token> {
        self.line.front().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::{final_reply_frame, ErrorCode, InputBudget, Reply, Token};
    use proto::front::LogEntry;

    #[test]
    fn a_reply_over_the_cap_is_answered_too_large_instead_of_dropped() {
        let entry = |i: usize| LogEntry {
            request_id: format!("r{i}"),
            finished_ms: 0,
            outcome: proto::front::Outcome::Error,
            wall_us: 1,
            error: Some("e".repeat(64 * 1024)),
            stdout: String::new(),
            stderr: String::new(),
        };
        let big = Reply::Logs {
            entries: (0..20).map(entry).collect(),
            left_out: 0,
        };
        // Within the cap: the reply itself.
        let f = final_reply_frame(&big, 4 << 20);
        let whole: Reply = proto::codec::decode(&f[4..]).expect("decode");
        assert_eq!(whole, big);
        // Over it: a small too_large error saying how large the answer was.
        let f = final_reply_frame(&big, 1 << 20);
        assert!(f.len() < 1024, "{} bytes", f.len());
        match proto::codec::decode::<Reply>(&f[4..]).expect("decode") {
            Reply::Error { code, message, .. } => {
                assert_eq!(code, ErrorCode::TooLarge);
                assert!(message.contains("2 MiB, over the 1 MiB"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_budget_serves_its_line_in_order() {
        let mut b = InputBudget::new(100);
        assert!(b.take(Token(1), 60));
        // 2 does not fit and waits; 3 would fit but it is 2's turn.
        assert!(!b.take(Token(2), 60));
        assert!(!b.take(Token(3), 10));
        assert_eq!(b.first(), Some(Token(2)));
        b.give_back(60);
        assert!(!b.take(Token(3), 10), "not before 2");
        assert!(b.take(Token(2), 60));
        assert_eq!(b.first(), Some(Token(3)));
        assert!(b.take(Token(3), 10));
        assert_eq!(b.first(), None);
        // One that leaves the line lets the next through.
        assert!(!b.take(Token(4), 90));
        assert!(!b.take(Token(5), 20));
        b.leave(Token(4));
        assert!(b.take(Token(5), 20));
    }
}
