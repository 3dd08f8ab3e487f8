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

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apihold-",
    handlers: "def echo(event):\n    return {\"echo\": event}\n\n\ndef big(event):\n    return \"x\" * event[\"n\"]\n",
    defaults: "timeout = \"20s\"\nmem = \"256M\"\nidle_timeout = \"300s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-api-hold-tests";

use zygo_tests::api::start_http_front;
use zygo_tests::http::req;

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
