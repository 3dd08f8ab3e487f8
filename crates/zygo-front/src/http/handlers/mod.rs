//! One handler per route. Each parses its path, query and body, builds one `proto`
//! request, asks the supervisor, and shapes the reply as the API contract draws it.

pub mod blobs;
pub mod deps;
pub mod functions;
pub mod mcp;
pub mod metrics;
pub mod misc;
pub mod pools;
pub mod run;
pub mod scripts;
pub mod secrets;
pub mod tenants;
pub mod tokens;

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use proto::api::{Credentials, TenantInfo, TenantLimits};
use proto::front::{ExecAnswer, ExecEvent, FunctionInfo, Outcome, Reply, Request};
use serde_json::{json, Value};

use super::channel::ChanError;
use super::{Call, Front, HttpError, ACQUIRE_WAIT, ANSWER_GRACE, AUTH_WAIT, SHARE_WAIT};

/// Ask the supervisor, waiting until the caller's deadline plus [`ANSWER_GRACE`]; a
/// caller holding its share of the channels waits its turn (see [`share_wait`]).
pub fn ask(front: &Front, call: &Call, req: Request) -> Result<Reply, HttpError> {
    ask_with(
        front,
        &call.who,
        req,
        call.deadline + ANSWER_GRACE,
        share_wait(call),
        |_| {},
    )
}

/// How a request whose caller holds its share of the channels waits for one of its own.
#[derive(Debug, Clone, Copy)]
pub struct ShareWait {
    /// Until when; `None`: not at all (refused at once).
    pub until: Option<Instant>,
    /// The connection of the request's client: a request whose client hung up while it
    /// waited leaves the line, and nothing of it is sent.
    pub client: Option<RawFd>,
}

impl ShareWait {
    /// Refused at once (a health check says how things are now).
    pub const NOT: ShareWait = ShareWait {
        until: None,
        client: None,
    };

    /// Until `deadline` (the caller's), and at most [`SHARE_WAIT`]. Its worker waits
    /// with it, one of its caller's places (see `fair::Places`): a caller's waiting
    /// requests are bounded by those.
    pub fn until(deadline: Instant, client: Option<RawFd>) -> ShareWait {
        ShareWait {
            until: Some(deadline.min(Instant::now() + SHARE_WAIT)),
            client,
        }
    }
}

/// How `call` waits for its caller's share: until its deadline, at most [`SHARE_WAIT`],
/// and not once its client hung up.
pub fn share_wait(call: &Call) -> ShareWait {
    ShareWait::until(
        call.deadline,
        call.rq.as_ref().and_then(|rq| rq.connection_fd()),
    )
}

/// Whether the client on `fd` hung up (or shut its sending side, which a client waiting
/// for its answer does not do).
fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: poll, without waiting, on one pollfd of a descriptor the request being
    // served holds open.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Ask, with a deadline of its own and events passed on. A refusal (`Reply::Error`) is
/// returned as the error it maps to. `wait`: how to wait for one of the caller's own
/// leases when it holds its share, in turn behind its other waiting requests; see
/// [`ShareWait`]. An exec that waited is sent with what is left of its timeout.
pub fn ask_with(
    front: &Front,
    who: &Credentials,
    req: Request,
    deadline: Instant,
    wait: ShareWait,
    on_event: impl FnMut(ExecEvent),
) -> Result<Reply, HttpError> {
    let asked = Instant::now();
    // A cancel takes no share: the supervisor answers it at once, and it is how a caller
    // at its share ends what holds the share (waiting behind those calls would defeat it).
    let share = if matches!(req, Request::Cancel { .. }) {
        None
    } else {
        Some(take_share(front, who, &req, &wait, asked)?)
    };
    let mut lease = acquire(front, deadline)?;
    let req = Request::Api {
        who: who.clone(),
        request: Box::new(less_time(req, asked.elapsed())),
    };
    // Should this request be abandoned (its deadline passes first), its channel still
    // counts against its caller until the channel is free again.
    if let Some(share) = share {
        lease.hold(share);
    }
    match lease.call(&req, deadline, on_event) {
        Ok(Reply::Error {
            code,
            message,
            retry_after,
        }) => Err(HttpError::from_code(code, message, retry_after)),
        Ok(reply) => {
            if let Reply::Answer(a) = &reply {
                crate::delivery::usage(&a.usage);
            }
            Ok(reply)
        }
        Err(ChanError::Timeout) => Err(HttpError::unavailable(
            "the supervisor did not answer in time",
        )),
        Err(ChanError::Broken(e)) => Err(HttpError::unavailable(format!(
            "lost the supervisor's answer: {e}"
        ))),
    }
}

/// One of the caller's shares of the channels, waiting for it as `wait` says: 499 when
/// the client hung up meanwhile, 429 when the wait ended without one.
fn take_share(
    front: &Front,
    who: &Credentials,
    req: &Request,
    wait: &ShareWait,
    asked: Instant,
) -> Result<super::fair::Share, HttpError> {
    // A share is the caller's as the supervisor says who it is: a tenant has one,
    // however it is named (asked once, then remembered for a few seconds).
    let party = match req {
        Request::Health => super::fair::Party::of(who, None),
        _ => authenticate(front, who)?,
    };
    let gone = || wait.client.is_some_and(hung_up);
    front
        .shares
        .take_unless(&party, wait.until, &gone)
        .ok_or_else(|| {
            if gone() {
                log::debug!("a request left the line for its caller's share: its client hung up");
                return HttpError::new(
                    499,
                    "cancelled",
                    "the client hung up while the request waited for its turn; nothing of it ran",
                );
            }
            over_share(front.shares.per(), wait.until.map(|_| asked.elapsed()))
        })
}

/// The 429 of a caller that holds its share of the channels: at once, or after `waited`.
fn over_share(per: usize, waited: Option<Duration>) -> HttpError {
    let message = match waited {
        None => format!(
            "this caller has {per} requests in flight already (its share of zygo api's channels to the supervisor); retry when one is done"
        ),
        Some(w) => format!(
            "this caller has {per} requests in flight already (its share of zygo api's channels to the supervisor), and none of them ended in the {:.1} s this request waited for its turn (until its deadline, at most {} s); retry when one is done",
            w.as_secs_f64(),
            SHARE_WAIT.as_secs()
        ),
    };
    HttpError::new(429, "busy", message)
}

/// `req` sent `waited` after it arrived: an exec's timeout is what is left of it (at
/// least 1 ms), so that a call that waited for a channel still ends by its caller's
/// deadline.
fn less_time(mut req: Request, waited: Duration) -> Request {
    if let Request::Exec(e) = &mut req {
        if let Some(ms) = e.timeout_ms {
            e.timeout_ms = Some(ms.saturating_sub(waited.as_millis() as u64).max(1));
        }
    }
    req
}

/// A free channel, waiting at most [`ACQUIRE_WAIT`] (and never past `deadline`).
fn acquire(front: &Front, deadline: Instant) -> Result<super::channel::Lease, HttpError> {
    let until = deadline.min(Instant::now() + ACQUIRE_WAIT);
    front.chans.acquire(until).ok_or_else(|| {
        HttpError::new(
            429,
            "busy",
            "every channel to the supervisor is in use; retry in a moment",
        )
    })
}

/// Whether the supervisor knows this caller (its token, and the tenant it names), and
/// whose share of the channels it uses: asked before a request's body is read (an unknown
/// or revoked token is refused without a byte of its body read) and before a share is
/// taken. The question is `Version` as the caller, which any known caller may ask and
/// which changes nothing; its answer names the tenant the caller acts for, and is
/// remembered for [`super::fair::AUTH_FRESH`].
pub fn authenticate(front: &Front, who: &Credentials) -> Result<super::fair::Party, HttpError> {
    if let Some(party) = front.auth.fresh(who) {
        return Ok(party);
    }
    let deadline = Instant::now() + AUTH_WAIT;
    let req = Request::Api {
        who: who.clone(),
        request: Box::new(Request::Version),
    };
    let mut lease = acquire(front, deadline)?;
    match lease.call(&req, deadline, |_| {}) {
        Ok(Reply::Version(v)) => {
            let party = super::fair::Party::of(who, v.tenant);
            front.auth.known(who, party.clone());
            Ok(party)
        }
        Ok(Reply::Error {
            code,
            message,
            retry_after,
        }) => Err(HttpError::from_code(code, message, retry_after)),
        Ok(r) => Err(unexpected(&r)),
        Err(ChanError::Timeout) => Err(HttpError::unavailable(
            "the supervisor did not say in time who is calling",
        )),
        Err(ChanError::Broken(e)) => Err(HttpError::unavailable(format!(
            "lost the supervisor's answer: {e}"
        ))),
    }
}

/// A reply that is not the one the route expects.
pub fn unexpected(reply: &Reply) -> HttpError {
    let kind = format!("{reply:?}");
    let kind = kind.split(['(', ' ', '{']).next().unwrap_or("").to_string();
    log::error!("the supervisor answered {kind} where another answer was expected");
    HttpError::new(
        500,
        "internal",
        format!("the supervisor gave an unexpected answer ({kind})"),
    )
}

/// A function or pool name from the path: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn name(call: &Call, i: usize) -> Result<String, HttpError> {
    let n = call.param(i);
    check_name(n)?;
    Ok(n.to_string())
}

pub fn check_name(n: &str) -> Result<(), HttpError> {
    if !proto::api::is_tenant_id(n) {
        return Err(HttpError::bad_request(format!(
            "{:?} is not a function name (1-63 of a-z, 0-9, _ and -, starting with a letter or digit)",
            n.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

/// A tenant id from the path.
pub fn tenant_id(call: &Call, i: usize) -> Result<String, HttpError> {
    let n = call.param(i);
    if !proto::api::is_tenant_id(n) {
        return Err(HttpError::bad_request(format!(
            "{:?} is not a tenant id (1-63 of a-z, 0-9, _ and -, starting with a letter or digit)",
            n.chars().take(80).collect::<String>()
        )));
    }
    Ok(n.to_string())
}

/// A digest from the path or a body: `sha256:<64 hex>` or the bare hex; lowercase hex out.
pub fn digest(d: &str) -> Result<String, HttpError> {
    proto::api::parse_digest(d)
        .map(str::to_string)
        .ok_or_else(|| {
            HttpError::bad_request(format!(
                "{:?} is not a digest (sha256: and 64 lowercase hex digits)",
                d.chars().take(80).collect::<String>()
            ))
        })
}

pub fn sha(hex: &str) -> String {
    format!("sha256:{hex}")
}

pub fn function_info(f: &FunctionInfo) -> Value {
    json!({
        "name": f.name,
        "tenant": f.tenant,
        "kind": f.kind,
        "state": f.state,
        "error": f.error,
        "zygotes": {
            "ready": f.zygotes.ready,
            "busy": f.zygotes.busy,
            "frozen": f.zygotes.frozen,
            "starting": f.zygotes.starting,
        },
        "in_flight": f.in_flight,
        "min_warm": f.min_warm,
        "max_warm": f.max_warm,
    })
}

/// Fields of a JSON object given as JSON text, in pieces passed on as they are.
pub type RawFields = Vec<(&'static str, Vec<Vec<u8>>)>;

/// The status and body of a call's answer (the contract's "A call's answer"), taking the
/// answer's strings rather than copying them. The result (and a workspace asked for with
/// `out`) come apart, as JSON text in pieces ([`encode_object`] puts them in): a result
/// that is one JSON value is passed on as the text the handler returned, checked without
/// building it; one that is not (never from a well-behaved agent) is a JSON string.
pub fn exec_answer(a: ExecAnswer) -> (u16, Value, RawFields) {
    let metrics = json!({
        "wall_ms": proto::front::ms(a.metrics.wall_us),
        "cpu_ms": proto::front::ms(a.metrics.cpu_us),
        "peak_rss_kb": a.metrics.peak_rss_kb,
    });
    let mut body = json!({
        "request_id": a.request_id,
        "stdout": a.stdout,
        "stderr": a.stderr,
        "stdout_truncated": a.stdout_truncated,
        "stderr_truncated": a.stderr_truncated,
        "started": a.started,
        "metrics": metrics,
    });
    let mut raw = RawFields::new();
    let status = match a.outcome {
        Outcome::Ok => {
            match a.result {
                None => body["result"] = Value::Null,
                Some(r) if is_one_json_value(&r) => raw.push(("result", vec![r.into_bytes()])),
                Some(r) => body["result"] = Value::String(r),
            }
            200
        }
        Outcome::Error => {
            body["error"] = json!(a.error.unwrap_or_else(|| "the handler failed".into()));
            body["code"] = json!("handler");
            body["traceback"] = json!(a.traceback);
            // Set when the handler's process exited (sys.exit(3), a command's status);
            // null when it raised.
            body["exit_code"] = json!(a.exit_code);
            body["oom_killed"] = json!(a.oom_killed);
            500
        }
        Outcome::Timeout | Outcome::Stuck | Outcome::Cancelled => {
            let (status, code, default) = match a.outcome {
                Outcome::Timeout => (504, "timeout", "the request ran past its deadline"),
                Outcome::Stuck => (504, "stuck", "the handler stopped answering"),
                _ => (499, "cancelled", "the request was cancelled"),
            };
            body["error"] = json!(a.error.unwrap_or_else(|| default.into()));
            body["code"] = json!(code);
            body["oom_killed"] = json!(a.oom_killed);
            status
        }
    };
    // A streamed call whose events were cut short (its client read too slowly).
    if a.stream_truncated {
        body["stream_truncated"] = json!(true);
    }
    // Asked for with `out`: the directory, packed (the caller's SDK decodes it). Base64
    // needs no escaping: its text is the JSON string's.
    if let Some(tar) = &a.workspace_out {
        let b64 = crate::http::base64::encode(tar).into_bytes();
        raw.push(("workspace", vec![b"\"".to_vec(), b64, b"\"".to_vec()]));
        body["workspace_truncated"] = json!(a.workspace_out_truncated);
    }
    (status, body, raw)
}

/// Whether `text` is one JSON value (and nothing else but whitespace), found without
/// building it.
pub fn is_one_json_value(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// A JSON object in pieces: the `raw` fields first (their values passed on as they are,
/// never copied), then the fields of `rest` (an object).
pub fn encode_object(raw: RawFields, rest: &Value) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut sep = "{";
    for (key, value) in raw {
        pieces.push(format!("{sep}{}:", Value::from(key)).into_bytes());
        pieces.extend(value);
        sep = ",";
    }
    let mut tail = rest.to_string().into_bytes();
    if sep == "," {
        if tail.len() > 2 {
            tail[0] = b',';
        } else {
            tail = b"}".to_vec();
        }
    }
    pieces.push(tail);
    pieces
}

/// How many bytes [`encode_object`] makes of `raw` and `rest`, without making them.
pub fn encoded_len(raw: &RawFields, rest: &Value) -> usize {
    let fields: usize = raw
        .iter()
        .map(|(key, value)| {
            1 + Value::from(*key).to_string().len() + 1 + value.iter().map(Vec::len).sum::<usize>()
        })
        .sum();
    let tail = rest.to_string().len();
    if raw.is_empty() || tail > 2 {
        fields + tail
    } else {
        fields + 1
    }
}

/// The pieces' bytes in one.
pub fn joined(pieces: Vec<Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(pieces.iter().map(Vec::len).sum());
    for p in pieces {
        out.extend_from_slice(&p);
    }
    out
}

fn bytes_text(b: u64) -> String {
    const K: u64 = 1024;
    for (unit, size) in [("G", K * K * K), ("M", K * K), ("K", K)] {
        if b >= size && b.is_multiple_of(size) {
            return format!("{}{unit}", b / size);
        }
    }
    b.to_string()
}

fn ms_text(ms: u64) -> String {
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1000)] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

pub fn limits_json(l: &TenantLimits) -> Value {
    json!({
        "mem": l.mem_bytes.map(bytes_text),
        "cpu": l.cpu_millis.map(|c| c as f64 / 1000.0),
        "pids": l.pids,
        "timeout": l.timeout_ms.map(ms_text),
        "scratch": l.scratch_bytes.map(bytes_text),
        "network": l.network,
        "allow": l.allow,
    })
}

pub fn tenant_json(t: &TenantInfo) -> Value {
    json!({
        "id": t.id,
        "created_ms": t.created_ms,
        "limits": limits_json(&t.limits),
        "functions": t.functions,
        "scripts": t.scripts.iter().map(|s| sha(s)).collect::<Vec<_>>(),
        "tokens": t.tokens,
    })
}

/// The deadline of a call the supervisor times itself: the caller's, plus a grace.
pub fn call_deadline(call: &Call) -> Instant {
    call.deadline + ANSWER_GRACE
}

/// `timeout_ms` for a call sent with `left` time remaining (at least 1 ms).
pub fn ms_left(left: Duration) -> u64 {
    (left.as_millis() as u64).max(1)
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_outcome_has_the_contracts_status_and_code() {
        use proto::front::Metrics;
        let base = ExecAnswer {
            request_id: "r".into(),
            outcome: Outcome::Ok,
            result: Some("{\"a\":1}".into()),
            error: None,
            traceback: None,
            exit_code: None,
            started: true,
            oom_killed: false,
            stdout: String::new(),
            stdout_truncated: false,
            stderr: String::new(),
            stderr_truncated: false,
            metrics: Metrics::default(),
            workspace_out: None,
            workspace_out_truncated: false,
            stream_truncated: false,
            usage: None,
        };
        let encoded = |a: ExecAnswer| {
            let (st, body, raw) = exec_answer(a);
            let v: Value = serde_json::from_slice(&joined(encode_object(raw, &body))).unwrap();
            (st, v)
        };
        let (_, body, raw) = exec_answer(base.clone());
        let len = encoded_len(&raw, &body);
        assert_eq!(len, joined(encode_object(raw, &body)).len());
        let raw = vec![("a", vec![b"1".to_vec()])];
        assert_eq!(
            encoded_len(&raw, &json!({})),
            joined(encode_object(raw, &json!({}))).len()
        );
        let (st, v) = encoded(base.clone());
        assert_eq!((st, v["result"]["a"].as_i64()), (200, Some(1)));
        assert_eq!(v["request_id"], "r");
        // A result that is not one JSON value is a string; none is null.
        for (result, want) in [
            (Some("{\"a\":"), json!("{\"a\":")),
            (Some("1 2"), json!("1 2")),
            (None, Value::Null),
        ] {
            let a = ExecAnswer {
                result: result.map(str::to_string),
                ..base.clone()
            };
            assert_eq!(encoded(a).1["result"], want);
        }
        let a = ExecAnswer {
            workspace_out: Some(vec![1, 2, 3].into()),
            ..base.clone()
        };
        let (_, v) = encoded(a);
        assert_eq!(
            (v["workspace"].as_str(), v["result"]["a"].as_i64()),
            (Some("AQID"), Some(1))
        );
        for (outcome, status, code) in [
            (Outcome::Error, 500, "handler"),
            (Outcome::Timeout, 504, "timeout"),
            (Outcome::Stuck, 504, "stuck"),
            (Outcome::Cancelled, 499, "cancelled"),
        ] {
            let a = ExecAnswer {
                outcome,
                result: None,
                ..base.clone()
            };
            let (st, v) = encoded(a);
            assert_eq!(st, status, "{outcome:?}");
            assert_eq!(v["code"], code);
            assert!(v["error"].is_string() && v.get("oom_killed").is_some());
        }
        // A handler error: exit_code is the process's code when it exited, else null.
        for (exit_code, shown) in [(Some(3), serde_json::json!(3)), (None, Value::Null)] {
            let a = ExecAnswer {
                outcome: Outcome::Error,
                result: None,
                exit_code,
                ..base.clone()
            };
            assert_eq!(exec_answer(a).1["exit_code"], shown);
        }
    }

    #[test]
    fn the_supervisors_codes_have_the_contracts_statuses() {
        use crate::http::status_of;
        use proto::front::ErrorCode::*;
        for (code, status) in [
            (BadRequest, 400),
            (BadSpec, 400),
            (Unauthorized, 401),
            (Forbidden, 403),
            (NotFound, 404),
            (Conflict, 409),
            (TooLarge, 413),
            (AboveCeiling, 422),
            (Busy, 429),
            (Internal, 500),
            (Unavailable, 503),
        ] {
            assert_eq!(status_of(code), status, "{code:?}");
        }
    }

    #[test]
    fn sizes_and_times_print_in_their_largest_whole_unit() {
        assert_eq!(bytes_text(256 << 20), "256M");
        assert_eq!(bytes_text(1 << 30), "1G");
        assert_eq!(bytes_text(1000), "1000");
        assert_eq!(ms_text(30_000), "30s");
        assert_eq!(ms_text(90_000), "90s");
        assert_eq!(ms_text(1500), "1500ms");
        assert_eq!(ms_text(7_200_000), "2h");
    }

    /// A front with two channels, a share of one channel per caller, and a supervisor
    /// that answers every exec after `hold` with the timeout it was sent (as
    /// `Cancelled { count }`), and anything else at once.
    fn front_and_supervisor(hold: Duration) -> Front {
        use std::os::unix::net::UnixStream;
        let mut ours = Vec::new();
        for _ in 0..2 {
            let (a, mut b) = UnixStream::pair().unwrap();
            ours.push(a);
            std::thread::spawn(move || {
                while let Ok(rq) =
                    proto::read_frame::<_, Request>(&mut b, proto::front::MAX_FRONT_FRAME)
                {
                    let Request::Api { request, .. } = rq else {
                        return;
                    };
                    let count = match *request {
                        Request::Exec(e) => {
                            std::thread::sleep(hold);
                            e.timeout_ms.unwrap_or(0) as u32
                        }
                        _ => 0,
                    };
                    if proto::write_frame(&mut b, &Reply::Cancelled { count }).is_err() {
                        return;
                    }
                }
            });
        }
        Front {
            chans: super::super::channel::Pool::new(ours),
            shares: super::super::fair::Shares::new(1),
            places: std::sync::Arc::new(super::super::fair::Places::new(16, 16, 48, 8)),
            refusals: super::super::fair::RefusalLog::default(),
            auth: super::super::fair::AuthCache::default(),
            answers: std::sync::Arc::new(super::super::fair::AnswerBudgets::new(1 << 20)),
            flags: proto::api::FrontFlags::default(),
            loopback: true,
            stopping: std::sync::atomic::AtomicBool::new(false),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn caller(front: &Front) -> Credentials {
        let who = Credentials {
            token: Some("tok".into()),
            tenant: None,
        };
        front
            .auth
            .known(&who, super::super::fair::Party::of(&who, None));
        who
    }

    fn exec(timeout_ms: u64) -> Request {
        Request::Exec(proto::front::ExecRequest {
            name: "f".into(),
            event: "{}".into(),
            key: None,
            timeout_ms: Some(timeout_ms),
            stream: false,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        })
    }

    #[test]
    fn a_call_over_its_callers_share_waits_and_is_sent_with_what_is_left_of_its_timeout() {
        let front = front_and_supervisor(Duration::ZERO);
        let who = caller(&front);
        let party = super::super::fair::Party::of(&who, None);
        // The caller's share (one channel) is held for 300 ms; the other channel is free
        // all along.
        let held = front.shares.take(&party, None).unwrap();
        let let_go = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let far = Instant::now() + Duration::from_secs(60);
        let wait = ShareWait::until(far, None);
        let r = ask_with(&front, &who, exec(10_000), far, wait, |_| {});
        let_go.join().unwrap();
        let Ok(Reply::Cancelled { count }) = r else {
            panic!("{r:?}");
        };
        // Its timeout lost what it waited.
        assert!(count <= 9_700, "sent with {count} ms");
        assert!(count > 0);
    }

    #[test]
    fn a_wait_past_the_callers_deadline_is_busy_saying_it_waited() {
        let front = front_and_supervisor(Duration::ZERO);
        let who = caller(&front);
        let party = super::super::fair::Party::of(&who, None);
        let _held = front.shares.take(&party, None).unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let t0 = Instant::now();
        let soon = Instant::now() + Duration::from_millis(200);
        let wait = ShareWait::until(soon, None);
        let e = ask_with(&front, &who, exec(1000), far, wait, |_| {}).unwrap_err();
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert_eq!((e.status, e.code, e.retry_after), (429, "busy", Some(1)));
        assert!(e.message.contains("waited"), "{}", e.message);
        // Without a wait (a health check), refused at once, saying nothing of a wait.
        let t0 = Instant::now();
        let e = ask_with(&front, &who, Request::List, far, ShareWait::NOT, |_| {}).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!((e.status, e.code), (429, "busy"));
        assert!(!e.message.contains("waited"), "{}", e.message);
    }

    #[test]
    fn a_call_whose_client_hangs_up_while_it_waits_is_never_sent() {
        use std::os::fd::AsRawFd;
        let front = front_and_supervisor(Duration::ZERO);
        let who = caller(&front);
        let party = super::super::fair::Party::of(&who, None);
        let held = front.shares.take(&party, None).unwrap();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let hang_up = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(theirs);
        });
        let t0 = Instant::now();
        let wait = ShareWait::until(far, Some(ours.as_raw_fd()));
        let e = ask_with(&front, &who, exec(1000), far, wait, |_| {}).unwrap_err();
        hang_up.join().unwrap();
        assert_eq!((e.status, e.code), (499, "cancelled"), "{}", e.message);
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
        // It left the line: the share, once free, is anyone's of that caller.
        drop(held);
        assert!(front.shares.take(&party, None).is_some());
    }

    #[test]
    fn a_wait_for_a_share_is_capped() {
        let now = Instant::now();
        let w = ShareWait::until(now + Duration::from_secs(86_400), None)
            .until
            .unwrap();
        assert!(w <= Instant::now() + SHARE_WAIT);
        assert!(w >= now + SHARE_WAIT);
        let soon = now + Duration::from_millis(5);
        assert_eq!(ShareWait::until(soon, None).until, Some(soon));
    }

    #[test]
    fn only_an_execs_timeout_is_shortened_by_its_wait() {
        let Request::Exec(e) = less_time(exec(1000), Duration::from_millis(300)) else {
            panic!("not an exec");
        };
        assert_eq!(e.timeout_ms, Some(700));
        let Request::Exec(e) = less_time(exec(1000), Duration::from_secs(5)) else {
            panic!("not an exec");
        };
        assert_eq!(e.timeout_ms, Some(1));
        assert_eq!(
            less_time(Request::List, Duration::from_secs(5)),
            Request::List
        );
    }
}
