//! Which host a connection says it is for: the server name (SNI) of a TLS ClientHello, or
//! the `Host` header of an HTTP/1 request. Read from the first bytes the client sends,
//! without taking them off the socket (they are relayed as they are).

/// The most the filter reads ahead to find the host.
pub const MAX_PEEK: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniff {
    /// Not enough bytes yet to tell.
    NeedMore,
    /// The host the client named (as sent; the policy normalizes it).
    Host(String),
    /// Neither a ClientHello with SNI nor an HTTP request with a Host header.
    NoHost,
}

/// What the first bytes `b` of a connection say.
pub fn sniff(b: &[u8]) -> Sniff {
    match b.first() {
        None => Sniff::NeedMore,
        Some(0x16) => tls(b),
        Some(c) if c.is_ascii_uppercase() => http(b),
        Some(_) => Sniff::NoHost,
    }
}

fn tls(b: &[u8]) -> Sniff {
    if b.len() < 5 {
        return Sniff::NeedMore;
    }
    if b[1] != 3 {
        return Sniff::NoHost;
    }
    let len = usize::from(u16::from_be_bytes([b[3], b[4]]));
    if b.len() < 5 + len {
        return if 5 + len > MAX_PEEK {
            Sniff::NoHost
        } else {
            Sniff::NeedMore
        };
    }
    client_hello_sni(&b[5..5 + len]).map_or(Sniff::NoHost, Sniff::Host)
}

/// The server name of a ClientHello handshake message (in one record).
fn client_hello_sni(h: &[u8]) -> Option<String> {
    let mut r = Reader { b: h, i: 0 };
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let body_len = r.u24()?;
    let mut r = Reader {
        b: r.take(body_len)?,
        i: 0,
    };
    r.take(2 + 32)?; // version, random
    let sid = usize::from(r.u8()?);
    r.take(sid)?;
    let suites = usize::from(r.u16()?);
    r.take(suites)?;
    let comp = usize::from(r.u8()?);
    r.take(comp)?;
    let ext_len = usize::from(r.u16()?);
    let mut ext = Reader {
        b: r.take(ext_len)?,
        i: 0,
    };
    while ext.i < ext.b.len() {
        let kind = ext.u16()?;
        let len = usize::from(ext.u16()?);
        let data = ext.take(len)?;
        if kind != 0 {
            continue;
        }
        let mut sn = Reader { b: data, i: 0 };
        let list = usize::from(sn.u16()?);
        let mut list = Reader {
            b: sn.take(list)?,
            i: 0,
        };
        while list.i < list.b.len() {
            let name_type = list.u8()?;
            let len = usize::from(list.u16()?);
            let name = list.take(len)?;
            if name_type == 0 {
                return std::str::from_utf8(name).ok().map(str::to_string);
            }
        }
        return None;
    }
    None
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.i..self.i.checked_add(n)?)?;
        self.i += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_be_bytes([s[0], s[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|s| usize::from(s[0]) << 16 | usize::from(s[1]) << 8 | usize::from(s[2]))
    }
}

fn http(b: &[u8]) -> Sniff {
    let Some(end) = b.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if b.len() >= MAX_PEEK {
            Sniff::NoHost
        } else {
            Sniff::NeedMore
        };
    };
    let Ok(head) = std::str::from_utf8(&b[..end]) else {
        return Sniff::NoHost;
    };
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or("");
    if !request.ends_with("HTTP/1.1") && !request.ends_with("HTTP/1.0") {
        return Sniff::NoHost;
    }
    let mut hosts = lines.filter_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("host").then(|| v.trim())
    });
    let (Some(host), None) = (hosts.next(), hosts.next()) else {
        return Sniff::NoHost; // none, or more than one
    };
    let name = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    Sniff::Host(name.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A minimal ClientHello record naming `host`.
    pub fn client_hello(host: &str) -> Vec<u8> {
        let name = host.as_bytes();
        let mut sni = Vec::new();
        sni.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name);
        let mut ext = Vec::new();
        ext.extend_from_slice(&0u16.to_be_bytes());
        ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        ext.extend_from_slice(&sni);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn tls_server_names_are_found() {
        let rec = client_hello("pypi.org");
        assert_eq!(sniff(&rec), Sniff::Host("pypi.org".into()));
        assert_eq!(sniff(&rec[..rec.len() - 1]), Sniff::NeedMore);
        assert_eq!(sniff(&rec[..3]), Sniff::NeedMore);
        let mut broken = rec.clone();
        broken[6] = 0xff; // a body longer than the record
        assert_eq!(sniff(&broken), Sniff::NoHost);
    }

    #[test]
    fn every_prefix_and_every_corruption_is_answered_without_panic() {
        let rec = client_hello("a.example");
        for end in 0..=rec.len() {
            let _ = sniff(&rec[..end]);
        }
        for i in 0..rec.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut bad = rec.clone();
                bad[i] = v;
                let _ = sniff(&bad);
            }
        }
        let mut huge = vec![0x16, 3, 1, 0xff, 0xff];
        huge.resize(MAX_PEEK, 0);
        assert_eq!(sniff(&huge), Sniff::NoHost);
        let long_http = [b"GET / HTTP/1.1\r\n".as_slice(), &[b'a'; MAX_PEEK]].concat();
        assert_eq!(sniff(&long_http), Sniff::NoHost);
    }

    #[test]
    fn http_hosts_are_found() {
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nhost: a.example:8080\r\n\r\n"),
            Sniff::Host("a.example".into())
        );
        assert_eq!(sniff(b"GET / HTTP/1.1\r\nHost: a\r\n"), Sniff::NeedMore);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\nX: y\r\n\r\n"), Sniff::NoHost);
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            Sniff::NoHost
        );
        assert_eq!(sniff(b"SSH-2.0-x\r\n\r\n"), Sniff::NoHost);
        assert_eq!(sniff(b"\x00\x01"), Sniff::NoHost);
    }
}
