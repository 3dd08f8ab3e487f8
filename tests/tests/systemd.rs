//! The supervisor as a systemd service, with the units Zygo ships (`contrib/`): it starts
//! as a `Type=notify` service and says when it serves, calls go through it, `systemctl
//! stop` drains (a running call finishes) inside `TimeoutStopSec`, `systemctl restart`
//! keeps what it acknowledged (stored scripts, the usage log), the journal has one entry
//! per event, and `systemd-analyze verify` accepts every unit.
//!
//! These install units and start services, so they need systemd as pid 1 on a machine of
//! their own: they are `#[ignore]`d, and run in the Debian 12 guest (`scripts/guest/run`,
//! `scripts/test --guest`), where systemd is pid 1 on cgroup v2.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use zygo_tests::*;

const UNIT: &str = "zygo.service";

/// The shipped unit files.
fn contrib(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("contrib")
        .join(name)
}

/// Run a command to its end; its exit code, stdout and stderr (a guard kills it after a
/// while, stretched by `$ZYGO_TEST_SLOWDOWN`).
fn sh(program: &str, args: &[&str]) -> Finished {
    let mut c = Command::new(program);
    c.args(args).stdin(Stdio::null());
    finish(c)
}

#[track_caller]
fn ok(program: &str, args: &[&str]) -> String {
    let f = sh(program, args);
    assert_eq!(
        f.code,
        0,
        "{program} {args:?}: exit {}\nstdout: {}\nstderr: {}",
        f.code,
        f.stdout_text(),
        f.stderr_text()
    );
    f.stdout_text()
}

/// `systemctl show zygo.service -p KEY --value`.
fn show(key: &str) -> String {
    ok("systemctl", &["show", UNIT, "-p", key, "--value"])
        .trim()
        .to_string()
}

fn journal() -> String {
    ok("journalctl", &["-u", UNIT, "-o", "cat", "--no-pager"])
}

/// Systemd must be pid 1 here: an ignored test that is asked to run must not pass by
/// doing nothing.
fn require_systemd() {
    assert!(
        Path::new("/run/systemd/system").is_dir(),
        "systemd is not the init system here; these tests run in the guest (scripts/guest/run)"
    );
    assert!(
        am_root(),
        "these tests install system units: run them as root"
    );
}

/// A `zygo` command as root, talking to the service's socket (`/run/zygo/zygo.sock`, the
/// root default).
fn zygo_cli(args: &[&str]) -> Finished {
    let mut c = zygo(Who::Root);
    c.env_remove("ZYGO_CGROUP").args(args);
    finish(c)
}

#[track_caller]
fn zygo_ok(args: &[&str]) -> Value {
    let f = zygo_cli(args);
    assert_eq!(
        f.code,
        0,
        "zygo {args:?}: exit {}\nstdout: {}\nstderr: {}\njournal:\n{}",
        f.code,
        f.stdout_text(),
        f.stderr_text(),
        journal()
    );
    serde_json::from_str(f.stdout_text().trim()).unwrap_or(Value::Null)
}

/// Install the binary where the unit runs it, and the system unit.
fn install() {
    let bin = Path::new("/usr/local/bin/zygo");
    copy_binary(&zygo_bin(), bin.parent().expect("a folder"), "zygo");
    fs::copy(contrib(UNIT), Path::new("/etc/systemd/system").join(UNIT)).expect("install the unit");
    ok("systemctl", &["daemon-reload"]);
    // A run of this test that failed half-way may have left it running.
    let _ = sh("systemctl", &["stop", UNIT]);
    let _ = sh("systemctl", &["reset-failed", UNIT]);
}

/// The functions the service serves: a Python handler, and a runtime pool.
fn sandbox_toml(dir: &TempDir) -> PathBuf {
    let fndir = dir.path.join("fn");
    fs::create_dir(&fndir).expect("mkdir fn");
    fs::write(
        fndir.join("handlers.py"),
        include_str!("../functions/handlers.py"),
    )
    .expect("write handlers.py");
    dir.file(
        "sandbox.toml",
        b"[defaults]\ntimeout = \"20s\"\nmem = \"64M\"\n\n\
          [fn.sd-nap]\nagent = \"python\"\nentry = \"fn/handlers.py:nap\"\n\n\
          [fn.sd-pool]\nagent = \"python\"\n",
    )
}

#[test]
#[ignore = "installs and starts a systemd service: run in the guest (scripts/guest/run)"]
fn units_verify() {
    require_systemd();
    // The binary must be where each unit runs it for `verify` to accept it.
    copy_binary(&zygo_bin(), Path::new("/usr/local/bin"), "zygo");
    let dir = TempDir::new(0o755);
    let sys = dir.path.join("zygo.service");
    fs::copy(contrib("zygo.service"), &sys).expect("copy the unit");
    let out = sh("systemd-analyze", &["verify", sys.to_str().expect("UTF-8")]);
    assert!(
        out.code == 0 && out.stderr_text().trim().is_empty(),
        "systemd-analyze verify zygo.service: {}{}",
        out.stdout_text(),
        out.stderr_text()
    );
    // The user unit, as the user manager of root would read it (%h is /root).
    copy_binary(&zygo_bin(), Path::new("/root/.local/bin"), "zygo");
    let user = dir.path.join("zygo-user.service");
    fs::copy(contrib("zygo-user.service"), &user).expect("copy the user unit");
    // A user manager's lookup paths need a runtime directory.
    let mut c = Command::new("systemd-analyze");
    c.args(["--user", "verify", user.to_str().expect("UTF-8")])
        .env("XDG_RUNTIME_DIR", &dir.path)
        .stdin(Stdio::null());
    let out = finish(c);
    let _ = fs::remove_file("/root/.local/bin/zygo");
    assert!(
        out.code == 0 && out.stderr_text().trim().is_empty(),
        "systemd-analyze --user verify zygo-user.service: {}{}",
        out.stdout_text(),
        out.stderr_text()
    );
}

#[test]
#[ignore = "installs and starts a systemd service: run in the guest (scripts/guest/run)"]
fn service_serves_drains_and_keeps_state() {
    require_systemd();
    install();

    // Type=notify: `systemctl start` returns once the supervisor said READY=1.
    ok("systemctl", &["start", UNIT]);
    assert_eq!(show("ActiveState"), "active");
    let status = show("StatusText");
    assert!(
        status.starts_with("serving on /run/zygo/zygo.sock"),
        "StatusText: {status:?}"
    );
    // Zygo's tree is in the unit's own (delegated) cgroup, its monitor in a leaf of it.
    let cg = show("ControlGroup");
    let unit_dir = PathBuf::from(format!("/sys/fs/cgroup{cg}"));
    assert!(
        status.contains(&format!("{}/zygo", unit_dir.display())),
        "not under the unit's cgroup {}: {status:?}",
        unit_dir.display()
    );
    let main_pid: i32 = show("MainPID").parse().expect("a MainPID");
    assert_eq!(
        memory_cgroup(main_pid),
        format!("{cg}/zygo-monitor"),
        "the supervisor is not in the leaf of its unit's cgroup"
    );

    // Calls go through the service.
    let dir = TempDir::new(0o755);
    let toml = sandbox_toml(&dir);
    let toml = toml.to_str().expect("UTF-8");
    zygo_ok(&["up", "-f", toml, "--json"]);
    let v = zygo_ok(&["exec", "sd-nap", r#"{"secs": 0}"#, "--json"]);
    assert_eq!(v["result"], serde_json::json!({"slept": 0}), "{v}");
    let script = dir.file(
        "pool.py",
        b"def handler(event):\n    return {'pool': event}\n",
    );
    let put = zygo_ok(&["scripts", "put", script.to_str().expect("UTF-8"), "--json"]);
    let digest = put["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("no digest in {put}"))
        .to_string();
    let v = zygo_ok(&["exec", "sd-pool", "1", "--digest", &digest, "--json"]);
    assert_eq!(v["result"], serde_json::json!({"pool": 1}), "{v}");
    let ids_before: Vec<String> = usage_request_ids();
    assert!(
        ids_before.len() >= 2,
        "the usage log has {} lines",
        ids_before.len()
    );

    // `systemctl restart` keeps what was acknowledged: the stored script (its digest runs
    // without sending it again once the pool is served again) and the usage log.
    ok("systemctl", &["restart", UNIT]);
    assert_eq!(show("ActiveState"), "active");
    zygo_ok(&["up", "-f", toml, "--json"]);
    let v = zygo_ok(&["exec", "sd-pool", "2", "--digest", &digest, "--json"]);
    assert_eq!(v["result"], serde_json::json!({"pool": 2}), "{v}");
    let ids_after = usage_request_ids();
    for id in &ids_before {
        assert!(
            ids_after.contains(id),
            "request {id} is gone from the usage log"
        );
    }

    // `systemctl stop` drains: a call running when it begins finishes, and the stop is
    // done well inside TimeoutStopSec (no SIGKILL: the unit's result is "success").
    let mut call = zygo(Who::Root);
    call.env_remove("ZYGO_CGROUP")
        .args(["exec", "sd-nap", r#"{"secs": 3}"#, "--json"]);
    let call = std::thread::spawn(move || finish(call));
    let t0 = std::time::Instant::now();
    while !journal_has_running_nap() && t0.elapsed() < slow(Duration::from_secs(30)) {
        std::thread::sleep(Duration::from_millis(200));
    }
    ok("systemctl", &["stop", UNIT]);
    let f = call.join().expect("the call's thread");
    assert_eq!(
        f.code,
        0,
        "the call cut off by the stop: {}",
        f.stderr_text()
    );
    let v: Value = serde_json::from_str(f.stdout_text().trim()).expect("JSON");
    assert_eq!(v["result"], serde_json::json!({"slept": 3}), "{v}");
    assert_eq!(show("ActiveState"), "inactive");
    assert_eq!(show("Result"), "success");
    assert!(!unit_dir.exists(), "{} is left", unit_dir.display());

    // The journal: one entry per event, none spread over lines.
    let j = journal();
    for want in [
        "supervisor listening on",
        "draining: no new calls",
        "drain complete",
    ] {
        assert!(j.contains(want), "no {want:?} in the journal:\n{j}");
    }
    assert!(
        !j.lines().any(|l| l.starts_with("    | ")),
        "an event over several journal entries:\n{j}"
    );

    let _ = fs::remove_file(Path::new("/etc/systemd/system").join(UNIT));
    ok("systemctl", &["daemon-reload"]);
}

/// Whether the supervisor has started the 3-second call (its zygote's agent is busy): the
/// `ls` answer shows a request in flight.
fn journal_has_running_nap() -> bool {
    let f = zygo_cli(&["ls", "--json"]);
    f.code == 0 && f.stdout_text().contains("\"in_flight\":1")
}

/// The request ids in the service's usage log.
fn usage_request_ids() -> Vec<String> {
    fs::read_to_string("/var/lib/zygo/usage.log")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["request_id"].as_str().map(str::to_string))
        .collect()
}

/// `zygo run --json` in whatever `prefix` starts it with (systemd-run and its options),
/// with a clean environment; (exit code, the JSON answer, stderr).
fn run_through(prefix: &[&str], zygo_args: &[&str], env: &[(&str, &str)]) -> (i32, Value, String) {
    let mut c = Command::new(prefix[0]);
    c.args(&prefix[1..])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(zygo_args);
    let f = finish(c);
    let out = f.stdout_text();
    let v = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null);
    (f.code, v, f.stderr_text())
}

/// The host's zygo, where every user may run it.
fn public_zygo() -> String {
    let dir = Path::new("/usr/local/lib/zygo-tests");
    copy_binary(&zygo_bin(), dir, "zygo")
        .to_str()
        .expect("UTF-8")
        .to_string()
}

#[test]
#[ignore = "starts systemd scopes and services: run in the guest (scripts/guest/run)"]
fn run_in_a_delegated_scope_and_service() {
    require_systemd();
    let zygo = public_zygo();
    // A scope: systemd-run execs zygo itself in a new cgroup with Delegate=yes; zygo
    // moves into a leaf of it and enforces the limits.
    for (what, prefix) in [
        (
            "scope",
            vec!["systemd-run", "--quiet", "--scope", "-p", "Delegate=yes"],
        ),
        (
            "service",
            vec![
                "systemd-run",
                "--quiet",
                "--wait",
                "--pipe",
                "--collect",
                "-p",
                "Delegate=yes",
            ],
        ),
    ] {
        let (code, v, err) = run_through(
            &prefix,
            &[&zygo, "run", "--json", "--", "/bin/echo", "hello"],
            &[],
        );
        assert!(
            code == 0 && v["stdout"] == "hello\n",
            "[{what}] {code} {v} {err}"
        );
        let (_, v, err) = run_through(
            &prefix,
            &[
                &zygo,
                "run",
                "--json",
                "--mem",
                "64M",
                "--",
                "/usr/bin/python3",
                "-c",
                "b = bytearray(200 << 20); print(len(b))",
            ],
            &[],
        );
        assert_eq!(v["oom_killed"], true, "[{what}] {v} {err}");
    }
}

#[test]
#[ignore = "starts a systemd service: run in the guest (scripts/guest/run)"]
fn a_service_without_delegation_is_told_how_to_fix_it() {
    require_systemd();
    let zygo = public_zygo();
    let enabled = fs::read_to_string("/sys/fs/cgroup/system.slice/cgroup.subtree_control")
        .unwrap_or_default();
    let (code, v, err) = run_through(
        &["systemd-run", "--quiet", "--wait", "--pipe", "--collect"],
        &[&zygo, "run", "--json", "--", "/bin/true"],
        &[],
    );
    if ["memory", "pids", "cpu"]
        .iter()
        .all(|c| enabled.split_whitespace().any(|x| x == *c))
    {
        // systemd enabled every controller Zygo needs for services: as root it can use
        // its service's cgroup even undelegated.
        assert_eq!(code, 0, "{v} {err}");
    } else {
        let why = v["error"].as_str().unwrap_or_default().to_string() + &err;
        assert!(
            code == 1
                && why.contains("Delegate=yes")
                && why.contains("systemd-run --scope -p Delegate=yes zygo run"),
            "the refusal does not say how to delegate: {code} {v} {err}"
        );
    }
}

#[test]
#[ignore = "starts a user's systemd: run in the guest (scripts/guest/run)"]
fn rootless_in_a_user_scope_after_the_steps_zygo_names() {
    require_systemd();
    let zygo = public_zygo();
    let r = rootless_setup();
    let uid = r.uid.to_string();
    let gid = r.gid.to_string();
    let user = ROOTLESS_USER;
    ok("loginctl", &["enable-linger", user]);
    let runtime = format!("/run/user/{uid}");
    wait_for(Duration::from_secs(60), "the user's systemd", || {
        Path::new(&format!("{runtime}/bus")).exists()
    });
    let bus = format!("unix:path={runtime}/bus");
    let env = [
        ("XDG_RUNTIME_DIR", runtime.as_str()),
        ("DBUS_SESSION_BUS_ADDRESS", bus.as_str()),
        ("USER", user),
        ("HOME", "/tmp"),
    ];
    let prefix = [
        "setpriv",
        "--reuid",
        &uid,
        "--regid",
        &gid,
        "--clear-groups",
        "--",
        "systemd-run",
        "--user",
        "--quiet",
        "--scope",
        "-p",
        "Delegate=yes",
    ];
    let dropin = Path::new("/etc/systemd/system/user@.service.d/zygo-tests-delegate.conf");
    let _ = fs::remove_file(dropin);
    let restart_user_manager = || {
        ok("systemctl", &["daemon-reload"]);
        ok("systemctl", &["restart", &format!("user@{uid}.service")]);
        wait_for(Duration::from_secs(60), "the user's systemd again", || {
            sh("systemctl", &["is-active", &format!("user@{uid}.service")]).code == 0
                && Path::new(&format!("{runtime}/bus")).exists()
        });
    };
    restart_user_manager();
    let enabled = fs::read_to_string(format!(
        "/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service/cgroup.subtree_control"
    ))
    .unwrap_or_default();
    let args = [zygo.as_str(), "run", "--json", "--", "/bin/echo", "hello"];
    if !enabled.split_whitespace().any(|c| c == "cpu") {
        // The user's systemd has not been given cpu: the refusal names the drop-in.
        let (code, v, err) = run_through(&prefix, &args, &env);
        let why = v["error"].as_str().unwrap_or_default().to_string() + &err;
        assert!(
            code == 1 && why.contains("Delegate=cpu cpuset io memory pids"),
            "the refusal does not name the user@.service drop-in: {code} {v} {err}"
        );
        fs::create_dir_all(dropin.parent().expect("a folder")).expect("mkdir the drop-in folder");
        fs::write(dropin, "[Service]\nDelegate=cpu cpuset io memory pids\n").expect("the drop-in");
        restart_user_manager();
    }
    let (code, v, err) = run_through(&prefix, &args, &env);
    let _ = fs::remove_file(dropin);
    let _ = sh("loginctl", &["disable-linger", user]);
    let _ = sh("systemctl", &["daemon-reload"]);
    assert!(code == 0 && v["stdout"] == "hello\n", "{code} {v} {err}");
}
