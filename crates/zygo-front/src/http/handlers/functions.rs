//! `/fn…`: list, serve from a layer, stop, call (plain, streamed, batched), logs, stats,
//! warm.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use proto::api::{Credentials, ServeKind};
use proto::front::{ExecEvent, ExecRequest, Reply, Request};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    ask, ask_until, ask_with, call_deadline, exec_answer, function_info, ms_left, name, unexpected,
};
use crate::http::{body, ok, Call, Front, HttpError, Out};

/// Events in one batch, at most.
pub const MAX_BATCH: usize = 1000;
/// Events of one batch in flight at once, at most (and never more than its caller's share
/// of the channels).
pub const BATCH_IN_FLIGHT: usize = 16;
/// What a batch's answer may hold of its elements' output (stdout, stderr and results
/// together). Past it an element's stdout and stderr are cut (`*_truncated: true`), and
/// a result over [`BATCH_SMALL_RESULT`] that does not fit is left out (that element is
/// 413 `too_large`); a smaller result is always kept.
pub const BATCH_ANSWER_BUDGET: usize = 64 * 1024 * 1024;
/// A result this small is kept in a batch's answer even past its budget (at most 1000 of
/// them: 64 MiB more at worst).
pub const BATCH_SMALL_RESULT: usize = 64 * 1024;

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
    let req = Request::ServeLayer {
        name,
        kind,
        layer: Value::Object(layer).to_string(),
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

/// An event body: empty is `null`; otherwise one JSON value (strict).
pub fn event_text(bytes: &[u8]) -> Result<String, HttpError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok("null".into());
    }
    let v: Value = body::json(bytes)?;
    Ok(v.to_string())
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
    match ask_until(
        front,
        &call.who,
        Request::Exec(req),
        call_deadline(call),
        |_| {},
    ) {
        Ok(Reply::Answer(a)) => {
            let (status, body) = exec_answer(&a);
            Out::Json(status, body, None)
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
/// client reads, and what does not fit in the queue is dropped, never waited for.
fn exec_stream(front: &Front, call: &mut Call, req: ExecRequest) -> Out {
    let Some(rq) = call.rq.take() else {
        return Out::Done;
    };
    let chunked = *rq.http_version() >= (1, 1);
    let mut w = rq.into_writer();
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
    let frame = |v: &Value| {
        let mut text = v.to_string();
        text.push('\n');
        if chunked {
            format!("{:x}\r\n{text}\r\n", text.len()).into_bytes()
        } else {
            text.into_bytes()
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
                }
                queued.fetch_sub(bytes.len(), Ordering::AcqRel);
            }
            if chunked && !gone {
                let _ = w.write_all(b"0\r\n\r\n").and_then(|()| w.flush());
            }
        });
        let mut cut = false;
        let result = ask_until(
            front,
            &call.who,
            Request::Exec(req),
            call_deadline(call),
            |ev| {
                if cut {
                    return;
                }
                let (stream, data) = match ev {
                    ExecEvent::Stdout(d) => ("stdout", d),
                    ExecEvent::Stderr(d) => ("stderr", d),
                    ExecEvent::Progress(d) => ("progress", d),
                };
                let bytes = frame(&json!({"stream": stream, "data": data}));
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
        let last = match result {
            Ok(Reply::Answer(a)) => {
                let (status, mut body) = exec_answer(&a);
                body["status"] = json!(status);
                if cut {
                    body["stream_truncated"] = json!(true);
                }
                body
            }
            Ok(r) => {
                let e = unexpected(&r);
                json!({"status": e.status, "error": e.message, "code": e.code})
            }
            Err(e) => json!({"status": e.status, "error": e.message, "code": e.code}),
        };
        crate::http::metrics::count(last["status"].as_u64().unwrap_or(200) as u16);
        let bytes = frame(&last);
        queued.fetch_add(bytes.len(), Ordering::AcqRel);
        // The writer always takes what is queued (writing or dropping it), so this waits
        // at most for the lines ahead of it to be written or given up on.
        let _ = tx.send(bytes);
        drop(tx);
    });
    Out::Done
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    events: Vec<Value>,
}

pub fn batch(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let name = name(call, 0)?;
        let b: BatchBody = body::json(&call.body()?)?;
        if b.events.len() > MAX_BATCH {
            return Err(HttpError::bad_request(format!(
                "a batch has at most {MAX_BATCH} events; this one has {}",
                b.events.len()
            )));
        }
        Ok((name, b.events))
    })();
    let (name, events) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    let next = AtomicUsize::new(0);
    let results: Mutex<BTreeMap<usize, Value>> = Mutex::new(BTreeMap::new());
    let budget = Mutex::new(BATCH_ANSWER_BUDGET);
    let (who, key, deadline) = (&call.who, &call.key, call.deadline);
    let in_flight = BATCH_IN_FLIGHT.min(front.shares.per()).min(events.len());
    std::thread::scope(|s| {
        for _ in 0..in_flight {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::AcqRel);
                let Some(ev) = events.get(i) else { return };
                let mut v = batch_one(front, who, key, deadline, &name, ev);
                {
                    let mut left = budget.lock().unwrap_or_else(|p| p.into_inner());
                    fit_in_budget(&mut v, &mut left);
                }
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(i, v);
            });
        }
    });
    let results: Vec<Value> = results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_values()
        .collect();
    // Who the caller is holds for every element: refused as a caller (no, an unknown or
    // a revoked token; another tenant's header), the batch is refused as a whole.
    if let Some(first) = results.first() {
        let status = first["status"].as_u64().unwrap_or(0);
        if (status == 401 || status == 403)
            && results.iter().all(|r| r["status"] == first["status"])
        {
            let code = if status == 401 {
                "unauthorized"
            } else {
                "forbidden"
            };
            let msg = first["error"].as_str().unwrap_or(code).to_string();
            return HttpError::new(status as u16, code, msg).into();
        }
    }
    ok(json!({ "results": results }))
}

/// Keep a batch element's answer within what is `left` of the batch's answer budget:
/// its result first (left out, as 413 `too_large`, when it does not fit and is over
/// [`BATCH_SMALL_RESULT`]), then as much of its stdout and then its stderr as fits, each
/// cut at a character's start and marked `*_truncated`.
fn fit_in_budget(v: &mut Value, left: &mut usize) {
    let result_len = v.get("result").map_or(0, |r| r.to_string().len());
    if result_len > *left && result_len > BATCH_SMALL_RESULT {
        *v = json!({
            "status": 413,
            "error": format!(
                "the batch's answer passed {} MiB; this event's result was left out",
                BATCH_ANSWER_BUDGET >> 20
            ),
            "code": "too_large",
        });
        return;
    }
    *left = left.saturating_sub(result_len);
    for (text, flag) in [
        ("stdout", "stdout_truncated"),
        ("stderr", "stderr_truncated"),
    ] {
        let Some(Value::String(s)) = v.get_mut(text) else {
            continue;
        };
        if s.len() > *left {
            let mut cut = *left;
            while cut > 0 && !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            v[flag] = json!(true);
        }
        let Some(Value::String(s)) = v.get(text) else {
            continue;
        };
        *left -= s.len();
    }
}

/// One element of a batch: sent only while the batch's deadline has time left, with no
/// more than what is left.
fn batch_one(
    front: &Front,
    who: &Credentials,
    key: &Option<String>,
    deadline: Instant,
    name: &str,
    ev: &Value,
) -> Value {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return json!({
            "status": 504,
            "error": "the batch's deadline passed before this event was sent",
            "code": "timeout",
        });
    }
    let req = ExecRequest {
        workspace: None,
        workspace_blob: None,
        out: false,
        name: name.to_string(),
        event: ev.to_string(),
        key: key.clone(),
        timeout_ms: Some(ms_left(left)),
        stream: false,
        script: None,
    };
    let deadline = Instant::now() + left + crate::http::ANSWER_GRACE;
    // An element waits for one of its own caller's leases (never another caller's).
    match ask_with(
        front,
        who,
        Request::Exec(req),
        deadline,
        Some(deadline),
        |_| {},
    ) {
        Ok(Reply::Answer(a)) => {
            let (status, mut body) = exec_answer(&a);
            body["status"] = json!(status);
            body
        }
        Ok(r) => {
            let e = unexpected(&r);
            json!({"status": e.status, "error": e.message, "code": e.code})
        }
        Err(e) => json!({"status": e.status, "error": e.message, "code": e.code}),
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
                "wall_ms": l.wall_ms as f64,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_answer_past_its_budget_is_cut_and_marked() {
        let mut left = 10;
        let mut v = json!({"status": 200, "result": "ab", "stdout": "0123", "stderr": "éééé",
            "stdout_truncated": false, "stderr_truncated": false});
        fit_in_budget(&mut v, &mut left);
        // "ab" is 4 bytes of JSON; 4 of stdout; 2 of stderr (one é).
        assert_eq!(v["stdout"], "0123");
        assert_eq!(v["stdout_truncated"], false);
        assert_eq!(v["stderr"], "é");
        assert_eq!(v["stderr_truncated"], true);
        assert_eq!(left, 0);
        // Past the budget a small result is still kept; a big one is left out.
        let mut v = json!({"status": 200, "result": "small", "stdout": "x", "stderr": "",
            "stdout_truncated": false});
        fit_in_budget(&mut v, &mut left);
        assert_eq!(
            (v["result"].as_str(), v["stdout"].as_str()),
            (Some("small"), Some(""))
        );
        assert_eq!(v["stdout_truncated"], true);
        let big = "r".repeat(BATCH_SMALL_RESULT + 1);
        let mut v = json!({"status": 200, "result": big, "stdout": "", "stderr": ""});
        fit_in_budget(&mut v, &mut left);
        assert_eq!(
            (v["status"].as_u64(), v["code"].as_str()),
            (Some(413), Some("too_large"))
        );
        let mut left = 100;
        let mut v = json!({"status": 504, "error": "late", "code": "timeout"});
        fit_in_budget(&mut v, &mut left);
        assert_eq!(v["code"], "timeout");
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
