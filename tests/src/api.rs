//! A connection to a test's supervisor in the API role: what `zygo api` sends, without the
//! HTTP front (its hello with the front's flags, then each request in an `Api` envelope
//! carrying the caller's token and `X-Zygo-Tenant`).

use std::io::Write;
use std::os::unix::net::UnixStream;
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
        let mut c = UnixStream::connect(sup.socket()).expect("connect to the supervisor");
        c.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("read timeout");
        c.write_all(
            &encode_frame(&Hello {
                protocol: FRONT_PROTOCOL,
                role: Role::Api,
                flags,
            })
            .expect("encode a hello"),
        )
        .expect("say hello");
        match read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME) {
            Ok(HelloReply::Welcome { .. }) => ApiConn { s: c },
            other => panic!("expected a welcome, got {other:?}\n{}", sup.log()),
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
