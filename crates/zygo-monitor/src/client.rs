//! The supervisor's client, as the CLI and `zygo mcp` use it: its socket, then a hello
//! that names the front's role (which decides what it may ask).

use std::os::unix::net::UnixStream;

use crate::paths;

pub use plumbing::hello::HelloError;

pub const NO_SUPERVISOR: &str = "no supervisor is running; start one with `zygo up`";

/// Why the supervisor's socket could not be reached.
#[derive(Debug)]
pub enum ReachError {
    /// No socket, or nothing listening on it.
    NotRunning,
    Unreachable(String),
}

impl std::fmt::Display for ReachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReachError::NotRunning => f.write_str(NO_SUPERVISOR),
            ReachError::Unreachable(e) => f.write_str(e),
        }
    }
}

/// Connect to the supervisor's socket (nothing said yet; [`hello`] is what a front says
/// first).
pub fn connect() -> Result<UnixStream, ReachError> {
    let path = paths::socket_path();
    UnixStream::connect(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ReachError::NotRunning
        }
        _ => ReachError::Unreachable(format!(
            "could not reach the supervisor at {}: {e}",
            path.display()
        )),
    })
}

/// Say hello as `role` (a front without flags: the CLI, `zygo mcp`) and read the
/// supervisor's answer.
pub fn hello(sock: &mut UnixStream, role: proto::front::Role) -> Result<(), HelloError> {
    plumbing::hello::say(sock, role, Default::default())
}
