//! `zygo api`, the HTTP front, against a stand-in supervisor: a socket in this test that
//! welcomes the API role's hello and answers each request with a canned reply, recording
//! what it was sent. What these tests hold the front to is its own part: HTTP, JSON, the
//! status codes and error shapes, the limits on sizes and times, confinement. Who a caller
//! is and what they may do is the supervisor's, tested through a real one elsewhere.
//!
//! - the confined front: no_new_privs, seccomp, no capabilities in any set, and after a
//!   run of hostile requests no descriptor but its sockets and the ones it started with;
//! - a body over 16 MiB is 413 before it is read; an idle keep-alive connection is closed
//!   after 30 s; slow, half-sent and malformed requests get their status and never stop
//!   the front; the next good request is served;
//! - every route with malformed JSON, wrong types, unknown fields, bad names, digests and
//!   keys, bad tokens and tenant headers: 4xx with `{"error", "code"}`, never a 5xx;
//! - batches (at most 16 at once, at most 1000 events), streams (NDJSON framing), `POST
//!   /run`'s 408 when the caller's deadline fires first (and the run is cancelled);
//! - SIGTERM lets a request in flight finish; past 512 connections one more is 503; slow
//!   uploads do not keep other callers waiting; deadlines that pass never cost a channel.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::api::{FrontFlags, RunAnswer, TenantInfo, TenantLimits, VersionInfo};
use proto::front::{
    ExecAnswer, ExecEvent, FunctionInfo, Health, Hello, HelloReply, Metrics, Outcome, Reply,
    Request, Role, UsageLogHealth, ZygoteCounts, MAX_FRONT_FRAME,
};
use proto::{read_frame, write_frame};
use serde_json::{json, Value};
use zygo_tests::http::{head, read_resp, Resp};
use zygo_tests::*;

const OP: &str = "zygo_op";

// ---------------------------------------------------------------------------------------
// The stand-in supervisor.

#[derive(Default)]
struct Seen {
    /// Every inner request, with the credentials it came with.
    requests: Vec<(Option<String>, Option<String>, Request)>,
    hellos: Vec<(Role, FrontFlags)>,
    /// Channels that closed while a request on them was unanswered.
    closed_mid_request: usize,
    in_flight: usize,
    max_in_flight: usize,
}

struct Fake {
    dir: TempDir,
    seen: Arc<Mutex<Seen>>,
}

fn function(name: &str, kind: &str) -> FunctionInfo {
    FunctionInfo {
        name: name.into(),
        tenant: None,
        kind: kind.into(),
        state: "serving".into(),
        error: None,
        zygotes: ZygoteCounts {
            ready: 1,
            busy: 0,
            frozen: 0,
            starting: 0,
        },
        in_flight: 0,
        min_warm: 1,
        max_warm: 4,
    }
}

fn answer(id: &str, result: &str) -> ExecAnswer {
    ExecAnswer {
        request_id: id.into(),
        outcome: Outcome::Ok,
        result: Some(result.into()),
        error: None,
        traceback: None,
        exit_code: None,
        started: true,
        oom_killed: false,
        stdout: String::new(),
        stdout_truncated: false,
        stderr: String::new(),
        stderr_truncated: false,
        metrics: Metrics {
            wall_us: 1_250,
            cpu_us: 750,
            peak_rss_kb: 1000,
        },
        usage: None,
        workspace_out: None,
        workspace_out_truncated: false,
        stream_truncated: false,
    }
}

fn err(code: proto::front::ErrorCode, msg: &str) -> Reply {
    Reply::Error {
        code,
        message: msg.into(),
        retry_after: None,
    }
}

fn tenant(id: &str) -> TenantInfo {
    TenantInfo {
        id: id.into(),
        created_ms: 1,
        limits: TenantLimits {
            mem_bytes: Some(64 << 20),
            ..Default::default()
        },
        functions: vec![],
        scripts: vec!["a".repeat(64)],
        tokens: 1,
    }
}

/// The canned replies: events first, then the final reply. `tenant` is the request's
/// `X-Zygo-Tenant` (`acting`), which the operator's token acts for (as the supervisor says in
/// `Version`).
fn replies(token: &Option<String>, acting: &Option<String>, req: &Request) -> Vec<Reply> {
    use proto::front::ErrorCode::*;
    if !matches!(req, Request::Health) && token.as_deref() != Some(OP) {
        return vec![err(Unauthorized, "no such token")];
    }
    let one = |r: Reply| vec![r];
    match req {
        Request::Health => one(Reply::Health(Health {
            usage_log: UsageLogHealth {
                error: None,
                held: 0,
                dropped: 0,
            },
            stopping: false,
            below_min_warm: vec![],
        })),
        Request::Version => one(Reply::Version(VersionInfo {
            version: "0.1.0".into(),
            api: 1,
            backend: "ns".into(),
            cgroup: "v1".into(),
            landlock_abi: 6,
            private_net: None,
            tenant: acting.clone(),
        })),
        Request::List => one(Reply::Functions(vec![
            function("echo", "function"),
            function("py", "pool"),
        ])),
        Request::Exec(e) => {
            if e.name == "missing" {
                return one(err(NotFound, "no function named \"missing\""));
            }
            if e.name == "slow" {
                std::thread::sleep(Duration::from_millis(300));
            }
            if e.name == "fails" {
                let mut a = answer("req-f", "null");
                a.outcome = Outcome::Error;
                a.result = None;
                a.error = Some("ValueError: no".into());
                a.traceback = Some("Traceback ...".into());
                return one(Reply::Answer(a));
            }
            let mut v = Vec::new();
            if e.stream {
                v.push(Reply::Event(ExecEvent::Stdout("hello\n".into())));
                v.push(Reply::Event(ExecEvent::Progress("half".into())));
            }
            v.push(Reply::Answer(answer("req-1", &e.event)));
            v
        }
        Request::Run { spec } => {
            if spec.cmd.iter().any(|a| a.contains("sleep")) {
                std::thread::sleep(Duration::from_secs(3));
            }
            one(Reply::RunAnswer(RunAnswer {
                request_id: "req-run".into(),
                started: true,
                phase: "run".into(),
                error: None,
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                oom_killed: false,
                wall_us: 1500,
                cpu_us: 1_000,
                peak_rss_kb: 100,
                stdout: "hi\n".into(),
                stdout_truncated: false,
                stderr: String::new(),
                stderr_truncated: false,
                usage: None,
            }))
        }
        Request::PutScript { source } => one(Reply::ScriptStored {
            digest: "b".repeat(64),
            size: source.len() as u64,
            existed: false,
        }),
        Request::ScriptInfo { digest } => one(Reply::ScriptHeld {
            digest: digest.clone(),
            size: 3,
        }),
        Request::DeleteScript { digest } => one(Reply::ScriptDeleted {
            digest: digest.clone(),
        }),
        Request::ServeLayer { name, kind, .. } => one(Reply::ServedOne {
            name: name.clone(),
            kind: *kind,
        }),
        Request::Stop { name } => one(Reply::Stopped { name: name.clone() }),
        Request::Logs { .. } => one(Reply::Logs {
            entries: vec![],
            left_out: 0,
        }),
        Request::Stats { name } => one(Reply::Stats(vec![proto::front::FunctionStats {
            name: name.clone().unwrap_or_default(),
            requests: 1,
            ok: 1,
            error: 0,
            timeout: 0,
            cancelled: 0,
            stuck: 0,
            p50_wall_us: 10,
            p99_wall_us: 20,
            peak_rss_kb: 1,
        }])),
        Request::Warm { name, n } => one(Reply::Warmed {
            name: name.clone(),
            ready: *n,
        }),
        Request::Cancel { key } => one(Reply::Cancelled {
            count: u32::from(key == "running"),
        }),
        Request::Drain { .. } => one(Reply::Drained {
            finished: 0,
            cut_off: 0,
        }),
        Request::CreateTenant { id } | Request::GetTenant { id } => one(Reply::Tenant {
            tenant: tenant(id),
            created: true,
        }),
        Request::SetLimits { id, .. } => one(Reply::Tenant {
            tenant: tenant(id),
            created: false,
        }),
        Request::ListTenants => one(Reply::Tenants(vec![tenant("acme")])),
        Request::DeleteTenant { id } => one(Reply::TenantDeleted(proto::api::TenantDeleted {
            id: id.clone(),
            stopped: vec![],
            scripts_removed: vec![],
            tokens_revoked: 1,
        })),
        Request::MintToken { tenant } => one(Reply::TokenMinted(proto::api::TokenMinted {
            id: "tok_0123456789abcdef".into(),
            secret: format!("zygo_{}", "c".repeat(64)),
            tenant: tenant.clone(),
            created_ms: 1,
        })),
        Request::ListTokens => one(Reply::Tokens(vec![])),
        Request::RevokeToken { id } => one(Reply::TokenRevoked { id: id.clone() }),
        Request::PutSecret { tenant, name, .. } => one(Reply::SecretStored {
            tenant: tenant.clone(),
            name: name.clone(),
            replaced: false,
        }),
        Request::DeleteSecret { tenant, name } => one(Reply::SecretDeleted {
            tenant: tenant.clone(),
            name: name.clone(),
        }),
        Request::ListSecrets { tenant } => one(Reply::Secrets {
            tenant: tenant.clone(),
            names: vec!["STRIPE_KEY".into()],
        }),
        Request::Metrics => one(Reply::Metrics {
            functions: vec![],
            process_counts: true,
        }),
        other => one(err(BadRequest, &format!("not for the API: {other:?}"))),
    }
}

fn serve_channel(mut s: UnixStream, seen: Arc<Mutex<Seen>>) {
    let Ok(hello) = read_frame::<_, Hello>(&mut s, 4096) else {
        return;
    };
    seen.lock().unwrap().hellos.push((hello.role, hello.flags));
    if hello.role != Role::Api {
        let _ = write_frame(
            &mut s,
            &HelloReply::Refused {
                reason: "not the API".into(),
            },
        );
        return;
    }
    let _ = write_frame(
        &mut s,
        &HelloReply::Welcome {
            version: "0.1.0".into(),
        },
    );
    while let Ok(req) = read_frame::<_, Request>(&mut s, MAX_FRONT_FRAME) {
        let (token, tenant, inner) = match req {
            Request::Api { who, request } => (who.token, who.tenant, *request),
            other => (None, None, other),
        };
        {
            let mut g = seen.lock().unwrap();
            g.requests
                .push((token.clone(), tenant.clone(), inner.clone()));
            g.in_flight += 1;
            g.max_in_flight = g.max_in_flight.max(g.in_flight);
        }
        let mut ok = true;
        for r in replies(&token, &tenant, &inner) {
            if write_frame(&mut s, &r).is_err() {
                ok = false;
                break;
            }
        }
        let mut g = seen.lock().unwrap();
        g.in_flight -= 1;
        if !ok {
            g.closed_mid_request += 1;
            return;
        }
    }
}

impl Fake {
    fn start() -> Fake {
        let dir = TempDir::new(0o700);
        let listener = UnixListener::bind(dir.path.join("zygo.sock")).unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for c in listener.incoming().flatten() {
                let seen = s2.clone();
                std::thread::spawn(move || serve_channel(c, seen));
            }
        });
        Fake { dir, seen }
    }

    fn requests(&self) -> Vec<(Option<String>, Option<String>, Request)> {
        self.seen.lock().unwrap().requests.clone()
    }
}

// ---------------------------------------------------------------------------------------
// The front under test.

struct Api {
    child: Child,
    addr: String,
    fake: Fake,
    log: Arc<Mutex<String>>,
}

impl Api {
    fn start(flags: &[&str]) -> Api {
        let fake = Fake::start();
        let mut cmd = Command::new(zygo_bin());
        cmd.arg("api")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(flags)
            .env_clear()
            .env("ZYGO_RUNTIME_DIR", &fake.dir.path)
            .env("ZYGO_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let mut addr = None;
        let log = Arc::new(Mutex::new(String::new()));
        for line in lines.by_ref() {
            let line = line.unwrap();
            log.lock().unwrap().push_str(&line);
            if let Some(rest) = line.split("listening on http://").nth(1) {
                addr = Some(rest.split_whitespace().next().unwrap().to_string());
                break;
            }
        }
        let addr =
            addr.unwrap_or_else(|| panic!("zygo api did not start: {}", log.lock().unwrap()));
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut g = l2.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        Api {
            child,
            addr,
            fake,
            log,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn conn(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// One request on a fresh connection.
    fn req(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let mut c = self.conn();
        send(&mut c, method, path, headers, body);
        read_resp(&mut BufReader::new(c)).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: no answer ({e}); log:\n{}",
                self.log.lock().unwrap()
            )
        })
    }

    fn op(&self, method: &str, path: &str, body: &str) -> Resp {
        self.req(
            method,
            path,
            &[("Authorization", &format!("Bearer {OP}"))],
            body.as_bytes(),
        )
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request's head (no token of its own: `headers` carry any) and body on `c`.
fn send(c: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    c.write_all(head(method, path, None, headers, body.len()).as_bytes())
        .unwrap();
    c.write_all(body).unwrap();
}

/// An error answer as the contract draws it.
trait AssertError {
    fn assert_error(&self, status: u16, what: &str);
}

impl AssertError for Resp {
    fn assert_error(&self, status: u16, what: &str) {
        assert_eq!(
            self.status,
            status,
            "{what}: {}",
            String::from_utf8_lossy(&self.body)
        );
        let v = self.json();
        assert!(
            v["error"].is_string() && v["code"].is_string(),
            "{what}: {v}"
        );
        assert!(
            self.header("x-zygo-request-id").is_some(),
            "{what}: no request id"
        );
    }
}

fn skip_without_binary() -> bool {
    zygo_bin();
    false
}

// ---------------------------------------------------------------------------------------
// Tests.

#[test]
fn healthz_needs_no_token_and_every_answer_carries_a_request_id() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let r = api.req("GET", "/healthz", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok"}));
    assert!(r.header("x-zygo-request-id").unwrap().starts_with("req-"));
    // The hello said Api, with the flags.
    let hellos = api.fake.seen.lock().unwrap().hellos.clone();
    assert!(hellos.len() >= 8, "{hellos:?}");
    assert!(hellos
        .iter()
        .all(|(r, f)| *r == Role::Api && *f == FrontFlags::default()));
    // A call: the answer's id is the header's.
    let r = api.op("POST", "/fn/echo", "{\"a\": 1}");
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["result"], json!({"a": 1}));
    assert_eq!(r.header("x-zygo-request-id"), Some("req-1"));
    assert_eq!(v["metrics"]["peak_rss_kb"], json!(1000));
    // Times in fractional milliseconds, as the supervisor measured them in microseconds.
    assert_eq!(v["metrics"]["wall_ms"], json!(1.25));
    assert_eq!(v["metrics"]["cpu_ms"], json!(0.75));
    // The token went to the supervisor as it came; the timeout as the default.
    let reqs = api.fake.requests();
    let (tok, _, last) = reqs.last().unwrap();
    assert_eq!(tok.as_deref(), Some(OP));
    match last {
        Request::Exec(e) => {
            assert_eq!(e.timeout_ms, Some(60_000));
            assert_eq!(e.event, "{\"a\":1}");
        }
        other => panic!("{other:?}"),
    }
    // tiny_http's own error answers carry one too.
    let mut c = api.conn();
    c.write_all(b"NOT HTTP\r\n\r\n").unwrap();
    let r = read_resp(&mut BufReader::new(c)).unwrap();
    r.assert_error(400, "a line that is not HTTP");
}

#[test]
fn the_confined_front_holds_no_privilege_and_opens_nothing() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", api.pid())).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .map(|l| l[k.len()..].trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2");
    for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(set), "0000000000000000", "{set}");
    }
    // Every thread is under the filter (TSYNC), threads started later included.
    let _ = api.req("GET", "/healthz", &[], b"");
    for t in std::fs::read_dir(format!("/proc/{}/task", api.pid())).unwrap() {
        let t = t.unwrap().path();
        let s = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        if s.is_empty() {
            continue;
        }
        assert!(s.contains("Seccomp:\t2"), "{}: {s}", t.display());
    }
    // Hostile requests that name files, programs and addresses do not make it open any.
    for path in [
        "/fn/..%2F..%2Fetc%2Fpasswd",
        "/scripts/..%2F..%2Fetc%2Fshadow",
        "/tenants/%2Fetc/limits",
        "/fn/%00",
    ] {
        let r = api.op("GET", path, "");
        assert!(r.status >= 400 && r.status < 500, "{path}: {}", r.status);
    }
    let r = api.op(
        "PUT",
        "/fn/x",
        r#"{"layer": {"cmd": ["/bin/sh"]}, "base_dir": "/etc"}"#,
    );
    assert_eq!(r.status, 200);
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", api.pid()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    for fd in &fds {
        assert!(
            fd.starts_with("socket:") || fd.starts_with("pipe:") || fd == "/dev/null",
            "the front holds {fd}: {fds:?}"
        );
    }
}

#[test]
fn a_body_over_16_mib_is_413_before_it_is_read() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let mut c = api.conn();
    let head = format!(
        "PUT /scripts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\nContent-Length: {}\r\n\r\n",
        16 * 1024 * 1024 + 1
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&[b'x'; 1000]).unwrap();
    let t0 = Instant::now();
    let mut r = BufReader::new(c);
    let resp = read_resp(&mut r).unwrap();
    resp.assert_error(413, "17 MiB announced");
    assert_eq!(resp.json()["code"], "too_large");
    assert!(t0.elapsed() < Duration::from_secs(10));
    // Chunked, with no length announced: cut off once it passes the cap.
    let mut c = api.conn();
    let head = format!(
        "PUT /scripts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b'y'; 1 << 20];
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for _ in 0..20 {
            if w.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .is_err()
                || w.write_all(&chunk).is_err()
                || w.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
    });
    let resp = read_resp(&mut BufReader::new(c)).unwrap();
    resp.assert_error(413, "chunked past 16 MiB");
    let _ = writer.join();
    // A length that is no number, or two that disagree.
    for extra in [
        "Content-Length: 12abc\r\n",
        "Content-Length: 99999999999999999999999999\r\n",
        "Content-Length: 1\r\nContent-Length: 2\r\n",
        "Transfer-Encoding: gzip\r\n",
    ] {
        let mut c = api.conn();
        let head = format!(
            "PUT /scripts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\n{extra}\r\n"
        );
        c.write_all(head.as_bytes()).unwrap();
        let resp = read_resp(&mut BufReader::new(c)).unwrap();
        assert!(
            resp.status == 400 || resp.status == 413,
            "{extra:?}: {}",
            resp.status
        );
        resp.assert_error(resp.status, extra);
    }
    // Still serving.
    assert_eq!(api.req("GET", "/healthz", &[], b"").status, 200);
}

#[test]
fn an_idle_keepalive_connection_is_closed_after_30_s() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let mut c = api.conn();
    c.set_read_timeout(Some(Duration::from_secs(45))).unwrap();
    send(&mut c, "GET", "/healthz", &[], b"");
    let mut r = BufReader::new(c.try_clone().unwrap());
    assert_eq!(read_resp(&mut r).unwrap().status, 200);
    // Kept alive: a second request on it is served.
    send(&mut c, "GET", "/healthz", &[], b"");
    assert_eq!(read_resp(&mut r).unwrap().status, 200);
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let n = r.read(&mut buf).unwrap_or(0);
    let waited = t0.elapsed();
    assert_eq!(n, 0, "an idle connection got bytes instead of being closed");
    assert!(
        waited >= Duration::from_secs(25) && waited < Duration::from_secs(40),
        "closed after {waited:?}"
    );
}

#[test]
fn slow_half_sent_and_malformed_requests_never_stop_the_front() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    // Half a head, then gone; half a body, then gone.
    for raw in [
        &b"GET /healthz HTTP/1.1\r\nHost: x\r\n"[..],
        &b"POST /fn/echo HTTP/1.1\r\nAuthorization: Bearer zygo_op\r\nContent-Length: 100\r\n\r\n{\"a\""[..],
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..],
    ] {
        let mut c = api.conn();
        c.write_all(raw).unwrap();
        drop(c);
    }
    // Answered with a status, and closed.
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (
            format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(10_000)).into_bytes(),
            431,
        ),
        (
            format!(
                "GET /healthz HTTP/1.1\r\n{}\r\n",
                (0..150)
                    .map(|i| format!("X-H{i}: v\r\n"))
                    .collect::<String>()
            )
            .into_bytes(),
            431,
        ),
        (
            b"GET /healthz HTTP/1.1\r\nX-Odd: \xff\xfe\r\n\r\n".to_vec(),
            400,
        ),
        (b"GET /healthz HTTP/2.0\r\n\r\n".to_vec(), 400),
        (
            b"GET /healthz HTTP/1.1\r\nExpect: magic\r\n\r\n".to_vec(),
            417,
        ),
        (b"GET http://evil/healthz HTTP/1.1\r\n\r\n".to_vec(), 400),
    ];
    for (raw, status) in cases {
        let mut c = api.conn();
        c.write_all(&raw).unwrap();
        let resp = read_resp(&mut BufReader::new(c)).unwrap_or_else(|e| {
            panic!(
                "{:?}: {e}",
                String::from_utf8_lossy(&raw[..raw.len().min(60)])
            )
        });
        let what = String::from_utf8_lossy(&raw[..raw.len().min(40)]).to_string();
        if status == 400 && resp.status == 505 {
            continue;
        }
        resp.assert_error(status, &what);
    }
    // A head that trickles in slower than the head's deadline is cut off with 408 (sent a
    // byte every 2 s would take 60 s; the head has 30 s from its first byte).
    let c = api.conn();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let slow = std::thread::spawn({
        let mut w = c.try_clone().unwrap();
        move || {
            for b in b"GET /healthz HTTP/1.1\r\nX-A: aaaaaaaaaaaaaaaaaaaaaa\r\n".iter() {
                if w.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1500));
            }
        }
    });
    // Meanwhile the front serves others.
    assert_eq!(api.req("GET", "/healthz", &[], b"").status, 200);
    let resp = read_resp(&mut BufReader::new(c)).unwrap();
    resp.assert_error(408, "a trickling head");
    let _ = slow.join();
    assert_eq!(api.req("GET", "/healthz", &[], b"").status, 200);
}

/// Every route, and what a caller can get wrong about it.
#[test]
fn every_route_refuses_bad_input_with_its_status_and_never_a_5xx() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let hex = "a".repeat(64);
    let auth = format!("Bearer {OP}");
    let routes: Vec<(&str, String)> = vec![
        ("GET", "/version".into()),
        ("GET", "/fn".into()),
        ("PUT", "/fn/echo".into()),
        ("DELETE", "/fn/echo".into()),
        ("POST", "/fn/echo".into()),
        ("POST", "/fn/echo/batch".into()),
        ("GET", "/fn/echo/logs".into()),
        ("GET", "/fn/echo/stats".into()),
        ("POST", "/fn/echo/warm".into()),
        ("POST", "/run".into()),
        ("GET", "/runtimes".into()),
        ("POST", "/runtimes".into()),
        ("DELETE", "/runtimes/py".into()),
        ("POST", "/runtimes/py/call".into()),
        ("PUT", "/scripts".into()),
        ("GET", format!("/scripts/sha256:{hex}")),
        ("DELETE", format!("/scripts/{hex}")),
        ("DELETE", "/requests/running".into()),
        ("POST", "/tenants".into()),
        ("GET", "/tenants".into()),
        ("GET", "/tenants/acme".into()),
        ("DELETE", "/tenants/acme".into()),
        ("PATCH", "/tenants/acme/limits".into()),
        ("POST", "/tenants/acme/tokens".into()),
        ("POST", "/tokens".into()),
        ("GET", "/tokens".into()),
        ("DELETE", "/tokens/tok_0123456789abcdef".into()),
        ("POST", "/drain".into()),
    ];
    let good_body = |m: &str, p: &str| -> &'static str {
        match (m, p) {
            ("PUT", p) if p.starts_with("/fn/") => r#"{"layer": {"entry": "h.py:f"}}"#,
            ("POST", "/fn/echo/batch") => r#"{"events": [1, 2]}"#,
            ("POST", "/fn/echo/warm") => r#"{"n": 2}"#,
            ("POST", "/run") => r#"{"cmd": ["/bin/true"]}"#,
            ("POST", "/runtimes") => r#"{"name": "py", "layer": {}}"#,
            ("POST", "/runtimes/py/call") => r#"{"source": "print(1)", "event": {}}"#,
            ("POST", "/tenants") => r#"{"id": "acme"}"#,
            ("PATCH", _) => r#"{"mem": "64M"}"#,
            ("POST", "/drain") => r#"{"grace": 1}"#,
            _ => "",
        }
    };
    for (m, p) in &routes {
        // The good request is served.
        let r = api.op(m, p, good_body(m, p));
        assert_eq!(
            r.status,
            200,
            "{m} {p}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(r.header("x-zygo-request-id").is_some());
        // No token, a garbage one, a malformed header: 401.
        let r = api.req(m, p, &[], good_body(m, p).as_bytes());
        r.assert_error(401, &format!("{m} {p} without a token"));
        for bad in [
            "Basic abc",
            "Bearer",
            "Bearer a b",
            &format!("Bearer {}", "x".repeat(300)),
        ] {
            let r = api.req(m, p, &[("Authorization", bad)], b"");
            r.assert_error(401, &format!("{m} {p} with {bad:.20}"));
        }
        // Header forms.
        for (h, v) in [
            ("X-Zygo-Tenant", "ACME"),
            ("X-Zygo-Tenant", "../x"),
            ("X-Zygo-Tenant", ""),
            ("X-Zygo-Timeout-Ms", "0"),
            ("X-Zygo-Timeout-Ms", "86400001"),
            ("X-Zygo-Timeout-Ms", "1e3"),
            ("X-Zygo-Timeout-Ms", "-5"),
            ("X-Zygo-Request-Key", &"k".repeat(129)),
        ] {
            let r = api.req(m, p, &[("Authorization", &auth), (h, v)], b"");
            r.assert_error(400, &format!("{m} {p} with {h}: {v:.20}"));
        }
        let r = api.req(
            m,
            p,
            &[
                ("Authorization", &auth),
                ("X-Zygo-Tenant", "a"),
                ("X-Zygo-Tenant", "b"),
            ],
            b"",
        );
        r.assert_error(400, &format!("{m} {p} with two tenant headers"));
        // An unknown query parameter.
        let r = api.op(m, &format!("{p}?bogus=1"), good_body(m, p));
        r.assert_error(400, &format!("{m} {p}?bogus"));
        // Bodies: malformed, wrong types, unknown fields, duplicate keys.
        let takes_json_object = !good_body(m, p).is_empty();
        if takes_json_object {
            for (body, what) in [
                ("{", "malformed"),
                ("[1,2]", "an array"),
                ("\"text\"", "a string"),
                (r#"{"zzz_unknown": 1}"#, "an unknown field"),
                (r#"{"a": 1, "a": 2}"#, "a duplicate key"),
                ("{\"\u{0}\": 1}", "odd bytes"),
            ] {
                let r = api.op(m, p, body);
                r.assert_error(400, &format!("{m} {p} with {what}"));
            }
        }
        // Never a 5xx for any of that, and the front still answers.
        assert_eq!(api.req("GET", "/healthz", &[], b"").status, 200);
    }
    // Wrong types inside the right fields.
    for (m, p, body) in [
        ("POST", "/fn/echo", "{"),
        ("POST", "/fn/echo", r#"{"a": 1, "a": 2}"#),
        ("POST", "/fn/echo", "1 2"),
        ("PUT", "/fn/echo", r#"{"layer": []}"#),
        (
            "PUT",
            "/fn/echo",
            r#"{"layer": {}, "base_dir": "relative"}"#,
        ),
        ("POST", "/fn/echo/batch", r#"{"events": {}}"#),
        ("POST", "/fn/echo/warm", r#"{"n": "two"}"#),
        ("POST", "/fn/echo/warm", r#"{"n": 0}"#),
        ("POST", "/run", r#"{"cmd": "ls"}"#),
        ("POST", "/run", r#"{"cmd": []}"#),
        ("POST", "/run", r#"{"cmd": ["ls"], "mounts": []}"#),
        ("POST", "/runtimes", r#"{"name": "Bad Name", "layer": {}}"#),
        ("POST", "/runtimes/py/call", r#"{"script": "sha256:zz"}"#),
        ("POST", "/runtimes/py/call", r#"{"event": 1}"#),
        (
            "POST",
            "/runtimes/py/call",
            r#"{"script": "x", "source": "y"}"#,
        ),
        (
            "POST",
            "/runtimes/py/call",
            r#"{"source": "x", "workspace": "sha256:aa"}"#,
        ),
        ("POST", "/tenants", r#"{"id": "../etc"}"#),
        ("POST", "/tenants", r#"{"id": 7}"#),
        ("PATCH", "/tenants/acme/limits", r#"{}"#),
        ("PATCH", "/tenants/acme/limits", r#"{"memory": "1G"}"#),
        ("POST", "/drain", r#"{"grace": -1}"#),
        ("POST", "/drain", r#"{"grace": 100000}"#),
        ("POST", "/tokens", r#"{"tenant": "acme"}"#),
    ] {
        api.op(m, p, body)
            .assert_error(400, &format!("{m} {p} {body}"));
    }
    // Names, digests, keys and ids with traversal and odd bytes.
    for (m, p) in [
        ("POST", "/fn/..%2Fetc"),
        ("POST", "/fn/A"),
        ("POST", "/fn/%e2%80%ae"),
        ("POST", "/fn/a%0ab"),
        ("POST", "/fn/%zz"),
        ("GET", "/fn/a%20b/logs"),
        ("GET", "/fn/echo/logs?limit=0"),
        ("GET", "/fn/echo/logs?limit=1001"),
        ("GET", "/fn/echo/logs?limit=x"),
        ("POST", "/fn/echo?stream=2"),
        ("POST", "/fn/echo?workspace=sha256:aa"),
        ("POST", "/fn/echo?out=2"),
        ("POST", "/fn/echo?workspace=sha256:aa&out=1"),
        ("GET", "/scripts/sha256:..%2F..%2Fetc"),
        ("GET", "/scripts/ABC"),
        ("DELETE", "/scripts/sha1:abc"),
        ("GET", "/tenants/..%2F"),
        ("GET", "/tenants/Acme"),
        ("DELETE", "/tokens/..%2Fx"),
        ("DELETE", "/tokens/tok_xyz"),
    ] {
        api.op(m, p, "").assert_error(400, &format!("{m} {p}"));
    }
    let long_key = format!("/requests/{}", "k".repeat(200));
    api.op("DELETE", &long_key, "")
        .assert_error(400, "a 200-byte key");
    api.op("DELETE", "/requests/%01", "")
        .assert_error(400, "a control byte in a key");
    // Nothing running under a key: 404.
    api.op("DELETE", "/requests/idle", "")
        .assert_error(404, "no request under the key");
    // The supervisor's refusals keep their status.
    api.op("POST", "/fn/missing", "")
        .assert_error(404, "an unknown function");
    // Unknown routes, a wrong method.
    for p in ["/nope", "/fn/a/b/c", "/blobs/a/b", "/deps/a/b"] {
        api.op("GET", p, "").assert_error(404, p);
    }
    // A secret is never read back: GET on one is not a route.
    api.op("GET", "/tenants/acme/secrets/K", "")
        .assert_error(405, "GET of one secret");
    let r = api.op("PATCH", "/fn/echo", "");
    r.assert_error(405, "PATCH /fn/echo");
    let allow = r.header("allow").unwrap();
    assert!(
        allow.contains("PUT") && allow.contains("POST") && allow.contains("DELETE"),
        "{allow}"
    );
    // A handler that failed: 500 with the contract's fields.
    let r = api.op("POST", "/fn/fails", "null");
    assert_eq!(r.status, 500);
    let v = r.json();
    assert_eq!(v["code"], "handler");
    assert_eq!(v["traceback"], "Traceback ...");
    assert!(v.get("exit_code").is_some() && v.get("oom_killed").is_some());
    // Key and timeout are forwarded.
    let r = api.req(
        "POST",
        "/fn/echo",
        &[
            ("Authorization", &auth),
            ("X-Zygo-Request-Key", "job-1"),
            ("X-Zygo-Timeout-Ms", "1500"),
            ("X-Zygo-Tenant", "acme"),
        ],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"], Value::Null);
    let reqs = api.fake.requests();
    let (_, tenant, last) = reqs.last().unwrap();
    assert_eq!(tenant.as_deref(), Some("acme"));
    match last {
        Request::Exec(e) => {
            assert_eq!(e.key.as_deref(), Some("job-1"));
            assert_eq!(e.timeout_ms, Some(1500));
            assert_eq!(e.event, "null");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !api.log.lock().unwrap().contains("panicked"),
        "{}",
        api.log.lock().unwrap()
    );
}

#[test]
fn batches_run_at_most_the_callers_share_at_a_time_in_order() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let events: Vec<Value> = (0..40).map(|i| json!({"i": i})).collect();
    let body = json!({ "events": events }).to_string();
    let r = api.op("POST", "/fn/slow/batch", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let results = r.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 40);
    for (i, res) in results.iter().enumerate() {
        assert_eq!(res["status"], 200);
        assert_eq!(res["result"]["i"], json!(i));
    }
    let max = api.fake.seen.lock().unwrap().max_in_flight;
    // A caller's share is a quarter of the front's 16 to 32 channels.
    assert!(
        (2..=8).contains(&max),
        "at most the caller's share at once, more than one: {max}"
    );
    // Each element's timeout is no more than what is left of the batch's.
    for (_, _, r) in api.fake.requests() {
        if let Request::Exec(e) = r {
            assert!(e.timeout_ms.unwrap() <= 60_000);
        }
    }
    // Too many; errors are per element.
    let big = json!({ "events": vec![0; 1001] }).to_string();
    api.op("POST", "/fn/slow/batch", &big)
        .assert_error(400, "1001 events");
    let r = api.op("POST", "/fn/missing/batch", r#"{"events": [1]}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["results"][0]["status"], 404);
    assert_eq!(r.json()["results"][0]["code"], "not_found");
    // A batch whose deadline has passed sends nothing more.
    let auth = format!("Bearer {OP}");
    let events: Vec<Value> = (0..64).map(|i| json!(i)).collect();
    let r = api.req(
        "POST",
        "/fn/slow/batch",
        &[("Authorization", &auth), ("X-Zygo-Timeout-Ms", "500")],
        json!({ "events": events }).to_string().as_bytes(),
    );
    assert_eq!(r.status, 200);
    let results = r.json()["results"].as_array().unwrap().clone();
    assert!(
        results.iter().any(|r| r["code"] == "timeout"),
        "{results:?}"
    );
}

#[test]
fn a_streamed_call_is_ndjson_with_the_answer_last() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    for (path, body) in [
        ("/fn/echo?stream=1", "{\"x\": 1}"),
        (
            "/runtimes/py/call?stream=1",
            "{\"source\": \"print(1)\", \"event\": {\"x\": 1}}",
        ),
    ] {
        let r = api.op("POST", path, body);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        assert!(r.header("x-zygo-request-id").is_some());
        let text = String::from_utf8(r.body.clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], json!({"stream": "stdout", "data": "hello\n"}));
        assert_eq!(lines[1], json!({"stream": "progress", "data": "half"}));
        assert_eq!(lines[2]["status"], 200);
        assert_eq!(lines[2]["result"], json!({"x": 1}));
        assert_eq!(lines[2]["request_id"], "req-1");
        assert!(text.ends_with('\n'));
    }
    // A refusal is the last line too.
    let r = api.op("POST", "/fn/missing?stream=1", "");
    assert_eq!(r.status, 200);
    let last: Value = serde_json::from_slice(r.body.trim_ascii_end()).unwrap();
    assert_eq!(last["status"], 404);
    assert_eq!(last["code"], "not_found");
    // The connection is good for another request after a stream.
    let mut c = api.conn();
    let mut r = BufReader::new(c.try_clone().unwrap());
    send(
        &mut c,
        "POST",
        "/fn/echo?stream=1",
        &[("Authorization", "Bearer zygo_op")],
        b"1",
    );
    assert_eq!(read_resp(&mut r).unwrap().status, 200);
    send(&mut c, "GET", "/healthz", &[], b"");
    assert_eq!(read_resp(&mut r).unwrap().status, 200);
}

#[test]
fn run_answers_408_when_the_callers_deadline_fires_first_and_cancels_it() {
    if skip_without_binary() {
        return;
    }
    let mut api = Api::start(&["--allow-deploy"]);
    let auth = format!("Bearer {OP}");
    let r = api.op("POST", "/run", r#"{"cmd": ["/bin/echo", "hi"]}"#);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["wall_ms"], 1.5);
    assert_eq!(v["cpu_ms"], 1.0);
    assert_eq!(v["phase"], "run");
    assert_eq!(r.header("x-zygo-request-id"), Some("req-run"));
    let t0 = Instant::now();
    let r = api.req(
        "POST",
        "/run",
        &[("Authorization", &auth), ("X-Zygo-Timeout-Ms", "500")],
        br#"{"cmd": ["sleep", "10"]}"#,
    );
    r.assert_error(408, "the outer deadline");
    assert_eq!(r.json()["code"], "api_timeout");
    assert!(t0.elapsed() < Duration::from_secs(3));
    // It was cancelled by the key it was sent with (one the front made for it).
    wait_for(Duration::from_secs(10), "the run's cancel", || {
        api.fake.requests().iter().any(
            |(_, _, r)| matches!(r, Request::Cancel { key } if key.starts_with("zygo-api-req-")),
        )
    });
    let spec_key = api.fake.requests().iter().find_map(|(_, _, r)| match r {
        Request::Run { spec } if spec.cmd.iter().any(|a| a.contains("sleep")) => spec.key.clone(),
        _ => None,
    });
    assert!(spec_key.is_some_and(|k| k.starts_with("zygo-api-req-")));
    // Deadlines that pass while the supervisor is still answering never cost the front its
    // channels: a burst of runs that each outlive a 1 ms deadline, then it still serves.
    for _ in 0..40 {
        let r = api.req(
            "POST",
            "/run",
            &[("Authorization", &auth), ("X-Zygo-Timeout-Ms", "1")],
            br#"{"cmd": ["sleep", "10"]}"#,
        );
        r.assert_error(408, "a 1 ms deadline");
    }
    assert_eq!(api.req("GET", "/healthz", &[], b"").status, 200);
    wait_for(Duration::from_secs(20), "the channels to come back", || {
        api.op("GET", "/fn", "").status == 200
    });
    assert_eq!(api.fake.seen.lock().unwrap().closed_mid_request, 0);
    assert!(api.child.try_wait().unwrap().is_none(), "zygo api exited");
    // The flags came with the hello.
    let hellos = api.fake.seen.lock().unwrap().hellos.clone();
    assert!(hellos.iter().all(|(_, f)| f.allow_deploy && !f.no_auth));
    assert_eq!(api.req("GET", "/healthz", &[], b"").status, 200);
}

#[test]
fn sigterm_lets_the_request_in_flight_finish() {
    if skip_without_binary() {
        return;
    }
    let mut api = Api::start(&[]);
    let mut c = api.conn();
    send(
        &mut c,
        "POST",
        "/fn/slow",
        &[("Authorization", "Bearer zygo_op")],
        b"7",
    );
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(api.pid() as i32, libc::SIGTERM) };
    let r = read_resp(&mut BufReader::new(c)).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"], 7);
    let t0 = Instant::now();
    loop {
        if let Some(st) = api.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "zygo api did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(api.log.lock().unwrap().contains("SIGTERM"));
}

#[test]
fn the_command_line_refuses_what_it_must() {
    if skip_without_binary() {
        return;
    }
    let dir = TempDir::new(0o700);
    let run = |args: &[&str]| {
        let out = Command::new(zygo_bin())
            .arg("api")
            .args(args)
            .env_clear()
            .env("ZYGO_RUNTIME_DIR", &dir.path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("no supervisor is running; start one with `zygo up`"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // --allow-private-net without --allow-deploy does nothing, and says so; it is not a
    // reason to refuse (here the only one is that no supervisor runs).
    let (code, err) = run(&["--allow-private-net", "--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--allow-private-net does nothing without --allow-deploy")
            && err.contains("it is ignored")
            && err.contains("no supervisor is running"),
        "{err}"
    );
    for (args, needle) in [
        (
            &["--no-auth", "--listen", "0.0.0.0:0"][..],
            "--no-auth is refused",
        ),
        (
            &["--otlp-endpoint", "http://x"][..],
            "host names are not resolved",
        ),
        (
            &["--usage-webhook", "https://127.0.0.1:1/x"][..],
            "https is not supported",
        ),
        (&["--listen", "localhost:80"][..], "give IP:PORT"),
        (
            &["--listen", "unix://relative"][..],
            "unix:///absolute/path",
        ),
    ] {
        let (code, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // The OpenAPI document is the committed one.
    let out = Command::new(zygo_bin())
        .args(["api", "--openapi"])
        .output()
        .unwrap();
    let committed = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec/openapi.json"),
    )
    .unwrap();
    assert!(
        out.stdout == committed,
        "zygo api --openapi differs from spec/openapi.json"
    );
}

#[test]
fn a_unix_socket_listener_is_created_0600_and_no_auth_is_allowed_there() {
    if skip_without_binary() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let fake = Fake::start();
    let sock = fake.dir.path.join("api.sock");
    let log = TempDir::new(0o700);
    let log_file = log.path.join("stderr");
    let mut child = Command::new(zygo_bin())
        .args(["api", "--no-auth", "--listen"])
        .arg(format!("unix://{}", sock.display()))
        .env_clear()
        .env("ZYGO_RUNTIME_DIR", &fake.dir.path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_file).unwrap())
        .spawn()
        .unwrap();
    let said = || std::fs::read_to_string(&log_file).unwrap_or_default();
    // The path appears only once something listens on it: the first connect after it
    // exists is accepted, never refused.
    wait_for(Duration::from_secs(10), "the socket", || {
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "zygo api exited ({st}) before its socket appeared: {}",
                said()
            );
        }
        sock.exists()
    });
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    let mut c = UnixStream::connect(&sock).unwrap_or_else(|e| {
        panic!(
            "connect to {}: {e}; zygo api said: {}",
            sock.display(),
            said()
        )
    });
    c.write_all(b"GET /fn HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let r = read_resp(&mut BufReader::new(c))
        .unwrap_or_else(|e| panic!("no answer: {e}; zygo api said: {}", said()));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(mode, 0o600, "zygo api said: {}", said());
    // No token was sent; the flag went with the hello (the fake refuses tokenless calls,
    // the real supervisor treats them as the bootstrap operator under --no-auth).
    assert_eq!(r.status, 401, "zygo api said: {}", said());
    let hellos = fake.seen.lock().unwrap().hellos.clone();
    assert!(hellos.iter().all(|(_, f)| f.no_auth));
    // Nothing but the socket (and the fake's own) was left in the folder: the temporary
    // name it was bound to became the socket's path.
    let names: Vec<String> = std::fs::read_dir(&fake.dir.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(names.is_empty(), "left behind: {names:?}");
    let _ = AtomicUsize::new(0).load(Ordering::Relaxed);
}

/// A front that cannot serve (no supervisor to reach) never puts a socket at its path: a
/// caller finds no socket rather than one that refuses it, and no temporary name is left.
#[test]
fn a_unix_socket_path_never_names_a_socket_nothing_listens_on() {
    if skip_without_binary() {
        return;
    }
    let dir = TempDir::new(0o700);
    let sock = dir.path.join("api.sock");
    let out = Command::new(zygo_bin())
        .args(["api", "--no-auth", "--listen"])
        .arg(format!("unix://{}", sock.display()))
        .env_clear()
        .env("ZYGO_RUNTIME_DIR", &dir.path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "zygo api said: {said}");
    assert!(said.contains("supervisor"), "zygo api said: {said}");
    let left: Vec<String> = std::fs::read_dir(&dir.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.is_empty(),
        "left behind: {left:?}; zygo api said: {said}"
    );
}

/// Past 512 connections, the one that has waited longest for a request's head (one that
/// sent nothing, or trickles a head) is closed to make room for a new one: connections that
/// never finish a request cannot hold the front, from however many addresses (one address
/// may hold only a quarter of them).
#[test]
fn past_512_connections_the_longest_waiting_is_closed_to_make_room() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let mut held = Vec::new();
    for i in 0..512 {
        let from = std::net::Ipv4Addr::new(127, 0, 0, 10 + (i % 4) as u8);
        let mut c = connect_from(from, &api.addr);
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // Half of them trickle the start of a head, the others send nothing.
        if i % 2 == 0 {
            c.write_all(b"GET /hea").unwrap();
        }
        held.push(c);
    }
    // Each held connection has been taken by the front once a new one is answered; new
    // ones keep being answered, each closing the longest-waiting held one.
    for _ in 0..8 {
        let r = api.req("GET", "/healthz", &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The longest-waiting held connection was closed (well before the 30 s a connection
    // may sit idle); the newest is open.
    held[0]
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 1];
    match held[0].read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the longest-waiting connection is still open: {other:?}"),
    }
    let last = held.len() - 1;
    held[last]
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut b = [0u8; 1];
    match held[last].read(&mut b) {
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut => {}
        other => panic!("the newest held connection was closed: {other:?}"),
    }
    drop(held);
    wait_for(Duration::from_secs(20), "the front to serve again", || {
        api.req("GET", "/healthz", &[], b"").status == 200
    });
}

#[test]
fn slow_uploads_do_not_keep_other_callers_waiting() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    // More half-sent bodies than the front has channels, from another address (one
    // caller, and one address, may have only 16 requests served at once; the rest are
    // 429 at once).
    let mut held = Vec::new();
    for _ in 0..40 {
        let mut c = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 2), &api.addr);
        let head = format!(
            "POST /fn/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\nContent-Length: 4096\r\n\r\n{}",
            "[".repeat(10)
        );
        c.write_all(head.as_bytes()).unwrap();
        held.push(c);
    }
    std::thread::sleep(Duration::from_millis(300));
    // Another caller (the operator acting for a tenant is a caller of its own).
    let t0 = Instant::now();
    let auth = format!("Bearer {OP}");
    let headers = [("Authorization", auth.as_str()), ("X-Zygo-Tenant", "acme")];
    let r = api.req("POST", "/fn/echo", &headers, b"1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "waited {:?}",
        t0.elapsed()
    );
    drop(held);
}

/// The secrets routes: PUT forwards the value to the supervisor (and answers without it),
/// GET lists names, DELETE forgets; a body that is not `{"value": "…"}` is 400 with a
/// message that never quotes it; a bad name is 400 before the supervisor is asked.
#[test]
fn secrets_routes_forward_values_and_never_answer_with_one() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let value = "sk_live_never_echoed_42";
    let r = api.op(
        "PUT",
        "/tenants/acme/secrets/STRIPE_KEY",
        &format!(r#"{{"value": "{value}"}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["tenant"], "acme");
    assert_eq!(v["name"], "STRIPE_KEY");
    assert!(!r.text().contains(value));
    let sent = api
        .fake
        .seen
        .lock()
        .unwrap()
        .requests
        .iter()
        .find_map(|(_, _, r)| match r {
            Request::PutSecret { value, .. } => Some(value.0.clone()),
            _ => None,
        })
        .expect("the PutSecret was forwarded");
    assert_eq!(sent, value.as_bytes());
    for bad in [
        format!(r#"{{"value": "{value}", "extra": 1}}"#),
        format!(r#"{{"value": "{value}", "value": "{value}"}}"#),
        format!(r#"{{"value": ["{value}"]}}"#),
        format!(r#"{{"valu": "{value}"}}"#),
        format!(r#""{value}""#),
        value.to_string(),
    ] {
        let r = api.op("PUT", "/tenants/acme/secrets/STRIPE_KEY", &bad);
        r.assert_error(400, &bad);
        assert!(
            !r.text().contains(value),
            "the refusal quotes the body: {}",
            r.text()
        );
    }
    let r = api.op("PUT", "/tenants/acme/secrets/1BAD", r#"{"value": "x"}"#);
    r.assert_error(400, "a bad secret name");
    let r = api.op("GET", "/tenants/acme/secrets", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["secrets"], serde_json::json!(["STRIPE_KEY"]));
    let r = api.op("DELETE", "/tenants/acme/secrets/STRIPE_KEY", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["deleted"], true);
    assert!(
        !api.log.lock().unwrap().contains(value),
        "the front logged a value"
    );
}

#[test]
fn a_body_that_stops_arriving_is_408_and_the_front_goes_on() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&[]);
    let mut c = api.conn();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST /fn/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OP}\r\nContent-Length: 5000\r\n\r\n{}",
        "[".repeat(2000)
    );
    c.write_all(head.as_bytes()).unwrap();
    let t0 = Instant::now();
    let resp = read_resp(&mut BufReader::new(c)).unwrap();
    resp.assert_error(408, "a body that stopped");
    assert!(
        t0.elapsed() >= Duration::from_secs(25),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(api.op("POST", "/fn/echo", "2").status, 200);
}

/// `[api]` of a sandbox.toml says where `zygo api` listens and whether a token is needed,
/// as `--listen` and `--no-auth` do: read from `-f FILE`, else from `./sandbox.toml`.
/// `auth = "none"` is refused off loopback, naming the file; a flag wins over the file; an
/// unknown key or a wrong value is refused, naming it.
#[test]
fn the_files_api_table_says_where_and_how_zygo_api_listens() {
    if skip_without_binary() {
        return;
    }
    let fake = Fake::start();
    let sock = fake.dir.path.join("from-file.sock");
    let app = TempDir::new(0o755);
    app.file(
        "sandbox.toml",
        format!(
            "[api]\nlisten = \"unix://{}\"\nauth = \"none\"\n\n[fn.x]\nagent = \"python\"\n",
            sock.display()
        )
        .as_bytes(),
    );
    let log = TempDir::new(0o700);
    let log_file = log.path.join("stderr");
    // No flag: ./sandbox.toml is read.
    let mut child = Command::new(zygo_bin())
        .arg("api")
        .current_dir(&app.path)
        .env_clear()
        .env("ZYGO_RUNTIME_DIR", &fake.dir.path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_file).unwrap())
        .spawn()
        .unwrap();
    let said = || std::fs::read_to_string(&log_file).unwrap_or_default();
    wait_for(Duration::from_secs(10), "the socket", || {
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "zygo api exited ({st}) before its socket appeared: {}",
                said()
            );
        }
        sock.exists()
    });
    let mut c = UnixStream::connect(&sock).unwrap();
    c.write_all(b"GET /fn HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let r = read_resp(&mut BufReader::new(c))
        .unwrap_or_else(|e| panic!("no answer: {e}; zygo api said: {}", said()));
    let _ = child.kill();
    let _ = child.wait();
    // The fake refuses tokenless calls; what matters is that the flag went with the hello.
    assert_eq!(r.status, 401, "zygo api said: {}", said());
    let hellos = fake.seen.lock().unwrap().hellos.clone();
    assert!(
        !hellos.is_empty() && hellos.iter().all(|(_, f)| f.no_auth),
        "{hellos:?}"
    );

    let refused = |args: &[&str], file: &str| {
        let dir = TempDir::new(0o755);
        dir.file("sandbox.toml", file.as_bytes());
        let f = dir.path.join("sandbox.toml");
        let out = Command::new(zygo_bin())
            .arg("api")
            .args(args)
            .arg("-f")
            .arg(&f)
            .env_clear()
            .env("ZYGO_RUNTIME_DIR", &fake.dir.path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            f.display().to_string(),
        )
    };
    let (code, err, f) = refused(&[], "[api]\nlisten = \"0.0.0.0:7799\"\nauth = \"none\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("[api] auth = \"none\"") && err.contains(&f),
        "{err}"
    );
    assert!(err.contains("loopback"), "{err}");
    let (code, err, _) = refused(&[], "[api]\nauth = \"off\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("[api] auth") && err.contains("\"none\""),
        "{err}"
    );
    let (code, err, _) = refused(&[], "[api]\nport = 7700\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("port") && err.contains("[api]"), "{err}");
    let (code, err, f) = refused(&[], "[api]\nlisten = \"localhost:7700\"\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("[api] listen") && err.contains(&f), "{err}");
    // A flag wins: the file's listen is never tried.
    let (code, err, _) = refused(
        &["--listen", "127.0.0.1:notaport"],
        "[api]\nlisten = \"unix:///nonexistent/dir/x.sock\"\n",
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--listen 127.0.0.1:notaport"), "{err}");
}

/// Under `--no-auth` on a loopback address, where no token stands between a web page in a
/// browser on the machine and the API, a request must name a loopback host (DNS
/// rebinding sends a page's own name) and carry no `Origin` but the server's own (a page
/// of another site's form POST carries its own): both are refused with 403 before
/// anything is asked of the supervisor. Programs (which send neither) are served; with
/// tokens nothing changes.
#[test]
fn without_tokens_on_loopback_only_local_callers_are_served() {
    if skip_without_binary() {
        return;
    }
    let api = Api::start(&["--no-auth"]);
    let host = api.addr.clone();
    let own = format!("http://{host}");
    let asked = || api.fake.requests().len();
    let before = asked();
    for headers in [
        vec![("Host", "attacker.example")],
        vec![("Host", "attacker.example:7700")],
        vec![
            ("Host", host.as_str()),
            ("Origin", "http://attacker.example"),
        ],
        vec![("Host", host.as_str()), ("Origin", "null")],
    ] {
        let r = api.req("POST", "/fn/echo", &headers, b"{}");
        r.assert_error(403, "forbidden");
        assert!(r.text().contains("--no-auth"), "{headers:?}: {}", r.text());
    }
    assert_eq!(asked(), before, "a refused request reached the supervisor");
    // A program's request, and a page of the server's own origin, go through (the fake
    // answers a tokenless caller 401: what matters is that it was asked).
    for headers in [
        vec![("Host", host.as_str())],
        vec![("Host", "localhost")],
        vec![("Host", host.as_str()), ("Origin", own.as_str())],
    ] {
        let r = api.req("GET", "/fn", &headers, b"");
        assert_ne!(r.status, 403, "{headers:?}: {}", r.text());
    }
    assert!(asked() > before, "no request reached the supervisor");
    // /healthz needs no caller and is answered whatever the Host.
    let r = api.req("GET", "/healthz", &[("Host", "attacker.example")], b"");
    assert_ne!(r.status, 403, "{}", r.text());
    // With tokens, the Host is not the server's business.
    let api = Api::start(&[]);
    let r = api.req(
        "GET",
        "/fn",
        &[
            ("Host", "attacker.example"),
            ("Authorization", &format!("Bearer {OP}")),
        ],
        b"",
    );
    assert_ne!(r.status, 403, "{}", r.text());
}
