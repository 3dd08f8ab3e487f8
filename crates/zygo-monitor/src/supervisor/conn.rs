//! A non-blocking, frame-oriented connection (a front or a launcher) for the event loop.

use std::io::Write;
use std::os::fd::AsRawFd;

use proto::readbuf::read_append;
use proto::{encode_frame, FrameBuf, ProtoError};
use serde::{de::DeserializeOwned, Serialize};

/// The most we buffer for a peer that does not read; past it the peer is dropped.
const MAX_OUT: usize = 64 * 1024 * 1024;

/// The most read from the socket at once.
const CHUNK: usize = 64 * 1024;

pub struct Conn {
    pub stream: mio::net::UnixStream,
    inbuf: FrameBuf,
    /// What one read brought, on its way into `inbuf`.
    scratch: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
    pub closed: bool,
}

impl Conn {
    pub fn new(stream: mio::net::UnixStream, max_frame: usize) -> Conn {
        Conn {
            stream,
            inbuf: FrameBuf::new(max_frame),
            scratch: Vec::new(),
            out: Vec::new(),
            sent: 0,
            closed: false,
        }
    }

    /// Queue one message and write as much as the socket takes now.
    pub fn send<T: Serialize>(&mut self, msg: &T) {
        if self.closed {
            return;
        }
        match encode_frame(msg) {
            Ok(f) => {
                if self.out.len() - self.sent + f.len() > MAX_OUT {
                    log::warn!("a peer is not reading its answers; dropping it");
                    self.closed = true;
                    return;
                }
                self.out.extend_from_slice(&f);
                self.flush();
            }
            Err(e) => log::error!("encode a message: {e}"),
        }
    }

    /// Whether queued bytes have not reached the socket yet.
    pub fn pending(&self) -> bool {
        !self.closed && self.sent < self.out.len()
    }

    pub fn flush(&mut self) {
        while self.sent < self.out.len() {
            match self.stream.write(&self.out[self.sent..]) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
        self.out.clear();
        self.sent = 0;
    }

    /// Read everything available. Returns the messages that completed; an error (a bad
    /// frame, or end of stream mid-frame) ends the connection. `Ok((msgs, true))` means the
    /// peer closed cleanly after these.
    pub fn receive<T: DeserializeOwned>(&mut self) -> Result<(Vec<T>, bool), ProtoError> {
        let mut eof = false;
        loop {
            self.scratch.clear();
            match read_append(self.stream.as_raw_fd(), &mut self.scratch, CHUNK) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(_) => self.inbuf.push(&self.scratch)?,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut msgs = Vec::new();
        while let Some(m) = self.inbuf.next_frame::<T>()? {
            msgs.push(m);
        }
        if eof {
            match self.inbuf.finish() {
                Err(ProtoError::Closed) => {}
                Err(e) => return Err(e),
                Ok(()) => {}
            }
        }
        Ok((msgs, eof))
    }
}
