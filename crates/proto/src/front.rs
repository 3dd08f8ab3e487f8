//! front ⇄ monitor: the hello every front sends first. Its role, fixed for the life of the
//! channel, selects the one dispatch table the monitor will use for everything after it.

use serde::{Deserialize, Serialize};

/// Protocol revision spoken on front channels. A hello with another revision ends the
/// channel: fronts and monitor come from the same binary.
pub const FRONT_PROTOCOL: u32 = 1;

/// Cap for frames on a front channel: a 16 MiB event plus its envelope.
pub const MAX_FRONT_FRAME: usize = crate::frame::MAX_FRAME;

/// Which kind of front is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Cli,
    Api,
    Mcp,
}

/// The first frame on every front channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub role: Role,
}

/// The monitor's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    Welcome { version: String },
    Refused { reason: String },
}
