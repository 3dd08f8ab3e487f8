//! The supervisor's client, as the CLI and `zygo mcp` use it: its socket, then a hello
//! that names the front's role (which decides what it may ask).

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use proto::front::Request;

use crate::paths;

pub use crate::hello::HelloError;

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
    crate::hello::say(sock, role, Default::default())
}

/// How long the host's fronts (the CLI, `zygo mcp`) wait on the supervisor's socket for
/// the next bytes of their answer to `req` before giving up with an error: a supervisor
/// that never answers (stuck, or an answer lost) is reported, not waited for forever.
/// Generous: the longest the request may rightly take, and a minute.
pub fn reply_wait(req: &Request) -> Duration {
    const MARGIN: Duration = Duration::from_secs(60);
    let longest = proto::front::MAX_DURATION;
    let took = match req {
        // A call runs until its deadline: the one asked for, else its function's (24 h at
        // most). A streamed call's events each restart the wait.
        Request::Exec(e) => e
            .timeout_ms
            .map_or(longest, |ms| Duration::from_millis(ms).min(longest)),
        Request::Run { .. } => longest,
        Request::Drain { grace_ms } => Duration::from_millis(*grace_ms).min(longest),
        // Serving waits for zygotes to import their handler, and for a dependency set's
        // build (15 minutes at most).
        Request::Serve { .. } | Request::ServeAll { .. } | Request::ServeLayer { .. } => {
            Duration::from_secs(30 * 60)
        }
        // Everything else is answered at once (a store write first, at most).
        _ => Duration::ZERO,
    };
    took.saturating_add(MARGIN)
}

/// How long the host's fronts wait for the supervisor's answer to their hello.
pub const HELLO_WAIT: Duration = Duration::from_secs(60);

/// Whether a channel error is a read that waited its whole timeout.
pub fn timed_out(e: &proto::ProtoError) -> bool {
    matches!(e, proto::ProtoError::Io(io) if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::front::ExecRequest;

    #[test]
    fn an_answer_is_waited_for_as_long_as_its_request_may_take_never_forever() {
        let exec = |timeout_ms| {
            Request::Exec(ExecRequest {
                name: "f".into(),
                event: "{}".into(),
                key: None,
                timeout_ms,
                stream: false,
                script: None,
                workspace: None,
                workspace_blob: None,
                out: false,
            })
        };
        let min = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(reply_wait(&exec(Some(5_000))), Duration::from_secs(65));
        assert_eq!(reply_wait(&exec(None)), min(24 * 60 + 1));
        assert_eq!(reply_wait(&exec(Some(u64::MAX))), min(24 * 60 + 1));
        assert_eq!(
            reply_wait(&Request::Drain { grace_ms: u64::MAX }),
            min(24 * 60 + 1)
        );
        assert_eq!(reply_wait(&Request::ServeAll { file: "f".into() }), min(31));
        for quick in [
            Request::Logs {
                name: "f".into(),
                n: 1000,
            },
            Request::List,
            Request::Health,
        ] {
            assert_eq!(reply_wait(&quick), min(1), "{quick:?}");
        }
    }
}
