//! Large events are checked off the supervisor's event loop, and a call carrying one is
//! still its caller's like any other:
//!
//! - a large event is answered as a small one is, and a bad one gets the words a small
//!   one gets (what is wrong, and at which byte);
//! - a cancel of its key while it is checked ends it once (`cancelled`), and a caller that
//!   leaves meanwhile leaves nothing behind;
//! - one tenant's queue of large events does not hold back another tenant's large event
//!   (they take turns), and the other tenant's small requests are answered meanwhile;
//! - a drain that comes while events are checked answers every call exactly once;
//! - large script and blob puts are named (SHA-256) off the loop and stored as small ones
//!   are, with the same digests and words; a caller that leaves meanwhile leaves nothing;
//! - one tenant's queue of large puts does not hold back another tenant's put (they take
//!   turns at being named and at being written), and its small requests are answered
//!   meanwhile.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proto::api::FrontFlags;
use proto::front::{ErrorCode, ExecRequest, Outcome, Reply, Request};
use serde_json::{json, Value};
use zygo_tests::api::{mint, tenant_id, ApiConn};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "bigev-",
    handlers: "def echo(event):\n    return event\n",
    defaults: "timeout = \"60s\"\nmem = \"512M\"\nidle_timeout = \"120s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-big-event-tests";

/// A supervisor with `echo` (a function returning its event) and `pool` (a runtime pool:
/// a call of it without a script is refused once its event is checked, so its answer
/// comes as soon as the check is done).
fn start(tag: &str) -> (Sup, String, String) {
    let mut s = SUITE.sup(Who::Root, tag);
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[
        (
            "echo",
            "agent = \"python\"\nentry = \"fn/handlers.py:echo\"\n".to_string(),
        ),
        ("pool", "agent = \"python\"\n".to_string()),
    ]);
    (s, names[0].clone(), names[1].clone())
}

fn conn(s: &Sup) -> ApiConn {
    ApiConn::open(s, FrontFlags::default())
}

/// A tenant, made by the bootstrap operator, and its token.
fn tenant(s: &Sup, tag: &str) -> String {
    let id = tenant_id(tag);
    let r = conn(s).ask(BOOT, None, Request::CreateTenant { id: id.clone() });
    assert!(matches!(r, Reply::Tenant { .. }), "create {id}: {r:?}");
    mint(s, Some(&id)).1
}

fn call(name: &str, event: String, key: Option<&str>) -> Request {
    Request::Exec(ExecRequest {
        name: name.into(),
        event,
        key: key.map(str::to_string),
        timeout_ms: None,
        stream: false,
        script: None,
        workspace: None,
        workspace_blob: None,
        out: false,
    })
}

/// About `bytes` of JSON text: an array of small objects, spaced and indented, with text
/// that is not ASCII.
fn big_event(bytes: usize, tag: &str) -> String {
    let mut s = String::from("[\n");
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!(
            "  {{ \"id\": {i}, \"tag\": \"{tag}\", \"name\": \"élément-{i}\", \"v\": [1.5, true, null] }},\n"
        ));
        i += 1;
    }
    s.push_str("  0\n]\n");
    s
}

/// About `bytes` of JSON text that is all tokens: `[0,0,…]`.
fn zeros(bytes: usize) -> String {
    let mut s = "[0".to_string();
    s.push_str(&",0".repeat(bytes / 2));
    s.push(']');
    s
}

#[track_caller]
fn error(r: &Reply) -> (ErrorCode, String) {
    match r {
        Reply::Error { code, message, .. } => (*code, message.clone()),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[track_caller]
fn answer(r: Reply) -> proto::front::ExecAnswer {
    match r {
        Reply::Answer(a) => a,
        other => panic!("expected an answer, got {other:?}"),
    }
}

/// A call's result, as JSON.
#[track_caller]
fn result(a: proto::front::ExecAnswer) -> Value {
    serde_json::from_str(a.result.as_deref().unwrap_or("null")).unwrap()
}

/// The refusal of a call of a runtime pool without a script.
fn is_pool_refusal(r: &Reply) -> bool {
    matches!(r, Reply::Error { code: ErrorCode::BadRequest, message, .. } if message.contains("is a runtime pool"))
}

#[test]
fn a_large_event_is_answered_as_a_small_one_and_a_bad_one_gets_the_same_words() {
    if !root_only() {
        return;
    }
    let (s, echo, _) = start("same");
    let token = tenant(&s, "same");
    let mut c = conn(&s);
    for size in [100, 1 << 20, 6 << 20] {
        let text = big_event(size, "ok");
        let a = answer(c.ask(&token, None, call(&echo, text.clone(), None)));
        assert_eq!(a.outcome, Outcome::Ok, "{size} bytes: {a:?}\n{}", s.log());
        let got: Value = serde_json::from_str(a.result.as_deref().unwrap()).unwrap();
        let sent: Value = serde_json::from_str(&text).unwrap();
        assert!(got == sent, "{size} bytes: the handler got another value");
    }
    // Bad events, small and large: the words name the fault and its byte, as the loop's
    // check always has.
    let big = big_event(2 << 20, "bad");
    let body = big.trim_end().trim_end_matches(']');
    let bad = [
        format!("{body}, {{\"a\": 1, \"a\": 2}}]"),
        format!("{big} 1"),
        format!("{body}, \"\\x\"]"),
        format!("{body}, 1e400]"),
        format!("{body}, {}1{}]", "[".repeat(200), "]".repeat(200)),
        body.to_string(),
    ];
    for text in bad {
        for t in [text.clone(), format!("[{}]", &text[text.len() - 40..])] {
            let expected = proto::json_scan::check_value(t.as_bytes()).expect_err("a bad event");
            let r = c.ask(&token, None, call(&echo, t.clone(), None));
            let (code, message) = error(&r);
            assert_eq!(code, ErrorCode::BadRequest, "{message}");
            assert_eq!(
                message,
                format!(
                    "the event is not JSON: {} at byte {}",
                    expected.what, expected.at
                ),
                "an event of {} bytes",
                t.len()
            );
        }
    }
    // Past the largest event: refused for its size, as before.
    let r = c.ask(&token, None, call(&echo, " ".repeat((16 << 20) + 1), None));
    assert_eq!(error(&r).0, ErrorCode::TooLarge, "{r:?}");
    // And the large event over HTTP, through `zygo api`.
    let f = zygo_tests::api::start_http_front(&s, &[]);
    let text = big_event(3 << 20, "http");
    let r = zygo_tests::http::req(
        &f.addr,
        "POST",
        &format!("/fn/{echo}"),
        Some(&token),
        &[],
        &text,
    );
    assert_eq!(r.status, 200, "{}", &r.text()[..r.text().len().min(500)]);
    let sent: Value = serde_json::from_str(&text).unwrap();
    assert!(
        r.json()["result"] == sent,
        "the handler got another value over HTTP"
    );
    drop(f);
    s.shutdown();
}

#[test]
fn a_cancel_while_the_event_is_checked_ends_the_call_once_and_a_caller_that_leaves_leaves_nothing()
{
    if !root_only() {
        return;
    }
    let (s, echo, pool) = start("cancel");
    let token = tenant(&s, "cancel");
    // Three large events of the tenant's first, so that the one cancelled waits its turn
    // behind them (wherever it is when the cancel comes, the answers below hold).
    let mut ahead: Vec<ApiConn> = (0..3).map(|_| conn(&s)).collect();
    for (i, c) in ahead.iter_mut().enumerate() {
        c.send(
            &token,
            None,
            call(&pool, big_event(6 << 20, &format!("a{i}")), None),
        );
    }
    let mut cancelled = conn(&s);
    cancelled.send(
        &token,
        None,
        call(&echo, big_event(6 << 20, "c"), Some("k1")),
    );
    // One that leaves while its event waits.
    let mut leaving = conn(&s);
    leaving.send(
        &token,
        None,
        call(&echo, big_event(6 << 20, "l"), Some("k2")),
    );
    drop(leaving);
    // The cancel may come before the supervisor has read the whole call: it is sent again
    // until it finds it.
    let mut canceller = conn(&s);
    wait_for(
        std::time::Duration::from_secs(30),
        "the cancel to find k1",
        || {
            let r = canceller.ask(&token, None, Request::Cancel { key: "k1".into() });
            match r {
                Reply::Cancelled { count } => {
                    assert_eq!(count, 1, "{r:?}");
                    true
                }
                Reply::Error {
                    code: ErrorCode::NotFound,
                    ..
                } => false,
                other => panic!("{other:?}\n{}", s.log()),
            }
        },
    );
    let a = answer(cancelled.recv());
    assert_eq!(a.outcome, Outcome::Cancelled, "{a:?}");
    for c in &mut ahead {
        let r = c.recv();
        assert!(is_pool_refusal(&r), "{r:?}");
    }
    // The cancelled call was answered once: the connection goes on with the next request.
    let r = cancelled.ask(&token, None, call(&echo, "{\"after\": 1}".into(), None));
    assert_eq!(result(answer(r)), json!({ "after": 1 }));
    // Nothing is left in flight, and another cancel of either key finds nothing.
    wait_for(
        std::time::Duration::from_secs(30),
        "no call in flight",
        || s.info(&echo)["in_flight"].as_u64() == Some(0),
    );
    for key in ["k1", "k2"] {
        let r = conn(&s).ask(&token, None, Request::Cancel { key: key.into() });
        assert_eq!(error(&r).0, ErrorCode::NotFound, "{key}: {r:?}");
    }
    s.shutdown();
}

#[test]
fn one_tenants_queue_of_large_events_does_not_hold_back_anothers() {
    if !root_only() {
        return;
    }
    let (s, echo, pool) = start("turns");
    let flooder = tenant(&s, "flood");
    let other = tenant(&s, "other");
    const FLOOD: usize = 8;
    // The order the answers come in.
    let order = Arc::new(AtomicUsize::new(0));
    // The flood is sent all at once, on connections of its own: events of many small
    // tokens, which take far longer to check than to send, so they wait in line.
    let sent = Arc::new(std::sync::Barrier::new(FLOOD + 1));
    let threads: Vec<_> = (0..FLOOD)
        .map(|_| {
            let mut c = conn(&s);
            let (pool, flooder, order, sent) =
                (pool.clone(), flooder.clone(), order.clone(), sent.clone());
            std::thread::spawn(move || {
                c.send(&flooder, None, call(&pool, zeros(6 << 20), None));
                sent.wait();
                let r = c.recv();
                (order.fetch_add(1, Ordering::SeqCst), r)
            })
        })
        .collect();
    sent.wait();
    // The other tenant's large event, sent once the flood's are: it takes its turn
    // beside them, not behind them all.
    let mut c = conn(&s);
    c.send(&other, None, call(&pool, zeros(256 << 10), None));
    let mine = {
        let order = order.clone();
        std::thread::spawn(move || {
            let r = c.recv();
            (order.fetch_add(1, Ordering::SeqCst), r)
        })
    };
    // Its small requests are answered meanwhile, each with what it asked for.
    let mut small = conn(&s);
    for i in 0..5 {
        let r = small.ask(
            &other,
            None,
            Request::Stats {
                name: Some(echo.clone()),
            },
        );
        assert!(matches!(r, Reply::Stats(_)), "{r:?}");
        let r = small.ask(
            &other,
            None,
            call(&echo, json!({ "i": i }).to_string(), None),
        );
        assert_eq!(result(answer(r)), json!({ "i": i }));
    }
    let (at, r) = mine.join().unwrap();
    assert!(is_pool_refusal(&r), "{r:?}");
    let mut after = 0;
    for t in threads {
        let (n, r) = t.join().unwrap();
        assert!(is_pool_refusal(&r), "{r:?}");
        if n > at {
            after += 1;
        }
    }
    // Turn about: the other tenant's event was checked after at most the flood's event
    // being checked and the next in turn; the rest of the flood came after it.
    assert!(
        after >= FLOOD - 3,
        "the other tenant's large event was answered after {} of the flood's {FLOOD}",
        FLOOD - after
    );
    s.shutdown();
}

#[test]
fn a_drain_during_checks_answers_every_call_once() {
    if !root_only() {
        return;
    }
    let (s, _, pool) = start("drain");
    let token = tenant(&s, "drain");
    let mut threads = Vec::new();
    for i in 0..6 {
        let mut c = conn(&s);
        c.send(
            &token,
            None,
            call(&pool, big_event(6 << 20, &format!("d{i}")), None),
        );
        threads.push(std::thread::spawn(move || {
            let first = c.recv();
            // Nothing after the one reply: the supervisor closes the connection as it
            // exits.
            let more = proto::read_frame::<_, Reply>(c.stream(), proto::front::MAX_FRONT_FRAME);
            (first, more.is_err())
        }));
    }
    s.shutdown();
    for t in threads {
        let (r, closed) = t.join().unwrap();
        let drained = matches!(&r, Reply::Error { code: ErrorCode::Unavailable, message, .. } if message.contains("draining"));
        assert!(is_pool_refusal(&r) || drained, "{r:?}");
        assert!(closed, "a second reply came");
    }
}

/// The lowercase hex SHA-256 of `bytes`.
fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `len` bytes no other put of this run has (a tag, then a pattern).
fn fresh_bytes(len: usize, tag: &str) -> Vec<u8> {
    let mut b = format!("{tag}-{:x}-", unique()).into_bytes();
    let mut i: u32 = 0;
    while b.len() < len {
        b.push((i % 251) as u8);
        i = i.wrapping_add(7);
    }
    b.truncate(len);
    b
}

fn put_blob(bytes: Vec<u8>) -> Request {
    Request::PutBlob {
        bytes: bytes.into(),
    }
}

/// A put's digest, size and whether the store held the bytes already.
#[track_caller]
fn stored(r: Reply) -> (String, u64, bool) {
    match r {
        Reply::BlobStored {
            digest,
            size,
            existed,
        }
        | Reply::ScriptStored {
            digest,
            size,
            existed,
        } => (digest, size, existed),
        other => panic!("expected a put's answer, got {other:?}"),
    }
}

#[test]
fn a_large_put_is_named_and_stored_as_a_small_one() {
    if !root_only() {
        return;
    }
    let (s, _, _) = start("puts");
    let token = tenant(&s, "puts");
    let mut c = conn(&s);
    for len in [1000, 3 << 20] {
        let bytes = fresh_bytes(len, "blob");
        let want = sha256(&bytes);
        let first = stored(c.ask(&token, None, put_blob(bytes.clone())));
        assert_eq!(
            first,
            (want.clone(), len as u64, false),
            "a {len}-byte blob"
        );
        let again = stored(c.ask(&token, None, put_blob(bytes)));
        assert_eq!(
            again,
            (want, len as u64, true),
            "the same {len} bytes again"
        );
        let source = fresh_bytes(len, "script");
        let want = sha256(&source);
        let r = c.ask(&token, None, Request::PutScript { source });
        assert_eq!(stored(r), (want, len as u64, false), "a {len}-byte script");
    }
    // Past the cap: the same words at once, whatever the size.
    let (code, message) = error(&c.ask(&token, None, put_blob(vec![b'x'; (16 << 20) + 1])));
    assert_eq!(code, ErrorCode::TooLarge, "{message}");
    assert!(message.contains("at most 16 MiB"), "{message}");
    // A caller that leaves while its bytes are named leaves nothing waiting: the next
    // caller is answered as ever.
    for i in 0..4 {
        let mut gone = conn(&s);
        gone.send(
            &token,
            None,
            put_blob(fresh_bytes(6 << 20, &format!("gone{i}"))),
        );
    }
    let bytes = fresh_bytes(2 << 20, "after");
    let want = sha256(&bytes);
    assert_eq!(stored(c.ask(&token, None, put_blob(bytes))).0, want);
    s.shutdown();
}

/// The CPU time (in clock ticks) of the supervisor's thread named `name`.
fn thread_ticks(s: &Sup, name: &str) -> u64 {
    let pid = s.supervisor.expect("the supervisor's pid");
    let mut ticks = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map(|(_, rest)| rest.split(' ').collect())
            .unwrap_or_default();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the name.
        for f in fields.iter().skip(11).take(2) {
            ticks += f.parse::<u64>().unwrap_or(0);
        }
    }
    ticks
}

#[test]
fn one_tenants_large_puts_are_named_off_the_loop_in_turns() {
    if !root_only() {
        return;
    }
    let (s, echo, _) = start("putturns");
    let flooder = tenant(&s, "pflood");
    let other = tenant(&s, "pother");
    let checker_before = thread_ticks(&s, "event-check");
    // As much as one tenant may have waiting: 14 × 4 MiB of the 64 MiB per holder, sent
    // at once on connections of its own.
    const FLOOD: usize = 14;
    let threads: Vec<_> = (0..FLOOD)
        .map(|i| {
            let mut c = conn(&s);
            let bytes = fresh_bytes(4 << 20, &format!("flood{i}"));
            let flooder = flooder.clone();
            std::thread::spawn(move || {
                let want = sha256(&bytes);
                c.send(&flooder, None, put_blob(bytes));
                (want, c.recv())
            })
        })
        .collect();
    // The other tenant's large put and small requests are answered meanwhile, each with
    // what it asked for.
    let mut c = conn(&s);
    let bytes = fresh_bytes(1 << 20, "other");
    let want = sha256(&bytes);
    assert_eq!(stored(c.ask(&other, None, put_blob(bytes))).0, want);
    for i in 0..5 {
        let r = c.ask(
            &other,
            None,
            call(&echo, json!({ "i": i }).to_string(), None),
        );
        assert_eq!(result(answer(r)), json!({ "i": i }));
    }
    for t in threads {
        let (want, r) = t.join().unwrap();
        assert_eq!(stored(r).0, want);
    }
    // The bytes were named by the checker thread (60 MiB of SHA-256 is CPU time it
    // counts), not by the loop.
    let checker = thread_ticks(&s, "event-check") - checker_before;
    assert!(checker > 0, "the checker thread did no work");
    s.shutdown();
}
