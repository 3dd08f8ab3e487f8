//! `zygo api` in front of a real supervisor, held by one tenant: what that tenant can make
//! the front spend on it (workers, memory, time), and that another tenant is answered
//! meanwhile (issue 29).
//!
//! - bodies trickled with a valid token, from several addresses, hold at most that
//!   caller's share of the workers;
//! - answers nobody reads, or reads a little at a time, hold at most that caller's share
//!   of the workers and little memory, and an answer taken too slowly has its connection
//!   closed;
//! - a batch's answer holds no more memory than its budget, whatever its events parse into;
//! - `zygo api` exits, saying why, once its supervisor is gone.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apihold-",
    handlers: "def echo(event):\n    return {\"echo\": event}\n\n\ndef big(event):\n    return \"x\" * event[\"n\"]\n\n\ndef zeros(event):\n    return [0] * event[\"n\"]\n",
    defaults: "timeout = \"20s\"\nmem = \"256M\"\nidle_timeout = \"300s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-api-hold-tests";
const MIB: usize = 1024 * 1024;

use zygo_tests::api::{mint, start_http_front, tenant_id, HttpFront as Front};
use zygo_tests::http::{head, req, req_within};

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

/// A field of the front's `/proc/PID/status`, in KiB (VmRSS, VmHWM).
fn front_kib(f: &Front, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{}/status", f.child.id())).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the front's status:\n{text}"))
}

/// Another tenant is answered within `secs`: `GET /version`, and a call of a warm
/// function. Each on a connection of its own, so an unanswered one fails the test.
fn another_tenant_is_answered(f: &Front, token: &str, echo: &str, what: &str, secs: u64) {
    let t0 = Instant::now();
    let r = req_within(&f.addr, "GET", "/version", Some(token), &[], "", secs);
    assert_eq!(
        r.status,
        200,
        "{what}: GET /version: {}\n{}",
        r.text(),
        f.log()
    );
    let r = req_within(
        &f.addr,
        "POST",
        &format!("/fn/{echo}"),
        Some(token),
        &[],
        r#"{"a": 1}"#,
        secs,
    );
    assert_eq!(
        r.status,
        200,
        "{what}: a warm call: {}\n{}",
        r.text(),
        f.log()
    );
    assert_eq!(r.json()["result"], json!({"echo": {"a": 1}}));
    eprintln!(
        "{what}: the other tenant was answered in {:.2}s",
        t0.elapsed().as_secs_f64()
    );
}

/// A connection from `from` whose receive buffer is `rcvbuf` bytes (fixed before it
/// connects, so the kernel does not grow it): the front's answer cannot hide in a large
/// receive window.
fn connect_small_window(from: Ipv4Addr, addr: &str, rcvbuf: i32) -> TcpStream {
    use std::os::fd::FromRawFd;
    let to: std::net::SocketAddrV4 = addr.parse().unwrap();
    let sin = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, given an option, bound and connected with values that live
    // across the calls; TcpStream owns the descriptor from then on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let r = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &rcvbuf as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
        let a = sin(from, 0);
        let r = libc::bind(fd, &a as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "bind {from}: {}", std::io::Error::last_os_error());
        let b = sin(*to.ip(), to.port());
        let r = libc::connect(fd, &b as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "connect {addr}: {}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

/// Ask for a `n`-byte answer on `c` and read only its status line: 200 (the answer is
/// coming, and is left unread), or whatever refused it.
fn ask_big_and_read_status(c: &mut TcpStream, big: &str, token: &str, n: usize) -> Option<u16> {
    let body = json!({ "n": n }).to_string();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(head("POST", &format!("/fn/{big}"), Some(token), &[], body.len()).as_bytes())
        .ok()?;
    c.write_all(body.as_bytes()).ok()?;
    // Byte by byte, so nothing past the status line is taken from the socket.
    let mut line = Vec::new();
    let mut b = [0u8];
    while line.len() < 200 && !line.ends_with(b"\r\n") {
        match c.read(&mut b) {
            Ok(1) => line.push(b[0]),
            _ => return None,
        }
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    line.split_whitespace().nth(1)?.parse().ok()
}

/// One tenant trickles request bodies (a valid token, from four addresses, 16 from each:
/// as many as the front has workers); another tenant is answered meanwhile, and most of
/// the trickles are refused at once (429, `Retry-After`) instead of being read.
#[test]
fn trickled_bodies_hold_only_their_callers_share() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "bodies");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", "")]);
    let echo = &names[0];
    let f = start_http_front(&s, &[]);
    let greedy_id = tenant_id("greedy");
    let r = req(
        &f.addr,
        "POST",
        "/tenants",
        Some(BOOT),
        &[],
        &json!({ "id": greedy_id }).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let greedy = mint(&s, Some(&greedy_id)).1;
    let other = tenant(&s, &f, "other");
    // The greedy tenant is known to the front before it starts (its token checked once,
    // with its header and without).
    for named in [&[][..], &[("X-Zygo-Tenant", greedy_id.as_str())][..]] {
        let r = req(&f.addr, "GET", "/version", Some(&greedy), named, "");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut trickles = Vec::new();
    for i in 0..64u8 {
        let from = Ipv4Addr::new(127, 0, 1, 10 + i % 4);
        let mut c = connect_from(from, &f.addr);
        // Every other one names its own tenant: the same caller, the same share.
        let named: &[(&str, &str)] = if i % 2 == 0 {
            &[("X-Zygo-Tenant", greedy_id.as_str())]
        } else {
            &[]
        };
        c.write_all(
            head(
                "POST",
                &format!("/fn/{echo}"),
                Some(&greedy),
                named,
                1_000_000,
            )
            .as_bytes(),
        )
        .unwrap();
        c.write_all(b"[").unwrap();
        trickles.push(c);
    }
    // Let the front take them all in.
    std::thread::sleep(Duration::from_millis(1500));
    another_tenant_is_answered(&f, &other, echo, "bodies trickled", 15);
    // Most were refused at once rather than read.
    let mut refused = 0;
    for c in &mut trickles {
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut first = [0u8; 12];
        if c.read_exact(&mut first).is_ok() && first.starts_with(b"HTTP/1.1 429") {
            refused += 1;
        }
    }
    // One share (a quarter of the workers) is read at once, named or not.
    assert!(
        refused >= 40,
        "{refused} of 64 trickles refused\n{}",
        f.log()
    );
    drop(trickles);
    drop(f);
    s.shutdown();
}

/// One tenant asks for 5 MiB answers on 64 connections, one after another, and never
/// reads them (48 connections) or reads 2 KiB every few seconds (16): another tenant is
/// answered meanwhile, the greedy one is refused past its share (429), and the front
/// holds only the encoded bytes of the answers it is writing.
#[test]
fn unread_answers_hold_only_their_callers_share_and_their_bytes() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "unread");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", ""), ("big", "big", "max_warm = 4")]);
    let (echo, big) = (&names[0], &names[1]);
    let f = start_http_front(&s, &[]);
    let greedy = tenant(&s, &f, "greedy");
    let other = tenant(&s, &f, "other");
    let before = front_kib(&f, "VmHWM");
    let mut held = Vec::new();
    let mut refused = 0;
    let t0 = Instant::now();
    let mut attempts = 0;
    while held.len() < 64 && attempts < 160 && t0.elapsed() < Duration::from_secs(60) {
        attempts += 1;
        let from = Ipv4Addr::new(127, 0, 2, 10 + (attempts % 4) as u8);
        let mut c = connect_from(from, &f.addr);
        match ask_big_and_read_status(&mut c, big, &greedy, 5 * MIB) {
            Some(200) => held.push(c),
            Some(429) | Some(503) => refused += 1,
            // No answer at all: the front has no worker left for it.
            other => {
                eprintln!("attempt {attempts}: {other:?}");
                break;
            }
        }
    }
    eprintln!(
        "{} answers held unread, {refused} refused, in {:.1}s",
        held.len(),
        t0.elapsed().as_secs_f64()
    );
    // A quarter of the held connections read 2 KiB every 5 s.
    let stop = Arc::new(AtomicBool::new(false));
    let mut trickling: Vec<TcpStream> = held.drain(..held.len().min(16)).collect();
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                for c in &mut trickling {
                    c.set_read_timeout(Some(Duration::from_millis(100)))
                        .unwrap();
                    let mut buf = [0u8; 2048];
                    let _ = c.read(&mut buf);
                }
                for _ in 0..50 {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            trickling
        })
    };
    let after = front_kib(&f, "VmHWM");
    let grew = after.saturating_sub(before) / 1024;
    eprintln!("the front's VmHWM: {before} KiB before, {after} KiB after (+{grew} MiB)");
    another_tenant_is_answered(&f, &other, echo, "answers unread", 15);
    assert!(
        refused > 0,
        "the greedy tenant was never refused\n{}",
        f.log()
    );
    // Only the answers' bytes are held: at most the greedy tenant's share of them (16),
    // each 5 MiB, and what an answer takes while it is made.
    assert!(
        grew < 128,
        "the front's peak memory grew by {grew} MiB\n{}",
        f.log()
    );
    stop.store(true, Ordering::Release);
    let trickling = reader.join().unwrap();
    drop(trickling);
    drop(held);
    drop(f);
    s.shutdown();
}

/// An answer its client takes 2 KiB at a time, every 5 s (each of those reads lets the
/// front's write go on, so a timeout per write never ends it), and one never read: the
/// front gives up on both within the time their size allows and closes the connections.
#[test]
fn an_answer_taken_too_slowly_has_its_connection_closed() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "slow");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("big", "big", "max_warm = 2")]);
    let big = &names[0];
    let f = start_http_front(&s, &[]);
    let n = 8 * MIB;
    let mut trickle = connect_small_window(Ipv4Addr::new(127, 0, 3, 10), &f.addr, 8192);
    assert_eq!(
        ask_big_and_read_status(&mut trickle, big, BOOT, n),
        Some(200)
    );
    let mut never = connect_small_window(Ipv4Addr::new(127, 0, 3, 11), &f.addr, 8192);
    assert_eq!(ask_big_and_read_status(&mut never, big, BOOT, n), Some(200));
    let t0 = Instant::now();
    // An answer of 8 MiB is given at most 1 s + 8 MiB / 64 KiB/s = 129 s; a client that
    // falls behind that pace is dropped as soon as it does.
    let limit = Duration::from_secs(140);
    let mut got = 0usize;
    let mut closed = None;
    trickle
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    while t0.elapsed() < limit {
        let mut buf = [0u8; 2048];
        match trickle.read(&mut buf) {
            Ok(0) | Err(_) if t0.elapsed() > Duration::from_secs(1) => {
                // A read that times out is not the end: look again.
                let mut probe = [0u8; 1];
                trickle.set_nonblocking(true).unwrap();
                let gone = match trickle.peek(&mut probe) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                };
                trickle.set_nonblocking(false).unwrap();
                if gone {
                    closed = Some(t0.elapsed());
                    break;
                }
            }
            Ok(k) => got += k,
            _ => {}
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    let closed = closed.unwrap_or_else(|| {
        panic!(
            "the trickled answer's connection is still open after {}s ({got} bytes read)\n{}",
            limit.as_secs(),
            f.log()
        )
    });
    eprintln!(
        "the trickled answer's connection was closed after {:.1}s, {got} bytes read",
        closed.as_secs_f64()
    );
    assert!(got < n, "{got} bytes: the whole answer was read");
    // The unread one is closed too: reading it now gives what was buffered, then the end.
    never
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let r = BufReader::new(&never).read_to_end(&mut rest);
    assert!(
        rest.len() < n,
        "{} bytes of the unread answer came ({r:?})",
        rest.len()
    );
    let log = f.log_once(|l| l.contains("slower than"));
    assert!(
        log.contains("slower than"),
        "the front did not say why it dropped them\n{log}"
    );
    drop(f);
    s.shutdown();
}

/// Batches whose events, or results, are small JSON texts that parse into large trees
/// (long arrays of small numbers, objects of many keys): the front's peak memory grows by
/// no more than the batch's body and its answer's budget (64 MiB), with what is in
/// flight; past the budget, elements are cut (413 `too_large`).
#[test]
fn a_batch_of_small_texts_that_parse_large_holds_its_budget() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "batchmem");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[
        ("echo", "echo", "max_warm = 4"),
        ("zeros", "zeros", "max_warm = 4"),
    ]);
    let (echo, zeros) = (&names[0], &names[1]);
    let f = start_http_front(&s, &[]);
    let before = front_kib(&f, "VmHWM");
    let grew = |f: &Front| front_kib(f, "VmHWM").saturating_sub(before) / 1024;
    // Events of about 60 KB each, echoed: 30 000 zeros, or 6 000 keys.
    let zero_list = format!("[{}0]", "0,".repeat(29_999));
    let keys = format!(
        "{{{}}}",
        (0..6000)
            .map(|i| format!("\"{i:x}\":0"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let events: Vec<&str> = (0..200)
        .map(|i| if i % 2 == 0 { &zero_list } else { &keys }.as_str())
        .collect();
    let body = format!("{{\"events\":[{}]}}", events.join(","));
    assert!(body.len() < 16 * MIB, "{}", body.len());
    let r = req_within(
        &f.addr,
        "POST",
        &format!("/fn/{echo}/batch"),
        Some(BOOT),
        &[("X-Zygo-Timeout-Ms", "120000")],
        &body,
        150,
    );
    let echoed = grew(&f);
    eprintln!(
        "echo: a batch of {} bytes: status {}, {} bytes answered; the front's VmHWM +{echoed} MiB",
        body.len(),
        r.status,
        r.body.len()
    );
    assert_eq!(r.status, 200, "{}", &r.text()[..r.text().len().min(2000)]);
    let v: Value = r.json();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 200);
    for (i, e) in results.iter().enumerate() {
        assert_eq!(e["status"], 200, "element {i}: {}", e["error"]);
        let back = &e["result"]["echo"];
        assert!(back.is_array() || back.is_object(), "element {i}: {e}");
    }
    drop(v);
    // The body (11 MB) and the results (as much again), and no trees.
    assert!(
        echoed <= 64,
        "the front's peak memory grew by {echoed} MiB for one batch\n{}",
        f.log()
    );
    // 100 events of 12 bytes, each answered by 2 MB of zeros: 200 MB of results, past
    // the budget.
    let events: Vec<Value> = (0..100).map(|_| json!({"n": 1_000_000})).collect();
    let r = req_within(
        &f.addr,
        "POST",
        &format!("/fn/{zeros}/batch"),
        Some(BOOT),
        &[("X-Zygo-Timeout-Ms", "120000")],
        &json!({ "events": events }).to_string(),
        150,
    );
    let widened = grew(&f);
    eprintln!(
        "zeros: status {}, {} bytes answered; the front's VmHWM +{widened} MiB",
        r.status,
        r.body.len()
    );
    assert_eq!(r.status, 200, "{}", &r.text()[..r.text().len().min(2000)]);
    assert!(r.body.len() <= 64 * MIB, "{} bytes answered", r.body.len());
    let v: Value = r.json();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 100);
    let (mut whole, mut cut) = (0, 0);
    for (i, e) in results.iter().enumerate() {
        match e["status"].as_u64() {
            Some(200) => {
                assert_eq!(e["result"].as_array().map(Vec::len), Some(1_000_000), "{i}");
                whole += 1;
            }
            Some(413) => {
                assert_eq!(e["code"], "too_large", "element {i}");
                cut += 1;
            }
            _ => panic!("element {i}: {e}"),
        }
    }
    eprintln!("zeros: {whole} elements whole, {cut} left out");
    assert!(whole >= 25 && cut >= 50, "{whole} whole, {cut} cut");
    drop(v);
    // The budget (64 MiB) and the replies in flight (the caller's share of the channels,
    // 4 here, each 2 MB as it came and 2 MB decoded), and no trees.
    assert!(
        widened <= 96,
        "the front's peak memory grew by {widened} MiB for one batch\n{}",
        f.log()
    );
    drop(f);
    s.shutdown();
}

/// Once the supervisor is gone (drained and exited), `zygo api` exits non-zero within a
/// few seconds, saying why, rather than answering 503 to every request.
#[test]
fn zygo_api_exits_when_its_supervisor_is_gone() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "gone");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("echo", "echo", "")]);
    let mut f = start_http_front(&s, &[]);
    let r = req(
        &f.addr,
        "POST",
        &format!("/fn/{}", names[0]),
        Some(BOOT),
        &[],
        "1",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    s.shutdown();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = f.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "zygo api still runs {:.1}s after its supervisor exited\n{}",
            t0.elapsed().as_secs_f64(),
            f.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "zygo api exited {status} {:.2}s after its supervisor",
        t0.elapsed().as_secs_f64()
    );
    assert!(!status.success(), "{status}");
    // Its last words say why (the log reader may be a moment behind the exit).
    wait_for(Duration::from_secs(5), "the front's last words", || {
        f.log().contains("supervisor")
    });
    let log = f.log();
    let last = log.lines().last().unwrap_or("");
    assert!(
        last.contains("supervisor") && last.contains("exit"),
        "its last line: {last:?}\n{log}"
    );
    // The listener is gone with it.
    assert!(
        TcpStream::connect(&f.addr).is_err() || {
            let c = TcpStream::connect(&f.addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut line = String::new();
            BufReader::new(c)
                .read_line(&mut line)
                .map_or(true, |n| n == 0)
        }
    );
}
