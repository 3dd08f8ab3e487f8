//! The only module that calls the codec. Messages are serde types; the wire format is
//! bincode 2 (standard config: little-endian, varint integers) with a decode limit equal to
//! the frame cap, so a hostile length inside a frame cannot make the decoder allocate more
//! than the frame itself could hold.

use serde::{de::DeserializeOwned, Serialize};

use crate::frame::{ProtoError, MAX_FRAME};

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME>()
}

/// Encode one message into its payload bytes (without the length prefix).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    bincode::serde::encode_to_vec(msg, config()).map_err(|e| ProtoError::Encode(e.to_string()))
}

/// Decode one message from a whole payload. Trailing bytes are an error: a frame holds
/// exactly one message.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ProtoError> {
    let (msg, used) = bincode::serde::decode_from_slice::<T, _>(payload, config())
        .map_err(|e| ProtoError::Decode(e.to_string()))?;
    if used != payload.len() {
        return Err(ProtoError::TrailingBytes {
            extra: payload.len() - used,
        });
    }
    Ok(msg)
}
