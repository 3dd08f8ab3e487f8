//! `proto`: every message that crosses a process boundary between Zygo's own processes
//! (front ⇄ monitor, monitor ⇄ launcher), and the framing that carries them.
//!
//! Trust: none. A frame may come from a confined front that has been taken over, or from a
//! launcher whose sandbox misbehaved. Frames are length-prefixed; the length is checked
//! against a hard cap *before* anything is allocated, and a frame must decode to exactly one
//! known message with no bytes left over. Anything else ends the channel: there is no
//! recovery from a protocol violation, and no free-form payload tunnelled inside a message.
//!
//! Every call into the codec (bincode 2, which is unmaintained) lives in [`codec`], so it can
//! be swapped without touching the message types.
//!
//! Beside the messages, the one parser for JSON that comes from outside — MCP messages, the
//! lines a sandbox writes, events ([`json`]): serde_json, with an object that repeats a key
//! refused. The process plumbing the messages travel in (descriptor passing, the spawn,
//! the hello) is the `plumbing` crate's.

pub mod api;
pub mod bytes;
pub mod codec;
pub mod frame;
pub mod front;
pub mod json;
pub mod json_scan;
pub mod keeper;
pub mod launch;
pub mod mcp;
pub mod readbuf;

pub use frame::{encode_frame, read_frame, write_frame, FrameBuf, ProtoError};

#[cfg(test)]
mod tests;
