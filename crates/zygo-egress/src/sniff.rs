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
    match request_head(&b[..end]) {
        Ok(head) => Sniff::Host(head.host),
        Err(_) => Sniff::NoHost,
    }
}

/// How the body of a request is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
}

/// What the filter takes from an HTTP/1 request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The `Host` header's host, without its port (as sent; the policy normalizes it).
    pub host: String,
    pub body: Body,
}

/// Parse one request head (everything before its blank line) strictly enough that every
/// server reading the same bytes finds the same host and the same end of the request: a
/// request line `METHOD /path HTTP/1.x` (an origin-form target, or `*`; not the absolute
/// form `GET http://other/`, which servers must prefer to `Host`, and not `CONNECT`),
/// lines ended by CRLF with no bare CR or LF, no folded lines, exactly one `Host`, at most
/// one `Content-Length` or one `Transfer-Encoding: chunked` and never both, and no
/// `Upgrade` (after a protocol switch the bytes are no longer requests the filter can
/// read). The error says what was wrong.
pub fn request_head(head: &[u8]) -> Result<Head, &'static str> {
    if head.len() > MAX_PEEK {
        return Err("a request head over 16 KiB");
    }
    let mut lines = Vec::new();
    let mut rest = head;
    loop {
        match rest.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                lines.push(&rest[..i]);
                rest = &rest[i + 2..];
            }
            None => {
                lines.push(rest);
                break;
            }
        }
    }
    if lines
        .iter()
        .any(|l| l.iter().any(|&c| c == b'\r' || c == b'\n' || c == 0))
    {
        return Err("a bare CR, LF or NUL in the request head");
    }
    let request = lines[0];
    let mut parts = request.split(|&c| c == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("a request line that is not METHOD TARGET VERSION");
    };
    if method.is_empty() || !method.iter().all(u8::is_ascii_uppercase) {
        return Err("a method that is not an upper-case word");
    }
    if method == b"CONNECT" {
        return Err("CONNECT is not relayed on a name rule");
    }
    // A path, but not one starting `//`, which some servers read as naming a host.
    let origin_form = target.first() == Some(&b'/') && target.get(1) != Some(&b'/');
    let asterisk = target == b"*" && method == b"OPTIONS";
    if !(origin_form || asterisk) || !target.iter().all(|c| c.is_ascii_graphic()) {
        return Err("a request target that is not a path (the absolute form names another host)");
    }
    if version != b"HTTP/1.1" && version != b"HTTP/1.0" {
        return Err("not HTTP/1.0 or HTTP/1.1");
    }
    let mut host = None;
    let mut length = None;
    let mut chunked = false;
    for line in &lines[1..] {
        if line.first().is_some_and(|c| *c == b' ' || *c == b'\t') {
            return Err("a folded header line");
        }
        let Some(colon) = line.iter().position(|&c| c == b':') else {
            return Err("a header line without a colon");
        };
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&c| is_tchar(c)) {
            return Err("a header name with characters a token may not have");
        }
        let value = trim(&line[colon + 1..]);
        if name.eq_ignore_ascii_case(b"host") {
            if host.is_some() {
                return Err("more than one Host");
            }
            host = Some(value);
        } else if name.eq_ignore_ascii_case(b"content-length") {
            if length.is_some() {
                return Err("more than one Content-Length");
            }
            if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
                return Err("a Content-Length that is not a number");
            }
            let text =
                std::str::from_utf8(value).map_err(|_| "a Content-Length that is not a number")?;
            length = Some(
                text.parse::<u64>()
                    .map_err(|_| "a Content-Length that is not a number")?,
            );
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if chunked || !value.eq_ignore_ascii_case(b"chunked") {
                return Err("a Transfer-Encoding other than one chunked");
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            return Err("a protocol upgrade, which is not relayed on a name rule");
        } else if name.eq_ignore_ascii_case(b"expect") {
            // A server that answers the expectation with a final status may take the body
            // that follows for the next request.
            return Err("an Expect header, which is not relayed on a name rule");
        }
    }
    if chunked && length.is_some() {
        return Err("both Content-Length and Transfer-Encoding");
    }
    if chunked && version == b"HTTP/1.0" {
        return Err("Transfer-Encoding in an HTTP/1.0 request");
    }
    // Some servers ignore the body of a method that has no use for one and read its bytes
    // as the next request: such a request may not carry one.
    let bodiless = matches!(method, b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE");
    if bodiless && (chunked || length.is_some_and(|n| n > 0)) {
        return Err("a body on a method that takes none");
    }
    let Some(host) = host else {
        return Err("no Host");
    };
    let host = std::str::from_utf8(host).map_err(|_| "a Host that is not text")?;
    let name = match host.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    if name.is_empty()
        || !name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-' || c == b'_')
    {
        return Err("a Host that is not a host name");
    }
    let body = match (chunked, length) {
        (true, _) => Body::Chunked,
        (false, Some(0)) | (false, None) => Body::None,
        (false, Some(n)) => Body::Length(n),
    };
    Ok(Head {
        host: name.to_string(),
        body,
    })
}

/// A character of an HTTP token (RFC 9110, 5.6.2).
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|c| *c != b' ' && *c != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|c| *c != b' ' && *c != b'\t')
        .map_or(start, |i| i + 1);
    &v[start..end.max(start)]
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
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

    /// Every way two servers could disagree about which host a request is for, or where it
    /// ends, is refused.
    #[test]
    fn ambiguous_requests_name_no_host() {
        for bad in [
            // The absolute form: servers must take its host over Host.
            &b"GET http://other.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n"[..],
            b"GET //other.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n".as_slice(),
            b"CONNECT other.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n",
            // A bare LF or CR hiding a second Host from a strict parser.
            b"GET / HTTP/1.1\r\nHost: a.example\nHost: other.example\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: y\rHost: other.example\r\nHost: a.example\r\n\r\n",
            // Folding, odd names, spacing.
            b"GET / HTTP/1.1\r\nHost: a.example\r\n other.example\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n",
            b"GET  / HTTP/1.1\r\nHost: a.example\r\n\r\n",
            b"get / HTTP/1.1\r\nHost: a.example\r\n\r\n",
            b"GET / HTTP/2.0\r\nHost: a.example\r\n\r\n",
            // Framing two servers could read differently.
            b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            // A protocol switch, after which the bytes are not requests.
            b"GET / HTTP/1.1\r\nHost: a.example\r\nUpgrade: websocket\r\n\r\n",
            // Bodies a server might read as the next request.
            b"GET / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 40\r\n\r\n",
            b"HEAD / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nExpect: 100-continue\r\nContent-Length: 9\r\n\r\n",
            b"POST / HTTP/1.0\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n",
            // Hosts that are not host names.
            b"GET / HTTP/1.1\r\nHost: a.example@other.example\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
        ] {
            assert_eq!(sniff(bad), Sniff::NoHost, "{:?}", String::from_utf8_lossy(bad));
        }
        let ok = b"POST /upload?x=1 HTTP/1.1\r\nHost: A.example:8080\r\nContent-Length: 3\r\n\r\n";
        let head = request_head(&ok[..ok.len() - 4]).unwrap();
        assert_eq!(head.host, "A.example");
        assert_eq!(head.body, Body::Length(3));
        let chunked = b"PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n";
        assert_eq!(
            request_head(&chunked[..chunked.len() - 4]).unwrap().body,
            Body::Chunked
        );
        assert_eq!(
            sniff(b"OPTIONS * HTTP/1.0\r\nHost: a.example\r\n\r\n"),
            Sniff::Host("a.example".into())
        );
    }
}
