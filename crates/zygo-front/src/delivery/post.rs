//! One HTTP/1.1 POST of a JSON body to an `http://IP:PORT/path` endpoint, with every step
//! bounded in time. A 2xx status is delivered; anything else (a refusal, a reset, a
//! timeout, another status) is not.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::Endpoint;

const CONNECT: Duration = Duration::from_secs(5);
const IO: Duration = Duration::from_secs(15);

pub fn post_json(to: &Endpoint, body: &[u8]) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&to.addr, CONNECT)
        .map_err(|e| format!("connect to {}: {e}", to.addr))?;
    s.set_read_timeout(Some(IO)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IO)).map_err(|e| e.to_string())?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: zygo-delivery\r\n\r\n",
        to.path,
        to.addr,
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .and_then(|()| s.flush())
        .map_err(|e| format!("send to {}: {e}", to.url))?;
    let mut r = BufReader::new(s.take(64 * 1024));
    let mut status = String::new();
    r.read_line(&mut status)
        .map_err(|e| format!("read the answer of {}: {e}", to.url))?;
    let code: u16 = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{} answered something that is not HTTP", to.url))?;
    if (200..300).contains(&code) {
        Ok(())
    } else {
        Err(format!("{} answered {code}", to.url))
    }
}
