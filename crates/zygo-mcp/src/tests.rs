//! The protocol driven in-process: a [`Server`] reading lines a test writes, answering
//! on a socket the test reads, and asking a fake sandbox side over a real socketpair.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use proto::front::{ExecAnswer, FunctionInfo, LogEntry, Metrics, Outcome, ZygoteCounts};
use proto::mcp::{McpReply, McpRequest, RunCodeResult, MAX_MCP_FRAME};
use proto::{read_frame, write_frame};
use serde_json::{json, Value};

use crate::link::Link;
use crate::server::{Config, Server};

/// What the fake sandbox side saw.
type Seen = Arc<Mutex<Vec<McpRequest>>>;

fn run_result(stdout: &str, exit: i32, cancelled: bool) -> RunCodeResult {
    RunCodeResult {
        exit_code: Some(exit),
        timed_out: false,
        oom_killed: false,
        cancelled,
        stdout: stdout.into(),
        stdout_truncated: false,
        stderr: String::new(),
        stderr_truncated: false,
        wall_us: 3_250,
        error: cancelled.then(|| "cancelled".to_string()),
    }
}

/// The fake sandbox side: `sleep` code waits for its cancel; anything else is echoed back
/// as stdout; the function tools answer canned data.
fn fake_monitor(mut sock: UnixStream, seen: Seen) {
    let mut tx = sock.try_clone().unwrap();
    let mut sleeping: HashMap<u64, ()> = HashMap::new();
    while let Ok(req) = read_frame::<_, McpRequest>(&mut sock, MAX_MCP_FRAME) {
        seen.lock().unwrap().push(req.clone());
        let reply = match req {
            McpRequest::RunCode { call, code, .. } if code.starts_with("sleep") => {
                sleeping.insert(call, ());
                None
            }
            McpRequest::RunCode {
                call, code, stdin, ..
            } => Some(McpReply::RunCode {
                call,
                result: run_result(&format!("{code}{}", stdin.unwrap_or_default()), 0, false),
            }),
            McpRequest::Cancel { call } => sleeping.remove(&call).map(|()| McpReply::RunCode {
                call,
                result: run_result("", 137, true),
            }),
            McpRequest::ListFunctions { call } => Some(McpReply::Functions {
                call,
                functions: vec![FunctionInfo {
                    name: "hello".into(),
                    tenant: None,
                    kind: "function".into(),
                    state: "serving".into(),
                    error: None,
                    zygotes: ZygoteCounts {
                        ready: 1,
                        busy: 0,
                        frozen: 0,
                        starting: 0,
                    },
                    in_flight: 0,
                    min_warm: 1,
                    max_warm: 4,
                }],
            }),
            McpRequest::CallFunction { call, name, .. } if name == "missing" => {
                Some(McpReply::ToolError {
                    call,
                    message: "no function named missing".into(),
                })
            }
            McpRequest::CallFunction { call, event, .. } => Some(McpReply::Called {
                call,
                answer: ExecAnswer {
                    request_id: "r1".into(),
                    outcome: Outcome::Ok,
                    result: Some(format!("{{\"echo\":{event}}}")),
                    error: None,
                    traceback: None,
                    exit_code: None,
                    started: true,
                    oom_killed: false,
                    stdout: "out".into(),
                    stdout_truncated: false,
                    stderr: String::new(),
                    stderr_truncated: false,
                    metrics: Metrics {
                        wall_us: 2_000,
                        cpu_us: 1_000,
                        peak_rss_kb: 10,
                    },
                    usage: None,
                    workspace_out: None,
                    workspace_out_truncated: false,
                    stream_truncated: false,
                },
            }),
            McpRequest::FunctionLogs { call, limit, .. } => Some(McpReply::Logs {
                call,
                entries: vec![LogEntry {
                    request_id: format!("limit={limit}"),
                    finished_ms: 1,
                    outcome: Outcome::Ok,
                    wall_us: 2_000,
                    error: None,
                    stdout: String::new(),
                    stderr: String::new(),
                }],
            }),
        };
        if let Some(r) = reply {
            if write_frame(&mut tx, &r).is_err() {
                return;
            }
        }
    }
}

struct Harness {
    input: Option<UnixStream>,
    output: BufReader<UnixStream>,
    seen: Seen,
    server: Option<JoinHandle<()>>,
}

impl Harness {
    fn new() -> Harness {
        Harness::with(Config {
            eof_grace: Duration::from_millis(300),
            max_in_flight: 8,
        })
    }

    fn with(cfg: Config) -> Harness {
        let (front, monitor) = UnixStream::pair().unwrap();
        let seen: Seen = Arc::default();
        let s2 = seen.clone();
        std::thread::spawn(move || fake_monitor(monitor, s2));
        let rx = front.try_clone().unwrap();
        let link = Link::start(front, rx);
        let (in_test, in_server) = UnixStream::pair().unwrap();
        let (out_server, out_test) = UnixStream::pair().unwrap();
        out_test
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let server = Server::new(Box::new(out_server), link, cfg);
        let handle = std::thread::spawn(move || server.serve(BufReader::new(in_server)));
        Harness {
            input: Some(in_test),
            output: BufReader::new(out_test),
            seen,
            server: Some(handle),
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let i = self.input.as_mut().unwrap();
        i.write_all(bytes).unwrap();
        i.write_all(b"\n").unwrap();
    }

    fn send(&mut self, v: Value) {
        self.send_raw(v.to_string().as_bytes());
    }

    fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = self.output.read_line(&mut line).unwrap();
        assert!(n > 0, "the server closed its output");
        assert!(line.ends_with('\n'), "every answer is one whole line");
        serde_json::from_str(&line).unwrap()
    }

    /// Send a request and return its answer (the next line).
    fn ask(&mut self, v: Value) -> Value {
        self.send(v);
        self.recv()
    }

    fn init(&mut self, rev: &str) -> Value {
        self.ask(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                        "params": {"protocolVersion": rev, "capabilities": {},
                                   "clientInfo": {"name": "test", "version": "1"}}}))
    }

    fn close_input(&mut self) {
        self.input.take();
    }

    fn wait_server(&mut self) {
        if let Some(h) = self.server.take() {
            h.join().unwrap();
        }
    }
}

fn call(id: i64, tool: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": args}})
}

fn stateless(id: i64, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

#[test]
fn initialize_answers_the_clients_revision_or_the_preferred_one() {
    let mut h = Harness::new();
    for (asked, want) in [
        ("2024-11-05", "2024-11-05"),
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2099-01-01", "2025-06-18"),
        ("2026-07-28", "2025-06-18"),
        // Between two of ours, older than all of ours, not a date: the preferred one too
        // (the MCP spec's rule: the server answers one it speaks, the client decides).
        ("2025-05-05", "2025-06-18"),
        ("2025-01-01", "2025-06-18"),
        ("2024-10-07", "2025-06-18"),
        ("draft", "2025-06-18"),
    ] {
        let r = h.init(asked);
        assert_eq!(r["result"]["protocolVersion"], want, "asked {asked}: {r}");
        assert_eq!(r["result"]["serverInfo"]["name"], "zygo");
        assert!(r["result"]["capabilities"]["tools"].is_object());
        let instr = r["result"]["instructions"].as_str().unwrap();
        assert!(
            instr.contains("Prefer a warm function over run_code"),
            "{instr}"
        );
    }
    let r = h.ask(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = h.ask(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": 20250618}}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

/// The seed's try-it: initialize without capabilities, then tools/list without the
/// initialized notification, then end of input: two lines back.
#[test]
fn the_readme_try_it_works() {
    let mut h = Harness::new();
    h.send(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}));
    h.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    h.close_input();
    let a = h.recv();
    let b = h.recv();
    assert_eq!(a["id"], 1);
    assert_eq!(b["id"], 2);
    let names: Vec<&str> = b["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "run_code",
            "list_functions",
            "call_function",
            "function_logs"
        ]
    );
    for t in b["result"]["tools"].as_array().unwrap() {
        assert!(
            t["inputSchema"].is_object() && t["outputSchema"].is_object(),
            "{t}"
        );
    }
    h.wait_server();
}

#[test]
fn tools_list_follows_the_revision() {
    let mut h = Harness::new();
    h.init("2024-11-05");
    let r = h.ask(json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    let t = &r["result"]["tools"][0];
    assert!(
        t.get("outputSchema").is_none() && t.get("annotations").is_none(),
        "{t}"
    );
    h.init("2025-03-26");
    let r = h.ask(json!({"jsonrpc":"2.0","id":3,"method":"tools/list"}));
    assert!(r["result"]["tools"][0]["annotations"].is_object());
    assert!(r["result"]["tools"][0].get("outputSchema").is_none());
    let r = h.ask(json!({"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"cursor":"x"}}));
    assert_eq!(r["error"]["code"], -32602);
}

#[test]
fn run_code_reaches_the_sandbox_side_and_answers_structured() {
    let mut h = Harness::new();
    h.init("2025-06-18");
    let r = h.ask(call(
        5,
        "run_code",
        json!({"language": "python", "code": "print(1)", "stdin": "!"}),
    ));
    let res = &r["result"];
    assert_eq!(res["isError"], false, "{r}");
    assert_eq!(res["structuredContent"]["stdout"], "print(1)!");
    assert_eq!(res["structuredContent"]["exit_code"], 0);
    let text: Value = serde_json::from_str(res["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, res["structuredContent"]);
    // Under 2025-03-26 the same result has no structuredContent.
    h.init("2025-03-26");
    let r = h.ask(call(6, "run_code", json!({"language": "sh", "code": "x"})));
    assert!(r["result"].get("structuredContent").is_none(), "{r}");
    assert_eq!(r["result"]["content"][0]["type"], "text");
}

/// A run_code that takes long does not hold up a tools/list behind it; a cancel stops it
/// on the sandbox side and it gets no answer.
#[test]
fn requests_run_concurrently_and_cancel_stops_the_call() {
    let mut h = Harness::new();
    h.init("2025-06-18");
    h.send(call(
        7,
        "run_code",
        json!({"language": "sh", "code": "sleep 100"}),
    ));
    let r = h.ask(json!({"jsonrpc":"2.0","id":8,"method":"tools/list"}));
    assert_eq!(r["id"], 8, "tools/list answered while run_code runs");
    // (A cancel that arrives before the call was sent stops it before it is sent; here the
    // call must be running on the sandbox side first.)
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.seen.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "run_code never reached the sandbox side"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    h.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled",
                  "params":{"requestId":7,"reason":"user"}}));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let cancelled = h
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|r| matches!(r, McpRequest::Cancel { .. }));
        if cancelled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancel never reached the sandbox side"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The next line is the ping's: the cancelled request got no answer.
    let r = h.ask(json!({"jsonrpc":"2.0","id":9,"method":"ping"}));
    assert_eq!(r, json!({"jsonrpc":"2.0","id":9,"result":{}}));
    // The id is free again.
    let r = h.ask(call(
        7,
        "run_code",
        json!({"language": "sh", "code": "again"}),
    ));
    assert_eq!(r["id"], 7);
    assert_eq!(r["result"]["structuredContent"]["stdout"], "again");
}

#[test]
fn bad_input_gets_the_errors_the_spec_names_and_the_server_keeps_serving() {
    let mut h = Harness::new();
    h.init("2025-06-18");
    let cases: Vec<(Vec<u8>, i64, Value)> = vec![
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\xff\"}".to_vec(), -32700, Value::Null),
        (b"{not json".to_vec(), -32700, Value::Null),
        (b"5".to_vec(), -32600, Value::Null),
        (b"\"ping\"".to_vec(), -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#.to_vec(), -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#.to_vec(), -32600, Value::Null),
        (br#"{"jsonrpc":"1.0","id":2,"method":"ping"}"#.to_vec(), -32600, json!(2)),
        (br#"{"jsonrpc":"2.0","id":3}"#.to_vec(), -32600, json!(3)),
        (br#"{"jsonrpc":"2.0","id":4,"method":7}"#.to_vec(), -32600, json!(4)),
        (br#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":[1]}"#.to_vec(), -32602, json!(5)),
        (br#"{"jsonrpc":"2.0","id":6,"method":"resources/list"}"#.to_vec(), -32601, json!(6)),
        (br#"{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":5}}"#.to_vec(), -32602, json!("s")),
        (br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"rm_rf"}}"#.to_vec(), -32602, json!(8)),
        (br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"run_code","arguments":[]}}"#.to_vec(), -32602, json!(9)),
        (br#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"sh","code":1}}}"#.to_vec(), -32602, json!(10)),
        (br#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"sh","code":"x","image":"ubuntu"}}}"#.to_vec(), -32602, json!(11)),
        (br#"{}"#.to_vec(), -32600, Value::Null),
        (br#"{"jsonrpc":"2.0","method":5}"#.to_vec(), -32600, Value::Null),
        (br#"{"method":"notifications/initialized"}"#.to_vec(), -32600, Value::Null),
        (br#"[1]"#.to_vec(), -32600, Value::Null),
        (br#"[]"#.to_vec(), -32600, Value::Null),
    ];
    for (line, code, id) in cases {
        h.send_raw(&line);
        let r = h.recv();
        assert_eq!(
            r["error"]["code"],
            code,
            "{}: {r}",
            String::from_utf8_lossy(&line)
        );
        assert_eq!(r["id"], id, "{}: {r}", String::from_utf8_lossy(&line));
        assert!(r["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // Notifications, blank lines and client responses get no answer.
    h.send(json!({"jsonrpc":"2.0","method":"notifications/unknown"}));
    h.send(json!({"jsonrpc":"2.0","method":"tools/list"}));
    h.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}));
    h.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":[7]}));
    h.send(json!({"jsonrpc":"2.0","id":77,"result":{}}));
    h.send_raw(b"   ");
    // A line over 20 MiB is skipped and answered with an error; the next one is served.
    let mut big =
        b"{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"ping\",\"params\":{\"x\":\"".to_vec();
    big.resize(crate::jsonrpc::MAX_LINE + 10, b'a');
    h.send_raw(&big);
    let r = h.recv();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["id"], Value::Null);
    let r = h.ask(json!({"jsonrpc":"2.0","id":12,"method":"ping"}));
    assert_eq!(r["result"], json!({}), "{r}");
}

/// `{"id":12,"id":13}` is not answered as 12 nor as 13: a message with a duplicate key
/// anywhere is a parse error with a null id, and nothing of it reaches the sandbox side.
#[test]
fn a_message_with_a_duplicate_key_is_a_parse_error_answered_with_no_id() {
    let mut h = Harness::new();
    h.init("2025-03-26");
    let cases: [(&[u8], &str); 5] = [
        (br#"{"jsonrpc":"2.0","id":12,"id":13,"method":"tools/list"}"#, "id"),
        (br#"{"jsonrpc":"2.0","id":14,"method":"ping","method":"tools/list"}"#, "method"),
        (
            br#"{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"sh","code":"a","code":"b"}}}"#,
            "code",
        ),
        (
            br#"{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"sh","code":"a"},"name":"x"}}"#,
            "name",
        ),
        (
            br#"[{"jsonrpc":"2.0","id":17,"method":"ping"},{"jsonrpc":"2.0","id":18,"id":19,"method":"ping"}]"#,
            "id",
        ),
    ];
    for (line, key) in cases {
        h.send_raw(line);
        let r = h.recv();
        let text = String::from_utf8_lossy(line);
        assert_eq!(r["error"]["code"], -32700, "{text}: {r}");
        assert_eq!(r["id"], Value::Null, "{text}: {r}");
        let message = r["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(&format!("duplicate key \"{key}\"")),
            "{text}: {r}"
        );
    }
    // Nothing was answered but the parse errors: the next answer is the next request's.
    let r = h.ask(json!({"jsonrpc":"2.0","id":20,"method":"ping"}));
    assert_eq!(r["id"], 20, "{r}");
    assert_eq!(r["result"], json!({}), "{r}");
    assert!(h.seen.lock().unwrap().is_empty());
}

#[test]
fn argument_errors_are_tool_errors_from_2025_11_25_on() {
    let mut h = Harness::new();
    h.init("2025-11-25");
    let r = h.ask(call(
        1,
        "run_code",
        json!({"language": "cobol", "code": "x"}),
    ));
    assert_eq!(r["result"]["isError"], true, "{r}");
    let err = r["result"]["structuredContent"]["error"].as_str().unwrap();
    assert!(err.contains("cobol"), "{err}");
    let r = h.ask(call(
        2,
        "run_code",
        json!({"language": "sh", "code": "x", "mem": "8G"}),
    ));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(r["result"]["structuredContent"]["error"]
        .as_str()
        .unwrap()
        .contains("fixed by whoever started the server"));
    // Unknown tools stay protocol errors.
    let r = h.ask(call(3, "nope", json!({})));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // Nothing reached the sandbox side.
    assert!(h.seen.lock().unwrap().is_empty());
}

#[test]
fn batches_only_under_2025_03_26() {
    let mut h = Harness::new();
    h.init("2025-06-18");
    h.send(json!([{"jsonrpc":"2.0","id":1,"method":"ping"}]));
    let r = h.recv();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    h.init("2025-03-26");
    h.send(json!([
        {"jsonrpc":"2.0","id":1,"method":"ping"},
        {"jsonrpc":"2.0","method":"notifications/initialized"},
        {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"sh","code":"b"}}},
        {"jsonrpc":"2.0","id":3,"method":"nope"},
        {"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":"2025-03-26"}},
        7
    ]));
    let r = h.recv();
    let items = r.as_array().unwrap();
    assert_eq!(items.len(), 5, "{r}");
    let by_id = |id: Value| items.iter().find(|i| i["id"] == id).unwrap().clone();
    assert_eq!(by_id(json!(1))["result"], json!({}));
    assert_eq!(by_id(json!(2))["result"]["content"][0]["type"], "text");
    assert_eq!(by_id(json!(3))["error"]["code"], -32601);
    assert_eq!(by_id(json!(4))["error"]["code"], -32600);
    assert_eq!(by_id(Value::Null)["error"]["code"], -32600);
    // A batch of notifications only gets nothing back.
    h.send(json!([{"jsonrpc":"2.0","method":"notifications/initialized"}]));
    let r = h.ask(json!({"jsonrpc":"2.0","id":5,"method":"ping"}));
    assert_eq!(r["id"], 5);
}

#[test]
fn stateless_revision_needs_no_handshake() {
    let mut h = Harness::new();
    let r = h.ask(stateless(1, "server/discover", json!({})));
    let res = &r["result"];
    assert_eq!(res["supportedVersions"], json!(["2026-07-28"]), "{r}");
    assert_eq!(res["resultType"], "complete");
    assert!(res["ttlMs"].as_u64().is_some() && res["cacheScope"] == "public");
    assert!(res["capabilities"]["tools"].is_object());
    assert_eq!(
        res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "zygo"
    );
    assert!(res["instructions"]
        .as_str()
        .unwrap()
        .contains("warm function"));
    let r = h.ask(stateless(2, "tools/list", json!({})));
    assert_eq!(r["result"]["resultType"], "complete");
    assert_eq!(r["result"]["tools"].as_array().unwrap().len(), 4);
    assert!(r["result"]["ttlMs"].is_u64());
    let r = h.ask(stateless(
        3,
        "tools/call",
        json!({"name": "run_code",
        "arguments": {"language": "javascript", "code": "console.log(1)"}}),
    ));
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(r["result"]["structuredContent"]["stdout"], "console.log(1)");
    // ping is gone in this revision.
    let r = h.ask(stateless(4, "ping", json!({})));
    assert_eq!(r["error"]["code"], -32601, "{r}");
    // A version it does not speak statelessly.
    let mut req = stateless(5, "tools/list", json!({}));
    req["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2030-01-01");
    let r = h.ask(req);
    assert_eq!(r["error"]["code"], -32022, "{r}");
    assert_eq!(r["error"]["data"]["supported"], json!(["2026-07-28"]));
    assert_eq!(r["error"]["data"]["requested"], "2030-01-01");
    // Missing client capabilities.
    let mut req = stateless(6, "tools/list", json!({}));
    req["params"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    let r = h.ask(req);
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // server/discover without the envelope.
    let r = h.ask(json!({"jsonrpc":"2.0","id":7,"method":"server/discover"}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // Argument errors are tool errors here.
    let r = h.ask(stateless(
        8,
        "tools/call",
        json!({"name": "run_code", "arguments": {}}),
    ));
    assert_eq!(r["result"]["isError"], true, "{r}");
    // A handshake client on the same connection keeps its own revision.
    h.init("2024-11-05");
    let r = h.ask(json!({"jsonrpc":"2.0","id":9,"method":"tools/list"}));
    assert!(r["result"].get("resultType").is_none());
    let r = h.ask(stateless(10, "tools/list", json!({})));
    assert_eq!(r["result"]["resultType"], "complete");
}

#[test]
fn function_tools_render_and_clamp() {
    let mut h = Harness::new();
    h.init("2025-06-18");
    let r = h.ask(call(1, "list_functions", json!({})));
    assert_eq!(
        r["result"]["structuredContent"]["functions"][0]["name"], "hello",
        "{r}"
    );
    assert_eq!(r["result"]["structuredContent"]["functions"][0]["ready"], 1);
    let r = h.ask(call(
        2,
        "call_function",
        json!({"name": "hello", "event": {"n": 1}}),
    ));
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(
        r["result"]["structuredContent"]["result"],
        json!({"echo": {"n": 1}})
    );
    assert_eq!(r["result"]["structuredContent"]["outcome"], "ok");
    let r = h.ask(call(
        3,
        "call_function",
        json!({"name": "missing", "event": {}}),
    ));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(r["result"]["structuredContent"]["outcome"], "refused");
    assert_eq!(
        r["result"]["structuredContent"]["error"],
        "no function named missing"
    );
    let r = h.ask(call(
        4,
        "function_logs",
        json!({"name": "hello", "limit": 5000}),
    ));
    assert_eq!(
        r["result"]["structuredContent"]["entries"][0]["request_id"], "limit=200",
        "{r}"
    );
    let r = h.ask(call(
        5,
        "function_logs",
        json!({"name": "hello", "limit": 0}),
    ));
    assert_eq!(
        r["result"]["structuredContent"]["entries"][0]["request_id"], "limit=1",
        "{r}"
    );
}

#[test]
fn duplicate_ids_and_too_many_requests_are_refused() {
    let mut h = Harness::with(Config {
        eof_grace: Duration::from_millis(100),
        max_in_flight: 2,
    });
    h.init("2025-06-18");
    h.send(call(
        1,
        "run_code",
        json!({"language": "sh", "code": "sleep a"}),
    ));
    let r = h.ask(call(1, "run_code", json!({"language": "sh", "code": "x"})));
    assert_eq!(r["error"]["code"], -32600, "{r}");
    h.send(call(
        2,
        "run_code",
        json!({"language": "sh", "code": "sleep b"}),
    ));
    let r = h.ask(call(3, "run_code", json!({"language": "sh", "code": "x"})));
    assert_eq!(r["error"]["code"], -32603, "{r}");
}

/// End of input with a call still running: it is cancelled after the grace and serve
/// returns; the call gets no answer.
#[test]
fn end_of_input_cancels_what_is_still_running() {
    let mut h = Harness::new();
    h.init("2025-06-18");
    h.send(call(
        1,
        "run_code",
        json!({"language": "sh", "code": "sleep forever"}),
    ));
    // Let the call reach the sandbox side before input ends.
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.seen.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    h.close_input();
    h.wait_server();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "serve took {:?}",
        t0.elapsed()
    );
    // The cancel was written before serve returned; the fake side reads it soon after.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !h
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|r| matches!(r, McpRequest::Cancel { call: 1 }))
    {
        assert!(Instant::now() < deadline, "the call was not cancelled");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Input that ends in the middle of a line ends the server too, without an answer.
#[test]
fn end_of_input_mid_message() {
    let mut h = Harness::new();
    h.input
        .as_mut()
        .unwrap()
        .write_all(br#"{"jsonrpc":"2.0","id":1,"meth"#)
        .unwrap();
    h.close_input();
    h.wait_server();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut h.output, &mut rest);
    assert_eq!(rest, "");
}

/// When the sandbox side is gone, tools say so in words and protocol keeps working.
#[test]
fn sandbox_side_gone() {
    let (front, monitor) = UnixStream::pair().unwrap();
    drop(monitor);
    let rx = front.try_clone().unwrap();
    let link = Link::start(front, rx);
    let deadline = Instant::now() + Duration::from_secs(5);
    while link.alive() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let (in_test, in_server) = UnixStream::pair().unwrap();
    let (out_server, out_test) = UnixStream::pair().unwrap();
    let server = Server::new(Box::new(out_server), link, Config::default());
    let t = std::thread::spawn(move || server.serve(BufReader::new(in_server)));
    let mut input = in_test;
    let mut output = BufReader::new(out_test);
    writeln!(
        input,
        "{}",
        call(1, "run_code", json!({"language": "sh", "code": "x"}))
    )
    .unwrap();
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    let r: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(r["result"]["structuredContent"]["error"]
        .as_str()
        .unwrap()
        .contains("has stopped"));
    drop(input);
    t.join().unwrap();
}
