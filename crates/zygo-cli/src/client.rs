//! The CLI as a front: connect to the supervisor's socket, say hello as `Cli`, send one
//! request, read the replies.

use std::os::unix::net::UnixStream;

use plumbing::client as supervisor;
use proto::front::{Reply, Request, Role, MAX_FRONT_FRAME};
use proto::{read_frame, write_frame};

pub struct Client {
    sock: UnixStream,
}

/// Why the CLI could not talk to a supervisor.
pub enum ConnectError {
    /// No socket, or nothing listening on it, at any of these places.
    NotRunning(Vec<std::path::PathBuf>),
    /// The socket could not be reached (e.g. no permission).
    Unreachable(String),
    /// The supervisor refused the hello.
    Refused(String),
    /// The connection ended before the hello was answered: the supervisor is going away
    /// (draining, exiting) or what listens there is not one.
    Gone(String),
    /// The hello failed on the wire.
    Broken(String),
}

impl ConnectError {
    /// The word a `--json` refusal carries in `code`.
    pub fn code(&self) -> &'static str {
        match self {
            ConnectError::NotRunning(_) | ConnectError::Unreachable(_) | ConnectError::Gone(_) => {
                "unavailable"
            }
            ConnectError::Refused(_) => "forbidden",
            ConnectError::Broken(_) => "internal",
        }
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::NotRunning(tried) => write!(
                f,
                "{}",
                supervisor::ReachError::NotRunning {
                    tried: tried.clone()
                }
            ),
            ConnectError::Unreachable(e) => f.write_str(e),
            ConnectError::Refused(reason) => write!(f, "the supervisor refused: {reason}"),
            ConnectError::Broken(e) => write!(f, "talk to the supervisor: {e}"),
            ConnectError::Gone(e) => write!(
                f,
                "the supervisor ended the connection before it answered ({e}); it may be stopping"
            ),
        }
    }
}

/// Whether a channel error is the peer going away (closed or reset), not a bad frame.
fn ended(e: &proto::ProtoError) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    match e {
        proto::ProtoError::Closed => true,
        proto::ProtoError::Io(io) => {
            matches!(io.kind(), BrokenPipe | ConnectionReset | UnexpectedEof)
        }
        _ => false,
    }
}

impl Client {
    pub fn connect() -> Result<Client, ConnectError> {
        let mut sock = supervisor::connect().map_err(|e| match e {
            supervisor::ReachError::NotRunning { tried } => ConnectError::NotRunning(tried),
            supervisor::ReachError::Unreachable(e) => ConnectError::Unreachable(e),
        })?;
        // Neither the hello nor any answer is waited for forever (see `reply_wait`).
        sock.set_read_timeout(Some(supervisor::HELLO_WAIT))
            .map_err(|e| ConnectError::Broken(format!("set a timeout on the socket: {e}")))?;
        match supervisor::hello(&mut sock, Role::Cli) {
            Ok(()) => Ok(Client { sock }),
            Err(supervisor::HelloError::Refused(reason)) => Err(ConnectError::Refused(reason)),
            Err(supervisor::HelloError::Proto(e)) if supervisor::timed_out(&e) => {
                Err(ConnectError::Broken(format!(
                    "it did not answer the hello within {}s; it may be stuck (its log may say why)",
                    supervisor::HELLO_WAIT.as_secs()
                )))
            }
            Err(supervisor::HelloError::Proto(e)) => Err(if ended(&e) {
                ConnectError::Gone(e.to_string())
            } else {
                ConnectError::Broken(e.to_string())
            }),
        }
    }

    pub fn send(&mut self, req: &Request) -> Result<(), String> {
        write_frame(&mut self.sock, req).map_err(|e| format!("send to the supervisor: {e}"))
    }

    pub fn recv(&mut self) -> Result<Reply, String> {
        read_frame::<_, Reply>(&mut self.sock, MAX_FRONT_FRAME).map_err(|e| match e {
            proto::ProtoError::Closed => "the supervisor closed the connection".to_string(),
            e if supervisor::timed_out(&e) => {
                "the supervisor did not answer in time; it may be stuck (its log may say why)"
                    .to_string()
            }
            e => format!("read from the supervisor: {e}"),
        })
    }

    /// Wait, at most `limit`, for the supervisor to close this connection, which it does
    /// when it exits: whether it did.
    pub fn wait_closed(&mut self, limit: std::time::Duration) -> bool {
        use std::io::Read;
        let deadline = std::time::Instant::now() + limit;
        let mut buf = [0u8; 512];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || self.sock.set_read_timeout(Some(left)).is_err() {
                return false;
            }
            match self.sock.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                // Reset: it is gone too.
                Err(_) => return true,
            }
        }
    }

    /// One request, one final reply (events are passed to `on_event`). The supervisor's
    /// answer is waited for as long as the request may rightly take, and a minute
    /// (`reply_wait`), never forever.
    pub fn call(
        &mut self,
        req: &Request,
        mut on_event: impl FnMut(&proto::front::ExecEvent),
    ) -> Result<Reply, String> {
        self.sock
            .set_read_timeout(Some(supervisor::reply_wait(req)))
            .map_err(|e| format!("set a timeout on the socket: {e}"))?;
        self.send(req)?;
        loop {
            match self.recv()? {
                Reply::Event(ev) => on_event(&ev),
                other => return Ok(other),
            }
        }
    }
}
