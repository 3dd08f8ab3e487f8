//! Length-prefixed frames: a 4-byte little-endian payload length, then the payload.
//!
//! Blocking readers use [`read_frame`]; event loops feed bytes into a [`FrameBuf`] and take
//! whole frames out. Both check the length against the channel's cap before allocating.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Serialize};

use crate::codec;

/// The largest frame any channel accepts: a 16 MiB event, or a handler's value (up to
/// 20 MiB from the agent) with its output (1 MiB per stream), plus the envelope.
pub const MAX_FRAME: usize = 24 * 1024 * 1024;

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

/// Incremental frame assembly for non-blocking channels.
#[derive(Debug)]
pub struct FrameBuf {
    buf: Vec<u8>,
    max: usize,
}

impl FrameBuf {
    pub fn new(max: usize) -> Self {
        FrameBuf {
            buf: Vec::new(),
            max: max.min(MAX_FRAME),
        }
    }

    /// Append bytes read from the channel. Fails as soon as a length prefix names a frame
    /// over the cap, before the payload is buffered.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), ProtoError> {
        self.buf.extend_from_slice(bytes);
        self.check_len()
    }

    fn check_len(&self) -> Result<(), ProtoError> {
        if self.buf.len() >= 4 {
            let len =
                u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            if len > self.max {
                return Err(ProtoError::TooLarge { len, max: self.max });
            }
        }
        Ok(())
    }

    /// Take the next whole frame, decoded, if one has arrived.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ProtoError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.max {
            return Err(ProtoError::TooLarge { len, max: self.max });
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let msg = codec::decode(&self.buf[4..4 + len]);
        self.buf.drain(..4 + len);
        self.check_len()?;
        msg.map(Some)
    }

    /// Called at end of stream: bytes left over mean the peer stopped mid-frame.
    pub fn finish(&self) -> Result<(), ProtoError> {
        if self.buf.is_empty() {
            return Err(ProtoError::Closed);
        }
        let want = if self.buf.len() < 4 {
            4
        } else {
            4 + u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize
        };
        Err(ProtoError::Truncated {
            got: self.buf.len(),
            want,
        })
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
