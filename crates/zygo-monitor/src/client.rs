//! The supervisor's client, as the CLI and `zygo mcp` use it: its socket, then a hello
//! that names the front's role (which decides what it may ask).

use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use crate::paths;

pub use plumbing::hello::HelloError;

pub const NO_SUPERVISOR: &str = "no supervisor is running; start one with `zygo up`";

/// Why the supervisor's socket could not be reached.
#[derive(Debug)]
pub enum ReachError {
    /// No socket, or nothing listening on it, at any of the places tried (in order).
    NotRunning {
        tried: Vec<PathBuf>,
    },
    Unreachable(String),
}

impl ReachError {
    /// Where it looked, in words: "no supervisor listens at A" or "… at A, B or C".
    pub fn tried_text(tried: &[PathBuf]) -> String {
        let shown: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        match shown.as_slice() {
            [] => String::new(),
            [one] => format!("no supervisor listens at {one}"),
            [rest @ .., last] => format!("no supervisor listens at {} or {last}", rest.join(", ")),
        }
    }
}

impl std::fmt::Display for ReachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReachError::NotRunning { tried } if tried.is_empty() => f.write_str(NO_SUPERVISOR),
            ReachError::NotRunning { tried } => {
                write!(f, "{NO_SUPERVISOR} ({})", ReachError::tried_text(tried))
            }
            ReachError::Unreachable(e) => f.write_str(e),
        }
    }
}

/// Connect to the supervisor's socket (nothing said yet; [`hello`] is what a front says
/// first): the first of [`paths::socket_candidates`] something listens on.
pub fn connect() -> Result<UnixStream, ReachError> {
    let tried = paths::socket_candidates();
    for path in &tried {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) => {}
            // Only the place this environment names is an error to be unable to reach: the
            // others are guesses, and one this user cannot enter is not its supervisor's.
            Err(_) if tried.first() != Some(path) => {}
            Err(e) => {
                return Err(ReachError::Unreachable(format!(
                    "could not reach the supervisor at {}: {e}",
                    path.display()
                )))
            }
        }
    }
    Err(ReachError::NotRunning { tried })
}

/// Say hello as `role` (a front without flags: the CLI, `zygo mcp`) and read the
/// supervisor's answer.
pub fn hello(sock: &mut UnixStream, role: proto::front::Role) -> Result<(), HelloError> {
    plumbing::hello::say(sock, role, Default::default())
}
