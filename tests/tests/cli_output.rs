//! What the CLI hands the sandbox and what it prints to the operator, end to end:
//!
//! - `zygo run --stdin PATH` gives the program a regular file or a pipe as they are; a
//!   terminal or a device only through a pipe zygo copies into, and a socket or a
//!   directory not at all. Without `--stdin`, a terminal on zygo's own stdin never reaches
//!   the program either.
//! - Text that came from a sandbox (a handler's output, progress, result, error and
//!   traceback) reaches the operator's terminal with its control characters shown as
//!   escapes in human output, and exactly, as JSON strings, with `--json`.
//! - Every `--json` answer is one JSON object on stdout, refusals included (no supervisor,
//!   usage errors).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use zygo_tests::*;

// ---------------------------------------------------------------------------------------
// Helpers.

/// A pseudo-terminal: (master, slave, the slave's path). The slave is made the rootless
/// user's when the tests run as root and `who` is rootless, so that zygo can open it.
fn open_pty(who: Who) -> (File, File, String) {
    // SAFETY: plain libc calls on descriptors we own; ptsname_r writes into `name`.
    let (master, name) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = File::from_raw_fd(m);
        assert!(
            libc::grantpt(m) == 0 && libc::unlockpt(m) == 0,
            "grantpt/unlockpt"
        );
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(
            libc::ptsname_r(m, name.as_mut_ptr(), name.len()),
            0,
            "ptsname_r"
        );
        let name = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .expect("a UTF-8 pty name")
            .to_string();
        (master, name)
    };
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&name)
        .unwrap_or_else(|e| panic!("open the pty's slave {name}: {e}"));
    if who == Who::Rootless && am_root() {
        let r = rootless_setup();
        std::os::unix::fs::chown(&name, Some(r.uid), Some(r.gid)).expect("chown the pty");
    }
    (master, slave, name)
}

/// The modes of a terminal, as tcgetattr reads them.
#[derive(Debug, PartialEq, Eq)]
struct Modes {
    iflag: libc::tcflag_t,
    oflag: libc::tcflag_t,
    cflag: libc::tcflag_t,
    lflag: libc::tcflag_t,
    cc: Vec<libc::cc_t>,
}

fn modes(tty: &File) -> Modes {
    // SAFETY: termios is plain old data; tcgetattr fills it for a descriptor we own.
    let t = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(
            libc::tcgetattr(tty.as_raw_fd(), &mut t),
            0,
            "tcgetattr: {}",
            std::io::Error::last_os_error()
        );
        t
    };
    Modes {
        iflag: t.c_iflag,
        oflag: t.c_oflag,
        cflag: t.c_cflag,
        lflag: t.c_lflag,
        cc: t.c_cc.to_vec(),
    }
}

/// Python run as the sandboxed program: what its stdin is, whether it can switch echo off
/// on it, and what it read from it: a line, or `READ` bytes (in hex), or nothing with
/// `READ=none`.
const STDIN_PROBE: &str = r#"
import errno, json, os, stat, sys, termios
r = {"isatty": os.isatty(0), "link": os.readlink("/proc/self/fd/0"),
     "fifo": stat.S_ISFIFO(os.fstat(0).st_mode)}
try:
    a = termios.tcgetattr(0)
    a[3] &= ~(termios.ECHO | termios.ICANON)
    termios.tcsetattr(0, termios.TCSANOW, a)
    r["tcsetattr"] = "OK"
except termios.error as e:
    r["tcsetattr"] = errno.errorcode.get(e.args[0], str(e.args[0]))
n = os.environ.get("READ", "line")
r["read"] = (sys.stdin.readline() if n == "line" else None if n == "none"
             else os.read(0, int(n)).hex())
print(json.dumps(r))
"#;

/// Reads a line of its stdin, then tries to change the file behind it (each attempt's
/// errno, or "OK", in its report): its mode, its times and an extended attribute through
/// the descriptor, and a truncating and a writing open through `/proc/self/fd/0`.
const STDIN_TAMPER: &str = r#"
import errno, json, os, stat, sys
r = {"fifo": stat.S_ISFIFO(os.fstat(0).st_mode), "read": sys.stdin.readline()}
def attempt(name, f):
    try:
        f()
        r[name] = "OK"
    except OSError as e:
        r[name] = errno.errorcode.get(e.errno, str(e.errno))
attempt("fchmod", lambda: os.fchmod(0, 0o777))
attempt("utime", lambda: os.utime(0, (0, 0)))
attempt("setxattr", lambda: os.setxattr(0, "user.zygo", b"x"))
attempt("reopen_trunc", lambda: os.close(os.open("/proc/self/fd/0", os.O_RDONLY | os.O_TRUNC)))
def write_again():
    fd = os.open("/proc/self/fd/0", os.O_WRONLY)
    os.write(fd, b"changed")
    os.close(fd)
attempt("reopen_write", write_again)
print(json.dumps(r))
"#;

/// `zygo run --json FLAGS -- python3 -c STDIN_PROBE`, with zygo's own stdin `stdin`: the
/// answer, the probe's report, and how the command ended.
fn stdin_probe(who: Who, flags: &[&str], stdin: Stdio) -> (Value, Value, Finished) {
    let mut c = zygo(who);
    c.args(["run", "--json"])
        .args(flags)
        .args(["--", "python3", "-c", STDIN_PROBE])
        .stdin(stdin);
    let f = finish(c);
    let v = f.last_json();
    assert!(
        v["started"] == true && v["exit_code"] == 0,
        "[{}] zygo run {flags:?}: exit {}: {v}\nstderr: {}",
        who.name(),
        f.code,
        f.stderr_text()
    );
    let report: Value = serde_json::from_str(s(&v, "stdout").trim())
        .unwrap_or_else(|e| panic!("[{}] the probe's report ({e}): {v}", who.name()));
    (v, report, f)
}

/// `zygo run [--json] --stdin PATH -- true`, which must be refused before anything ran:
/// the error, from the JSON answer and from the human line alike.
#[track_caller]
fn refused_stdin(who: Who, path: &str, stdin: impl Fn() -> Stdio) -> String {
    let mut c = zygo(who);
    c.args(["run", "--json", "--stdin", path, "--", "true"])
        .stdin(stdin());
    let f = finish(c);
    let v = f.last_json();
    assert!(
        f.code == 1 && v["started"] == false && v["phase"] == "plan",
        "[{}] --stdin {path} was not refused: exit {}: {v}\nstderr: {}",
        who.name(),
        f.code,
        f.stderr_text()
    );
    let mut c = zygo(who);
    c.args(["run", "--stdin", path, "--", "true"])
        .stdin(stdin());
    let human = finish(c);
    assert_eq!(human.code, 1, "[{}] {}", who.name(), human.stderr_text());
    assert!(
        human.stderr_text().contains(s(&v, "error")),
        "[{}] the human refusal says the same: {}",
        who.name(),
        human.stderr_text()
    );
    s(&v, "error").to_string()
}

/// Every control character in `bytes` that a terminal would act on (C0 but newline and
/// tab, a carriage return that does not end a line, DEL, C1 in UTF-8), described.
fn controls_in(bytes: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        let lone_cr = b == b'\r' && bytes.get(i + 1) != Some(&b'\n');
        let c0 = b < 0x20 && !matches!(b, b'\n' | b'\t' | b'\r');
        let c1 = b == 0xc2 && bytes.get(i + 1).is_some_and(|n| (0x80..0xa0).contains(n));
        if c0 || lone_cr || b == 0x7f || c1 {
            let at = i.saturating_sub(12);
            found.push(format!(
                "byte {b:#04x} at {i}: {:?}",
                String::from_utf8_lossy(&bytes[at..(i + 12).min(bytes.len())])
            ));
        }
    }
    found
}

#[track_caller]
fn assert_no_controls(who: Who, what: &str, f: &Finished) {
    for (stream, bytes) in [("stdout", &f.stdout), ("stderr", &f.stderr)] {
        let found = controls_in(bytes);
        assert!(
            found.is_empty(),
            "[{}] {what}: control characters reached the operator on {stream}: {found:?}\n{}",
            who.name(),
            String::from_utf8_lossy(bytes)
        );
    }
}

/// What `tests/functions/escapes.py` prints, returns and raises (its `NASTY`).
const NASTY: &str =
    "title\x1b]0;owned\x07 clear\x1b[2J c1\u{9b}31m del\x7f cr\rfake bs\x08 bell\x07 end";

/// The same, as human output shows it.
const NASTY_SHOWN: &str =
    "title\\x1b]0;owned\\x07 clear\\x1b[2J c1\\x9b31m del\\x7f cr\\rfake bs\\x08 bell\\x07 end";

/// A handler module that fails to import with `NASTY` in its error.
const BAD_IMPORT: &str = r"raise RuntimeError('import title\x1b]0;owned\x07 clear\x1b[2J c1\u009b31m '
                   'del\x7f cr\rfake bs\x08 bell\x07 end')
";

static ESCAPES: Suite = Suite {
    prefix: "esc-",
    handlers: include_str!("../functions/escapes.py"),
    defaults: "timeout = \"5s\"\nmem = \"64M\"\nidle_timeout = \"30s\"\n",
    agents: true,
};

/// A `zygo` command for `who` with a runtime directory where no supervisor runs.
fn no_supervisor_cmd(who: Who, rt: &TempDir, args: &[&str]) -> std::process::Command {
    let mut c = zygo(who);
    c.env("ZYGO_RUNTIME_DIR", &rt.path)
        .env("ZYGO_STATE_DIR", rt.path.join("state"))
        .args(args);
    c
}

/// Stdout is exactly one line, a JSON object with a `code` and an `error`; the command
/// exited non-zero and said nothing on stderr. The object.
#[track_caller]
fn assert_one_json_refusal(who: Who, args: &[&str], f: &Finished) -> Value {
    let out = f.stdout_text();
    let lines: Vec<&str> = out.lines().collect();
    let v: Value = match lines.as_slice() {
        [one] => serde_json::from_str(one).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    assert!(
        f.code != 0
            && v.is_object()
            && v["code"].as_str().is_some_and(|c| !c.is_empty())
            && v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "[{}] zygo {args:?}: expected one {{code, error}} object on stdout and a non-zero \
         exit, got exit {}\nstdout: {out:?}\nstderr: {}",
        who.name(),
        f.code,
        f.stderr_text()
    );
    assert!(
        f.stderr.is_empty(),
        "[{}] zygo {args:?}: --json wrote to stderr: {}",
        who.name(),
        f.stderr_text()
    );
    v
}

// ---------------------------------------------------------------------------------------
// 7. What `zygo run` hands the program as stdin.

both_tests! {
    /// A terminal named by --stdin is copied through a pipe: the program sees no terminal,
    /// cannot switch the host terminal's echo off (tcsetattr fails with ENOTTY), still
    /// reads what was typed, and the terminal's modes are unchanged afterwards. The copy
    /// left waiting on the silent terminal does not hold up zygo's exit.
    fn a_terminal_given_as_stdin_reaches_the_program_as_a_pipe(who) {
        let (mut master, slave, name) = open_pty(who);
        let before = modes(&slave);
        master.write_all(b"typed line\n").expect("type into the terminal");
        let (v, r, f) = stdin_probe(who, &["--stdin", &name], Stdio::null());
        let w = who.name();
        assert_eq!(r["isatty"], false, "[{w}] the program got a terminal: {r}");
        assert_eq!(r["fifo"], true, "[{w}] {r}");
        assert!(s(&r, "link").starts_with("pipe:"), "[{w}] stdin is {r}");
        assert_eq!(r["tcsetattr"], "ENOTTY", "[{w}] {r}");
        assert_eq!(r["read"], "typed line\n", "[{w}] what was typed: {r} {v}");
        assert_eq!(modes(&slave), before, "[{w}] the host terminal's modes changed");
        assert!(f.elapsed < Duration::from_secs(20), "[{w}] zygo took {:?}", f.elapsed);
    }

    /// A character device named by --stdin (/dev/zero) is copied through a pipe too, and
    /// the copy ends with the program (it would never end by itself).
    fn a_device_given_as_stdin_reaches_the_program_as_a_pipe(who) {
        let mut c = zygo(who);
        c.args(["run", "--json", "--stdin", "/dev/zero", "--env", "READ=16", "--",
                "python3", "-c", STDIN_PROBE]);
        let f = finish(c);
        let v = f.last_json();
        let w = who.name();
        assert!(v["started"] == true && v["exit_code"] == 0, "[{w}] {v}\n{}", f.stderr_text());
        let r: Value = serde_json::from_str(s(&v, "stdout").trim()).expect("the probe's report");
        assert_eq!(r["isatty"], false, "[{w}] {r}");
        assert_eq!(r["fifo"], true, "[{w}] /dev/zero was handed over as it is: {r}");
        assert!(s(&r, "link").starts_with("pipe:"), "[{w}] stdin is {r}");
        assert_eq!(r["tcsetattr"], "ENOTTY", "[{w}] {r}");
        assert_eq!(r["read"], "00".repeat(16), "[{w}] {r}");
        assert!(f.elapsed < Duration::from_secs(20), "[{w}] zygo took {:?}", f.elapsed);
    }

    /// A regular file named by --stdin reaches the program through a pipe, and the
    /// program gets no hold on the host's file: it cannot change its mode, times or
    /// extended attributes through its stdin, nor open it again through
    /// `/proc/self/fd/0` to truncate or write it. (Handed over as it was, the file's
    /// descriptor allowed all of that rootless, where the sandbox's root is the file's
    /// owner.) A pipe arrives as a pipe.
    fn a_file_given_as_stdin_is_read_through_a_pipe_and_left_as_it_was(who) {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = TempDir::new(0o755);
        let file = dir.file("input", b"from a file\n");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod the file");
        if who == Who::Rootless && am_root() {
            // The rootless user's own file, as one of its own would be.
            let r = rootless_setup();
            std::os::unix::fs::chown(&file, Some(r.uid), Some(r.gid)).expect("chown the file");
        }
        let before = std::fs::metadata(&file).expect("stat the file");
        let mut c = zygo(who);
        c.args(["run", "--json", "--stdin", file.to_str().expect("UTF-8"), "--", "python3",
                "-c", STDIN_TAMPER]);
        let f = finish(c);
        let v = f.last_json();
        let w = who.name();
        assert!(v["started"] == true && v["exit_code"] == 0, "[{w}] {v}\n{}", f.stderr_text());
        let r: Value = serde_json::from_str(s(&v, "stdout").trim()).expect("the probe's report");
        assert_eq!(r["read"], "from a file\n", "[{w}] {r}");
        assert_eq!(r["fifo"], true, "[{w}] the file was handed over as it is: {r}");
        let after = std::fs::metadata(&file).expect("stat the file");
        assert_eq!(after.permissions().mode() & 0o7777, 0o600, "[{w}] its mode changed: {r}");
        assert_eq!(after.len(), before.len(), "[{w}] its size changed: {r}");
        assert_eq!(after.mtime(), before.mtime(), "[{w}] its times changed: {r}");
        assert_eq!(std::fs::read(&file).expect("read the file"), b"from a file\n", "[{w}] {r}");
        let xattr = std::process::Command::new("getfattr").args(["--absolute-names", "-d"]).arg(&file).output();
        if let Ok(x) = xattr {
            let listed = String::from_utf8_lossy(&x.stdout).to_string();
            assert!(!listed.contains("user.zygo"), "[{w}] an attribute was set: {listed} {r}");
        }

        let (read, mut write) = pipe();
        if who == Who::Rootless && am_root() {
            // The pipe is this (root) test's: make it the rootless user's, as a pipe of
            // that user's own shell would be, so that zygo may reopen it.
            let r = rootless_setup();
            std::os::unix::fs::fchown(&write, Some(r.uid), Some(r.gid)).expect("chown the pipe");
        }
        write.write_all(b"from a pipe\n").expect("write the pipe");
        drop(write);
        let (_, r, _) = stdin_probe(who, &["--stdin", "/dev/stdin"], Stdio::from(read));
        assert_eq!(r["read"], "from a pipe\n", "[{}] {r}", who.name());
        assert_eq!(r["fifo"], true, "[{}] {r}", who.name());
    }

    /// Output that zygo passes through to `/dev/null` is not relayed at all: the program's
    /// stream is a `/dev/null` of its own (nothing for zygo to copy, outside the sandbox's
    /// CPU quota). A stream that goes anywhere else is still a pipe zygo relays.
    fn output_passed_through_to_dev_null_is_not_relayed(who) {
        let probe = "import os, stat, sys\n\
                     def kind(fd):\n    st = os.fstat(fd)\n    \
                     return 'null' if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3) \
                     else 'pipe' if stat.S_ISFIFO(st.st_mode) else 'other'\n\
                     print(kind(1), kind(2), file=sys.stderr)\n\
                     print('to stdout')\n";
        let w = who.name();
        let run = |out: Stdio, err: Stdio| {
            let mut c = zygo(who);
            c.args(["run", "--", "python3", "-c", probe]).stdout(out).stderr(err);
            let o = spawn_retrying(&mut c).wait_with_output().expect("wait for zygo");
            assert!(o.status.success(), "[{w}] {o:?}");
            (String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
        };
        let (_, err) = run(Stdio::null(), Stdio::piped());
        assert_eq!(err.trim(), "null pipe", "[{w}] stdout to /dev/null");
        let (out, _) = run(Stdio::piped(), Stdio::null());
        assert_eq!(out, "to stdout\n", "[{w}] stderr to /dev/null");
    }

    /// Output that zygo passes through to a pipe, and its own stdin when that is a pipe,
    /// reach the program as those very pipes (each through a description of its own): zygo
    /// copies nothing outside the sandbox's CPU quota (issue 29 item 10). The program sees
    /// the inode of the test's own pipes; a flood of both streams costs zygo next to no
    /// CPU however long it lasts; and the program's flags are its own (a non-blocking
    /// stdout in the sandbox leaves zygo's blocking).
    fn output_and_stdin_passed_through_pipes_are_not_relayed(who) {
        use std::os::unix::fs::MetadataExt;
        let w = who.name();
        let probe = "import os, fcntl\n\
                     print(os.fstat(0).st_ino, os.fstat(1).st_ino, os.fstat(2).st_ino, flush=True)\n\
                     fcntl.fcntl(1, fcntl.F_SETFL, os.O_NONBLOCK)\n\
                     print(os.read(0, 100).decode(), flush=True)\n";
        let ino = |f: &File| f.metadata().expect("fstat a pipe").ino();
        let (mut stdin, child_in) = pipe_for(who, true);
        let (mut stdout, child_out) = pipe_for(who, false);
        let (stderr, child_err) = pipe_for(who, false);
        let want = format!("{} {} {}", ino(&stdin), ino(&stdout), ino(&stderr));
        let mut c = zygo(who);
        c.args(["run", "--", "python3", "-c", probe])
            .stdin(child_in)
            .stdout(child_out)
            .stderr(child_err);
        let mut child = spawn_retrying(&mut c);
        drop(c);
        stdin.write_all(b"from the test").expect("write stdin");
        drop(stdin);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).expect("read stdout");
        let status = child.wait().expect("wait for zygo");
        assert!(status.success(), "[{w}] {status:?} {out}");
        assert_eq!(out.lines().next(), Some(want.as_str()), "[{w}] the program's pipes: {out}");
        assert_eq!(out.lines().nth(1), Some("from the test"), "[{w}] {out}");

        // A flood of both streams, drained by the test: zygo's own CPU does not grow with
        // how long it lasts.
        let mut own = Vec::new();
        for secs in ["1s", "4s"] {
            let (stdout, child_out) = pipe_for(who, false);
            let (stderr, child_err) = pipe_for(who, false);
            let mut c = zygo(who);
            c.args(["run", "--cpu", "0.5", "--timeout", secs, "--", "sh", "-c"])
                .arg("cat /dev/zero & cat /dev/zero >&2")
                .stdin(Stdio::null())
                .stdout(child_out)
                .stderr(child_err);
            let mut child = spawn_retrying(&mut c);
            drop(c);
            let pid = child.id();
            let drain = |mut r: Box<dyn std::io::Read + Send>| {
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    let mut n = 0u64;
                    while let Ok(k) = r.read(&mut buf) {
                        if k == 0 {
                            break;
                        }
                        n += k as u64;
                    }
                    n
                })
            };
            let out = drain(Box::new(stdout));
            let err = drain(Box::new(stderr));
            // SAFETY: sysconf cannot fail for this name.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
            let mut ticks = 0u64;
            while child.try_wait().ok().flatten().is_none() {
                if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                    let f: Vec<&str> = stat.rsplit(") ").next().unwrap_or("").split(' ').collect();
                    if let (Some(u), Some(s)) = (f.get(11), f.get(12)) {
                        ticks = u.parse::<u64>().unwrap_or(0) + s.parse::<u64>().unwrap_or(0);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let (out, err) = (out.join().expect("drain"), err.join().expect("drain"));
            assert!(out > 1 << 20 && err > 1 << 20, "[{w}] {out} and {err} bytes came through");
            let cpu = Duration::from_millis(ticks * 1000 / hz);
            eprintln!("[{w}] --timeout {secs}: {out} + {err} bytes, zygo's own CPU {cpu:?}");
            own.push(cpu);
        }
        let extra = own[1].saturating_sub(own[0]);
        assert!(
            extra < Duration::from_millis(300),
            "[{w}] zygo spent {extra:?} more CPU passing 3 s more of output through ({own:?})"
        );
    }

    /// A socket named by --stdin is refused, naming the path and saying why, whether it is
    /// a socket file or zygo's own stdin (`/dev/stdin`).
    fn a_socket_given_as_stdin_is_refused_naming_it(who) {
        let dir = TempDir::new(0o755);
        let path = dir.path.join("sock");
        let _listener = UnixListener::bind(&path).expect("bind a unix socket");
        let path = path.to_str().expect("UTF-8");
        let why = refused_stdin(who, path, Stdio::null);
        assert!(why.contains(path) && why.contains("is a socket"), "[{}] {why}", who.name());

        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let theirs = OwnedFd::from(theirs);
        let why = refused_stdin(who, "/dev/stdin", || {
            Stdio::from(theirs.try_clone().expect("dup the socket"))
        });
        drop(ours);
        assert!(why.contains("/dev/stdin") && why.contains("is a socket"), "[{}] {why}", who.name());
    }

    /// A directory named by --stdin is refused: as the program's descriptor 0 it would be
    /// a way into the host's file tree past the sandbox's root (`/proc/self/fd/0/..`).
    fn a_directory_given_as_stdin_is_refused_naming_it(who) {
        let dir = TempDir::new(0o755);
        let why = refused_stdin(who, dir.str(), Stdio::null);
        assert!(why.contains(dir.str()) && why.contains("is a directory"), "[{}] {why}", who.name());
    }

    /// Without --stdin, a terminal on zygo's own stdin never reaches the program: with
    /// --json it gets /dev/null, without it a pipe zygo copies into.
    fn a_terminal_on_zygos_own_stdin_never_reaches_the_program(who) {
        let (_master, slave, _) = open_pty(who);
        let before = modes(&slave);
        let (_, r, _) = stdin_probe(who, &[], Stdio::from(slave.try_clone().expect("dup pty")));
        assert_eq!(r["isatty"], false, "[{}] --json: {r}", who.name());
        assert_eq!(r["link"], "/dev/null", "[{}] --json: {r}", who.name());

        let mut c = zygo(who);
        c.args(["run", "--env", "READ=none", "--", "python3", "-c", STDIN_PROBE])
            .stdin(slave.try_clone().expect("dup pty"));
        let f = finish(c);
        assert_eq!(f.code, 0, "[{}] {}", who.name(), f.stderr_text());
        let r: Value = serde_json::from_str(f.stdout_text().lines().next().unwrap_or(""))
            .unwrap_or(Value::Null);
        assert_eq!(r["isatty"], false, "[{}] plain: {r} {}", who.name(), f.stdout_text());
        assert!(s(&r, "link").starts_with("pipe:"), "[{}] plain: {r}", who.name());
        assert_eq!(modes(&slave), before, "[{}] the terminal's modes changed", who.name());
    }
}

/// A pipe: (read end, write end).
fn pipe() -> (OwnedFd, File) {
    let mut fds = [0; 2];
    // SAFETY: fds is a two-element array as pipe2 requires.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

// ---------------------------------------------------------------------------------------
// 8. Control characters from a sandbox, shown to the operator.

both_tests! {
    /// A handler's stdout, stderr, progress, result, error and traceback full of terminal
    /// escapes reach `zygo exec` (with and without --stream), `zygo logs`, `zygo up` and
    /// `zygo ls` human output with every control character shown as an escape; with
    /// --json, the same text decodes exactly (and no raw control is on the line either).
    fn terminal_escapes_from_a_handler_are_shown_escaped_to_the_operator(who) {
        let mut s = ESCAPES.sup(who, "show");
        s.fn_file("badimport.py", BAD_IMPORT);
        let (file, n) = s.write_toml(&[
            ("noisy", "noisy", ""),
            ("raising", "raising", ""),
            ("badimport", "", "entry = \"fn/badimport.py:handler\""),
        ]);
        let (noisy, raising, badimport) = (&n[0], &n[1], &n[2]);
        let file = file.to_str().expect("UTF-8").to_string();
        let w = who.name();

        // zygo up: the import error of one function, escaped.
        let f = s.run(&["up", "-f", &file]);
        s.find_supervisor();
        assert_eq!(f.code, 1, "[{w}] zygo up: {}\n{}", f.stderr_text(), s.log());
        assert_no_controls(who, "zygo up", &f);
        assert!(f.stderr_text().contains(NASTY_SHOWN), "[{w}] zygo up: {}", f.stderr_text());

        // zygo exec, human.
        let f = s.run(&["exec", noisy]);
        assert_eq!(f.code, 0, "[{w}] {}\n{}", f.stderr_text(), s.log());
        assert_no_controls(who, "zygo exec", &f);
        // The handler's output is on stderr (stdout has the result alone).
        assert!(f.stderr_text().contains(&format!("out {NASTY_SHOWN}\n")), "[{w}] {}", f.stderr_text());
        assert!(f.stderr_text().contains(&format!("err {NASTY_SHOWN}\n")), "[{w}] {}", f.stderr_text());
        assert!(!f.stdout_text().contains("out "), "[{w}] {}", f.stdout_text());

        let f = s.run(&["exec", noisy, "--stream"]);
        assert_eq!(f.code, 0, "[{w}] {}", f.stderr_text());
        assert_no_controls(who, "zygo exec --stream", &f);
        assert!(f.stderr_text().contains(&format!("progress: progress {NASTY_SHOWN}")),
            "[{w}] {}", f.stderr_text());

        let f = s.run(&["exec", raising]);
        assert_eq!(f.code, 1, "[{w}] {}", f.stderr_text());
        assert_no_controls(who, "zygo exec of a handler that raised", &f);
        assert!(f.stderr_text().contains(&format!("error {NASTY_SHOWN}")), "[{w}] {}", f.stderr_text());

        let f = s.run(&["exec", badimport]);
        assert_eq!(f.code, 1, "[{w}] {}", f.stderr_text());
        assert_no_controls(who, "zygo exec of a function that failed to import", &f);

        // zygo exec --json: the exact text.
        let (v, f) = s.exec(noisy, None, &[]);
        s.assert_ok(&v, &f, "noisy --json");
        assert!(controls_in(&f.stdout).is_empty(), "[{w}] raw controls in --json: {:?}", controls_in(&f.stdout));
        assert_eq!(v["result"]["value"], NASTY, "[{w}] {v}");
        assert_eq!(v["stdout"], format!("out {NASTY}\n"), "[{w}] {v}");
        assert_eq!(v["stderr"], format!("err {NASTY}\n"), "[{w}] {v}");
        let (v, f) = s.exec(raising, None, &[]);
        let error = s.assert_handler_error(&v, &f);
        assert!(error.contains(&format!("error {NASTY}")), "[{w}] {v}");
        assert!(text(&v, "traceback").contains(&format!("error {NASTY}")), "[{w}] {v}");
        let (_, f) = s.exec(noisy, None, &["--stream"]);
        assert!(controls_in(&f.stdout).is_empty(), "[{w}] raw controls in --stream --json");
        let lines = f.json_lines();
        assert!(lines.iter().any(|l| l["event"] == "progress" && l["data"] == format!("progress {NASTY}")),
            "[{w}] {lines:?}");
        let (v, f) = s.exec(badimport, None, &[]);
        s.assert_refused(&v, &f, "unavailable");
        assert!(text(&v, "error").contains(&format!("import {NASTY}")), "[{w}] {v}");

        // zygo logs, human and --json.
        for name in [noisy, raising] {
            let f = s.run(&["logs", name]);
            assert_eq!(f.code, 0, "[{w}] {}", f.stderr_text());
            assert_no_controls(who, "zygo logs", &f);
            assert!(f.stdout_text().contains(&format!("out: out {NASTY_SHOWN}")), "[{w}] {}", f.stdout_text());
            let f = s.run(&["logs", name, "--json"]);
            assert!(controls_in(&f.stdout).is_empty(), "[{w}] raw controls in logs --json");
            for l in f.json_lines() {
                assert_eq!(l["stdout"], format!("out {NASTY}\n"), "[{w}] {l}");
                assert_eq!(l["stderr"], format!("err {NASTY}\n"), "[{w}] {l}");
            }
        }
        let f = s.run(&["logs", raising]);
        assert!(f.stdout_text().contains(&format!("error {NASTY_SHOWN}")), "[{w}] {}", f.stdout_text());

        // zygo ls: the failed function's error.
        let f = s.run(&["ls"]);
        assert_eq!(f.code, 0, "[{w}] {}", f.stderr_text());
        assert_no_controls(who, "zygo ls", &f);
        assert!(f.stdout_text().contains(&format!("import {NASTY_SHOWN}")), "[{w}] {}", f.stdout_text());
        assert!(text(&s.info(badimport), "error").contains(&format!("import {NASTY}")), "[{w}] ls --json");
        let f = s.run(&["stats"]);
        assert_no_controls(who, "zygo stats", &f);
        s.shutdown();
    }
}

// ---------------------------------------------------------------------------------------
// 14. Every --json answer is one JSON object.

both_tests! {
    /// With no supervisor, each command asked for --json prints exactly one
    /// `{code, error}` object on stdout (nothing on stderr) and exits 1; without --json,
    /// one line on stderr and nothing on stdout.
    fn every_json_answer_without_a_supervisor_is_one_object(who) {
        let rt = TempDir::new(0o777);
        for args in [
            &["exec", "--json", "f", "{}"][..],
            &["exec", "f", "--json", "--stream"],
            &["ls", "--json"],
            &["logs", "--json", "f"],
            &["stats", "--json"],
            &["stop", "f", "--json"],
            &["warm", "f", "2", "--json"],
            &["cancel", "k", "--json"],
            &["drain", "--json"],
            &["scripts", "put", "/etc/hostname", "--json"],
        ] {
            let f = finish(no_supervisor_cmd(who, &rt, args));
            let v = assert_one_json_refusal(who, args, &f);
            assert_eq!(f.code, 1, "[{}] zygo {args:?}", who.name());
            assert_eq!(v["code"], "unavailable", "[{}] zygo {args:?}: {v}", who.name());
            assert!(text(&v, "error").contains("no supervisor"), "[{}] {v}", who.name());
        }
        for args in [&["exec", "f", "{}"][..], &["ls"], &["logs", "f"], &["stats"]] {
            let f = finish(no_supervisor_cmd(who, &rt, args));
            assert_eq!(f.code, 1, "[{}] zygo {args:?}", who.name());
            assert!(f.stdout.is_empty(), "[{}] zygo {args:?}: {}", who.name(), f.stdout_text());
            assert!(f.stderr_text().contains("no supervisor is running"), "[{}] {}", who.name(), f.stderr_text());
        }
    }

    /// A socket nobody listens on (a supervisor that died) is answered the same way.
    fn a_socket_nobody_listens_on_is_one_json_refusal(who) {
        let rt = TempDir::new(0o777);
        drop(UnixListener::bind(rt.path.join("zygo.sock")).expect("bind"));
        let args = ["exec", "f", "--json"];
        let f = finish(no_supervisor_cmd(who, &rt, &args));
        let v = assert_one_json_refusal(who, &args, &f);
        assert_eq!(v["code"], "unavailable", "[{}] {v}", who.name());
    }

    /// A command line that cannot be used, with --json anywhere among its options (before
    /// or after the fault), is answered with one `{code: "bad_request", error}` object
    /// and exit 2.
    fn a_usage_error_with_json_is_one_object(who) {
        let rt = TempDir::new(0o777);
        for args in [
            &["exec", "f", "--json", "--bogus"][..],
            &["exec", "--bogus", "--json", "f"],
            &["exec", "--json"],
            &["exec", "f", "{}", "extra", "--json"],
            &["exec", "f", "--timeout", "soon", "--json"],
            &["exec", "f", "not json and no file", "--json"],
            &["logs", "f", "-n", "0", "--json"],
            &["logs", "--json", "-n"],
            &["warm", "--json"],
            &["stop", "--json"],
            &["drain", "--grace", "x", "--json"],
            &["version", "--json", "--bogus"],
            &["bogus-command", "--json"],
            &["run", "--json", "--bogus", "--", "true"],
            &["run", "--mem", "lots", "--json", "--", "true"],
            &["run", "--json"],
        ] {
            let f = finish(no_supervisor_cmd(who, &rt, args));
            let v = assert_one_json_refusal(who, args, &f);
            assert_eq!(f.code, 2, "[{}] zygo {args:?}: {v}", who.name());
            assert_eq!(v["code"], "bad_request", "[{}] zygo {args:?}: {v}", who.name());
        }
        // `zygo run --json` answers in its own shape too.
        let f = finish(no_supervisor_cmd(who, &rt, &["run", "--json", "--bogus", "--", "true"]));
        let v = f.last_json();
        assert!(v["started"] == false && v["phase"] == "plan", "[{}] {v}", who.name());
        // --json that belongs to the program is not zygo's.
        let f = finish(no_supervisor_cmd(who, &rt, &["run", "--bogus", "--", "prog", "--json"]));
        assert_eq!(f.code, 2);
        assert!(f.stdout.is_empty(), "[{}] {}", who.name(), f.stdout_text());
    }
}

#[test]
fn the_helpers_find_every_kind_of_control() {
    assert!(controls_in(b"plain\ttext\r\n").is_empty());
    for bad in [
        &b"\x1b"[..],
        b"\x07",
        b"a\rb",
        b"\x7f",
        "\u{9b}".as_bytes(),
        b"end\r",
    ] {
        assert_eq!(controls_in(bad).len(), 1, "{bad:?}");
    }
}
