//! Length-prefixed frames: a 4-byte little-endian payload length, then the payload.
//!
//! Blocking readers use [`read_frame`]; event loops feed bytes into a [`FrameBuf`] and take
//! whole frames out. Both check the length against the channel's cap before allocating.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;

use serde::{de::DeserializeOwned, Serialize};

use crate::{codec, readbuf};

/// The largest frame any channel accepts: a 16 MiB event, or a handler's value (up to
/// 20 MiB from the agent) with its output (1 MiB per stream), plus the envelope; and room
/// beside it for a call's workspace (a tar of up to [`MAX_WORKSPACE`] bytes).
///
/// [`MAX_WORKSPACE`]: crate::front::MAX_WORKSPACE
pub const MAX_FRAME: usize = 24 * 1024 * 1024 + crate::front::MAX_WORKSPACE;

/// Why a channel was ended.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("peer closed the channel")]
    Closed,
    #[error("peer closed the channel in the middle of a frame ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("frame of {len} bytes is over this channel's cap of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("frame does not decode: {0}")]
    Decode(String),
    #[error("frame has {extra} bytes after its message")]
    TrailingBytes { extra: usize },
    #[error("message does not encode: {0}")]
    Encode(String),
    #[error("channel i/o: {0}")]
    Io(#[from] io::Error),
}

/// Write one message as a frame. The frame is assembled first and written with one call,
/// so two writers holding a lock per frame never interleave.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> Result<(), ProtoError> {
    let buf = encode_frame(msg)?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Read exactly one frame and decode it. `max` is this channel's cap (at most [`MAX_FRAME`]).
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R, max: usize) -> Result<T, ProtoError> {
    let mut len = [0u8; 4];
    let got = read_full(r, &mut len)?;
    if got == 0 {
        return Err(ProtoError::Closed);
    }
    if got < 4 {
        return Err(ProtoError::Truncated { got, want: 4 });
    }
    let len = u32::from_le_bytes(len) as usize;
    let max = max.min(MAX_FRAME);
    if len > max {
        return Err(ProtoError::TooLarge { len, max });
    }
    let mut payload = vec![0u8; len];
    let got = read_full(r, &mut payload)?;
    if got < len {
        return Err(ProtoError::Truncated { got, want: len });
    }
    codec::decode(&payload)
}

fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, ProtoError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

/// The bytes of a frame's length prefix.
pub const PREFIX: usize = 4;

/// Capacity a [`FrameBuf`] keeps between frames. A buffer grown past it for a large frame
/// is given back once that frame has been taken, so a channel that once carried a 24 MiB
/// frame does not hold 24 MiB for the rest of its life.
const KEEP: usize = 128 * 1024;

/// Incremental frame assembly for non-blocking channels.
///
/// Frames are taken from the front by moving an offset; the bytes taken are dropped when
/// more are appended, so taking many small frames out of one read copies nothing per frame.
#[derive(Debug)]
pub struct FrameBuf {
    buf: Vec<u8>,
    /// Where the next frame starts in `buf`.
    start: usize,
    max: usize,
}

impl FrameBuf {
    pub fn new(max: usize) -> Self {
        FrameBuf {
            buf: Vec::new(),
            start: 0,
            max: max.min(MAX_FRAME),
        }
    }

    /// Change the cap for the frames not taken yet: a channel whose first frame is a small
    /// hello caps that one tightly and raises the cap once it has been taken.
    pub fn set_max(&mut self, max: usize) {
        self.max = max.min(MAX_FRAME);
    }

    /// Bytes held: frames, or parts of one, read and not taken yet.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether part of a frame is held but not the whole of it.
    pub fn partial(&self) -> bool {
        match self.next_len() {
            Ok(Some(len)) => self.buffered() < PREFIX + len,
            Ok(None) => self.buffered() > 0,
            Err(_) => true,
        }
    }

    /// The payload length the next frame declares, once its prefix has arrived. Fails when
    /// it is over the cap, before any of the payload need be held.
    pub fn next_len(&self) -> Result<Option<usize>, ProtoError> {
        let head = &self.buf[self.start..];
        if head.len() < PREFIX {
            return Ok(None);
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > self.max {
            return Err(ProtoError::TooLarge { len, max: self.max });
        }
        Ok(Some(len))
    }

    /// Drop the bytes of the frames already taken.
    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// Append bytes read from the channel. Fails as soon as a length prefix names a frame
    /// over the cap, before the payload is buffered.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), ProtoError> {
        self.compact();
        self.buf.extend_from_slice(bytes);
        self.next_len().map(|_| ())
    }

    /// Append what one `read(2)` of at most `max` (> 0) bytes from `fd` brings (0 at end
    /// of stream; a non-blocking descriptor with nothing to read fails with `WouldBlock`).
    /// Once the next frame's length is known, room for the rest of it is made in one step,
    /// and a frame larger than `max` is read up to its end and no further, so its buffer
    /// is allocated once, at its size, and never doubled. Fails, as [`FrameBuf::push`]
    /// does, on a length over the cap.
    pub fn read_from(&mut self, fd: RawFd, max: usize) -> Result<usize, ProtoError> {
        self.compact();
        let mut want = max.max(1);
        if let Some(len) = self.next_len()? {
            let rest = (PREFIX + len).saturating_sub(self.buf.len());
            if rest > 0 {
                self.buf.reserve_exact(rest);
                if PREFIX + len > want {
                    want = want.min(rest);
                }
            }
        }
        let n = readbuf::read_append(fd, &mut self.buf, want)?;
        self.next_len()?;
        Ok(n)
    }

    /// Take the next whole frame, decoded, if one has arrived.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ProtoError> {
        let Some(len) = self.next_len()? else {
            return Ok(None);
        };
        if self.buffered() < PREFIX + len {
            return Ok(None);
        }
        let at = self.start + PREFIX;
        let msg = codec::decode(&self.buf[at..at + len]);
        self.start = at + len;
        self.taken();
        msg.map(Some)
    }

    /// After a frame was taken: an empty buffer starts again from its beginning, and one
    /// grown past [`KEEP`] is given back when little of it is still in use.
    fn taken(&mut self) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        if self.buf.capacity() > KEEP && self.buffered() <= KEEP / 2 {
            self.compact();
            self.buf.shrink_to(KEEP);
        }
    }

    /// Called at end of stream: bytes left over mean the peer stopped mid-frame.
    pub fn finish(&self) -> Result<(), ProtoError> {
        let held = self.buffered();
        if held == 0 {
            return Err(ProtoError::Closed);
        }
        let want = match self.next_len() {
            Ok(Some(len)) => PREFIX + len,
            Ok(None) => PREFIX,
            Err(e) => return Err(e),
        };
        Err(ProtoError::Truncated { got: held, want })
    }
}

/// One message as a whole frame (length prefix and payload), for buffered writers.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    let payload = codec::encode(msg)?;
    if payload.len() > MAX_FRAME {
        return Err(ProtoError::TooLarge {
            len: payload.len(),
            max: MAX_FRAME,
        });
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&payload);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use super::{encode_frame, FrameBuf, ProtoError, KEEP, MAX_FRAME, PREFIX};
    use crate::front::{Hello, Request, Role, FRONT_PROTOCOL};

    fn hello() -> Vec<u8> {
        encode_frame(&Hello {
            protocol: FRONT_PROTOCOL,
            role: Role::Cli,
            flags: Default::default(),
        })
        .expect("encode")
    }

    #[test]
    fn a_first_frame_cap_does_not_apply_to_the_frames_behind_it() {
        let big = encode_frame(&Request::Cancel {
            key: "k".repeat(1000),
        })
        .expect("encode");
        let mut bytes = hello();
        bytes.extend_from_slice(&big);
        let mut fb = FrameBuf::new(16);
        fb.push(&bytes).expect("push");
        assert!(fb.next_frame::<Hello>().expect("hello").is_some());
        // Still capped at 16: the request behind it is refused, not misread...
        assert!(matches!(
            fb.next_frame::<Request>(),
            Err(ProtoError::TooLarge { max: 16, .. })
        ));
        // ...until the cap is raised, and then it is whole and still there.
        fb.set_max(MAX_FRAME);
        let r = fb.next_frame::<Request>().expect("request");
        assert!(matches!(r, Some(Request::Cancel { key }) if key.len() == 1000));
        assert_eq!(fb.buffered(), 0);
    }

    #[test]
    fn a_large_frame_is_read_to_its_end_and_no_further_and_its_buffer_given_back() {
        let (r, w) = UnixStream::pair().expect("socketpair");
        r.set_nonblocking(true).expect("non-blocking");
        let big = encode_frame(&Request::PutScript {
            source: vec![7; 300_000],
        })
        .expect("encode");
        let small = encode_frame(&Request::List).expect("encode");
        let writer = {
            let mut bytes = big.clone();
            bytes.extend_from_slice(&small);
            std::thread::spawn(move || (&w).write_all(&bytes).expect("write"))
        };
        let mut fb = FrameBuf::new(MAX_FRAME);
        while fb.buffered() < big.len() {
            match fb.read_from(r.as_raw_fd(), 64 * 1024) {
                Ok(n) => assert!(n > 0, "end of stream mid-frame"),
                Err(ProtoError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::yield_now()
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_eq!(
            fb.buffered(),
            big.len(),
            "read past the end of a large frame"
        );
        assert_eq!(
            fb.buf.capacity(),
            big.len(),
            "one allocation, at the frame's size"
        );
        assert!(matches!(
            fb.next_frame::<Request>().expect("decode"),
            Some(Request::PutScript { source }) if source.len() == 300_000
        ));
        assert!(fb.buf.capacity() <= KEEP, "the large buffer is given back");
        writer.join().expect("writer");
        while fb.buffered() < small.len() {
            fb.read_from(r.as_raw_fd(), 64 * 1024).expect("read");
        }
        assert_eq!(
            fb.next_frame::<Request>().expect("decode"),
            Some(Request::List)
        );
    }

    #[test]
    fn partial_tells_a_started_frame_from_whole_ones() {
        let mut fb = FrameBuf::new(MAX_FRAME);
        assert!(!fb.partial());
        let list = encode_frame(&Request::List).expect("encode");
        fb.push(&list[..2]).expect("push");
        assert!(fb.partial());
        fb.push(&list[2..]).expect("push");
        assert!(!fb.partial());
        assert_eq!(fb.next_len().expect("len"), Some(list.len() - PREFIX));
        fb.next_frame::<Request>().expect("decode");
        assert!(!fb.partial());
        assert!(matches!(fb.finish(), Err(ProtoError::Closed)));
    }
}
