//! `zygo api` in front of a real supervisor, over real HTTP: what an embedder sees.
//!
//! - a tenant made over HTTP, its token minted on the host, a call as that tenant; what a
//!   tenant token may not do (list tenants, name another tenant), a revoked token refused
//!   from its next request;
//! - the deploy gate as HTTP answers: the bootstrap token without `--allow-deploy` is 403
//!   naming the flag; with it, a function served from a layer, called and stopped;
//! - scripts and a runtime pool: put, held, called by digest and by source;
//! - a streamed call (NDJSON: output lines, then the answer), a batch, a cancel by key
//!   (the victim answers 499).

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apif-",
    handlers: "import sys, time\n\n\ndef echo(event):\n    print(\"to stdout\")\n    sys.stdout.flush()\n    return {\"echo\": event}\n\n\ndef slow(event):\n    time.sleep(event[\"s\"])\n    return \"slept\"\n",
    defaults: "timeout = \"20s\"\nmem = \"64M\"\nidle_timeout = \"60s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-api-front-tests";

use zygo_tests::api::start_http_front as start_api;

use zygo_tests::api::{mint, tenant_id};
use zygo_tests::http::req;

#[test]
fn a_tenant_calls_over_http_and_the_gate_and_tokens_hold() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "tenant");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", ""), ("slow", "slow", "")]);
    let (echo, slow) = (&names[0], &names[1]);
    let f = start_api(&s, &[]);
    let r = req(&f.addr, "GET", "/healthz", None, &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = req(&f.addr, "GET", "/version", Some(BOOT), &[], "");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["api"], 1);
    // A tenant, made by the bootstrap operator; its token minted on the host.
    let t = tenant_id("acme");
    let r = req(
        &f.addr,
        "POST",
        "/tenants",
        Some(BOOT),
        &[],
        &json!({"id": t}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["created"], true);
    let (tid, secret) = mint(&s, Some(&t));
    // It calls a host function.
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{echo}"),
        Some(&secret),
        &[],
        r#"{"a": 1}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["result"], json!({"echo": {"a": 1}}));
    assert_eq!(
        r.headers.get("x-zygo-request-id").map(String::as_str),
        v["request_id"].as_str()
    );
    // What a tenant token may not do.
    let r = req(&f.addr, "GET", "/tenants", Some(&secret), &[], "");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["code"], "forbidden");
    let other = tenant_id("other");
    let r = req(
        &f.addr,
        "GET",
        "/fn",
        Some(&secret),
        &[("X-Zygo-Tenant", &other)],
        "",
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let r = req(
        &f.addr,
        "PUT",
        "/fn/mine",
        Some(&secret),
        &[],
        r#"{"layer": {}}"#,
    );
    assert_eq!(r.status, 403, "{}", r.text());
    // The bootstrap token without --allow-deploy: refused, naming the flag.
    let r = req(
        &f.addr,
        "PUT",
        "/fn/mine",
        Some(BOOT),
        &[],
        r#"{"layer": {}}"#,
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("--allow-deploy"),
        "{}",
        r.text()
    );
    // Streamed: the handler's output line, then the answer.
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{echo}?stream=1"),
        Some(&secret),
        &[],
        "7",
    );
    assert_eq!(r.status, 200);
    let lines: Vec<Value> = r
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["status"], 200, "{lines:?}");
    assert_eq!(last["result"], json!({"echo": 7}));
    // A batch, in order.
    let events: Vec<Value> = (0..20).map(|i| json!(i)).collect();
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{echo}/batch"),
        Some(&secret),
        &[],
        &json!({"events": events}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let res = r.json()["results"].as_array().unwrap().clone();
    for (i, x) in res.iter().enumerate() {
        assert_eq!(x["result"], json!({"echo": i}), "{x}");
    }
    // A cancel by key: the victim answers 499.
    let addr = f.addr.clone();
    let (slow2, secret2) = (slow.clone(), secret.clone());
    let victim = std::thread::spawn(move || {
        let r = req(
            &addr,
            "POST",
            &format!("/fn/{slow2}"),
            Some(&secret2),
            &[("X-Zygo-Request-Key", "job-9")],
            r#"{"s": 15}"#,
        );
        (r.status, r.json())
    });
    s.wait_in_flight(slow, 1);
    let r = req(&f.addr, "DELETE", "/requests/job-9", Some(&secret), &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["cancelled"], 1);
    let (status, v) = victim.join().unwrap();
    assert_eq!(status, 499, "{v}");
    assert_eq!(v["code"], "cancelled");
    // Revoked: refused from the next request on.
    let f2 = s.run(&["token", "revoke", &tid]);
    assert_eq!(f2.code, 0, "{}", f2.stderr_text());
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{echo}"),
        Some(&secret),
        &[],
        "1",
    );
    assert_eq!(r.status, 401, "{}", r.text());
    drop(f);
    s.shutdown();
}

#[test]
fn with_allow_deploy_an_operator_serves_calls_and_stops_over_http() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "deploy");
    s.env("ZYGO_API_TOKEN", BOOT);
    let _ = s.up(&[("echo", "echo", "")]);
    let f = start_api(&s, &["--allow-deploy"]);
    let name = s.name("served");
    let base = s.dir.path.display().to_string();
    let layer =
        json!({"layer": {"agent": "python", "entry": "fn/handlers.py:echo"}, "base_dir": base});
    let r = req(
        &f.addr,
        "PUT",
        &format!("/fn/{name}"),
        Some(BOOT),
        &[],
        &layer.to_string(),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), s.log());
    assert_eq!(r.json()["kind"], "function");
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{name}"),
        Some(BOOT),
        &[],
        r#""hi""#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"], json!({"echo": "hi"}));
    // Host networking is refused whatever the caller.
    let bad = json!({"layer": {"agent": "python", "entry": "fn/handlers.py:echo", "network": "host"}, "base_dir": base});
    let r = req(
        &f.addr,
        "PUT",
        &format!("/fn/{}", s.name("host")),
        Some(BOOT),
        &[],
        &bad.to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["code"], "bad_spec");
    // Scripts and a pool.
    let r = req(
        &f.addr,
        "PUT",
        "/scripts",
        Some(BOOT),
        &[],
        "def handler(event):\n    return event * 2\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let digest = r.json()["sha256"].as_str().unwrap().to_string();
    let r = req(
        &f.addr,
        "GET",
        &format!("/scripts/{digest}"),
        Some(BOOT),
        &[],
        "",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["held"], true);
    let pool = s.name("pool");
    let body = json!({"name": pool, "layer": {"agent": "python"}, "base_dir": base});
    let r = req(
        &f.addr,
        "POST",
        "/runtimes",
        Some(BOOT),
        &[],
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), s.log());
    let r = req(
        &f.addr,
        "POST",
        &format!("/runtimes/{pool}/call"),
        Some(BOOT),
        &[],
        &json!({"script": digest, "event": 21}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"], 42);
    let src = json!({"source": "def handler(event):\n    return event + 1\n", "event": 1});
    let r = req(
        &f.addr,
        "POST",
        &format!("/runtimes/{pool}/call"),
        Some(BOOT),
        &[],
        &src.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"], 2);
    let r = req(&f.addr, "GET", "/runtimes", Some(BOOT), &[], "");
    assert!(r.json()["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == pool.as_str()));
    // A one-shot run: 200 with the program's answer; 408 when the caller's deadline
    // passes first, and the front goes on serving.
    let r = req(
        &f.addr,
        "POST",
        "/run",
        Some(BOOT),
        &[],
        r#"{"cmd": ["/bin/echo", "hi"]}"#,
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), s.log());
    let v = r.json();
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["stdout"], "hi\n");
    assert_eq!(v["started"], true);
    let r = req(
        &f.addr,
        "POST",
        "/run",
        Some(BOOT),
        &[("X-Zygo-Timeout-Ms", "700")],
        r#"{"cmd": ["/bin/sleep", "30"], "timeout": "60s"}"#,
    );
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.json()["code"], "api_timeout");
    let r = req(&f.addr, "GET", "/healthz", None, &[], "");
    assert_eq!(r.status, 200);
    for path in [format!("/runtimes/{pool}"), format!("/fn/{name}")] {
        let r = req(&f.addr, "DELETE", &path, Some(BOOT), &[], "");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    drop(f);
    s.shutdown();
}
