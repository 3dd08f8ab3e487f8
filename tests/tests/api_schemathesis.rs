//! schemathesis (PyPI, installed by `tests/schemathesis/setup.sh`) against
//! `spec/openapi.json` and a live `zygo api` in front of a real supervisor: every
//! operation with generated bodies, parameters and headers, checked for no 5xx
//! (`not_a_server_error`) and no status the document does not list
//! (`status_code_conformance`).
//!
//! It runs as the bootstrap operator of an API started without `--allow-deploy`: every
//! route is reached, the deploy routes answer 403 (so generated input never serves a
//! function, runs a one-shot sandbox or drains the supervisor), and the others do their
//! work on the test's own supervisor. Then once more as a tenant.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apis-",
    handlers: "def echo(event):\n    return {\"echo\": event}\n",
    defaults: "timeout = \"10s\"\nmem = \"64M\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-schemathesis";

fn venv() -> PathBuf {
    if let Some(d) = std::env::var_os("ZYGO_SCHEMATHESIS_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    cache.join("zygo-schemathesis")
}

struct Front(Child);

impl Drop for Front {
    fn drop(&mut self) {
        // SAFETY: signalling the child this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

#[test]
fn schemathesis_finds_no_server_error_and_no_undocumented_status() {
    if !root_only() {
        return;
    }
    let st = venv().join("bin/schemathesis");
    if !st.is_file() {
        skip(&format!(
            "schemathesis is not installed at {} (run tests/schemathesis/setup.sh)",
            st.display()
        ));
        return;
    }
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec/openapi.json");
    let mut s = SUITE.sup(Who::Root, "fuzz");
    s.env("ZYGO_API_TOKEN", BOOT);
    // POST /deps is any caller's: a generated body may start a real build. Its registry is
    // this host's loopback, where nothing listens, so no build sends a packet anywhere.
    s.env("ZYGO_DEPS_REGISTRIES", "127.0.0.1:9")
        .env("ZYGO_DEPS_PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
        .env("ZYGO_DEPS_NPM_REGISTRY", "http://127.0.0.1:9/");
    let names = s.up(&[("echo", "echo", "")]);
    let mut c = s.cmd(&["api", "--listen", "127.0.0.1:0"]);
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("start zygo api");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let front = Front(child);
    let mut addr = None;
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some(rest) = line.split("listening on http://").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_string);
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let addr = addr.expect("zygo api said where it listens");
    let tenant = format!("st{:x}", unique() & 0xff_ffff);
    // A tenant of its own, for the second run as a tenant.
    let body = format!("{{\"id\": \"{tenant}\"}}");
    let made = http(
        &addr,
        &format!(
            "POST /tenants HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {BOOT}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(made.starts_with("HTTP/1.1 200"), "POST /tenants: {made}");
    let f = s.run(&["token", "mint", "--tenant", &tenant, "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let tenant_token = Some(text(&f.last_json(), "secret").to_string());
    let mut tokens = vec![BOOT.to_string()];
    tokens.extend(tenant_token);
    for token in tokens {
        let out = std::process::Command::new(&st)
            .arg("run")
            .arg(&spec)
            .arg("--url")
            .arg(format!("http://{addr}"))
            .args(["--checks", "not_a_server_error,status_code_conformance"])
            .arg("-H")
            .arg(format!("Authorization: Bearer {token}"))
            .args(["--max-examples", "25", "--seed", "1"])
            .env("SCHEMATHESIS_HOOKS", "")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("run schemathesis");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "schemathesis found problems (exit {:?}):\n{text}\nsupervisor log:\n{}",
            out.status.code(),
            s.log()
        );
        // The front is still there and serving.
        assert!(
            front_alive(&addr),
            "zygo api stopped answering after the run"
        );
    }
    let _ = names;
    drop(front);
    s.shutdown();
}

/// One request on its own connection (`Connection: close`); the whole answer as text.
fn http(addr: &str, raw: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    if c.write_all(raw.as_bytes()).is_err() {
        return String::new();
    }
    let mut buf = String::new();
    let _ = c.read_to_string(&mut buf);
    buf
}

fn front_alive(addr: &str) -> bool {
    http(
        addr,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .starts_with("HTTP/1.1 200")
}
