//! Raw HTTP/1.1 for tests of `zygo api`: a request head written by hand, an answer read
//! back by its Content-Length or chunks. Deliberately small and literal, so a test can
//! also send what no well-behaved client would (a body announced and never sent, a
//! connection held open) with the same pieces.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

/// An answer: its status, headers (names in lower case) and body.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The body as JSON; panics with (the start of) the body if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(2000)])
            )
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value, by its name in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// A request's head: `Host` (`t`, unless `extra` names one), `Content-Length: len`, `Authorization: Bearer` with `token`
/// if there is one, then `extra`, then the blank line.
pub fn head(
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
    len: usize,
) -> String {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if !extra.iter().any(|(k, _)| k.eq_ignore_ascii_case("Host")) {
        head.push_str("Host: t\r\n");
    }
    head.push_str(&format!("Content-Length: {len}\r\n"));
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// One answer from `r`: the status line, the headers, and the body by its chunks or its
/// Content-Length (an answer with neither has an empty body here: the connection may go
/// on). The end of the stream before a status line is `UnexpectedEof`.
pub fn read_resp(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed before an answer",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
    let mut headers = HashMap::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l)?;
        let l = l.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| bad(format!("bad header line {l:?}")))?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let mut body = Vec::new();
    if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        loop {
            let mut l = String::new();
            r.read_line(&mut l)?;
            let n = usize::from_str_radix(l.trim(), 16)
                .map_err(|e| bad(format!("bad chunk size {l:?}: {e}")))?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = headers.get("content-length") {
        let n: usize = n
            .parse()
            .map_err(|e| bad(format!("bad Content-Length {n:?}: {e}")))?;
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    }
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// One request on a connection of its own (`Connection: close`), answered within `secs`
/// or the test fails: see [`head`] for what it sends. An answer with neither chunks nor
/// a Content-Length is read to the connection's end.
pub fn req_within(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
    body: &(impl AsRef<[u8]> + ?Sized),
    secs: u64,
) -> Resp {
    let body = body.as_ref();
    let what = format!("{method} {path} to {addr}");
    let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{what}: connect: {e}"));
    c.set_read_timeout(Some(Duration::from_secs(secs)))
        .unwrap_or_else(|e| panic!("{what}: set a read timeout: {e}"));
    let mut extra = extra.to_vec();
    extra.push(("Connection", "close"));
    c.write_all(head(method, path, token, &extra, body.len()).as_bytes())
        .and_then(|()| c.write_all(body))
        .unwrap_or_else(|e| panic!("{what}: send: {e}"));
    let mut r = BufReader::new(c);
    let mut resp = read_resp(&mut r).unwrap_or_else(|e| panic!("{what}: no answer: {e}"));
    if resp.header("transfer-encoding").is_none() && resp.header("content-length").is_none() {
        r.read_to_end(&mut resp.body)
            .unwrap_or_else(|e| panic!("{what}: read the body: {e}"));
    }
    resp
}

/// [`req_within`] 90 seconds.
pub fn req(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
    body: &(impl AsRef<[u8]> + ?Sized),
) -> Resp {
    req_within(addr, method, path, token, extra, body, 90)
}
