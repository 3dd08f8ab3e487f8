//! What one tenant can do to another through the HTTP API's monitor side, end to end on the
//! real kernel: each test starts its own supervisor and talks to its control socket as
//! `zygo api` does (a hello as the API role, then every request inside `Request::Api`
//! with the caller's token and tenant header).
//!
//! - the script and blob stores: a tenant's share is its own, so another uploading far
//!   past the store's cap evicts only its own entries; storing bytes another tenant holds
//!   is answered as for new bytes; a put of a tenant deleted (and made again) while it is
//!   written is registered to nobody;
//! - zygotes: two tenants calling one host pool at the same time run in different
//!   zygotes (different network namespaces), a pool at `max_warm` answers the other
//!   tenant busy, and no call can `stat` another tenant's script in `/run/script`; a
//!   call never runs beside what another tenant's answered call left running;
//! - egress: a tenant whose limits say network "none", or whose allow list does not cover
//!   an egress function's, is refused (forbidden, naming the limit);
//! - deleting a tenant purges its log entries and counters on host functions, so an id
//!   made again starts empty;
//! - what a tenant reads about host functions: only its own calls as busy, a fixed phrase
//!   for a host function that failed to serve; the operator lists every function with
//!   its tenant; `/healthz` names no function.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use proto::api::{Credentials, FrontFlags, ServeKind};
use proto::front::{
    ErrorCode, ExecAnswer, ExecRequest, FunctionInfo, Hello, HelloReply, Outcome, Reply, Request,
    ScriptRef, FRONT_PROTOCOL, MAX_FRONT_FRAME,
};
use proto::{encode_frame, read_frame};
use serde_json::Value;
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apit-",
    handlers: "import time\n\n\ndef echo(event):\n    return {\"echo\": event}\n\n\ndef slow(event):\n    time.sleep(event[\"s\"])\n    return \"slept\"\n\n\ndef hog(event):\n    return len(bytearray(event[\"bytes\"]))\n",
    defaults: "timeout = \"30s\"\nmem = \"64M\"\nidle_timeout = \"60s\"\n",
    agents: false,
};

/// The bootstrap token every test's supervisor is started with.
const BOOT: &str = "bootstrap-secret-for-tenancy-tests";

// ---------------------------------------------------------------------------------------
// A small client: what `zygo api` sends, minus HTTP.

struct Api {
    s: UnixStream,
}

#[derive(Clone, Copy)]
struct As<'a> {
    token: Option<&'a str>,
    tenant: Option<&'a str>,
}

fn tok(t: &str) -> As<'_> {
    As {
        token: Some(t),
        tenant: None,
    }
}

impl Api {
    fn open(s: &Sup) -> Api {
        Api::open_at(&s.socket())
    }

    /// The same, given only the supervisor's socket (from another thread).
    fn open_at(socket: &std::path::Path) -> Api {
        let mut c = UnixStream::connect(socket).expect("connect to the supervisor");
        c.set_read_timeout(Some(Duration::from_secs(90)))
            .expect("read timeout");
        c.write_all(
            &encode_frame(&Hello {
                protocol: FRONT_PROTOCOL,
                role: proto::front::Role::Api,
                flags: FrontFlags::default(),
            })
            .expect("encode a hello"),
        )
        .expect("say hello");
        match read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME) {
            Ok(HelloReply::Welcome { .. }) => Api { s: c },
            other => panic!("expected a welcome, got {other:?}"),
        }
    }

    fn ask(&mut self, who: As, req: Request) -> Reply {
        self.send(who, req);
        self.recv()
    }

    /// Send a request without waiting for its reply.
    fn send(&mut self, who: As, req: Request) {
        let env = Request::Api {
            who: Credentials {
                token: who.token.map(str::to_string),
                tenant: who.tenant.map(str::to_string),
            },
            request: Box::new(req),
        };
        self.s
            .write_all(&encode_frame(&env).expect("encode"))
            .expect("send a request");
    }

    /// The reply to the request sent last.
    fn recv(&mut self) -> Reply {
        loop {
            match read_frame::<_, Reply>(&mut self.s, MAX_FRONT_FRAME) {
                Ok(Reply::Event(_)) => continue,
                Ok(r) => return r,
                Err(e) => panic!("no reply from the supervisor: {e}"),
            }
        }
    }
}

fn code(r: &Reply) -> Option<ErrorCode> {
    match r {
        Reply::Error { code, .. } => Some(*code),
        _ => None,
    }
}

fn message(r: &Reply) -> String {
    match r {
        Reply::Error { message, .. } => message.clone(),
        other => format!("{other:?}"),
    }
}

#[track_caller]
fn expect_code(r: &Reply, want: ErrorCode, what: &str) {
    assert_eq!(code(r), Some(want), "{what}: {r:?}");
}

fn call(name: &str, event: &str) -> ExecRequest {
    ExecRequest {
        name: name.into(),
        event: event.into(),
        key: None,
        timeout_ms: None,
        stream: false,
        script: None,
        workspace: None,
        workspace_blob: None,
        out: false,
    }
}

fn exec(name: &str, event: &str) -> Request {
    Request::Exec(call(name, event))
}

fn run_script(pool: &str, digest: &str, event: &str) -> Request {
    Request::Exec(ExecRequest {
        script: Some(ScriptRef::Digest(digest.into())),
        ..call(pool, event)
    })
}

#[track_caller]
fn answer(r: Reply, what: &str) -> ExecAnswer {
    match r {
        Reply::Answer(a) => a,
        other => panic!("{what}: expected an answer, got {other:?}"),
    }
}

/// An answer that returned: its result as JSON.
#[track_caller]
fn result(r: Reply, what: &str) -> Value {
    let a = answer(r, what);
    assert_eq!(a.outcome, Outcome::Ok, "{what}: {a:?}");
    serde_json::from_str(a.result.as_deref().unwrap_or("null")).expect("a JSON result")
}

/// `zygo up` with these `[fn.*]` tables (suffix, lines) and the bootstrap token; with
/// `may_fail`, a function that fails to serve is expected (`zygo up` exits 1).
fn start(s: &mut Sup, fns: &[(&str, String)], may_fail: bool) -> Vec<String> {
    s.env("ZYGO_API_TOKEN", BOOT);
    let (file, names) = s.write_toml(fns);
    let f = s.run(&["up", "-f", file.to_str().expect("UTF-8 path")]);
    s.find_supervisor();
    let want = if may_fail { 1 } else { 0 };
    assert_eq!(f.code, want, "zygo up: {}\n{}", f.stderr_text(), s.log());
    names
}

/// A Python function's table: `fn/handlers.py:<handler>` and extra lines.
fn function(handler: &str, extra: &str) -> String {
    format!("agent = \"python\"\nentry = \"fn/handlers.py:{handler}\"\n{extra}")
}

/// Create a tenant (as the bootstrap operator) and mint its token.
fn tenant(s: &Sup, api: &mut Api, tag: &str) -> (String, String) {
    let id = api::tenant_id(tag);
    let r = api.ask(tok(BOOT), Request::CreateTenant { id: id.clone() });
    assert!(matches!(r, Reply::Tenant { .. }), "create {id}: {r:?}");
    let t = api::mint(s, Some(&id)).1;
    (id, t)
}

/// Set a tenant's limits, as an operator token (deploy rights).
fn set_limits(api: &mut Api, op: &str, id: &str, limits: &str) {
    let r = api.ask(
        tok(op),
        Request::SetLimits {
            id: id.into(),
            // The body as the HTTP front parses it.
            limits: zygo_front::http::bodies::limits::parse(limits.as_bytes())
                .unwrap_or_else(|e| panic!("limits {limits}: {}", e.message)),
        },
    );
    assert!(
        matches!(r, Reply::Tenant { .. }),
        "limits {limits} for {id}: {r:?}"
    );
}

fn put_script(api: &mut Api, who: As, source: &str) -> String {
    match api.ask(
        who,
        Request::PutScript {
            source: source.as_bytes().to_vec(),
        },
    ) {
        Reply::ScriptStored { digest, .. } => digest,
        other => panic!("put a script: {other:?}"),
    }
}

fn put_blob(api: &mut Api, who: As, bytes: Vec<u8>) -> Reply {
    api.ask(
        who,
        Request::PutBlob {
            bytes: bytes.into(),
        },
    )
}

fn one_file_tar(name: &str, len: usize) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(len as u64);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    b.append_data(&mut h, name, &vec![b'w'; len][..])
        .expect("append");
    b.into_inner().expect("finish")
}

fn listing(r: Reply) -> Vec<FunctionInfo> {
    match r {
        Reply::Functions(f) => f,
        other => panic!("expected a listing, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// H4: the stores.

/// A pool script that lists its workspace.
const LIST_WORK: &str = "import os\n\ndef handler(event):\n    return sorted(os.listdir(\".\"))\n";

/// Tenant a stores a blob and a script; tenant b then stores ten times the blob store's
/// cap in blobs, and the script store's in scripts. b only churns its own share (its
/// oldest blob is gone, `not_found`); a's blob and script still serve a call. One blob
/// larger than a tenant's share is refused (too_large, naming the share).
#[test]
fn a_tenants_blob_and_script_survive_another_uploading_past_the_cap() {
    let Some(mut s) = SUITE.root("shares") else {
        return;
    };
    s.env("ZYGO_BLOB_STORE", "4M")
        .env("ZYGO_SCRIPT_STORE", "4M");
    let n = start(&mut s, &[("pool", "agent = \"python\"".to_string())], false);
    let pool = &n[0];
    let mut api = Api::open(&s);
    let (_, at) = tenant(&s, &mut api, "sha");
    let (_, bt) = tenant(&s, &mut api, "shb");
    let a_script = put_script(&mut api, tok(&at), LIST_WORK);
    let a_blob = match put_blob(&mut api, tok(&at), one_file_tar("mine.txt", 1000)) {
        Reply::BlobStored { digest, .. } => digest,
        other => panic!("a's blob: {other:?}"),
    };
    // Answered once the bytes are on disk (written by the store's own thread).
    assert!(s.st.join("scripts").join(&a_script).is_file());
    assert!(s.st.join("blobs").join(&a_blob).is_file());
    let a_call = |api: &mut Api| {
        let mut c = call(pool, "{}");
        c.script = Some(ScriptRef::Digest(a_script.clone()));
        c.workspace_blob = Some(a_blob.clone());
        result(api.ask(tok(&at), Request::Exec(c)), "a's call")
    };
    assert_eq!(a_call(&mut api), serde_json::json!(["mine.txt"]));

    // b: 40 blobs of 256 KiB (10 MiB, the cap is 4 MiB, b's share 1 MiB) and 40 scripts
    // of 256 KiB; every one is taken.
    let mut b_blobs = Vec::new();
    for i in 0..40 {
        match put_blob(
            &mut api,
            tok(&bt),
            one_file_tar(&format!("b{i}"), 256 << 10),
        ) {
            Reply::BlobStored { digest, .. } => b_blobs.push(digest),
            other => panic!("b's blob {i}: {other:?}\n{}", s.log()),
        }
    }
    for i in 0..40 {
        let src = format!(
            "# {i}\n{}\ndef handler(event):\n    return {i}\n",
            "#".repeat(256 << 10)
        );
        put_script(&mut api, tok(&bt), &src);
    }
    // a's things are where they were.
    assert_eq!(a_call(&mut api), serde_json::json!(["mine.txt"]));
    // b's first blob made room for its later ones; its last is there.
    let mut c = call(pool, "{}");
    c.script = Some(ScriptRef::Source(LIST_WORK.as_bytes().to_vec()));
    c.workspace_blob = Some(b_blobs[0].clone());
    expect_code(
        &api.ask(tok(&bt), Request::Exec(c.clone())),
        ErrorCode::NotFound,
        "b's oldest blob, evicted for its own newer ones",
    );
    c.workspace_blob = b_blobs.last().cloned();
    assert_eq!(
        result(api.ask(tok(&bt), Request::Exec(c)), "b's newest blob"),
        serde_json::json!(["b39"])
    );
    // More than a whole share at once: too large, saying which setting.
    let r = put_blob(&mut api, tok(&bt), one_file_tar("big", 3 << 20));
    expect_code(&r, ErrorCode::TooLarge, "a blob past a tenant's share");
    assert!(
        message(&r).contains("ZYGO_TENANT_STORE_SHARE"),
        "{}",
        message(&r)
    );
    drop(api);
    s.shutdown();
}

/// Tenant b stores the bytes tenant a stored, while a's are being written and after:
/// each is answered as for new bytes (`existed` false: that a holds them is a's fact),
/// and the bytes serve b's call; the echo that made b's answer take as long as a write
/// leaves no file behind. a storing its own bytes again reads `existed`.
#[test]
fn a_tenant_storing_bytes_another_holds_is_answered_as_for_new_bytes() {
    let Some(mut s) = SUITE.root("echo") else {
        return;
    };
    let n = start(&mut s, &[("pool", "agent = \"python\"".to_string())], false);
    let pool = &n[0];
    let mut api = Api::open(&s);
    let (_, at) = tenant(&s, &mut api, "eca");
    let (_, bt) = tenant(&s, &mut api, "ecb");
    let bytes = one_file_tar(&format!("shared{}", unique()), 12 << 20);
    // a's put and b's at once: b's finds a's being written.
    let mut api_a = Api::open(&s);
    let (at2, bytes2) = (at.clone(), bytes.clone());
    let a = std::thread::spawn(move || put_blob(&mut api_a, tok(&at2), bytes2));
    let b = put_blob(&mut api, tok(&bt), bytes.clone());
    let a = a.join().expect("a's thread");
    let digest = |r: &Reply| match r {
        Reply::BlobStored {
            digest, existed, ..
        } => (digest.clone(), *existed),
        other => panic!("a put: {other:?}\n{}", s.log()),
    };
    let (d, a_existed) = digest(&a);
    let (db, b_existed) = digest(&b);
    assert_eq!(d, db);
    // Whichever came first, neither is told the other holds them.
    assert!(!a_existed || !b_existed, "a {a:?}, b {b:?}");
    // Once held: b again (it holds them now) and a again read existed; a new tenant c
    // does not.
    let (_, ct) = tenant(&s, &mut api, "ecc");
    assert_eq!(
        digest(&put_blob(&mut api, tok(&at), bytes.clone())),
        (d.clone(), true)
    );
    assert_eq!(
        digest(&put_blob(&mut api, tok(&ct), bytes.clone())),
        (d.clone(), false)
    );
    assert_eq!(
        digest(&put_blob(&mut api, tok(&ct), bytes.clone())),
        (d.clone(), true)
    );
    // The bytes serve b's call.
    let mut c = call(pool, "{}");
    c.script = Some(ScriptRef::Source(LIST_WORK.as_bytes().to_vec()));
    c.workspace_blob = Some(d.clone());
    let listed = result(api.ask(tok(&bt), Request::Exec(c)), "b's call");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    // Only the entry is in the store's folder: no temporary file of an echo.
    let names: Vec<String> = std::fs::read_dir(s.st.join("blobs"))
        .expect("the blob store")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(names, [d], "the blob store's folder");
    drop(api);
    s.shutdown();
}

/// A tenant deleted while its blob is being written, and made again at once under the
/// same id: the old put is answered not_found (or, had the write ended first, stored and
/// then purged with its tenant), and the new tenant holds nothing of it.
#[test]
fn a_put_of_a_deleted_tenant_is_registered_to_nobody_even_when_the_id_is_made_again() {
    let Some(mut s) = SUITE.root("reborn") else {
        return;
    };
    let n = start(&mut s, &[("pool", "agent = \"python\"".to_string())], false);
    let pool = &n[0];
    let mut api = Api::open(&s);
    let op = api::mint(&s, None).1;
    for round in 0..3 {
        let (id, t) = tenant(&s, &mut api, "rbn");
        let bytes = one_file_tar(&format!("old{}", unique()), 15 << 20);
        // The put is sent (the supervisor has read nearly all of it once the send
        // returns), then the tenant deleted while its bytes are written.
        let mut api_a = Api::open(&s);
        api_a.send(
            tok(&t),
            Request::PutBlob {
                bytes: bytes.into(),
            },
        );
        let a = std::thread::spawn(move || api_a.recv());
        std::thread::sleep(Duration::from_millis(5 * round));
        let r = api.ask(tok(&op), Request::DeleteTenant { id: id.clone() });
        assert!(matches!(r, Reply::TenantDeleted(_)), "{r:?}");
        let r = api.ask(tok(BOOT), Request::CreateTenant { id: id.clone() });
        assert!(matches!(r, Reply::Tenant { .. }), "{r:?}");
        let t2 = api::mint(&s, Some(&id)).1;
        let d = match a.join().expect("the put's thread") {
            Reply::BlobStored { digest, .. } => digest,
            r => {
                // Deleted while written: not_found. (Should the put have been read only
                // after the delete, its token was revoked: that round shows nothing.)
                assert!(
                    matches!(
                        code(&r),
                        Some(ErrorCode::NotFound | ErrorCode::Unauthorized)
                    ),
                    "the deleted tenant's put: {r:?}"
                );
                continue;
            }
        };
        let mut c = call(pool, "{}");
        c.script = Some(ScriptRef::Source(LIST_WORK.as_bytes().to_vec()));
        c.workspace_blob = Some(d);
        expect_code(
            &api.ask(tok(&t2), Request::Exec(c)),
            ErrorCode::NotFound,
            "the new tenant naming the old one's blob",
        );
    }
    drop(api);
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// M3: zygotes.

/// A pool script: its network namespace, the time it ran, and whether it can `stat` the
/// path of the script named in the event.
const WHERE_AM_I: &str = r#"import os, time
def handler(event):
    start = time.time()
    net = os.readlink("/proc/self/ns/net")
    own = os.path.exists(__file__)
    try:
        os.stat("/run/script/" + event["other"])
        other = "found"
    except OSError as e:
        other = type(e).__name__
    time.sleep(event["s"])
    return {"net": net, "own": own, "other": other, "start": start, "end": time.time()}
"#;

/// Two tenants call one host pool (max_warm 2) at the same time: different zygotes
/// (different network namespaces), and neither can `stat` the other's script in
/// `/run/script`, during or after the other's call. At max_warm 1 the second tenant is
/// answered busy while the first one's call runs, never put beside it.
#[test]
fn tenants_never_share_a_zygote() {
    let Some(mut s) = SUITE.root("affinity") else {
        return;
    };
    let n = start(
        &mut s,
        &[
            // Both zygotes kept ready: b's call need not wait for one to start (under
            // load that took longer than a's call and the calls did not overlap).
            (
                "two",
                "agent = \"python\"\nmin_warm = 2\nmax_warm = 2".to_string(),
            ),
            ("one", "agent = \"python\"\nmax_warm = 1".to_string()),
        ],
        false,
    );
    let (two, one) = (n[0].clone(), n[1].clone());
    let mut api = Api::open(&s);
    for i in 0.. {
        let l = listing(api.ask(tok(BOOT), Request::List));
        if l.iter().any(|f| f.name == two && f.zygotes.ready >= 2) {
            break;
        }
        assert!(i < 1200, "{two} never had two zygotes ready: {l:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
    let (_, at) = tenant(&s, &mut api, "afa");
    let (_, bt) = tenant(&s, &mut api, "afb");
    // The same program, but different bytes for each: different digests.
    let da = put_script(&mut api, tok(&at), &format!("{WHERE_AM_I}# a\n"));
    let db = put_script(&mut api, tok(&bt), &format!("{WHERE_AM_I}# b\n"));
    let event = |other: &str, s: u32| format!(r#"{{"other": "{other}", "s": {s}}}"#);

    let mut api_a = Api::open(&s);
    let (at2, two2, da2, ev_a) = (at.clone(), two.clone(), da.clone(), event(&db, 6));
    let a = std::thread::spawn(move || {
        result(
            api_a.ask(tok(&at2), run_script(&two2, &da2, &ev_a)),
            "a's call",
        )
    });
    wait_in_flight(&mut api, &at, &two);
    // b's call takes 2 s too: a's shows in flight once it is handed to its zygote, which
    // may be a few milliseconds before its handler starts (under load, b's instant call
    // was over by then once).
    let b = result(
        api.ask(tok(&bt), run_script(&two, &db, &event(&da, 2))),
        "b's call",
    );
    let a = a.join().expect("a's thread");
    let at_ = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    assert!(
        at_(&b, "start") < at_(&a, "end") && at_(&a, "start") < at_(&b, "end"),
        "the two calls did not overlap, so this proves nothing: a {a}, b {b}"
    );
    assert!(
        a["net"].as_str().is_some_and(|n| n.starts_with("net:")),
        "{a}"
    );
    assert_ne!(
        a["net"], b["net"],
        "a and b ran in one zygote: a {a}, b {b}"
    );
    assert_eq!(
        (a["own"].as_bool(), b["own"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(
        b["other"], "FileNotFoundError",
        "b looked for a's script: {b}"
    );
    assert_eq!(
        a["other"], "FileNotFoundError",
        "a looked for b's script: {a}"
    );
    // After a's call: a later call of b, in the zygote a used or not, does not find it.
    for _ in 0..3 {
        let b = result(
            api.ask(tok(&bt), run_script(&two, &db, &event(&da, 0))),
            "b's later call",
        );
        assert_eq!(b["other"], "FileNotFoundError", "{b}");
    }

    // max_warm 1: while a's call runs, b is busy (retry), not beside it.
    let mut api_a = Api::open(&s);
    let (at2, one2, da2, ev_a) = (at.clone(), one.clone(), da.clone(), event(&db, 3));
    let a = std::thread::spawn(move || {
        result(
            api_a.ask(tok(&at2), run_script(&one2, &da2, &ev_a)),
            "a's call",
        )
    });
    wait_in_flight(&mut api, &at, &one);
    let r = api.ask(tok(&bt), run_script(&one, &db, &event(&da, 0)));
    expect_code(&r, ErrorCode::Busy, "another tenant's call at max_warm");
    a.join().expect("a's thread");
    // Then b has the zygote.
    let b = result(
        api.ask(tok(&bt), run_script(&one, &db, &event(&da, 0))),
        "b after a",
    );
    assert_eq!(b["other"], "FileNotFoundError", "{b}");
    drop(api);
    s.shutdown();
}

/// A pool script: with `leave`, it listens on a loopback port, leaves a process of its own
/// holding that listener (and everything the handler inherited) running, and returns at
/// once; without, it tries to connect to that port. Both say which network namespace
/// they ran in.
const LEAVE_BEHIND: &str = r#"import os, socket, time
def handler(event):
    net = os.readlink("/proc/self/ns/net")
    port = event["port"]
    if event["leave"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(8)
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        s.close()
        return {"net": net}
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(2)
    try:
        c.connect(("127.0.0.1", port))
        reached = "connected"
    except OSError as e:
        reached = type(e).__name__
    return {"net": net, "reached": reached}
"#;

/// Tenant a's call of a host pool (max_warm 1) leaves a process listening on loopback
/// and returns; tenant b's call, made at once (while a's child would still linger after
/// its answer), runs in that same zygote only once what a left is gone: it cannot reach
/// a's listener. Three rounds: a's next call binds the port again, so what it left the
/// round before is gone too.
#[test]
fn another_tenants_call_never_runs_beside_what_an_answered_call_left_running() {
    let Some(mut s) = SUITE.root("linger") else {
        return;
    };
    let n = start(
        &mut s,
        &[("one", "agent = \"python\"\nmax_warm = 1".to_string())],
        false,
    );
    let one = n[0].clone();
    let mut api = Api::open(&s);
    let (_, at) = tenant(&s, &mut api, "lga");
    let (_, bt) = tenant(&s, &mut api, "lgb");
    let da = put_script(&mut api, tok(&at), LEAVE_BEHIND);
    let db = put_script(&mut api, tok(&bt), LEAVE_BEHIND);
    let port = 20000 + (unique() % 20000) as u16;
    let ev = |leave: bool| format!(r#"{{"port": {port}, "leave": {leave}}}"#);
    for round in 0..3 {
        let a = result(
            api.ask(tok(&at), run_script(&one, &da, &ev(true))),
            "a's call",
        );
        let b = result(
            api.ask(tok(&bt), run_script(&one, &db, &ev(false))),
            "b's call",
        );
        assert!(
            a["net"].as_str().is_some_and(|n| n.starts_with("net:")),
            "{a}"
        );
        assert_eq!(
            a["net"], b["net"],
            "round {round}: with max_warm 1 both run in the one zygote, or this proves nothing"
        );
        assert_ne!(
            b["reached"],
            "connected",
            "round {round}: b reached the listener a's call left running: {b}\n{}",
            s.log()
        );
    }
    drop(api);
    s.shutdown();
}

/// Wait until the tenant of token `t` has a call of `name` in flight (as `GET /fn` says).
fn wait_in_flight(api: &mut Api, t: &str, name: &str) {
    for _ in 0..400 {
        let l = listing(api.ask(tok(t), Request::List));
        if l.iter().any(|f| f.name == name && f.in_flight == 1) {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("the call of {name} never showed in flight");
}

// ---------------------------------------------------------------------------------------
// M4: egress.

/// A host function with `network = "egress"` (its rule names a host that is never
/// reached: the function only echoes): a tenant without network limits calls it; one
/// whose limits say network "none", or whose allow list does not cover the function's
/// rule, is refused (forbidden, naming the limit), whatever else; one whose list covers
/// it calls it.
#[test]
fn an_egress_function_is_refused_to_a_tenant_whose_limits_do_not_cover_it() {
    let Some(mut s) = SUITE.root("egress") else {
        return;
    };
    let n = start(
        &mut s,
        &[(
            "net",
            function(
                "echo",
                "network = \"egress\"\nallow = [\"api.zygo.test:443\"]\n",
            ),
        )],
        false,
    );
    let f = &n[0];
    let op = api::mint(&s, None).1;
    let mut api = Api::open(&s);
    let (free, free_t) = tenant(&s, &mut api, "egf");
    let _ = free;
    assert_eq!(
        result(api.ask(tok(&free_t), exec(f, "1")), "no network limit"),
        serde_json::json!({"echo": 1})
    );
    let (none, none_t) = tenant(&s, &mut api, "egn");
    set_limits(&mut api, &op, &none, r#"{"network": "none"}"#);
    let r = api.ask(tok(&none_t), exec(f, "1"));
    expect_code(&r, ErrorCode::Forbidden, "network none");
    assert!(message(&r).contains("network \"none\""), "{}", message(&r));
    let (other, other_t) = tenant(&s, &mut api, "ego");
    set_limits(
        &mut api,
        &op,
        &other,
        r#"{"network": "egress", "allow": ["other.zygo.test:443"]}"#,
    );
    let r = api.ask(tok(&other_t), exec(f, "1"));
    expect_code(
        &r,
        ErrorCode::Forbidden,
        "an allow list that misses the rule",
    );
    assert!(
        message(&r).contains("api.zygo.test:443") && message(&r).contains("other.zygo.test:443"),
        "{}",
        message(&r)
    );
    // Acting for that tenant, the operator is held to the same.
    let r = api.ask(
        As {
            token: Some(BOOT),
            tenant: Some(&other),
        },
        exec(f, "1"),
    );
    expect_code(&r, ErrorCode::Forbidden, "the operator acting for it");
    let (cover, cover_t) = tenant(&s, &mut api, "egc");
    set_limits(
        &mut api,
        &op,
        &cover,
        r#"{"allow": ["api.zygo.test:443", "other.zygo.test:443"]}"#,
    );
    assert_eq!(
        result(api.ask(tok(&cover_t), exec(f, "2")), "a covering list"),
        serde_json::json!({"echo": 2})
    );
    // The host calls it whatever.
    assert_eq!(
        result(api.ask(tok(BOOT), exec(f, "3")), "the host"),
        serde_json::json!({"echo": 3})
    );
    drop(api);
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// M6: deleting a tenant.

/// A tenant calls a host function; its log entries and counters are there. Deleted and
/// made again under the same id, the tenant reads none of them.
#[test]
fn a_tenant_made_again_reads_nothing_of_the_one_deleted() {
    let Some(mut s) = SUITE.root("reuse") else {
        return;
    };
    let n = start(&mut s, &[("echo", function("echo", ""))], false);
    let f = &n[0];
    let mut api = Api::open(&s);
    let (id, t) = tenant(&s, &mut api, "reu");
    for i in 0..3 {
        result(
            api.ask(tok(&t), exec(f, &format!("\"secret-{i}\""))),
            "a call",
        );
    }
    let logs = |api: &mut Api, t: &str| match api.ask(
        tok(t),
        Request::Logs {
            name: f.clone(),
            n: 1000,
        },
    ) {
        Reply::Logs { entries, .. } => entries,
        other => panic!("logs: {other:?}"),
    };
    let stats = |api: &mut Api, t: &str| match api.ask(
        tok(t),
        Request::Stats {
            name: Some(f.clone()),
        },
    ) {
        Reply::Stats(st) => st[0].requests,
        other => panic!("stats: {other:?}"),
    };
    assert_eq!(logs(&mut api, &t).len(), 3);
    assert_eq!(stats(&mut api, &t), 3);
    let op = api::mint(&s, None).1;
    let r = api.ask(tok(&op), Request::DeleteTenant { id: id.clone() });
    assert!(matches!(r, Reply::TenantDeleted(_)), "{r:?}");
    let r = api.ask(tok(BOOT), Request::CreateTenant { id: id.clone() });
    assert!(matches!(r, Reply::Tenant { .. }), "{r:?}");
    let t2 = api::mint(&s, Some(&id)).1;
    let l = logs(&mut api, &t2);
    assert!(
        l.is_empty(),
        "the new {id} reads the old one's calls: {l:?}"
    );
    assert_eq!(stats(&mut api, &t2), 0);
    // The host's own view still counts every call.
    match api.ask(
        tok(BOOT),
        Request::Stats {
            name: Some(f.clone()),
        },
    ) {
        Reply::Stats(st) => assert_eq!(st[0].requests, 3),
        other => panic!("stats: {other:?}"),
    }
    drop(api);
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// L2, L3, L4 and the operator's listing.

/// A handler module that takes a while to import (so a zygote is starting for a while).
const SLOW_IMPORT: &str = "import time\ntime.sleep(6)\n\ndef handler(event):\n    return 1\n";

/// A handler module whose import fails naming a host path.
const BROKEN: &str =
    "raise RuntimeError(\"cannot read /srv/operator-only/config.toml\")\n\ndef handler(event):\n    return 1\n";

/// - the operator (acting for nobody) lists every function on the host, a tenant's with
///   its tenant; a tenant lists its own and the host's;
/// - while tenant b's call runs in a host function, tenant a reads its zygotes as
///   ready, not busy, and no call in flight; b reads one busy;
/// - a host function that failed to serve: a tenant reads a fixed phrase, in the listing
///   and when calling it; the operator reads why;
/// - `/healthz` (no token) counts the functions below min_warm and names none.
#[test]
fn what_a_tenant_reads_about_host_functions() {
    let Some(mut s) = SUITE.root("reads") else {
        return;
    };
    s.fn_file("slowimp.py", SLOW_IMPORT);
    s.fn_file("broken.py", BROKEN);
    let n = start(
        &mut s,
        &[
            ("slow", function("slow", "")),
            (
                "slowimp",
                "agent = \"python\"\nentry = \"fn/slowimp.py:handler\"\nmax_warm = 2".to_string(),
            ),
            (
                "broken",
                "agent = \"python\"\nentry = \"fn/broken.py:handler\"".to_string(),
            ),
        ],
        true,
    );
    let (slow, slowimp, broken) = (n[0].clone(), n[1].clone(), n[2].clone());
    let mut api = Api::open(&s);
    let (a, at) = tenant(&s, &mut api, "rda");
    let (b, bt) = tenant(&s, &mut api, "rdb");
    // A function of b's own.
    let r = api.ask(
        As {
            token: Some(&api::mint(&s, None).1),
            tenant: Some(&b),
        },
        Request::ServeLayer {
            name: "mine".into(),
            kind: ServeKind::Function,
            layer: zygo_tests::api::layer("{\"agent\":\"python\",\"entry\":\"handlers.py:echo\"}"),
            base_dir: Some(s.dir.path.join("fn").to_str().expect("UTF-8").into()),
        },
    );
    assert!(matches!(r, Reply::ServedOne { .. }), "{r:?}\n{}", s.log());

    // The operator: everything, each naming its tenant.
    let all = listing(api.ask(tok(BOOT), Request::List));
    let mine = all
        .iter()
        .find(|f| f.name == "mine")
        .unwrap_or_else(|| panic!("the operator does not see b's function: {all:?}"));
    assert_eq!(mine.tenant.as_deref(), Some(b.as_str()));
    for host in [&slow, &slowimp, &broken] {
        assert!(
            all.iter().any(|f| &f.name == host && f.tenant.is_none()),
            "{host}: {all:?}"
        );
    }
    // Tenants: their own and the host's.
    let la = listing(api.ask(tok(&at), Request::List));
    assert!(!la.iter().any(|f| f.name == "mine"), "{la:?}");
    assert!(la.iter().all(|f| f.tenant.is_none()), "{la:?}");
    let lb = listing(api.ask(tok(&bt), Request::List));
    assert!(lb.iter().any(|f| f.name == "mine"), "{lb:?}");

    // b's call in flight: a sees nothing of it.
    let mut api_b = Api::open(&s);
    let (bt2, slow2) = (bt.clone(), slow.clone());
    let call_b = std::thread::spawn(move || {
        result(
            api_b.ask(tok(&bt2), exec(&slow2, r#"{"s": 4}"#)),
            "b's call",
        )
    });
    let seen = |api: &mut Api, who: &str| {
        listing(api.ask(tok(who), Request::List))
            .into_iter()
            .find(|f| f.name == slow)
            .expect("the slow function is listed")
    };
    let mut busy_for_b = None;
    for _ in 0..200 {
        let fb = seen(&mut api, &bt);
        if fb.in_flight == 1 && fb.zygotes.busy == 1 {
            busy_for_b = Some(fb);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let fb = busy_for_b.expect("b's call never showed in flight");
    let fa = seen(&mut api, &at);
    let fop = seen(&mut api, BOOT);
    call_b.join().expect("b's thread");
    assert_eq!((fb.zygotes.busy, fb.in_flight), (1, 1), "b: {fb:?}");
    assert_eq!((fa.zygotes.busy, fa.in_flight), (0, 0), "a: {fa:?}");
    assert!(fa.zygotes.ready >= 1, "a: {fa:?}");
    assert_eq!(
        (fop.zygotes.busy, fop.in_flight),
        (1, 1),
        "the operator: {fop:?}"
    );

    // The broken host function: a fixed phrase for a tenant, the reason for the operator.
    let fa = listing(api.ask(tok(&at), Request::List))
        .into_iter()
        .find(|f| f.name == broken)
        .expect("listed");
    let why = fa.error.clone().unwrap_or_default();
    assert!(
        fa.state == "failed" && !why.contains("/srv/") && why.contains("log"),
        "{fa:?}"
    );
    let r = api.ask(tok(&at), exec(&broken, "1"));
    expect_code(&r, ErrorCode::Unavailable, "a failed function");
    assert!(!message(&r).contains("/srv/"), "{}", message(&r));
    let fop = listing(api.ask(tok(BOOT), Request::List))
        .into_iter()
        .find(|f| f.name == broken)
        .expect("listed");
    assert!(
        fop.error
            .as_deref()
            .unwrap_or("")
            .contains("/srv/operator-only"),
        "{fop:?}"
    );
    let r = api.ask(tok(BOOT), exec(&broken, "1"));
    assert!(
        message(&r).contains("/srv/operator-only"),
        "{}",
        message(&r)
    );

    // Two zygotes of slowimp wanted, the second importing for seconds: /healthz counts
    // it and names nothing.
    let r = api.ask(
        tok(BOOT),
        Request::Warm {
            name: slowimp.clone(),
            n: 2,
        },
    );
    assert!(matches!(r, Reply::Warmed { .. }), "{r:?}");
    let nobody = As {
        token: None,
        tenant: None,
    };
    match api.ask(nobody, Request::Health) {
        Reply::Health(h) => {
            let said = h.reasons().join("; ");
            assert!(
                h.below_min_warm == vec!["1 function(s) or pool(s)".to_string()],
                "{said}"
            );
            for name in [&slowimp, &slow, &broken, &a, &b] {
                assert!(!said.contains(name.as_str()), "{name} in {said}");
            }
        }
        other => panic!("health: {other:?}"),
    }
    drop(api);
    s.shutdown();
}

/// A call that runs out of memory is told the limit that applied: a tenant held to 64M
/// calling a 256M function hears "limit 64M" (it heard the function's 256M, while its
/// peak said 64M).
#[test]
fn an_oom_names_the_limit_that_applied() {
    let Some(mut s) = SUITE.root("oomlimit") else {
        return;
    };
    let n = start(&mut s, &[("big", function("hog", "mem = \"256M\""))], false);
    let op = api::mint(&s, None).1;
    let mut api = Api::open(&s);
    let (t, tt) = tenant(&s, &mut api, "oom");
    set_limits(&mut api, &op, &t, r#"{"mem": "64M"}"#);
    let a = answer(
        api.ask(tok(&tt), exec(&n[0], r#"{"bytes": 268435456}"#)),
        "a tenant's call past its memory",
    );
    assert!(a.oom_killed, "{a:?}");
    assert_eq!(
        a.error.as_deref(),
        Some("ran out of memory (limit 64M)"),
        "{a:?}"
    );
    // The host's own call of the same function is told the function's limit.
    let a = answer(
        api.ask(tok(&op), exec(&n[0], r#"{"bytes": 536870912}"#)),
        "the host's call past the function's memory",
    );
    assert!(a.oom_killed, "{a:?}");
    assert_eq!(
        a.error.as_deref(),
        Some("ran out of memory (limit 256M)"),
        "{a:?}"
    );
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// One tenant cannot take the service from the others: logs.

/// A handler that writes 8 KiB to stdout and to stderr and raises an error of `n` bytes
/// (the launcher keeps its first 64 KiB).
const LOUD: &str = "import sys\n\ndef handler(event):\n    sys.stdout.write(\"o\" * 8192)\n    sys.stderr.write(\"e\" * 8192)\n    raise RuntimeError(\"x\" * event[\"n\"])\n";

/// `calls` calls of `name` as the holder of `token`, four connections at once: each must
/// be answered (an error, as the handler raises).
fn call_many(s: &Sup, token: &str, name: &str, calls: usize, n: usize) {
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (sock, token, name) = (s.socket(), token.to_string(), name.to_string());
            std::thread::spawn(move || {
                let mut api = Api::open_at(&sock);
                for _ in (i..calls).step_by(4) {
                    let a = answer(
                        api.ask(tok(&token), exec(&name, &format!("{{\"n\": {n}}}"))),
                        "a loud call",
                    );
                    assert_eq!(a.outcome, Outcome::Error, "{:?}", a.error);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a caller's thread");
    }
}

/// The supervisor's resident memory, in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// The bytes of a logs answer's entries, as the log counts them.
fn entries_bytes(l: &[proto::front::LogEntry]) -> usize {
    l.iter()
        .map(|e| {
            e.request_id.len()
                + e.error.as_ref().map_or(0, String::len)
                + e.stdout.len()
                + e.stderr.len()
        })
        .sum()
}

/// Tenant a, with its token only, calls a host function 1,000 times, each call raising a
/// 64 KiB error and writing 16 KiB; tenants c and d 100 times each; tenant b five times
/// before them, and the host once.
///
/// - b still reads its five entries: a's calls erased none of them (one log of 1,000 for
///   every caller erased them all);
/// - a reads its own entries within its 2 MiB (each error kept to its first 16 KiB and
///   saying how much was cut), where the log held 800 entries, 59 MB, for it; the
///   supervisor's memory grows far less than the 74 MB it grew by;
/// - the operator's answer (every caller's entries) holds the newest that fit 4 MiB and
///   says how many were left out; the host's `zygo logs` answers at once;
/// - `zygo mcp`'s logs (the MCP role) show only the host's own call.
#[test]
fn a_tenants_calls_keep_every_log_small_and_apart() {
    let Some(mut s) = SUITE.root("logs") else {
        return;
    };
    s.fn_file("loud.py", LOUD);
    let n = start(
        &mut s,
        &[(
            "loud",
            "agent = \"python\"\nentry = \"fn/loud.py:handler\"".to_string(),
        )],
        false,
    );
    let loud = n[0].clone();
    let mut api = Api::open(&s);
    let (_, at) = tenant(&s, &mut api, "lga");
    let (b, bt) = tenant(&s, &mut api, "lgb");
    let (_, ct) = tenant(&s, &mut api, "lgc");
    let (_, dt) = tenant(&s, &mut api, "lgd");
    let logs = |api: &mut Api, who: As, n: u32| match api.ask(
        who,
        Request::Logs {
            name: loud.clone(),
            n,
        },
    ) {
        Reply::Logs { entries, left_out } => (entries, left_out),
        other => panic!("logs: {other:?}"),
    };
    call_many(&s, &bt, &loud, 5, 10);
    let (host, f) = s.exec(&loud, Some(r#"{"n": 3}"#), &[]);
    s.assert_handler_error(&host, &f);
    let pid = s.supervisor.expect("the supervisor's pid");
    let before = rss(pid);
    call_many(&s, &at, &loud, 1000, 100_000);
    call_many(&s, &ct, &loud, 100, 100_000);
    call_many(&s, &dt, &loud, 100, 100_000);
    let grew = rss(pid).saturating_sub(before);

    let (mine, left_out) = logs(&mut api, tok(&bt), 1000);
    assert_eq!(
        (mine.len(), left_out),
        (5, 0),
        "tenant {b} lost its entries to another tenant's calls"
    );
    let (theirs, left_out) = logs(&mut api, tok(&at), 1000);
    let bytes = entries_bytes(&theirs);
    assert!(
        bytes <= 2 << 20 && left_out == 0 && theirs.len() >= 50,
        "a's own log holds {} entries, {bytes} bytes (left out {left_out})",
        theirs.len()
    );
    for e in &theirs {
        let error = e.error.as_deref().unwrap_or("");
        assert!(
            error.len() <= (16 << 10) + 64 && error.ends_with("more bytes cut)"),
            "an error of {} bytes: …{}",
            error.len(),
            &error[error.len().saturating_sub(80)..]
        );
        assert!(e.stdout.len() <= 4096 && e.stderr.len() <= 4096);
    }
    assert!(
        grew < 40 << 20,
        "the supervisor grew by {} MiB for 1,200 calls' logs",
        grew >> 20
    );
    // The operator: every caller's, the newest that fit the answer's budget.
    let (all, left_out) = logs(&mut api, tok(BOOT), 1000);
    assert!(
        entries_bytes(&all) <= 4 << 20 && left_out > 0,
        "the operator's answer: {} entries, {} bytes, {left_out} left out",
        all.len(),
        entries_bytes(&all)
    );
    let t0 = std::time::Instant::now();
    let f = s.run(&["logs", &loud, "-n", "1000", "--json"]);
    assert_eq!(f.code, 0, "zygo logs: {}", f.stderr_text());
    assert!(
        t0.elapsed() < Duration::from_secs(20) && f.stderr_text().contains("left out"),
        "zygo logs took {:?}: {}",
        t0.elapsed(),
        f.stderr_text()
    );
    // zygo mcp reads the host's own call, none of the tenants'.
    let mut mcp = UnixStream::connect(s.socket()).expect("connect as zygo mcp");
    mcp.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    mcp.write_all(
        &encode_frame(&Hello {
            protocol: FRONT_PROTOCOL,
            role: proto::front::Role::Mcp,
            flags: FrontFlags::default(),
        })
        .expect("encode a hello"),
    )
    .expect("say hello");
    let hello = read_frame::<_, HelloReply>(&mut mcp, MAX_FRONT_FRAME);
    assert!(matches!(hello, Ok(HelloReply::Welcome { .. })), "{hello:?}");
    mcp.write_all(
        &encode_frame(&Request::Logs {
            name: loud.clone(),
            n: 200,
        })
        .expect("encode"),
    )
    .expect("ask for the logs");
    match read_frame::<_, Reply>(&mut mcp, MAX_FRONT_FRAME) {
        Ok(Reply::Logs { entries, .. }) => assert_eq!(
            entries
                .iter()
                .map(|e| e.request_id.as_str())
                .collect::<Vec<_>>(),
            [host["request_id"].as_str().unwrap_or("?")],
            "zygo mcp reads tenants' calls"
        ),
        other => panic!("zygo mcp's logs: {other:?}"),
    }
    drop((api, mcp));
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// One tenant cannot take the service from the others: a pool's zygotes.

/// A pool script that sleeps `s` seconds and says which zygote (network namespace) it ran in.
const NAP: &str = "import os, time\ndef handler(event):\n    time.sleep(event[\"s\"])\n    return os.readlink(\"/proc/self/ns/net\")\n";

/// Tenant a, with its token only, makes 13 calls at once of a host pool (max_warm 4, the
/// default): at most half the pool's zygotes are its share, so 8 of them run (two zygotes
/// of 4 calls) and the others are busy, saying it is this tenant's share. Meanwhile tenant
/// b's calls are served, in zygotes of their own. (a's 13 calls held all four zygotes, and
/// b was busy.)
#[test]
fn one_tenant_holds_at_most_its_share_of_a_pool() {
    let Some(mut s) = SUITE.root("poolshare") else {
        return;
    };
    let n = start(&mut s, &[("nap", "agent = \"python\"".to_string())], false);
    let nap = n[0].clone();
    let mut api = Api::open(&s);
    let (_, at) = tenant(&s, &mut api, "psa");
    let (_, bt) = tenant(&s, &mut api, "psb");
    let da = put_script(&mut api, tok(&at), NAP);
    let db = put_script(&mut api, tok(&bt), &format!("{NAP}# b\n"));
    let calls: Vec<_> = (0..13)
        .map(|_| {
            let (sock, at, nap, da) = (s.socket(), at.clone(), nap.clone(), da.clone());
            std::thread::spawn(move || {
                Api::open_at(&sock).ask(tok(&at), run_script(&nap, &da, r#"{"s": 8}"#))
            })
        })
        .collect();
    // Once a's calls are all placed or refused (the refusals come at once), b calls.
    std::thread::sleep(Duration::from_millis(2500));
    let b: Vec<Value> = (0..2)
        .map(|_| {
            let (sock, bt, nap, db) = (s.socket(), bt.clone(), nap.clone(), db.clone());
            std::thread::spawn(move || {
                Api::open_at(&sock).ask(tok(&bt), run_script(&nap, &db, r#"{"s": 0}"#))
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| result(t.join().expect("b's call"), "b's call beside a's"))
        .collect();
    let (mut ran, mut busy, mut nets) = (0, 0, std::collections::BTreeSet::new());
    for c in calls {
        match c.join().expect("a's call") {
            Reply::Answer(a) if a.outcome == Outcome::Ok => {
                ran += 1;
                nets.insert(a.result.unwrap_or_default());
            }
            r @ Reply::Error {
                code: ErrorCode::Busy,
                ..
            } => {
                assert!(message(&r).contains("share"), "{}", message(&r));
                busy += 1;
            }
            other => panic!("a's call: {other:?}"),
        }
    }
    assert_eq!(
        (ran, busy, nets.len()),
        (8, 5, 2),
        "a's 13 calls: {ran} ran (in {} zygotes), {busy} busy",
        nets.len()
    );
    for v in &b {
        assert!(
            !nets.contains(&v.to_string()),
            "b ran in a zygote of a's: {v}"
        );
    }
    drop(api);
    s.shutdown();
}
