//! `zygo api` in front of a real supervisor, attacked: what one caller (with a token, with
//! a wrong one, or with none) may take of the front, and what it may not.
//!
//! - a streamed call whose client never reads (or reads late) costs neither a channel nor
//!   anybody else's calls; its answer says the stream was cut;
//! - unknown tokens and no token are refused before a byte of the body is read, slow
//!   bodies are dropped (408), and while both go on `/healthz` and a known caller are
//!   served;
//! - one caller holding its share of the channels (a batch, concurrent calls) has one more
//!   request wait its turn (429 once its deadline passes), and another caller is served
//!   meanwhile;
//! - a batch's answer is held to its budget, the cut elements marked.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apifair-",
    handlers: "import sys, time\n\n\ndef echo(event):\n    return {\"echo\": event}\n\n\ndef slow(event):\n    time.sleep(event[\"s\"])\n    return \"slept\"\n\n\ndef spew(event):\n    chunk = \"x\" * 65536\n    while True:\n        print(chunk)\n\n\ndef flood(event):\n    chunk = \"x\" * 65536\n    for _ in range(event[\"mib\"] * 16):\n        event.progress(chunk)\n    return \"done\"\n\n\ndef big(event):\n    n = event[\"n\"]\n    sys.stdout.write(\"o\" * n)\n    sys.stdout.flush()\n    sys.stderr.write(\"e\" * n)\n    sys.stderr.flush()\n    return n\n",
    defaults: "timeout = \"20s\"\nmem = \"128M\"\nidle_timeout = \"120s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-api-fair-tests";

use zygo_tests::api::{mint, start_http_front, tenant_id, HttpFront as Front};
use zygo_tests::http::{head, read_resp, req, req_within};

fn start_api(s: &Sup) -> Front {
    start_http_front(s, &[])
}

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

/// A channel the front lost, as its log says it.
fn lost_channels(f: &Front, s: &Sup) -> bool {
    f.log().contains("a channel to the supervisor was closed")
        || s.log().contains("Api front's connection")
}

#[test]
fn a_stream_nobody_reads_costs_no_channel_and_no_other_callers_time() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "stream");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[
        ("echo", "echo", ""),
        ("spew", "spew", "max_warm = 4"),
        ("flood", "flood", ""),
    ]);
    let (echo, spew, flood) = (&names[0], &names[1], &names[2]);
    let f = start_api(&s);
    let other = tenant(&s, &f, "other");
    // More streams than the front has channels (16 to 32), a caller's share (a quarter of
    // them) at a time, each printing without end until its deadline, none of them read.
    let rounds = 9;
    for round in 0..rounds {
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut c = TcpStream::connect(&f.addr).unwrap();
            c.write_all(
                head(
                    "POST",
                    &format!("/fn/{spew}?stream=1"),
                    Some(BOOT),
                    &[("X-Zygo-Timeout-Ms", "3000")],
                    2,
                )
                .as_bytes(),
            )
            .unwrap();
            c.write_all(b"{}").unwrap();
            held.push(c);
        }
        // Meanwhile another caller is answered, well before a connection could be let go
        // for idling (30 s): its connection is read at once, beside the streams'.
        let r = req_within(
            &f.addr,
            "POST",
            &format!("/fn/{echo}"),
            Some(&other),
            &[],
            &json!({ "round": round }).to_string(),
            20,
        );
        assert_eq!(r.status, 200, "round {round}: {}\n{}", r.text(), f.log());
        assert_eq!(r.json()["result"], json!({"echo": {"round": round}}));
        std::thread::sleep(Duration::from_millis(4000));
        assert!(
            !lost_channels(&f, &s),
            "round {round}: a channel was lost\nfront:\n{}\nsupervisor:\n{}",
            f.log(),
            s.log()
        );
        drop(held);
    }
    // A stream read only once its call is over: 32 MiB of progress events, far more than
    // the sockets and the front's queue hold (not output: the launcher relays 1 MiB of
    // each stream, which the sockets may well hold); what was dropped is said in its last
    // line.
    let count = |f: &Front| {
        let r = req(
            &f.addr,
            "GET",
            &format!("/fn/{flood}/stats"),
            Some(BOOT),
            &[],
            "",
        );
        r.json()["requests"].as_u64().unwrap_or(0)
    };
    let before = count(&f);
    let mut c = TcpStream::connect(&f.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let event = r#"{"mib": 32}"#;
    c.write_all(
        head(
            "POST",
            &format!("/fn/{flood}?stream=1"),
            Some(BOOT),
            &[],
            event.len(),
        )
        .as_bytes(),
    )
    .unwrap();
    c.write_all(event.as_bytes()).unwrap();
    wait_for(Duration::from_secs(60), "the flood to be over", || {
        count(&f) > before
    });
    let r = read_resp(&mut BufReader::new(c)).unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["status"], 200, "{}", last["error"]);
    assert_eq!(last["result"], "done");
    assert_eq!(
        last["stream_truncated"],
        true,
        "{} lines came; the last: {}\nfront:\n{}",
        lines.len(),
        serde_json::to_string(&{
            let mut l = last.clone();
            l["stdout"] = json!(l["stdout"].as_str().map(str::len));
            l
        })
        .unwrap_or_default(),
        f.log()
    );
    assert!(lines.len() > 1, "some output came before the cut");
    assert!(
        lines.len() < 32 * 16,
        "{} lines: nothing was dropped",
        lines.len()
    );
    for l in &lines[..lines.len() - 1] {
        assert_eq!(l["stream"], "progress", "{}", l["stream"]);
    }
    // The front kept every channel and goes on serving.
    assert!(!lost_channels(&f, &s), "{}\n{}", f.log(), s.log());
    let r = req(&f.addr, "GET", "/healthz", None, &[], "");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{echo}"),
        Some(&other),
        &[],
        "1",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    drop(f);
    s.shutdown();
}

#[test]
fn unknown_tokens_and_slow_bodies_hold_no_worker() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "slowloris");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", "")]);
    let echo = &names[0];
    let f = start_api(&s);
    let good = tenant(&s, &f, "good");
    let other = tenant(&s, &f, "other");
    let path = format!("/fn/{echo}");
    // A 16 MiB body announced with an unknown token, and with none: 401 with not a byte
    // of the body sent.
    for token in [Some("zygo_aaaa"), None] {
        let mut c = TcpStream::connect(&f.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(head("POST", &path, token, &[], 16 * 1024 * 1024).as_bytes())
            .unwrap();
        let r = read_resp(&mut BufReader::new(c)).unwrap();
        assert_eq!(r.status, 401, "{token:?}: {}", r.text());
        assert_eq!(r.json()["code"], "unauthorized");
    }
    // A known caller trickling bodies from another address: 16 are read at once from one
    // address (the rest are 429 at once), and those are dropped (408) for being too slow.
    let mut trickles = Vec::new();
    for _ in 0..20 {
        let mut c = connect_from(Ipv4Addr::new(127, 0, 0, 3), &f.addr);
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c.write_all(head("POST", &path, Some(&good), &[], 1_000_000).as_bytes())
            .unwrap();
        c.write_all(b"[").unwrap();
        trickles.push(c);
    }
    // Slowloris: more connections than the front has workers, with a wrong token and
    // with none, each announcing a big body and sending a byte of it; kept open.
    let mut attackers = Vec::new();
    for i in 0..80 {
        let token = if i % 2 == 0 { Some("zygo_aaaa") } else { None };
        let mut c = connect_from(Ipv4Addr::new(127, 0, 0, 2), &f.addr);
        c.write_all(head("POST", &path, token, &[], 16_000_000).as_bytes())
            .unwrap();
        c.write_all(b"{").unwrap();
        attackers.push(c);
    }
    // Meanwhile: /healthz, and another known caller's call, answered (the trickling one
    // holds its share of the workers, and is refused one more).
    for _ in 0..3 {
        let r = req(&f.addr, "GET", "/healthz", None, &[], "");
        assert_eq!(r.status, 200, "{}", r.text());
        let r = req(&f.addr, "POST", &path, Some(&other), &[], r#"{"a": 1}"#);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["result"], json!({"echo": {"a": 1}}));
    }
    // Every attacker was answered 401 without its body being read.
    for (i, c) in attackers.into_iter().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let r = read_resp(&mut BufReader::new(c)).unwrap();
        assert_eq!(r.status, 401, "attacker {i}: {}", r.text());
    }
    std::thread::sleep(Duration::from_millis(3000));
    let mut seen = HashMap::new();
    for c in &mut trickles {
        // Another byte, late: the body is too slow now.
        let _ = c.write_all(b"1");
    }
    for c in trickles {
        let r = read_resp(&mut BufReader::new(c)).unwrap();
        *seen.entry(r.status).or_insert(0) += 1;
        if r.status == 429 {
            assert!(r.headers.contains_key("retry-after"));
        }
    }
    assert_eq!(
        seen.get(&408).copied().unwrap_or(0) + seen.get(&429).copied().unwrap_or(0),
        20,
        "{seen:?}"
    );
    assert!(
        seen.get(&429).copied().unwrap_or(0) >= 4,
        "{seen:?}\n{}",
        f.log()
    );
    // Each dropped body is logged: as too slow when its late byte came, as stopped when
    // the late byte came after the idle timeout (a loaded machine).
    let dropped = |l: &str| l.contains("slower than") || l.contains("stopped arriving");
    let log = f.log_once(dropped);
    assert!(dropped(&log), "{log}");
    // Connections from one address are capped (a quarter of all): one more is 503.
    let idle: Vec<TcpStream> = (0..128)
        .map(|_| connect_from(Ipv4Addr::new(127, 0, 0, 4), &f.addr))
        .collect();
    // (It is answered as it is accepted; nothing is sent, which would only race the
    // close.)
    let c = connect_from(Ipv4Addr::new(127, 0, 0, 4), &f.addr);
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let r = read_resp(&mut BufReader::new(c)).unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.headers.contains_key("retry-after"));
    drop(idle);
    let r = req(&f.addr, "POST", &path, Some(&good), &[], "2");
    assert_eq!(r.status, 200, "{}", r.text());
    drop(f);
    s.shutdown();
}

#[test]
fn one_caller_holds_at_most_its_share_of_the_channels() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "share");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", ""), ("slow", "slow", "max_warm = 4")]);
    let (echo, slow) = (names[0].clone(), names[1].clone());
    let f = start_api(&s);
    let greedy = tenant(&s, &f, "greedy");
    let other = tenant(&s, &f, "other");
    // A batch asking for a long deadline holds the greedy tenant's share.
    let batch = {
        let (addr, greedy, slow) = (f.addr.clone(), greedy.clone(), slow.clone());
        std::thread::spawn(move || {
            let events: Vec<Value> = (0..8).map(|_| json!({"s": 3})).collect();
            req(
                &addr,
                "POST",
                &format!("/fn/{slow}/batch"),
                Some(&greedy),
                &[("X-Zygo-Timeout-Ms", "86400000")],
                &json!({ "events": events }).to_string(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(1000));
    // One more call of that tenant waits its turn: asking for half a second, it is 429
    // once that has passed, with Retry-After, saying it waited.
    let t0 = std::time::Instant::now();
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{slow}"),
        Some(&greedy),
        &[("X-Zygo-Timeout-Ms", "500")],
        r#"{"s": 0}"#,
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["code"], "busy");
    let message = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        message.contains("share") && message.contains("waited"),
        "{message}"
    );
    assert_eq!(r.headers.get("retry-after").map(String::as_str), Some("1"));
    assert!(
        t0.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t0.elapsed()
    );
    // Asking for longer, it is served in its turn, between the batch's events.
    let waiter = {
        let (addr, greedy, slow) = (f.addr.clone(), greedy.clone(), slow.clone());
        std::thread::spawn(move || {
            req(
                &addr,
                "POST",
                &format!("/fn/{slow}"),
                Some(&greedy),
                &[],
                r#"{"s": 0}"#,
            )
        })
    };
    // Another tenant is served meanwhile, many times over.
    for i in 0..5 {
        let r = req(
            &f.addr,
            "POST",
            &format!("/fn/{echo}"),
            Some(&other),
            &[],
            &i.to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = waiter.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"], "slept");
    // The batch is whole: its elements waited for their own caller's leases.
    let r = batch.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let results = r.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 8);
    for v in &results {
        assert_eq!(v["status"], 200, "{v}");
        assert_eq!(v["result"], "slept");
    }
    drop(f);
    s.shutdown();
}

/// A tenant's share of the channels is the tenant's, however it is named: while its batch
/// holds the share, a request with its token that also names it in `X-Zygo-Tenant`,
/// one with another of its tokens, and one of an operator acting for it each wait their
/// turn, and are 429 once their short deadline passes (each was a caller of its own, with
/// a share of its own); the host's callers and another tenant are served.
#[test]
fn a_tenant_has_one_share_however_it_is_named() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "named");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", ""), ("slow", "slow", "max_warm = 4")]);
    let (echo, slow) = (names[0].clone(), names[1].clone());
    let f = start_api(&s);
    let t = tenant_id("named");
    let r = req(
        &f.addr,
        "POST",
        "/tenants",
        Some(BOOT),
        &[],
        &json!({ "id": t }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (first, second) = (mint(&s, Some(&t)).1, mint(&s, Some(&t)).1);
    let op = mint(&s, None).1;
    let other = tenant(&s, &f, "other");
    let batch = {
        let (addr, first, slow) = (f.addr.clone(), first.clone(), slow.clone());
        std::thread::spawn(move || {
            let events: Vec<Value> = (0..8).map(|_| json!({"s": 5})).collect();
            req(
                &addr,
                "POST",
                &format!("/fn/{slow}/batch"),
                Some(&first),
                &[],
                &json!({ "events": events }).to_string(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(1000));
    // `wait_ms`: the call's deadline (the default 60 s without).
    let call = |token: &str, header: Option<&str>, wait_ms: Option<&str>| {
        let mut extra: Vec<(&str, &str)> =
            header.map(|h| ("X-Zygo-Tenant", h)).into_iter().collect();
        extra.extend(wait_ms.map(|ms| ("X-Zygo-Timeout-Ms", ms)));
        req(
            &f.addr,
            "POST",
            &format!("/fn/{echo}"),
            Some(token),
            &extra,
            "1",
        )
    };
    for (what, token, header) in [
        ("its token naming it", first.as_str(), Some(t.as_str())),
        ("another of its tokens", second.as_str(), None),
        ("an operator acting for it", op.as_str(), Some(t.as_str())),
    ] {
        // Half a second: over the share, it waits that long and is 429 (the batch's
        // first events take 5 s).
        let r = call(token, header, Some("500"));
        assert_eq!(
            r.status,
            429,
            "{what}: served beside the tenant's whole share: {}",
            r.text()
        );
        assert!(r.json()["error"].as_str().unwrap().contains("share"));
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    for (what, token) in [
        ("the operator", op.as_str()),
        ("another tenant", other.as_str()),
    ] {
        let r = call(token, None, None);
        assert_eq!(r.status, 200, "{what}: {}", r.text());
    }
    let r = batch.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    for v in r.json()["results"].as_array().unwrap() {
        assert_eq!(v["status"], 200, "{v}");
    }
    // The share is free again: the same names are served.
    let r = call(&first, Some(&t), None);
    assert_eq!(r.status, 200, "{}", r.text());
    drop(f);
    s.shutdown();
}

#[test]
fn a_batch_answer_is_held_to_its_budget() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "budget");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("big", "big", "max_warm = 4")]);
    let big = &names[0];
    let f = start_api(&s);
    // 40 answers of 1 MiB stdout and 1 MiB stderr each: 80 MiB, over the 64 MiB budget.
    let mib = 1024 * 1024;
    let events: Vec<Value> = (0..40).map(|_| json!({ "n": mib })).collect();
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{big}/batch"),
        Some(BOOT),
        &[("X-Zygo-Timeout-Ms", "300000")],
        &json!({ "events": events }).to_string(),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.text(), s.log());
    let v = r.json();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 40);
    let mut total = 0;
    let mut cut = 0;
    for e in results {
        assert_eq!(e["status"], 200, "{}", e["error"]);
        assert_eq!(e["result"], mib);
        let (o, er) = (
            e["stdout"].as_str().unwrap().len(),
            e["stderr"].as_str().unwrap().len(),
        );
        total += o + er;
        if e["stdout_truncated"] == true || e["stderr_truncated"] == true {
            cut += 1;
        } else {
            assert_eq!((o, er), (mib, mib));
        }
    }
    assert!(total <= 64 * mib, "{total}");
    assert!(total > 60 * mib, "{total}: the budget is used, not wasted");
    assert!(cut >= 8, "{cut} elements cut");
    drop(f);
    s.shutdown();
}

/// A caller's batches answered at once share one answer budget (64 MiB): each sets aside
/// 16 KiB for each of its events as it begins, so five batches of 1,000 events from one
/// tenant at once do not all fit, and one is refused 429 `busy` at once instead of the
/// front holding five budgets' worth (a tenant once made the front hold a gigabyte with
/// sixteen). Another tenant's batch is answered meanwhile, and once the tenant's batches
/// are answered its budget is whole again.
#[test]
fn a_callers_batches_at_once_share_one_answer_budget() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "batchshare");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("slow", "slow", "max_warm = 8")]);
    let slow = names[0].clone();
    let f = start_api(&s);
    let greedy = tenant(&s, &f, "greedy");
    let other = tenant(&s, &f, "other");
    // Each batch lasts a second at least (its first event sleeps), so they overlap.
    let body = |n: usize| {
        let mut events = vec![json!({ "s": 1 })];
        events.extend((1..n).map(|_| json!({ "s": 0 })));
        json!({ "events": events }).to_string()
    };
    let batch = |token: &str, n: usize| {
        req(
            &f.addr,
            "POST",
            &format!("/fn/{slow}/batch"),
            Some(token),
            &[("X-Zygo-Timeout-Ms", "120000")],
            &body(n),
        )
    };
    let answers: Vec<_> = std::thread::scope(|scope| {
        let greedy_ones: Vec<_> = (0..5)
            .map(|_| scope.spawn(|| batch(&greedy, 1000)))
            .collect();
        // The other tenant's batch, sent while the greedy tenant's are answered.
        std::thread::sleep(Duration::from_millis(300));
        let r = batch(&other, 20);
        assert_eq!(r.status, 200, "the other tenant's batch: {}", r.text());
        greedy_ones.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let refused: Vec<_> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(
        refused.len(),
        1,
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    let v = refused[0].json();
    assert_eq!(v["code"], "busy", "{v}");
    assert!(v["error"].as_str().unwrap().contains("batches"), "{v}");
    for r in answers.iter().filter(|r| r.status != 429) {
        assert_eq!(r.status, 200, "{}", r.text());
        let results = r.json()["results"].as_array().unwrap().len();
        assert_eq!(results, 1000);
    }
    // Answered, its batches gave their budget back.
    let r = batch(&greedy, 1000);
    assert_eq!(r.status, 200, "{}", r.text());
    drop(f);
    s.shutdown();
}

/// The supervisor's side of a stream nobody reads: a front (here a bare API-role client)
/// that reads nothing while a call prints without end is sent a bounded prefix of the
/// events, then the answer marked `stream_truncated`; the connection is not dropped.
#[test]
fn the_supervisor_cuts_a_stream_its_front_does_not_read() {
    use proto::api::{Credentials, FrontFlags};
    use proto::front::{
        ExecEvent, ExecRequest, Hello, HelloReply, Outcome, Reply, Request, Role, FRONT_PROTOCOL,
        MAX_FRONT_FRAME,
    };
    use proto::{encode_frame, read_frame};
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "cut");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("spew", "spew", "max_warm = 1")]);
    let mut c = std::os::unix::net::UnixStream::connect(s.socket()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let hello = Hello {
        protocol: FRONT_PROTOCOL,
        role: Role::Api,
        flags: FrontFlags::default(),
    };
    c.write_all(&encode_frame(&hello).unwrap()).unwrap();
    let welcome = read_frame::<_, HelloReply>(&mut c, MAX_FRONT_FRAME).unwrap();
    assert!(matches!(welcome, HelloReply::Welcome { .. }), "{welcome:?}");
    let who = Credentials {
        token: Some(BOOT.into()),
        tenant: None,
    };
    let call = Request::Api {
        who: who.clone(),
        request: Box::new(Request::Exec(ExecRequest {
            name: names[0].clone(),
            event: "{}".into(),
            key: None,
            timeout_ms: Some(3000),
            stream: true,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        })),
    };
    c.write_all(&encode_frame(&call).unwrap()).unwrap();
    // Nothing read while the call prints, well past its deadline.
    std::thread::sleep(Duration::from_secs(6));
    let mut events = 0usize;
    let answer = loop {
        match read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME) {
            Ok(Reply::Event(ExecEvent::Stdout(d))) => events += d.len(),
            Ok(Reply::Answer(a)) => break a,
            other => panic!("expected events then an answer, got {other:?}\n{}", s.log()),
        }
    };
    assert_eq!(answer.outcome, Outcome::Timeout);
    assert!(answer.stream_truncated, "{}", s.log());
    assert!(answer.stdout_truncated && answer.stdout.len() > 1000 * 1024);
    assert!(events > 0, "some events came before the cut");
    assert!(
        events < 16 << 20,
        "{events} bytes of events queued for a front that read none"
    );
    assert!(s.log().contains("makes no more events"), "{}", s.log());
    // The connection goes on serving.
    let v = Request::Api {
        who,
        request: Box::new(Request::Version),
    };
    c.write_all(&encode_frame(&v).unwrap()).unwrap();
    let r = read_frame::<_, Reply>(&mut c, MAX_FRONT_FRAME).unwrap();
    assert!(matches!(r, Reply::Version(_)), "{r:?}");
    drop(c);
    s.shutdown();
}
