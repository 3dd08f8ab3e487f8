//! `zygo api` in front of a real supervisor: a caller over its share of the channels to
//! the supervisor waits its turn instead of being refused.
//!
//! - eight concurrent calls of one token (a share of four) are all served, four at a time;
//! - a call whose deadline passes while it waits is 429 `busy` with `Retry-After`, saying
//!   it waited, and `/healthz` is answered meanwhile;
//! - a call that waited is sent with what is left of its timeout, so it ends by its
//!   caller's deadline;
//! - a call whose client hangs up while it waits is never sent.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apiqueue-",
    handlers:
        "import time\n\n\ndef slow(event):\n    time.sleep(event[\"s\"])\n    return \"slept\"\n",
    defaults: "timeout = \"30s\"\nmem = \"128M\"\nidle_timeout = \"120s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-api-queue-tests";

use zygo_tests::api::{mint, start_http_front, tenant_id, HttpFront as Front};
use zygo_tests::http::{head, req, Resp};

/// A tenant made over HTTP, and a token for it.
fn tenant(s: &Sup, f: &Front, tag: &str) -> String {
    let t = tenant_id(tag);
    let r = req(
        &f.addr,
        "POST",
        "/tenants",
        Some(BOOT),
        &[],
        &json!({ "id": t }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    mint(s, Some(&t)).1
}

/// Calls of `slow` in flight, as the operator sees them.
fn in_flight(f: &Front, slow: &str) -> u64 {
    let r = req(&f.addr, "GET", "/fn", Some(BOOT), &[], "");
    r.json()["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == slow)
        .and_then(|v| v["in_flight"].as_u64())
        .unwrap_or(0)
}

/// `n` calls of `slow` by `token`, each sleeping `secs`, started at once on threads.
fn calls(
    f: &Front,
    slow: &str,
    token: &str,
    n: usize,
    secs: u64,
) -> Vec<std::thread::JoinHandle<Resp>> {
    (0..n)
        .map(|_| {
            let (addr, path, token) = (f.addr.clone(), format!("/fn/{slow}"), token.to_string());
            std::thread::spawn(move || {
                req(
                    &addr,
                    "POST",
                    &path,
                    Some(&token),
                    &[],
                    &json!({ "s": secs }).to_string(),
                )
            })
        })
        .collect()
}

#[test]
fn eight_concurrent_calls_of_one_token_are_all_served_four_at_a_time() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "eight");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("slow", "slow", "min_warm = 2\nmax_warm = 4")]);
    let slow = &names[0];
    let f = start_http_front(&s, &[]);
    let token = tenant(&s, &f, "eight");
    // Known to the front before the burst (its token checked once).
    let r = req(&f.addr, "GET", "/version", Some(&token), &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    let t0 = Instant::now();
    let answers: Vec<Resp> = calls(&f, slow, &token, 8, 2)
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let took = t0.elapsed();
    for (i, r) in answers.iter().enumerate() {
        assert_eq!(r.status, 200, "call {i}: {}\n{}", r.text(), f.log());
        assert_eq!(r.json()["result"], "slept");
    }
    // Four at a time (the tenant's share of the front's 16 channels): two rounds of 2 s.
    assert!(
        took >= Duration::from_millis(3900),
        "eight 2 s calls took {took:?}: more than four ran at once"
    );
    drop(f);
    s.shutdown();
}

#[test]
fn a_call_whose_deadline_passes_while_it_waits_is_busy_and_one_that_waited_keeps_its_deadline() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "deadline");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("slow", "slow", "min_warm = 2\nmax_warm = 4")]);
    let slow = &names[0];
    let f = start_http_front(&s, &[]);
    let token = tenant(&s, &f, "deadline");
    // The tenant's whole share, held for 8 s.
    let holders = calls(&f, slow, &token, 4, 8);
    wait_for(Duration::from_secs(30), "the four calls to run", || {
        in_flight(&f, slow) >= 4
    });
    let held_since = Instant::now();
    // A call asking for 10 s: it waits its turn (about 8 s), and is then sent with what
    // is left of its 10 s, too little for 8 s of sleep: its deadline holds (504), where
    // the full 10 s would have let it finish.
    let patient = {
        let (addr, path, token) = (f.addr.clone(), format!("/fn/{slow}"), token.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = req(
                &addr,
                "POST",
                &path,
                Some(&token),
                &[("X-Zygo-Timeout-Ms", "10000")],
                r#"{"s": 8}"#,
            );
            (r, t0.elapsed())
        })
    };
    // A call asking for 1 s: the share is not free by then, so 429 with Retry-After,
    // saying it waited.
    let t0 = Instant::now();
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{slow}"),
        Some(&token),
        &[("X-Zygo-Timeout-Ms", "1000")],
        r#"{"s": 0}"#,
    );
    let waited = t0.elapsed();
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["code"], "busy");
    let message = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        message.contains("share") && message.contains("waited"),
        "{message}"
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        waited >= Duration::from_millis(900),
        "answered after {waited:?}"
    );
    assert!(
        held_since.elapsed() < Duration::from_secs(7),
        "the share came free before the wait ended; the test proves nothing"
    );
    // Health never waits for a share.
    let t0 = Instant::now();
    let r = req(&f.addr, "GET", "/healthz", None, &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    for h in holders {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let (r, took) = patient.join().unwrap();
    let v: Value = r.json();
    assert_eq!(r.status, 504, "{}\n{}", r.text(), f.log());
    assert_eq!(v["code"], "timeout", "{v}");
    assert!(took < Duration::from_secs(20), "answered after {took:?}");
    drop(f);
    s.shutdown();
}

/// Calls of `slow` answered so far, as the operator sees them.
fn answered(f: &Front, slow: &str) -> u64 {
    let r = req(
        &f.addr,
        "GET",
        &format!("/fn/{slow}/stats"),
        Some(BOOT),
        &[],
        "",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["requests"].as_u64().unwrap_or(0)
}

#[test]
fn a_call_whose_client_hangs_up_while_it_waits_is_never_sent() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "hangup");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("slow", "slow", "min_warm = 2\nmax_warm = 4")]);
    let slow = &names[0];
    let f = start_http_front(&s, &[]);
    let token = tenant(&s, &f, "hangup");
    let before = answered(&f, slow);
    // The tenant's whole share, held for 3 s.
    let holders = calls(&f, slow, &token, 4, 3);
    wait_for(Duration::from_secs(30), "the four calls to run", || {
        in_flight(&f, slow) >= 4
    });
    // One more call, whose client gives up while it waits for its turn.
    let mut c = TcpStream::connect(&f.addr).unwrap();
    let body = r#"{"s": 0}"#;
    c.write_all(
        head(
            "POST",
            &format!("/fn/{slow}"),
            Some(&token),
            &[],
            body.len(),
        )
        .as_bytes(),
    )
    .unwrap();
    c.write_all(body.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(c);
    for h in holders {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Had it been sent once the share came free, it would have been answered at once.
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(
        answered(&f, slow) - before,
        4,
        "the abandoned call ran\n{}",
        f.log()
    );
    // The caller's share is whole again.
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{slow}"),
        Some(&token),
        &[],
        r#"{"s": 0}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    drop(f);
    s.shutdown();
}

/// A caller whose calls hold its whole share can still cancel them: a cancel takes no
/// share, so it does not wait in line behind the very calls it ends.
#[test]
fn a_caller_at_its_share_cancels_its_calls_at_once() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "cancel");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("slow", "slow", "min_warm = 1\nmax_warm = 4")]);
    let slow = &names[0];
    let f = start_http_front(&s, &[]);
    let token = tenant(&s, &f, "cancel");
    let held: Vec<_> = (0..4)
        .map(|_| {
            let (addr, path, token) = (f.addr.clone(), format!("/fn/{slow}"), token.clone());
            std::thread::spawn(move || {
                req(
                    &addr,
                    "POST",
                    &path,
                    Some(&token),
                    &[("X-Zygo-Request-Key", "all-of-them")],
                    &json!({ "s": 30 }).to_string(),
                )
            })
        })
        .collect();
    let t0 = Instant::now();
    while in_flight(&f, slow) < 4 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the four calls never ran\n{}",
            f.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let asked = Instant::now();
    let r = req(
        &f.addr,
        "DELETE",
        "/requests/all-of-them",
        Some(&token),
        &[],
        "",
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), f.log());
    assert_eq!(r.json()["cancelled"], 4, "{}", r.text());
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "the cancel waited {:?} for a share",
        asked.elapsed()
    );
    for h in held {
        let r = h.join().unwrap();
        assert_eq!(r.status, 499, "{}", r.text());
        assert_eq!(r.json()["code"], "cancelled");
    }
    drop(f);
    s.shutdown();
}
