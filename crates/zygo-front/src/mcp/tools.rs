//! The four tools: what the model sees (names, descriptions, input and output schemas), how
//! their arguments become the one [`McpRequest`] each may send, and how the monitor side's
//! reply becomes a tool result.
//!
//! The boundary is the type: a tool's arguments are parsed into [`Call`], whose variants
//! carry only code, stdin, a function name, an event, a pool's script and a log count. There is nowhere to
//! put an image, a mount, a network mode, a limit or a path, and unknown argument names are
//! refused, so a model that asks for more is told the ceiling is not its to change.

use proto::front::{ExecAnswer, FunctionInfo, LogEntry, Outcome};
use proto::mcp::{Language, McpReply, McpRequest, RunCodeResult};
use serde_json::{json, Map, Value};

use super::jsonrpc::{excerpt, type_name};
use super::revision::Rev;

/// The most code plus stdin (or event) one call may carry: the channel's frame cap less
/// room for the envelope.
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;

/// `function_logs`' limit is clamped into this range, never refused.
pub const LOG_LIMIT_MIN: i64 = 1;
pub const LOG_LIMIT_MAX: i64 = 200;
pub const LOG_LIMIT_DEFAULT: u32 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    RunCode,
    ListFunctions,
    CallFunction,
    FunctionLogs,
}

/// Listed in this order, always (clients cache the list).
pub const ALL: [Tool; 4] = [
    Tool::RunCode,
    Tool::ListFunctions,
    Tool::CallFunction,
    Tool::FunctionLogs,
];

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::RunCode => "run_code",
            Tool::ListFunctions => "list_functions",
            Tool::CallFunction => "call_function",
            Tool::FunctionLogs => "function_logs",
        }
    }

    pub fn by_name(name: &str) -> Option<Tool> {
        ALL.iter().copied().find(|t| t.name() == name)
    }

    fn title(self) -> &'static str {
        match self {
            Tool::RunCode => "Run code in a sandbox",
            Tool::ListFunctions => "List warm functions",
            Tool::CallFunction => "Call a warm function",
            Tool::FunctionLogs => "Read a warm function's recent requests",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Tool::RunCode => {
                "Run a program in a fresh sandbox and get its exit code, stdout and stderr. \
                 language is python (run with python3), javascript (node) or sh (/bin/sh). \
                 The code is saved as /zygo/main.py, /zygo/main.js or /zygo/main.sh (read-only) \
                 and runs with /work as its working directory: files written under /work \
                 persist between calls, everything else is thrown away when the call ends. \
                 stdin, if given, is fed to the program and then closed. There is no network. \
                 Memory, CPU, process and time limits are fixed by whoever started this server; \
                 a program that exceeds one is killed and the result says which (for example \
                 \"ran out of memory (limit 256M)\"). If list_functions shows a warm function \
                 that does the job, call_function is much faster."
            }
            Tool::ListFunctions => {
                "List the warm functions the running Zygo supervisor serves: name, state \
                 (serving, starting, failed, stopping), ready zygotes and requests in flight. \
                 A warm function has its code and dependencies already loaded and answers in \
                 milliseconds; prefer call_function over run_code when one fits."
            }
            Tool::CallFunction => {
                "Call a warm function served by the running Zygo supervisor with a JSON event \
                 object, and get the handler's return value (result), its stdout and stderr, \
                 or the error and traceback when it failed. Use list_functions to see names. \
                 A runtime pool (kind \"pool\" in list_functions) has no handler of its own: \
                 give the script it runs as code, in the pool's language (a Python pool's \
                 script defines handler(event); a Node pool's exports it as default; a pool \
                 with a command runs it with the event on stdin)."
            }
            Tool::FunctionLogs => {
                "The most recent finished requests of a warm function, newest last: outcome, \
                 wall time, error, stdout and stderr. limit is how many (1 to 200, default 20; \
                 values outside that range are clamped)."
            }
        }
    }

    pub fn input_schema(self) -> Value {
        match self {
            Tool::RunCode => json!({
                "type": "object",
                "properties": {
                    "language": {
                        "type": "string",
                        "enum": ["python", "javascript", "sh"],
                        "description": "python (python3), javascript (node) or sh (/bin/sh)"
                    },
                    "code": {
                        "type": "string",
                        "description": "the whole program"
                    },
                    "stdin": {
                        "type": "string",
                        "description": "text fed to the program's standard input, which is then closed"
                    }
                },
                "required": ["language", "code"],
                "additionalProperties": false
            }),
            Tool::ListFunctions => json!({
                "type": "object",
                "properties": {},
                "additionalProperties": false
            }),
            Tool::CallFunction => json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "the function's name, as list_functions shows it"},
                    "event": {"type": "object", "description": "the JSON event handed to the handler"},
                    "code": {"type": "string", "description": "for a runtime pool only: the script the pool runs for this call"}
                },
                "required": ["name", "event"],
                "additionalProperties": false
            }),
            Tool::FunctionLogs => json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "the function's name"},
                    "limit": {"type": "integer", "description": "how many requests, 1 to 200 (clamped); default 20"}
                },
                "required": ["name"],
                "additionalProperties": false
            }),
        }
    }

    pub fn output_schema(self) -> Value {
        let nullable_string = json!({"type": ["string", "null"]});
        match self {
            Tool::RunCode => json!({
                "type": "object",
                "properties": {
                    "exit_code": {"type": ["integer", "null"], "description": "the program's exit code; 128+N when killed by signal N; null when it never started"},
                    "timed_out": {"type": "boolean"},
                    "oom_killed": {"type": "boolean"},
                    "cancelled": {"type": "boolean"},
                    "stdout": {"type": "string"},
                    "stdout_truncated": {"type": "boolean", "description": "stdout was longer than 1 MiB and was cut"},
                    "stderr": {"type": "string"},
                    "stderr_truncated": {"type": "boolean"},
                    "wall_ms": {"type": "number", "description": "milliseconds, fractional"},
                    "error": {"type": ["string", "null"], "description": "why it failed, in words; null when the program ran and exited by itself"}
                },
                "required": ["exit_code", "timed_out", "oom_killed", "cancelled", "stdout",
                             "stdout_truncated", "stderr", "stderr_truncated", "wall_ms", "error"],
                "additionalProperties": false
            }),
            Tool::ListFunctions => json!({
                "type": "object",
                "properties": {
                    "functions": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "kind": {"type": "string"},
                                "state": {"type": "string"},
                                "error": nullable_string,
                                "ready": {"type": "integer"},
                                "busy": {"type": "integer"},
                                "starting": {"type": "integer"},
                                "frozen": {"type": "integer"},
                                "in_flight": {"type": "integer"},
                                "min_warm": {"type": "integer"},
                                "max_warm": {"type": "integer"}
                            },
                            "required": ["name", "kind", "state", "error", "ready", "busy",
                                         "starting", "frozen", "in_flight", "min_warm", "max_warm"]
                        }
                    },
                    "error": {"type": ["string", "null"], "description": "why the list could not be read"}
                },
                "required": ["functions", "error"],
                "additionalProperties": false
            }),
            Tool::CallFunction => json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "outcome": {"type": "string", "enum": ["ok", "error", "timeout", "cancelled", "stuck", "refused"],
                                "description": "refused: nothing ran (no supervisor, no such function, busy)"},
                    "result": {"description": "the handler's return value when outcome is ok"},
                    "error": {"type": ["string", "null"]},
                    "traceback": {"type": ["string", "null"]},
                    "oom_killed": {"type": "boolean"},
                    "stdout": {"type": "string"},
                    "stdout_truncated": {"type": "boolean"},
                    "stderr": {"type": "string"},
                    "stderr_truncated": {"type": "boolean"},
                    "request_id": {"type": ["string", "null"]},
                    "wall_ms": {"type": "number", "description": "milliseconds, fractional"}
                },
                "required": ["name", "outcome", "result", "error", "traceback", "oom_killed",
                             "stdout", "stdout_truncated", "stderr", "stderr_truncated",
                             "request_id", "wall_ms"],
                "additionalProperties": false
            }),
            Tool::FunctionLogs => json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "entries": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "request_id": {"type": "string"},
                                "finished_ms": {"type": "integer", "description": "milliseconds since the Unix epoch"},
                                "outcome": {"type": "string"},
                                "wall_ms": {"type": "number", "description": "milliseconds, fractional"},
                                "error": nullable_string,
                                "stdout": {"type": "string"},
                                "stderr": {"type": "string"}
                            },
                            "required": ["request_id", "finished_ms", "outcome", "wall_ms",
                                         "error", "stdout", "stderr"]
                        }
                    },
                    "error": {"type": ["string", "null"]}
                },
                "required": ["name", "entries", "error"],
                "additionalProperties": false
            }),
        }
    }

    fn annotations(self) -> Value {
        let (read_only, destructive, open_world) = match self {
            // It can overwrite files in /work; it has no network.
            Tool::RunCode => (false, true, false),
            Tool::ListFunctions | Tool::FunctionLogs => (true, false, false),
            // A function's handler does whatever it was written to do.
            Tool::CallFunction => (false, true, true),
        };
        json!({
            "title": self.title(),
            "readOnlyHint": read_only,
            "destructiveHint": destructive,
            "idempotentHint": read_only,
            "openWorldHint": open_world,
        })
    }

    /// The tool as `tools/list` shows it under `rev`.
    pub fn definition(self, rev: Rev) -> Value {
        let mut t = Map::new();
        t.insert("name".into(), json!(self.name()));
        if rev.has_structured_output() {
            t.insert("title".into(), json!(self.title()));
        }
        t.insert("description".into(), json!(self.description()));
        t.insert("inputSchema".into(), self.input_schema());
        if rev.has_structured_output() {
            t.insert("outputSchema".into(), self.output_schema());
        }
        if rev.has_annotations() {
            t.insert("annotations".into(), self.annotations());
        }
        Value::Object(t)
    }
}

/// Every tool, as listed under `rev`.
pub fn definitions(rev: Rev) -> Vec<Value> {
    ALL.iter().map(|t| t.definition(rev)).collect()
}

/// How `run_code` works at `zygo api`'s `/mcp`, where it is a `POST /run`.
const RUN_CODE_OVER_HTTP: &str = "\
Run a program in a fresh one-shot sandbox and get its exit code, stdout and stderr. language \
is python (run as python3 -c CODE), javascript (node -e CODE) or sh (/bin/sh -c CODE); the \
code is that one argument, at most 128 KiB. stdin, if given, is fed to the program and then \
closed. Nothing is kept between calls. Image, memory, CPU, process and time limits and network \
are the operator's and no argument changes them; a program that exceeds a limit is killed and \
the result says which. It needs deploy rights, as POST /run does: a tenant's token, or the \
bootstrap token of an API started without --allow-deploy, is refused. If list_functions shows \
a warm function that does the job, call_function is much faster.";

/// Every tool, as `zygo api` lists them at `/mcp` under `rev`: the same names and schemas,
/// with `run_code` described as it runs there.
pub fn definitions_http(rev: Rev) -> Vec<Value> {
    let mut defs = definitions(rev);
    for d in &mut defs {
        if d["name"] == Tool::RunCode.name() {
            d["description"] = json!(RUN_CODE_OVER_HTTP);
        }
    }
    defs
}

/// A tool call with its arguments checked: everything the front may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    RunCode {
        language: Language,
        code: String,
        stdin: Option<String>,
    },
    ListFunctions,
    CallFunction {
        name: String,
        event: String,
        /// A runtime pool's script for this call.
        code: Option<String>,
    },
    FunctionLogs {
        name: String,
        limit: u32,
    },
}

impl Call {
    /// The one message this call sends, numbered `call`.
    pub fn request(self, call: u64) -> McpRequest {
        match self {
            Call::RunCode {
                language,
                code,
                stdin,
            } => McpRequest::RunCode {
                call,
                language,
                code,
                stdin,
            },
            Call::ListFunctions => McpRequest::ListFunctions { call },
            Call::CallFunction { name, event, code } => McpRequest::CallFunction {
                call,
                name,
                event,
                code,
            },
            Call::FunctionLogs { name, limit } => McpRequest::FunctionLogs { call, name, limit },
        }
    }
}

fn fixed_by_operator(tool: Tool, key: &str) -> String {
    let takes = match tool {
        Tool::RunCode => "language, code and stdin",
        Tool::ListFunctions => "no arguments",
        Tool::CallFunction => "name, event and (for a runtime pool) code",
        Tool::FunctionLogs => "name and limit",
    };
    format!(
        "{} takes {takes}; {} is not one of them. The image, mounts, network, limits and \
         paths are fixed by whoever started the server and cannot be set by a tool call",
        tool.name(),
        excerpt(key)
    )
}

fn string_arg(tool: Tool, args: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "{}: {key} must be a string, not {}",
            tool.name(),
            type_name(other)
        )),
    }
}

fn required(tool: Tool, v: Option<String>, key: &str) -> Result<String, String> {
    v.ok_or_else(|| format!("{}: {key} is required", tool.name()))
}

/// Check a tool's arguments against its input schema and turn them into a [`Call`]. The
/// error says what is wrong in words a model can act on.
pub fn parse_arguments(tool: Tool, args: &Map<String, Value>) -> Result<Call, String> {
    let known: &[&str] = match tool {
        Tool::RunCode => &["language", "code", "stdin"],
        Tool::ListFunctions => &[],
        Tool::CallFunction => &["name", "event", "code"],
        Tool::FunctionLogs => &["name", "limit"],
    };
    if let Some(k) = args.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(fixed_by_operator(tool, k));
    }
    match tool {
        Tool::RunCode => {
            let language =
                match required(tool, string_arg(tool, args, "language")?, "language")?.as_str() {
                    "python" => Language::Python,
                    "javascript" => Language::Javascript,
                    "sh" => Language::Sh,
                    other => {
                        return Err(format!(
                        "run_code: language {} is not one of \"python\", \"javascript\", \"sh\"",
                        excerpt(other)
                    ))
                    }
                };
            let code = required(tool, string_arg(tool, args, "code")?, "code")?;
            let stdin = string_arg(tool, args, "stdin")?;
            let size = code.len() + stdin.as_ref().map_or(0, String::len);
            if size > MAX_PAYLOAD {
                return Err(format!(
                    "run_code: code and stdin together are {size} bytes, over the 16 MiB a call \
                     may carry; write large data to /work in pieces instead"
                ));
            }
            Ok(Call::RunCode {
                language,
                code,
                stdin,
            })
        }
        Tool::ListFunctions => Ok(Call::ListFunctions),
        Tool::CallFunction => {
            let name = required(tool, string_arg(tool, args, "name")?, "name")?;
            let event = match args.get("event") {
                Some(v @ Value::Object(_)) => v.to_string(),
                None | Some(Value::Null) => {
                    return Err(
                        "call_function: event is required (a JSON object, {} for none)".into(),
                    )
                }
                Some(other) => {
                    return Err(format!(
                        "call_function: event must be a JSON object, not {}",
                        type_name(other)
                    ))
                }
            };
            let code = string_arg(tool, args, "code")?;
            let size = event.len() + code.as_ref().map_or(0, String::len);
            if size > MAX_PAYLOAD {
                return Err(format!(
                    "call_function: the event and code together are {size} bytes, over the 16 MiB a call may carry"
                ));
            }
            Ok(Call::CallFunction { name, event, code })
        }
        Tool::FunctionLogs => {
            let name = required(tool, string_arg(tool, args, "name")?, "name")?;
            let limit = match args.get("limit") {
                None | Some(Value::Null) => LOG_LIMIT_DEFAULT,
                Some(Value::Number(n)) => {
                    let clamped = match (n.as_i64(), n.as_u64()) {
                        (Some(i), _) => i.clamp(LOG_LIMIT_MIN, LOG_LIMIT_MAX),
                        (None, Some(_)) => LOG_LIMIT_MAX,
                        (None, None) => {
                            return Err(format!(
                                "function_logs: limit must be a whole number, not {n}"
                            ))
                        }
                    };
                    u32::try_from(clamped).unwrap_or(LOG_LIMIT_DEFAULT)
                }
                Some(other) => {
                    return Err(format!(
                        "function_logs: limit must be an integer, not {}",
                        type_name(other)
                    ))
                }
            };
            Ok(Call::FunctionLogs { name, limit })
        }
    }
}

/// A tool result: the structured value, and the same as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub structured: Value,
    pub is_error: bool,
}

impl ToolResult {
    /// The `CallToolResult` object under `rev` (without the stateless revision's envelope,
    /// which the server adds to every result).
    pub fn to_json(&self, rev: Rev) -> Value {
        let text = self.structured.to_string();
        let mut r = Map::new();
        r.insert("content".into(), json!([{"type": "text", "text": text}]));
        if rev.has_structured_output() {
            r.insert("structuredContent".into(), self.structured.clone());
        }
        r.insert("isError".into(), json!(self.is_error));
        Value::Object(r)
    }
}

/// A failed call of `tool` that never reached a sandbox or a function: the same shape as a
/// real answer, with `message` as its error.
pub fn failure(tool: Tool, name: Option<&str>, message: &str) -> ToolResult {
    let structured = match tool {
        Tool::RunCode => json!({
            "exit_code": null, "timed_out": false, "oom_killed": false, "cancelled": false,
            "stdout": "", "stdout_truncated": false, "stderr": "", "stderr_truncated": false,
            "wall_ms": 0.0, "error": message,
        }),
        Tool::ListFunctions => json!({"functions": [], "error": message}),
        Tool::CallFunction => json!({
            "name": name.unwrap_or(""), "outcome": "refused", "result": null, "error": message,
            "traceback": null, "oom_killed": false, "stdout": "", "stdout_truncated": false,
            "stderr": "", "stderr_truncated": false, "request_id": null, "wall_ms": 0.0,
        }),
        Tool::FunctionLogs => json!({"name": name.unwrap_or(""), "entries": [], "error": message}),
    };
    ToolResult {
        structured,
        is_error: true,
    }
}

pub fn run_code_result(r: &RunCodeResult) -> ToolResult {
    let structured = json!({
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "oom_killed": r.oom_killed,
        "cancelled": r.cancelled,
        "stdout": r.stdout,
        "stdout_truncated": r.stdout_truncated,
        "stderr": r.stderr,
        "stderr_truncated": r.stderr_truncated,
        "wall_ms": proto::front::ms(r.wall_us),
        "error": r.error,
    });
    ToolResult {
        structured,
        is_error: r.error.is_some() || r.exit_code != Some(0),
    }
}

pub fn function_json(f: &FunctionInfo) -> Value {
    json!({
        "name": f.name,
        "kind": f.kind,
        "state": f.state,
        "error": f.error,
        "ready": f.zygotes.ready,
        "busy": f.zygotes.busy,
        "starting": f.zygotes.starting,
        "frozen": f.zygotes.frozen,
        "in_flight": f.in_flight,
        "min_warm": f.min_warm,
        "max_warm": f.max_warm,
    })
}

pub fn answer_result(name: &str, a: &ExecAnswer) -> ToolResult {
    let result = match &a.result {
        Some(text) => serde_json::from_str::<Value>(text).unwrap_or_else(|_| json!(text)),
        None => Value::Null,
    };
    let error = match (&a.error, a.outcome) {
        (Some(e), _) => Some(e.clone()),
        (None, Outcome::Ok) => None,
        (None, _) if a.oom_killed => Some("the handler ran out of memory".to_string()),
        (None, Outcome::Timeout) => Some("the handler exceeded its time limit".to_string()),
        (None, Outcome::Cancelled) => Some("the call was cancelled".to_string()),
        (None, Outcome::Stuck) => {
            Some("the handler stopped answering (no heartbeat) and was killed".to_string())
        }
        (None, Outcome::Error) => Some("the handler failed".to_string()),
    };
    let structured = json!({
        "name": name,
        "outcome": a.outcome.as_str(),
        "result": result,
        "error": error,
        "traceback": a.traceback,
        "oom_killed": a.oom_killed,
        "stdout": a.stdout,
        "stdout_truncated": a.stdout_truncated,
        "stderr": a.stderr,
        "stderr_truncated": a.stderr_truncated,
        "request_id": a.request_id,
        "wall_ms": proto::front::ms(a.metrics.wall_us),
    });
    ToolResult {
        structured,
        is_error: a.outcome != Outcome::Ok,
    }
}

pub fn log_json(e: &LogEntry) -> Value {
    json!({
        "request_id": e.request_id,
        "finished_ms": e.finished_ms,
        "outcome": e.outcome.as_str(),
        "wall_ms": proto::front::ms(e.wall_us),
        "error": e.error,
        "stdout": e.stdout,
        "stderr": e.stderr,
    })
}

/// The tool result for the monitor side's reply to `call`.
pub fn render(tool: Tool, call: &Call, reply: &McpReply) -> ToolResult {
    let name = match call {
        Call::CallFunction { name, .. } | Call::FunctionLogs { name, .. } => Some(name.as_str()),
        _ => None,
    };
    match (tool, reply) {
        (_, McpReply::ToolError { message, .. }) => failure(tool, name, message),
        (Tool::RunCode, McpReply::RunCode { result, .. }) => run_code_result(result),
        (Tool::ListFunctions, McpReply::Functions { functions, .. }) => ToolResult {
            structured: json!({
                "functions": functions.iter().map(function_json).collect::<Vec<_>>(),
                "error": null,
            }),
            is_error: false,
        },
        (Tool::CallFunction, McpReply::Called { answer, .. }) => {
            answer_result(name.unwrap_or(""), answer)
        }
        (Tool::FunctionLogs, McpReply::Logs { entries, .. }) => ToolResult {
            structured: json!({
                "name": name.unwrap_or(""),
                "entries": entries.iter().map(log_json).collect::<Vec<_>>(),
                "error": null,
            }),
            is_error: false,
        },
        (tool, _) => failure(
            tool,
            name,
            "internal error: the sandbox side answered with another kind of reply",
        ),
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::revision::{HANDSHAKE, STATELESS};

    /// Every property name in a schema, at any depth.
    fn property_names(schema: &Value, out: &mut Vec<String>) {
        match schema {
            Value::Object(m) => {
                if let Some(Value::Object(props)) = m.get("properties") {
                    out.extend(props.keys().cloned());
                }
                for v in m.values() {
                    property_names(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| property_names(v, out)),
            _ => {}
        }
    }

    /// Words that would let a tool call widen the sandbox: pick the image, mount something,
    /// reach a network, raise a limit, name a host path or set the environment. A property
    /// containing any of them fails the test.
    const WIDENING: &[&str] = &[
        "image",
        "mount",
        "volume",
        "bind",
        "network",
        "net",
        "egress",
        "allow",
        "host",
        "port",
        "proxy",
        "mem",
        "cpu",
        "pids",
        "process",
        "timeout",
        "deadline",
        "scratch",
        "disk",
        "quota",
        "rlimit",
        "cgroup",
        "path",
        "file",
        "dir",
        "folder",
        "cwd",
        "workspace",
        "root",
        "chroot",
        "env",
        "variable",
        "secret",
        "tenant",
        "uid",
        "gid",
        "user",
        "privilege",
        "capabilit",
        "seccomp",
        "landlock",
        "namespace",
        "device",
    ];

    /// The rule that shapes `zygo mcp`: no tool's input can name an image, a mount, a
    /// network, a limit, a path or the environment. Adding such a field looks harmless on
    /// its own, which is why this test exists: a model reading untrusted text must not be
    /// able to ask for more than the person who installed the server granted.
    #[test]
    fn no_tool_can_widen_the_sandbox() {
        for rev in HANDSHAKE.iter().chain(STATELESS.iter()) {
            for def in definitions(*rev) {
                let tool = def["name"].as_str().unwrap();
                let schema = &def["inputSchema"];
                assert_eq!(schema["type"], "object", "{tool}");
                assert_eq!(
                    schema["additionalProperties"], false,
                    "{tool} must refuse fields it does not name"
                );
                let mut names = Vec::new();
                property_names(schema, &mut names);
                for n in &names {
                    let lower = n.to_ascii_lowercase();
                    for w in WIDENING {
                        assert!(
                            !lower.contains(w),
                            "{tool}'s input schema has {n:?}, which looks like {w:?}: tools \
                             must not be able to widen the sandbox"
                        );
                    }
                }
                // Only these may exist at all; a new one needs a review of this rule.
                let allowed = ["language", "code", "stdin", "name", "event", "limit"];
                for n in &names {
                    assert!(
                        allowed.contains(&n.as_str()),
                        "{tool}: new input field {n:?}"
                    );
                }
            }
        }
        // And the parser refuses such fields even if a client sends them anyway.
        for tool in ALL {
            for w in [
                "image",
                "mounts",
                "network",
                "mem",
                "cpu",
                "pids",
                "timeout",
                "path",
                "env",
                "workspace",
                "cwd",
                "allow",
                "scratch",
            ] {
                let mut args = Map::new();
                args.insert(w.into(), json!("x"));
                let err = parse_arguments(tool, &args).unwrap_err();
                assert!(
                    err.contains("fixed by whoever started the server"),
                    "{tool:?} {w}: {err}"
                );
            }
        }
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn run_code_arguments() {
        let c = parse_arguments(
            Tool::RunCode,
            &args(json!({"language": "python", "code": "print(1)", "stdin": "x"})),
        )
        .unwrap();
        assert_eq!(
            c,
            Call::RunCode {
                language: Language::Python,
                code: "print(1)".into(),
                stdin: Some("x".into())
            }
        );
        let bad = [
            (json!({"code": "x"}), "language is required"),
            (json!({"language": "ruby", "code": "x"}), "is not one of"),
            (json!({"language": "sh"}), "code is required"),
            (
                json!({"language": "sh", "code": 5}),
                "code must be a string, not an integer",
            ),
            (
                json!({"language": "sh", "code": "x", "stdin": [1]}),
                "stdin must be a string",
            ),
        ];
        for (a, want) in bad {
            let e = parse_arguments(Tool::RunCode, &args(a.clone())).unwrap_err();
            assert!(e.contains(want), "{a}: {e}");
        }
    }

    #[test]
    fn function_arguments() {
        let c = parse_arguments(
            Tool::CallFunction,
            &args(json!({"name": "f", "event": {"a": [1, 2]}})),
        )
        .unwrap();
        assert_eq!(
            c,
            Call::CallFunction {
                name: "f".into(),
                event: r#"{"a":[1,2]}"#.into(),
                code: None,
            }
        );
        // A runtime pool's script comes as `code`, a string.
        let c = parse_arguments(
            Tool::CallFunction,
            &args(json!({"name": "py", "event": {}, "code": "def handler(e):\n    return 1\n"})),
        )
        .unwrap();
        assert_eq!(
            c.request(7),
            McpRequest::CallFunction {
                call: 7,
                name: "py".into(),
                event: "{}".into(),
                code: Some("def handler(e):\n    return 1\n".into()),
            }
        );
        assert!(parse_arguments(
            Tool::CallFunction,
            &args(json!({"name": "py", "event": {}, "code": 5}))
        )
        .unwrap_err()
        .contains("code must be a string"));
        assert!(parse_arguments(
            Tool::CallFunction,
            &args(json!({"name": "f", "event": "x"}))
        )
        .unwrap_err()
        .contains("must be a JSON object"));
        for (limit, want) in [
            (json!(0), 1),
            (json!(-5), 1),
            (json!(50), 50),
            (json!(500), 200),
            (json!(u64::MAX), 200),
            (json!(null), LOG_LIMIT_DEFAULT),
        ] {
            let c = parse_arguments(
                Tool::FunctionLogs,
                &args(json!({"name": "f", "limit": limit})),
            )
            .unwrap();
            assert_eq!(
                c,
                Call::FunctionLogs {
                    name: "f".into(),
                    limit: want
                }
            );
        }
        assert!(parse_arguments(
            Tool::FunctionLogs,
            &args(json!({"name": "f", "limit": 2.5}))
        )
        .unwrap_err()
        .contains("whole number"));
        assert!(parse_arguments(
            Tool::FunctionLogs,
            &args(json!({"name": "f", "limit": "9"}))
        )
        .unwrap_err()
        .contains("must be an integer"));
    }

    #[test]
    fn definitions_follow_the_revision() {
        let old = Tool::RunCode.definition(Rev::V2024_11_05);
        assert!(old.get("outputSchema").is_none() && old.get("annotations").is_none());
        let mid = Tool::RunCode.definition(Rev::V2025_03_26);
        assert!(mid.get("outputSchema").is_none() && mid.get("annotations").is_some());
        let new = Tool::RunCode.definition(Rev::V2025_06_18);
        assert!(new.get("outputSchema").is_some() && new.get("title").is_some());
        let r = failure(Tool::RunCode, None, "boom").to_json(Rev::V2024_11_05);
        assert!(r.get("structuredContent").is_none());
        assert_eq!(r["isError"], true);
        let r = failure(Tool::RunCode, None, "boom").to_json(Rev::V2025_06_18);
        assert_eq!(r["structuredContent"]["error"], "boom");
        let text: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text, r["structuredContent"]);
    }

    /// Every failure has its tool's output shape: the keys the schema requires, and no
    /// other.
    #[test]
    fn failures_fit_the_output_schemas() {
        for tool in ALL {
            let s = failure(tool, Some("f"), "why").structured;
            let schema = tool.output_schema();
            let req: Vec<&str> = schema["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let keys: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
            for r in &req {
                assert!(keys.contains(r), "{tool:?} misses {r}");
            }
            for k in &keys {
                assert!(
                    schema["properties"].get(*k).is_some(),
                    "{tool:?} has extra {k}"
                );
            }
        }
    }
}
