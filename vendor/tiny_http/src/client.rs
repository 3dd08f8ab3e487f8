use ascii::AsciiString;

use std::io::Error as IoError;
use std::io::Result as IoResult;
use std::io::{BufReader, BufWriter, ErrorKind, Read};

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crate::limits::{own_error, Limits, PoisonCheck};

use crate::common::{HTTPVersion, Method};
use crate::util::RefinedTcpStream;
use crate::util::{SequentialReader, SequentialReaderBuilder, SequentialWriterBuilder};
use crate::Request;

/// A ClientConnection is an object that will store a socket to a client
/// and return Request objects.
pub struct ClientConnection {
    // address of the client
    remote_addr: IoResult<Option<SocketAddr>>,

    // sequence of Readers to the stream, so that the data is not read in
    //  the wrong order
    source: SequentialReaderBuilder<PoisonCheck<BufReader<RefinedTcpStream>>>,

    // sequence of Writers to the stream, to avoid writing response #2 before
    //  response #1
    sink: SequentialWriterBuilder<BufWriter<RefinedTcpStream>>,

    // Reader to read the next header from
    next_header_source: SequentialReader<PoisonCheck<BufReader<RefinedTcpStream>>>,

    // set to true if we know that the previous request is the last one
    no_more_requests: bool,

    // true if the connection goes through SSL
    secure: bool,

    // Zygo patch: the limits, and the flag a request's unread body sets to close the
    // connection after it.
    limits: Arc<Limits>,
    poisoned: Arc<AtomicBool>,

    // Zygo patch: the descriptor of the socket's write half, given to each request.
    #[cfg(unix)]
    write_fd: Option<std::os::unix::io::RawFd>,
}

/// Error that can happen when reading a request.
#[derive(Debug)]
enum ReadError {
    WrongRequestLine,
    WrongHeader(HTTPVersion),
    /// the client sent an unrecognized `Expect` header
    ExpectationFailed(HTTPVersion),
    ReadIoError(IoError),
    /// Zygo patch: a line or the head over its cap (the status to answer).
    TooLarge(u16, &'static str),
    /// Zygo patch: the head did not arrive in time after its first byte.
    HeadTimeout,
    /// Zygo patch: the connection was idle (no byte of a new request): close quietly.
    Idle,
    /// Zygo patch: the framing headers contradict themselves.
    BadFraming(&'static str),
}

impl ClientConnection {
    /// Creates a new `ClientConnection` that takes ownership of the `TcpStream`.
    pub fn new(
        write_socket: RefinedTcpStream,
        mut read_socket: RefinedTcpStream,
        limits: Arc<Limits>,
    ) -> ClientConnection {
        // Zygo patch: a peer that already went away has no address, rather than a panic.
        let remote_addr = Ok(read_socket.peer_addr().ok().flatten());
        let secure = read_socket.secure();
        let poisoned = Arc::new(AtomicBool::new(false));

        let mut source = SequentialReaderBuilder::new(PoisonCheck {
            inner: BufReader::with_capacity(1024, read_socket),
            poisoned: poisoned.clone(),
        });
        let first_header = source.next().unwrap();
        #[cfg(unix)]
        let write_fd = write_socket.raw_fd();

        ClientConnection {
            source,
            sink: SequentialWriterBuilder::new(BufWriter::with_capacity(1024, write_socket)),
            remote_addr,
            next_header_source: first_header,
            no_more_requests: false,
            secure,
            limits,
            poisoned,
            #[cfg(unix)]
            write_fd,
        }
    }

    /// true if the connection is HTTPS
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// Reads the next line from self.next_header_source.
    ///
    /// Reads until `CRLF` is reached. The next read will start
    ///  at the first byte of the new line.
    fn read_next_line(&mut self, started: &mut Option<Instant>) -> Result<AsciiString, ReadError> {
        // Zygo patch: a line has a cap, the head a deadline from its first byte, and a
        // socket timeout before any byte of a request is an idle connection, closed quietly.
        let mut buf = Vec::new();
        let mut prev_byte_was_cr = false;

        loop {
            let byte = self.next_header_source.by_ref().bytes().next();

            let byte = match byte {
                Some(Ok(b)) => b,
                Some(Err(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(if started.is_some() {
                        ReadError::HeadTimeout
                    } else {
                        ReadError::Idle
                    })
                }
                Some(Err(e)) => return Err(ReadError::ReadIoError(e)),
                None if started.is_none() => return Err(ReadError::Idle),
                None => {
                    return Err(ReadError::ReadIoError(IoError::new(
                        ErrorKind::ConnectionAborted,
                        "Unexpected EOF",
                    )))
                }
            };
            let t0 = *started.get_or_insert_with(Instant::now);
            if t0.elapsed() > self.limits.head_timeout {
                return Err(ReadError::HeadTimeout);
            }

            if byte == b'\n' && prev_byte_was_cr {
                buf.pop(); // removing the '\r'
                           // Zygo patch: answered 400, not closed without a word.
                return AsciiString::from_ascii(buf).map_err(|_| {
                    ReadError::TooLarge(
                        400,
                        "a request line or header has bytes that are not ASCII",
                    )
                });
            }

            prev_byte_was_cr = byte == b'\r';

            buf.push(byte);
            if buf.len() > self.limits.max_line {
                return Err(ReadError::TooLarge(
                    431,
                    "a request line or header line is over 8 KiB",
                ));
            }
        }
    }

    /// Reads a request from the stream.
    /// Blocks until the header has been read.
    fn read(&mut self) -> Result<Request, ReadError> {
        let mut started_at: Option<Instant> = None;
        let (method, path, version, headers) = {
            // reading the request line
            let (method, path, version) = {
                let line = self.read_next_line(&mut started_at)?;

                parse_request_line(
                    line.as_str().trim(), // TODO: remove this conversion
                )?
            };

            // getting all headers
            let headers = {
                let mut headers = Vec::new();
                loop {
                    let line = self.read_next_line(&mut started_at)?;

                    if line.is_empty() {
                        break;
                    };
                    if headers.len() >= self.limits.max_headers {
                        return Err(ReadError::TooLarge(
                            431,
                            "a request has more than 100 headers",
                        ));
                    }
                    headers.push(match FromStr::from_str(line.as_str().trim()) {
                        // TODO: remove this conversion
                        Ok(h) => h,
                        _ => return Err(ReadError::WrongHeader(version)),
                    });
                }

                headers
            };

            (method, path, version, headers)
        };

        // building the writer for the request
        let writer = self.sink.next().unwrap();

        // follow-up for next potential request
        let mut data_source = self.source.next().unwrap();
        std::mem::swap(&mut self.next_header_source, &mut data_source);

        // building the next reader
        let request = crate::request::new_request(
            self.secure,
            method,
            path,
            version.clone(),
            headers,
            self.remote_addr.as_ref().ok().copied().flatten(),
            data_source,
            writer,
            crate::request::BodyLimits {
                poisoned: self.poisoned.clone(),
                max_drain: self.limits.max_drain,
                own_headers: self.limits.own_headers,
            },
        )
        .map_err(|e| {
            use crate::request;
            match e {
                request::RequestCreationError::CreationIoError(e) => ReadError::ReadIoError(e),
                request::RequestCreationError::ExpectationFailed => {
                    ReadError::ExpectationFailed(version)
                }
                request::RequestCreationError::BadFraming(why) => ReadError::BadFraming(why),
            }
        })?;
        #[cfg(unix)]
        let request = request.with_connection_fd(self.write_fd);

        // return the request
        Ok(request)
    }
}

impl Iterator for ClientConnection {
    type Item = Request;

    /// Blocks until the next Request is available.
    /// Returns None when no new Requests will come from the client.
    fn next(&mut self) -> Option<Request> {
        // the client sent a "connection: close" header in this previous request
        //  or is using HTTP 1.0, meaning that no new request will come
        if self.no_more_requests {
            return None;
        }

        loop {
            // Zygo patch: the server's own answers are JSON errors that carry the own
            // headers and close the connection.
            let refuse = |this: &mut Self, status: u16, code: &str, msg: &str| {
                if let Some(writer) = this.sink.next() {
                    let response = own_error(&this.limits, status, code, msg);
                    response
                        .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                        .ok();
                }
            };
            let rq = match self.read() {
                Err(ReadError::WrongRequestLine) => {
                    refuse(self, 400, "bad_request", "the request line is not HTTP");
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::WrongHeader(_)) => {
                    refuse(self, 400, "bad_request", "a header line is malformed");
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::HeadTimeout) => {
                    refuse(
                        self,
                        408,
                        "bad_request",
                        "the request's head did not arrive in time",
                    );
                    return None; // closing the connection
                }

                Err(ReadError::TooLarge(status, msg)) => {
                    refuse(self, status, "bad_request", msg);
                    return None;
                }

                Err(ReadError::BadFraming(msg)) => {
                    refuse(self, 400, "bad_request", msg);
                    return None;
                }

                Err(ReadError::ExpectationFailed(_)) => {
                    refuse(
                        self,
                        417,
                        "bad_request",
                        "only `Expect: 100-continue` is understood",
                    );
                    return None; // TODO: should be recoverable, but needs handling in case of body
                }

                Err(ReadError::Idle) | Err(ReadError::ReadIoError(_)) => return None,

                Ok(rq) => rq,
            };

            // checking HTTP version
            if *rq.http_version() > (1, 1) {
                // Answered through the request itself: a second writer would wait for
                // this request's to finish.
                let response = own_error(
                    &self.limits,
                    505,
                    "bad_request",
                    "only HTTP/1.0 and HTTP/1.1 are served",
                );
                rq.respond(response).ok();
                return None;
            }

            // updating the status of the connection
            let connection_header = rq
                .headers()
                .iter()
                .find(|h| h.field.equiv("Connection"))
                .map(|h| h.value.as_str());

            let lowercase = connection_header.map(|h| h.to_ascii_lowercase());

            match lowercase {
                Some(ref val) if val.contains("close") => self.no_more_requests = true,
                Some(ref val) if val.contains("upgrade") => self.no_more_requests = true,
                Some(ref val)
                    if !val.contains("keep-alive") && *rq.http_version() == HTTPVersion(1, 0) =>
                {
                    self.no_more_requests = true
                }
                None if *rq.http_version() == HTTPVersion(1, 0) => self.no_more_requests = true,
                _ => (),
            };

            // returning the request
            return Some(rq);
        }
    }
}

/// Parses a "HTTP/1.1" string.
fn parse_http_version(version: &str) -> Result<HTTPVersion, ReadError> {
    let (major, minor) = match version {
        "HTTP/0.9" => (0, 9),
        "HTTP/1.0" => (1, 0),
        "HTTP/1.1" => (1, 1),
        "HTTP/2.0" => (2, 0),
        "HTTP/3.0" => (3, 0),
        _ => return Err(ReadError::WrongRequestLine),
    };

    Ok(HTTPVersion(major, minor))
}

/// Parses the request line of the request.
/// eg. GET / HTTP/1.1
fn parse_request_line(line: &str) -> Result<(Method, String, HTTPVersion), ReadError> {
    let mut parts = line.split(' ');

    let method = parts.next().and_then(|w| w.parse().ok());
    let path = parts.next().map(ToOwned::to_owned);
    let version = parts.next().and_then(|w| parse_http_version(w).ok());

    method
        .and_then(|method| Some((method, path?, version?)))
        .ok_or(ReadError::WrongRequestLine)
}

#[cfg(test)]
mod test {
    #[test]
    fn test_parse_request_line() {
        let (method, path, ver) = super::parse_request_line("GET /hello HTTP/1.1").unwrap();

        assert!(method == crate::Method::Get);
        assert!(path == "/hello");
        assert!(ver == crate::common::HTTPVersion(1, 1));

        assert!(super::parse_request_line("GET /hello").is_err());
        assert!(super::parse_request_line("qsd qsd qsd").is_err());
    }
}
