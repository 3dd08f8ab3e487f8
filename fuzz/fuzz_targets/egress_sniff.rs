//! Arbitrary bytes as what a sandbox sends through the egress filter: the first bytes of a
//! connection (`zygo_egress::sniff`), a DNS query (`dns::parse_query`), and an upstream
//! DNS answer (`dns::parse_answer`).
//! - `sniff` never panics, and its verdict does not change as more bytes arrive: once a
//!   prefix of the input is a `Host` or `NoHost`, the whole input (at most `MAX_PEEK`) is
//!   the same; a host named by an HTTP head is a non-empty host name; `sniff` on a head and
//!   its blank line agrees with `request_head` on the head;
//! - `request_head` takes only a head without a bare CR, LF or NUL, and a body length it
//!   gives is above 0;
//! - a query taken is 12 to 1500 bytes with a lower-case name of at most 255 bytes of
//!   letters, digits, `-` and `_`; the answer built for it reads back (`parse_answer`)
//!   with the same addresses and TTLs capped at 300 s, NXDOMAIN as no address, another
//!   error as its rcode;
//! - `parse_answer` on anything: no panic, never more addresses than the answer count.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use zygo_egress::dns::{self, RCODE_NXDOMAIN, RCODE_OK};
use zygo_egress::sniff::{self, Body, Sniff, MAX_PEEK};

fn host_name(h: &str) -> bool {
    !h.is_empty()
        && h.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-' || c == b'_')
}

fn check_sniff(data: &[u8]) {
    let whole = sniff::sniff(data);
    if let Sniff::Host(h) = &whole {
        if data.first() != Some(&0x16) {
            assert!(host_name(h), "{h:?}");
        }
    }
    if data.len() <= MAX_PEEK {
        // A cut chosen by the input: the verdict on the bytes before it stands.
        let cut = data.last().map_or(0, |&b| usize::from(b)) * data.len() / 256;
        let prefix = sniff::sniff(&data[..cut]);
        if prefix != Sniff::NeedMore {
            assert_eq!(prefix, whole, "cut at {cut} of {}", data.len());
        }
    }
}

fn check_head(data: &[u8]) {
    let head = sniff::request_head(data);
    if let Ok(h) = &head {
        assert!(host_name(&h.host), "{h:?}");
        assert!(!data.contains(&0));
        if let Body::Length(n) = h.body {
            assert!(n > 0);
        }
        for (i, &c) in data.iter().enumerate() {
            match c {
                b'\r' => assert_eq!(data.get(i + 1), Some(&b'\n'), "a bare CR at {i}"),
                b'\n' => assert_eq!(i.checked_sub(1).map(|j| data[j]), Some(b'\r')),
                _ => {}
            }
        }
    }
    // What the filter sees: the head, then its blank line.
    let starts_http = data.first().is_some_and(u8::is_ascii_uppercase);
    if starts_http && data.len() + 4 <= MAX_PEEK && !data.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut sent = data.to_vec();
        sent.extend_from_slice(b"\r\n\r\n");
        // The blank line may start inside the head's own last bytes (a head ending in
        // CR, LF or CR LF), which then ends earlier.
        let end = sent
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or(sent.len());
        let expect = match sniff::request_head(&sent[..end]) {
            Ok(h) => Sniff::Host(h.host),
            Err(_) => Sniff::NoHost,
        };
        assert_eq!(sniff::sniff(&sent), expect);
    }
}

fn check_dns(data: &[u8]) {
    if let Some(q) = dns::parse_query(data) {
        assert!((12..=dns::MAX_MSG).contains(&data.len()));
        assert!(q.name.len() <= 255, "{}", q.name);
        assert!(
            q.name.bytes().all(|c| c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || c == b'-'
                || c == b'_'
                || c == b'.'),
            "{:?}",
            q.name
        );
        // An answer with an rcode and some addresses taken from the query's own bytes.
        let rcode = data[3] & 0xf;
        let addrs: Vec<(Ipv4Addr, u32)> = data
            .chunks_exact(8)
            .take(usize::from(data[2] & 7))
            .map(|c| {
                let ttl = u32::from_be_bytes([c[4], c[5], c[6], c[7]]);
                (Ipv4Addr::new(c[0], c[1], c[2], c[3]), ttl)
            })
            .collect();
        let msg = dns::answer(data, &q, rcode, &addrs);
        let read = dns::parse_answer(&msg, q.id).expect("the answer is to the query's id");
        let expect = match rcode {
            RCODE_OK => Ok(addrs.iter().map(|&(a, ttl)| (a, ttl.min(300))).collect()),
            RCODE_NXDOMAIN => Ok(Vec::new()),
            other => Err(other),
        };
        assert_eq!(read, expect, "{q:?}");
        // The question it echoes is the query's: the answer, read as a query once its
        // header says it is one, is the same question.
        let mut echoed = msg.clone();
        echoed[2] &= 0x7f;
        echoed[6..8].copy_from_slice(&[0, 0]);
        echoed.truncate(q_end(&msg));
        let again = dns::parse_query(&echoed).expect("the echoed question parses");
        assert_eq!(
            (again.name, again.qtype, again.qclass, again.rd),
            (q.name.clone(), q.qtype, q.qclass, q.rd)
        );
    }
    let id = u16::from_be_bytes([
        data.first().copied().unwrap_or(0),
        data.get(1).copied().unwrap_or(0),
    ]);
    if let Some(Ok(addrs)) = dns::parse_answer(data, id) {
        // NXDOMAIN is taken from the header's first four bytes, with no address.
        let an = data
            .get(6..8)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
        assert!(
            addrs.len() <= usize::from(an),
            "{} addresses for {an} answers",
            addrs.len()
        );
    }
}

/// Where the question of an answer `dns::answer` built ends: its uncompressed name, type
/// and class.
fn q_end(msg: &[u8]) -> usize {
    let mut i = 12;
    while msg[i] != 0 {
        i += 1 + usize::from(msg[i]);
    }
    i + 5
}

fuzz_target!(|data: &[u8]| {
    check_sniff(data);
    check_head(data);
    check_dns(data);
});
