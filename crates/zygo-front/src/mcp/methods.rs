//! The parts of answering a message that do not depend on the transport: reading a
//! message's envelope (request, notification or neither), `initialize`, `tools/list`, and
//! checking a `tools/call` down to the [`Call`] it asks for.

use serde_json::{json, Map, Value};

use super::jsonrpc::{self, excerpt, type_name, Id, INVALID_PARAMS, INVALID_REQUEST};
use super::revision::{self, Rev};
use super::tools::{self, parse_arguments, Call, Tool};

/// A JSON-RPC error: code, message, data.
pub type RpcError = (i64, String, Option<Value>);

pub fn invalid_params(msg: impl Into<String>) -> RpcError {
    (INVALID_PARAMS, msg.into(), None)
}

/// How long clients may cache `tools/list` and `server/discover` (the tools never change
/// while the server runs).
pub const CACHE_TTL_MS: u64 = 3_600_000;

/// The server's identity under `rev`.
pub fn server_info(rev: Rev) -> Value {
    let mut i = Map::new();
    i.insert("name".into(), json!("zygo"));
    if rev.has_structured_output() {
        i.insert("title".into(), json!("Zygo"));
    }
    i.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    Value::Object(i)
}

pub fn versions(list: &[Rev]) -> Vec<&'static str> {
    list.iter().map(|r| r.as_str()).collect()
}

/// What one JSON object turned out to be.
#[derive(Debug)]
pub enum Envelope {
    Request {
        id: Id,
        method: String,
        params: Option<Map<String, Value>>,
    },
    Notification {
        method: String,
        params: Option<Map<String, Value>>,
    },
    /// A response from the client: these servers send no requests, so it is ignored.
    Response,
    /// Not a request or a notification at all, or a request whose envelope is wrong: this
    /// error is the answer.
    Refused(Value),
    /// A notification whose envelope is wrong: ignored (a notification is never answered),
    /// and this says why.
    Ignored(String),
}

/// Read a message's envelope. `params` is taken, not copied: it may be most of the message.
pub fn envelope(mut obj: Map<String, Value>) -> Envelope {
    let method = obj.get("method");
    if method.is_none() && (obj.contains_key("result") || obj.contains_key("error")) {
        return Envelope::Response;
    }
    let id = match obj.get("id") {
        None => None,
        Some(v) => match Id::from_value(v) {
            Some(id) => Some(id),
            None => {
                return Envelope::Refused(jsonrpc::error(
                    None,
                    INVALID_REQUEST,
                    format!(
                        "Invalid Request: id must be a string or an integer, not {}",
                        type_name(v)
                    ),
                    None,
                ))
            }
        },
    };
    // A message that is not a request or a notification at all is answered with id null
    // (JSON-RPC's "Invalid Request"); a notification with bad params only logged.
    let refuse = |code: i64, msg: String| match &id {
        Some(id) => Envelope::Refused(jsonrpc::error(Some(id), code, msg, None)),
        None if code == INVALID_REQUEST => Envelope::Refused(jsonrpc::error(None, code, msg, None)),
        None => Envelope::Ignored(msg),
    };
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        return refuse(
            INVALID_REQUEST,
            "Invalid Request: jsonrpc must be \"2.0\"".into(),
        );
    }
    let method = match method {
        Some(Value::String(m)) => m.clone(),
        Some(other) => {
            return refuse(
                INVALID_REQUEST,
                format!(
                    "Invalid Request: method must be a string, not {}",
                    type_name(other)
                ),
            )
        }
        None => return refuse(INVALID_REQUEST, "Invalid Request: no method".into()),
    };
    let params = match obj.remove("params") {
        None => None,
        Some(Value::Object(p)) => Some(p),
        Some(other) => {
            return refuse(
                INVALID_PARAMS,
                format!(
                    "Invalid params: params of {} must be an object, not {}",
                    excerpt(&method),
                    type_name(&other)
                ),
            )
        }
    };
    match id {
        None => Envelope::Notification { method, params },
        Some(id) => Envelope::Request { id, method, params },
    }
}

/// Answer `initialize`: the revision chosen (see [`revision::negotiate`]) and the result.
pub fn initialize(
    params: Option<&Map<String, Value>>,
    instructions: &str,
) -> Result<(Rev, Value), RpcError> {
    let Some(p) = params else {
        return Err(invalid_params(
            "Invalid params: initialize needs params with protocolVersion",
        ));
    };
    let requested = match p.get("protocolVersion") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(invalid_params(format!(
                "Invalid params: protocolVersion must be a string, not {}",
                type_name(other)
            )))
        }
        None => {
            return Err(invalid_params(
                "Invalid params: initialize needs params.protocolVersion",
            ))
        }
    };
    for key in ["capabilities", "clientInfo"] {
        if let Some(v) = p.get(key) {
            if !v.is_object() {
                return Err(invalid_params(format!(
                    "Invalid params: {key} must be an object, not {}",
                    type_name(v)
                )));
            }
        }
    }
    let rev = revision::negotiate(requested);
    let client = p
        .get("clientInfo")
        .and_then(|c| c.get("name"))
        .and_then(Value::as_str)
        .map(excerpt)
        .unwrap_or_else(|| "a client".into());
    log::info!(
        "{client} asked for protocol revision {}; speaking {rev}",
        excerpt(requested)
    );
    Ok((
        rev,
        json!({
            "protocolVersion": rev.as_str(),
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": server_info(rev),
            "instructions": instructions,
        }),
    ))
}

/// Answer `tools/list` with `tools` (one page: a cursor is refused).
pub fn tools_list(
    rev: Rev,
    params: Option<&Map<String, Value>>,
    tools: Vec<Value>,
) -> Result<Value, RpcError> {
    match params.and_then(|p| p.get("cursor")) {
        None | Some(Value::Null) => {}
        Some(Value::String(c)) => {
            return Err(invalid_params(format!(
                "Invalid params: cursor {} is not one this server handed out (the tool list \
                 has one page)",
                excerpt(c)
            )))
        }
        Some(other) => {
            return Err(invalid_params(format!(
                "Invalid params: cursor must be a string, not {}",
                type_name(other)
            )))
        }
    }
    let mut r = json!({ "tools": tools });
    if rev.is_stateless() {
        r["ttlMs"] = json!(CACHE_TTL_MS);
        r["cacheScope"] = json!("public");
    }
    Ok(r)
}

/// What a `tools/call` asks for, checked.
#[derive(Debug)]
pub enum ToolCall {
    /// Carry out `call`; `fn_name` is the function it names, if any (for failures).
    Ready {
        tool: Tool,
        call: Call,
        fn_name: Option<String>,
    },
    /// Its arguments do not fit the tool, and under this revision that is a tool error:
    /// this is the result.
    Answered(Value),
}

/// Check a `tools/call`'s params under `rev`.
pub fn tool_call(rev: Rev, params: Option<&Map<String, Value>>) -> Result<ToolCall, RpcError> {
    let Some(p) = params else {
        return Err(invalid_params(
            "Invalid params: tools/call needs params with name and arguments",
        ));
    };
    let name = match p.get("name") {
        Some(Value::String(n)) => n,
        Some(other) => {
            return Err(invalid_params(format!(
                "Invalid params: name must be a string, not {}",
                type_name(other)
            )))
        }
        None => {
            return Err(invalid_params(
                "Invalid params: tools/call needs params.name",
            ))
        }
    };
    let Some(tool) = Tool::by_name(name) else {
        return Err(invalid_params(format!(
            "Unknown tool: {} (this server has run_code, list_functions, call_function and \
             function_logs)",
            excerpt(name)
        )));
    };
    let empty = Map::new();
    let args = match p.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(a)) => a,
        Some(other) => {
            return Err(invalid_params(format!(
                "Invalid params: arguments must be an object, not {}",
                type_name(other)
            )))
        }
    };
    let fn_name = args.get("name").and_then(Value::as_str);
    match parse_arguments(tool, args) {
        Ok(call) => Ok(ToolCall::Ready {
            tool,
            call,
            fn_name: fn_name.map(str::to_string),
        }),
        Err(msg) if rev.argument_errors_are_tool_errors() => Ok(ToolCall::Answered(
            tools::failure(tool, fn_name, &msg).to_json(rev),
        )),
        Err(msg) => Err(invalid_params(format!("Invalid params: {msg}"))),
    }
}
