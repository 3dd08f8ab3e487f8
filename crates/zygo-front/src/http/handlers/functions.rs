//! `/fn…`: list, serve from a layer, stop, call (plain, streamed, batched), logs, stats,
//! warm.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use proto::api::{Credentials, ServeKind};
use proto::front::{ErrorCode, ExecAnswer, ExecEvent, ExecRequest, Reply, Request};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{
    ask, ask_with, call_deadline, encode_object, encoded_len, exec_answer, function_info, joined,
    ms_left, name, share_wait, unexpected, ShareWait,
};
use crate::http::answer::Paced;
use crate::http::fair::AnswerShare;
use crate::http::{body, ok, Call, Front, HttpError, Out};

/// Events in one batch, at most.
pub const MAX_BATCH: usize = 1000;
/// Events of one batch in flight at once, at most (and never more than its caller's share
/// of the channels).
pub const BATCH_IN_FLIGHT: usize = 16;
/// What a batch's answer may hold, all its elements together, counted as the bytes of
/// their encoded JSON (what the front holds until the answer is written: results are kept
/// as the text they came as, never parsed into trees). Past it an element's stdout and
/// stderr are cut (`*_truncated: true`), and an element whose own fields and result do not
/// fit is left out (413 `too_large`).
pub const BATCH_ANSWER_BUDGET: usize = 64 * 1024 * 1024;
/// Set aside of [`BATCH_ANSWER_BUDGET`] for each event when the batch begins (at most 1000
/// of them: 15.6 MiB), so that every element's status, its own fields and a result of up
/// to about this much always fit, whatever the elements before it took.
pub const BATCH_ELEMENT_RESERVE: usize = 16 * 1024;

pub fn list(front: &Front, call: &mut Call) -> Out {
    if let Err(e) = call.only_query(&[]) {
        return e.into();
    }
    match ask(front, call, Request::List) {
        Ok(Reply::Functions(fs)) => ok(json!({
            "functions": fs.iter().map(function_info).collect::<Vec<_>>()
        })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

/// `PUT /fn/{name}` and `POST /runtimes`: a layer and the folder its paths are relative to.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeBody {
    pub layer: serde_json::Map<String, Value>,
    #[serde(default)]
    pub base_dir: Option<String>,
}

pub fn serve_layer(
    front: &Front,
    call: &Call,
    name: String,
    kind: ServeKind,
    layer: serde_json::Map<String, Value>,
    base_dir: Option<String>,
) -> Out {
    if let Some(d) = &base_dir {
        if !d.starts_with('/') || d.contains('\0') {
            return HttpError::bad_request("base_dir must be an absolute path").into();
        }
    }
    let layer = match crate::http::bodies::layer::from_map(&layer) {
        Ok(l) => Box::new(l),
        Err(m) => return HttpError::from_code(ErrorCode::BadSpec, m, None).into(),
    };
    let req = Request::ServeLayer {
        name,
        kind,
        layer,
        base_dir,
    };
    match ask(front, call, req) {
        Ok(Reply::ServedOne { name, kind }) => ok(json!({
            "name": name,
            "kind": match kind { ServeKind::Function => "function", ServeKind::Pool => "pool" },
            "state": "serving",
        })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn serve(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let name = name(call, 0)?;
        let b: ServeBody = body::json(&call.body()?)?;
        Ok::<_, HttpError>((name, b))
    })();
    match parsed {
        Ok((name, b)) => serve_layer(front, call, name, ServeKind::Function, b.layer, b.base_dir),
        Err(e) => e.into(),
    }
}

pub fn stop_named(front: &Front, call: &mut Call) -> Out {
    let name = match call.only_query(&[]).and_then(|()| name(call, 0)) {
        Ok(n) => n,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::Stop { name }) {
        Ok(Reply::Stopped { name }) => ok(json!({ "stopped": name })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn stop(front: &Front, call: &mut Call) -> Out {
    stop_named(front, call)
}

/// The query of a pool call: `stream` (its workspace and `out` are in the body).
pub fn call_query(call: &Call) -> Result<bool, HttpError> {
    call.only_query(&["stream"])?;
    call.stream_flag()
}

/// The query of a function call: `stream`, `workspace` (a blob digest only: an inline tar
/// does not belong in a URL) and `out`.
fn fn_call_query(call: &Call) -> Result<(bool, Option<String>, bool), HttpError> {
    call.only_query(&["stream", "workspace", "out"])?;
    let stream = call.stream_flag()?;
    let blob = match call.query("workspace") {
        None => None,
        Some(d) => Some(super::digest(d).map_err(|_| {
            HttpError::bad_request(
                "?workspace= takes a blob digest (sha256:… from PUT /blobs); an inline tar goes only in a pool call's body",
            )
        })?),
    };
    let out = match call.query("out") {
        None | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(v) => {
            return Err(HttpError::bad_request(format!(
                "out={:?}: use out=1 or leave it out",
                v.chars().take(40).collect::<String>()
            )))
        }
    };
    Ok((stream, blob, out))
}

/// An event body: empty is `null`; otherwise one JSON value (strict), passed on as its
/// text without the whitespace between tokens. It is checked without building it: as a
/// tree, a body of small numbers or many keys takes many times its size (the supervisor
/// parses it once more itself).
pub fn event_text(bytes: &[u8]) -> Result<String, HttpError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok("null".into());
    }
    let _: IgnoredAny = body::json(bytes)?;
    compact(bytes)
}

/// A JSON text already checked, without the whitespace between its tokens.
fn compact(text: &[u8]) -> Result<String, HttpError> {
    let mut out = Vec::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        out.push(b);
    }
    String::from_utf8(out).map_err(|_| HttpError::bad_request("the body is not UTF-8 text"))
}

pub fn call(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        let (stream, blob, out) = fn_call_query(call)?;
        let name = name(call, 0)?;
        let event = event_text(&call.body()?)?;
        Ok::<_, HttpError>((stream, blob, out, name, event))
    })();
    let (stream, blob, out, name, event) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    let req = ExecRequest {
        workspace: None,
        workspace_blob: blob,
        out,
        name,
        event,
        key: call.key.clone(),
        timeout_ms: Some(call.timeout_ms),
        stream,
        script: None,
    };
    exec(front, call, req)
}

/// Run one call: plain (one JSON answer) or streamed (NDJSON).
pub fn exec(front: &Front, call: &mut Call, req: ExecRequest) -> Out {
    if req.stream {
        return exec_stream(front, call, req);
    }
    match ask_with(
        front,
        &call.who,
        Request::Exec(req),
        call_deadline(call),
        share_wait(call),
        |_| {},
    ) {
        Ok(Reply::Answer(a)) => {
            let id = a.request_id.clone();
            let (status, body, raw) = exec_answer(a);
            Out::Bytes(status, encode_object(raw, &body), Some(id))
        }
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

/// Lines of a stream waiting for a slow client, at most, and their bytes at most. Past
/// either the call's events are dropped from there on (the answer still comes, marked
/// `stream_truncated`): the channel is read at the supervisor's pace whatever the client
/// does, so a client that reads slowly or never costs the front nothing but its worker.
pub const STREAM_QUEUE_LINES: usize = 256;
pub const STREAM_QUEUE_BYTES: usize = 1024 * 1024;

/// A streamed call: headers first (before the call's id is known), one line per event,
/// the last line the answer with its `status`. Chunked for HTTP/1.1, each line flushed.
///
/// The channel is read on this thread and the HTTP client written on another, through a
/// bounded queue: the supervisor's events are taken as they come however slowly the
/// client reads, and what does not fit in the queue is dropped, never waited for. Once
/// the call has answered, what is still queued must be taken at the pace of any answer
/// (see [`crate::http::answer`]), or the connection is reset.
fn exec_stream(front: &Front, call: &mut Call, req: ExecRequest) -> Out {
    let Some(rq) = call.rq.take() else {
        return Out::Done;
    };
    // The connection stays open while the writer made of `rq` lives (through the call).
    let wait = ShareWait::until(call.deadline, rq.connection_fd());
    let chunked = *rq.http_version() >= (1, 1);
    let answered = Arc::new(OnceLock::new());
    let mut w = Paced::from_when(rq, answered.clone());
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nX-Zygo-Request-Id: {}\r\nCache-Control: no-store\r\n{}\r\n",
        call.id,
        if chunked {
            "Transfer-Encoding: chunked\r\n"
        } else {
            "Connection: close\r\n"
        }
    );
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(STREAM_QUEUE_LINES);
    let queued = AtomicUsize::new(0);
    let frame = |mut text: Vec<u8>| {
        text.push(b'\n');
        if chunked {
            let mut framed = format!("{:x}\r\n", text.len()).into_bytes();
            framed.extend_from_slice(&text);
            framed.extend_from_slice(b"\r\n");
            framed
        } else {
            text
        }
    };
    std::thread::scope(|s| {
        let queued = &queued;
        // The writer: once the client is gone (a write failed or timed out), what comes
        // is dropped; the call still runs to its answer, so the channel stays in step.
        s.spawn(move || {
            let mut gone = w
                .write_all(head.as_bytes())
                .and_then(|()| w.flush())
                .is_err();
            for bytes in rx {
                if !gone && w.write_all(&bytes).and_then(|()| w.flush()).is_err() {
                    gone = true;
                    crate::http::answer::log_stop(w.stopped(), queued.load(Ordering::Acquire));
                }
                queued.fetch_sub(bytes.len(), Ordering::AcqRel);
            }
            if chunked && !gone {
                let _ = w.write_all(b"0\r\n\r\n").and_then(|()| w.flush());
            }
        });
        let mut cut = false;
        let result = ask_with(
            front,
            &call.who,
            Request::Exec(req),
            call_deadline(call),
            wait,
            |ev| {
                if cut {
                    return;
                }
                let (stream, data) = match ev {
                    ExecEvent::Stdout(d) => ("stdout", d),
                    ExecEvent::Stderr(d) => ("stderr", d),
                    ExecEvent::Progress(d) => ("progress", d),
                };
                let bytes = frame(
                    json!({"stream": stream, "data": data})
                        .to_string()
                        .into_bytes(),
                );
                let n = bytes.len();
                let q = queued.load(Ordering::Acquire);
                if q > 0 && q + n > STREAM_QUEUE_BYTES {
                    cut = true;
                    return;
                }
                queued.fetch_add(n, Ordering::AcqRel);
                if tx.try_send(bytes).is_err() {
                    queued.fetch_sub(n, Ordering::AcqRel);
                    cut = true;
                }
            },
        );
        let (status, last) = match result {
            Ok(Reply::Answer(a)) => {
                let (status, mut body, raw) = exec_answer(a);
                body["status"] = json!(status);
                if cut {
                    body["stream_truncated"] = json!(true);
                }
                (status, joined(encode_object(raw, &body)))
            }
            Ok(r) => {
                let e = unexpected(&r);
                let v = json!({"status": e.status, "error": e.message, "code": e.code});
                (e.status, v.to_string().into_bytes())
            }
            Err(e) => {
                let v = json!({"status": e.status, "error": e.message, "code": e.code});
                (e.status, v.to_string().into_bytes())
            }
        };
        crate::http::metrics::count(status);
        let bytes = frame(last);
        queued.fetch_add(bytes.len(), Ordering::AcqRel);
        // From now on the client must take what is queued at an answer's pace.
        let _ = answered.set(Instant::now());
        // The writer always takes what is queued (writing or dropping it), so this waits
        // at most for the lines ahead of it to be written or given up on.
        let _ = tx.send(bytes);
        drop(tx);
    });
    Out::Done
}

/// `POST /fn/{name}/batch`'s body. Each event is kept as the text it came as: parsed
/// into trees, events of small numbers or many keys take many times their text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    #[serde(borrow)]
    events: Vec<&'a RawValue>,
}

/// The events of a batch's body, checked strictly (a key named twice at any depth is 400)
/// without building any of them.
fn batch_events(bytes: &[u8]) -> Result<Vec<&RawValue>, HttpError> {
    let bad = |e: serde_json::Error| {
        HttpError::bad_request(format!("the body is not what this route takes: {e}"))
    };
    proto::json::from_slice_strict::<IgnoredAny>(bytes).map_err(bad)?;
    let b: BatchBody = serde_json::from_slice(bytes).map_err(bad)?;
    if b.events.len() > MAX_BATCH {
        return Err(HttpError::bad_request(format!(
            "a batch has at most {MAX_BATCH} events; this one has {}",
            b.events.len()
        )));
    }
    Ok(b.events)
}

/// One element of a batch's answer: its status, what a refusal said (for a batch refused
/// as a whole), and its JSON in pieces.
struct Element {
    status: u16,
    error: Option<String>,
    pieces: Vec<Vec<u8>>,
}

impl Element {
    fn len(&self) -> usize {
        self.pieces.iter().map(Vec::len).sum()
    }
}

pub fn batch(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let name = name(call, 0)?;
        Ok::<_, HttpError>((name, call.body()?))
    })();
    let (name, bytes) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    let events = match batch_events(&bytes) {
        Ok(e) => e,
        Err(e) => return e.into(),
    };
    // The answer's budget is its caller's, shared by all its batches at once: each
    // element's reserve is set aside now, and the rest is taken as elements come.
    let party = match super::authenticate(front, &call.who) {
        Ok(p) => p,
        Err(e) => return e.into(),
    };
    let held = match front
        .answers
        .take(&party, events.len() * BATCH_ELEMENT_RESERVE)
    {
        Ok(h) => Mutex::new(h),
        Err(in_use) => {
            return HttpError::new(
                429,
                "busy",
                format!(
                    "this caller's batches being answered hold {} MiB already (at most {} \
                     MiB, all its batches together); retry once one has been answered",
                    in_use >> 20,
                    BATCH_ANSWER_BUDGET >> 20
                ),
            )
            .into();
        }
    };
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Element>>> =
        Mutex::new(std::iter::repeat_with(|| None).take(events.len()).collect());
    let (who, key, deadline) = (&call.who, &call.key, call.deadline);
    let in_flight = BATCH_IN_FLIGHT.min(front.shares.per()).min(events.len());
    std::thread::scope(|s| {
        for _ in 0..in_flight {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::AcqRel);
                let Some(ev) = events.get(i) else { return };
                let answer = compact(ev.get().as_bytes())
                    .and_then(|event| batch_one(front, who, key, deadline, &name, event));
                let element = fit_element(answer, BATCH_ELEMENT_RESERVE, &held);
                let mut results = results.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(slot) = results.get_mut(i) {
                    *slot = Some(element);
                }
            });
        }
    });
    // Every event was taken by a thread, so every element is there.
    let results: Vec<Element> = results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .flatten()
        .collect();
    // Who the caller is holds for every element: refused as a caller (no, an unknown or
    // a revoked token; another tenant's header), the batch is refused as a whole.
    if let Some(first) = results.first() {
        let status = first.status;
        if (status == 401 || status == 403) && results.iter().all(|r| r.status == status) {
            let code = if status == 401 {
                "unauthorized"
            } else {
                "forbidden"
            };
            let msg = first.error.clone().unwrap_or_else(|| code.to_string());
            return HttpError::new(status, code, msg).into();
        }
    }
    drop(events);
    drop(bytes);
    let mut pieces = vec![b"{\"results\":[".to_vec()];
    for (i, e) in results.into_iter().enumerate() {
        if i > 0 {
            pieces.push(b",".to_vec());
        }
        pieces.extend(e.pieces);
    }
    pieces.push(b"]}".to_vec());
    // Held by the call until its answer is written.
    call.hold(held.into_inner().unwrap_or_else(|p| p.into_inner()));
    Out::Bytes(200, pieces, None)
}

/// How many bytes each byte of a string takes in JSON as serde_json writes it.
fn json_width(b: u8) -> usize {
    match b {
        b'"' | b'\\' | 0x08 | 0x09 | 0x0a | 0x0c | 0x0d => 2,
        0x00..=0x1f => 6,
        _ => 1,
    }
}

/// `s` cut, at a character's start, to what takes at most `room` bytes inside a JSON
/// string; and whether it was cut.
fn cut_to(mut s: String, room: usize) -> (String, bool) {
    let mut used = 0;
    let mut end = s.len();
    for (i, b) in s.bytes().enumerate() {
        used += json_width(b);
        if used > room {
            end = i;
            break;
        }
    }
    if end == s.len() {
        return (s, false);
    }
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    (s, true)
}

/// Keep one element within the batch's budget, encoded: its own fields and result must
/// fit in its `reserve` and what is free of its caller's budget (else the element is 413
/// `too_large`, its result left out); then as much of its stdout, and then its stderr,
/// as still fits, each cut at a character's start and marked `*_truncated`. What its
/// reserve did not need goes back to the caller's budget.
fn fit_element(
    answer: Result<ExecAnswer, HttpError>,
    reserve: usize,
    held: &Mutex<AnswerShare>,
) -> Element {
    let mut a = match answer {
        Ok(a) => a,
        Err(e) => return small_element(e, reserve, held),
    };
    let stdout = std::mem::take(&mut a.stdout);
    let stderr = std::mem::take(&mut a.stderr);
    let (status, mut body, raw) = exec_answer(a);
    body["status"] = json!(status);
    let fixed = encoded_len(&raw, &body);
    let mut h = held.lock().unwrap_or_else(|p| p.into_inner());
    let free = h.free();
    if fixed > reserve + free {
        drop(h);
        let e = HttpError::new(
            413,
            "too_large",
            format!(
                "the batch's answer passed {} MiB; this event's result was left out",
                BATCH_ANSWER_BUDGET >> 20
            ),
        );
        return small_element(e, reserve, held);
    }
    let room = (reserve + free) - fixed;
    let (stdout, out_cut) = cut_to(stdout, room);
    let room = room - stdout.bytes().map(json_width).sum::<usize>();
    let (stderr, err_cut) = cut_to(stderr, room);
    body["stdout"] = json!(stdout);
    body["stderr"] = json!(stderr);
    if out_cut {
        body["stdout_truncated"] = json!(true);
    }
    if err_cut {
        body["stderr_truncated"] = json!(true);
    }
    let pieces = encode_object(raw, &body);
    let used: usize = pieces.iter().map(Vec::len).sum();
    // The batch held `reserve` for this element; it holds what the element takes now.
    let now = (h.bytes() + used).saturating_sub(reserve);
    h.set(now);
    Element {
        status,
        error: body
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string),
        pieces,
    }
}

/// An element that is a refusal: small, it fits in its reserve (what it does not need
/// goes back to the caller's budget).
fn small_element(e: HttpError, reserve: usize, held: &Mutex<AnswerShare>) -> Element {
    let v = json!({"status": e.status, "error": e.message, "code": e.code});
    let pieces = vec![v.to_string().into_bytes()];
    let el = Element {
        status: e.status,
        error: Some(e.message),
        pieces,
    };
    let mut h = held.lock().unwrap_or_else(|p| p.into_inner());
    let now = (h.bytes() + el.len()).saturating_sub(reserve);
    h.set(now);
    el
}

/// One element of a batch: sent only while the batch's deadline has time left, with no
/// more than what is left.
fn batch_one(
    front: &Front,
    who: &Credentials,
    key: &Option<String>,
    deadline: Instant,
    name: &str,
    event: String,
) -> Result<ExecAnswer, HttpError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HttpError::new(
            504,
            "timeout",
            "the batch's deadline passed before this event was sent",
        ));
    }
    let req = ExecRequest {
        workspace: None,
        workspace_blob: None,
        out: false,
        name: name.to_string(),
        event,
        key: key.clone(),
        timeout_ms: Some(ms_left(left)),
        stream: false,
        script: None,
    };
    let deadline = Instant::now() + left + crate::http::ANSWER_GRACE;
    // An element waits for one of its own caller's leases (never another caller's).
    let wait = ShareWait {
        until: Some(deadline),
        client: None,
    };
    match ask_with(front, who, Request::Exec(req), deadline, wait, |_| {}) {
        Ok(Reply::Answer(a)) => Ok(a),
        Ok(r) => Err(unexpected(&r)),
        Err(e) => Err(e),
    }
}

pub fn logs(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&["limit"])?;
        let name = name(call, 0)?;
        let n = match call.query("limit") {
            None => 100,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| {
                    HttpError::bad_request(format!("limit={v:?}: a whole number from 1 to 1000"))
                })?,
        };
        Ok::<_, HttpError>((name, n))
    })();
    let (name, n) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::Logs { name, n }) {
        Ok(Reply::Logs { entries, left_out }) => ok(json!({
            "truncated": left_out > 0,
            "left_out": left_out,
            "logs": entries.iter().map(|l| json!({
                "request_id": l.request_id,
                "finished_ms": l.finished_ms,
                "outcome": l.outcome.as_str(),
                "wall_ms": proto::front::ms(l.wall_us),
                "error": l.error,
                "stdout": l.stdout,
                "stderr": l.stderr,
            })).collect::<Vec<_>>()
        })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn stats(front: &Front, call: &mut Call) -> Out {
    let name = match call.only_query(&[]).and_then(|()| name(call, 0)) {
        Ok(n) => n,
        Err(e) => return e.into(),
    };
    match ask(
        front,
        call,
        Request::Stats {
            name: Some(name.clone()),
        },
    ) {
        Ok(Reply::Stats(s)) => match s.into_iter().find(|s| s.name == name) {
            Some(s) => ok(json!({
                "name": s.name,
                "requests": s.requests,
                "ok": s.ok,
                "error": s.error,
                "timeout": s.timeout,
                "cancelled": s.cancelled,
                "stuck": s.stuck,
                "p50_wall_us": s.p50_wall_us,
                "p99_wall_us": s.p99_wall_us,
                "peak_rss_kb": s.peak_rss_kb,
            })),
            None => HttpError::not_found(format!("no function named {name:?}")).into(),
        },
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::fair::AnswerBudgets;

    fn answer(result: &str, stdout: &str, stderr: &str) -> ExecAnswer {
        ExecAnswer {
            request_id: "r".into(),
            outcome: proto::front::Outcome::Ok,
            result: Some(result.into()),
            error: None,
            traceback: None,
            exit_code: None,
            started: true,
            oom_killed: false,
            stdout: stdout.into(),
            stdout_truncated: false,
            stderr: stderr.into(),
            stderr_truncated: false,
            metrics: proto::front::Metrics::default(),
            workspace_out: None,
            workspace_out_truncated: false,
            stream_truncated: false,
            usage: None,
        }
    }

    fn parsed(e: &Element) -> Value {
        serde_json::from_slice(&super::super::joined(e.pieces.clone())).unwrap()
    }

    /// `fit_element` of `answer` in a batch holding `reserve` for it, its caller's budget
    /// having `free` bytes more: the element, what the batch holds after, and what is free.
    fn fit(answer: ExecAnswer, reserve: usize, free: usize) -> (Element, usize, usize) {
        let budgets = Arc::new(AnswerBudgets::new(reserve + free));
        let party = crate::http::fair::Party::Host(None);
        let held = Mutex::new(budgets.take(&party, reserve).unwrap());
        let e = fit_element(Ok(answer), reserve, &held);
        let h = held.into_inner().unwrap();
        let (bytes, free) = (h.bytes(), h.free());
        (e, bytes, free)
    }

    #[test]
    fn a_batch_element_past_its_budget_is_cut_and_marked() {
        // Its own fields, then stdout and stderr from what is left, each cut at a
        // character's start; what the element does not use goes back.
        let fixed = fit(answer("[1,2]", "", ""), 0, 1 << 20).0.len();
        let (e, held, free) = fit(answer("[1,2]", "0123", "éééé"), 0, fixed + 6);
        let v = parsed(&e);
        assert_eq!(v["result"], json!([1, 2]));
        assert_eq!(
            (v["stdout"].as_str(), v["stdout_truncated"].as_bool()),
            (Some("0123"), Some(false))
        );
        assert_eq!(
            (v["stderr"].as_str(), v["stderr_truncated"].as_bool()),
            (Some("é"), Some(true))
        );
        // What it holds and what is left are what there was ("true" is a byte shorter
        // than "false").
        assert_eq!(held, e.len());
        assert_eq!(e.len() + free, fixed + 6);
        assert!(e.len() <= fixed + 6);
        // Escapes count as what they take.
        let v = parsed(&fit(answer("[1,2]", "\n\n", ""), 0, fixed + 3).0);
        assert_eq!(v["stdout"], "\n");
        // An element whose own fields and result do not fit is 413, in its reserve.
        let big = format!("[{}0]", "0,".repeat(5000));
        let (e, held, free) = fit(answer(&big, "out", ""), 1000, 0);
        let v = parsed(&e);
        assert_eq!(
            (v["status"].as_u64(), v["code"].as_str()),
            (Some(413), Some("too_large"))
        );
        assert_eq!((held, free), (e.len(), 1000 - e.len()));
        // A result that fits in the element's reserve is kept, its output cut.
        let v = parsed(&fit(answer(&big, "out", ""), 16 * 1024, 0).0);
        assert_eq!(v["result"].as_array().map(Vec::len), Some(5001));
        assert_eq!(
            (v["stdout"].as_str(), v["stdout_truncated"].as_bool()),
            (Some("out"), Some(false))
        );
    }

    #[test]
    fn an_event_is_checked_strictly_and_kept_as_text() {
        assert_eq!(event_text(b" \n").unwrap(), "null");
        assert_eq!(event_text(b"{\"a\": [0, 0]}").unwrap(), "{\"a\":[0,0]}");
        // Whitespace inside strings, and escaped quotes, stay as they are.
        let text = "{ \"a b\" :\t\"c \\\" d\\\\\" ,\r\n\"é\": [ 1 , 2 ] }";
        assert_eq!(
            event_text(text.as_bytes()).unwrap(),
            "{\"a b\":\"c \\\" d\\\\\",\"é\":[1,2]}"
        );
        for bad in [&b"{\"a\": 1, \"a\": 2}"[..], b"[1,", b"1 2"] {
            assert_eq!(event_text(bad).unwrap_err().status, 400);
        }
    }

    #[test]
    fn a_batchs_events_are_checked_strictly_and_kept_as_text() {
        let ev = batch_events(br#"{"events": [1, {"a": [0, 0]}, "x"]}"#).unwrap();
        let texts: Vec<&str> = ev.iter().map(|e| e.get()).collect();
        assert_eq!(texts, ["1", r#"{"a": [0, 0]}"#, r#""x""#]);
        for bad in [
            &br#"{"events": [{"a": 1, "a": 2}]}"#[..],
            br#"{"events": [], "events": []}"#,
            br#"{"events": [1], "more": 1}"#,
            br#"{"events": 1}"#,
            br#"{"events": [1,]}"#,
            b"{}",
        ] {
            let e = batch_events(bad).unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(bad));
        }
        let many = format!("{{\"events\": [{}0]}}", "0,".repeat(MAX_BATCH));
        assert!(batch_events(many.as_bytes())
            .unwrap_err()
            .message
            .contains("at most"));
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WarmBody {
    #[serde(default)]
    n: Option<u32>,
}

pub fn warm(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let name = name(call, 0)?;
        let b: WarmBody = body::json_or_default(&call.body()?)?;
        let n = b.n.unwrap_or(1);
        if n == 0 || n > 1024 {
            return Err(HttpError::bad_request(
                "n is a whole number from 1 to max_warm",
            ));
        }
        Ok((name, n))
    })();
    let (name, n) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::Warm { name, n }) {
        Ok(Reply::Warmed { name, ready }) => ok(json!({ "name": name, "ready": ready })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}
