//! `GET /metrics` and usage records, end to end: a real supervisor, `zygo api` in front
//! of it, real HTTP.
//!
//! - the page is scoped by token exactly as `GET /fn` is (a tenant: the API's two unnamed
//!   series and the functions `GET /fn` shows it; an operator: every function), needs a
//!   token, and is valid for `promtool check metrics`;
//! - every call over HTTP leaves one usage record in the supervisor's `usage.log`.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apimet-",
    handlers: "def echo(event):\n    return {\"echo\": event}\n\n\ndef boom(event):\n    raise ValueError(\"boom\")\n",
    defaults: "timeout = \"20s\"\nmem = \"64M\"\nidle_timeout = \"60s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-api-metrics-tests";

use zygo_tests::api::{start_http_front as start_api, HttpFront as Front};

use zygo_tests::api::{mint, tenant_id};
use zygo_tests::http::req;

/// The `function` labels of the page's `zygo_function_requests_total` series.
fn functions_on(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("zygo_function_requests_total{function=\""))
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect()
}

/// The names `GET /fn` shows this token.
fn listed(f: &Front, token: &str) -> BTreeSet<String> {
    let r = req(&f.addr, "GET", "/fn", Some(token), &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

/// What GET /fn lists, a tenant's function as `tenant/name` (as an operator's /metrics
/// names it).
fn listed_keys(f: &Front, token: &str) -> BTreeSet<String> {
    let r = req(&f.addr, "GET", "/fn", Some(token), &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let name = f["name"].as_str().unwrap();
            match f["tenant"].as_str() {
                Some(t) => format!("{t}/{name}"),
                None => name.to_string(),
            }
        })
        .collect()
}

/// The value of one series line (`name{labels}` exactly as written).
fn value(page: &str, series: &str) -> Option<u64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `promtool check metrics` on the page: it must pass. Without promtool the test is
/// skipped (CI installs it; see .ci/run).
fn promtool_passes(page: &str) -> bool {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        skip("promtool is not installed (Debian package prometheus)");
        return false;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- the page:\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

#[test]
fn metrics_are_scoped_by_token_and_valid_for_promtool() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "scope");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", ""), ("boom", "boom", "")]);
    let (echo, boom) = (&names[0], &names[1]);
    let f = start_api(&s, &["--allow-deploy"]);
    // Two tenants, each with a function of its own, served by the operator for it.
    let (a, b) = (tenant_id("ma"), tenant_id("mb"));
    let base = s.dir.path.display().to_string();
    let own = s.name("own");
    for t in [&a, &b] {
        let r = req(
            &f.addr,
            "POST",
            "/tenants",
            Some(BOOT),
            &[],
            &json!({"id": t}).to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let layer =
            json!({"layer": {"agent": "python", "entry": "fn/handlers.py:echo"}, "base_dir": base});
        let r = req(
            &f.addr,
            "PUT",
            &format!("/fn/{own}"),
            Some(BOOT),
            &[("X-Zygo-Tenant", t)],
            &layer.to_string(),
        );
        assert_eq!(r.status, 200, "{}\n{}", r.text(), s.log());
    }
    let ta = mint(&s, Some(&a)).1;
    let tb = mint(&s, Some(&b)).1;
    // a: two calls of its own function, one of the host's echo, one failing boom.
    for _ in 0..2 {
        let r = req(&f.addr, "POST", &format!("/fn/{own}"), Some(&ta), &[], "1");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = req(&f.addr, "POST", &format!("/fn/{echo}"), Some(&ta), &[], "2");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = req(&f.addr, "POST", &format!("/fn/{boom}"), Some(&ta), &[], "3");
    assert_eq!(r.status, 500, "{}", r.text());
    // b: one call of its own.
    let r = req(&f.addr, "POST", &format!("/fn/{own}"), Some(&tb), &[], "4");
    assert_eq!(r.status, 200, "{}", r.text());

    // No token: 401, like every other route that needs one.
    let r = req(&f.addr, "GET", "/metrics", None, &[], "");
    assert_eq!(r.status, 401, "{}", r.text());

    // Tenant a: exactly what GET /fn shows it, and not the process's request and error
    // counts (every caller's traffic: for deploy rights only).
    let r = req(&f.addr, "GET", "/metrics", Some(&ta), &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.headers["content-type"].starts_with("text/plain; version=0.0.4"),
        "{:?}",
        r.headers
    );
    let page = r.text();
    assert_eq!(functions_on(&page), listed(&f, &ta), "{page}");
    assert!(functions_on(&page).contains(&own));
    assert!(
        !page.contains(&b),
        "tenant b's name on tenant a's page:\n{page}"
    );
    // The API's unnamed series are on every page, as the specification has them.
    assert!(page.contains("zygo_api_requests_total"), "{page}");
    assert!(page.contains("zygo_api_errors_total"), "{page}");
    // Counted from a's own calls only.
    let own_l = format!("{{function=\"{own}\",kind=\"function\"}}");
    assert_eq!(
        value(&page, &format!("zygo_function_requests_total{own_l}")),
        Some(2),
        "{page}"
    );
    assert_eq!(
        value(&page, &format!("zygo_function_failures_total{own_l}")),
        Some(0),
        "{page}"
    );
    let boom_l = format!("{{function=\"{boom}\",kind=\"function\"}}");
    assert_eq!(
        value(&page, &format!("zygo_function_requests_total{boom_l}")),
        Some(1),
        "{page}"
    );
    assert_eq!(
        value(&page, &format!("zygo_function_failures_total{boom_l}")),
        Some(1),
        "{page}"
    );
    assert_eq!(
        value(
            &page,
            &format!(
                "zygo_function_state{{function=\"{own}\",kind=\"function\",state=\"serving\"}}"
            )
        ),
        Some(1),
        "{page}"
    );
    assert!(
        value(&page, &format!("zygo_function_rss_bytes{own_l}")).unwrap() > 0,
        "{page}"
    );
    let promtool = promtool_passes(&page);

    // Tenant b: its own function, not a's calls.
    let page_b = req(&f.addr, "GET", "/metrics", Some(&tb), &[], "").text();
    assert_eq!(functions_on(&page_b), listed(&f, &tb), "{page_b}");
    assert_eq!(
        value(&page_b, &format!("zygo_function_requests_total{own_l}")),
        Some(1),
        "{page_b}"
    );
    assert!(!page_b.contains(&a), "{page_b}");

    // The operator: every function on the host, counted from every call; GET /fn shows
    // the same functions, each naming its tenant.
    let page_op = req(&f.addr, "GET", "/metrics", Some(BOOT), &[], "").text();
    let all = functions_on(&page_op);
    assert_eq!(all, listed_keys(&f, BOOT), "{page_op}");
    // An operator token (deploy rights): every function, and the process's counts.
    let deployer = mint(&s, None).1;
    let page_dep = req(&f.addr, "GET", "/metrics", Some(&deployer), &[], "").text();
    assert_eq!(functions_on(&page_dep), all, "{page_dep}");
    assert!(
        value(&page_dep, "zygo_api_requests_total").unwrap() >= 7,
        "{page_dep}"
    );
    assert!(
        value(&page_dep, "zygo_api_errors_total").unwrap() >= 2,
        "{page_dep}"
    );
    // An operator acting for a tenant sees what that tenant sees.
    let page_for_a = req(
        &f.addr,
        "GET",
        "/metrics",
        Some(BOOT),
        &[("X-Zygo-Tenant", &a)],
        "",
    )
    .text();
    assert_eq!(functions_on(&page_for_a), listed(&f, &ta), "{page_for_a}");
    assert!(
        all.contains(&format!("{a}/{own}")) && all.contains(&format!("{b}/{own}")),
        "{page_op}"
    );
    assert!(all.contains(echo) && all.contains(boom), "{page_op}");
    if promtool {
        promtool_passes(&page_op);
    }

    // A name with a quote and a backslash cannot be served, so escaping is tested on the
    // unit side (zygo-front's http::metrics); here: every line parses as a sample.
    for l in page_op.lines().filter(|l| !l.starts_with('#')) {
        let v = l.rsplit(' ').next().unwrap();
        assert!(v.parse::<u64>().is_ok(), "{l}");
    }
    drop(f);
    s.shutdown();
}

#[test]
fn every_call_over_http_leaves_one_usage_record() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "usage");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", "")]);
    let echo = &names[0];
    let f = start_api(&s, &[]);
    let t = tenant_id("mu");
    let r = req(
        &f.addr,
        "POST",
        "/tenants",
        Some(BOOT),
        &[],
        &json!({"id": t}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let tok = mint(&s, Some(&t)).1;
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = req(
            &f.addr,
            "POST",
            &format!("/fn/{echo}"),
            Some(&tok),
            &[],
            &i.to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        ids.push(r.json()["request_id"].as_str().unwrap().to_string());
    }
    // Records are written just after the answers go out.
    let log = s.st.join("usage.log");
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if ids.iter().all(|id| text.contains(id.as_str())) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(f);
    s.shutdown();
    let recs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for id in &ids {
        let mine: Vec<&Value> = recs
            .iter()
            .filter(|r| r["request_id"] == id.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "{id}: {text}");
        let r = mine[0];
        assert_eq!(r["tenant"], t.as_str());
        assert_eq!(r["function"], echo.as_str());
        assert_eq!(r["outcome"], "ok");
        for k in ["script", "wall_ms", "cpu_ms", "peak_rss_kb", "finished_ms"] {
            assert!(r.get(k).is_some(), "{k} missing: {r}");
        }
    }
}

/// `zygo mcp`'s `run_code` runs outside the supervisor; its record still lands in the
/// supervisor's usage log, once.
#[test]
fn mcp_run_code_writes_one_usage_record() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "mcp");
    let _ = s.up(&[("echo", "echo", "")]);
    let log = s.st.join("usage.log");
    let before = std::fs::read_to_string(&log).unwrap_or_default();
    let mut c = s.cmd(&["mcp"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    for line in [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}),
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"sh","code":"echo counted"}}}),
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    stdin.flush().unwrap();
    let mut answer = Value::Null;
    for _ in 0..2 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        answer = serde_json::from_str(&l).unwrap();
    }
    assert_eq!(answer["id"], 2, "{answer}");
    assert!(answer.to_string().contains("counted"), "{answer}");
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "zygo mcp: {status}");
    let mut added = Vec::new();
    for _ in 0..100 {
        let now = std::fs::read_to_string(&log).unwrap_or_default();
        added = now[before.len().min(now.len())..]
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["function"] == "mcp:run_code")
            .collect();
        if !added.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(added.len(), 1, "{added:?}\n{}", s.log());
    let r = &added[0];
    assert_eq!(r["tenant"], "_host");
    assert_eq!(r["outcome"], "ok", "{r}");
    assert!(r["request_id"].as_str().unwrap().starts_with("mcp-"), "{r}");
    assert!(
        r["wall_ms"].as_f64().is_some_and(|w| w > 0.0) && r["finished_ms"].as_u64().unwrap() > 0,
        "{r}"
    );
    s.shutdown();
}

/// What a receiver on loopback was sent: each request's body, in arrival order.
struct Receiver {
    addr: String,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

/// A receiver whose `n`th connection (from 0) is answered as `act(n)` says: `Some(status)`
/// after reading the whole request (and, for `stall`, waiting first), `None` to hang up
/// after reading it without a word.
fn receiver(act: fn(usize) -> (Option<u16>, Duration)) -> Receiver {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let b2 = bodies.clone();
    std::thread::spawn(move || {
        for (n, c) in l.incoming().enumerate() {
            let Ok(c) = c else { return };
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            let mut r = BufReader::new(c);
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let t = line.trim_end();
                if t.is_empty() {
                    break;
                }
                if let Some((k, v)) = t.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_err() {
                continue;
            }
            b2.lock().unwrap().push(body);
            let (status, stall) = act(n);
            std::thread::sleep(stall);
            let mut c = r.into_inner();
            if let Some(s) = status {
                let _ = write!(
                    c,
                    "HTTP/1.1 {s} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        }
    });
    Receiver { addr, bodies }
}

/// The webhook gets every call's record, in order, whole, even though the receiver fails
/// (500, 503), hangs up, and stalls some deliveries; the OTLP endpoint gets the numbers
/// with the per-tenant series.
#[test]
fn the_webhook_delivers_everything_in_order_through_failures_and_otlp_has_the_shape() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "hook");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", ""), ("boom", "boom", "")]);
    let (echo, boom) = (&names[0], &names[1]);
    let hook = receiver(|n| match n {
        0 => (Some(500), Duration::ZERO),
        1 => (None, Duration::ZERO),
        2 => (Some(200), Duration::from_millis(1500)),
        3 => (Some(503), Duration::ZERO),
        5 => (None, Duration::from_millis(300)),
        _ => (Some(200), Duration::ZERO),
    });
    let otlp = receiver(|_| (Some(200), Duration::ZERO));
    let f = start_api(
        &s,
        &[
            "--usage-webhook",
            &format!("http://{}/usage", hook.addr),
            "--otlp-endpoint",
            &format!("http://{}/v1/metrics", otlp.addr),
        ],
    );
    let t = tenant_id("mh");
    let r = req(
        &f.addr,
        "POST",
        "/tenants",
        Some(BOOT),
        &[],
        &json!({"id": t}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let tok = mint(&s, Some(&t)).1;
    let mut ids = Vec::new();
    for i in 0..30 {
        let (name, want) = if i % 10 == 9 {
            (boom, 500)
        } else {
            (echo, 200)
        };
        let r = req(
            &f.addr,
            "POST",
            &format!("/fn/{name}"),
            Some(&tok),
            &[],
            &i.to_string(),
        );
        assert_eq!(r.status, want, "{}", r.text());
        ids.push(r.json()["request_id"].as_str().unwrap().to_string());
        if i % 7 == 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    // Everything arrives (the failed batches come again).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let records = loop {
        let recs: Vec<Value> = hook
            .bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| serde_json::from_slice::<Vec<Value>>(b).unwrap())
            .collect();
        let seen: BTreeSet<&str> = recs
            .iter()
            .filter_map(|r| r["request_id"].as_str())
            .collect();
        if ids.iter().all(|id| seen.contains(id.as_str())) {
            break recs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every record arrived: {} of {}\n{}",
            ids.iter().filter(|id| seen.contains(id.as_str())).count(),
            ids.len(),
            s.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // In order (first arrivals), duplicates only whole.
    let mut first: Vec<String> = Vec::new();
    let mut by_id: HashMap<String, Value> = HashMap::new();
    for r in &records {
        let id = r["request_id"].as_str().unwrap().to_string();
        match by_id.get(&id) {
            Some(earlier) => assert_eq!(earlier, r, "a duplicate that is not whole"),
            None => {
                by_id.insert(id.clone(), r.clone());
                first.push(id);
            }
        }
    }
    let ours: Vec<String> = first.into_iter().filter(|id| ids.contains(id)).collect();
    assert_eq!(
        ours, ids,
        "the records did not arrive in the order of the calls"
    );
    assert!(
        records.len() > ids.len(),
        "the failed deliveries were not sent again"
    );
    for (i, id) in ids.iter().enumerate() {
        let r = &by_id[id];
        assert_eq!(r["tenant"], t.as_str());
        assert_eq!(
            r["outcome"],
            if i % 10 == 9 { "error" } else { "ok" },
            "{r}"
        );
        for k in [
            "function",
            "script",
            "wall_ms",
            "cpu_ms",
            "peak_rss_kb",
            "finished_ms",
        ] {
            assert!(r.get(k).is_some(), "{k} missing: {r}");
        }
    }

    // OTLP: within ~10 s a push carries the tenant's numbers.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let push = loop {
        let last = otlp.bodies.lock().unwrap().last().cloned();
        if let Some(b) = last {
            let v: Value = serde_json::from_slice(&b).unwrap();
            let txt = v.to_string();
            if txt.contains(&t) && txt.contains("\"asInt\":\"30\"") {
                break v;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no OTLP push with the tenant's 30 calls\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let metrics = push["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
        .as_array()
        .unwrap();
    let find = |n: &str| {
        metrics
            .iter()
            .find(|m| m["name"] == n)
            .unwrap_or_else(|| panic!("{n} missing: {push}"))
    };
    for n in [
        "zygo_api_requests_total",
        "zygo_api_errors_total",
        "zygo_function_requests_total",
        "zygo_function_failures_total",
        "zygo_function_rss_bytes",
    ] {
        find(n);
    }
    let point = |n: &str, attrs: &[(&str, &str)]| -> f64 {
        let m = find(n);
        let pts = m["sum"]["dataPoints"]
            .as_array()
            .or(m["gauge"]["dataPoints"].as_array())
            .unwrap();
        let p = pts
            .iter()
            .find(|p| {
                attrs.iter().all(|(k, v)| {
                    p["attributes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|a| a["key"] == *k && a["value"]["stringValue"] == *v)
                })
            })
            .unwrap_or_else(|| panic!("{n} {attrs:?}: {m}"));
        // Counts are integers (as text, OTLP's JSON for an int64); times fractional
        // milliseconds.
        match p["asInt"].as_str() {
            Some(i) => i.parse::<u64>().unwrap() as f64,
            None => p["asDouble"].as_f64().unwrap_or_else(|| panic!("{n}: {p}")),
        }
    };
    assert_eq!(point("zygo_tenant_requests_total", &[("tenant", &t)]), 30.0);
    assert_eq!(
        point(
            "zygo_tenant_outcomes_total",
            &[("tenant", &t), ("outcome", "error")]
        ),
        3.0
    );
    assert_eq!(
        point(
            "zygo_tenant_outcomes_total",
            &[("tenant", &t), ("outcome", "ok")]
        ),
        27.0
    );
    assert!(point("zygo_tenant_wall_ms_total", &[("tenant", &t)]) > 0.0);
    point("zygo_tenant_cpu_ms_total", &[("tenant", &t)]);
    assert_eq!(
        find("zygo_tenant_requests_total")["sum"]["aggregationTemporality"],
        2
    );

    // zygo-delivery, the front's child, is confined: no capabilities, no_new_privs, a
    // seccomp filter, and it holds no descriptor but its pipe and stderr.
    let front = f.child.id();
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|p| {
            let st = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            st.contains("Name:\tzygo-delivery") && st.contains(&format!("PPid:\t{front}\n"))
        })
        .expect("zygo-delivery runs beside the front");
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for want in [
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
    ] {
        assert!(st.contains(want), "{want} missing:\n{st}");
    }
    let fds: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_string()))
        .collect();
    let want: BTreeSet<String> = ["2", "3"].iter().map(|s| s.to_string()).collect();
    assert_eq!(
        fds, want,
        "zygo-delivery holds more than its pipe and stderr"
    );
    drop(f);
    s.shutdown();
}

/// Only the MCP role may hand the supervisor a usage record, and only one shaped as
/// `run_code`'s: the CLI, a wrong function, tenant or outcome are refused, and nothing is
/// written for them.
#[test]
fn a_usage_record_from_outside_is_the_mcp_roles_and_shape_checked() {
    use proto::api::UsageRecord;
    use proto::front::{Hello, HelloReply, Reply, Request, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME};
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "rec");
    let _ = s.up(&[("echo", "echo", "")]);
    let ask = |role: Role, rec: &UsageRecord| -> Option<Reply> {
        let mut c = std::os::unix::net::UnixStream::connect(s.socket()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        proto::write_frame(
            &mut c,
            &Hello {
                protocol: FRONT_PROTOCOL,
                role,
                flags: Default::default(),
            },
        )
        .unwrap();
        match proto::read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME).unwrap() {
            HelloReply::Welcome { .. } => {}
            other => panic!("{other:?}"),
        }
        proto::write_frame(&mut c, &Request::RecordUsage(rec.clone())).unwrap();
        // A request a role may not make ends its connection.
        proto::read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME).ok()
    };
    let good = UsageRecord {
        tenant: "_host".into(),
        function: "mcp:run_code".into(),
        script: None,
        request_id: format!("mcp-test-{:x}", unique()),
        wall_us: 1_500,
        cpu_us: 1_000,
        peak_rss_kb: 1,
        outcome: "ok".into(),
        finished_ms: 1,
    };
    let refused = |r: Option<Reply>| matches!(r, None | Some(Reply::Error { .. }));
    assert!(
        refused(ask(Role::Cli, &good)),
        "the CLI role may not record usage"
    );
    let mut bad = good.clone();
    bad.function = "echo".into();
    bad.request_id = format!("{}-f", good.request_id);
    assert!(refused(ask(Role::Mcp, &bad)));
    let mut bad2 = good.clone();
    bad2.tenant = "acme".into();
    bad2.request_id = format!("{}-t", good.request_id);
    assert!(refused(ask(Role::Mcp, &bad2)));
    let mut bad3 = good.clone();
    bad3.outcome = "fine".into();
    bad3.request_id = format!("{}-o", good.request_id);
    assert!(refused(ask(Role::Mcp, &bad3)));
    assert_eq!(ask(Role::Mcp, &good), Some(Reply::UsageRecorded));
    let log = s.st.join("usage.log");
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains(&good.request_id) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(text.matches(good.request_id.as_str()).count(), 1, "{text}");
    s.shutdown();
}
