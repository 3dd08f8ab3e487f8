//! Promises a new user meets in their first hour that were built but not yet held by a
//! test, end to end on the real binary (a supervisor of the test's own, `zygo api` in
//! front of it over loopback HTTP, `zygo mcp` over stdio):
//!
//! - a tenant's `cpu`, `pids` and `timeout` limits narrow its warm call of a host function
//!   (the request's own cgroup has the tenant's CPU quota and pids limit, a fork loop
//!   inside the call stops at the tenant's limit, a call past the tenant's timeout is
//!   killed naming it), while the host's own call of the same function keeps the
//!   function's;
//! - a cancel before the request is let go to a child answers `started: false`;
//! - one key cancels every call in flight under it;
//! - `zygo mcp`'s deadline answers a `run_code` that outlives it, naming the limit, and
//!   leaves no sandbox behind;
//! - `zygo api` without `--listen` listens on 127.0.0.1:7700, and only there.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zygo_tests::api::{mint, start_http_front, tenant_id, HttpFront};
use zygo_tests::http::{req, Resp};
use zygo_tests::*;

/// The handlers every supervisor of this file serves from.
const HANDLERS: &str = r#"import errno, os, subprocess, time


def slow(event):
    time.sleep(event["s"])
    return "slept"


def nap(event):
    subprocess.run(["sleep", event["marker"]], check=True)
    return "slept"


def _gate(name, limit):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    end = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def forks(event):
    """Fork children that wait on a pipe until a fork fails; count them. Then start
    `sleep MARKER` (which the test finds on the host, in this request's cgroup) and hold
    until the test opens the gate."""
    r, w = os.pipe()
    kids = []
    failed = None
    while len(kids) < 2000:
        try:
            pid = os.fork()
        except OSError as e:
            failed = errno.errorcode.get(e.errno, str(e.errno))
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        kids.append(pid)
    os.close(w)
    os.close(r)
    for k in kids:
        os.waitpid(k, 0)
    marker = subprocess.Popen(["sleep", event["marker"]])
    opened = _gate(event["gate"], 60)
    marker.kill()
    marker.wait()
    return {"forks": len(kids), "failed": failed, "gate": opened}
"#;

static SUITE: Suite = Suite {
    prefix: "prom-",
    handlers: HANDLERS,
    defaults: "timeout = \"30s\"\nmem = \"128M\"\ncpu = 1\npids = 64\nidle_timeout = \"60s\"\n",
    agents: false,
};

// ---------------------------------------------------------------------------------------
// Helpers.

/// A unique `sleep` argument: a number of seconds no other process of the host is likely
/// to sleep, so its command line finds it.
fn marker(base: u32) -> String {
    format!("{base}.{:06}", unique() % 1_000_000)
}

/// The host pid of `sleep MARKER`, once it runs (within 20 s).
fn sleeping(marker: &str) -> i32 {
    let needle = format!("sleep\0{marker}\0");
    let mut found = Vec::new();
    wait_for(Duration::from_secs(20), &format!("sleep {marker}"), || {
        found = host_pids_with(needle.as_bytes());
        !found.is_empty()
    });
    found[0]
}

/// The folder of a process's cgroup, on the host, in the hierarchy holding `ctrl` (the
/// unified one on a cgroup v2 host).
fn cgroup_dir(pid: i32, ctrl: &str) -> PathBuf {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/cgroup: {e}"));
    let v2 = is_cgroup_v2_host();
    let path = parse_cgroups(&text)
        .into_iter()
        .find(|(ctrls, _)| {
            if v2 {
                ctrls.is_empty()
            } else {
                ctrls.iter().any(|c| c == ctrl)
            }
        })
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no {ctrl} line in /proc/{pid}/cgroup: {text}"));
    let (point, _, _) = cgroup_mounts()
        .into_iter()
        .find(|(_, is_v2, opts)| {
            if v2 {
                *is_v2
            } else {
                !is_v2 && opts.iter().any(|o| o == ctrl)
            }
        })
        .unwrap_or_else(|| panic!("no cgroup mount holds {ctrl}"));
    point.join(path.trim_start_matches('/'))
}

fn read_trim(p: &Path) -> String {
    fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .trim()
        .to_string()
}

/// What a request's cgroup allows, read on the host: CPUs (quota over period) and pids.
#[derive(Debug)]
struct Allowed {
    cpus: f64,
    pids: String,
    /// The cgroup's folder, in the cpu hierarchy.
    dir: PathBuf,
}

/// What the cgroup of host process `pid` allows.
fn allowed(pid: i32) -> Allowed {
    let cpu = cgroup_dir(pid, "cpu");
    let cpus = if is_cgroup_v2_host() {
        let max = read_trim(&cpu.join("cpu.max"));
        let (q, p) = max.split_once(' ').unwrap_or((&max, "100000"));
        if q == "max" {
            f64::INFINITY
        } else {
            q.parse::<f64>().unwrap() / p.parse::<f64>().unwrap()
        }
    } else {
        let q: i64 = read_trim(&cpu.join("cpu.cfs_quota_us")).parse().unwrap();
        let p: i64 = read_trim(&cpu.join("cpu.cfs_period_us")).parse().unwrap();
        if q < 0 {
            f64::INFINITY
        } else {
            q as f64 / p as f64
        }
    };
    let pids = read_trim(&cgroup_dir(pid, "pids").join("pids.max"));
    Allowed {
        cpus,
        pids,
        dir: cpu,
    }
}

/// `zygo up` with these functions and an operator token minted on the host, and `zygo api`
/// in front: (function names, operator token, the front).
fn serve(s: &mut Sup, fns: &[(&str, &str, &str)]) -> (Vec<String>, String, HttpFront) {
    let names = s.up(fns);
    let (_, op) = mint(s, None);
    let front = start_http_front(s, &[]);
    (names, op, front)
}

/// A tenant made over HTTP by the operator, and its token minted on the host.
fn tenant(s: &Sup, f: &HttpFront, op: &str, tag: &str) -> (String, String) {
    let t = tenant_id(tag);
    let r = req(
        &f.addr,
        "POST",
        "/tenants",
        Some(op),
        &[],
        &json!({"id": t}).to_string(),
    );
    assert_eq!(r.status, 200, "create tenant {t}: {}", r.text());
    let (_, secret) = mint(s, Some(&t));
    (t, secret)
}

/// `POST /fn/{name}` with `event`, as the holder of `token`, with extra headers.
fn call(f: &HttpFront, token: &str, name: &str, headers: &[(&str, &str)], event: &Value) -> Resp {
    req(
        &f.addr,
        "POST",
        &format!("/fn/{name}"),
        Some(token),
        headers,
        &event.to_string(),
    )
}

/// The same, on a thread of its own: (status, body).
fn call_bg(
    f: &HttpFront,
    token: &str,
    name: &str,
    headers: &[(&str, &str)],
    event: Value,
) -> std::thread::JoinHandle<(u16, Value)> {
    let (addr, token, name) = (f.addr.clone(), token.to_string(), name.to_string());
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    std::thread::spawn(move || {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let r = req(
            &addr,
            "POST",
            &format!("/fn/{name}"),
            Some(&token),
            &h,
            &event.to_string(),
        );
        (r.status, r.json())
    })
}

// ---------------------------------------------------------------------------------------
// 1. A tenant's cpu, pids and timeout narrow a warm call of a host function.

/// One call of `forks` as `token`: the cgroup of its request read on the host while it
/// holds, and what the handler counted.
fn forks_call(s: &Sup, f: &HttpFront, token: &str, name: &str) -> (Allowed, Value) {
    let m = marker(61);
    let gate = format!("gate-{:x}", unique());
    let call = call_bg(
        f,
        token,
        name,
        &[],
        json!({"marker": m, "gate": gate.clone()}),
    );
    let pid = sleeping(&m);
    let a = allowed(pid);
    s.fn_file(&gate, "");
    let (status, v) = call.join().unwrap();
    assert_eq!(status, 200, "[{}] forks: {v}\n{}", s.who.name(), s.log());
    eprintln!("[{}] {a:?}: {}", s.who.name(), v["result"]);
    assert_eq!(v["result"]["gate"], true, "{v}");
    (a, v["result"].clone())
}

/// A tenant held to 0.25 CPU, 8 pids and a 2 s timeout calls a host function declared with
/// 1 CPU, 64 pids and 30 s: its request's cgroup (read on the host, from the cgroup of a
/// process the call started) has a quota of 0.25 CPU and `pids.max` 8, and lies under
/// `tenants/<tenant>/`; a fork loop inside the call stops (EAGAIN) below 8; a call
/// sleeping 6 s is killed as a timeout naming the tenant's 2 s. The host's own calls of
/// the same function keep the function's limits: 1 CPU, 64 pids, a fork loop that gets
/// far past 8, and a 3 s sleep that returns. Narrowed again (0.1 CPU, 5 pids), the
/// tenant's next request has the new limits, not a cgroup kept with the old ones.
fn tenant_limits_narrow_a_warm_call_of_a_host_function(who: Who) {
    let mut s = SUITE.sup(who, "narrow");
    let (names, op, f) = serve(
        &mut s,
        &[("forks", "forks", "max_warm = 2"), ("slow", "slow", "")],
    );
    let (forks, slow) = (&names[0], &names[1]);
    let (t, tt) = tenant(&s, &f, &op, "narrow");
    let r = req(
        &f.addr,
        "PATCH",
        &format!("/tenants/{t}/limits"),
        Some(&op),
        &[],
        r#"{"cpu": 0.25, "pids": 8, "timeout": "2s"}"#,
    );
    assert_eq!(r.status, 200, "set the limits: {}", r.text());

    // The tenant's call: its cgroup and its fork loop.
    let (a, v) = forks_call(&s, &f, &tt, forks);
    let w = who.name();
    assert!(
        a.dir.to_string_lossy().contains(&format!("/tenants/{t}/")),
        "[{w}] the tenant's request runs outside its tenant's cgroups: {a:?}"
    );
    assert!(
        (a.cpus - 0.25).abs() < 0.01,
        "[{w}] the tenant's request may use {} CPUs, not its 0.25: {a:?}",
        a.cpus
    );
    assert_eq!(a.pids, "8", "[{w}] the tenant's request's pids.max: {a:?}");
    let n = v["forks"].as_u64().unwrap();
    assert!(
        (1..8).contains(&n) && v["failed"] == "EAGAIN",
        "[{w}] the tenant's fork loop: {v} (the tenant allows 8 pids)"
    );

    // The host's own call of the same function: the function's limits.
    let (a, v) = forks_call(&s, &f, &op, forks);
    assert!(
        (a.cpus - 1.0).abs() < 0.01,
        "[{w}] the host's request may use {} CPUs, not the function's 1: {a:?}",
        a.cpus
    );
    assert_eq!(a.pids, "64", "[{w}] the host's request's pids.max: {a:?}");
    let n = v["forks"].as_u64().unwrap();
    assert!(
        (32..64).contains(&n) && v["failed"] == "EAGAIN",
        "[{w}] the host's fork loop: {v} (the function allows 64 pids)"
    );

    // The operator narrows the tenant again: its next call has the new limits, not those
    // of a cgroup kept from its last call.
    let r = req(
        &f.addr,
        "PATCH",
        &format!("/tenants/{t}/limits"),
        Some(&op),
        &[],
        r#"{"cpu": 0.1, "pids": 5}"#,
    );
    assert_eq!(r.status, 200, "narrow the limits: {}", r.text());
    let (a, v) = forks_call(&s, &f, &tt, forks);
    assert!(
        (a.cpus - 0.1).abs() < 0.01,
        "[{w}] after the limits narrowed, the tenant's request may use {} CPUs, not 0.1: {a:?}",
        a.cpus
    );
    assert_eq!(a.pids, "5", "[{w}] after the limits narrowed: {a:?}");
    let n = v["forks"].as_u64().unwrap();
    assert!(
        (1..5).contains(&n) && v["failed"] == "EAGAIN",
        "[{w}] the tenant's fork loop after the limits narrowed: {v}"
    );

    // The timeout: the tenant's 2 s kills a 6 s sleep; the host's call sleeps 3 s.
    let t0 = Instant::now();
    let r = call(&f, &tt, slow, &[], &json!({"s": 6}));
    let took = t0.elapsed();
    let v = r.json();
    assert_eq!(
        r.status,
        504,
        "[{w}] the tenant's 6 s call: {v}\n{}",
        s.log()
    );
    assert_eq!(v["code"], "timeout", "{v}");
    assert_eq!(v["error"], "exceeded its 2s time limit", "{v}");
    assert!(
        took < Duration::from_secs(6),
        "[{w}] the tenant's call was answered after {took:?}: it was not killed at 2 s"
    );
    let r = call(&f, &op, slow, &[], &json!({"s": 3}));
    assert_eq!(r.status, 200, "[{w}] the host's 3 s call: {}", r.text());
    assert_eq!(r.json()["result"], "slept");
    drop(f);
    s.shutdown();
}

root_and_rootless!(tenant_limits_narrow_a_warm_call_of_a_host_function);

// ---------------------------------------------------------------------------------------
// 2. A cancel before the request is let go answers `started: false`.

/// A module whose import, once the file `shut` is beside it, waits until `open` is too (at
/// most 60 s): a zygote started after the test writes `shut` is not ready, and a call that
/// needs it waits for a child until the test lets it. `hold` holds until the file its
/// event names appears.
const GATED: &str = r#"import os, time

_here = os.path.dirname(os.path.abspath(__file__))


def _wait(name, limit):
    end = time.monotonic() + limit
    while not os.path.exists(os.path.join(_here, name)):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


if os.path.exists(os.path.join(_here, "shut")):
    _wait("open", 60)


def handler(event):
    return "ran"


def hold(event):
    return _wait(event["gate"], 60)
"#;

/// A host function (`max_warm = 2`) whose one zygote runs the operator's call: a tenant's
/// call may not run beside it, so a second zygote starts, and its import waits on a gate.
/// The tenant's call waits for a child meanwhile; the tenant's `DELETE /requests/{key}`
/// cancels it (`{"cancelled": 1}`), and it answers 499 `cancelled` with `started: false`,
/// with the gate still shut (no child of it ever ran). Once the gate opens the tenant's
/// next call runs (`started: true`), and the operator's call returns: the cancel harmed
/// neither zygote.
fn a_cancel_before_the_child_is_let_go_answers_not_started(who: Who) {
    let mut s = SUITE.sup(who, "early");
    s.fn_file("gated.py", GATED);
    let (names, op, f) = serve(
        &mut s,
        &[(
            "gated",
            "hold",
            "entry = \"fn/gated.py:hold\"\nmax_warm = 2",
        )],
    );
    let gated = &names[0];
    let w = who.name();
    let (_, tt) = tenant(&s, &f, &op, "early");
    // Zygotes started from now on wait at their import.
    s.fn_file("shut", "");
    // The operator's call holds the one zygote there is.
    let release = format!("release-{:x}", unique());
    let held = call_bg(&f, &op, gated, &[], json!({ "gate": release }));
    wait_for(
        Duration::from_secs(20),
        "the operator's call running",
        || s.info(gated)["zygotes"]["busy"] == 1,
    );
    // The tenant's call: a second zygote starts for it, and it waits.
    let key = format!("early-{:x}", unique());
    let victim = call_bg(
        &f,
        &tt,
        gated,
        &[("X-Zygo-Request-Key", &key)],
        json!({"gate": "open"}),
    );
    wait_for(
        Duration::from_secs(20),
        "the tenant's call waiting for a starting zygote",
        || {
            let i = s.info(gated);
            i["in_flight"] == 2 && i["zygotes"]["starting"] == 1
        },
    );
    let r = req(
        &f.addr,
        "DELETE",
        &format!("/requests/{key}"),
        Some(&tt),
        &[],
        "",
    );
    assert_eq!(r.status, 200, "[{w}] the cancel: {}", r.text());
    assert_eq!(r.json()["cancelled"], 1, "{}", r.text());
    let (status, v) = victim.join().unwrap();
    assert_eq!(status, 499, "[{w}] the cancelled call: {v}\n{}", s.log());
    assert_eq!(v["code"], "cancelled", "{v}");
    assert_eq!(
        v["started"], false,
        "[{w}] a call cancelled while it waited for a child says it started: {v}"
    );
    assert_eq!(
        s.info(gated)["zygotes"]["starting"],
        1,
        "[{w}] the second zygote was ready before the cancel was answered: this proves nothing"
    );
    // The gate opens: the tenant's next call runs, the operator's returns.
    s.fn_file("open", "");
    let r = call(&f, &tt, gated, &[], &json!({"gate": "open"}));
    assert_eq!(r.status, 200, "[{w}] the tenant's next call: {}", r.text());
    let v = r.json();
    assert_eq!(
        (&v["result"], &v["started"]),
        (&json!(true), &json!(true)),
        "{v}"
    );
    s.fn_file(&release, "");
    let (status, v) = held.join().unwrap();
    assert_eq!(
        (status, &v["result"]),
        (200, &json!(true)),
        "[{w}] the operator's call: {v}"
    );
    drop(f);
    s.shutdown();
}

root_and_rootless!(a_cancel_before_the_child_is_let_go_answers_not_started);

// ---------------------------------------------------------------------------------------
// 3. One key cancels every call under it.

/// Three calls that each run `sleep` for 30 s, made under one key (each on a connection
/// of its own, as `zygo api` makes them), and a fourth under another key: once the three
/// sleeps run, one `Request::Cancel` of the key answers `Cancelled { count: 3 }`, the three
/// end `cancelled` (having started) long before their sleep would, and their sleeps are
/// gone; the fourth goes on and returns. The key then names nothing (`not_found`).
fn one_key_cancels_every_call_under_it(who: Who) {
    use proto::api::FrontFlags;
    use proto::front::{ErrorCode, ExecRequest, Outcome, Reply, Request};
    use zygo_tests::api::ApiConn;

    let mut s = SUITE.sup(who, "onekey");
    let names = s.up(&[("nap", "nap", "max_warm = 2")]);
    let nap = names[0].clone();
    let (_, op) = mint(&s, None);
    let w = who.name();
    let key = format!("batch-{:x}", unique());
    let long = marker(30);
    let exec = |key: &str, marker: &str| {
        Request::Exec(ExecRequest {
            name: nap.clone(),
            event: json!({ "marker": marker }).to_string(),
            key: Some(key.to_string()),
            timeout_ms: None,
            stream: false,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        })
    };
    let socket = s.socket();
    let start = |req: Request| {
        let (socket, op) = (socket.clone(), op.clone());
        std::thread::spawn(move || {
            let mut c = ApiConn::connect(&socket, FrontFlags::default()).unwrap();
            let t0 = Instant::now();
            let r = c.ask(&op, None, req);
            (r, t0.elapsed())
        })
    };
    let victims: Vec<_> = (0..3).map(|_| start(exec(&key, &long))).collect();
    let other = start(exec(&format!("{key}-other"), "4"));
    let needle = format!("sleep\0{long}\0");
    wait_for(Duration::from_secs(30), "the three calls' sleeps", || {
        host_pids_with(needle.as_bytes()).len() == 3
    });
    let mut api = ApiConn::open(&s, FrontFlags::default());
    match api.ask(&op, None, Request::Cancel { key: key.clone() }) {
        Reply::Cancelled { count } => assert_eq!(count, 3, "[{w}] calls cancelled"),
        other => panic!("[{w}] the cancel: {other:?}\n{}", s.log()),
    }
    for v in victims {
        let (r, took) = v.join().unwrap();
        let Reply::Answer(a) = r else {
            panic!("[{w}] a cancelled call: {r:?}")
        };
        assert_eq!(a.outcome, Outcome::Cancelled, "[{w}] {a:?}");
        assert_eq!(a.error.as_deref(), Some("cancelled"), "{a:?}");
        assert!(a.started, "[{w}] the call was running: {a:?}");
        assert!(
            took < Duration::from_secs(25),
            "[{w}] a cancelled call was answered after {took:?}"
        );
    }
    let mut left = Vec::new();
    wait_for_quietly(Duration::from_secs(5), || {
        left = host_pids_with(needle.as_bytes());
        left.is_empty()
    });
    assert!(
        left.is_empty(),
        "[{w}] cancelled calls' sleeps left: {left:?}"
    );
    let (r, _) = other.join().unwrap();
    match r {
        Reply::Answer(a) => assert_eq!(
            (a.outcome, a.result.as_deref()),
            (Outcome::Ok, Some("\"slept\"")),
            "[{w}] the call under another key: {a:?}"
        ),
        other => panic!("[{w}] the call under another key: {other:?}"),
    }
    match api.ask(&op, None, Request::Cancel { key }) {
        Reply::Error { code, .. } => assert_eq!(code, ErrorCode::NotFound),
        other => panic!("[{w}] a second cancel of the key: {other:?}"),
    }
    drop(api);
    s.shutdown();
}

root_and_rootless!(one_key_cancels_every_call_under_it);

// ---------------------------------------------------------------------------------------
// 4. `zygo mcp`'s deadline.

/// A running `zygo mcp` for `who` with runtime and state folders of its own (so no
/// supervisor of the host is reached): JSON lines in and out, its stderr kept.
struct Mcp {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    _dirs: [TempDir; 2],
}

impl Mcp {
    fn start(who: Who, args: &[&str]) -> Mcp {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let dirs = [TempDir::new(0o700), TempDir::new(0o700)];
        if who == Who::Rootless && am_root() {
            let r = rootless_setup();
            for d in &dirs {
                std::os::unix::fs::chown(&d.path, Some(r.uid), Some(r.gid)).unwrap();
            }
        }
        let mut c = zygo(who);
        c.env("ZYGO_RUNTIME_DIR", &dirs[0].path)
            .env("ZYGO_STATE_DIR", &dirs[1].path)
            .arg("mcp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("start zygo mcp");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let keep = said.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut k = keep.lock().unwrap_or_else(|e| e.into_inner());
                k.push_str(&l);
                k.push('\n');
            }
        });
        Mcp {
            child,
            stdin,
            lines,
            stderr: said,
            _dirs: dirs,
        }
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .map_or_else(|e| e.into_inner().clone(), |s| s.clone())
    }

    fn send(&mut self, v: &Value) {
        use std::io::Write;
        let s = self.stdin.as_mut().expect("stdin is open");
        s.write_all(format!("{v}\n").as_bytes())
            .and_then(|()| s.flush())
            .expect("write to zygo mcp");
    }

    /// The next line, within `secs`.
    fn recv(&mut self, secs: u64) -> Value {
        let l = self
            .lines
            .recv_timeout(Duration::from_secs(secs))
            .unwrap_or_else(|_| panic!("no answer within {secs}s; stderr:\n{}", self.stderr()));
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
    }

    fn run_code(&mut self, id: i64, language: &str, code: &str) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_code", "arguments": {"language": language, "code": code}}}));
    }

    /// Close stdin; its exit code (within 30 s).
    fn close(mut self) -> i32 {
        self.stdin.take();
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "zygo mcp did not exit: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling the child this test started.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The one-shot cgroups of process `pid` (`run-<pid>-…`) under every Zygo root.
fn run_cgroups_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("run-{pid}-");
    zygo_cgroup_roots()
        .into_iter()
        .flat_map(|r| fs::read_dir(r).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

/// `zygo mcp --timeout 3s`: a `run_code` whose program sleeps a minute (and leaves a
/// second sleep in a session of its own) is answered within seconds, as a tool error
/// naming the deadline ("exceeded its 3s time limit", `timed_out`), without the program's
/// last line; when the answer comes neither sleep is left on the host and no one-shot
/// cgroup of the server is left. The server then answers the next call, and exits 0 when
/// its input ends.
fn mcp_run_code_past_the_deadline_is_answered_and_leaves_no_sandbox(who: Who) {
    let w = who.name();
    let mut m = Mcp::start(who, &["--timeout", "3s"]);
    m.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "promises", "version": "1"}}}));
    let init = m.recv(30);
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    let long = marker(62);
    let needle = format!("sleep\0{long}\0");
    let t0 = Instant::now();
    m.run_code(
        1,
        "sh",
        &format!("setsid sleep {long} &\nsleep {long}\necho finished\n"),
    );
    // While it runs: both sleeps, in a one-shot cgroup of the server's (what is checked
    // for below is there to be found).
    let mut seen = (0, 0);
    wait_for(Duration::from_secs(10), "the program's two sleeps", || {
        seen = (
            host_pids_with(needle.as_bytes()).len(),
            run_cgroups_of(m.child.id()).len(),
        );
        seen.0 == 2 && seen.1 > 0
    });
    let r = m.recv(60);
    let took = t0.elapsed();
    let left = host_pids_with(needle.as_bytes());
    let cgroups = run_cgroups_of(m.child.id());
    let v = &r["result"]["structuredContent"];
    assert_eq!(r["id"], 1, "[{w}] {r}");
    assert_eq!(r["result"]["isError"], true, "[{w}] {r}");
    assert_eq!(v["error"], "exceeded its 3s time limit", "[{w}] {r}");
    assert_eq!(v["timed_out"], true, "[{w}] {r}");
    assert!(
        !v["stdout"].as_str().unwrap_or("").contains("finished"),
        "[{w}] {r}"
    );
    assert!(
        took < Duration::from_secs(20),
        "[{w}] answered after {took:?}, its deadline is 3 s"
    );
    assert!(
        left.is_empty(),
        "[{w}] the sandbox's sleeps outlived the answer: {left:?}\n{}",
        m.stderr()
    );
    assert!(
        cgroups.is_empty(),
        "[{w}] the sandbox's cgroups outlived the answer: {cgroups:?}"
    );
    // It goes on serving.
    m.run_code(2, "sh", "echo after");
    let r = m.recv(60);
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "after\n",
        "[{w}] {r}"
    );
    let stderr = m.stderr();
    assert_eq!(m.close(), 0, "[{w}] {stderr}");
}

root_and_rootless!(mcp_run_code_past_the_deadline_is_answered_and_leaves_no_sandbox);

// ---------------------------------------------------------------------------------------
// 5. Where `zygo api` listens when not told.

/// Where `zygo api` listens without `--listen` (docs/api.md, the user's document).
const DEFAULT_LISTEN: &str = "127.0.0.1:7700";

/// The tests that take the default port take turns.
static DEFAULT_PORT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The bootstrap token of the supervisor behind the default address.
const BOOT: &str = "bootstrap-secret-for-promises-tests";

/// Listening TCP sockets of this network namespace: (local `IP:PORT`, inode).
fn tcp_listeners() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let text = fs::read_to_string(file).unwrap_or_default();
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let Some((ip, port)) = f[1].split_once(':') else {
                continue;
            };
            let port = u16::from_str_radix(port, 16).unwrap_or(0);
            let ip = if v6 {
                // Four host-order words.
                let mut b = [0u8; 16];
                for (i, w) in (0..4).map(|i| &ip[i * 8..i * 8 + 8]).enumerate() {
                    let w = u32::from_str_radix(w, 16).unwrap_or(0).to_ne_bytes();
                    b[i * 4..i * 4 + 4].copy_from_slice(&w);
                }
                format!("[{}]", std::net::Ipv6Addr::from(b))
            } else {
                let w = u32::from_str_radix(ip, 16).unwrap_or(0).to_ne_bytes();
                std::net::Ipv4Addr::from(w).to_string()
            };
            out.push((format!("{ip}:{port}"), f[9].parse().unwrap_or(0)));
        }
    }
    out
}

/// The socket inodes a process holds.
fn socket_inodes(pid: i32) -> Vec<u64> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let t = fs::read_link(e.path()).ok()?;
            let t = t.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Who listens on `port` here, in words (the pid and command line of each holder).
fn holders(port: u16) -> String {
    let inodes: Vec<u64> = tcp_listeners()
        .into_iter()
        .filter(|(a, _)| a.ends_with(&format!(":{port}")))
        .map(|(_, i)| i)
        .collect();
    let held: Vec<String> = host_processes()
        .into_iter()
        .filter(|(pid, _)| socket_inodes(*pid).iter().any(|i| inodes.contains(i)))
        .map(|(pid, cmd)| {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            format!(
                "{pid} ({})",
                cmd.split_whitespace().collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    if held.is_empty() {
        "a process this test cannot see".into()
    } else {
        held.join(", ")
    }
}

/// `zygo api` with no `--listen` in front of the test's own supervisor says it listens on
/// http://127.0.0.1:7700, and does: the only TCP socket it listens on is 127.0.0.1:7700
/// (loopback, not every address), and a call there with this supervisor's bootstrap token
/// reaches this supervisor's function. If another process already holds the port, the test
/// fails saying which (it cannot prove anything then), rather than talking to that one.
fn zygo_api_listens_on_loopback_7700_by_default(who: Who) {
    use std::io::{BufRead, BufReader};
    let _turn = DEFAULT_PORT.lock().unwrap_or_else(|e| e.into_inner());
    let w = who.name();
    let mut s = SUITE.sup(who, "listen");
    s.env("ZYGO_API_TOKEN", BOOT);
    let names = s.up(&[("slow", "slow", "")]);
    // The port must be free, or what answers there is somebody else's.
    if let Err(e) = std::net::TcpListener::bind(DEFAULT_LISTEN) {
        panic!(
            "[{w}] {DEFAULT_LISTEN}, where zygo api listens by default, is taken on this \
             machine ({e}), by {}: stop that server to run this test",
            holders(7700)
        );
    }
    let mut c = s.cmd(&["api"]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("start zygo api");
    let pid = child.id() as i32;
    let (tx, said) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let mut log = String::new();
    let listening = loop {
        match said.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => {
                log.push_str(&l);
                log.push('\n');
                if l.contains("listening on") {
                    break l;
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "[{w}] zygo api did not say where it listens: {log}(port 7700 held by {})",
                    holders(7700)
                );
            }
        }
    };
    let stop = |mut child: std::process::Child| {
        // SAFETY: signalling the child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().unwrap()
    };
    assert!(
        listening.contains(&format!("listening on http://{DEFAULT_LISTEN} ")),
        "[{w}] {listening}"
    );
    let mine: Vec<String> = {
        let inodes = socket_inodes(pid);
        tcp_listeners()
            .into_iter()
            .filter(|(_, i)| inodes.contains(i))
            .map(|(a, _)| a)
            .collect()
    };
    assert_eq!(
        mine,
        vec![DEFAULT_LISTEN.to_string()],
        "[{w}] the TCP sockets zygo api listens on"
    );
    let r = req(
        DEFAULT_LISTEN,
        "POST",
        &format!("/fn/{}", names[0]),
        Some(BOOT),
        &[],
        r#"{"s": 0}"#,
    );
    assert_eq!(
        r.status,
        200,
        "[{w}] a call on {DEFAULT_LISTEN}: {}",
        r.text()
    );
    assert_eq!(r.json()["result"], "slept");
    let st = stop(child);
    assert!(st.success(), "[{w}] zygo api on SIGTERM: {st}");
    s.shutdown();
}

root_and_rootless!(zygo_api_listens_on_loopback_7700_by_default);
