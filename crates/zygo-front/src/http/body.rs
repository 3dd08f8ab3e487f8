//! Request bodies: at most [`MAX_BODY`] bytes, refused with 413 before anything is read
//! when the announced length is over it, and within [`BODY_TIMEOUT`] of the head (each
//! read also waits at most the connection's idle timeout). After its first second a body
//! must keep arriving at [`MIN_BODY_RATE`] on average, or it is dropped with 408: a
//! trickle cannot hold a worker for long. JSON bodies are strict: a key
//! named twice or a field the route does not take is 400, naming it.

use std::time::Instant;

use serde::de::DeserializeOwned;

use super::{HttpError, BODY_TIMEOUT, MAX_BODY, MIN_BODY_RATE};

fn too_large() -> HttpError {
    HttpError::new(
        413,
        "too_large",
        format!("the body is over {} MiB", MAX_BODY / (1024 * 1024)),
    )
}

/// Read the whole body.
pub fn read(rq: &mut tiny_http::Request) -> Result<Vec<u8>, HttpError> {
    if rq.body_length().is_some_and(|n| n > MAX_BODY) {
        return Err(too_large());
    }
    let started = Instant::now();
    let mut out = Vec::with_capacity(rq.body_length().unwrap_or(0).min(64 * 1024));
    let mut chunk = vec![0u8; 64 * 1024];
    let reader = rq.as_reader();
    loop {
        if started.elapsed() > BODY_TIMEOUT {
            return Err(HttpError::new(
                408,
                "bad_request",
                format!(
                    "the body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            ));
        }
        match reader.read(&mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => {
                if out.len() + n > MAX_BODY {
                    return Err(too_large());
                }
                out.extend_from_slice(&chunk[..n]);
                if too_slow(out.len(), started.elapsed()) {
                    log::warn!(
                        "dropped a request body arriving slower than {} KiB/s ({} bytes in {:.1} s)",
                        MIN_BODY_RATE / 1024,
                        out.len(),
                        started.elapsed().as_secs_f64()
                    );
                    return Err(HttpError::new(
                        408,
                        "bad_request",
                        format!(
                            "the body arrived slower than {} KiB/s; send it faster",
                            MIN_BODY_RATE / 1024
                        ),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                log::warn!(
                    "dropped a request body that stopped arriving ({} bytes in {:.1} s)",
                    out.len(),
                    started.elapsed().as_secs_f64()
                );
                return Err(HttpError::new(
                    408,
                    "bad_request",
                    "the body stopped arriving before it was complete",
                ));
            }
            Err(e) => {
                return Err(HttpError::bad_request(format!(
                    "the body could not be read: {e}"
                )))
            }
        }
    }
}

/// Whether `got` bytes after `elapsed` is under [`MIN_BODY_RATE`], counted after the
/// first second (the body may be complete before then at any rate).
fn too_slow(got: usize, elapsed: std::time::Duration) -> bool {
    let after = elapsed.saturating_sub(std::time::Duration::from_secs(1));
    (got as f64) < MIN_BODY_RATE as f64 * after.as_secs_f64()
}

/// Parse a JSON body strictly into `T` (whose fields say what the route takes).
pub fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    proto::json::from_slice_strict::<T>(bytes)
        .map_err(|e| HttpError::bad_request(format!("the body is not what this route takes: {e}")))
}

/// A JSON body that may be empty (then `T::default()`).
pub fn json_or_default<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, HttpError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    json(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_body_is_too_slow_only_after_its_first_second() {
        assert!(!too_slow(1, Duration::from_millis(900)));
        assert!(!too_slow(64 * 1024, Duration::from_secs(2)));
        assert!(too_slow(64 * 1024 - 1, Duration::from_secs(2)));
        assert!(too_slow(100_000, Duration::from_secs(30)));
    }
}
