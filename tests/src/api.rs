//! A connection to a test's supervisor in the API role: what `zygo api` sends, without the
//! HTTP front (its hello with the front's flags, then each request in an `Api` envelope
//! carrying the caller's token and `X-Zygo-Tenant`).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
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
        self.send(token, tenant, req);
        self.recv()
    }

    /// Send a request without waiting for its reply.
    pub fn send(&mut self, token: &str, tenant: Option<&str>, req: Request) {
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
    }

    /// The connection itself.
    pub fn stream(&mut self) -> &mut UnixStream {
        &mut self.s
    }

    /// The final reply to the request sent last (events of a streamed answer skipped).
    pub fn recv(&mut self) -> Reply {
        loop {
            match read_frame::<_, Reply>(&mut self.s, MAX_FRONT_FRAME) {
                Ok(Reply::Event(_)) => continue,
                Ok(r) => return r,
                Err(e) => panic!("no reply from the supervisor: {e}"),
            }
        }
    }
}

/// `zygo token mint [--tenant T] --json` on the test's supervisor: the token's id and
/// secret.
pub fn mint(s: &Sup, tenant: Option<&str>) -> (String, String) {
    let mut args = vec!["token", "mint", "--json"];
    if let Some(t) = tenant {
        args.extend(["--tenant", t]);
    }
    let f = s.run(&args);
    assert_eq!(
        f.code,
        0,
        "zygo token mint: {}\n{}",
        f.stderr_text(),
        s.log()
    );
    let v = f.last_json();
    (
        crate::text(&v, "id").to_string(),
        crate::text(&v, "secret").to_string(),
    )
}

/// A `POST /run` body, from its JSON as the HTTP front parses it.
pub fn run_body(spec: &serde_json::Value) -> proto::api::RunBody {
    zygo_front::http::bodies::run::parse(spec.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("the run's body {spec}: {e}"))
}

/// A layer (`PUT /fn/{name}`, `POST /runtimes`), from its JSON text as the HTTP front
/// parses it.
pub fn layer(text: &str) -> Box<proto::api::LayerBody> {
    Box::new(
        zygo_front::http::bodies::layer::parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("the layer {text}: {e}")),
    )
}

/// A tenant id no other test (or run) has: `tag` and a number.
pub fn tenant_id(tag: &str) -> String {
    format!("{tag}{:x}", crate::unique() & 0xff_ffff_ffff)
}

/// A `zygo api` of a test's own, listening on a loopback port it chose; stopped (SIGTERM,
/// then reaped) when dropped.
pub struct HttpFront {
    pub child: std::process::Child,
    /// `IP:PORT` it listens on.
    pub addr: String,
    /// What it has written to stderr (its log), a line at a time.
    said: Arc<Mutex<String>>,
}

impl HttpFront {
    /// Its log so far.
    pub fn log(&self) -> String {
        self.said
            .lock()
            .map_or_else(|e| e.into_inner().clone(), |s| s.clone())
    }

    /// Its log once it has a line `has` says yes to, waiting up to 10 s: its stderr is
    /// read on a thread of the test's, so a line the front wrote just before its answer
    /// may not be here yet when the answer is. Its log as it is after 10 s otherwise.
    pub fn log_once(&self, has: impl Fn(&str) -> bool) -> String {
        let t0 = std::time::Instant::now();
        loop {
            let text = self.log();
            if has(&text) || t0.elapsed() > std::time::Duration::from_secs(10) {
                return text;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for HttpFront {
    fn drop(&mut self) {
        // One that exited on its own (and was reaped) is not signalled: its pid may be
        // another process's by now.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling the child this test started, which has not been reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}

/// Start `zygo api --listen 127.0.0.1:0` with `flags` in front of the test's supervisor,
/// and wait for the address it says it listens on.
pub fn start_http_front(s: &Sup, flags: &[&str]) -> HttpFront {
    use std::io::{BufRead, BufReader};
    let mut c = s.cmd(&["api", "--listen", "127.0.0.1:0"]);
    c.args(flags)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("start zygo api");
    let mut lines = BufReader::new(child.stderr.take().expect("its stderr")).lines();
    let said = Arc::new(Mutex::new(String::new()));
    let keep = |said: &Mutex<String>, line: &str| {
        let mut said = said.lock().unwrap_or_else(|e| e.into_inner());
        said.push_str(line);
        said.push('\n');
    };
    let mut addr = None;
    for line in lines.by_ref() {
        let Ok(line) = line else { break };
        keep(&said, &line);
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
            break;
        }
    }
    // Keep reading, or the front blocks writing its log.
    let rest = said.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep(&rest, &line);
        }
    });
    let addr = addr.unwrap_or_else(|| {
        panic!(
            "zygo api did not start: {}\n{}",
            said.lock().map(|s| s.clone()).unwrap_or_default(),
            s.log()
        )
    });
    HttpFront { child, addr, said }
}
