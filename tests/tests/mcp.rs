//! `zygo mcp` end to end: the real binary, driven by the official MCP client SDKs that Zygo
//! did not write — PyPI `mcp` 1.x (the handshake revisions), `mcp` 2.x (the stateless
//! 2026-07-28 revision), npm `@modelcontextprotocol/sdk` 1.x and `@modelcontextprotocol/client`
//! 2.x — through the scripts in tests/mcp/, plus raw JSON-RPC for what no SDK sends (bad
//! input, end of input in the middle of a call, signals) and for the confinement of the
//! front.
//!
//! The SDKs are installed by `bash tests/mcp/setup.sh` (which `.ci/run` runs) into
//! `$ZYGO_MCP_SDK_DIR` (default `~/.cache/zygo-mcp-sdk`). When they are missing, the SDK
//! tests are skipped ([`skip`]) — except under CI (`ZYGO_TEST_NO_SKIPS=1`), where a
//! missing SDK fails.
//!
//! Every test gives `zygo mcp` a runtime directory of its own, so no supervisor of the host
//! is reached by accident; the warm-function test starts its own with `zygo up -f` there.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygo_tests::*;

// ---------------------------------------------------------------------------------------
// The SDKs and the scripts that drive them.

fn sdk_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ZYGO_MCP_SDK_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    cache.join("zygo-mcp-sdk")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sdk {
    /// PyPI `mcp` 1.x.
    Py1,
    /// PyPI `mcp` 2.x.
    Py2,
    /// npm `@modelcontextprotocol/sdk` 1.x and `@modelcontextprotocol/client` 2.x.
    Node,
}

impl Sdk {
    fn path(self) -> PathBuf {
        let d = sdk_dir();
        match self {
            Sdk::Py1 => d.join("py1/bin/python"),
            Sdk::Py2 => d.join("py2/bin/python"),
            Sdk::Node => d.join("node/node_modules"),
        }
    }

    /// The SDK's path, or why it cannot be used: it is not installed.
    fn installed(self) -> Result<PathBuf, String> {
        let p = self.path();
        let ok = match self {
            Sdk::Node => {
                p.join("@modelcontextprotocol/sdk/package.json").is_file()
                    && p.join("@modelcontextprotocol/client/package.json")
                        .is_file()
            }
            _ => p.is_file(),
        };
        if ok {
            return Ok(p);
        }
        Err(format!(
            "the MCP client SDK {self:?} is not installed at {}; run `bash tests/mcp/setup.sh`",
            p.display()
        ))
    }

    /// The SDK's path, or None when it is not installed: the test is then
    /// [`skip`]ped (failed under CI) and must return.
    fn available(self) -> Option<PathBuf> {
        self.installed().map_err(|why| skip(&why)).ok()
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp").join(name)
}

/// A private runtime and state directory for a `zygo mcp` and (maybe) a supervisor.
struct Dirs {
    runtime: TempDir,
    state: TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            runtime: TempDir::new(0o700),
            state: TempDir::new(0o700),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("ZYGO_RUNTIME_DIR".into(), self.runtime.str().into()),
            ("ZYGO_STATE_DIR".into(), self.state.str().into()),
        ]
    }
}

/// A command with a clean environment: PATH, HOME, the Zygo variables given, and the
/// test's own ZYGO_LOG / ZYGO_SUBID.
fn clean(program: &Path, env: &[(String, String)]) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/root")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null());
    for key in ["ZYGO_LOG", "ZYGO_SUBID"] {
        if let Some(v) = std::env::var_os(key) {
            c.env(key, v);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Run one scenario of a client script; return its observations (its last stdout line).
fn scenario(
    sdk: Sdk,
    tool: &Path,
    name: &str,
    revision: Option<&str>,
    zygo_args: &[&str],
    env: &[(String, String)],
) -> Value {
    let bin = zygo_bin();
    let mut c = match sdk {
        Sdk::Py1 | Sdk::Py2 => {
            let mut c = clean(tool, env);
            c.arg(script("py_client.py"));
            c
        }
        Sdk::Node => {
            let mut c = clean(Path::new("node"), env);
            c.arg(script("node_client.mjs")).arg("--modules").arg(tool);
            c
        }
    };
    c.arg("--zygo").arg(&bin);
    if let Some(r) = revision {
        c.args(["--revision", r]);
    }
    c.arg(name).arg("--").args(zygo_args);
    let f = finish(c);
    let out = String::from_utf8_lossy(&f.stdout).into_owned();
    let what = format!("{sdk:?} {name} {revision:?} {zygo_args:?}");
    assert!(
        f.code == 0,
        "{what}: the client exited {}\nstdout: {}\nstderr: {}",
        f.code,
        truncate(&out, 4000),
        truncate(&f.stderr_text(), 8000)
    );
    let last = out.lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("{what}: the last line is not JSON ({e}): {out}"));
    assert_eq!(v["ok"], true, "{what}: {v}");
    eprintln!("{what}: {v} ({:.1}s)", f.elapsed.as_secs_f64());
    v
}

const HANDSHAKE_REVISIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

// ---------------------------------------------------------------------------------------
// The official SDKs.

/// PyPI `mcp` 1.x against every handshake revision: the four tools (with output schemas
/// where the revision has them), Python, JavaScript and sh, stdin, a traceback naming
/// /zygo/main.py, /work kept between calls, a read-only /zygo, a refused widening argument,
/// an unknown tool, and no supervisor in words.
#[test]
fn python_sdk_1x_every_handshake_revision() {
    let Some(py) = Sdk::Py1.available() else {
        return;
    };
    for rev in HANDSHAKE_REVISIONS {
        let d = Dirs::new();
        let v = scenario(Sdk::Py1, &py, "basics", Some(rev), &[], &d.env());
        assert_eq!(v["revision"], rev);
        let widening = if rev >= "2025-11-25" {
            "tool error"
        } else {
            "protocol error"
        };
        assert_eq!(v["widening"], widening, "{rev}: {v}");
    }
}

/// A timeout and an OOM kill under small limits, each reported in its own words.
#[test]
fn python_sdk_limits_in_words() {
    let Some(py) = Sdk::Py1.available() else {
        return;
    };
    let d = Dirs::new();
    let v = scenario(
        Sdk::Py1,
        &py,
        "limits",
        None,
        &["--mem", "64M", "--timeout", "2s"],
        &d.env(),
    );
    assert_eq!(v["oom"], "ran out of memory (limit 64M)");
    assert_eq!(v["timeout"], "exceeded its 2s time limit");
}

/// notifications/cancelled (sent through the 1.x session) kills the sandbox within seconds,
/// and the program does not reach its end.
#[test]
fn python_sdk_1x_cancel() {
    let Some(py) = Sdk::Py1.available() else {
        return;
    };
    let d = Dirs::new();
    let v = scenario(Sdk::Py1, &py, "cancel", None, &[], &d.env());
    assert!(v["gone_after_s"].as_f64().is_some_and(|s| s < 5.0), "{v}");
}

/// PyPI `mcp` 2.x probes with server/discover and speaks the stateless 2026-07-28
/// revision; its abandoned call sends the cancel by itself.
#[test]
fn python_sdk_2x_stateless_revision() {
    let Some(py) = Sdk::Py2.available() else {
        return;
    };
    let d = Dirs::new();
    let v = scenario(Sdk::Py2, &py, "stateless", None, &[], &d.env());
    assert_eq!(v["revision"], "2026-07-28");
    let v = scenario(Sdk::Py2, &py, "basics", Some("2026-07-28"), &[], &d.env());
    assert_eq!(v["widening"], "tool error");
    let v = scenario(Sdk::Py2, &py, "cancel", None, &[], &d.env());
    assert!(v["gone_after_s"].as_f64().is_some_and(|s| s < 5.0), "{v}");
}

/// npm `@modelcontextprotocol/sdk` 1.x: its own revision (2025-11-25) and older ones, with
/// its ajv validation of every structured result against the tools' output schemas.
#[test]
fn typescript_sdk_1x_revisions() {
    let Some(node) = Sdk::Node.available() else {
        return;
    };
    let d = Dirs::new();
    let v = scenario(Sdk::Node, &node, "basics", None, &[], &d.env());
    assert_eq!(v["revision"], "2025-11-25");
    for rev in ["2024-11-05", "2025-03-26", "2025-06-18"] {
        let v = scenario(Sdk::Node, &node, "basics", Some(rev), &[], &d.env());
        assert_eq!(v["revision"], rev);
    }
}

#[test]
fn typescript_sdk_limits_and_cancel() {
    let Some(node) = Sdk::Node.available() else {
        return;
    };
    let d = Dirs::new();
    scenario(
        Sdk::Node,
        &node,
        "limits",
        None,
        &["--mem", "64M", "--timeout", "2s"],
        &d.env(),
    );
    let v = scenario(Sdk::Node, &node, "cancel", None, &[], &d.env());
    assert!(v["gone_after_s"].as_f64().is_some_and(|s| s < 5.0), "{v}");
}

/// npm `@modelcontextprotocol/client` 2.x in `auto` mode: it probes (on a sibling process)
/// and lands on the stateless era.
#[test]
fn typescript_client_2x_stateless_revision() {
    let Some(node) = Sdk::Node.available() else {
        return;
    };
    let d = Dirs::new();
    let v = scenario(Sdk::Node, &node, "stateless", None, &[], &d.env());
    assert_eq!(v["revision"], "2026-07-28");
}

/// Stops the test's supervisor whatever happens.
struct Supervisor {
    env: Vec<(String, String)>,
    /// Its log, `$ZYGO_STATE_DIR/supervisor.log` (see [`supervisor_pid`]).
    log: PathBuf,
}

impl Drop for Supervisor {
    /// `zygo drain`, then make sure the supervisor is gone (killed if it is not).
    fn drop(&mut self) {
        let mut c = clean(&zygo_bin(), &self.env);
        c.args(["drain", "--grace", "1s"]);
        let f = finish(c);
        if f.code != 0 {
            eprintln!("zygo drain: exit {}: {}", f.code, f.stderr_text());
        }
        wait_for_quietly(Duration::from_secs(15), || {
            supervisor_pid(&self.log).is_none()
        });
        if let Some(pid) = supervisor_pid(&self.log) {
            eprintln!("the test's supervisor {pid} did not drain; killing it");
            // SAFETY: killing the supervisor this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A warm Python function served by a supervisor started with `zygo up -f`, listed, called
/// and read through every SDK (handshake and stateless).
#[test]
fn warm_function_through_a_running_supervisor() {
    let (py1, py2, node) = (
        Sdk::Py1.installed(),
        Sdk::Py2.installed(),
        Sdk::Node.installed(),
    );
    // What is missing is a skip, said once the SDKs that are there have passed.
    let missing: Vec<Sdk> = [(Sdk::Py1, &py1), (Sdk::Py2, &py2), (Sdk::Node, &node)]
        .into_iter()
        .filter_map(|(sdk, r)| r.is_err().then_some(sdk))
        .collect();
    let missing = format!(
        "the MCP client SDKs {missing:?} are not installed in {}; run `bash tests/mcp/setup.sh`",
        sdk_dir().display()
    );
    let (py1, py2, node) = (py1.ok(), py2.ok(), node.ok());
    if py1.is_none() && py2.is_none() && node.is_none() {
        skip(&missing);
        return;
    }
    let d = Dirs::new();
    let app = TempDir::new(0o755);
    app.file(
        "sandbox.toml",
        b"[defaults]\nmem = \"256M\"\n\n[fn.hello]\nagent = \"python\"\nentry = \"hello.py:handler\"\n",
    );
    app.file(
        "hello.py",
        b"def handler(event):\n    print('saw', event)\n    if event.get('fail'):\n        raise ValueError('asked to fail')\n    return {'greeting': 'hello ' + str(event.get('name', 'world'))}\n",
    );
    let env = d.env();
    let mut up = clean(&zygo_bin(), &env);
    up.args(["up", "-f"]).arg(app.path.join("sandbox.toml"));
    let f = finish(up);
    let _guard = Supervisor {
        env: env.clone(),
        log: d.state.path.join("supervisor.log"),
    };
    assert_eq!(
        f.code,
        0,
        "zygo up: {}\n{}",
        String::from_utf8_lossy(&f.stdout),
        f.stderr_text()
    );

    if let Some(py) = &py1 {
        scenario(Sdk::Py1, py, "functions", None, &[], &env);
    }
    if let Some(node) = &node {
        scenario(Sdk::Node, node, "functions", None, &[], &env);
    }
    let mut with_fn = env.clone();
    with_fn.push(("ZYGO_TEST_FUNCTIONS".into(), "1".into()));
    if let Some(py) = &py2 {
        let v = scenario(Sdk::Py2, py, "stateless", None, &[], &with_fn);
        assert_eq!(v["function"], json!({"greeting": "hello bo"}));
    }
    if let Some(node) = &node {
        let v = scenario(Sdk::Node, node, "stateless", None, &[], &with_fn);
        assert_eq!(v["function"], json!({"greeting": "hello ts"}));
    }
    if py1.is_none() || py2.is_none() || node.is_none() {
        skip(&missing);
    }
}

// ---------------------------------------------------------------------------------------
// Raw JSON-RPC over the real binary.

/// A running `zygo mcp` with pipes: lines in, lines out, stderr collected.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    _dirs: Dirs,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let dirs = Dirs::new();
        let env = dirs.env();
        Server::start_env(args, &env, dirs)
    }

    /// With exactly this environment (besides `clean`'s PATH and HOME); `dirs` are kept
    /// as long as the server.
    fn start_env(args: &[&str], env: &[(String, String)], dirs: Dirs) -> Server {
        let mut c = clean(&zygo_bin(), env);
        c.arg("mcp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("start zygo mcp");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                match l {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        });
        let err = Arc::new(Mutex::new(String::new()));
        let e2 = err.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut e = e2.lock().expect("stderr lock");
                e.push_str(&l);
                e.push('\n');
            }
        });
        Server {
            child,
            stdin,
            lines,
            stderr: err,
            _dirs: dirs,
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let s = self.stdin.as_mut().expect("stdin is open");
        s.write_all(bytes).expect("write to zygo mcp");
        s.write_all(b"\n").expect("write to zygo mcp");
        s.flush().expect("flush");
    }

    fn send(&mut self, v: Value) {
        self.send_raw(v.to_string().as_bytes());
    }

    fn recv(&mut self) -> Value {
        let l = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no answer within 30s; stderr:\n{}", self.stderr()));
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
    }

    fn ask(&mut self, v: Value) -> Value {
        self.send(v);
        self.recv()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The workspace path zygo mcp printed on stderr.
    fn workspace(&self) -> PathBuf {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let e = self.stderr();
            if let Some(rest) = e.split("zygo mcp: workspace ").nth(1) {
                let path = rest.split(" (").next().unwrap_or("");
                return PathBuf::from(path);
            }
            assert!(
                Instant::now() < deadline,
                "no workspace line on stderr: {e}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Wait for the exit; its code.
    fn wait(&mut self, within: Duration) -> i32 {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().expect("wait for zygo mcp") {
                return s.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "zygo mcp did not exit within {within:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn init(&mut self, rev: &str) -> Value {
        self.ask(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                        "params": {"protocolVersion": rev, "capabilities": {},
                                   "clientInfo": {"name": "raw", "version": "1"}}}))
    }
}

impl Drop for Server {
    /// Even a failed test stops its server cleanly (SIGTERM, then SIGKILL after 10 s), so
    /// no sandbox or scratch workspace is left behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_code(id: i64, language: &str, code: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "run_code", "arguments": {"language": language, "code": code}}})
}

/// The README's try-it: two lines in, two JSON lines out, the workspace named on stderr
/// and removed at exit.
#[test]
fn try_it_from_the_readme() {
    let mut s = Server::start(&[]);
    s.send_raw(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#);
    s.send_raw(br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    s.close_stdin();
    let a = s.recv();
    let b = s.recv();
    assert_eq!(a["result"]["protocolVersion"], "2025-06-18", "{a}");
    assert_eq!(
        b["result"]["tools"].as_array().map(Vec::len),
        Some(4),
        "{b}"
    );
    let ws = s.workspace();
    assert_eq!(s.wait(Duration::from_secs(20)), 0, "{}", s.stderr());
    assert!(
        s.lines.recv_timeout(Duration::from_millis(200)).is_err(),
        "nothing else on stdout"
    );
    assert!(
        !ws.exists(),
        "the scratch workspace {} is left",
        ws.display()
    );
}

/// The front that parses JSON-RPC runs with no_new_privs and one seccomp filter (its
/// table, `clone3`'s ENOSYS included), and holds only stdin, stdout, stderr and its channel.
#[test]
fn the_front_is_confined() {
    let mut s = Server::start(&[]);
    s.init("2025-06-18");
    let pid = s.child.id() as i32;
    let fronts: Vec<i32> = host_processes()
        .into_iter()
        .filter(|(p, cmd)| {
            contains(cmd, b"__mcp-front")
                && std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .ok()
                    .and_then(|st| {
                        st.rsplit_once(") ")
                            .and_then(|(_, r)| r.split(' ').nth(1).and_then(|x| x.parse().ok()))
                    })
                    == Some(pid)
        })
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        fronts.len(),
        1,
        "one front under zygo mcp {pid}: {fronts:?}"
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", fronts[0])).expect("status");
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    };
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(field("Seccomp:"), "2", "{status}");
    assert_eq!(field("Seccomp_filters:"), "1", "{status}");
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", fronts[0]))
        .expect("list the front's fds")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        fds.len() <= 5,
        "the front holds only stdio and its channel: {fds:?}"
    );
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0);
}

/// Bad input over the real binary: answered per the spec, and the server keeps serving.
#[test]
fn bad_input_keeps_the_server_serving() {
    let mut s = Server::start(&[]);
    s.init("2025-06-18");
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xc3\x28\"}");
    assert_eq!(s.recv()["error"]["code"], -32700);
    s.send_raw(b"{\"jsonrpc\":");
    assert_eq!(s.recv()["error"]["code"], -32700);
    s.send_raw(b"[1,2]");
    assert_eq!(s.recv()["error"]["code"], -32600);
    s.send_raw(b"null");
    assert_eq!(s.recv()["error"]["code"], -32600);
    s.send(json!({"jsonrpc":"2.0","method":"tools/call","params":{"name":"run_code"}}));
    s.send(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"sh","code":["x"]}}}));
    let r = s.recv();
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (json!(2), json!(-32602)),
        "{r}"
    );
    s.send(json!({"jsonrpc":"2.0","id":3,"method":"no/such"}));
    assert_eq!(s.recv()["error"]["code"], -32601);
    // A line of 21 MiB: refused without being kept, and the next line is served.
    let mut big = Vec::with_capacity(21 << 20);
    big.extend_from_slice(br#"{"jsonrpc":"2.0","id":4,"method":"ping","params":{"x":""#);
    big.resize(21 << 20, b'a');
    s.send_raw(&big);
    let r = s.recv();
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (Value::Null, json!(-32600)),
        "{r}"
    );
    let r = s.ask(json!({"jsonrpc":"2.0","id":5,"method":"ping"}));
    assert_eq!(r, json!({"jsonrpc":"2.0","id":5,"result":{}}));
    let r = s.ask(run_code(6, "sh", "echo still here"));
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "still here\n",
        "{r}"
    );
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0);
}

/// Standard input closing while a run_code runs: the server exits on its own (after a
/// short grace), the sandbox is gone, the scratch workspace removed.
#[test]
fn end_of_input_mid_request_leaves_no_sandbox() {
    let mut s = Server::start(&[]);
    s.init("2025-06-18");
    let ws = s.workspace();
    let secs = format!("51.{}", unique() % 1_000_000);
    let marker = format!("sleep\0{secs}\0");
    s.send(run_code(1, "sh", &format!("sleep {secs}; echo done")));
    wait_for(Duration::from_secs(20), "the sandbox started", || {
        !host_pids_with(marker.as_bytes()).is_empty()
    });
    let t0 = Instant::now();
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(30)), 0, "{}", s.stderr());
    eprintln!("exited {:?} after stdin closed", t0.elapsed());
    assert!(
        host_pids_with(marker.as_bytes()).is_empty(),
        "the sandbox outlived zygo mcp"
    );
    assert!(
        !ws.exists(),
        "the scratch workspace {} is left",
        ws.display()
    );
}

/// A scratch workspace is the sandboxes' to fill, and is removed at exit whatever they left
/// in it: a folder chain 40,000 deep (deeper than any walk by recursion goes; made by
/// moving chains of 100 under the deepest folder, since each path walk inside a sandbox
/// costs its depth), a folder closed to everyone (mode 0) with files in it, and a link to
/// a folder of the host's, which is removed as a link, its target untouched.
#[test]
fn a_scratch_workspace_is_removed_whatever_was_left_in_it() {
    let keep = TempDir::new(0o755);
    std::fs::write(keep.path.join("file"), b"keep").expect("write");
    let mut s = Server::start(&[]);
    s.init("2025-06-18");
    let ws = s.workspace();
    let code = format!(
        "import os\n\
         os.makedirs('/work/closed/inner')\n\
         open('/work/closed/inner/f', 'w').write('x')\n\
         os.chmod('/work/closed/inner', 0)\n\
         os.chmod('/work/closed', 0)\n\
         os.symlink({:?}, '/work/link')\n\
         os.chdir('/work')\n\
         top = os.open('.', os.O_RDONLY)\n\
         os.mkdir('deep')\n\
         deep = os.open('deep', os.O_RDONLY)\n\
         for i in range(400):\n\
         \x20   name = 'c%d' % i\n\
         \x20   os.makedirs(name + '/d' * 99)\n\
         \x20   os.rename(name, 'x', src_dir_fd=top, dst_dir_fd=deep)\n\
         \x20   below = os.open('x' + '/d' * 99, os.O_RDONLY, dir_fd=deep)\n\
         \x20   os.close(deep)\n\
         \x20   deep = below\n\
         print('left')\n",
        keep.str()
    );
    let r = s.ask(run_code(1, "python", &code));
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert!(r.to_string().contains("left"), "{r}");
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(60)), 0, "{}", s.stderr());
    assert!(
        !ws.exists(),
        "the scratch workspace {} is left: {}",
        ws.display(),
        s.stderr()
    );
    assert_eq!(
        std::fs::read(keep.path.join("file")).expect("the link's target is left alone"),
        b"keep"
    );
}

/// SIGTERM stops every sandbox and the server exits promptly and cleanly.
#[test]
fn sigterm_stops_every_sandbox() {
    let mut s = Server::start(&[]);
    s.init("2025-06-18");
    let ws = s.workspace();
    let secs = format!("52.{}", unique() % 1_000_000);
    let marker = format!("sleep\0{secs}\0");
    s.send(run_code(1, "sh", &format!("sleep {secs}")));
    s.send(run_code(
        2,
        "python",
        &format!("import subprocess\nsubprocess.run(['sleep', '{secs}'])"),
    ));
    wait_for(Duration::from_secs(20), "both sandboxes started", || {
        host_pids_with(marker.as_bytes()).len() >= 2
    });
    let t0 = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    assert_eq!(s.wait(Duration::from_secs(15)), 0, "{}", s.stderr());
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        host_pids_with(marker.as_bytes()).is_empty(),
        "a sandbox outlived zygo mcp"
    );
    assert!(
        !ws.exists(),
        "the scratch workspace {} is left",
        ws.display()
    );
}

/// --workspace DIR is made if missing, bound at /work, and kept after exit.
#[test]
fn workspace_flag_is_kept() {
    let base = TempDir::new(0o755);
    let dir = base.path.join("ws");
    let dir_s = dir.to_str().expect("utf-8").to_string();
    let mut s = Server::start(&["--workspace", &dir_s]);
    s.init("2025-06-18");
    let r = s.ask(run_code(
        1,
        "python",
        "open('made-here.txt', 'w').write('yes')",
    ));
    assert_eq!(r["result"]["isError"], false, "{r}");
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0);
    assert_eq!(
        std::fs::read_to_string(dir.join("made-here.txt")).expect("the file is kept"),
        "yes"
    );
}

/// As root, a --workspace whose parent only root can enter is opened by the monitor and
/// handed over: the sandbox writes there all the same.
#[test]
fn a_workspace_behind_a_folder_only_root_can_enter_is_handed_over() {
    if !root_only() {
        return;
    }
    let base = TempDir::new(0o755);
    let parent = base.path.join("private");
    std::fs::create_dir(&parent).expect("create the private folder");
    std::fs::set_permissions(&parent, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod 0700");
    // Made by zygo mcp (0700, the sandbox's root's), inside the folder only root can enter.
    let dir = parent.join("ws");
    let dir_s = dir.to_str().expect("utf-8").to_string();
    let mut s = Server::start(&["--workspace", &dir_s]);
    s.init("2025-06-18");
    let r = s.ask(run_code(
        1,
        "python",
        "open('made-here.txt', 'w').write('behind 0700')",
    ));
    assert_eq!(r["result"]["isError"], false, "{r}\n{}", s.stderr());
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0);
    assert_eq!(
        std::fs::read_to_string(dir.join("made-here.txt")).expect("the file is there"),
        "behind 0700"
    );
}

fn zygo_mcp_refused(args: &[&str]) -> Finished {
    let d = Dirs::new();
    let mut c = clean(&zygo_bin(), &d.env());
    c.arg("mcp").args(args);
    finish(c)
}

/// What the ceiling cannot be: malformed allow rules, allow rules without egress, bad
/// values; and -f's [defaults] is the ceiling flags may
/// only narrow.
#[test]
fn ceiling_flags_and_refusals() {
    let f = zygo_mcp_refused(&["--net", "egress", "--allow", "api_github.com:443"]);
    assert_eq!(f.code, 2, "{}", f.stderr_text());
    assert!(f.stderr_text().contains("bad host"), "{}", f.stderr_text());
    let f = zygo_mcp_refused(&["--allow", "192.0.2.1:443"]);
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains("--net egress"),
        "{}",
        f.stderr_text()
    );
    let f = zygo_mcp_refused(&["--net", "host"]);
    assert_eq!(f.code, 2, "{}", f.stderr_text());
    let f = zygo_mcp_refused(&["--mem", "lots"]);
    assert_eq!(f.code, 2, "{}", f.stderr_text());
    let f = zygo_mcp_refused(&["--mem", "unlimited"]);
    assert_eq!(f.code, 2, "{}", f.stderr_text());
    let f = zygo_mcp_refused(&["--bogus"]);
    assert_eq!(f.code, 2, "{}", f.stderr_text());
    assert!(f.stdout.is_empty());

    let app = TempDir::new(0o755);
    let file = app.file(
        "sandbox.toml",
        b"[defaults]\nmem = \"64M\"\ntimeout = \"3s\"\n",
    );
    let file = file.to_str().expect("utf-8");
    let f = zygo_mcp_refused(&["-f", file, "--mem", "1G"]);
    assert_eq!(f.code, 2, "{}", f.stderr_text());
    assert!(f.stderr_text().contains("ceiling"), "{}", f.stderr_text());

    let mut s = Server::start(&["-f", file]);
    s.init("2025-11-25");
    let r = s.ask(run_code(1, "python", "b = bytearray(256 << 20)"));
    assert_eq!(
        r["result"]["structuredContent"]["error"], "ran out of memory (limit 64M)",
        "{r}"
    );
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0);
}

// ---------------------------------------------------------------------------------------
// A new user's first hour.

fn call_function(id: i64, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "call_function", "arguments": args}})
}

/// On a machine where no supervisor ever ran, the state directory does not exist yet: a
/// `run_code`'s usage record makes it (0700) and lands in its `usage.log`, and nothing is
/// logged about a record it could not write.
#[test]
fn a_run_code_usage_record_has_a_home_on_a_fresh_machine() {
    let dirs = Dirs::new();
    let state = dirs.state.path.join("fresh/zygo");
    let env = vec![
        (
            "ZYGO_RUNTIME_DIR".to_string(),
            dirs.runtime.str().to_string(),
        ),
        ("ZYGO_STATE_DIR".to_string(), state.display().to_string()),
    ];
    let mut s = Server::start_env(&[], &env, dirs);
    s.init("2025-06-18");
    let r = s.ask(run_code(1, "sh", "echo counted"));
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "counted\n",
        "{r}"
    );
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0, "{}", s.stderr());
    let said = s.stderr();
    assert!(
        !said.contains("usage record"),
        "zygo mcp complained about its usage record: {said}"
    );
    let log = std::fs::read_to_string(state.join("usage.log"))
        .unwrap_or_else(|e| panic!("no usage.log in {} ({e}); stderr: {said}", state.display()));
    let records: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("a usage line is JSON"))
        .collect();
    assert_eq!(records.len(), 1, "{log}");
    assert_eq!(records[0]["function"], "mcp:run_code", "{log}");
    assert_eq!(records[0]["outcome"], "ok", "{log}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&state)
        .expect("the state dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the state directory's mode");
}

/// A stand-in supervisor at `path`: welcomes an MCP front's hello and answers `List` with
/// one function named `found-me`. Dropped, it removes the socket and the folders it made.
struct FakeSupervisor {
    path: PathBuf,
    made: Vec<PathBuf>,
}

impl FakeSupervisor {
    fn start(path: PathBuf) -> FakeSupervisor {
        use proto::front::{FunctionInfo, Hello, HelloReply, Reply, Request, ZygoteCounts};
        use proto::{read_frame, write_frame};
        let mut made = Vec::new();
        let mut missing = Vec::new();
        let mut d = path
            .parent()
            .expect("a socket path has a folder")
            .to_path_buf();
        while !d.exists() {
            missing.push(d.clone());
            d = d.parent().expect("the root exists").to_path_buf();
        }
        for d in missing.into_iter().rev() {
            std::fs::create_dir(&d).expect("make the fake supervisor's folder");
            made.push(d);
        }
        let listener =
            std::os::unix::net::UnixListener::bind(&path).expect("bind the fake supervisor");
        std::thread::spawn(move || {
            for mut c in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let Ok(_hello) = read_frame::<_, Hello>(&mut c, 4096) else {
                        return;
                    };
                    let _ = write_frame(
                        &mut c,
                        &HelloReply::Welcome {
                            version: "0.1.0".into(),
                        },
                    );
                    while let Ok(req) = read_frame::<_, Request>(&mut c, 1 << 20) {
                        let reply = match req {
                            Request::List => Reply::Functions(vec![FunctionInfo {
                                name: "found-me".into(),
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
                                max_warm: 1,
                            }]),
                            _ => Reply::UsageRecorded,
                        };
                        if write_frame(&mut c, &reply).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeSupervisor { path, made }
    }
}

impl Drop for FakeSupervisor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        for d in self.made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// An MCP host that starts the server with a reduced environment (the TypeScript SDK's
/// stdio transport passes HOME, LOGNAME, PATH, SHELL, TERM and USER only) leaves out
/// `XDG_RUNTIME_DIR`: the server still finds a supervisor started in a login session's
/// runtime directory (`/run/user/<uid>/zygo`), and, when it finds none, names every socket
/// it tried and says how to point it at another.
#[test]
fn with_a_reduced_environment_the_server_finds_the_supervisor_or_names_where_it_looked() {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let session = PathBuf::from(format!("/run/user/{uid}/zygo/zygo.sock"));
    let system = if am_root() {
        PathBuf::from("/run/zygo/zygo.sock")
    } else {
        PathBuf::from(format!("/tmp/zygo-{uid}/zygo.sock"))
    };
    // The places the server looks are the host's own: a supervisor of the host's, or
    // anything at those paths already, is not this test's to use or remove.
    for p in [&session, &system] {
        if p.exists() {
            skip(&format!(
                "{} exists on this host: this test needs the places a reduced environment looks to be free",
                p.display()
            ));
            return;
        }
    }
    let reduced = |dirs: &Dirs| {
        // The state directory too is the test's own, so a record goes nowhere else.
        vec![
            ("ZYGO_STATE_DIR".to_string(), dirs.state.str().to_string()),
            ("LOGNAME".to_string(), "root".to_string()),
            ("USER".to_string(), "root".to_string()),
            ("SHELL".to_string(), "/bin/sh".to_string()),
            ("TERM".to_string(), "dumb".to_string()),
        ]
    };
    // None running: every place tried is named, and the way to point it elsewhere.
    let dirs = Dirs::new();
    let env = reduced(&dirs);
    let mut s = Server::start_env(&[], &env, dirs);
    s.init("2025-06-18");
    let r = s.ask(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "list_functions", "arguments": {}}}));
    let err = r["result"]["structuredContent"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {r}"))
        .to_string();
    assert!(err.starts_with("no supervisor is running"), "{err}");
    for p in [&session, &system] {
        assert!(
            err.contains(&p.display().to_string()),
            "{p:?} not named: {err}"
        );
    }
    assert!(err.contains("ZYGO_RUNTIME_DIR"), "{err}");
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0, "{}", s.stderr());

    // One listening in the session's runtime directory is found.
    let _fake = FakeSupervisor::start(session.clone());
    let dirs = Dirs::new();
    let env = reduced(&dirs);
    let mut s = Server::start_env(&[], &env, dirs);
    s.init("2025-06-18");
    let r = s.ask(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "list_functions", "arguments": {}}}));
    assert_eq!(
        r["result"]["structuredContent"]["functions"][0]["name"],
        "found-me",
        "{r}\n{}",
        s.stderr()
    );
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0, "{}", s.stderr());
}

/// A runtime pool is called from MCP with its script as `code`; called without one, the
/// refusal says how (in words an MCP caller can follow).
#[test]
fn a_runtime_pool_is_called_with_its_code() {
    let d = Dirs::new();
    let app = TempDir::new(0o755);
    app.file(
        "sandbox.toml",
        b"[defaults]\nmem = \"256M\"\n\n[fn.py]\nagent = \"python\"\n",
    );
    let env = d.env();
    let mut up = clean(&zygo_bin(), &env);
    up.args(["up", "-f"]).arg(app.path.join("sandbox.toml"));
    let f = finish(up);
    let _guard = Supervisor {
        env: env.clone(),
        log: d.state.path.join("supervisor.log"),
    };
    assert_eq!(f.code, 0, "zygo up: {}", f.stderr_text());
    let runtime = d.runtime.str().to_string();
    let state = d.state.str().to_string();
    let mut s = Server::start_env(
        &[],
        &[
            ("ZYGO_RUNTIME_DIR".into(), runtime),
            ("ZYGO_STATE_DIR".into(), state),
        ],
        Dirs::new(),
    );
    s.init("2025-06-18");
    let r = s.ask(call_function(
        1,
        json!({"name": "py", "event": {"x": 2},
               "code": "def handler(event):\n    print('tripling')\n    return event['x'] * 3\n"}),
    ));
    let v = &r["result"]["structuredContent"];
    assert_eq!(v["outcome"], "ok", "{r}");
    assert_eq!(v["result"], 6, "{r}");
    assert_eq!(v["stdout"], "tripling\n", "{r}");
    let r = s.ask(call_function(2, json!({"name": "py", "event": {}})));
    let v = &r["result"]["structuredContent"];
    assert_eq!(r["result"]["isError"], true, "{r}");
    let err = v["error"].as_str().unwrap_or_default();
    assert!(err.contains("call_function with code"), "{err}");
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0, "{}", s.stderr());
}

/// `--timeout` is a ceiling for `call_function` too: a call of a function whose own
/// timeout is longer ends at the MCP server's (outcome `timeout`).
#[test]
fn call_function_is_held_to_the_ceilings_timeout() {
    let d = Dirs::new();
    let app = TempDir::new(0o755);
    app.file(
        "sandbox.toml",
        b"[defaults]\nmem = \"256M\"\ntimeout = \"60s\"\n\n[fn.slow]\nagent = \"python\"\nentry = \"slow.py:handler\"\n",
    );
    app.file(
        "slow.py",
        b"import time\n\ndef handler(event):\n    time.sleep(event['s'])\n    return 'slept'\n",
    );
    let env = d.env();
    let mut up = clean(&zygo_bin(), &env);
    up.args(["up", "-f"]).arg(app.path.join("sandbox.toml"));
    let f = finish(up);
    let _guard = Supervisor {
        env: env.clone(),
        log: d.state.path.join("supervisor.log"),
    };
    assert_eq!(f.code, 0, "zygo up: {}", f.stderr_text());
    let runtime = d.runtime.str().to_string();
    let state = d.state.str().to_string();
    let mut s = Server::start_env(
        &["--timeout", "1s"],
        &[
            ("ZYGO_RUNTIME_DIR".into(), runtime),
            ("ZYGO_STATE_DIR".into(), state),
        ],
        Dirs::new(),
    );
    s.init("2025-06-18");
    let r = s.ask(call_function(
        1,
        json!({"name": "slow", "event": {"s": 20}}),
    ));
    let v = &r["result"]["structuredContent"];
    assert_eq!(v["outcome"], "timeout", "{r}\n{}", s.stderr());
    // Within the ceiling, the call is answered as usual.
    let r = s.ask(call_function(2, json!({"name": "slow", "event": {"s": 0}})));
    let v = &r["result"]["structuredContent"];
    assert_eq!(v["outcome"], "ok", "{r}");
    assert_eq!(v["result"], "slept", "{r}");
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0, "{}", s.stderr());
}

/// A `--workspace` path through a symbolic link is refused at start, naming the link, and
/// nothing is made or changed where the link points (the sandboxes would write there as
/// that folder's owner). A path that is a file is refused too.
#[test]
fn a_workspace_through_a_link_is_refused_and_nothing_is_made_behind_it() {
    use std::os::unix::fs::PermissionsExt;
    let base = TempDir::new(0o755);
    let target = base.path.join("target");
    std::fs::create_dir(&target).expect("mkdir");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    let link = base.path.join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    for ws in [link.clone(), link.join("new/deeper")] {
        let f = zygo_mcp_refused(&["--workspace", ws.to_str().expect("utf-8")]);
        assert_eq!(f.code, 1, "{}", f.stderr_text());
        let err = f.stderr_text();
        assert!(
            err.contains(&link.display().to_string()) && err.contains("symbolic link"),
            "{err}"
        );
        let mode = std::fs::metadata(&target)
            .expect("stat")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o750, "the link's target was changed");
        assert_eq!(
            std::fs::read_dir(&target).expect("ls").count(),
            0,
            "something was made behind the link"
        );
    }
    base.file("a-file", b"x");
    let f = zygo_mcp_refused(&[
        "--workspace",
        base.path.join("a-file/ws").to_str().expect("utf-8"),
    ]);
    assert_eq!(f.code, 1, "{}", f.stderr_text());
}

/// A `--workspace` holding a set-user-id program is refused at start, naming it (the
/// sandboxes write there as its owner and could change it).
#[test]
fn a_workspace_holding_a_set_id_program_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let base = TempDir::new(0o755);
    let ws = base.path.join("ws");
    std::fs::create_dir_all(ws.join("bin")).expect("mkdir");
    let prog = ws.join("bin/tool");
    std::fs::write(&prog, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    let f = zygo_mcp_refused(&["--workspace", ws.to_str().expect("utf-8")]);
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains(&prog.display().to_string()),
        "{}",
        f.stderr_text()
    );
}

/// A `--workspace` path with `..` in it names the folder it says (made if missing), as
/// long as no link is on the way.
#[test]
fn a_workspace_path_with_dot_dot_is_taken_as_written() {
    let base = TempDir::new(0o755);
    std::fs::create_dir(base.path.join("sub")).expect("mkdir");
    let dir = base.path.join("sub/../ws");
    let mut s = Server::start(&["--workspace", dir.to_str().expect("utf-8")]);
    s.init("2025-06-18");
    let r = s.ask(run_code(1, "python", "open('here.txt', 'w').write('yes')"));
    assert_eq!(r["result"]["isError"], false, "{r}\n{}", s.stderr());
    s.close_stdin();
    assert_eq!(s.wait(Duration::from_secs(20)), 0, "{}", s.stderr());
    assert_eq!(
        std::fs::read_to_string(base.path.join("ws/here.txt")).expect("the file is there"),
        "yes"
    );
}
