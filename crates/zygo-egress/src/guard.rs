//! Every request on a cleartext HTTP connection that a name rule let through, checked as
//! its bytes pass: the first request's `Host` opened the connection, and each later one on
//! the same connection (keep-alive, pipelining) must name the same host, or the connection
//! is reset. The guard follows the requests' own framing (`Content-Length`, chunked) to
//! find where each request ends and the next head begins, and refuses whatever it cannot
//! read unambiguously (see [`crate::sniff::request_head`]): every line of a head, a chunk
//! size or a trailer section must end in CRLF, with no bare CR or LF anywhere, since some
//! servers end lines at a bare LF. The bytes of a head, a chunk-size line or a trailer
//! section are held back until they are complete and checked; body bytes go on as they
//! come. Nothing is changed: what goes on is what came.

use crate::sniff::{request_head, Body, MAX_PEEK};

/// The longest chunk-size line taken (size, extensions and CRLF).
const MAX_CHUNK_LINE: usize = 1024;

#[derive(Debug)]
enum State {
    /// Reading a request head into `buf`.
    Head,
    /// This many body bytes still to pass.
    Body(u64),
    /// Reading a chunk-size line into `buf`.
    ChunkSize,
    /// This many bytes of chunk data still to pass, then its CRLF.
    ChunkData(u64),
    /// The CRLF after a chunk's data: how many of its two bytes have passed.
    ChunkEnd(u8),
    /// Reading the trailer section (ended by an empty line) into `buf`.
    Trailers,
}

/// The checker of one connection's client-to-server bytes.
#[derive(Debug)]
pub struct Requests {
    host: String,
    state: State,
    buf: Vec<u8>,
}

impl Requests {
    /// For a connection opened by a request naming `host` (not yet fed: the first request
    /// passes through the guard too).
    pub fn new(host: &str) -> Requests {
        Requests {
            host: policy::egress::normal_name(host),
            state: State::Head,
            buf: Vec::new(),
        }
    }

    /// Check the next bytes the client sent, appending to `out` those that may go on now
    /// (held bytes of a head or line follow once it is complete and checked). An error
    /// says why the connection must end; nothing more may be passed on then.
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        while !data.is_empty() {
            data = match self.state {
                State::Head => self.head(data, out)?,
                State::Body(n) => {
                    let k = take(n, data);
                    out.extend_from_slice(&data[..k]);
                    self.state = if n == k as u64 {
                        State::Head
                    } else {
                        State::Body(n - k as u64)
                    };
                    &data[k..]
                }
                State::ChunkSize => self.chunk_size(data, out)?,
                State::ChunkData(n) => {
                    let k = take(n, data);
                    out.extend_from_slice(&data[..k]);
                    self.state = if n == k as u64 {
                        State::ChunkEnd(0)
                    } else {
                        State::ChunkData(n - k as u64)
                    };
                    &data[k..]
                }
                State::ChunkEnd(seen) => {
                    let want = if seen == 0 { b'\r' } else { b'\n' };
                    if data[0] != want {
                        return Err("a chunk's data is not followed by CRLF".into());
                    }
                    out.push(data[0]);
                    self.state = if seen == 0 {
                        State::ChunkEnd(1)
                    } else {
                        State::ChunkSize
                    };
                    &data[1..]
                }
                State::Trailers => self.trailers(data, out)?,
            };
        }
        Ok(())
    }

    fn head<'d>(&mut self, data: &'d [u8], out: &mut Vec<u8>) -> Result<&'d [u8], String> {
        let (used, done) = gather(&mut self.buf, data, b"\r\n\r\n", MAX_PEEK + 4)
            .map_err(|why| format!("a request head with {why}"))?;
        if done {
            let head = request_head(&self.buf[..self.buf.len() - 4])
                .map_err(|why| format!("a later request on the connection has {why}"))?;
            if policy::egress::normal_name(&head.host) != self.host {
                return Err(format!(
                    "a later request on the connection names another host, {:?}",
                    head.host
                ));
            }
            out.append(&mut self.buf);
            self.state = match head.body {
                Body::None => State::Head,
                Body::Length(n) => State::Body(n),
                Body::Chunked => State::ChunkSize,
            };
        }
        Ok(&data[used..])
    }

    fn chunk_size<'d>(&mut self, data: &'d [u8], out: &mut Vec<u8>) -> Result<&'d [u8], String> {
        let (used, done) = gather(&mut self.buf, data, b"\r\n", MAX_CHUNK_LINE)
            .map_err(|why| format!("a chunk-size line with {why}"))?;
        if done {
            let line = &self.buf[..self.buf.len() - 2];
            let size = line.split(|&c| c == b';').next().unwrap_or_default();
            if size.is_empty()
                || size.len() > 15
                || !size.iter().all(u8::is_ascii_hexdigit)
                || line.iter().any(|&c| c == b'\r' || c == b'\n' || c == 0)
            {
                return Err("a chunk size that is not a hexadecimal number".into());
            }
            let text = std::str::from_utf8(size).map_err(|_| "a chunk size that is not text")?;
            let n = u64::from_str_radix(text, 16).map_err(|_| "a chunk size out of range")?;
            out.append(&mut self.buf);
            self.state = if n == 0 {
                State::Trailers
            } else {
                State::ChunkData(n)
            };
        }
        Ok(&data[used..])
    }

    fn trailers<'d>(&mut self, data: &'d [u8], out: &mut Vec<u8>) -> Result<&'d [u8], String> {
        // The trailer section is either a lone CRLF or header lines ending in CRLFCRLF.
        let mut used = 0;
        for &c in data {
            used += 1;
            push_strict(&mut self.buf, c)
                .map_err(|why| format!("a chunked body's trailers with {why}"))?;
            if self.buf.len() > MAX_PEEK {
                return Err("a chunked body's trailers over 16 KiB".into());
            }
            if self.buf == b"\r\n" || self.buf.ends_with(b"\r\n\r\n") {
                if self.buf.len() > 2 && self.buf[..self.buf.len() - 4].contains(&0) {
                    return Err("a NUL in a chunked body's trailers".into());
                }
                out.append(&mut self.buf);
                self.state = State::Head;
                break;
            }
        }
        Ok(&data[used..])
    }
}

/// How many of `n` wanted bytes `data` holds.
fn take(n: u64, data: &[u8]) -> usize {
    usize::try_from(n).map_or(data.len(), |n| n.min(data.len()))
}

/// Append `data` to `buf` up to and including the first `end` (which may straddle what
/// `buf` already held): how many bytes of `data` were used, and whether `end` was reached.
/// An error when a line does not end in CRLF, or `buf` would pass `cap` first.
fn gather(
    buf: &mut Vec<u8>,
    data: &[u8],
    end: &[u8],
    cap: usize,
) -> Result<(usize, bool), &'static str> {
    let mut used = 0;
    for &c in data {
        used += 1;
        push_strict(buf, c)?;
        if buf.ends_with(end) {
            return Ok((used, true));
        }
        if buf.len() >= cap {
            return Err("no end within its size limit");
        }
    }
    Ok((used, false))
}

/// Append `c` to `buf`, refusing a CR not followed by LF and an LF not after a CR.
fn push_strict(buf: &mut Vec<u8>, c: u8) -> Result<(), &'static str> {
    let after_cr = buf.last() == Some(&b'\r');
    if after_cr && c != b'\n' {
        return Err("a bare CR");
    }
    if c == b'\n' && !after_cr {
        return Err("a bare LF");
    }
    buf.push(c);
    Ok(())
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `stream` whole, then byte by byte, then in uneven pieces: the answer must not
    /// depend on how the bytes arrive, and what is passed on is always a prefix of the
    /// stream (all of it when it is accepted).
    fn check(host: &str, stream: &[u8]) -> Result<(), String> {
        let mut out = Vec::new();
        let whole = Requests::new(host).feed(stream, &mut out);
        if whole.is_ok() {
            assert_eq!(out, stream);
        }
        let mut one = Requests::new(host);
        let mut out1 = Vec::new();
        let bytes = stream.iter().try_for_each(|b| one.feed(&[*b], &mut out1));
        assert_eq!(whole.is_ok(), bytes.is_ok(), "{whole:?} vs {bytes:?}");
        assert!(stream.starts_with(&out1));
        let mut odd = Requests::new(host);
        let mut out2 = Vec::new();
        let mut rest = stream;
        let mut pieces = Ok(());
        let mut k = 1;
        while !rest.is_empty() && pieces.is_ok() {
            let n = k.min(rest.len());
            pieces = odd.feed(&rest[..n], &mut out2);
            rest = &rest[n..];
            k = k * 3 % 17 + 1;
        }
        assert_eq!(whole.is_ok(), pieces.is_ok(), "{whole:?} vs {pieces:?}");
        assert!(stream.starts_with(&out2));
        whole
    }

    /// What is passed on of `stream` fed whole.
    fn passed(host: &str, stream: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut g = Requests::new(host);
        let mut rest = stream;
        while !rest.is_empty() {
            if g.feed(&rest[..1], &mut out).is_err() {
                break;
            }
            rest = &rest[1..];
        }
        out
    }

    #[test]
    fn requests_for_the_same_host_pass_in_any_framing() {
        let stream = [
            &b"GET /a HTTP/1.1\r\nHost: a.example\r\n\r\n"[..],
            b"POST /b HTTP/1.1\r\nHost: A.EXAMPLE:80\r\nContent-Length: 11\r\n\r\nHost: other",
            b"PUT /c HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"5;x=y\r\nHost:\r\n10\r\nGET / HTTP/1.1\r\n\r\n0\r\nX-T: 1\r\n\r\n",
            b"PUT /d HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"GET /e HTTP/1.0\r\nHost: a.example.\r\n\r\n",
        ]
        .concat();
        check("a.example", &stream).unwrap();
    }

    #[test]
    fn a_later_request_for_another_host_ends_the_connection() {
        for stream in [
            // Pipelined, and after a body whose bytes look like a request.
            &b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\nGET / HTTP/1.1\r\nHost: other.example\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\nHost: other.example\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: other.example\r\n\r\n",
            // The absolute form, a smuggling attempt, a bad chunk.
            b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\nGET http://other.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiXX",
            // Lines ended by a bare LF (which some servers take): in a head, in a chunk-size
            // line, and after the last chunk.
            b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\nGET /x HTTP/1.1\nHost: other.example\n\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n0\n\nGET / HTTP/1.1\nHost: other.example\n\n",
            b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\nGET / HTTP/1.1\r\nHost: other.example\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\nGET / HTTP/1.1\r\nHost: other.example\r\n\n",
            b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\nGET / HTTP/1.1\rHost: other.example\r\n\r\n",
            // Not HTTP after all, and a first request for another host.
            b"\x16\x03\x01\x00\x05hello\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n",
        ] {
            assert!(
                check("a.example", stream).is_err(),
                "{:?}",
                String::from_utf8_lossy(stream)
            );
        }
    }

    /// A head is passed on only once it is complete and checked: an unfinished one is
    /// held back, so no server sees a request the guard has not read.
    #[test]
    fn an_unfinished_head_is_held_back() {
        let first = b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n";
        let stream = [&first[..], b"GET /x HTTP/1.1\r\nHost: other.example"].concat();
        assert_eq!(passed("a.example", &stream), first);
        let chunked = b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n";
        let stream = [&chunked[..], b"4\r\ndata\r\n0\r\nX-T: 1\r\n"].concat();
        let expect = [&chunked[..], b"4\r\ndata\r\n0\r\n"].concat();
        assert_eq!(passed("a.example", &stream), expect);
    }

    #[test]
    fn heads_and_lines_are_capped() {
        let mut big = b"GET / HTTP/1.1\r\nHost: a.example\r\nX: ".to_vec();
        big.resize(MAX_PEEK + 100, b'a');
        assert!(Requests::new("a.example")
            .feed(&big, &mut Vec::new())
            .is_err());
        let mut chunk =
            b"PUT / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n1".to_vec();
        chunk.resize(chunk.len() + 2000, b'0');
        assert!(Requests::new("a.example")
            .feed(&chunk, &mut Vec::new())
            .is_err());
        // A large body passes without being held: only the framing is followed.
        let mut body =
            b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1000000\r\n\r\n".to_vec();
        body.resize(body.len() + 1_000_000, b'x');
        let mut g = Requests::new("a.example");
        let mut out = Vec::new();
        g.feed(&body, &mut out).unwrap();
        assert_eq!(out, body);
        assert!(g.buf.capacity() <= MAX_PEEK + 4);
    }
}
