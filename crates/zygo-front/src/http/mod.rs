//! `zygo api`'s HTTP front: tiny_http parses HTTP, [`routes::ROUTES`] names every route
//! with who may call it, and each handler turns one request into one `proto` message for
//! the supervisor ([`channel`]) and its reply back into JSON. Nothing here decides who a
//! caller is or what they may do: the token and `X-Zygo-Tenant` are forwarded as they
//! came, around every request (`Request::Api`), and the supervisor answers.
//!
//! What the front does own is the shape of HTTP: caps on sizes and times, strict JSON
//! (an unknown field or a key named twice is 400), the status codes and error bodies, the
//! `X-Zygo-Request-Id` on every response, streaming as NDJSON.

pub mod answer;
pub mod base64;
pub mod bodies;
pub mod body;
pub mod channel;
pub mod fair;
pub mod handlers;
pub mod metrics;
pub mod openapi;
pub mod routes;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mcp::jsonrpc::excerpt;
use proto::api::{Credentials, FrontFlags};
use proto::front::{ErrorCode, Request};
use serde_json::{json, Value};
use tiny_http::{Header, Method};

/// The largest request body (JSON or raw), as the seed says.
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// `X-Zygo-Timeout-Ms` when the caller sends none.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// The most `X-Zygo-Timeout-Ms` may say: 24 hours.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// The longest `X-Zygo-Request-Key`.
pub const MAX_KEY_LEN: usize = 128;
/// How long in-flight requests may go on after SIGTERM.
pub const STOP_GRACE: Duration = Duration::from_secs(25);
/// How long an idle keep-alive connection is kept.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// From the end of a request's head to the end of its body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// The fewest worker threads (each serves one request at a time).
pub const WORKERS_MIN: usize = 64;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections served at once from one peer address.
pub const MAX_CONNECTIONS_PER_PEER: usize = MAX_CONNECTIONS / 4;
/// Of the workers, the share one caller's requests may hold at once (from the head's
/// arrival until the answer is written), and one peer address's: a quarter each.
pub const PLACES_PER_CALLER_DIV: usize = 4;
/// Of the workers, the share requests of callers not known yet (tokens the supervisor has
/// not recently vouched for, or none) may hold together: an eighth. Past it such a request
/// is first checked with the supervisor, then counted as its caller.
pub const PLACES_UNKNOWN_DIV: usize = 8;
/// Of the workers, the share all requests together may hold (three quarters): the rest
/// answer refusals at once, so a refusal never waits for a worker.
pub const PLACES_ALL_NUM: usize = 3;
/// After its first second, a body must keep arriving at this many bytes a second on
/// average (counted from that first second), or it is dropped with 408.
pub const MIN_BODY_RATE: usize = 64 * 1024;
/// The longest a request waits for a free channel to the supervisor before it is answered
/// 429 (never the caller's own deadline: a worker waiting is a worker nobody else has).
pub const ACQUIRE_WAIT: Duration = Duration::from_secs(2);
/// The longest a request whose caller holds its share of the channels to the supervisor
/// waits (never past its own deadline) for one of them to be free before it is answered
/// 429: long enough for a burst of a caller's calls to be served in turn, short enough
/// that a caller whose calls never end hears so.
pub const SHARE_WAIT: Duration = Duration::from_secs(30);
/// How long the supervisor may take to say who a caller is, before its body is read.
pub const AUTH_WAIT: Duration = Duration::from_secs(10);
/// Beyond the caller's deadline, how long the front waits for the supervisor's answer to a
/// call (the supervisor enforces the deadline itself and answers `timeout`).
pub const ANSWER_GRACE: Duration = Duration::from_secs(15);

/// The front's shared state.
pub struct Front {
    pub chans: std::sync::Arc<channel::Pool>,
    /// Channels one credential may hold at once: a quarter of them.
    pub shares: fair::Shares,
    /// Requests being served per caller, per address and in all.
    pub places: Arc<fair::Places>,
    /// Refusals for want of a place, logged at most once a second.
    pub refusals: fair::RefusalLog,
    /// Credentials the supervisor recently said it knows.
    pub auth: fair::AuthCache,
    /// What each caller's batch answers hold at once, all its batches together.
    pub answers: Arc<fair::AnswerBudgets>,
    pub flags: FrontFlags,
    /// The listener is a loopback address: with `--no-auth`, a request there must name a
    /// loopback host in `Host` (which a page of another site that had its name resolve to
    /// this address does not) and carry no other origin's `Origin` (see `local_only`).
    pub loopback: bool,
    pub stopping: AtomicBool,
    pub in_flight: AtomicUsize,
}

/// An error answer: status, `code`, message, and `Retry-After` when it has one.
#[derive(Debug, Clone)]
pub struct HttpError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<u32>,
}

impl HttpError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> HttpError {
        let retry_after = matches!(status, 429 | 503).then_some(1);
        HttpError {
            status,
            code,
            message: message.into(),
            retry_after,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> HttpError {
        HttpError::new(400, "bad_request", message)
    }
    pub fn not_found(message: impl Into<String>) -> HttpError {
        HttpError::new(404, "not_found", message)
    }
    pub fn unauthorized(message: impl Into<String>) -> HttpError {
        HttpError::new(401, "unauthorized", message)
    }
    pub fn unavailable(message: impl Into<String>) -> HttpError {
        HttpError::new(503, "unavailable", message)
    }
    /// The supervisor's refusal.
    pub fn from_code(code: ErrorCode, message: String, retry_after: Option<u32>) -> HttpError {
        let status = status_of(code);
        let mut e = HttpError::new(status, code.as_str(), message);
        if retry_after.is_some() {
            e.retry_after = retry_after;
        }
        e
    }
    pub fn body(&self) -> Value {
        json!({"error": self.message, "code": self.code})
    }
}

/// The status of each of the supervisor's error codes.
pub fn status_of(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::BadRequest | ErrorCode::BadSpec | ErrorCode::MissingSecret => 400,
        ErrorCode::Unauthorized => 401,
        ErrorCode::Forbidden => 403,
        ErrorCode::NotFound => 404,
        ErrorCode::Conflict => 409,
        ErrorCode::TooLarge => 413,
        ErrorCode::AboveCeiling => 422,
        ErrorCode::Busy => 429,
        ErrorCode::Internal => 500,
        ErrorCode::Unavailable => 503,
    }
}

/// What a handler answers.
pub enum Out {
    /// A JSON body with this status (and `Retry-After` when set).
    Json(u16, Value, Option<u32>),
    /// A JSON body already encoded, in pieces written one after another, and the request
    /// id for `X-Zygo-Request-Id` when the answer has its own.
    Bytes(u16, Vec<Vec<u8>>, Option<String>),
    Err(HttpError),
    /// The handler wrote the response itself (a stream).
    Done,
}

impl From<HttpError> for Out {
    fn from(e: HttpError) -> Out {
        Out::Err(e)
    }
}

pub fn ok(v: Value) -> Out {
    Out::Json(200, v, None)
}

/// One request being served.
pub struct Call {
    /// Taken by a handler that writes its own response.
    pub rq: Option<tiny_http::Request>,
    /// Path parameters, in the order of the template.
    pub params: Vec<String>,
    /// Query parameters, decoded.
    pub query: Vec<(String, String)>,
    /// The id on `X-Zygo-Request-Id` when no call's own id replaces it.
    pub id: String,
    /// When the caller stops waiting (`X-Zygo-Timeout-Ms` from the head's arrival).
    pub deadline: Instant,
    pub timeout_ms: u64,
    pub key: Option<String>,
    pub who: Credentials,
    /// Whether the handler read the body (otherwise the answer closes the connection).
    pub body_read: bool,
    /// What the handler's answer holds of a budget (given back once it is written).
    held: Option<Box<dyn std::any::Any + Send + 'static>>,
}

impl Call {
    /// Keep `what` (a share of a budget the answer holds) until the answer is written.
    pub fn hold(&mut self, what: impl std::any::Any + Send + 'static) {
        self.held = Some(Box::new(what));
    }

    pub fn param(&self, i: usize) -> &str {
        self.params.get(i).map(String::as_str).unwrap_or("")
    }

    /// The query keys this route understands; any other is 400.
    pub fn only_query(&self, known: &[&str]) -> Result<(), HttpError> {
        for (k, _) in &self.query {
            if !known.contains(&k.as_str()) {
                return Err(HttpError::bad_request(format!(
                    "unknown query parameter {k:?}{}",
                    if known.is_empty() {
                        " (this route takes none)".to_string()
                    } else {
                        format!(" (this route takes {})", known.join(", "))
                    }
                )));
            }
        }
        Ok(())
    }

    pub fn query(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `?stream=1`: true; `0` or absent: false; anything else 400.
    pub fn stream_flag(&self) -> Result<bool, HttpError> {
        match self.query("stream") {
            None | Some("0") | Some("false") => Ok(false),
            Some("1") | Some("true") => Ok(true),
            Some(v) => Err(HttpError::bad_request(format!(
                "stream={v:?}: use stream=1 or leave it out"
            ))),
        }
    }

    /// The body, read within the caps.
    pub fn body(&mut self) -> Result<Vec<u8>, HttpError> {
        let r = match self.rq.as_mut() {
            Some(rq) => body::read(rq),
            None => Ok(Vec::new()),
        };
        self.body_read = true;
        r
    }

    /// Wrap an inner request with who is asking.
    pub fn api(&self, request: Request) -> Request {
        Request::Api {
            who: self.who.clone(),
            request: Box::new(request),
        }
    }

    /// Time left before the caller's deadline.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// A fresh request id: `req-` and 16 random hex digits. Without randomness from the
/// kernel, an id unique within this process still (it names a response, nothing more).
pub fn new_request_id() -> String {
    match plumbing::random::random_hex(8) {
        Ok(h) => format!("req-{h}"),
        Err(_) => {
            static N: AtomicUsize = AtomicUsize::new(0);
            format!("req-local-{}", N.fetch_add(1, Ordering::Relaxed))
        }
    }
}

fn header(name: &str, value: &str) -> Option<Header> {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).ok()
}

/// The headers tiny_http puts on the answers it writes on its own (its 400s, 408s, 431s).
pub fn own_headers() -> Vec<Header> {
    header("X-Zygo-Request-Id", &new_request_id())
        .into_iter()
        .collect()
}

/// The limits tiny_http serves under.
pub fn limits() -> tiny_http::Limits {
    tiny_http::Limits {
        max_connections: MAX_CONNECTIONS,
        max_per_peer: MAX_CONNECTIONS_PER_PEER,
        idle_timeout: IDLE_TIMEOUT,
        head_timeout: Duration::from_secs(30),
        // Each write waits at most this; an answer's whole time is [`answer`]'s pace.
        write_timeout: answer::WRITE_STEP,
        max_line: 8 * 1024,
        max_headers: 100,
        max_drain: 64 * 1024,
        own_headers,
    }
}

/// Write a JSON answer to a request that holds a place (see [`answer`]); the value is
/// encoded first. `close`: the request's body, if any, stays unread and the connection is
/// closed after the answer.
pub fn respond_json(
    rq: tiny_http::Request,
    status: u16,
    body: &Value,
    id: &str,
    retry_after: Option<u32>,
    extra: &[(&str, &str)],
    close: bool,
) {
    respond_json_at(
        rq,
        status,
        body,
        id,
        retry_after,
        extra,
        close,
        answer::Pace::Answer,
    );
}

/// [`respond_json`] at `pace`.
#[allow(clippy::too_many_arguments)]
pub fn respond_json_at(
    rq: tiny_http::Request,
    status: u16,
    body: &Value,
    id: &str,
    retry_after: Option<u32>,
    extra: &[(&str, &str)],
    close: bool,
    pace: answer::Pace,
) {
    let text = body.to_string().into_bytes();
    respond_bytes(
        rq,
        status,
        "application/json",
        vec![text],
        id,
        retry_after,
        extra,
        close,
        pace,
    );
}

/// Write an answer already encoded (in pieces, written one after another) at `pace`.
#[allow(clippy::too_many_arguments)]
pub fn respond_bytes(
    rq: tiny_http::Request,
    status: u16,
    content_type: &str,
    body: Vec<Vec<u8>>,
    id: &str,
    retry_after: Option<u32>,
    extra: &[(&str, &str)],
    close: bool,
    pace: answer::Pace,
) {
    metrics::count(status);
    write_answer(
        rq,
        status,
        content_type,
        body,
        id,
        retry_after,
        extra,
        close,
        pace,
    );
}

/// [`respond_bytes`] without counting the answer in `/metrics` (which counts itself).
#[allow(clippy::too_many_arguments)]
pub fn write_answer(
    rq: tiny_http::Request,
    status: u16,
    content_type: &str,
    body: Vec<Vec<u8>>,
    id: &str,
    retry_after: Option<u32>,
    extra: &[(&str, &str)],
    close: bool,
    pace: answer::Pace,
) {
    let mut hs = vec![
        header("Content-Type", content_type),
        header("X-Zygo-Request-Id", id),
    ];
    if let Some(s) = retry_after {
        hs.push(header("Retry-After", &s.to_string()));
    }
    for (k, v) in extra {
        hs.push(header(k, v));
    }
    if close {
        // Whatever of the body is unread stays unread: the connection is closed, so a
        // client trickling the body it announced holds no worker past its answer.
        rq.leave_body_unread();
    }
    answer::send(rq, status, hs.into_iter().flatten().collect(), body, pace);
}

/// An error answer at `pace`.
fn respond_error(
    rq: tiny_http::Request,
    e: &HttpError,
    id: &str,
    extra: &[(&str, &str)],
    close: bool,
    pace: answer::Pace,
) {
    respond_json_at(
        rq,
        e.status,
        &e.body(),
        id,
        e.retry_after,
        extra,
        close,
        pace,
    );
}

/// Serve until SIGTERM or SIGINT (which the caller blocked in every thread before it
/// confined itself), then stop taking requests, let those in flight finish for up to
/// [`STOP_GRACE`], and return.
pub fn serve(
    listener: tiny_http::Listener,
    chans: Vec<std::os::unix::net::UnixStream>,
    flags: FrontFlags,
    listen_fd: i32,
) -> Result<(), String> {
    hand_back_large_buffers();
    // More workers than channels: a worker reading a slow client's body holds no channel,
    // so a few slow uploads cannot leave the channels idle and everyone else waiting.
    let workers = (chans.len() * 4).max(WORKERS_MIN);
    let share = (chans.len() / 4).max(1);
    let server = tiny_http::Server::from_listener_limited(listener, None, limits())
        .map_err(|e| format!("start the HTTP server: {e}"))?;
    let loopback = server
        .server_addr()
        .to_ip()
        .is_some_and(|a| a.ip().is_loopback());
    let front = Arc::new(Front {
        shares: fair::Shares::new(share),
        places: Arc::new(fair::Places::new(
            workers / PLACES_PER_CALLER_DIV,
            workers / PLACES_PER_CALLER_DIV,
            workers * PLACES_ALL_NUM / 4,
            workers / PLACES_UNKNOWN_DIV,
        )),
        refusals: fair::RefusalLog::default(),
        auth: fair::AuthCache::default(),
        answers: Arc::new(fair::AnswerBudgets::new(
            handlers::functions::BATCH_ANSWER_BUDGET,
        )),
        chans: channel::Pool::new(chans),
        flags,
        loopback,
        stopping: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
    });
    front.chans.watch()?;
    let server = Arc::new(server);
    for i in 0..workers {
        let (front, server) = (front.clone(), server.clone());
        std::thread::Builder::new()
            .name(format!("http-{i}"))
            .spawn(move || loop {
                match server.recv() {
                    Ok(rq) => serve_one(&front, rq),
                    Err(e) => {
                        log::debug!("the request queue ended: {e}");
                        return;
                    }
                }
            })
            .map_err(|e| format!("start a worker thread: {e}"))?;
    }
    let sig = wait_for_stop_signal();
    log::warn!(
        "{sig} received: taking no new requests; waiting up to {}s for {} in flight",
        STOP_GRACE.as_secs(),
        front.in_flight.load(Ordering::Acquire)
    );
    front.stopping.store(true, Ordering::Release);
    // No new connections: a listening socket shut for reading refuses them.
    // SAFETY: shutdown on the listener's descriptor, which this process holds.
    unsafe { libc::shutdown(listen_fd, libc::SHUT_RDWR) };
    let until = Instant::now() + STOP_GRACE;
    while front.in_flight.load(Ordering::Acquire) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = front.in_flight.load(Ordering::Acquire);
    if left > 0 {
        log::warn!("{left} requests still in flight after the grace; stopping anyway");
    }
    Ok(())
}

/// Allocations of this size and more are mapped on their own and unmapped when freed.
pub const LARGE_BUFFER: usize = 256 * 1024;

/// The front's large buffers (replies read from the supervisor, answers being written) go
/// back to the kernel as soon as they are freed. By default glibc raises its threshold for
/// that to the largest block freed so far (up to 32 MiB), after which such blocks are kept
/// in the arena of whichever of the 64 threads freed them: the front's resident memory
/// then stays at its peak of answers long after they were written.
fn hand_back_large_buffers() {
    // SAFETY: mallopt only sets allocator parameters (glibc itself changes this one,
    // unlocked, in free()).
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE_BUFFER as libc::c_int) };
}

/// The signals that stop the front; block them in the calling thread (before any other
/// thread starts, so every thread inherits the mask) so that one thread can wait for them.
pub fn block_stop_signals() -> std::io::Result<()> {
    plumbing::signals::block_signals(&[libc::SIGTERM, libc::SIGINT]).map(|_| ())
}

fn wait_for_stop_signal() -> &'static str {
    // SAFETY: as in block_stop_signals; sigwaitinfo (rt_sigtimedwait) on a blocked set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        loop {
            let s = libc::sigwaitinfo(&set, std::ptr::null_mut());
            if s == libc::SIGTERM {
                return "SIGTERM";
            }
            if s == libc::SIGINT {
                return "SIGINT";
            }
        }
    }
}

struct InFlight<'a>(&'a AtomicUsize);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn header_values<'a>(rq: &'a tiny_http::Request, name: &'static str) -> Vec<&'a str> {
    rq.headers()
        .iter()
        .filter(|h| h.field.equiv(name))
        .map(|h| h.value.as_str())
        .collect()
}

/// At most one of a header.
pub(crate) fn one_header<'a>(
    rq: &'a tiny_http::Request,
    name: &'static str,
) -> Result<Option<&'a str>, HttpError> {
    let v = header_values(rq, name);
    match v.len() {
        0 => Ok(None),
        1 => Ok(Some(v[0])),
        _ => Err(HttpError::bad_request(format!(
            "{name} is sent more than once"
        ))),
    }
}

/// Who a request's credential is, if the front knows without asking: a tokenless request
/// under `--no-auth` (the bootstrap operator), or a credential the supervisor recently
/// said it knows (see [`fair::AuthCache`]).
fn known_party(front: &Front, who: routes::Who, creds: &Credentials) -> Option<fair::Party> {
    if who == routes::Who::None {
        return None;
    }
    if creds.token.is_none() && front.flags.no_auth {
        return Some(fair::Party::of(creds, None));
    }
    front.auth.fresh(creds)
}

/// Under `--no-auth` on a loopback listener no token stands between a web page in a
/// browser on this machine and the API: a page of another site may send requests to it
/// (a form's POST needs no permission), or rename itself onto the loopback address (DNS
/// rebinding) and read the answers. So there a request that needs a caller must name a
/// loopback host in `Host`, and an `Origin` (which browsers send, and programs do not)
/// must be this server's own. (`/mcp` checks the same itself, answering in JSON-RPC.)
fn local_only(
    front: &Front,
    rq: &tiny_http::Request,
    who: routes::Who,
    path: &str,
) -> Result<(), HttpError> {
    if !(front.loopback && front.flags.no_auth) || who == routes::Who::None || path == "/mcp" {
        return Ok(());
    }
    let host = one_header(rq, "Host")?.unwrap_or("");
    if !handlers::mcp::is_loopback_host(host) {
        log::warn!(
            "refused a request for host {}: this server listens on a loopback address without \
             tokens (--no-auth)",
            excerpt(host)
        );
        return Err(HttpError::new(
            403,
            "forbidden",
            format!(
                "Host {} is not a loopback name, and this server listens on a loopback address \
                 without tokens (--no-auth); connect as localhost, 127.0.0.1 or [::1]",
                excerpt(host)
            ),
        ));
    }
    if let Some(origin) = one_header(rq, "Origin")? {
        if !handlers::mcp::same_origin(origin, host) {
            log::warn!(
                "refused a request from origin {}: this server takes no token (--no-auth), so \
                 not from web pages of other origins",
                excerpt(origin)
            );
            return Err(HttpError::new(
                403,
                "forbidden",
                format!(
                    "Origin {} is not this server's own origin, and this server takes no token \
                     (--no-auth): web pages of other origins are not served",
                    excerpt(origin)
                ),
            ));
        }
    }
    Ok(())
}

/// The caller's headers, as the front checks their shape (never who they are).
fn read_headers(rq: &tiny_http::Request, call: &mut Call) -> Result<(), HttpError> {
    if let Some(t) = one_header(rq, "X-Zygo-Timeout-Ms")? {
        let ms: u64 = t
            .trim()
            .parse()
            .ok()
            .filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms))
            .ok_or_else(|| {
                HttpError::bad_request(format!(
                    "X-Zygo-Timeout-Ms must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS} (24 h); got {t:?}"
                ))
            })?;
        call.timeout_ms = ms;
        call.deadline = Instant::now() + Duration::from_millis(ms);
    }
    if let Some(k) = one_header(rq, "X-Zygo-Request-Key")? {
        check_key(k)?;
        call.key = Some(k.to_string());
    }
    if let Some(t) = one_header(rq, "X-Zygo-Tenant")? {
        if !proto::api::is_tenant_id(t) {
            return Err(HttpError::bad_request(format!(
                "X-Zygo-Tenant {t:?} is not a tenant id (1-63 of a-z, 0-9, _ and -, starting with a letter or digit)"
            )));
        }
        call.who.tenant = Some(t.to_string());
    }
    Ok(())
}

/// Whether a request comes with a body (announced with a length over 0, or chunked).
fn has_body(rq: &tiny_http::Request) -> bool {
    match rq.body_length() {
        Some(n) => n > 0,
        None => !header_values(rq, "Transfer-Encoding").is_empty(),
    }
}

/// `Authorization: Bearer <token>`. A malformed header is 401 without asking the supervisor.
fn read_token(rq: &tiny_http::Request) -> Result<Option<String>, HttpError> {
    let Some(v) = one_header(rq, "Authorization")? else {
        return Ok(None);
    };
    let v = v.trim();
    let (scheme, token) = v.split_once(' ').unwrap_or((v, ""));
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(HttpError::unauthorized(
            "the Authorization header must be `Bearer <token>`",
        ));
    }
    if token.len() > proto::api::MAX_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::unauthorized("the token is not one Zygo issued"));
    }
    Ok(Some(token.to_string()))
}

/// A request key: 1–128 bytes of printable ASCII.
pub fn check_key(k: &str) -> Result<(), HttpError> {
    if k.is_empty() || k.len() > MAX_KEY_LEN || !k.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(HttpError::bad_request(format!(
            "a request key is 1 to {MAX_KEY_LEN} bytes of printable ASCII"
        )));
    }
    Ok(())
}

fn method_name(m: &Method) -> &'static str {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Patch => "PATCH",
        Method::Options => "OPTIONS",
        _ => "OTHER",
    }
}

/// Serve one request: find its route, check the shape of its headers, give it a place
/// among its caller's and its address's ([`fair::Places`]), run its handler, write the
/// answer. What is answered before the request has a place is small and gets
/// [`answer::REFUSAL_WRITE`]; everything after is written at [`answer::Pace::Answer`].
pub fn serve_one(front: &Front, rq: tiny_http::Request) {
    use answer::Pace;
    front.in_flight.fetch_add(1, Ordering::AcqRel);
    let _guard = InFlight(&front.in_flight);
    let id = new_request_id();
    let close = front.stopping.load(Ordering::Acquire);
    if close {
        let body = if rq.url() == "/healthz" {
            json!({"status": "stopping"})
        } else {
            HttpError::unavailable("zygo api is stopping").body()
        };
        respond_json_at(rq, 503, &body, &id, Some(5), &[], true, Pace::Refusal);
        return;
    }
    // A refusal before its body was read closes the connection instead of draining it
    // (a body of at most 1 KiB has already been read with the head).
    let body_coming = has_body(&rq) && rq.body_length().is_none_or(|n| n > 1024);
    let (path, query) = match routes::split_url(rq.url()) {
        Ok(x) => x,
        Err(e) => return respond_error(rq, &e, &id, &[], body_coming, Pace::Refusal),
    };
    let method = method_name(rq.method());
    let (route, params) = match routes::find(method, &path) {
        routes::Found::Route(r, p) => (r, p),
        routes::Found::Bad(e) => {
            return respond_error(rq, &e, &id, &[], body_coming, Pace::Refusal);
        }
        routes::Found::NotFound(msg) => {
            let e = HttpError::not_found(msg);
            return respond_error(rq, &e, &id, &[], body_coming, Pace::Refusal);
        }
        routes::Found::WrongMethod(allow) => {
            let e = HttpError::new(
                405,
                "bad_request",
                format!("{method} is not served on {path}; it takes {allow}"),
            );
            let extra = [("Allow", allow.as_str())];
            return respond_error(rq, &e, &id, &extra, body_coming, Pace::Refusal);
        }
    };
    let mut call = Call {
        rq: None,
        params,
        query,
        id: id.clone(),
        deadline: Instant::now() + Duration::from_millis(DEFAULT_TIMEOUT_MS),
        timeout_ms: DEFAULT_TIMEOUT_MS,
        key: None,
        who: Credentials {
            token: None,
            tenant: None,
        },
        body_read: false,
        held: None,
    };
    let checked = local_only(front, &rq, route.who, &path)
        .and_then(|()| read_headers(&rq, &mut call))
        .and_then(|()| {
            if route.who == routes::Who::None {
                Ok(None)
            } else {
                read_token(&rq)
            }
        });
    match checked {
        Ok(token) => call.who.token = token,
        Err(e) => return respond_error(rq, &e, &id, &[], body_coming, Pace::Refusal),
    }
    // A body is read only for a caller the supervisor knows: nobody without a token can
    // hold a worker or memory with one (and a caller it does not know is told so, 401,
    // whatever its share).
    if route.who != routes::Who::None && has_body(&rq) {
        if let Err(e) = handlers::authenticate(front, &call.who) {
            return respond_error(rq, &e, &id, &[], true, Pace::Refusal);
        }
    }
    // Held until the answer is written: reading the body, asking the supervisor and
    // writing the answer all count against the caller's share and its address's.
    let ip = rq.remote_addr().map(|a| a.ip());
    let known = known_party(front, route.who, &call.who);
    let caller = match (&known, route.who) {
        (_, routes::Who::None) => fair::Caller::Anyone,
        (Some(p), _) => fair::Caller::Known(p),
        (None, _) => fair::Caller::Unknown,
    };
    let place = match fair::Places::take(&front.places, caller, ip) {
        // The pool of callers not known yet is full: ask the supervisor who this is (at
        // most once every few seconds per credential), and count it as that.
        Err(fair::Full::Unknown(_)) => match handlers::authenticate(front, &call.who) {
            Ok(party) => fair::Places::take(&front.places, fair::Caller::Known(&party), ip),
            Err(e) => return respond_error(rq, &e, &id, &[], body_coming, Pace::Refusal),
        },
        other => other,
    };
    let _place = match place {
        Ok(p) => p,
        Err(full) => {
            let (status, code, message) = full.refusal();
            front.refusals.note(|n| {
                let from = ip.map_or_else(|| "a unix socket peer".to_string(), |ip| ip.to_string());
                format!("refused a request from {from}: {message} ({n} refused since the last such line)")
            });
            let e = HttpError::new(status, code, message);
            return respond_error(rq, &e, &id, &[], true, Pace::Refusal);
        }
    };
    call.rq = Some(rq);
    let out = (route.handler)(front, &mut call);
    let Some(rq) = call.rq.take() else {
        return;
    };
    match out {
        Out::Done => {}
        Out::Json(status, body, retry) => {
            let rid = body
                .get("request_id")
                .and_then(Value::as_str)
                .unwrap_or(&call.id)
                .to_string();
            let close = !call.body_read && body_coming;
            // Only the encoded text is held while the answer drains.
            let text = body.to_string().into_bytes();
            drop(body);
            respond_bytes(
                rq,
                status,
                "application/json",
                vec![text],
                &rid,
                retry,
                &[],
                close,
                Pace::Answer,
            );
        }
        Out::Bytes(status, pieces, rid) => {
            let close = !call.body_read && body_coming;
            respond_bytes(
                rq,
                status,
                "application/json",
                pieces,
                rid.as_deref().unwrap_or(&call.id),
                None,
                &[],
                close,
                Pace::Answer,
            );
        }
        Out::Err(e) => {
            let close = e.status == 413 || e.status == 408 || (!call.body_read && body_coming);
            respond_error(rq, &e, &call.id, &[], close, Pace::Answer);
        }
    }
}
