//! The monitor's side of the HTTP API, end to end on the real kernel: each test starts its
//! own supervisor and talks to its control socket the way `zygo api` does — a hello as the
//! API role with the front's flags, then every request inside `Request::Api { who, .. }`
//! carrying the bearer token and `X-Zygo-Tenant` as an HTTP caller sent them. Everything an
//! HTTP caller may do is decided here, by the supervisor: who the token belongs to, the
//! deploy gate, what a tenant sees, and the limits its requests run under.
//!
//! - every row of the deploy gate, for an operator token, the bootstrap token with and
//!   without `--allow-deploy`, and a tenant token;
//! - tokens: minted with `zygo token mint`, used, revoked (401 from the next request);
//!   the tenant header's rules;
//! - two tenants: listings, digests, logs, stats and cancels never cross; a tenant's
//!   function's cgroups are `tenants/<tenant>/<fn>/…`;
//! - deleting a tenant answers what it stopped and removed, and takes its tokens;
//! - a limit above every ceiling is 422 naming the key; a tenant held to 64M is
//!   OOM-killed at 64M in a pool declared with 512M;
//! - the records survive a `kill -9` in the middle of a burst of changes, and a torn one
//!   refuses the start naming its path;
//! - hostile envelopes are refused with the right code, and the connection still serves.

use std::fs;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use proto::api::{Credentials, FrontFlags, LimitsPatch, ServeKind, TenantInfo};
use proto::front::{
    ErrorCode, ExecRequest, Hello, HelloReply, Outcome, Reply, Request, Role, ScriptRef,
    FRONT_PROTOCOL, MAX_FRONT_FRAME,
};
use proto::{encode_frame, read_frame};
use zygo_tests::api::{mint, tenant_id};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apim-",
    handlers: "import time\n\n\ndef echo(event):\n    return {\"echo\": event}\n\n\ndef slow(event):\n    time.sleep(event[\"s\"])\n    return \"slept\"\n",
    defaults: "timeout = \"20s\"\nmem = \"64M\"\nidle_timeout = \"60s\"\n",
    agents: false,
};

/// The bootstrap token every test's supervisor is started with.
const BOOT: &str = "bootstrap-secret-for-tests";

/// A pool script that holds `mb` MiB (every page written) and says how much.
const ALLOC: &str =
    "def handler(event):\n    b = b\"x\" * (event[\"mb\"] << 20)\n    return len(b) >> 20\n";

// ---------------------------------------------------------------------------------------
// A small client: what `zygo api` sends, minus HTTP.

/// One API-role connection to a supervisor.
struct Api {
    s: UnixStream,
}

/// Who a request is from: a token (or none) and a tenant header (or none).
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

fn tok_for<'a>(t: &'a str, tenant: &'a str) -> As<'a> {
    As {
        token: Some(t),
        tenant: Some(tenant),
    }
}

impl Api {
    fn open(s: &Sup, flags: FrontFlags) -> Api {
        let mut c = UnixStream::connect(s.socket()).expect("connect to the supervisor");
        c.set_read_timeout(Some(Duration::from_secs(60)))
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
            Ok(HelloReply::Welcome { .. }) => Api { s: c },
            other => panic!("expected a welcome, got {other:?}\n{}", s.log()),
        }
    }

    fn plain(s: &Sup) -> Api {
        Api::open(s, FrontFlags::default())
    }

    fn send_raw(&mut self, r: &Request) {
        self.s
            .write_all(&encode_frame(r).expect("encode"))
            .expect("send a request");
    }

    /// The final reply (events of a streamed call are skipped).
    fn reply(&mut self) -> Reply {
        loop {
            match read_frame::<_, Reply>(&mut self.s, MAX_FRONT_FRAME) {
                Ok(Reply::Event(_)) => continue,
                Ok(r) => return r,
                Err(e) => panic!("no reply from the supervisor: {e}"),
            }
        }
    }

    fn ask(&mut self, who: As, req: Request) -> Reply {
        self.send_raw(&envelope(who, req));
        self.reply()
    }
}

fn envelope(who: As, req: Request) -> Request {
    Request::Api {
        who: Credentials {
            token: who.token.map(str::to_string),
            tenant: who.tenant.map(str::to_string),
        },
        request: Box::new(req),
    }
}

/// The code of a refusal (`None`: not a refusal).
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

#[track_caller]
fn expect_ok(r: &Reply, what: &str) {
    assert_eq!(code(r), None, "{what}: {r:?}");
}

fn exec(name: &str, event: &str) -> Request {
    Request::Exec(ExecRequest {
        name: name.into(),
        event: event.into(),
        key: None,
        timeout_ms: None,
        stream: false,
        script: None,
        workspace: None,
        workspace_blob: None,
        out: false,
    })
}

fn run_script(pool: &str, digest: &str, event: &str) -> Request {
    Request::Exec(ExecRequest {
        name: pool.into(),
        event: event.into(),
        key: None,
        timeout_ms: None,
        stream: false,
        script: Some(ScriptRef::Digest(digest.into())),
        workspace: None,
        workspace_blob: None,
        out: false,
    })
}

/// Start the test's supervisor with these functions (or none), with the bootstrap token.
fn start<T: FnTable>(s: &mut Sup, fns: &[T]) -> Vec<String> {
    s.env("ZYGO_API_TOKEN", BOOT);
    if fns.is_empty() {
        let mut c = s.cmd(&["up"]);
        c.current_dir(&s.dir.path);
        let f = finish(c);
        assert_eq!(f.code, 0, "zygo up: {}\n{}", f.stderr_text(), s.log());
        s.find_supervisor();
        return Vec::new();
    }
    s.up(fns)
}

fn create_tenant(api: &mut Api, op: &str, id: &str) -> TenantInfo {
    match api.ask(tok(op), Request::CreateTenant { id: id.into() }) {
        Reply::Tenant { tenant, .. } => tenant,
        other => panic!("create tenant {id}: {other:?}"),
    }
}

/// A tenant's function or pool directories in every hierarchy: `<root>/tenants/<t>/<fn>`.
fn tenant_cgroups(tenant: &str, name: &str) -> Vec<std::path::PathBuf> {
    zygo_cgroup_roots()
        .into_iter()
        .map(|r| r.join("tenants").join(tenant).join(name))
        .collect()
}

/// Serve a layer for a tenant (an operator acting for it): it must be served.
fn serve_for(
    api: &mut Api,
    op: &str,
    tenant: &str,
    name: &str,
    kind: ServeKind,
    layer: &str,
    base: Option<&str>,
) {
    let r = api.ask(
        tok_for(op, tenant),
        Request::ServeLayer {
            name: name.into(),
            kind,
            layer: zygo_tests::api::layer(layer),
            base_dir: base.map(str::to_string),
        },
    );
    assert!(
        matches!(&r, Reply::ServedOne { name: n, kind: k } if n == name && *k == kind),
        "serve {name} for {tenant}: {r:?}"
    );
}

/// The digest a tenant (or the operator) gets for a script put through the API.
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

fn answer(r: Reply, what: &str) -> proto::front::ExecAnswer {
    match r {
        Reply::Answer(a) => a,
        other => panic!("{what}: expected an answer, got {other:?}"),
    }
}

fn listed(r: &Reply) -> Vec<String> {
    match r {
        Reply::Functions(fs) => {
            let mut v: Vec<String> = fs.iter().map(|f| f.name.clone()).collect();
            v.sort();
            v
        }
        other => panic!("expected a listing, got {other:?}"),
    }
}

/// Drain through the API (as an operator token) and wait for the supervisor to be gone.
fn drain_over_api(mut s: Sup, op: &str) {
    let mut api = Api::plain(&s);
    let r = api.ask(tok(op), Request::Drain { grace_ms: 1000 });
    assert!(
        matches!(r, Reply::Drained { .. }),
        "drain: {r:?}\n{}",
        s.log()
    );
    s.wait_gone();
}

// ---------------------------------------------------------------------------------------
// The deploy gate.

/// Every row of the gate, end to end: for each request the API may carry, which of the
/// four callers is refused (403 `forbidden`) and which gets through to the handler (whose
/// answer, for the harmless requests used here, is anything but `forbidden`).
#[test]
fn every_gate_row_for_every_caller() {
    let Some(mut s) = SUITE.root("gate") else {
        return;
    };
    let names = start(&mut s, &[("echo", "echo", "")]);
    let echo = &names[0];
    let (_, op) = mint(&s, None);
    let t = tenant_id("g");
    let mut opc = Api::plain(&s);
    create_tenant(&mut opc, &op, &t);
    let (_, tenant_tok) = mint(&s, Some(&t));
    let deploy = FrontFlags {
        allow_deploy: true,
        ..Default::default()
    };
    let zero = "0".repeat(64);
    // (request, operator, bootstrap --allow-deploy, bootstrap, tenant): true = allowed.
    let rows: Vec<(Request, [bool; 4])> = vec![
        (Request::Health, [true; 4]),
        (Request::Version, [true; 4]),
        (Request::List, [true; 4]),
        (exec(echo, "1"), [true; 4]),
        (
            Request::Logs {
                name: echo.clone(),
                n: 5,
            },
            [true; 4],
        ),
        (Request::Stats { name: None }, [true; 4]),
        (
            Request::Warm {
                name: echo.clone(),
                n: 1,
            },
            // A host function's warmth is the operator's setting.
            [true, true, true, false],
        ),
        (
            Request::PutScript {
                source: b"def handler(e):\n    return 1\n".to_vec(),
            },
            [true; 4],
        ),
        (
            Request::ScriptInfo {
                digest: zero.clone(),
            },
            [true; 4],
        ),
        (Request::Cancel { key: "k".into() }, [true; 4]),
        (Request::GetTenant { id: t.clone() }, [true; 4]),
        (
            Request::CreateTenant { id: t.clone() },
            [true, true, true, false],
        ),
        (Request::ListTenants, [true, true, true, false]),
        (
            Request::ServeLayer {
                name: "gated".into(),
                kind: ServeKind::Function,
                layer: Box::default(),
                base_dir: None,
            },
            [true, true, false, false],
        ),
        (
            Request::Stop {
                name: "nosuch".into(),
            },
            [true, true, false, false],
        ),
        (
            Request::Run {
                spec: zygo_tests::api::run_body(&serde_json::json!({"cmd": ["true"]})),
            },
            [true, true, false, false],
        ),
        (
            Request::DeleteScript {
                digest: zero.clone(),
            },
            [true, true, false, false],
        ),
        (
            Request::DeleteTenant {
                id: "nosuch".into(),
            },
            [true, true, false, false],
        ),
        (
            Request::SetLimits {
                id: "nosuch".into(),
                limits: LimitsPatch::default(),
            },
            [true, true, false, false],
        ),
        (
            Request::MintToken {
                tenant: Some("nosuch".into()),
            },
            [true, true, false, false],
        ),
        (Request::ListTokens, [true, true, false, false]),
        (
            Request::RevokeToken {
                id: "tok_0000000000000000".into(),
            },
            [true, true, false, false],
        ),
        (
            Request::Drain { grace_ms: 1000 },
            [true, true, false, false],
        ),
    ];
    let mut boot_deploy = Api::open(&s, deploy);
    let mut boot = Api::plain(&s);
    let mut tenant = Api::plain(&s);
    for (req, allowed) in rows {
        let callers: [(&str, &mut Api, &str); 4] = [
            ("operator token", &mut opc, op.as_str()),
            ("bootstrap --allow-deploy", &mut boot_deploy, BOOT),
            ("bootstrap", &mut boot, BOOT),
            ("tenant token", &mut tenant, tenant_tok.as_str()),
        ];
        for ((who, conn, token), allow) in callers.into_iter().zip(allowed) {
            // Draining for real is left to the end.
            if matches!(req, Request::Drain { .. }) && allow {
                continue;
            }
            let r = conn.ask(tok(token), req.clone());
            let forbidden = code(&r) == Some(ErrorCode::Forbidden);
            assert_eq!(
                forbidden,
                !allow,
                "{req:?} as the {who}: {r:?}\n{}",
                s.log()
            );
            if forbidden {
                let m = message(&r);
                let says = if who == "tenant token" {
                    m.contains("tenant token is for")
                } else {
                    m.contains("--allow-deploy")
                };
                assert!(says, "the refusal says what to do: {m}");
            }
        }
    }
    // A deploy caller gets `private_net` in the version; others do not see it.
    match opc.ask(tok(&op), Request::Version) {
        Reply::Version(v) => assert_eq!(v.private_net, Some(false)),
        other => panic!("{other:?}"),
    }
    match tenant.ask(tok(&tenant_tok), Request::Version) {
        Reply::Version(v) => assert_eq!(v.private_net, None),
        other => panic!("{other:?}"),
    }
    drain_over_api(s, &op);
}

/// Host networking and unlimited limits are refused over the API whoever asks; a private
/// address in `allow` only without `--allow-deploy --allow-private-net`.
#[test]
fn what_stays_off_for_everybody() {
    let Some(mut s) = SUITE.root("off") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let layer = |extra: &str| zygo_tests::api::layer(&format!("{{\"agent\":\"python\",{extra}}}"));
    for extra in [
        "\"network\":\"host\"",
        "\"mem\":\"unlimited\"",
        "\"network\":\"egress\",\"allow\":[\"10.0.0.5:4010\"]",
        "\"network\":\"egress\",\"allow\":[\"[fe80::1]:80\"]",
    ] {
        let r = api.ask(
            tok(&op),
            Request::ServeLayer {
                name: "off".into(),
                kind: ServeKind::Pool,
                layer: layer(extra),
                base_dir: None,
            },
        );
        expect_code(&r, ErrorCode::BadSpec, extra);
    }
    // With both flags, the private address is no longer the reason (egress itself is not
    // available in this version, which says so).
    let both = FrontFlags {
        allow_deploy: true,
        allow_private_net: true,
        no_auth: false,
    };
    let mut api2 = Api::open(&s, both);
    let r = api2.ask(
        tok(BOOT),
        Request::ServeLayer {
            name: "off".into(),
            kind: ServeKind::Pool,
            layer: layer("\"network\":\"egress\",\"allow\":[\"10.0.0.5:4010\"]"),
            base_dir: None,
        },
    );
    assert!(!message(&r).contains("private"), "{r:?}");
    // Still refused for unlimited, with both flags.
    let r = api2.ask(
        tok(BOOT),
        Request::ServeLayer {
            name: "off".into(),
            kind: ServeKind::Pool,
            layer: layer("\"mem\":\"unlimited\""),
            base_dir: None,
        },
    );
    expect_code(&r, ErrorCode::BadSpec, "unlimited with both flags");
    drain_over_api(s, &op);
}

// ---------------------------------------------------------------------------------------
// Tokens and the tenant header.

fn tokens_mint_use_revoke(who: Who) {
    let mut s = SUITE.sup(who, "tokens");
    start::<(&str, &str)>(&mut s, &[]);
    let f = s.run(&["token", "--help"]);
    assert!(
        f.code == 0 && f.stdout_text().contains("zygo token mint [--tenant T]"),
        "{}",
        f.stdout_text()
    );
    let f = s.run(&["token", "frob", "--json"]);
    assert_eq!(f.code, 2, "a usage error: {}", f.stdout_text());
    // Human output: the secret alone on stdout.
    let f = s.run(&["token", "mint"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let secret = f.stdout_text().trim().to_string();
    assert!(
        secret.starts_with("zygo_") && secret.len() == 69,
        "{secret}"
    );
    assert!(
        f.stderr_text().contains("shown this once"),
        "{}",
        f.stderr_text()
    );
    let (op_id, op) = mint(&s, None);
    assert!(
        op.starts_with("zygo_") && op.len() == 69 && is_hex(&op[5..], 64),
        "{op}"
    );
    assert!(
        op_id.starts_with("tok_") && is_hex(&op_id[4..], 16),
        "{op_id}"
    );
    let mut api = Api::plain(&s);
    let t = tenant_id("k");
    create_tenant(&mut api, &op, &t);
    let (tid, tt) = mint(&s, Some(&t));
    expect_ok(&api.ask(tok(&tt), Request::List), "a tenant token lists");
    // Only hashes are stored.
    let stored = fs::read_to_string(s.st.join(format!("api/tokens/{tid}.json"))).expect("record");
    assert!(
        !stored.contains(&tt[5..]),
        "the secret is not stored: {stored}"
    );
    // Revoked from the host: the next request is 401, the record stays, marked.
    let f = s.run(&["token", "revoke", &tid, "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    expect_code(
        &api.ask(tok(&tt), Request::List),
        ErrorCode::Unauthorized,
        "revoked",
    );
    let f = s.run(&["token", "ls", "--json"]);
    let listed = f.last_json();
    let rec = listed
        .as_array()
        .and_then(|a| a.iter().find(|x| x["id"] == tid.as_str()).cloned())
        .unwrap_or_else(|| panic!("{tid} is listed: {listed}"));
    assert!(rec["revoked_ms"].as_u64().is_some(), "{rec}");
    // Unknown, missing, oversized and empty tokens.
    for bad in [
        "zygo_".to_string() + &"0".repeat(64),
        "x".repeat(1 << 20),
        String::new(),
    ] {
        expect_code(
            &api.ask(tok(&bad), Request::List),
            ErrorCode::Unauthorized,
            "a bad token",
        );
    }
    let none = As {
        token: None,
        tenant: None,
    };
    expect_code(
        &api.ask(none, Request::List),
        ErrorCode::Unauthorized,
        "no token",
    );
    // `--no-auth`: no token acts as the bootstrap operator (no deploy rights without
    // --allow-deploy); a token sent is still checked.
    let mut open = Api::open(
        &s,
        FrontFlags {
            no_auth: true,
            ..Default::default()
        },
    );
    expect_ok(
        &open.ask(none, Request::ListTenants),
        "no-auth lists tenants",
    );
    expect_code(
        &open.ask(none, Request::ListTokens),
        ErrorCode::Forbidden,
        "no-auth, no deploy",
    );
    expect_code(
        &open.ask(tok(&tt), Request::List),
        ErrorCode::Unauthorized,
        "no-auth checks a token sent",
    );
    // The connection still serves after all of that.
    expect_ok(&api.ask(tok(&op), Request::Version), "still served");
    drain_over_api(s, &op);
}

#[test]
fn tenant_header_rules() {
    let Some(mut s) = SUITE.root("header") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let a = tenant_id("a");
    let b = tenant_id("b");
    create_tenant(&mut api, &op, &a);
    create_tenant(&mut api, &op, &b);
    let (_, at) = mint(&s, Some(&a));
    // A tenant token naming another tenant: 403; naming itself: fine.
    expect_code(
        &api.ask(tok_for(&at, &b), Request::List),
        ErrorCode::Forbidden,
        "other tenant",
    );
    expect_ok(&api.ask(tok_for(&at, &a), Request::List), "its own tenant");
    // An operator acting for a tenant that does not exist: 404; a malformed header: 400.
    expect_code(
        &api.ask(tok_for(&op, "nosuch-tenant"), Request::List),
        ErrorCode::NotFound,
        "unknown tenant",
    );
    for bad in ["A", "a/b", "../x", "a\u{0}b", "é"] {
        expect_code(
            &api.ask(tok_for(&op, bad), Request::List),
            ErrorCode::BadRequest,
            bad,
        );
    }
    // A tenant reads its own record and no other (as if it did not exist).
    expect_ok(
        &api.ask(tok(&at), Request::GetTenant { id: a.clone() }),
        "own record",
    );
    expect_code(
        &api.ask(tok(&at), Request::GetTenant { id: b.clone() }),
        ErrorCode::NotFound,
        "another's record",
    );
    // Creating is idempotent.
    match api.ask(tok(&op), Request::CreateTenant { id: a.clone() }) {
        Reply::Tenant { created, .. } => assert!(!created),
        other => panic!("{other:?}"),
    }
    drain_over_api(s, &op);
}

// ---------------------------------------------------------------------------------------
// Two tenants.

fn two_tenants_never_cross(who: Who) {
    let mut s = SUITE.sup(who, "iso");
    let names = start(&mut s, &[("echo", "echo", ""), ("slow", "slow", "")]);
    let (echo, slow) = (&names[0], &names[1]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let a = tenant_id("a");
    let b = tenant_id("b");
    create_tenant(&mut api, &op, &a);
    create_tenant(&mut api, &op, &b);
    let (_, at) = mint(&s, Some(&a));
    let (_, bt) = mint(&s, Some(&b));
    // a's own function and pool, served for it by the operator.
    let fndir = s.dir.path.join("fn");
    let base = fndir.to_str().expect("UTF-8");
    serve_for(
        &mut api,
        &op,
        &a,
        "mine",
        ServeKind::Function,
        "{\"agent\":\"python\",\"entry\":\"handlers.py:echo\",\"mem\":\"64M\"}",
        Some(base),
    );
    serve_for(
        &mut api,
        &op,
        &a,
        "apool",
        ServeKind::Pool,
        "{\"agent\":\"python\",\"mem\":\"64M\"}",
        None,
    );
    // Listings: a sees its own (by plain name) and the host's; b only the host's.
    let mut want_a = vec![
        "apool".to_string(),
        "mine".to_string(),
        echo.clone(),
        slow.clone(),
    ];
    want_a.sort();
    let mut want_b = vec![echo.clone(), slow.clone()];
    want_b.sort();
    assert_eq!(listed(&api.ask(tok(&at), Request::List)), want_a);
    assert_eq!(listed(&api.ask(tok(&bt), Request::List)), want_b);
    // a's function answers a; to b it does not exist.
    let r = answer(api.ask(tok(&at), exec("mine", "7")), "a calls its own");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let r_b = api.ask(tok(&bt), exec("mine", "7"));
    let r_none = api.ask(tok(&bt), exec("nosuchfn", "7"));
    expect_code(&r_b, ErrorCode::NotFound, "b calls a's function");
    assert_eq!(
        message(&r_b).replace("mine", "X"),
        message(&r_none).replace("nosuchfn", "X")
    );
    for req in [
        Request::Stop {
            name: "mine".into(),
        },
        Request::Logs {
            name: "mine".into(),
            n: 5,
        },
        Request::Stats {
            name: Some("mine".into()),
        },
        Request::Warm {
            name: "mine".into(),
            n: 1,
        },
    ] {
        let who_b = if matches!(req, Request::Stop { .. }) {
            &op
        } else {
            &bt
        };
        let as_b = if matches!(req, Request::Stop { .. }) {
            tok_for(who_b, &b)
        } else {
            tok(who_b)
        };
        expect_code(
            &api.ask(as_b, req.clone()),
            ErrorCode::NotFound,
            &format!("{req:?} as b"),
        );
    }
    // Its cgroups are under tenants/<a>/mine.
    assert!(
        tenant_cgroups(&a, "mine").iter().any(|d| d.is_dir()),
        "no cgroup under tenants/{a}/mine in {:?}",
        zygo_cgroup_roots()
    );
    // Digests: a's script is a's; b naming it is told exactly what an unknown digest gets.
    let d = put_script(
        &mut api,
        tok(&at),
        "def handler(event):\n    return event\n",
    );
    let r = answer(
        api.ask(tok(&at), run_script("apool", &d, "5")),
        "a runs its script",
    );
    assert_eq!(r.result.as_deref(), Some("5"), "{r:?}");
    let unknown = "1".repeat(64);
    let theirs = api.ask(tok(&bt), Request::ScriptInfo { digest: d.clone() });
    let none = api.ask(
        tok(&bt),
        Request::ScriptInfo {
            digest: unknown.clone(),
        },
    );
    expect_code(&theirs, ErrorCode::NotFound, "b looks up a's digest");
    assert_eq!(
        message(&theirs).replace(&d, "D"),
        message(&none).replace(&unknown, "D")
    );
    assert!(matches!(
        api.ask(tok(&at), Request::ScriptInfo { digest: d.clone() }),
        Reply::ScriptHeld { .. }
    ));
    // b registers a pool of its own and names a's digest there: not found either.
    serve_for(
        &mut api,
        &op,
        &b,
        "bpool",
        ServeKind::Pool,
        "{\"agent\":\"python\",\"mem\":\"64M\"}",
        None,
    );
    let r = api.ask(tok(&bt), run_script("bpool", &d, "5"));
    expect_code(&r, ErrorCode::NotFound, "b runs a's digest");
    // Logs and stats of a host function: each tenant reads its own calls only.
    for _ in 0..2 {
        answer(api.ask(tok(&at), exec(echo, "\"from-a\"")), "a calls echo");
    }
    answer(api.ask(tok(&bt), exec(echo, "\"from-b\"")), "b calls echo");
    let logs = |api: &mut Api, t: &str| match api.ask(
        tok(t),
        Request::Logs {
            name: echo.clone(),
            n: 100,
        },
    ) {
        Reply::Logs { entries, .. } => entries,
        other => panic!("{other:?}"),
    };
    let la = logs(&mut api, &at);
    let lb = logs(&mut api, &bt);
    assert_eq!((la.len(), lb.len()), (2, 1), "a: {la:?}\nb: {lb:?}");
    assert!(lb[0].stdout.is_empty() && la.iter().all(|e| e.request_id != lb[0].request_id));
    let stats = |api: &mut Api, t: &str| match api.ask(
        tok(t),
        Request::Stats {
            name: Some(echo.clone()),
        },
    ) {
        Reply::Stats(st) => st[0].requests,
        other => panic!("{other:?}"),
    };
    assert_eq!((stats(&mut api, &at), stats(&mut api, &bt)), (2, 1));
    // Cancels: b cannot cancel a's request under a's key; a can, and a's caller gets
    // `cancelled`.
    let sock = s.socket();
    let at2 = at.clone();
    let slow2 = slow.clone();
    let call = std::thread::spawn(move || {
        let mut c = UnixStream::connect(sock).expect("connect");
        c.write_all(
            &encode_frame(&Hello {
                protocol: FRONT_PROTOCOL,
                role: Role::Api,
                flags: FrontFlags::default(),
            })
            .expect("hello"),
        )
        .expect("hello");
        let _: HelloReply = read_frame(&mut c, MAX_FRONT_FRAME).expect("welcome");
        let mut api = Api { s: c };
        let mut e = ExecRequest {
            name: slow2,
            event: "{\"s\": 15}".into(),
            key: Some("job-1".into()),
            timeout_ms: None,
            stream: false,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        };
        e.key = Some("job-1".into());
        api.ask(tok(&at2), Request::Exec(e))
    });
    wait_for(Duration::from_secs(10), "a's call in flight", || match api
        .ask(tok(&at), Request::List)
    {
        Reply::Functions(fs) => fs.iter().any(|f| f.name == *slow && f.in_flight == 1),
        _ => false,
    });
    // It runs in a cgroup of a's: tenants/<a>/@<slow>/r-…, holding the handler.
    let mine: Vec<std::path::PathBuf> = tenant_cgroups(&a, &format!("@{slow}"))
        .iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("r-"))
        })
        .collect();
    assert!(
        mine.iter().any(|d| fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())),
        "no process in a cgroup under tenants/{a}/@{slow}: {mine:?}"
    );
    // b does not even see it in flight.
    match api.ask(tok(&bt), Request::List) {
        Reply::Functions(fs) => assert!(fs.iter().all(|f| f.in_flight == 0), "{fs:?}"),
        other => panic!("{other:?}"),
    }
    expect_code(
        &api.ask(
            tok(&bt),
            Request::Cancel {
                key: "job-1".into(),
            },
        ),
        ErrorCode::NotFound,
        "b cancels a's key",
    );
    match api.ask(
        tok(&at),
        Request::Cancel {
            key: "job-1".into(),
        },
    ) {
        Reply::Cancelled { count } => assert_eq!(count, 1),
        other => panic!("a cancels its own: {other:?}"),
    }
    let victim = answer(
        call.join().expect("the call's thread"),
        "the cancelled call",
    );
    assert_eq!(victim.outcome, Outcome::Cancelled, "{victim:?}");
    // The usage log names the tenant of each request.
    wait_for(
        Duration::from_secs(10),
        "a's requests in the usage log",
        || {
            let log = fs::read_to_string(s.st.join("usage.log")).unwrap_or_default();
            let tenants: Vec<String> = log
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["request_id"] == victim.request_id.as_str())
                .map(|v| v["tenant"].as_str().unwrap_or("").to_string())
                .collect();
            tenants == vec![a.clone()]
        },
    );
    drain_over_api(s, &op);
    for d in tenant_cgroups(&a, "mine")
        .into_iter()
        .chain(tenant_cgroups(&b, "bpool"))
    {
        assert!(!d.exists(), "{} is left after the drain", d.display());
    }
}

root_and_rootless!(
    tokens_mint_use_revoke,
    two_tenants_never_cross,
    tenant_held_to_64m_in_a_512m_pool
);

/// Deleting a tenant stops its functions and pools, removes the scripts nobody else
/// registered (and keeps the ones somebody did), revokes its tokens, and says so.
#[test]
fn delete_tenant_answers_what_it_took() {
    let Some(mut s) = SUITE.root("del") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let t = tenant_id("d");
    create_tenant(&mut api, &op, &t);
    let (_, tt) = mint(&s, Some(&t));
    serve_for(
        &mut api,
        &op,
        &t,
        "tpool",
        ServeKind::Pool,
        "{\"agent\":\"python\",\"mem\":\"64M\"}",
        None,
    );
    let only_theirs = put_script(
        &mut api,
        tok(&tt),
        "def handler(e):\n    return 'only theirs'\n",
    );
    // The same bytes from the host first: the host's too.
    let shared_src = "def handler(e):\n    return 'shared'\n";
    let shared = put_script(&mut api, tok(&op), shared_src);
    assert_eq!(put_script(&mut api, tok(&tt), shared_src), shared);
    assert!(tenant_cgroups(&t, "tpool").iter().any(|d| d.is_dir()));
    // A one-shot run of theirs is going when the tenant is deleted.
    let sock = s.socket();
    let (op2, t2) = (op.clone(), t.clone());
    let run = std::thread::spawn(move || {
        let mut c = UnixStream::connect(sock).expect("connect");
        let hello = Hello {
            protocol: FRONT_PROTOCOL,
            role: Role::Api,
            flags: FrontFlags::default(),
        };
        c.write_all(&encode_frame(&hello).expect("hello"))
            .expect("hello");
        let _: HelloReply = read_frame(&mut c, MAX_FRONT_FRAME).expect("welcome");
        let mut api = Api { s: c };
        let spec = "{\"cmd\": [\"sleep\", \"60\"], \"timeout\": \"90s\"}";
        api.ask(
            tok_for(&op2, &t2),
            Request::Run {
                spec: zygo_tests::api::run_body(
                    &serde_json::from_str(spec).expect("the spec is JSON"),
                ),
            },
        )
    });
    wait_for(Duration::from_secs(10), "the run to start", || {
        tenant_cgroups(&t, "_run")
            .iter()
            .any(|d| fs::read_dir(d).is_ok_and(|mut e| e.next().is_some()))
    });
    let r = api.ask(tok(&op), Request::DeleteTenant { id: t.clone() });
    let Reply::TenantDeleted(d) = r else {
        panic!("delete: {r:?}\n{}", s.log());
    };
    assert_eq!(d.id, t);
    assert_eq!(d.stopped, vec!["tpool".to_string()]);
    assert_eq!(d.scripts_removed, vec![only_theirs.clone()]);
    assert_eq!(d.tokens_revoked, 1);
    match run.join().expect("the run's thread") {
        Reply::RunAnswer(a) => assert!(
            a.error.as_deref().is_some_and(|e| e.contains("cancel")),
            "the tenant's run ends cancelled: {a:?}"
        ),
        other => panic!("the run: {other:?}"),
    }
    assert!(!s.st.join("scripts").join(&only_theirs).exists());
    assert!(s.st.join("scripts").join(&shared).exists());
    expect_code(
        &api.ask(tok(&tt), Request::List),
        ErrorCode::Unauthorized,
        "its token",
    );
    expect_code(
        &api.ask(tok(&op), Request::GetTenant { id: t.clone() }),
        ErrorCode::NotFound,
        "gone",
    );
    wait_for(Duration::from_secs(10), "its cgroups to go", || {
        tenant_cgroups(&t, "tpool").iter().all(|d| !d.exists())
    });
    drain_over_api(s, &op);
}

// ---------------------------------------------------------------------------------------
// Limits.

fn tenant_held_to_64m_in_a_512m_pool(who: Who) {
    let mut s = SUITE.sup(who, "oom");
    let names = start(
        &mut s,
        &[(
            "big",
            "agent = \"python\"\nmem = \"512M\"\ntimeout = \"30s\"",
        )],
    );
    let big = &names[0];
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let t = tenant_id("o");
    create_tenant(&mut api, &op, &t);
    let (_, tt) = mint(&s, Some(&t));
    // Above every ceiling the tenant can reach: 422 naming the key, nothing stored.
    let r = api.ask(
        tok(&op),
        Request::SetLimits {
            id: t.clone(),
            limits: LimitsPatch {
                mem_bytes: Some(Some(1 << 30)),
                ..LimitsPatch::default()
            },
        },
    );
    expect_code(&r, ErrorCode::AboveCeiling, "mem above every ceiling");
    assert!(message(&r).starts_with("mem "), "{}", message(&r));
    let r = api.ask(
        tok(&op),
        Request::SetLimits {
            id: t.clone(),
            limits: LimitsPatch {
                pids: Some(Some(100_000)),
                ..LimitsPatch::default()
            },
        },
    );
    assert!(
        matches!(code(&r), Some(ErrorCode::AboveCeiling | ErrorCode::BadSpec)),
        "{r:?}"
    );
    match api.ask(tok(&op), Request::GetTenant { id: t.clone() }) {
        Reply::Tenant { tenant, .. } => assert_eq!(tenant.limits.mem_bytes, None),
        other => panic!("{other:?}"),
    }
    expect_code(
        &api.ask(
            tok(&op),
            Request::SetLimits {
                id: t.clone(),
                limits: LimitsPatch {
                    mem_bytes: Some(Some(0)),
                    ..LimitsPatch::default()
                },
            },
        ),
        ErrorCode::BadSpec,
        "a zero limit",
    );
    // A tenant token may not set limits at all.
    expect_code(
        &api.ask(
            tok(&tt),
            Request::SetLimits {
                id: t.clone(),
                limits: LimitsPatch {
                    mem_bytes: Some(Some(64 << 20)),
                    ..LimitsPatch::default()
                },
            },
        ),
        ErrorCode::Forbidden,
        "a tenant sets its own limits",
    );
    match api.ask(
        tok(&op),
        Request::SetLimits {
            id: t.clone(),
            limits: LimitsPatch {
                mem_bytes: Some(Some(64 << 20)),
                ..LimitsPatch::default()
            },
        },
    ) {
        Reply::Tenant { tenant, .. } => assert_eq!(tenant.limits.mem_bytes, Some(64 << 20)),
        other => panic!("set 64M: {other:?}\n{}", s.log()),
    }
    let d = put_script(&mut api, tok(&tt), ALLOC);
    put_script(&mut api, tok(&op), ALLOC);
    // The host (no tenant) holds 200 MiB in the 512M pool.
    let r = answer(
        api.ask(tok(&op), run_script(big, &d, "{\"mb\": 200}")),
        "the host's call",
    );
    assert_eq!(
        (r.outcome, r.result.as_deref()),
        (Outcome::Ok, Some("200")),
        "{r:?}\n{}",
        s.log()
    );
    // The tenant is OOM-killed at 64M, in the same pool.
    let r = answer(
        api.ask(tok(&tt), run_script(big, &d, "{\"mb\": 200}")),
        "the tenant's call",
    );
    assert!(
        r.oom_killed && r.outcome == Outcome::Error,
        "{r:?}\n{}",
        s.log()
    );
    assert!(
        r.metrics.peak_rss_kb <= 66 * 1024,
        "peak {} KiB",
        r.metrics.peak_rss_kb
    );
    // Within its 64M it runs.
    let r = answer(
        api.ask(tok(&tt), run_script(big, &d, "{\"mb\": 16}")),
        "a small call",
    );
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    // And the host's calls afterwards are not narrowed (the narrowed cgroup was not kept).
    for _ in 0..3 {
        let r = answer(
            api.ask(tok(&op), run_script(big, &d, "{\"mb\": 200}")),
            "the host again",
        );
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    }
    drain_over_api(s, &op);
}

// ---------------------------------------------------------------------------------------
// State that survives a restart.

/// `kill -9` of the supervisor in the middle of a burst of tenant creations and mints:
/// after `zygo up`, everything that was acknowledged is there, and nothing half-written is.
#[test]
fn records_survive_kill_9_in_a_burst() {
    let Some(mut s) = SUITE.root("kill9") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let sock = s.socket();
    let op2 = op.clone();
    let prefix = tenant_id("k");
    let burst = std::thread::spawn(move || {
        let mut acked_tenants = Vec::new();
        let mut acked_tokens = Vec::new();
        let mut acked_limits = Vec::new();
        let Ok(mut c) = UnixStream::connect(sock) else {
            return (acked_tenants, acked_tokens, acked_limits);
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
        let hello = encode_frame(&Hello {
            protocol: FRONT_PROTOCOL,
            role: Role::Api,
            flags: FrontFlags::default(),
        })
        .expect("hello");
        if c.write_all(&hello).is_err()
            || read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME).is_err()
        {
            return (acked_tenants, acked_tokens, acked_limits);
        }
        for i in 0..100_000 {
            let id = format!("{prefix}-{i}");
            let req = envelope(tok(&op2), Request::CreateTenant { id: id.clone() });
            if c.write_all(&encode_frame(&req).expect("encode")).is_err() {
                break;
            }
            match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
                Ok(Reply::Tenant { .. }) => acked_tenants.push(id.clone()),
                _ => break,
            }
            let pids = i % 50 + 1;
            let limits = LimitsPatch {
                pids: Some(Some(pids)),
                ..LimitsPatch::default()
            };
            let req = envelope(
                tok(&op2),
                Request::SetLimits {
                    id: id.clone(),
                    limits,
                },
            );
            if c.write_all(&encode_frame(&req).expect("encode")).is_err() {
                break;
            }
            match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
                Ok(Reply::Tenant { .. }) => acked_limits.push((id.clone(), pids)),
                _ => break,
            }
            let req = envelope(tok(&op2), Request::MintToken { tenant: Some(id) });
            if c.write_all(&encode_frame(&req).expect("encode")).is_err() {
                break;
            }
            match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
                Ok(Reply::TokenMinted(m)) => acked_tokens.push((m.id, m.secret)),
                _ => break,
            }
        }
        (acked_tenants, acked_tokens, acked_limits)
    });
    std::thread::sleep(Duration::from_millis(1500));
    s.kill_supervisor();
    let (tenants, tokens, limits) = burst.join().expect("the burst");
    assert!(
        tenants.len() > 5,
        "the burst made progress before the kill: {}",
        tenants.len()
    );
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    assert_eq!(
        f.code,
        0,
        "zygo up after kill -9: {}\n{}",
        f.stderr_text(),
        s.log()
    );
    s.find_supervisor();
    // Nothing half-written is left (leftover temporary files are removed at start).
    for k in ["tokens", "tenants", "scripts"] {
        for e in fs::read_dir(s.st.join("api").join(k))
            .expect("read the store")
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            assert!(!n.starts_with('.'), "{k}/{n} left");
        }
    }
    let mut api = Api::plain(&s);
    let listed: Vec<TenantInfo> = match api.ask(tok(&op), Request::ListTenants) {
        Reply::Tenants(ts) => ts,
        other => panic!("{other:?}"),
    };
    for t in &tenants {
        assert!(
            listed.iter().any(|x| x.id == *t),
            "acknowledged tenant {t} is gone"
        );
    }
    for (t, pids) in &limits {
        let rec = listed.iter().find(|x| x.id == *t).expect("listed");
        assert_eq!(rec.limits.pids, Some(*pids), "acknowledged limits of {t}");
    }
    for (id, secret) in &tokens {
        let r = api.ask(tok(secret), Request::List);
        expect_ok(&r, &format!("acknowledged token {id}"));
    }
    drain_over_api(s, &op);
}

/// A torn record refuses the supervisor's start, naming its path.
#[test]
fn a_torn_record_refuses_the_start_naming_it() {
    let Some(mut s) = SUITE.root("torn") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let t = tenant_id("t");
    create_tenant(&mut api, &op, &t);
    drop(api);
    let f = s.run(&["drain", "--grace", "1s"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    s.wait_gone();
    let path = s.st.join(format!("api/tenants/{t}.json"));
    let whole = fs::read(&path).expect("the tenant's record");
    fs::write(&path, &whole[..whole.len() / 2]).expect("tear it");
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    let said = format!("{}{}", f.stderr_text(), s.log());
    assert!(f.code != 0, "zygo up started with a torn record: {said}");
    assert!(
        said.contains(path.to_str().expect("UTF-8")),
        "the path is named: {said}"
    );
    assert!(!s.socket().exists());
    // Mended, it starts, and the tenant is there.
    fs::write(&path, &whole).expect("mend it");
    s.supervisor = None;
    start::<(&str, &str)>(&mut s, &[]);
    let mut api = Api::plain(&s);
    expect_ok(
        &api.ask(tok(&op), Request::GetTenant { id: t.clone() }),
        "the tenant is back",
    );
    drain_over_api(s, &op);
}

// ---------------------------------------------------------------------------------------
// Hostile envelopes.

/// What a taken-over front could send: an envelope inside an envelope, CLI-only requests,
/// odd bytes in every name, id and key. Each is refused with its code, and the connection
/// goes on serving; an envelope nested deeper than one level does not even decode (that
/// connection ends, the supervisor serves the others).
#[test]
fn hostile_envelopes_are_refused_and_the_connection_serves() {
    let Some(mut s) = SUITE.root("hostile") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let nested = envelope(tok(&op), Request::List);
    expect_code(
        &api.ask(tok(&op), nested),
        ErrorCode::BadRequest,
        "nested Api",
    );
    for cli_only in [
        Request::ServeAll {
            file: "/etc/passwd".into(),
        },
        Request::Serve {
            name: "x".into(),
            file: "/etc/passwd".into(),
            secrets: Vec::new(),
        },
    ] {
        expect_code(
            &api.ask(tok(&op), cli_only.clone()),
            ErrorCode::BadRequest,
            &format!("{cli_only:?}"),
        );
    }
    let long = "a".repeat(300);
    let odd = [
        "",
        "../../etc",
        "a/b",
        "a\u{0}b",
        "é",
        "A",
        long.as_str(),
        "\n",
    ];
    for o in odd {
        let o = o.to_string();
        let cases = [
            (
                Request::CreateTenant { id: o.clone() },
                vec![ErrorCode::BadRequest],
            ),
            (
                Request::GetTenant { id: o.clone() },
                vec![ErrorCode::NotFound],
            ),
            (
                Request::DeleteTenant { id: o.clone() },
                vec![ErrorCode::NotFound],
            ),
            (
                Request::SetLimits {
                    id: o.clone(),
                    limits: LimitsPatch::default(),
                },
                vec![ErrorCode::NotFound],
            ),
            (
                Request::MintToken {
                    tenant: Some(o.clone()),
                },
                vec![ErrorCode::BadRequest],
            ),
            (
                Request::RevokeToken { id: o.clone() },
                vec![ErrorCode::NotFound],
            ),
            (
                Request::ScriptInfo { digest: o.clone() },
                vec![ErrorCode::BadRequest],
            ),
            (
                Request::DeleteScript { digest: o.clone() },
                vec![ErrorCode::BadRequest],
            ),
            (
                Request::Cancel { key: o.clone() },
                vec![ErrorCode::NotFound, ErrorCode::BadRequest],
            ),
            (
                Request::Stop { name: o.clone() },
                vec![ErrorCode::BadRequest],
            ),
            (
                Request::Logs {
                    name: o.clone(),
                    n: 1,
                },
                vec![ErrorCode::BadRequest],
            ),
            (exec(&o, "1"), vec![ErrorCode::BadRequest]),
            (
                Request::ServeLayer {
                    name: o.clone(),
                    kind: ServeKind::Pool,
                    layer: zygo_tests::api::layer("{\"agent\":\"python\"}"),
                    base_dir: None,
                },
                vec![ErrorCode::BadRequest],
            ),
        ];
        for (req, want) in cases {
            let r = api.ask(tok(&op), req.clone());
            assert!(
                code(&r).is_some_and(|c| want.contains(&c)),
                "{req:?}: expected one of {want:?}, got {r:?}"
            );
        }
    }
    // Nothing of that reached the store's folders as a file name.
    for k in ["tokens", "tenants", "scripts"] {
        assert_eq!(
            fs::read_dir(s.st.join("api").join(k))
                .expect("read")
                .count(),
            usize::from(k == "tokens"),
            "{k}"
        );
    }
    expect_ok(
        &api.ask(tok(&op), Request::Version),
        "the connection still serves",
    );
    // Three envelopes deep: that connection ends, and only it.
    let mut deep = Api::plain(&s);
    deep.send_raw(&envelope(
        tok(&op),
        envelope(tok(&op), envelope(tok(&op), Request::List)),
    ));
    assert!(
        read_frame::<_, Reply>(&mut deep.s, MAX_FRONT_FRAME).is_err(),
        "a deep envelope is not answered"
    );
    expect_ok(
        &api.ask(tok(&op), Request::Version),
        "the others are still served",
    );
    // An envelope from a CLI-role connection ends that connection (the CLI has no envelope).
    drain_over_api(s, &op);
}

/// `/healthz` needs no token and says `stopping` once a drain has begun; `GET /version`
/// answers; a drain over the API answers once the call in flight has finished.
#[test]
fn health_stopping_and_a_drain_over_the_api() {
    let Some(mut s) = SUITE.root("health") else {
        return;
    };
    let names = start(&mut s, &[("slow", "slow", "")]);
    let slow = names[0].clone();
    let (_, op) = mint(&s, None);
    let none = As {
        token: None,
        tenant: None,
    };
    let bogus = "x".repeat(300);
    let mut api = Api::plain(&s);
    for who in [none, tok(&bogus), tok(&op)] {
        match api.ask(who, Request::Health) {
            Reply::Health(h) => assert!(!h.stopping && h.below_min_warm.is_empty(), "{h:?}"),
            other => panic!("health: {other:?}"),
        }
    }
    match api.ask(tok(&op), Request::Version) {
        Reply::Version(v) => {
            assert_eq!((v.api, v.backend.as_str()), (proto::api::API_VERSION, "ns"));
            assert!(v.cgroup == "v1" || v.cgroup == "v2", "{v:?}");
        }
        other => panic!("version: {other:?}"),
    }
    let sock = s.socket();
    let op2 = op.clone();
    let call = std::thread::spawn(move || {
        let mut c = UnixStream::connect(sock).expect("connect");
        let hello = Hello {
            protocol: FRONT_PROTOCOL,
            role: Role::Api,
            flags: FrontFlags::default(),
        };
        c.write_all(&encode_frame(&hello).expect("hello"))
            .expect("hello");
        let _: HelloReply = read_frame(&mut c, MAX_FRONT_FRAME).expect("welcome");
        let mut api = Api { s: c };
        api.ask(tok(&op2), exec(&slow, "{\"s\": 2}"))
    });
    s.wait_in_flight(&names[0], 1);
    let mut drainer = Api::plain(&s);
    drainer.send_raw(&envelope(tok(&op), Request::Drain { grace_ms: 20_000 }));
    wait_for(
        Duration::from_secs(5),
        "health to say stopping",
        || matches!(api.ask(none, Request::Health), Reply::Health(h) if h.stopping),
    );
    // New calls are refused meanwhile.
    let r = api.ask(tok(&op), exec(&names[0], "{\"s\": 0}"));
    expect_code(&r, ErrorCode::Unavailable, "a call while draining");
    let r = answer(call.join().expect("the call"), "the call in flight");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    match drainer.reply() {
        Reply::Drained { finished, cut_off } => assert_eq!((finished, cut_off), (1, 0)),
        other => panic!("drain: {other:?}"),
    }
    s.wait_gone();
}

/// A one-shot run made by an operator acting for a tenant is that tenant's: held to its
/// limits (64M here, whatever the run asks for).
#[test]
fn a_run_for_a_tenant_is_held_to_its_limits() {
    let Some(mut s) = SUITE.root("run") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let t = tenant_id("r");
    create_tenant(&mut api, &op, &t);
    // No function is served, so no ceiling: any value is taken.
    let r = api.ask(
        tok(&op),
        Request::SetLimits {
            id: t.clone(),
            limits: LimitsPatch {
                mem_bytes: Some(Some(64 << 20)),
                ..LimitsPatch::default()
            },
        },
    );
    expect_ok(&r, "set 64M");
    let spec = "{\"cmd\": [\"python3\", \"-c\", \"b = b'x' * (200 << 20); print(len(b))\"], \"mem\": \"512M\", \"timeout\": \"20s\"}";
    let run = |api: &mut Api, who: As| match api.ask(
        who,
        Request::Run {
            spec: zygo_tests::api::run_body(&serde_json::from_str(spec).expect("the spec is JSON")),
        },
    ) {
        Reply::RunAnswer(a) => a,
        other => panic!("run: {other:?}\n{}", s.log()),
    };
    let host = run(&mut api, tok(&op));
    assert!(
        host.exit_code == Some(0) && !host.oom_killed,
        "the host's run: {host:?}"
    );
    let theirs = run(&mut api, tok_for(&op, &t));
    assert!(theirs.oom_killed, "the tenant's run: {theirs:?}");
    drain_over_api(s, &op);
}

/// Layers served over the API: served once ready, the same layer again is the same
/// function, a name taken by the other kind is a conflict, an import that fails is
/// `bad_spec` with its reason, and stopping answers with the name.
#[test]
fn layers_served_over_the_api() {
    let Some(mut s) = SUITE.root("layers") else {
        return;
    };
    start::<(&str, &str)>(&mut s, &[]);
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let base = s.dir.path.join("fn");
    let base = base.to_str().expect("UTF-8").to_string();
    let name = format!("lp{:x}", unique() & 0xff_ffff);
    let serve = |api: &mut Api, kind: ServeKind, layer: &str| {
        api.ask(
            tok(&op),
            Request::ServeLayer {
                name: name.clone(),
                kind,
                layer: zygo_tests::api::layer(layer),
                base_dir: Some(base.clone()),
            },
        )
    };
    let pool = "{\"agent\":\"python\",\"mem\":\"64M\"}";
    for _ in 0..2 {
        let r = serve(&mut api, ServeKind::Pool, pool);
        assert!(
            matches!(
                r,
                Reply::ServedOne {
                    kind: ServeKind::Pool,
                    ..
                }
            ),
            "{r:?}\n{}",
            s.log()
        );
    }
    let r = serve(
        &mut api,
        ServeKind::Function,
        "{\"agent\":\"python\",\"entry\":\"handlers.py:echo\"}",
    );
    expect_code(
        &r,
        ErrorCode::Conflict,
        "a function's layer under a pool's name",
    );
    match api.ask(tok(&op), Request::Stop { name: name.clone() }) {
        Reply::Stopped { name: n } => assert_eq!(n, name),
        other => panic!("stop: {other:?}"),
    }
    // An import that fails: bad_spec, saying why.
    s.fn_file(
        "broken.py",
        "import no_such_module_here\n\ndef handler(event):\n    return 1\n",
    );
    let r = serve(
        &mut api,
        ServeKind::Function,
        "{\"agent\":\"python\",\"entry\":\"broken.py:handler\"}",
    );
    expect_code(&r, ErrorCode::BadSpec, "an import error");
    assert!(message(&r).contains("no_such_module_here"), "{r:?}");
    // Fixed, the same name serves.
    let r = serve(
        &mut api,
        ServeKind::Function,
        "{\"agent\":\"python\",\"entry\":\"handlers.py:echo\"}",
    );
    assert!(
        matches!(
            r,
            Reply::ServedOne {
                kind: ServeKind::Function,
                ..
            }
        ),
        "{r:?}\n{}",
        s.log()
    );
    let a = answer(api.ask(tok(&op), exec(&name, "3")), "the served function");
    assert_eq!(a.result.as_deref(), Some("{\"echo\":3}"), "{a:?}");
    let r = api.ask(tok(&op), Request::Stop { name: name.clone() });
    assert!(matches!(r, Reply::Stopped { .. }), "{r:?}");
    drain_over_api(s, &op);
}

/// A tenant's scratch limit shrinks the `/tmp` and `/work` of its request's child before
/// the request reaches it: 1M in a pool declared with 64M.
fn tenant_scratch_is_narrowed(who: Who) {
    let mut s = SUITE.sup(who, "scratch");
    let names = start(
        &mut s,
        &[(
            "tmpy",
            "agent = \"python\"\nscratch = \"64M\"\nmem = \"256M\"",
        )],
    );
    let pool = &names[0];
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let t = tenant_id("s");
    create_tenant(&mut api, &op, &t);
    let (_, tt) = mint(&s, Some(&t));
    let r = api.ask(
        tok(&op),
        Request::SetLimits {
            id: t.clone(),
            limits: LimitsPatch {
                scratch_bytes: Some(Some(1 << 20)),
                ..LimitsPatch::default()
            },
        },
    );
    expect_ok(&r, "scratch 1M");
    let write = "import os\n\ndef handler(event):\n    out = []\n    for d in ('/tmp', '/work'):\n        try:\n            with open(d + '/f', 'wb') as f:\n                f.write(b'x' * (4 << 20))\n            os.remove(d + '/f')\n            out.append('ok')\n        except OSError as e:\n            out.append(os.strerror(e.errno))\n    return out\n";
    let d = put_script(&mut api, tok(&tt), write);
    put_script(&mut api, tok(&op), write);
    for _ in 0..3 {
        let r = answer(
            api.ask(tok(&op), run_script(pool, &d, "null")),
            "the host's call",
        );
        assert_eq!(
            r.result.as_deref(),
            Some("[\"ok\",\"ok\"]"),
            "{r:?}\n{}",
            s.log()
        );
        let r = answer(
            api.ask(tok(&tt), run_script(pool, &d, "null")),
            "the tenant's call",
        );
        assert_eq!(
            r.result.as_deref(),
            Some("[\"No space left on device\",\"No space left on device\"]"),
            "{r:?}\n{}",
            s.log()
        );
    }
    drain_over_api(s, &op);
}

root_and_rootless!(tenant_scratch_is_narrowed);

/// A tar of one file of `len` bytes named `name`.
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

/// A tenant's workspace goes into its request's narrowed scratch space, after the shrink:
/// one that fits is there when its script runs; one past the tenant's 1M is refused
/// (too_large) before anything runs, while the host's own call takes it in the pool's 64M.
fn a_tenants_workspace_goes_into_its_narrowed_scratch(who: Who) {
    let mut s = SUITE.sup(who, "wsscratch");
    let names = start(
        &mut s,
        &[(
            "wsp",
            "agent = \"python\"\nscratch = \"64M\"\nmem = \"256M\"",
        )],
    );
    let pool = &names[0];
    let (_, op) = mint(&s, None);
    let mut api = Api::plain(&s);
    let t = tenant_id("w");
    create_tenant(&mut api, &op, &t);
    let (_, tt) = mint(&s, Some(&t));
    let r = api.ask(
        tok(&op),
        Request::SetLimits {
            id: t.clone(),
            limits: LimitsPatch {
                scratch_bytes: Some(Some(1 << 20)),
                ..LimitsPatch::default()
            },
        },
    );
    expect_ok(&r, "scratch 1M");
    let list = "import os\n\ndef handler(event):\n    return {n: os.path.getsize(n) for n in os.listdir('.')}\n";
    let d = put_script(&mut api, tok(&tt), list);
    put_script(&mut api, tok(&op), list);
    let call = |tar: Vec<u8>| {
        let Request::Exec(mut e) = run_script(pool, &d, "null") else {
            unreachable!("run_script makes an Exec")
        };
        e.workspace = Some(proto::bytes::Bytes(tar));
        Request::Exec(e)
    };
    let small = one_file_tar("small.bin", 512 * 1024);
    let big = one_file_tar("big.bin", 2 << 20);
    for _ in 0..2 {
        let r = answer(
            api.ask(tok(&tt), call(small.clone())),
            "the tenant's small one",
        );
        assert_eq!(r.result.as_deref(), Some("{\"small.bin\":524288}"), "{r:?}");
        let r = api.ask(tok(&tt), call(big.clone()));
        expect_code(&r, ErrorCode::TooLarge, "the tenant's big one");
        assert!(message(&r).contains("past its cap of 1048576"), "{r:?}");
        let r = answer(api.ask(tok(&op), call(big.clone())), "the host's big one");
        assert_eq!(r.result.as_deref(), Some("{\"big.bin\":2097152}"), "{r:?}");
    }
    drain_over_api(s, &op);
}

root_and_rootless!(a_tenants_workspace_goes_into_its_narrowed_scratch);
