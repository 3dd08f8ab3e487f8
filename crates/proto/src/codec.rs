//! The only module that calls the codec. Messages are serde types; the wire format is
//! bincode 2 (standard config: little-endian, varint integers) with a decode limit that
//! follows the payload's size (see [`decode`]), so a hostile length inside a frame cannot
//! make the decoder set aside much more than the frame could hold.

use serde::{de::DeserializeOwned, Serialize};

use crate::frame::{ProtoError, MAX_FRAME};

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME>()
}

/// How much more than its encoded size a message may make the decoder set aside. bincode
/// counts every value at its size in memory (a `u64` is 8 bytes, however few it took on the
/// wire; a `u128`, 16) and a string or byte buffer at its length, which it reserves before
/// it reads the bytes: a message the encoder wrote never counts more than 16 times its
/// size, and one that declares more is refused before anything is reserved.
const GROWTH: usize = 64;

/// The decode limits, smallest first; a payload gets the first that is at least
/// [`GROWTH`] times its size, or the frame cap.
const LIMITS: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];

fn decode_within<T: DeserializeOwned, const N: usize>(
    payload: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    bincode::serde::decode_from_slice::<T, _>(
        payload,
        bincode::config::standard().with_limit::<N>(),
    )
}

/// Encode one message into its payload bytes (without the length prefix).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    bincode::serde::encode_to_vec(msg, config()).map_err(|e| ProtoError::Encode(e.to_string()))
}

/// Decode one message from a whole payload. Trailing bytes are an error: a frame holds
/// exactly one message.
///
/// What the decoder may set aside follows the payload's size: a ten-byte frame that
/// declares an 80 MiB string is refused at the declaration, not after 80 MiB are reserved.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ProtoError> {
    let want = payload.len().saturating_mul(GROWTH);
    let decoded = if want <= LIMITS[0] {
        decode_within::<T, { LIMITS[0] }>(payload)
    } else if want <= LIMITS[1] {
        decode_within::<T, { LIMITS[1] }>(payload)
    } else if want <= LIMITS[2] {
        decode_within::<T, { LIMITS[2] }>(payload)
    } else {
        decode_within::<T, MAX_FRAME>(payload)
    };
    let (msg, used) = decoded.map_err(|e| ProtoError::Decode(e.to_string()))?;
    if used != payload.len() {
        return Err(ProtoError::TrailingBytes {
            extra: payload.len() - used,
        });
    }
    Ok(msg)
}
