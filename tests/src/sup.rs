//! A supervisor of a test's own: `zygo up -f <tmp>/sandbox.toml` with its own runtime and
//! state directories, the CLI commands that talk to it, and at the end a drain that must
//! leave no cgroup (`…/zygo/tenants/_host/<fn>`) and no process (launcher, agent, request)
//! behind.
//!
//! A test file describes its supervisors once, in a [`Suite`] (the handlers, the
//! `[defaults]`, what `zygo up` must have started), and each test makes one with
//! [`Suite::sup`]. Function names carry the suite's prefix, the test's name, who runs it
//! and a unique suffix, so the tests can run in parallel with each other and with other
//! runs of the suite.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{
    alive, am_root, contains, finish, host_pids_with, memory_cgroup, pids_holding, ppid, root_only,
    rootless_setup, unique, wait_for, wait_for_quietly, zygo, zygo_cgroup_roots, Finished, TempDir,
    Who,
};

/// How long a drained supervisor may take to remove its socket.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// What the supervisors of one test file share.
pub struct Suite {
    /// Put before the test's name in every function name.
    pub prefix: &'static str,
    /// The text of `<dir>/fn/handlers.py`.
    pub handlers: &'static str,
    /// The lines of `[defaults]` in every `sandbox.toml`.
    pub defaults: &'static str,
    /// Whether `zygo up` must also have started, for every function it serves, a zygote
    /// with a launcher holding the log and a Python agent ([`agent_pids`]).
    pub agents: bool,
}

impl Suite {
    /// A supervisor for `test`, not started yet: fresh directories (runtime 0700, state
    /// 0700, owned by whoever runs zygo) and the suite's handlers in `<dir>/fn/`.
    pub fn sup(&'static self, who: Who, test: &str) -> Sup {
        let dir = TempDir::new(0o755);
        let rt = dir.path.join("rt");
        let st = dir.path.join("st");
        for d in [&rt, &st] {
            fs::create_dir(d).expect("create a supervisor directory");
            fs::set_permissions(d, fs::Permissions::from_mode(0o700)).expect("chmod 0700");
        }
        let fndir = dir.path.join("fn");
        fs::create_dir(&fndir).expect("create fn/");
        fs::set_permissions(&fndir, fs::Permissions::from_mode(0o755)).expect("chmod fn/");
        let h = fndir.join("handlers.py");
        fs::write(&h, self.handlers).expect("write handlers.py");
        fs::set_permissions(&h, fs::Permissions::from_mode(0o644)).expect("chmod handlers");
        if who == Who::Rootless && am_root() {
            let r = rootless_setup();
            for d in [&rt, &st] {
                std::os::unix::fs::chown(d, Some(r.uid), Some(r.gid)).expect("chown");
            }
        }
        let w = match who {
            Who::Root => "r",
            Who::Rootless => "u",
        };
        Sup {
            suite: self,
            who,
            tag: format!("{}{test}-{w}", self.prefix),
            uniq: format!("{:012x}", unique() & 0xffff_ffff_ffff),
            dir,
            rt,
            st,
            env: Vec::new(),
            names: Vec::new(),
            supervisor: None,
            closed: false,
        }
    }

    /// A supervisor run by root, for a test that only runs as root; None (the test is
    /// [`skip`](crate::skip)ped, and must return) when the tests do not run as root.
    #[track_caller]
    pub fn root(&'static self, test: &str) -> Option<Sup> {
        root_only().then(|| self.sup(Who::Root, test))
    }
}

/// One `[fn.NAME]` table of a `sandbox.toml`.
pub trait FnTable {
    /// What follows the test's name in the function's name.
    fn suffix(&self) -> &str;
    /// The table's lines.
    fn body(&self) -> String;
}

/// (suffix, lines): the table's lines as they are (a pool: `agent = "python"` and no
/// entry, or `cmd = [...]`).
impl<S: AsRef<str>> FnTable for (&str, S) {
    fn suffix(&self) -> &str {
        self.0
    }

    fn body(&self) -> String {
        self.1.as_ref().to_string()
    }
}

/// (suffix, handler, extra lines): a Python function whose entry is
/// `fn/handlers.py:<handler>`, unless the extra lines name an agent or an entry of their
/// own.
impl FnTable for (&str, &str, &str) {
    fn suffix(&self) -> &str {
        self.0
    }

    fn body(&self) -> String {
        let (_, func, extra) = self;
        let mut text = String::new();
        if !extra.contains("agent =") {
            text.push_str("agent = \"python\"\n");
        }
        if !extra.contains("entry") {
            text.push_str(&format!("entry = \"fn/handlers.py:{func}\"\n"));
        }
        text.push_str(extra);
        text
    }
}

/// A supervisor of this test's own, with its directories and functions. Dropped without
/// [`Sup::shutdown`] (a test that failed half-way), it stops the supervisor and whatever
/// it started, and removes its cgroups.
pub struct Sup {
    suite: &'static Suite,
    pub who: Who,
    tag: String,
    uniq: String,
    pub dir: TempDir,
    /// `ZYGO_RUNTIME_DIR`.
    pub rt: PathBuf,
    /// `ZYGO_STATE_DIR`.
    pub st: PathBuf,
    env: Vec<(String, String)>,
    names: Vec<String>,
    /// The supervisor's pid, once found ([`Sup::find_supervisor`]).
    pub supervisor: Option<i32>,
    closed: bool,
}

impl Sup {
    /// Pass `key=value` to every zygo command (and so, through `zygo up`, to the
    /// supervisor).
    pub fn env(&mut self, key: &str, value: &str) -> &mut Sup {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// The full name of one of this test's functions.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}-{}", self.tag, self.uniq)
    }

    /// A file in the functions' folder `<dir>/fn/` (mode 0644).
    pub fn fn_file(&self, name: &str, text: &str) {
        let p = self.dir.path.join("fn").join(name);
        fs::write(&p, text).expect("write a handler file");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod");
    }

    /// A file in this test's directory (mode 0644, readable by the rootless user): its path.
    pub fn file(&self, name: &str, bytes: &[u8]) -> String {
        let p = self.dir.file(name, bytes);
        p.to_str().expect("UTF-8 path").to_string()
    }

    /// Write `sandbox.toml` with these functions under the suite's defaults; return its
    /// path and the functions' full names.
    pub fn write_toml<T: FnTable>(&mut self, fns: &[T]) -> (PathBuf, Vec<String>) {
        let mut text = format!("[defaults]\n{}", self.suite.defaults);
        let mut names = Vec::new();
        for f in fns {
            let name = self.name(f.suffix());
            text.push_str(&format!("\n[fn.{name}]\n{}\n", f.body()));
            self.names.push(name.clone());
            names.push(name);
        }
        let p = self.dir.file("sandbox.toml", text.as_bytes());
        (p, names)
    }

    /// `zygo up -f sandbox.toml` with these functions; it must succeed, and every function
    /// must have its cgroup (and, in a suite with `agents`, its launcher and agent).
    /// Returns the full names.
    pub fn up<T: FnTable>(&mut self, fns: &[T]) -> Vec<String> {
        let (file, names) = self.write_toml(fns);
        let f = self.run(&["up", "-f", file.to_str().expect("UTF-8 path")]);
        self.find_supervisor();
        assert_eq!(
            f.code,
            0,
            "[{}] zygo up failed: {}\nstdout: {}\n{}",
            self.who.name(),
            f.stderr_text(),
            f.stdout_text(),
            self.log()
        );
        // The checks at the end look in the right places: the supervisor (and its
        // launchers) hold our log, and every function served has its cgroup (and agent)
        // where they look.
        assert!(
            self.supervisor.is_some(),
            "no process holds {}",
            self.log_path().display()
        );
        if self.suite.agents {
            assert!(
                pids_holding(&self.log_path())
                    .iter()
                    .any(|(_, cmd)| contains(cmd, b"__launcher")),
                "no launcher holds {}",
                self.log_path().display()
            );
        }
        for n in &names {
            assert!(
                fn_cgroups(n).iter().any(|d| d.is_dir()),
                "[{}] no cgroup of {n} under {:?}",
                self.who.name(),
                zygo_cgroup_roots()
            );
            if self.suite.agents {
                assert!(
                    !agent_pids(n).is_empty(),
                    "[{}] no agent of {n} found",
                    self.who.name()
                );
            }
        }
        names
    }

    /// A zygo command with this supervisor's directories and environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = zygo(self.who);
        c.env("ZYGO_RUNTIME_DIR", &self.rt)
            .env("ZYGO_STATE_DIR", &self.st);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Finished {
        finish(self.cmd(args))
    }

    /// `zygo exec NAME [EVENT] FLAGS... --json`: the answer (the last line) and the rest.
    pub fn exec(&self, name: &str, event: Option<&str>, flags: &[&str]) -> (Value, Finished) {
        let f = finish(self.exec_cmd(name, event, flags));
        (f.last_json(), f)
    }

    pub fn exec_cmd(&self, name: &str, event: Option<&str>, flags: &[&str]) -> Command {
        let mut args = vec!["exec", name];
        args.extend(event);
        args.extend_from_slice(flags);
        args.push("--json");
        self.cmd(&args)
    }

    /// The same, in the background.
    pub fn exec_bg(&self, name: &str, event: &str, flags: &[&str]) -> JoinHandle<Finished> {
        let cmd = self.exec_cmd(name, Some(event), flags);
        std::thread::spawn(move || finish(cmd))
    }

    /// The same, in the background, once `zygo ls` counts it in flight (for a function
    /// with no other call in flight).
    pub fn exec_in_flight(&self, name: &str, event: &str, flags: &[&str]) -> JoinHandle<Finished> {
        let call = self.exec_bg(name, event, flags);
        self.wait_in_flight(name, 1);
        call
    }

    /// `zygo exec NAME EVENT --json`, which must return: its result.
    #[track_caller]
    pub fn call_ok(&self, name: &str, event: &str) -> Value {
        let (v, f) = self.exec(name, Some(event), &[]);
        self.assert_ok(&v, &f, &format!("{name} {event}"));
        v["result"].clone()
    }

    /// `zygo exec POOL EVENT --digest D --json`, which must return: the whole answer.
    #[track_caller]
    pub fn run_ok(&self, pool: &str, event: &str, digest: &str) -> Value {
        let (v, f) = self.exec(pool, Some(event), &["--digest", digest]);
        self.assert_ok(&v, &f, &format!("{pool} --digest {digest} {event}"));
        v
    }

    /// An exec answer that returned: exit 0, outcome ok.
    #[track_caller]
    pub fn assert_ok(&self, v: &Value, f: &Finished, what: &str) {
        assert!(
            f.code == 0 && v["outcome"] == "ok",
            "[{}] {what}: expected ok, got exit {}: {v}\nstderr: {}\n{}",
            self.who.name(),
            f.code,
            f.stderr_text(),
            self.log()
        );
    }

    /// An exec answer that failed the way expected: exit 1, this outcome and code.
    #[track_caller]
    pub fn assert_failed(&self, v: &Value, f: &Finished, outcome: &str, code: &str) {
        assert!(
            f.code == 1 && v["outcome"] == outcome && v["code"] == code,
            "[{}] expected outcome {outcome} (code {code}, exit 1), got exit {}: {v}\nstderr: {}\n{}",
            self.who.name(),
            f.code,
            f.stderr_text(),
            self.log()
        );
    }

    /// A handler error (exit 1, outcome error, code handler): the error message.
    #[track_caller]
    pub fn assert_handler_error(&self, v: &Value, f: &Finished) -> String {
        self.assert_failed(v, f, "error", "handler");
        v["error"].as_str().unwrap_or("").to_string()
    }

    /// A refusal before anything ran: exit 1 and `{"code": code, "error": ...}` with no
    /// outcome; the error.
    #[track_caller]
    pub fn assert_refused(&self, v: &Value, f: &Finished, code: &str) -> String {
        let error = v["error"].as_str().unwrap_or("");
        assert!(
            f.code == 1 && v["code"] == code && !error.is_empty() && v.get("outcome").is_none(),
            "[{}] expected a {code} refusal (exit 1), got exit {}: {v}\nstderr: {}\n{}",
            self.who.name(),
            f.code,
            f.stderr_text(),
            self.log()
        );
        error.to_string()
    }

    /// `zygo scripts put FILE`, which must succeed: the digest it printed.
    #[track_caller]
    pub fn put(&self, file: &str) -> String {
        let f = self.run(&["scripts", "put", file]);
        assert_eq!(
            f.code,
            0,
            "[{}] zygo scripts put {file}: {}\n{}",
            self.who.name(),
            f.stderr_text(),
            self.log()
        );
        f.stdout_text().trim().to_string()
    }

    /// Write a script and register it: its digest.
    #[track_caller]
    pub fn put_script(&self, name: &str, source: &str) -> String {
        let file = self.file(name, source.as_bytes());
        self.put(&file)
    }

    /// The files of the script store (every entry, temporary ones included).
    pub fn store(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.st.join("scripts"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// `zygo ls --json`.
    pub fn ls(&self) -> Vec<Value> {
        let f = self.run(&["ls", "--json"]);
        assert_eq!(f.code, 0, "zygo ls: {}", f.stderr_text());
        match serde_json::from_slice(&f.stdout) {
            Ok(Value::Array(a)) => a,
            other => panic!("zygo ls --json: not an array: {other:?}"),
        }
    }

    /// One function's line of `zygo ls --json` (Null when it is not listed).
    pub fn info(&self, name: &str) -> Value {
        self.ls()
            .into_iter()
            .find(|f| f["name"] == name)
            .unwrap_or(Value::Null)
    }

    /// Wait until `zygo ls` counts `n` requests in flight for `name`.
    pub fn wait_in_flight(&self, name: &str, n: u64) {
        wait_for(Duration::from_secs(10), &format!("{n} in flight"), || {
            self.info(name)["in_flight"].as_u64() >= Some(n)
        });
    }

    /// The end of the supervisor's log, for failure messages.
    pub fn log(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let start = text.len().saturating_sub(3000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        format!("--- supervisor.log (end) ---\n{}", &text[start..])
    }

    pub fn log_path(&self) -> PathBuf {
        self.st.join("supervisor.log")
    }

    pub fn socket(&self) -> PathBuf {
        self.rt.join("zygo.sock")
    }

    /// Kill the supervisor with SIGKILL and wait until it is gone, which is when its
    /// socket refuses connections: its leader may show as a zombie while another of its
    /// threads, still exiting, holds the listening socket (a client connecting then is
    /// reset). Returns the dead supervisor's pid.
    pub fn kill_supervisor(&mut self) -> i32 {
        let pid = self.supervisor.take().expect("the supervisor's pid");
        // SAFETY: killing the supervisor this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let socket = self.socket();
        wait_for(
            Duration::from_secs(10),
            "the killed supervisor to be gone",
            || !alive(pid) && std::os::unix::net::UnixStream::connect(&socket).is_err(),
        );
        pid
    }

    /// Remember the supervisor's pid: the process whose stderr is our log.
    pub fn find_supervisor(&mut self) {
        if self.supervisor.is_some() {
            return;
        }
        self.supervisor = supervisor_pid(&self.log_path());
    }

    /// Wait for the supervisor to exit (its socket removed, its process gone), then check
    /// that nothing of it is left.
    pub fn wait_gone(&mut self) {
        let t0 = Instant::now();
        while self.socket().exists() {
            assert!(
                t0.elapsed() < EXIT_WAIT,
                "[{}] the supervisor did not remove its socket within {}s\n{}",
                self.who.name(),
                EXIT_WAIT.as_secs(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(pid) = self.supervisor {
            wait_for(Duration::from_secs(10), "the supervisor to exit", || {
                !alive(pid)
            });
        }
        self.closed = true;
        self.assert_clean();
    }

    /// `zygo drain --grace 1s`, then [`Sup::wait_gone`].
    pub fn shutdown(mut self) {
        let f = self.run(&["drain", "--grace", "1s"]);
        assert_eq!(
            f.code,
            0,
            "[{}] zygo drain: {}\n{}",
            self.who.name(),
            f.stderr_text(),
            self.log()
        );
        self.wait_gone();
    }

    /// A supervisor that was never started: nothing to stop, nothing to check.
    pub fn never_started(mut self) {
        self.closed = true;
    }

    /// No cgroup of this test's functions and no process of its supervisor remain.
    pub fn assert_clean(&self) {
        let mut left = Vec::new();
        wait_for_quietly(Duration::from_secs(3), || {
            left = self.leftover_cgroups();
            left.is_empty()
        });
        assert!(
            left.is_empty(),
            "[{}] cgroups left behind: {left:?}\n{}",
            self.who.name(),
            self.log()
        );
        let mut procs = Vec::new();
        wait_for_quietly(Duration::from_secs(3), || {
            procs = pids_holding(&self.log_path());
            procs.is_empty()
        });
        let described: Vec<String> = procs
            .iter()
            .map(|(pid, cmd)| format!("{pid}: {}", String::from_utf8_lossy(cmd)))
            .collect();
        assert!(
            described.is_empty(),
            "[{}] processes of this supervisor left behind (launchers, agents): {described:?}",
            self.who.name()
        );
    }

    /// The cgroups of this test's functions that exist.
    pub fn leftover_cgroups(&self) -> Vec<PathBuf> {
        self.names
            .iter()
            .flat_map(|n| fn_cgroups(n))
            .filter(|d| d.exists())
            .collect()
    }
}

impl Drop for Sup {
    /// A test that failed half-way: stop its supervisor and whatever it started (by pid),
    /// and remove its cgroups, without panicking again.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let mut c = self.cmd(&["drain", "--grace", "0s"]);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        if let Ok(mut child) = c.spawn() {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_for_quietly(Duration::from_secs(5), || !self.socket().exists());
        for (pid, _) in pids_holding(&self.log_path()) {
            // SAFETY: killing a process this test's supervisor started (it holds our log).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(200));
        for d in self.leftover_cgroups() {
            remove_cgroup_tree(&d);
        }
    }
}

/// The supervisor whose stderr is `log` (`$ZYGO_STATE_DIR/supervisor.log`): the process
/// holding it that runs `zygo supervisor`.
pub fn supervisor_pid(log: &Path) -> Option<i32> {
    pids_holding(log)
        .into_iter()
        .find(|(_, cmd)| cmd.split(|b| *b == 0).nth(1) == Some(b"supervisor"))
        .map(|(pid, _)| pid)
}

/// rmdir a cgroup and its children, deepest first (best effort).
pub fn remove_cgroup_tree(d: &Path) {
    if let Ok(entries) = fs::read_dir(d) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(d);
}

/// A function's cgroup in every hierarchy Zygo uses, root's and rootless:
/// `<root>/tenants/_host/<name>`, whether it exists or not.
pub fn fn_cgroups(name: &str) -> Vec<PathBuf> {
    zygo_cgroup_roots()
        .into_iter()
        .map(|r| r.join("tenants/_host").join(name))
        .collect()
}

/// The cgroups inside a function's (its zygotes' `z-…`, its requests' `r-…`) whose names
/// start with `prefix`, in every hierarchy.
pub fn fn_subgroups(name: &str, prefix: &str) -> Vec<PathBuf> {
    fn_cgroups(name)
        .iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect()
}

/// The python agents of a function's zygotes: python3 running the agent, in one of its
/// zygote cgroups (`…/tenants/_host/<fn>/z-…`), whose parent is not itself an agent (a
/// child just forked to park is in the zygote's cgroup until it is given its own).
pub fn agent_pids(name: &str) -> Vec<i32> {
    let needle = format!("/tenants/_host/{name}/z-");
    let agent = b"/run/zygo/python_agent.py";
    host_pids_with(agent)
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/usr/bin/python3\0"))
                && memory_cgroup(*pid).contains(&needle)
                && ppid(*pid).is_some_and(|pp| {
                    !fs::read(format!("/proc/{pp}/cmdline")).is_ok_and(|c| contains(&c, agent))
                })
        })
        .collect()
}
