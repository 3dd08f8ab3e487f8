//! The JSON-RPC server: reads one message per line, answers each request on a thread of its
//! own, writes every answer whole as one line under a lock.
//!
//! # Order and threads
//!
//! The reading thread decides, in input order, everything that depends on earlier messages:
//! `initialize` is answered right there (it sets the revision later requests are served
//! under), and every other request is classified (its revision, whether its method exists,
//! whether its id is free) before its thread starts. So `initialize` followed at once by
//! `tools/list` is served under the revision just negotiated, while a 30 s `run_code` never
//! holds up a `tools/list` behind it.
//!
//! # Cancellation
//!
//! `notifications/cancelled` marks the named request: if it already asked the sandbox side
//! for something, that call is cancelled (its sandbox is killed), and whatever it was going
//! to answer is dropped — the spec says a cancelled request gets no answer. A request is
//! sent to the sandbox side while the in-flight table is locked, so a cancel can never
//! overtake the call it cancels.
//!
//! # End of input
//!
//! Standard input closing is the host's shutdown signal. Reading stops; requests still
//! running get [`Config::eof_grace`] to finish and be answered; what is left is cancelled.
//! Then [`Server::serve`] returns, the front exits, and the sandbox side (which sees its
//! channel close) kills what remains and removes the scratch workspace.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::jsonrpc::{
    self, excerpt, type_name, Id, Line, LineReader, INTERNAL_ERROR, INVALID_REQUEST, MAX_LINE,
    METHOD_NOT_FOUND, PARSE_ERROR, UNSUPPORTED_PROTOCOL_VERSION,
};
use crate::link::{lock, Link, LinkError};
use crate::revision::{Rev, PREFERRED, STATELESS};
use crate::tools::{self, render, Call, Tool};
use zygo_front::mcp::methods::{
    self, envelope, invalid_params, server_info, versions, Envelope, RpcError, ToolCall,
    CACHE_TTL_MS,
};

const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// What the server tells the model about itself.
pub const INSTRUCTIONS: &str = "\
Zygo runs code in sandboxes the Linux kernel enforces. Prefer a warm function over run_code \
where one exists: call list_functions first, and if a function there does the job, use \
call_function. A warm function answers in milliseconds with its dependencies already \
imported; run_code starts a fresh sandbox for every call (tens of milliseconds or more) with \
only what the image has. run_code runs python, javascript (node) or sh with /work as its \
working directory; files under /work persist between calls, everything else is discarded, \
and there is no network. Memory, CPU, process and time limits are set by whoever started this \
server and no tool argument can change them: when a program is killed, the result says which \
limit it hit, so change the program, not the request.";

#[derive(Debug, Clone)]
pub struct Config {
    /// How long requests still running when standard input closes may go on (and be
    /// answered) before they are cancelled.
    pub eof_grace: Duration,
    /// The most requests answered at once; more are refused with an error.
    pub max_in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            eof_grace: Duration::from_secs(5),
            max_in_flight: 64,
        }
    }
}

#[derive(Debug, Default)]
struct Flight {
    cancelled: bool,
    /// The sandbox-side call this request made, once it made it.
    call: Option<u64>,
}

/// Where a request's answer goes: straight out, or to the batch it came in.
#[derive(Clone)]
enum Sink {
    Out,
    Batch(mpsc::Sender<Option<Value>>),
}

/// What handling one message produced.
enum Handled {
    /// Nothing to answer (a notification, or a message that is ignored).
    Nothing,
    /// This answer, now.
    Now(Value),
    /// A thread will deliver exactly one `Option<Value>` to the sink (None: cancelled).
    Later,
}

pub struct Server {
    out: Mutex<Box<dyn Write + Send>>,
    out_broken: AtomicBool,
    link: Arc<Link>,
    /// The revision `initialize` chose, if one did.
    negotiated: Mutex<Option<Rev>>,
    inflight: Mutex<HashMap<Id, Flight>>,
    idle: Condvar,
    cfg: Config,
}

impl Server {
    pub fn new(out: Box<dyn Write + Send>, link: Arc<Link>, cfg: Config) -> Arc<Server> {
        Arc::new(Server {
            out: Mutex::new(out),
            out_broken: AtomicBool::new(false),
            link,
            negotiated: Mutex::new(None),
            inflight: Mutex::new(HashMap::new()),
            idle: Condvar::new(),
            cfg,
        })
    }

    /// Serve `input` until it ends, then let running requests finish within the grace and
    /// cancel the rest.
    pub fn serve(self: &Arc<Self>, input: impl BufRead) {
        let mut reader = LineReader::new(input, MAX_LINE);
        loop {
            match reader.next_line() {
                Ok(Line::Message(bytes)) => self.on_line(&bytes),
                Ok(Line::TooLong { len }) => {
                    log::warn!("skipped a message of {len} bytes: over the 20 MiB limit");
                    self.write(&jsonrpc::error(
                        None,
                        INVALID_REQUEST,
                        format!(
                            "a message of {len} bytes is over this server's limit of {MAX_LINE} \
                             bytes for one line; it was skipped"
                        ),
                        Some(json!({"limit": MAX_LINE})),
                    ));
                }
                Ok(Line::Truncated { len }) => {
                    log::warn!(
                        "standard input ended in the middle of a message ({len} bytes without \
                         a newline); it was ignored"
                    );
                    break;
                }
                Ok(Line::Eof) => break,
                Err(e) => {
                    log::error!("read standard input: {e}");
                    break;
                }
            }
        }
        self.drain();
    }

    fn drain(&self) {
        let deadline = Instant::now() + self.cfg.eof_grace;
        let mut fl = lock(&self.inflight);
        while !fl.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            fl = self
                .idle
                .wait_timeout(fl, left)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
        if !fl.is_empty() {
            log::warn!(
                "standard input closed; cancelling {} request(s) still running",
                fl.len()
            );
            for f in fl.values_mut() {
                f.cancelled = true;
                if let Some(call) = f.call {
                    self.link.cancel(call);
                }
            }
        }
    }

    /// Write one message as one line. Lines are assembled first and written whole under
    /// the lock, so two answers never interleave.
    fn write(&self, msg: &Value) {
        let mut line = match serde_json::to_vec(msg) {
            Ok(l) => l,
            Err(e) => {
                log::error!("encode an answer: {e}");
                return;
            }
        };
        line.push(b'\n');
        let mut out = lock(&self.out);
        if let Err(e) = out.write_all(&line).and_then(|()| out.flush()) {
            if !self.out_broken.swap(true, Ordering::SeqCst) {
                log::error!("write to standard output: {e}; answers are being lost");
            }
        }
    }

    fn on_line(self: &Arc<Self>, bytes: &[u8]) {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                log::warn!("a message is not valid UTF-8; answered with a parse error");
                self.write(&jsonrpc::error(
                    None,
                    PARSE_ERROR,
                    format!(
                        "Parse error: the message is not valid UTF-8 (bad byte at offset {})",
                        e.valid_up_to()
                    ),
                    None,
                ));
                return;
            }
        };
        // Strict: an object with a duplicate key anywhere is a parse error, so no id is
        // guessed from a message that names two.
        let value: Value = match proto::json::from_str_strict(text) {
            Ok(v) => v,
            Err(e) => {
                log::warn!("a message is not valid JSON: {e}");
                self.write(&jsonrpc::error(
                    None,
                    PARSE_ERROR,
                    format!("Parse error: the message is not valid JSON ({e})"),
                    None,
                ));
                return;
            }
        };
        match value {
            Value::Object(obj) => match self.on_message(obj, &Sink::Out) {
                Handled::Now(v) => self.write(&v),
                Handled::Nothing | Handled::Later => {}
            },
            Value::Array(items) => self.on_batch(items),
            other => self.write(&jsonrpc::error(
                None,
                INVALID_REQUEST,
                format!(
                    "Invalid Request: a message must be a JSON object, not {}",
                    type_name(&other)
                ),
                None,
            )),
        }
    }

    fn on_batch(self: &Arc<Self>, items: Vec<Value>) {
        let negotiated = *lock(&self.negotiated);
        if items.is_empty() {
            self.write(&jsonrpc::error(
                None,
                INVALID_REQUEST,
                "Invalid Request: an empty batch",
                None,
            ));
            return;
        }
        if !negotiated.is_some_and(Rev::allows_batches) {
            let speaking = negotiated.map_or_else(
                || "no revision yet (send initialize first)".to_string(),
                |r| format!("revision {r}"),
            );
            self.write(&jsonrpc::error(
                None,
                INVALID_REQUEST,
                format!(
                    "Invalid Request: JSON-RPC batches exist only in protocol revision \
                     2025-03-26, and this connection speaks {speaking}; send one message per line"
                ),
                None,
            ));
            return;
        }
        let (tx, rx) = mpsc::channel();
        let mut answers = Vec::new();
        let mut waiting = 0usize;
        for item in items {
            match item {
                Value::Object(o) if o.get("method") == Some(&json!("initialize")) => {
                    let id = o.get("id").and_then(Id::from_value);
                    if id.is_some() {
                        answers.push(jsonrpc::error(
                            id.as_ref(),
                            INVALID_REQUEST,
                            "Invalid Request: initialize must not be part of a batch",
                            None,
                        ));
                    }
                }
                Value::Object(o) => match self.on_message(o, &Sink::Batch(tx.clone())) {
                    Handled::Nothing => {}
                    Handled::Now(v) => answers.push(v),
                    Handled::Later => waiting += 1,
                },
                other => answers.push(jsonrpc::error(
                    None,
                    INVALID_REQUEST,
                    format!(
                        "Invalid Request: a batch element must be a JSON object, not {}",
                        type_name(&other)
                    ),
                    None,
                )),
            }
        }
        drop(tx);
        if waiting == 0 {
            if !answers.is_empty() {
                self.write(&Value::Array(answers));
            }
            return;
        }
        let me = self.clone();
        let collect = move || {
            for _ in 0..waiting {
                match rx.recv() {
                    Ok(Some(v)) => answers.push(v),
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
            if !answers.is_empty() {
                me.write(&Value::Array(answers));
            }
        };
        if let Err(e) = std::thread::Builder::new().spawn(collect) {
            log::error!("start a thread for a batch: {e}; its answers are lost");
        }
    }

    fn on_message(self: &Arc<Self>, obj: Map<String, Value>, sink: &Sink) -> Handled {
        match envelope(obj) {
            Envelope::Response => {
                log::warn!("ignored a response from the client: this server sends no requests");
                Handled::Nothing
            }
            Envelope::Refused(answer) => Handled::Now(answer),
            Envelope::Ignored(why) => {
                log::warn!("ignored a notification: {why}");
                Handled::Nothing
            }
            Envelope::Notification { method, params } => {
                self.on_notification(&method, params.as_ref());
                Handled::Nothing
            }
            Envelope::Request { id, method, params } => self.on_request(id, method, params, sink),
        }
    }

    fn on_notification(&self, method: &str, params: Option<&Map<String, Value>>) {
        match method {
            "notifications/cancelled" => {
                let Some(id) = params
                    .and_then(|p| p.get("requestId"))
                    .and_then(Id::from_value)
                else {
                    log::warn!("ignored notifications/cancelled without a valid requestId");
                    return;
                };
                let reason = params
                    .and_then(|p| p.get("reason"))
                    .and_then(Value::as_str)
                    .map(|r| format!(" ({})", excerpt(r)))
                    .unwrap_or_default();
                self.cancel(&id, &reason);
            }
            "notifications/initialized" => log::debug!("the client is initialized"),
            other => log::debug!("ignored notification {}", excerpt(other)),
        }
    }

    fn cancel(&self, id: &Id, reason: &str) {
        let mut fl = lock(&self.inflight);
        match fl.get_mut(id) {
            Some(f) if !f.cancelled => {
                f.cancelled = true;
                log::info!("request {id} cancelled by the client{reason}");
                if let Some(call) = f.call {
                    self.link.cancel(call);
                }
            }
            Some(_) => {}
            None => log::debug!("cancel for request {id}, which is not running"),
        }
    }

    /// The revision a request claims in its `_meta` (the stateless era), checked.
    fn stateless_claim(claim: &Value, meta: &Map<String, Value>) -> Result<Rev, RpcError> {
        let Some(asked) = claim.as_str() else {
            return Err(invalid_params(format!(
                "Invalid params: _meta {META_PROTOCOL_VERSION} must be a string, not {}",
                type_name(claim)
            )));
        };
        let Some(rev) = Rev::parse(asked).filter(|r| r.is_stateless()) else {
            return Err((
                UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version".into(),
                Some(json!({"supported": versions(&STATELESS), "requested": asked})),
            ));
        };
        match meta.get(META_CLIENT_CAPABILITIES) {
            Some(Value::Object(_)) => {}
            Some(other) => {
                return Err(invalid_params(format!(
                    "Invalid params: _meta {META_CLIENT_CAPABILITIES} must be an object, not {}",
                    type_name(other)
                )))
            }
            None => {
                return Err(invalid_params(format!(
                    "Invalid params: _meta lacks {META_CLIENT_CAPABILITIES}, which revision {rev} \
                     requires on every request"
                )))
            }
        }
        if let Some(info) = meta.get(META_CLIENT_INFO) {
            if !info.is_object() {
                return Err(invalid_params(format!(
                    "Invalid params: _meta {META_CLIENT_INFO} must be an object, not {}",
                    type_name(info)
                )));
            }
        }
        Ok(rev)
    }

    fn on_request(
        self: &Arc<Self>,
        id: Id,
        method: String,
        params: Option<Map<String, Value>>,
        sink: &Sink,
    ) -> Handled {
        let now_err =
            |(code, msg, data): RpcError| Handled::Now(jsonrpc::error(Some(&id), code, msg, data));
        if method == "initialize" {
            return Handled::Now(match self.initialize(params.as_ref()) {
                Ok(r) => jsonrpc::result(&id, r),
                Err((code, msg, data)) => jsonrpc::error(Some(&id), code, msg, data),
            });
        }
        let meta = params
            .as_ref()
            .and_then(|p| p.get("_meta"))
            .and_then(Value::as_object);
        let claim = meta.and_then(|m| m.get(META_PROTOCOL_VERSION));
        let rev = match (claim, meta) {
            (Some(c), Some(m)) => match Self::stateless_claim(c, m) {
                Ok(r) => r,
                Err(e) => return now_err(e),
            },
            _ if method == "server/discover" => {
                return now_err(invalid_params(format!(
                    "Invalid params: server/discover belongs to the stateless revision 2026-07-28; \
                     send params._meta with {META_PROTOCOL_VERSION} and {META_CLIENT_CAPABILITIES}"
                )))
            }
            _ => lock(&self.negotiated).unwrap_or(PREFERRED),
        };
        let known = match method.as_str() {
            "ping" => rev.has_ping(),
            "tools/list" | "tools/call" => true,
            "server/discover" => rev.is_stateless(),
            _ => false,
        };
        if !known {
            return now_err((
                METHOD_NOT_FOUND,
                format!(
                    "Method not found: {} (under revision {rev} this server answers {})",
                    excerpt(&method),
                    if rev.is_stateless() {
                        "server/discover, tools/list and tools/call"
                    } else {
                        "initialize, ping, tools/list and tools/call"
                    }
                ),
                None,
            ));
        }
        {
            let mut fl = lock(&self.inflight);
            if fl.contains_key(&id) {
                return now_err((
                    INVALID_REQUEST,
                    format!("Invalid Request: id {id} is already used by a request still running"),
                    None,
                ));
            }
            if fl.len() >= self.cfg.max_in_flight {
                return now_err((
                    INTERNAL_ERROR,
                    format!(
                        "{} requests are already running, the most this server takes at once; \
                         wait for some answers",
                        fl.len()
                    ),
                    None,
                ));
            }
            fl.insert(id.clone(), Flight::default());
        }
        let me = self.clone();
        let sink2 = sink.clone();
        let id2 = id.clone();
        let work = move || {
            let answer = me.answer(&id2, rev, &method, params);
            me.finish(&id2, answer, &sink2);
        };
        match std::thread::Builder::new().spawn(work) {
            Ok(_) => Handled::Later,
            Err(e) => {
                lock(&self.inflight).remove(&id);
                now_err((
                    INTERNAL_ERROR,
                    format!("could not start a thread for this request: {e}"),
                    None,
                ))
            }
        }
    }

    fn finish(&self, id: &Id, answer: Value, sink: &Sink) {
        let mut fl = lock(&self.inflight);
        let cancelled = fl.remove(id).is_some_and(|f| f.cancelled);
        let answer = if cancelled {
            log::info!("request {id} was cancelled; its answer is dropped");
            None
        } else {
            Some(answer)
        };
        // Written while the table is locked, so a cancel either comes first (and the answer
        // is dropped) or finds the request gone.
        match sink {
            Sink::Out => {
                if let Some(a) = &answer {
                    self.write(a);
                }
            }
            Sink::Batch(tx) => {
                let _ = tx.send(answer);
            }
        }
        drop(fl);
        self.idle.notify_all();
    }

    fn answer(&self, id: &Id, rev: Rev, method: &str, params: Option<Map<String, Value>>) -> Value {
        let res = match method {
            "ping" => Ok(json!({})),
            "tools/list" => Self::tools_list(rev, params.as_ref()),
            "server/discover" => Ok(json!({
                "supportedVersions": versions(&STATELESS),
                "capabilities": {"tools": {"listChanged": false}},
                "instructions": INSTRUCTIONS,
                "ttlMs": CACHE_TTL_MS,
                "cacheScope": "public",
            })),
            "tools/call" => self.tools_call(id, rev, params.as_ref()),
            other => Err((
                METHOD_NOT_FOUND,
                format!("Method not found: {}", excerpt(other)),
                None,
            )),
        };
        match res {
            Ok(mut r) => {
                if rev.is_stateless() {
                    if let Value::Object(m) = &mut r {
                        m.insert("resultType".into(), json!("complete"));
                        let meta = m.entry("_meta").or_insert_with(|| json!({}));
                        if let Value::Object(meta) = meta {
                            meta.insert(META_SERVER_INFO.into(), server_info(rev));
                        }
                    }
                }
                jsonrpc::result(id, r)
            }
            Err((code, msg, data)) => jsonrpc::error(Some(id), code, msg, data),
        }
    }

    fn initialize(&self, params: Option<&Map<String, Value>>) -> Result<Value, RpcError> {
        let (rev, result) = methods::initialize(params, INSTRUCTIONS)?;
        *lock(&self.negotiated) = Some(rev);
        Ok(result)
    }

    fn tools_list(rev: Rev, params: Option<&Map<String, Value>>) -> Result<Value, RpcError> {
        methods::tools_list(rev, params, tools::definitions(rev))
    }

    fn tools_call(
        &self,
        id: &Id,
        rev: Rev,
        params: Option<&Map<String, Value>>,
    ) -> Result<Value, RpcError> {
        match methods::tool_call(rev, params)? {
            ToolCall::Answered(result) => Ok(result),
            ToolCall::Ready {
                tool,
                call,
                fn_name,
            } => Ok(self
                .call_monitor(id, tool, call, fn_name.as_deref())
                .to_json(rev)),
        }
    }

    fn call_monitor(
        &self,
        id: &Id,
        tool: Tool,
        call: Call,
        fn_name: Option<&str>,
    ) -> tools::ToolResult {
        let n = self.link.next_call();
        let req = call.clone().request(n);
        let rx = {
            // Sent with the table locked, so a cancel for this request cannot be sent to
            // the sandbox side before the call it cancels.
            let mut fl = lock(&self.inflight);
            match fl.get_mut(id) {
                Some(f) if !f.cancelled => match self.link.send(&req) {
                    Ok(rx) => {
                        f.call = Some(n);
                        rx
                    }
                    Err(e) => return tools::failure(tool, fn_name, &e.to_string()),
                },
                _ => return tools::failure(tool, fn_name, "cancelled by the client"),
            }
        };
        match rx.recv() {
            Ok(reply) => render(tool, &call, &reply),
            Err(_) => {
                self.link.forget(n);
                tools::failure(tool, fn_name, &LinkError::Gone.to_string())
            }
        }
    }
}
