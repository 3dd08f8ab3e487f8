//! Runtime pools and the script store, end to end on the real kernel: each test starts its
//! own supervisor (`zygo up -f <tmp>/sandbox.toml` with its own runtime and state
//! directories), registers scripts with `zygo scripts put`, runs them with
//! `zygo exec POOL --digest D | --script FILE`, and at the end drains the supervisor and
//! checks that it left no cgroup and no process behind.
//!
//! A pool is a `[fn.NAME]` with `agent = "python"` and no `entry` (each call's script
//! defines `handler(event)`), or with `cmd = [...]` (warm-exec: the command runs with the
//! script's path as its last argument and the event on stdin). Scripts are stored under
//! `<ZYGO_STATE_DIR>/scripts/<sha256>` and written into the sandbox at
//! `/run/script/<sha256>`, which no script may list, write or change.

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use zygo_tests::*;

/// A Python pool: an agent and no entry.
const PY_POOL: &str = "agent = \"python\"";
/// A warm-exec pool running scripts with /bin/sh.
const SH_POOL: &str = "cmd = [\"/bin/sh\"]";

/// One supervisor per test: its pools (and the one ordinary function some tests serve
/// next to them, from `fn/handlers.py`), under small defaults.
static SUITE: Suite = Suite {
    prefix: "pool-",
    handlers: "def hello(event):\n    return {\"echo\": event}\n",
    defaults: "timeout = \"8s\"\nmem = \"64M\"\nidle_timeout = \"30s\"\n",
    agents: false,
};

// ---------------------------------------------------------------------------------------
// Helpers.

/// SHA-256 of `bytes` as lowercase hex, computed by `sha256sum` (independently of Zygo).
fn sha256_hex(bytes: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha256sum");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(bytes)
        .expect("feed sha256sum");
    let out = child.wait_with_output().expect("sha256sum output");
    assert!(out.status.success(), "sha256sum: {}", out.status);
    let text = String::from_utf8(out.stdout).expect("sha256sum prints ASCII");
    text.split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

// ---------------------------------------------------------------------------------------
// Scripts the tests run.

/// Returns what it was given and where it runs; writes to stdout and stderr.
const ECHO_PY: &str = r#"import os, sys
def handler(event):
    print("script stdout")
    print("script stderr", file=sys.stderr)
    return {"event": event, "file": __file__, "cwd": os.getcwd()}
"#;

/// Writes a secret into its own /work directory, waits, and says whether it is still there.
const SECRET_PY: &str = r#"import os, time
def handler(event):
    with open("secret.txt", "w") as f:
        f.write(event["token"])
    time.sleep(event["secs"])
    with open("secret.txt") as f:
        still = f.read() == event["token"]
    return {"cwd": os.getcwd(), "still_there": still, "marker": "secret-script"}
"#;

/// Looks everywhere a neighbour's script name or /work directory could show: the script
/// folder and /run (listed and globbed), mountinfo, the environment, and for every visible
/// process its cmdline, environ, status, maps, cwd/root/exe links, descriptors and the
/// files in its cwd; /tmp and /work walked. Returns what it found as one text.
const SNOOP_PY: &str = r#"import glob, os
def attempt(f):
    try:
        return f()
    except OSError as e:
        return type(e).__name__
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode("utf-8", "replace")
    except OSError as e:
        return type(e).__name__
def handler(event):
    seen = []
    r = {"own": __file__, "cwd": os.getcwd()}
    r["listdir_script"] = attempt(lambda: sorted(os.listdir("/run/script")))
    r["listdir_run"] = attempt(lambda: sorted(os.listdir("/run")))
    r["scandir_script"] = attempt(lambda: [e.name for e in os.scandir("/run/script")])
    r["glob"] = glob.glob("/run/script/*") + glob.glob("/run/*") + glob.glob("/run/*/*")
    seen.append(read("/proc/self/mountinfo"))
    seen.append(repr(dict(os.environ)))
    me, others = os.getpid(), 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        others += int(p) != me
        base = "/proc/" + p
        for name in ("cmdline", "environ", "status", "stat", "maps", "mountinfo", "comm"):
            seen.append(read(base + "/" + name))
        for link in ("cwd", "root", "exe"):
            seen.append(str(attempt(lambda: os.readlink(base + "/" + link))))
        fds = attempt(lambda: os.listdir(base + "/fd"))
        if isinstance(fds, list):
            for fd in fds:
                seen.append(str(attempt(lambda: os.readlink(base + "/fd/" + fd))))
        entries = attempt(lambda: os.listdir(base + "/cwd"))
        if isinstance(entries, list):
            for n in entries:
                seen.append(n)
                seen.append(read(base + "/cwd/" + n))
    for top in ("/tmp", "/work"):
        for d, dirs, files in os.walk(top):
            seen.extend([d] + dirs + files)
            for n in files:
                seen.append(read(os.path.join(d, n)))
    r["processes"] = others
    r["seen"] = "\n".join(str(s) for s in seen)
    return r
"#;

/// Tries to change /run/script: write, truncate, unlink, chmod, rename, link its own file
/// and the one named in the event; chmod the folder; create a file, a folder and a symlink
/// in it. Returns "OK" or the errno's name for each.
const TAMPER_PY: &str = r#"import errno, os
def attempt(f):
    try:
        f()
        return "OK"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def handler(event):
    d = "/run/script"
    r = {}
    for who, p in (("own", __file__), ("other", d + "/" + event["other"])):
        r[who + "_write"] = attempt(lambda: open(p, "a").write("x"))
        r[who + "_rdwr"] = attempt(lambda: os.close(os.open(p, os.O_RDWR)))
        r[who + "_truncate"] = attempt(lambda: os.truncate(p, 0))
        r[who + "_unlink"] = attempt(lambda: os.unlink(p))
        r[who + "_chmod"] = attempt(lambda: os.chmod(p, 0o666))
        r[who + "_rename"] = attempt(lambda: os.rename(p, d + "/" + "e" * 64))
        r[who + "_link"] = attempt(lambda: os.link(p, d + "/" + "f" * 64))
        r[who + "_utime"] = attempt(lambda: os.utime(p, (0, 0)))
    r["dir_chmod"] = attempt(lambda: os.chmod(d, 0o777))
    r["create"] = attempt(lambda: open(d + "/" + "0" * 64, "x").write("x"))
    r["create_tmp"] = attempt(lambda: open(d + "/new.txt", "w").write("x"))
    r["mkdir"] = attempt(lambda: os.mkdir(d + "/sub"))
    r["symlink"] = attempt(lambda: os.symlink("/etc/passwd", d + "/" + "1" * 64))
    r["run_create"] = attempt(lambda: open("/run/x", "w").write("x"))
    return r
"#;

// ---------------------------------------------------------------------------------------
// The store.

/// `zygo scripts put FILE` prints the SHA-256 of the file's bytes (any bytes: NUL, non-UTF-8,
/// no final newline, empty); the same bytes twice are one digest and one file; different
/// bytes another; the stored file holds exactly the bytes; --json gives digest and size.
#[test]
fn scripts_put_is_content_addressed() {
    let Some(mut s) = SUITE.root("store") else {
        return;
    };
    s.up(&[("py", PY_POOL)]);

    let a: &[u8] = b"def handler(event):\r\n    return '\xff\x00\xe9'";
    let b: &[u8] = b"def handler(event):\n    return 2\n";
    let (da, db) = (sha256_hex(a), sha256_hex(b));

    let got = s.put(&s.file("a.py", a));
    assert_eq!(got, da, "the digest printed is the SHA-256 of the bytes");
    assert!(is_digest(&got), "64 lowercase hex digits: {got:?}");
    assert_eq!(s.store(), vec![da.clone()], "one file in the store");

    // The same bytes again, from another file: the same digest, still one file.
    assert_eq!(s.put(&s.file("a-again.py", a)), da);
    assert_eq!(s.put(&s.file("a.py", a)), da);
    assert_eq!(s.store(), vec![da.clone()], "the same bytes are one file");

    // Different bytes: a different digest and a second file.
    assert_eq!(s.put(&s.file("b.py", b)), db);
    assert_ne!(da, db);
    let mut both = vec![da.clone(), db.clone()];
    both.sort();
    assert_eq!(
        s.store(),
        both,
        "two scripts, two files (and no temporary left)"
    );

    // The store holds exactly the bytes.
    let store = s.st.join("scripts");
    assert_eq!(fs::read(store.join(&da)).expect("read the stored a"), a);
    assert_eq!(fs::read(store.join(&db)).expect("read the stored b"), b);

    // --json: {"digest", "size"}.
    let f = s.run(&["scripts", "put", &s.file("b2.py", b), "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let v: Value = serde_json::from_slice(&f.stdout).expect("--json prints JSON");
    assert_eq!(v, json!({"digest": db, "size": b.len()}), "{v}");

    // The empty script has the empty string's digest.
    let empty = s.put(&s.file("empty.py", b""));
    assert_eq!(empty, sha256_hex(b""));
    assert_eq!(
        fs::read(store.join(&empty)).expect("read the stored empty"),
        b""
    );
    assert_eq!(s.store().len(), 3, "{:?}", s.store());

    // A file that does not exist is the caller's mistake, and stores nothing.
    let f = s.run(&["scripts", "put", "/nonexistent/zygo-no-such-script.py"]);
    assert_eq!(f.code, 2, "a missing file: {}", f.stderr_text());
    assert_eq!(s.store().len(), 3, "{:?}", s.store());
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Python pools and warm-exec pools, rootful and rootless.

root_and_rootless!(
    python_pool,
    node_pool,
    warm_exec,
    script_isolation,
    warm_exec_hides_neighbour_digest,
    exec_child_work_hidden
);

/// A Node runtime pool (`agent = "node"`, no entry): each call's Node spare imports the
/// script the call names, an ES module's default export or a CommonJS module's `handler`;
/// its output is captured; a script with no function, or one that does not parse, is that
/// caller's error; and a script cannot list the other scripts.
fn node_pool(who: Who) {
    if !std::path::Path::new("/usr/bin/node").exists() {
        // `.ci/run` installs it: under CI this fails rather than skips.
        zygo_tests::skip("no /usr/bin/node on this machine");
        return;
    }
    let mut s = SUITE.sup(who, "js");
    let n = s.up(&[("js", "agent = \"node\"")]);
    let pool = &n[0];
    let info = s.info(pool);
    assert_eq!(info["kind"], "pool", "{info}");
    assert_eq!(info["state"], "serving", "{info}");

    let esm = "import fs from \"node:fs\";\n\
               export default async function (event) {\n\
               console.log(\"from js\");\n\
               let listed;\n\
               try { listed = fs.readdirSync(\"/run/script\"); } catch (e) { listed = e.code; }\n\
               return { sum: event.a + event.b, url: import.meta.url, listed };\n\
               }\n";
    let d = s.put_script("add.mjs", esm);
    let v = s.run_ok(pool, r#"{"a": 2, "b": 3}"#, &d);
    assert_eq!(v["result"]["sum"], 5, "{v}");
    assert_eq!(v["result"]["url"], format!("file:///run/script/{d}"), "{v}");
    assert_eq!(v["result"]["listed"], "EACCES", "listing /run/script: {v}");
    assert_eq!(v["stdout"], "from js\n", "{v}");

    let cjs = s.put_script(
        "cjs.js",
        "module.exports.handler = async (e) => ({ cjs: e });\n",
    );
    let v = s.run_ok(pool, r#"{"x": 1}"#, &cjs);
    assert_eq!(v["result"], json!({"cjs": {"x": 1}}), "{v}");

    let none = s.put_script("none.mjs", "export const x = 1;\n");
    let (v, f) = s.exec(pool, None, &["--digest", &none]);
    let e = s.assert_handler_error(&v, &f);
    assert!(e.contains("no default export"), "{v}");
    let bad = s.put_script(
        "bad.mjs",
        "export default function () { return nope nope; }\n",
    );
    let (v, f) = s.exec(pool, None, &["--digest", &bad]);
    let e = s.assert_handler_error(&v, &f);
    assert!(e.contains("SyntaxError"), "{v}");
    // The pool keeps serving.
    let v = s.run_ok(pool, r#"{"a": 1, "b": 1}"#, &d);
    assert_eq!(v["result"]["sum"], 2, "{v}");
    s.shutdown();
}

/// A Python pool runs the named script's handler(event): by --digest (lowercase or
/// upper) and by --script FILE (which stores the file); stdout and stderr are captured;
/// the request runs in its own /work directory. A script that raises, one with no
/// handler, one whose handler is not a function and one with a syntax error each give a
/// clear handler error, and the pool keeps serving.
fn python_pool(who: Who) {
    let mut s = SUITE.sup(who, "py");
    let n = s.up(&[("py", PY_POOL)]);
    let pool = &n[0];
    let info = s.info(pool);
    assert_eq!(info["kind"], "pool", "{info}");
    assert_eq!(info["state"], "serving", "{info}");

    let d = s.put_script("echo.py", ECHO_PY);
    assert_eq!(d, sha256_hex(ECHO_PY.as_bytes()));
    let v = s.run_ok(pool, r#"{"x":1}"#, &d);
    let r = &v["result"];
    assert_eq!(r["event"], json!({"x": 1}), "{v}");
    assert_eq!(r["file"], format!("/run/script/{d}"), "{v}");
    let cwd = text(r, "cwd");
    assert!(
        cwd.strip_prefix("/work/").is_some_and(|x| is_hex(x, 32)),
        "cwd: {v}"
    );
    assert_eq!(v["stdout"], "script stdout\n", "{v}");
    assert_eq!(v["stderr"], "script stderr\n", "{v}");
    assert!(is_hex(text(&v, "request_id"), 32), "{v}");

    // The CLI takes the digest in capitals too.
    let v = s.run_ok(pool, r#"{"x":2}"#, &d.to_ascii_uppercase());
    assert_eq!(v["result"]["event"], json!({"x": 2}), "{v}");

    // --script FILE: run, and stored under its digest (exactly its bytes).
    let src = format!("{ECHO_PY}# a one-off {}\n", unique());
    let file = s.file("oneoff.py", src.as_bytes());
    let d2 = sha256_hex(src.as_bytes());
    assert!(!s.store().contains(&d2), "not stored before the call");
    let (v, f) = s.exec(pool, Some(r#"{"y":[1,2]}"#), &["--script", &file]);
    s.assert_ok(&v, &f, "--script");
    assert_eq!(v["result"]["event"], json!({"y": [1, 2]}), "{v}");
    assert_eq!(v["result"]["file"], format!("/run/script/{d2}"), "{v}");
    assert!(
        s.store().contains(&d2),
        "--script stores the file: {:?}",
        s.store()
    );
    assert_eq!(
        fs::read(s.st.join("scripts").join(&d2)).expect("read"),
        src.as_bytes()
    );
    // ... and can be called by digest afterwards.
    assert_eq!(s.run_ok(pool, "{}", &d2)["result"]["event"], json!({}));

    // A script that raises: the error and its traceback, with the output so far.
    let raises = s.put_script(
        "raises.py",
        "def handler(event):\n    print('before')\n    raise ValueError('boom ' + str(event['n']))\n",
    );
    let (v, f) = s.exec(pool, Some(r#"{"n":7}"#), &["--digest", &raises]);
    let e = s.assert_handler_error(&v, &f);
    assert_eq!(e, "ValueError: boom 7", "{v}");
    let tb = text(&v, "traceback");
    assert!(
        tb.starts_with("Traceback (most recent call last):"),
        "traceback: {v}"
    );
    assert!(
        tb.contains(&format!("/run/script/{raises}")),
        "the traceback names the script: {v}"
    );
    assert!(tb.contains("raise ValueError"), "{v}");
    assert_eq!(v["stdout"], "before\n", "{v}");

    // No handler.
    let nohandler = s.put_script("nohandler.py", "def main(event):\n    return 1\n");
    let (v, f) = s.exec(pool, None, &["--digest", &nohandler]);
    let e = s.assert_handler_error(&v, &f);
    assert!(e.contains("has no function 'handler'"), "{v}");

    // A handler that is not a function.
    let notfn = s.put_script("notfn.py", "handler = 5\n");
    let (v, f) = s.exec(pool, None, &["--digest", &notfn]);
    let e = s.assert_handler_error(&v, &f);
    assert!(
        e.contains("not a function") && e.contains("'handler'"),
        "{v}"
    );

    // A syntax error: "cannot import ...: SyntaxError", the line shown.
    let syntax = s.put_script("syntax.py", "def handler(event)\n    return 1\n");
    let (v, f) = s.exec(pool, None, &["--digest", &syntax]);
    let e = s.assert_handler_error(&v, &f);
    assert!(
        e.starts_with("cannot import ") && e.contains("SyntaxError"),
        "{v}"
    );
    assert!(text(&v, "traceback").contains("def handler(event)"), "{v}");

    // The pool keeps serving, the same zygote.
    let v = s.run_ok(pool, r#"{"after":"errors"}"#, &d);
    assert_eq!(v["result"]["event"], json!({"after": "errors"}), "{v}");
    let info = s.info(pool);
    assert_eq!(info["state"], "serving", "{info}");
    s.shutdown();
}

/// A warm-exec pool (cmd = ["/bin/sh"]; another with ["/bin/sh", "-e"]): the command runs
/// with /run/script/<digest> as its last argument (argv read from /proc/self/cmdline),
/// the event JSON on stdin, in its own /work directory; stdout and stderr are captured;
/// exit 0 → {"exit_code": 0}; exit 3 → an error naming status 3, output kept.
fn warm_exec(who: Who) {
    let mut s = SUITE.sup(who, "exec");
    let n = s.up(&[("sh", SH_POOL), ("she", "cmd = [\"/bin/sh\", \"-e\"]")]);
    let (sh, she) = (&n[0], &n[1]);
    assert_eq!(s.info(sh)["kind"], "pool");
    let script = "tr '\\0' '\\n' < /proc/$$/cmdline | sed 's/^/argv: /'\n\
                  printf 'zero: %s\\n' \"$0\"\n\
                  printf 'pwd: %s\\n' \"$(pwd)\"\n\
                  printf 'event: %s\\n' \"$(cat)\"\n\
                  echo 'to stderr' >&2\n";
    let d = s.put_script("argv.sh", script);
    let path = format!("/run/script/{d}");
    for (pool, argv) in [
        (sh, vec!["/bin/sh", &path]),
        (she, vec!["/bin/sh", "-e", &path]),
    ] {
        let v = s.run_ok(pool, r#"{"y": [1, 2], "s": "é"}"#, &d);
        assert_eq!(v["result"], json!({"exit_code": 0}), "{v}");
        let out = text(&v, "stdout");
        let got: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("argv: "))
            .collect();
        assert_eq!(got, argv, "argv: the script's path last: {v}");
        assert!(out.contains(&format!("zero: {path}\n")), "{v}");
        let pwd = out
            .lines()
            .find_map(|l| l.strip_prefix("pwd: "))
            .unwrap_or("");
        assert!(
            pwd.strip_prefix("/work/").is_some_and(|x| is_hex(x, 32)),
            "pwd: {v}"
        );
        let ev = out
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or("");
        let ev: Value = serde_json::from_str(ev).unwrap_or(Value::Null);
        assert_eq!(
            ev,
            json!({"y": [1, 2], "s": "é"}),
            "the event on stdin: {v}"
        );
        assert_eq!(v["stderr"], "to stderr\n", "{v}");
    }

    // --script works too (and stores it).
    let file = s.file("three.sh", b"echo out; echo err >&2; exit 3\n");
    let (v, f) = s.exec(sh, None, &["--script", &file]);
    let e = s.assert_handler_error(&v, &f);
    assert!(e.contains("status 3"), "the error names the status: {v}");
    assert_eq!(v["stdout"], "out\n", "{v}");
    assert_eq!(v["stderr"], "err\n", "{v}");
    assert!(s
        .store()
        .contains(&sha256_hex(b"echo out; echo err >&2; exit 3\n")));

    // Killed by a signal: an error saying so; then the pool still serves.
    let killed = s.put_script("killed.sh", "kill -9 $$\n");
    let (v, f) = s.exec(sh, None, &["--digest", &killed]);
    let e = s.assert_handler_error(&v, &f);
    assert!(e.contains("signal 9"), "{v}");
    let v = s.run_ok(sh, "{}", &d);
    assert_eq!(v["result"], json!({"exit_code": 0}), "{v}");
    s.shutdown();
}

/// From inside a pool script (max_warm = 1, so every request shares one sandbox):
/// /run/script and /run cannot be listed (PermissionError), and a script A that looks
/// everywhere (the folders, mountinfo, the environment, every visible process's
/// cmdline/environ/status/maps/links/descriptors/cwd, /tmp, /work) while script B is in
/// flight, and after script C ran there, finds neither B's nor C's digest, nor B's /work
/// directory or the secret B wrote in it. Then a script cannot write, truncate, unlink,
/// chmod, rename or link its own file or another's in /run/script, nor chmod the folder,
/// nor create a file, folder or symlink there; the scripts still run unchanged.
fn script_isolation(who: Who) {
    let mut s = SUITE.sup(who, "iso");
    let n = s.up(&[("py", &format!("{PY_POOL}\nmax_warm = 1"))]);
    let pool = &n[0];
    let da = s.put_script("a.py", SNOOP_PY);
    let db = s.put_script("b.py", SECRET_PY);
    let dc = s.put_script("c.py", ECHO_PY);
    // C ran in this sandbox before: its file is in /run/script.
    s.run_ok(pool, "{}", &dc);

    let token = format!("token-{:x}", unique());
    let b = s.exec_in_flight(
        pool,
        &json!({"token": token, "secs": 2}).to_string(),
        &["--digest", &db],
    );
    std::thread::sleep(Duration::from_millis(300));
    let (a, f) = s.exec(pool, None, &["--digest", &da]);
    s.assert_ok(&a, &f, "the snooping script");
    let r = &a["result"];
    assert_eq!(
        r["listdir_script"],
        "PermissionError",
        "listing /run/script: {}",
        truncate(&r.to_string(), 2000)
    );
    // /run holds the agent's folder and the script folder, names no script.
    assert_eq!(
        r["listdir_run"],
        json!(["script", "zygo"]),
        "listing /run: {}",
        truncate(&r.to_string(), 2000)
    );
    assert_eq!(
        r["scandir_script"],
        "PermissionError",
        "{}",
        truncate(&r.to_string(), 2000)
    );
    let globbed: Vec<&str> = r["glob"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    assert!(
        !globbed.iter().any(|p| p.starts_with("/run/script/")),
        "globbing /run found scripts: {}",
        truncate(&r.to_string(), 2000)
    );
    assert_eq!(r["own"], format!("/run/script/{da}"));
    // /proc (hidepid) shows a request none of its neighbours: as root each has a uid of its
    // own, and rootless (one uid for all) each has a Landlock domain of its own.
    assert_eq!(
        r["processes"],
        0,
        "[{}] saw other processes: {}",
        who.name(),
        truncate(&r.to_string(), 2000)
    );

    let bf = b.join().expect("the B thread");
    let bv = bf.last_json();
    s.assert_ok(&bv, &bf, "script B");
    assert_eq!(bv["result"]["still_there"], true, "{bv}");
    let bcwd = text(&bv["result"], "cwd").to_string();
    assert_ne!(bcwd, text(r, "cwd"), "A and B shared a /work directory");

    let answer = a.to_string();
    for (what, needle) in [
        ("B's digest", &db),
        ("C's digest", &dc),
        ("B's secret", &token),
        ("B's /work directory", &bcwd),
    ] {
        if let Some(i) = answer.find(needle.as_str()) {
            let from = answer[..i]
                .char_indices()
                .rev()
                .nth(300)
                .map_or(0, |(j, _)| j);
            panic!(
                "[{}] script A found {what} ({needle}): ...{}...",
                who.name(),
                truncate(&answer[from..], 700)
            );
        }
    }

    // Tampering with /run/script fails, for its own file and for B's.
    let t = s.put_script("tamper.py", TAMPER_PY);
    let v = s.run_ok(pool, &json!({"other": db}).to_string(), &t);
    let r = v["result"].as_object().expect("an object").clone();
    assert!(r.len() >= 20, "{v}");
    for (k, got) in &r {
        // /run/script is a read-only mount inside (the launcher writes through a mount of
        // its own): nothing may list, write, create, remove or change a script, nor change
        // a mode or a time, rootless (whose one id owns the files) or not. B's script is
        // not there at all once B has ended (ENOENT where the path is looked up first).
        let gone_ok = k.starts_with("other_") && got == "ENOENT";
        assert!(
            gone_ok || ["EPERM", "EACCES", "EROFS"].contains(&got.as_str().unwrap_or("")),
            "[{}] {k}: expected EPERM, EACCES or EROFS, got {got}\nall: {v}",
            who.name()
        );
    }
    // The scripts are intact, in the sandbox and in the store.
    let v = s.run_ok(pool, &json!({"token": "t", "secs": 0}).to_string(), &db);
    assert_eq!(v["result"]["marker"], "secret-script", "{v}");
    let v = s.run_ok(pool, &json!({"other": dc}).to_string(), &t);
    assert!(v["result"].is_object(), "{v}");
    assert_eq!(
        fs::read(s.st.join("scripts").join(&db)).expect("read"),
        SECRET_PY.as_bytes()
    );
    assert_eq!(
        fs::read(s.st.join("scripts").join(&t)).expect("read"),
        TAMPER_PY.as_bytes()
    );
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Refusals (rootful).

/// A pool called without a script, a function called with one, an unknown digest, a
/// malformed digest, both flags at once, and a script file that does not exist: each is
/// refused before anything runs, with a message that says what to do.
#[test]
fn refusals() {
    let Some(mut s) = SUITE.root("refuse") else {
        return;
    };
    let n = s.up(&[
        ("py", PY_POOL),
        ("sh", SH_POOL),
        ("fn", "agent = \"python\"\nentry = \"fn/handlers.py:hello\""),
    ]);
    let (py, sh, func) = (&n[0], &n[1], &n[2]);
    assert_eq!(s.info(func)["kind"], "function");
    let d = s.put_script("echo.py", ECHO_PY);
    let file = s.file("echo2.py", ECHO_PY.as_bytes());

    // A pool without a script: bad_request naming the pool and both flags.
    for pool in [py, sh] {
        let (v, f) = s.exec(pool, Some("{}"), &[]);
        let e = s.assert_refused(&v, &f, "bad_request");
        assert!(
            e.contains(pool.as_str())
                && e.contains("--script FILE")
                && e.contains("--digest SHA256"),
            "{v}"
        );
    }

    // A function with its own handler, called with a script (either way): bad_request.
    for flags in [["--script", file.as_str()], ["--digest", d.as_str()]] {
        let (v, f) = s.exec(func, Some("{}"), &flags);
        let e = s.assert_refused(&v, &f, "bad_request");
        assert!(
            e.contains(func.as_str()) && e.contains("own handler"),
            "{flags:?}: {v}"
        );
    }
    // ... and without, it answers.
    let (v, f) = s.exec(func, Some(r#"{"k":1}"#), &[]);
    s.assert_ok(&v, &f, "the function");
    assert_eq!(v["result"], json!({"echo": {"k": 1}}), "{v}");

    // An unknown digest: not_found, naming it.
    let unknown = sha256_hex(format!("never stored {}", unique()).as_bytes());
    let (v, f) = s.exec(py, None, &["--digest", &unknown]);
    let e = s.assert_refused(&v, &f, "not_found");
    assert!(e.contains(&unknown), "{v}");

    // Malformed digests: bad_request.
    let long = format!("{d}0");
    let not_hex = "g".repeat(64);
    let with_path = format!("../{}", &d[3..]);
    for bad in ["abc", &d[..63], &long, &not_hex, &with_path, ""] {
        let (v, f) = s.exec(py, None, &["--digest", bad]);
        let e = s.assert_refused(&v, &f, "bad_request");
        assert!(e.contains("64") && e.contains("hex"), "{bad:?}: {v}");
    }

    // Both flags, or a missing file: the CLI's usage error (exit 2), nothing sent.
    let f = s.run(&["exec", py, "--script", &file, "--digest", &d]);
    assert_eq!(f.code, 2, "both flags: {}", f.stderr_text());
    assert!(f.stderr_text().contains("not both"), "{}", f.stderr_text());
    let f = s.run(&["exec", py, "--script", "/nonexistent/zygo-no-such.py"]);
    assert_eq!(f.code, 2, "a missing script: {}", f.stderr_text());

    // Refusals cost the pool nothing.
    let v = s.run_ok(py, "{}", &d);
    assert_eq!(v["result"]["event"], json!({}), "{v}");
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Usage events (rootful).

/// Every pool call writes a usage line whose `function` is the pool's name, whose
/// `script` is `sha256:` and the digest of the script the call ran, and whose times are the
/// answer's, in fractional milliseconds.
#[test]
fn usage_log_names_the_pool() {
    let Some(mut s) = SUITE.root("usage") else {
        return;
    };
    let n = s.up(&[("py", PY_POOL), ("sh", SH_POOL)]);
    let (py, sh) = (&n[0], &n[1]);
    let ok = s.put_script("echo.py", ECHO_PY);
    let raises = s.put_script(
        "raises.py",
        "def handler(event):\n    raise RuntimeError('x')\n",
    );
    let shd = s.put_script("ok.sh", "exit 0\n");
    let mut answers = Vec::new();
    for (pool, digest) in [(py, &ok), (py, &raises), (sh, &shd)] {
        let (v, _) = s.exec(pool, None, &["--digest", digest]);
        assert!(v["request_id"].is_string(), "{v}");
        answers.push((pool.clone(), digest.clone(), v));
    }
    let usage = fs::read_to_string(s.st.join("usage.log")).expect("read usage.log");
    let lines: Vec<Value> = usage
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("usage line ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), answers.len(), "one line per call: {usage}");
    for ((pool, digest, ans), line) in answers.iter().zip(&lines) {
        assert_eq!(&line["function"], pool, "{line}");
        assert_eq!(line["tenant"], "_host", "{line}");
        assert_eq!(line["request_id"], ans["request_id"], "{line} vs {ans}");
        assert_eq!(line["outcome"], ans["outcome"], "{line} vs {ans}");
        // The script as the user's document shows it: `sha256:` and the digest.
        assert_eq!(
            text(line, "script"),
            format!("sha256:{digest}"),
            "the script's digest: {line}"
        );
        // Times in fractional milliseconds, the answer's own; a fast call's is not 0.
        assert_eq!(
            line["wall_ms"], ans["metrics"]["wall_ms"],
            "{line} vs {ans}"
        );
        assert_eq!(line["cpu_ms"], ans["metrics"]["cpu_ms"], "{line} vs {ans}");
        assert!(line["wall_ms"].as_f64() > Some(0.0), "{line}");
    }
    let outcomes: Vec<&str> = lines.iter().map(|l| text(l, "outcome")).collect();
    assert_eq!(outcomes, ["ok", "error", "ok"]);
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Stored scripts are bytes, and isolation that must survive exec.

both_tests! {
    /// A script stored with `zygo scripts put` is bytes: a warm-exec script with one Latin-1
    /// byte (in a comment) runs the same by `--script FILE` and by `--digest`.
    fn non_utf8_script_by_digest(who) {
        let mut s = SUITE.sup(who, "latin1");
        let n = s.up(&[("sh", SH_POOL)]);
        let sh = &n[0];
        let bytes: &[u8] = b"# caf\xe9\necho ok\n";
        let file = s.file("latin1.sh", bytes);
        let (v, f) = s.exec(sh, None, &["--script", &file]);
        s.assert_ok(&v, &f, "--script");
        let d = s.put(&file);
        assert_eq!(d, sha256_hex(bytes));
        let v = s.run_ok(sh, "{}", &d);
        assert_eq!(v["stdout"], "ok\n", "{v}");
        s.shutdown();
    }
}

/// Warm-exec runs `CMD... /run/script/<digest>`, an exec'd (so dumpable) process whose
/// command line names its script: another request in flight in the same sandbox
/// (max_warm = 1) finds neither its /proc/<pid>/cmdline nor its descriptors.
fn warm_exec_hides_neighbour_digest(who: Who) {
    let mut s = SUITE.sup(who, "exec-leak");
    let n = s.up(&[("sh", &format!("{SH_POOL}\nmax_warm = 1"))]);
    let sh = &n[0];
    let db = s.put_script("b.sh", "sleep 2\n");
    let da = s.put_script(
        "a.sh",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; \
         ls -l $p/fd 2>/dev/null; done; exit 0\n",
    );
    let b = s.exec_in_flight(sh, "{}", &["--digest", &db]);
    std::thread::sleep(Duration::from_millis(300));
    let v = s.run_ok(sh, "{}", &da);
    let out = text(&v, "stdout");
    assert!(out.contains(&da), "the scan sees its own command line: {v}");
    assert!(
        !out.contains(&db),
        "[{}] script A learnt B's digest:\n{out}",
        who.name()
    );
    let bf = b.join().expect("the B thread");
    s.assert_ok(&bf.last_json(), &bf, "script B");
    s.shutdown();
}

/// A request's process that execs a program (a Python script's subprocess, and every
/// warm-exec command) is dumpable again; still, another request in flight in the same
/// sandbox cannot follow its /proc/<pid>/cwd into its /work directory.
fn exec_child_work_hidden(who: Who) {
    let mut s = SUITE.sup(who, "exec-work");
    let n = s.up(&[
        ("py", &format!("{PY_POOL}\nmax_warm = 1")),
        ("sh", &format!("{SH_POOL}\nmax_warm = 1")),
    ]);
    let (py, sh) = (&n[0], &n[1]);
    let snoop = s.put_script("a.py", SNOOP_PY);
    let bpy = s.put_script(
        "b.py",
        "import subprocess\ndef handler(event):\n    \
         open('secret.txt', 'w').write(event['token'])\n    \
         subprocess.run(['sleep', '2'])\n",
    );
    let bsh = s.put_script(
        "b.sh",
        "sed -n 's/.*\"token\": \"\\([^\"]*\\)\".*/\\1/p' > secret.txt; sleep 2\n",
    );
    let ash = s.put_script(
        "a.sh",
        "cat /proc/[0-9]*/cwd/secret.txt 2>/dev/null; exit 0\n",
    );
    for (pool, b, a) in [(py, &bpy, &snoop), (sh, &bsh, &ash)] {
        let token = format!("token-{:x}", unique());
        let bg = s.exec_in_flight(pool, &json!({"token": token}).to_string(), &["--digest", b]);
        std::thread::sleep(Duration::from_millis(500));
        let v = s.run_ok(pool, "{}", a);
        let bf = bg.join().expect("the B thread");
        s.assert_ok(&bf.last_json(), &bf, "script B");
        assert!(
            !v.to_string().contains(&token),
            "[{}] {pool}: script A read B's secret from B's /work: {}",
            who.name(),
            truncate(&v.to_string(), 1500)
        );
    }
    s.shutdown();
}
