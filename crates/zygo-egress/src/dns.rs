//! Zygo's resolver for a sandbox with name rules: a small DNS client and server, no glibc
//! name service. The sandbox's queries (UDP, port 53 of any address) reach the filter; a
//! query for a name a rule has, type A, is asked of the host's DNS servers (from its
//! resolv.conf, handed over by the launcher) and answered with the addresses the rule
//! allows; AAAA for such a name is answered with no address (IPv6 has no route); every
//! other query is answered REFUSED with no address, and logged.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The largest DNS message over UDP either side handles.
pub const MAX_MSG: usize = 1500;
/// How long one upstream server has to answer.
const UPSTREAM_WAIT: Duration = Duration::from_secs(2);
/// The longest an answer tells the sandbox to keep an address.
const MAX_TTL: u32 = 300;

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
pub const RCODE_OK: u8 = 0;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_NXDOMAIN: u8 = 3;
pub const RCODE_REFUSED: u8 = 5;

/// One question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub id: u16,
    /// Lower case, dot-separated, no trailing dot.
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// Whether recursion was asked for (echoed in the answer).
    pub rd: bool,
    /// Where the question ends in the message (the answer copies it).
    end: usize,
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_be_bytes([
        *b.get(i)?,
        *b.get(i + 1)?,
        *b.get(i + 2)?,
        *b.get(i + 3)?,
    ]))
}

/// A query from the sandbox: a standard query (QR 0, opcode 0) with exactly one question
/// whose name is uncompressed. `None` for anything else.
pub fn parse_query(b: &[u8]) -> Option<Query> {
    if b.len() < 12 || b.len() > MAX_MSG {
        return None;
    }
    let id = u16_at(b, 0)?;
    let flags = u16_at(b, 2)?;
    if flags & 0x8000 != 0 || (flags >> 11) & 0xf != 0 || u16_at(b, 4)? != 1 {
        return None;
    }
    let mut i = 12;
    let mut labels: Vec<String> = Vec::new();
    let mut total = 0usize;
    loop {
        let len = usize::from(*b.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None; // compression or a reserved label type: not in a query
        }
        total += len + 1;
        if total > 255 {
            return None;
        }
        let label = b.get(i..i + len)?;
        if !label
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
        {
            return None;
        }
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16_at(b, i)?;
    let qclass = u16_at(b, i + 2)?;
    Some(Query {
        id,
        name: labels.join("."),
        qtype,
        qclass,
        rd: flags & 0x0100 != 0,
        end: i + 4,
    })
}

/// The answer to `q` (whose message was `msg`): `rcode` and A records for `addrs`.
pub fn answer(msg: &[u8], q: &Query, rcode: u8, addrs: &[(Ipv4Addr, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(q.end + 16 * addrs.len());
    out.extend_from_slice(&q.id.to_be_bytes());
    let flags: u16 = 0x8000 | 0x0080 | (u16::from(q.rd) << 8) | u16::from(rcode & 0xf);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(addrs.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&msg[12..q.end]);
    for (a, ttl) in addrs {
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&(*ttl).min(MAX_TTL).to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&a.octets());
    }
    out
}

/// A type A query for `name` with `id`, recursion desired.
pub fn query_a(name: &str, id: u16) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(18 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&TYPE_A.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    Some(out)
}

/// Past a (possibly compressed) name starting at `i`: where what follows it starts.
fn skip_name(b: &[u8], mut i: usize) -> Option<usize> {
    for _ in 0..128 {
        let len = *b.get(i)?;
        match len {
            0 => return Some(i + 1),
            l if l & 0xc0 == 0xc0 => return Some(i + 2),
            l if l <= 63 => i += 1 + usize::from(l),
            _ => return None,
        }
    }
    None
}

/// The A records of an upstream answer to the query with `id`: `Ok(addresses)` (empty
/// for NXDOMAIN or no records), `Err(rcode)` for another error.
pub fn parse_answer(b: &[u8], id: u16) -> Option<Result<Vec<(Ipv4Addr, u32)>, u8>> {
    if u16_at(b, 0)? != id {
        return None;
    }
    let flags = u16_at(b, 2)?;
    if flags & 0x8000 == 0 {
        return None;
    }
    let rcode = (flags & 0xf) as u8;
    if rcode == RCODE_NXDOMAIN {
        return Some(Ok(Vec::new()));
    }
    if rcode != RCODE_OK {
        return Some(Err(rcode));
    }
    let qd = u16_at(b, 4)?;
    let an = u16_at(b, 6)?;
    let mut i = 12;
    for _ in 0..qd {
        i = skip_name(b, i)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        i = skip_name(b, i)?;
        let (t, c, ttl, len) = (
            u16_at(b, i)?,
            u16_at(b, i + 2)?,
            u32_at(b, i + 4)?,
            usize::from(u16_at(b, i + 8)?),
        );
        let data = b.get(i + 10..i + 10 + len)?;
        if t == TYPE_A && c == CLASS_IN && len == 4 {
            out.push((Ipv4Addr::new(data[0], data[1], data[2], data[3]), ttl));
        }
        i += 10 + len;
    }
    Some(Ok(out))
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // SAFETY: getrandom fills the two bytes of `b`.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), 2, 0) };
    u16::from_ne_bytes(b)
}

/// Ask the host's DNS servers, in order, for `name`'s A records.
pub fn resolve(servers: &[Ipv4Addr], name: &str) -> Result<Vec<(Ipv4Addr, u32)>, String> {
    let mut last = String::from("no DNS server is configured");
    for server in servers {
        match ask(*server, name) {
            Ok(a) => return Ok(a),
            Err(e) => last = format!("{server}: {e}"),
        }
    }
    Err(last)
}

fn ask(server: Ipv4Addr, name: &str) -> Result<Vec<(Ipv4Addr, u32)>, String> {
    let id = random_id();
    let q = query_a(name, id).ok_or("not a name that can be asked for")?;
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: the socket was just created by this process.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 53u16.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(server).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in of the size passed.
    let r = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: q is valid for its length.
    let sent = unsafe { libc::send(sock.as_raw_fd(), q.as_ptr().cast(), q.len(), 0) };
    if sent != q.len() as isize {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let deadline = Instant::now() + UPSTREAM_WAIT;
    let mut buf = [0u8; MAX_MSG];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no answer".into());
        }
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int + 1) } <= 0 {
            continue;
        }
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        match parse_answer(&buf[..n as usize], id) {
            Some(Ok(a)) => return Ok(a),
            Some(Err(rcode)) => return Err(format!("answered with error code {rcode}")),
            None => continue, // not our answer
        }
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_round_trips_into_an_answer() {
        let q = query_a("Api.Example.com", 0x1234).unwrap();
        let parsed = parse_query(&q).unwrap();
        assert_eq!(parsed.name, "api.example.com");
        assert_eq!(parsed.qtype, TYPE_A);
        let a = answer(&q, &parsed, RCODE_OK, &[(Ipv4Addr::new(1, 2, 3, 4), 9999)]);
        let got = parse_answer(&a, 0x1234).unwrap().unwrap();
        assert_eq!(got, vec![(Ipv4Addr::new(1, 2, 3, 4), MAX_TTL)]);
        assert!(parse_answer(&a, 0x4321).is_none());
        let refused = answer(&q, &parsed, RCODE_REFUSED, &[]);
        assert_eq!(parse_answer(&refused, 0x1234).unwrap(), Err(RCODE_REFUSED));
    }

    #[test]
    fn hostile_queries_are_dropped() {
        let q = query_a("a.com", 1).unwrap();
        assert!(parse_query(&q[..11]).is_none());
        assert!(parse_query(&q[..q.len() - 1]).is_none());
        let mut answer_bit = q.clone();
        answer_bit[2] |= 0x80;
        assert!(parse_query(&answer_bit).is_none());
        let mut two = q.clone();
        two[5] = 2;
        assert!(parse_query(&two).is_none());
        let mut pointer = q.clone();
        pointer[12] = 0xc0;
        assert!(parse_query(&pointer).is_none());
        let mut odd = q.clone();
        odd[13] = b'/';
        assert!(parse_query(&odd).is_none());
        assert!(parse_query(&[0u8; 2000]).is_none());
        // A pointer loop in an answer ends, without an address.
        let mut looped = answer(&q, &parse_query(&q).unwrap(), RCODE_OK, &[]);
        looped[7] = 1;
        looped.extend_from_slice(&[0xc0, 0x0c]);
        assert!(parse_answer(&looped, 1).is_none());
    }
}
