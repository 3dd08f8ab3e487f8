//! The CLI as a front: connect to the supervisor's socket, say hello as `Cli`, send one
//! request, read the replies.

use std::os::unix::net::UnixStream;

use proto::front::{Hello, HelloReply, Reply, Request, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME};
use proto::{read_frame, write_frame};

pub struct Client {
    sock: UnixStream,
}

/// Why the CLI could not talk to a supervisor.
pub enum ConnectError {
    NotRunning,
    Other(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::NotRunning => {
                f.write_str("no supervisor is running; start one with `zygo up`")
            }
            ConnectError::Other(e) => f.write_str(e),
        }
    }
}

impl Client {
    pub fn connect() -> Result<Client, ConnectError> {
        let path = zygo_monitor::paths::socket_path();
        let mut sock = match UnixStream::connect(&path) {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Err(ConnectError::NotRunning)
            }
            Err(e) => {
                return Err(ConnectError::Other(format!(
                    "connect to {}: {e}",
                    path.display()
                )))
            }
        };
        write_frame(
            &mut sock,
            &Hello {
                protocol: FRONT_PROTOCOL,
                role: Role::Cli,
            },
        )
        .map_err(|e| ConnectError::Other(format!("talk to the supervisor: {e}")))?;
        match read_frame::<_, HelloReply>(&mut sock, MAX_FRONT_FRAME) {
            Ok(HelloReply::Welcome { .. }) => Ok(Client { sock }),
            Ok(HelloReply::Refused { reason }) => Err(ConnectError::Other(format!(
                "the supervisor refused: {reason}"
            ))),
            Err(e) => Err(ConnectError::Other(format!("talk to the supervisor: {e}"))),
        }
    }

    pub fn send(&mut self, req: &Request) -> Result<(), String> {
        write_frame(&mut self.sock, req).map_err(|e| format!("send to the supervisor: {e}"))
    }

    pub fn recv(&mut self) -> Result<Reply, String> {
        read_frame::<_, Reply>(&mut self.sock, MAX_FRONT_FRAME).map_err(|e| match e {
            proto::ProtoError::Closed => "the supervisor closed the connection".to_string(),
            e => format!("read from the supervisor: {e}"),
        })
    }

    /// One request, one final reply (events are passed to `on_event`).
    pub fn call(
        &mut self,
        req: &Request,
        mut on_event: impl FnMut(&proto::front::ExecEvent),
    ) -> Result<Reply, String> {
        self.send(req)?;
        loop {
            match self.recv()? {
                Reply::Event(ev) => on_event(&ev),
                other => return Ok(other),
            }
        }
    }
}
