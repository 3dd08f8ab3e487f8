//! Usage and metrics delivery for `zygo api` (`--usage-webhook`, `--otlp-endpoint`), off
//! the serving path.
//!
//! Before the front confines itself it forks `zygo-delivery`, a process of its own fed
//! through a pipe. The front's side ([`Feed`]) only ever writes one whole line at a time
//! to the pipe's non-blocking end: a call's usage record when its answer comes back, and
//! the front's own request counts every few seconds. A full pipe drops the line (counted,
//! and logged as the count grows); the front never waits for delivery.
//!
//! The delivery process ([`run`]) confines itself first (no capabilities, Landlock with no
//! filesystem and TCP connect only to the endpoints' ports where the kernel's ABI has it,
//! a seccomp table of its own: [`allowlist`]), then:
//! - keeps the usage events in a queue of at most [`MAX_QUEUE`] (the oldest dropped first,
//!   the count logged) and POSTs them to the webhook as JSON arrays of at most [`BATCH`],
//!   in order; a batch that fails goes back on the front of the queue, in order, and is
//!   sent again after a pause that grows to [`MAX_BACKOFF`]. So delivery is at least once:
//!   a receiver keys on `request_id`;
//! - every [`OTLP_EVERY`] POSTs the numbers (cumulative sums, so a lost push loses
//!   nothing) as OTLP/HTTP JSON metrics.
//!
//! Only `http://IP:PORT/path` endpoints: a static binary cannot resolve host names (no
//! NSS), and no TLS stack is linked in.

mod otlp;
mod post;
pub mod process;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

pub use process::{allowlist, run};

/// The most usage events held for the webhook.
pub const MAX_QUEUE: usize = 10_000;
/// The most events in one POST.
pub const BATCH: usize = 100;
/// The longest pause between failed webhook deliveries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often the OTLP numbers are pushed.
pub const OTLP_EVERY: Duration = Duration::from_secs(10);
/// A line on the pipe is written in one `write`, whole or not at all: at most this long
/// (PIPE_BUF, so the kernel never splits it).
pub const MAX_LINE: usize = 4096;

/// Where a delivery goes: `http://IP:PORT/path`, parsed, never resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub path: String,
    /// As given, for messages.
    pub url: String,
}

/// Parse `--usage-webhook` or `--otlp-endpoint`'s value.
pub fn parse_endpoint(flag: &str, url: &str) -> Result<Endpoint, String> {
    if url.starts_with("https://") {
        return Err(format!(
            "--{flag} {url}: https is not supported (zygo api links no TLS stack); give http://IP:PORT/path, e.g. to a local collector or proxy that forwards over TLS"
        ));
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!("--{flag} {url}: give http://IP:PORT/path"));
    };
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = hostport.parse().map_err(|_| {
        format!(
            "--{flag} {url}: {hostport:?} is not IP:PORT; host names are not resolved (zygo is a static binary with no NSS), so give the address, e.g. http://127.0.0.1:4318/v1/metrics or http://[::1]:8080/usage"
        )
    })?;
    if addr.port() == 0 {
        return Err(format!("--{flag} {url}: port 0 is not a port"));
    }
    if path.len() > 1024 || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "--{flag} {url}: the path must be printable ASCII without spaces, at most 1024 bytes"
        ));
    }
    Ok(Endpoint {
        addr,
        path: path.to_string(),
        url: url.to_string(),
    })
}

/// The front's end of the pipe to `zygo-delivery`.
pub struct Feed {
    fd: OwnedFd,
    dropped: AtomicU64,
}

static FEED: OnceLock<Feed> = OnceLock::new();

impl Feed {
    /// Set the process's feed (once, before serving).
    pub fn install(fd: OwnedFd) {
        let _ = FEED.set(Feed {
            fd,
            dropped: AtomicU64::new(0),
        });
    }

    /// Write one line (a newline is added) without ever blocking: whole, or dropped and
    /// counted.
    fn send(&self, mut line: String) {
        line.push('\n');
        if line.len() > MAX_LINE {
            self.drop_one("a line longer than the pipe writes whole");
            return;
        }
        // SAFETY: write on the pipe's write end, which this process holds, from a valid
        // buffer of the given length. The descriptor is non-blocking.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), line.as_ptr().cast(), line.len()) };
        if n < 0 || n as usize != line.len() {
            self.drop_one("the delivery process is behind (its pipe is full) or gone");
        }
    }

    fn drop_one(&self, why: &str) {
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 || n.is_power_of_two() {
            log::warn!("usage delivery: {n} events dropped before delivery: {why}; they are in the supervisor's usage.log");
        }
    }
}

/// A finished call's usage record, for delivery (nothing when no delivery is set up).
pub fn usage(rec: &Option<Box<proto::api::UsageRecord>>) {
    if let (Some(feed), Some(rec)) = (FEED.get(), rec) {
        feed.send(format!("{{\"usage\":{}}}", rec.json_line()));
    }
}

/// The front's own counts, for the OTLP push.
pub fn api_counts(requests: u64, errors: u64) {
    if let Some(feed) = FEED.get() {
        feed.send(format!("{{\"api\":[{requests},{errors}]}}"));
    }
}

/// Whether a feed is installed.
pub fn enabled() -> bool {
    FEED.get().is_some()
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_ip_port_endpoints() {
        let e = parse_endpoint("usage-webhook", "http://127.0.0.1:9000/usage").unwrap();
        assert_eq!(e.addr, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(e.path, "/usage");
        let e = parse_endpoint("otlp-endpoint", "http://[::1]:4318").unwrap();
        assert_eq!(e.path, "/");
        let https = parse_endpoint("usage-webhook", "https://1.2.3.4:443/x").unwrap_err();
        assert!(https.contains("https is not supported"), "{https}");
        let name = parse_endpoint("usage-webhook", "http://billing.example:80/x").unwrap_err();
        assert!(name.contains("host names are not resolved"), "{name}");
        assert!(parse_endpoint("usage-webhook", "ftp://1.2.3.4/x").is_err());
        assert!(parse_endpoint("usage-webhook", "http://1.2.3.4:0/x").is_err());
        assert!(parse_endpoint("usage-webhook", "http://1.2.3.4:80/a b").is_err());
    }
}
