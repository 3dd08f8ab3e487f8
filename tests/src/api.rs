//! A connection to a test's supervisor in the API role: what `zygo api` sends, without the
//! HTTP front (its hello with the front's flags, then each request in an `Api` envelope
//! carrying the caller's token and `X-Zygo-Tenant`).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use proto::api::{Credentials, FrontFlags};
use proto::front::{Hello, HelloReply, Reply, Request, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME};
use proto::{encode_frame, read_frame};

use crate::Sup;

pub struct ApiConn {
    s: UnixStream,
}

impl ApiConn {
    /// Say hello as the API role with these flags (`--allow-deploy` and the rest).
    pub fn open(sup: &Sup, flags: FrontFlags) -> ApiConn {
        ApiConn::connect(&sup.socket(), flags).unwrap_or_else(|e| panic!("{e}\n{}", sup.log()))
    }

    /// The same, given only the supervisor's socket (from another thread, say).
    pub fn connect(socket: &Path, flags: FrontFlags) -> Result<ApiConn, String> {
        let mut c = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
        c.set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| format!("read timeout: {e}"))?;
        let hello = encode_frame(&Hello {
            protocol: FRONT_PROTOCOL,
            role: Role::Api,
            flags,
        })
        .map_err(|e| format!("encode a hello: {e}"))?;
        c.write_all(&hello).map_err(|e| format!("say hello: {e}"))?;
        match read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME) {
            Ok(HelloReply::Welcome { .. }) => Ok(ApiConn { s: c }),
            other => Err(format!("expected a welcome, got {other:?}")),
        }
    }

    /// One request as the holder of `token`, acting for `tenant`: its final reply (events
    /// of a streamed answer are skipped).
    pub fn ask(&mut self, token: &str, tenant: Option<&str>, req: Request) -> Reply {
        let env = Request::Api {
            who: Credentials {
                token: Some(token.to_string()),
                tenant: tenant.map(str::to_string),
            },
            request: Box::new(req),
        };
        self.s
            .write_all(&encode_frame(&env).expect("encode"))
            .expect("send a request");
        loop {
            match read_frame::<_, Reply>(&mut self.s, MAX_FRONT_FRAME) {
                Ok(Reply::Event(_)) => continue,
                Ok(r) => return r,
                Err(e) => panic!("no reply from the supervisor: {e}"),
            }
        }
    }
}
