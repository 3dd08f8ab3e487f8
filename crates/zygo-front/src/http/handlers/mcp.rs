//! `POST /mcp`: MCP's Streamable HTTP transport, the same four tools as `zygo mcp`, for
//! agent platforms that reach tool servers over HTTP.
//!
//! Each POST carries one JSON-RPC message and is a request of the HTTP API like any other:
//! its bearer token was checked before its body was read, and every tool is carried out
//! with the typed request the matching route sends (`List`, `Logs`, `Exec`, `Run`), as the
//! caller the token names. So a tool reaches exactly what the caller's token reaches over
//! the rest of the API: a tenant lists and calls its own functions only, and `run_code` is
//! a `POST /run`, which needs deploy rights. The ceiling (image, limits, network) is the
//! operator's, as for every route; no tool argument names any of it.
//!
//! The transport, as this server offers it:
//! - no sessions: every POST stands alone, so nothing is kept between requests and any
//!   worker serves any of them. After `initialize`, the revision is the request's
//!   `MCP-Protocol-Version` header (2025-03-26 when there is none, as the spec says); one
//!   this server does not speak is 400;
//! - answers are `application/json`; a notification or a response is answered 202 with no
//!   body; GET and DELETE are 405 (there is no server stream and no session to end);
//! - a JSON-RPC batch (an array) is refused with 400: one message per POST;
//! - against DNS rebinding (a page of another site that had its name resolve to this
//!   server's address, driving the tools from a browser): on any listener, an `Origin` that
//!   is not this server's own (`http://` or `https://` and the request's `Host`) is 403;
//!   and on a loopback listener started with `--no-auth`, where no token stands between
//!   such a page and the tools, a `Host` that is not a loopback name (`localhost`,
//!   `127.0.0.1`, `[::1]`, with a port or not) is 403 too. With a token the page has
//!   nothing to send, and a reverse proxy on the same machine may forward its own name;
//! - the body is parsed strictly (a key named twice anywhere is a parse error) within the
//!   API's 16 MiB cap.

use proto::api::{RunAnswer, RunBody};
use proto::front::{ExecRequest, Reply, Request, ScriptRef};
use proto::mcp::{Language, RunCodeResult};
use serde_json::{json, Map, Value};

use super::{ask, ask_with, call_deadline, share_wait, unexpected};
use crate::http::{one_header, Call, Front, HttpError, Out};
use crate::mcp::jsonrpc::{
    self, excerpt, type_name, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR,
};
use crate::mcp::methods::{self, envelope, Envelope, RpcError, ToolCall};
use crate::mcp::revision::{Rev, HANDSHAKE};
use crate::mcp::tools::{self, Call as ToolArgs, Tool, ToolResult};

/// What `initialize` tells the model about this server.
pub const INSTRUCTIONS: &str = "\
Zygo runs code in sandboxes the Linux kernel enforces. Prefer a warm function over run_code \
where one exists: call list_functions first, and if a function there does the job, use \
call_function. A warm function answers in milliseconds with its dependencies already \
imported; run_code starts a fresh sandbox for every call with only what the image has, and \
keeps nothing between calls. What this server lets you list, call and run is what the token \
it was given may reach over Zygo's HTTP API; limits, image and network are set by the \
operator and no tool argument can change them: when a program is killed, the result says \
which limit it hit, so change the program, not the request.";

/// The revision of a request after `initialize` that names none (the spec's rule for a
/// server with no other way to know).
pub const WITHOUT_HEADER: Rev = Rev::V2025_03_26;

/// How one POST is answered.
enum Answer {
    /// 200 with this JSON-RPC message.
    Message(Value),
    /// 202, no body.
    Accepted,
    /// An error status with this JSON-RPC error.
    Status(u16, Value),
    /// Refused by the API before the message was read (its body's size or pace), in the
    /// API's own error shape; the connection is closed after it.
    Http(HttpError),
}

pub fn post(front: &Front, call: &mut Call) -> Out {
    let answer = match check_headers(front, call) {
        Ok(header_rev) => match read_message(call) {
            Ok(obj) => on_message(front, call, obj, header_rev),
            Err(a) => a,
        },
        Err(a) => a,
    };
    match answer {
        Answer::Message(v) => Out::Json(200, v, None),
        Answer::Accepted => Out::Bytes(202, Vec::new(), None),
        Answer::Status(status, v) => Out::Json(status, v, None),
        Answer::Http(e) => Out::Err(e),
    }
}

fn status_error(status: u16, code: i64, msg: impl Into<String>) -> Answer {
    Answer::Status(status, jsonrpc::error(None, code, msg, None))
}

/// The headers MCP's transport asks a server to check: `Origin`, `Content-Type`,
/// `Accept`, and `MCP-Protocol-Version` (its revision, if it names one).
fn check_headers(front: &Front, call: &Call) -> Result<Option<Rev>, Answer> {
    let Some(rq) = call.rq.as_ref() else {
        return Ok(None);
    };
    let bad = |e: HttpError| status_error(400, INVALID_REQUEST, e.message);
    call.only_query(&[]).map_err(bad)?;
    let host = one_header(rq, "Host").map_err(bad)?.unwrap_or("");
    if front.loopback && front.flags.no_auth && !is_loopback_host(host) {
        log::warn!(
            "refused an MCP request for host {}: this server listens on a loopback address \
             without tokens (--no-auth)",
            excerpt(host)
        );
        return Err(status_error(
            403,
            INVALID_REQUEST,
            format!(
                "Forbidden: Host {} is not a loopback name, and this server listens on a \
                 loopback address without tokens (--no-auth); connect as localhost, \
                 127.0.0.1 or [::1]",
                excerpt(host)
            ),
        ));
    }
    if let Some(origin) = one_header(rq, "Origin").map_err(bad)? {
        if !same_origin(origin, host) {
            log::warn!(
                "refused an MCP request from origin {}: not this server's own ({})",
                excerpt(origin),
                excerpt(host)
            );
            return Err(status_error(
                403,
                INVALID_REQUEST,
                format!(
                    "Forbidden: Origin {} is not this server's own origin; MCP over HTTP is \
                     not served to web pages of other origins",
                    excerpt(origin)
                ),
            ));
        }
    }
    let ctype = one_header(rq, "Content-Type").map_err(bad)?.unwrap_or("");
    if !media_type_is(ctype, "application/json") {
        return Err(status_error(
            415,
            INVALID_REQUEST,
            format!(
                "Unsupported Media Type: POST /mcp takes Content-Type application/json, not {}",
                excerpt(ctype)
            ),
        ));
    }
    if let Some(accept) = one_header(rq, "Accept").map_err(bad)? {
        if !accepts_json(accept) {
            return Err(status_error(
                406,
                INVALID_REQUEST,
                format!(
                    "Not Acceptable: this server answers application/json, which Accept {} \
                     does not take (send Accept: application/json, text/event-stream)",
                    excerpt(accept)
                ),
            ));
        }
    }
    match one_header(rq, "MCP-Protocol-Version").map_err(bad)? {
        None => Ok(None),
        Some(v) => match Rev::parse(v.trim()).filter(|r| HANDSHAKE.contains(r)) {
            Some(r) => Ok(Some(r)),
            None => Err(status_error(
                400,
                INVALID_REQUEST,
                format!(
                    "Bad Request: MCP-Protocol-Version {} is not a revision this server speaks \
                     over HTTP ({})",
                    excerpt(v),
                    methods::versions(&HANDSHAKE).join(", ")
                ),
            )),
        },
    }
}

/// Whether a `Host` value names this machine's loopback: `localhost`, an address in
/// 127.0.0.0/8 or `[::1]`, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inner, port)) if port.is_empty() || port.starts_with(':') => inner,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `origin` is `http://HOST` or `https://HOST` for the `Host` the request came to.
pub fn same_origin(origin: &str, host: &str) -> bool {
    let host = host.trim();
    if host.is_empty() {
        return false;
    }
    let origin = origin.trim();
    ["http://", "https://"].iter().any(|scheme| {
        origin
            .strip_prefix(scheme)
            .is_some_and(|rest| rest.eq_ignore_ascii_case(host))
    })
}

/// Whether a `Content-Type` value is `want` (parameters such as `charset` allowed).
fn media_type_is(value: &str, want: &str) -> bool {
    value
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(want))
}

/// Whether an `Accept` value takes `application/json`.
fn accepts_json(accept: &str) -> bool {
    accept.split(',').any(|item| {
        let t = item.split(';').next().unwrap_or("").trim();
        ["application/json", "application/*", "*/*"]
            .iter()
            .any(|w| t.eq_ignore_ascii_case(w))
    })
}

/// The body as one JSON-RPC message (an object), strictly.
fn read_message(call: &mut Call) -> Result<Map<String, Value>, Answer> {
    let bytes = call.body().map_err(Answer::Http)?;
    let value: Value = proto::json::from_slice_strict(&bytes).map_err(|e| {
        status_error(
            400,
            PARSE_ERROR,
            format!("Parse error: the body is not one valid JSON value ({e})"),
        )
    })?;
    match value {
        Value::Object(obj) => Ok(obj),
        Value::Array(_) => Err(status_error(
            400,
            INVALID_REQUEST,
            "Invalid Request: JSON-RPC batches are not taken at /mcp; send one message per POST",
        )),
        other => Err(status_error(
            400,
            INVALID_REQUEST,
            format!(
                "Invalid Request: a message must be a JSON object, not {}",
                type_name(&other)
            ),
        )),
    }
}

fn on_message(
    front: &Front,
    call: &Call,
    obj: Map<String, Value>,
    header_rev: Option<Rev>,
) -> Answer {
    match envelope(obj) {
        Envelope::Response => {
            log::debug!("ignored a response from an MCP client: this server sends no requests");
            Answer::Accepted
        }
        Envelope::Refused(err) => {
            // A request with a usable id is answered; anything else was not a request.
            if err.get("id").is_some_and(|id| !id.is_null()) {
                Answer::Message(err)
            } else {
                Answer::Status(400, err)
            }
        }
        Envelope::Ignored(why) => {
            log::debug!("ignored an MCP notification: {why}");
            Answer::Accepted
        }
        Envelope::Notification { method, .. } => {
            log::debug!("MCP notification {}", excerpt(&method));
            Answer::Accepted
        }
        Envelope::Request { id, method, params } => {
            match on_request(front, call, &method, params.as_ref(), header_rev) {
                Ok(Ok(v)) => Answer::Message(jsonrpc::result(&id, v)),
                Ok(Err((code, msg, data))) => {
                    Answer::Message(jsonrpc::error(Some(&id), code, msg, data))
                }
                Err(e) => Answer::Http(e),
            }
        }
    }
}

/// Answer one request. The outer error is the caller's refusal as the API says it (401 for
/// a token the supervisor does not know, 403 for a tenant header a tenant token may not
/// send): no MCP answer at all.
fn on_request(
    front: &Front,
    call: &Call,
    method: &str,
    params: Option<&Map<String, Value>>,
    header_rev: Option<Rev>,
) -> Result<Result<Value, RpcError>, HttpError> {
    if method != "tools/call" {
        // Every request is judged by the supervisor, not only the ones that carry out a
        // tool: a revoked token gets no answer from the next request on.
        ask(front, call, Request::Version)?;
    }
    if method == "initialize" {
        return Ok(methods::initialize(params, INSTRUCTIONS).map(|(_, result)| result));
    }
    let rev = header_rev.unwrap_or(WITHOUT_HEADER);
    Ok(match method {
        "ping" => Ok(json!({})),
        "tools/list" => methods::tools_list(rev, params, tools::definitions_http(rev)),
        "tools/call" => match methods::tool_call(rev, params) {
            Err(e) => Err(e),
            Ok(ToolCall::Answered(result)) => Ok(result),
            Ok(ToolCall::Ready {
                tool,
                call: args,
                fn_name,
            }) => Ok(carry_out(front, call, tool, args, fn_name.as_deref())?.to_json(rev)),
        },
        other => Err((
            METHOD_NOT_FOUND,
            format!(
                "Method not found: {} (this server answers initialize, ping, tools/list and \
                 tools/call)",
                excerpt(other)
            ),
            None,
        )),
    })
}

/// A refusal of the supervisor's (or the front's), as a tool's error; a caller the
/// supervisor does not know gets the API's 401 instead.
fn refused(tool: Tool, name: Option<&str>, e: HttpError) -> Result<ToolResult, HttpError> {
    if e.status == 401 {
        return Err(e);
    }
    Ok(tools::failure(
        tool,
        name,
        &format!("refused ({}): {}", e.code, e.message),
    ))
}

/// Carry out one tool call with the request its route sends, as the caller.
fn carry_out(
    front: &Front,
    call: &Call,
    tool: Tool,
    args: ToolArgs,
    name: Option<&str>,
) -> Result<ToolResult, HttpError> {
    match args {
        ToolArgs::ListFunctions => match ask(front, call, Request::List) {
            Ok(Reply::Functions(fs)) => Ok(ToolResult {
                structured: json!({
                    "functions": fs.iter().map(tools::function_json).collect::<Vec<_>>(),
                    "error": null,
                }),
                is_error: false,
            }),
            Ok(r) => refused(tool, name, unexpected(&r)),
            Err(e) => refused(tool, name, e),
        },
        ToolArgs::FunctionLogs { name: f, limit } => {
            match ask(
                front,
                call,
                Request::Logs {
                    name: f.clone(),
                    n: limit,
                },
            ) {
                Ok(Reply::Logs { entries, .. }) => Ok(ToolResult {
                    structured: json!({
                        "name": f,
                        "entries": entries.iter().map(tools::log_json).collect::<Vec<_>>(),
                        "error": null,
                    }),
                    is_error: false,
                }),
                Ok(r) => refused(tool, name, unexpected(&r)),
                Err(e) => refused(tool, name, e),
            }
        }
        ToolArgs::CallFunction {
            name: f,
            event,
            code,
        } => {
            let req = ExecRequest {
                name: f.clone(),
                event,
                key: call.key.clone(),
                timeout_ms: Some(call.timeout_ms),
                stream: false,
                script: code.map(|c| ScriptRef::Source(c.into_bytes())),
                workspace: None,
                workspace_blob: None,
                out: false,
            };
            match ask_with(
                front,
                &call.who,
                Request::Exec(req),
                call_deadline(call),
                share_wait(call),
                |_| {},
            ) {
                Ok(Reply::Answer(a)) => Ok(tools::answer_result(&f, &a)),
                Ok(r) => refused(tool, name, unexpected(&r)),
                Err(e) => refused(tool, name, e),
            }
        }
        ToolArgs::RunCode {
            language,
            code,
            stdin,
        } => run_code(front, call, language, code, stdin),
    }
}

/// `run_code` as `POST /run`: the code is the argument of `python3 -c`, `node -e` or
/// `/bin/sh -c`, with the operator's defaults for everything else.
fn run_code(
    front: &Front,
    call: &Call,
    language: Language,
    code: String,
    stdin: Option<String>,
) -> Result<ToolResult, HttpError> {
    let tool = Tool::RunCode;
    let max = proto::api::run_caps::MAX_ARG;
    if code.len() > max {
        return Ok(tools::failure(
            tool,
            None,
            &format!(
                "the code is {} bytes; over HTTP it is passed as one argument, which holds at \
                 most {max} bytes",
                code.len()
            ),
        ));
    }
    let (prog, flag) = match language {
        Language::Python => ("python3", "-c"),
        Language::Javascript => ("node", "-e"),
        Language::Sh => ("/bin/sh", "-c"),
    };
    // A key the run can be cancelled by if its answer does not come in time.
    let key = call
        .key
        .clone()
        .unwrap_or_else(|| format!("zygo-mcp-{}", crate::http::new_request_id()));
    let spec = RunBody {
        cmd: vec![prog.to_string(), flag.to_string(), code],
        stdin: stdin.map(|s| s.into_bytes().into()),
        key: Some(key.clone()),
        ..RunBody::default()
    };
    match ask_with(
        front,
        &call.who,
        Request::Run { spec },
        call.deadline,
        share_wait(call),
        |_| {},
    ) {
        Ok(Reply::RunAnswer(a)) => {
            crate::delivery::usage(&a.usage);
            Ok(tools::run_code_result(&run_code_words(&a)))
        }
        Ok(r) => refused(tool, None, unexpected(&r)),
        Err(e) => {
            if e.status == 503 {
                // The answer did not come: end the run rather than leave it running.
                if let Err(c) = ask(front, call, Request::Cancel { key }) {
                    log::warn!(
                        "cancel an MCP run_code whose answer did not come: {}",
                        c.message
                    );
                }
            }
            refused(tool, None, e)
        }
    }
}

/// A run's answer with what ended it in words, as `zygo mcp`'s `run_code` says it.
fn run_code_words(a: &RunAnswer) -> RunCodeResult {
    let error = if !a.started {
        Some(format!(
            "the sandbox could not start: {}",
            a.error.as_deref().unwrap_or("no reason was given")
        ))
    } else if a.timed_out {
        Some("exceeded its time limit".to_string())
    } else if a.oom_killed {
        Some("ran out of memory".to_string())
    } else if let Some(e) = &a.error {
        Some(format!("the sandbox failed: {e}"))
    } else {
        a.signal.map(|s| format!("was killed by signal {s}"))
    };
    RunCodeResult {
        exit_code: if a.started { a.exit_code } else { None },
        timed_out: a.timed_out,
        oom_killed: a.oom_killed,
        cancelled: false,
        stdout: a.stdout.clone(),
        stdout_truncated: a.stdout_truncated,
        stderr: a.stderr.clone(),
        stderr_truncated: a.stderr_truncated,
        wall_us: a.wall_us,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_servers_own_origin_is_taken() {
        assert!(same_origin("http://127.0.0.1:7700", "127.0.0.1:7700"));
        assert!(same_origin("https://api.example.com", "API.example.com"));
        for (origin, host) in [
            ("http://evil.example", "127.0.0.1:7700"),
            ("http://127.0.0.1:7700.evil.example", "127.0.0.1:7700"),
            ("null", "127.0.0.1:7700"),
            ("http://127.0.0.1:7700", ""),
            ("ftp://127.0.0.1:7700", "127.0.0.1:7700"),
            ("http://127.0.0.1:7701", "127.0.0.1:7700"),
        ] {
            assert!(!same_origin(origin, host), "{origin} at {host}");
        }
    }

    #[test]
    fn on_loopback_only_loopback_names_are_taken() {
        for h in [
            "localhost",
            "LOCALHOST:7700",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:7700",
            "127.9.9.9:1",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "",
            "evil.example.com",
            "evil.example.com:7700",
            "localhost.evil.example",
            "10.0.0.1:7700",
            "[::2]:1",
            "[::1]x",
            "127.0.0.1:x",
            "t",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn accept_and_content_type() {
        assert!(accepts_json("application/json, text/event-stream"));
        assert!(accepts_json("text/event-stream;q=0.5, */*;q=0.1"));
        assert!(!accepts_json("text/event-stream"));
        assert!(media_type_is(
            "application/json; charset=utf-8",
            "application/json"
        ));
        assert!(!media_type_is("text/plain", "application/json"));
        assert!(!media_type_is("", "application/json"));
    }

    #[test]
    fn a_run_says_what_ended_it() {
        let mut a = RunAnswer {
            request_id: "r".into(),
            started: true,
            phase: "run".into(),
            error: None,
            exit_code: Some(137),
            signal: Some(9),
            timed_out: false,
            oom_killed: true,
            wall_us: 1500,
            cpu_us: 0,
            peak_rss_kb: 0,
            stdout: String::new(),
            stdout_truncated: false,
            stderr: String::new(),
            stderr_truncated: false,
            usage: None,
        };
        assert_eq!(
            run_code_words(&a).error.as_deref(),
            Some("ran out of memory")
        );
        a.oom_killed = false;
        a.timed_out = true;
        assert_eq!(
            run_code_words(&a).error.as_deref(),
            Some("exceeded its time limit")
        );
        a.started = false;
        a.error = Some("no image".into());
        let r = run_code_words(&a);
        assert_eq!(r.exit_code, None);
        assert_eq!(
            r.error.as_deref(),
            Some("the sandbox could not start: no image")
        );
    }
}
