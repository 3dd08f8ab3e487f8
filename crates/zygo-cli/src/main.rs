//! The `zygo` binary: one executable, several roles. `zygo __launcher` is the launcher role
//! (started only by the monitor, with its socket on fd 3); everything else is the CLI.
//!
//! The C runtime calls [`main`] directly (`no_main`), skipping Rust's own start-up; see
//! there for what that keeps and what it leaves out. The unit tests keep the test
//! harness's own `main`, so the start-up is left out of their build.
#![cfg_attr(not(test), no_main)]
#![cfg_attr(test, allow(dead_code))]

/// `println!` that does not panic when stdout is closed (e.g. piped into `head`): the
/// monitor must still clean up its sandbox whatever happens to its output.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// `print!` that does not panic when stdout is closed.
#[macro_export]
macro_rules! say_raw {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($t)*);
    }};
}

mod api;
mod client;
mod deps;
mod flags;
mod fncmds;
mod mcp;
mod output;
mod run;
mod sandbox_file;
mod usage;
mod version;

/// The process's entry point. Every sandbox starts two processes of this binary (the
/// command and its launcher), so they start the way a C program does. Of what Rust's
/// start-up would do, Zygo relies on two things, done here: descriptors 0, 1 and 2 are
/// open (on `/dev/null` if whoever started us had closed them), so no file opened later
/// can become our stdout; and SIGPIPE is ignored, so writing to a closed pipe is an error
/// to handle rather than death. Left out: the main thread's stack guard lookup (glibc
/// reads `/proc/self/maps` for it) and the alternate signal stack that turns a stack
/// overflow into a message; an overflow still ends the process (SIGSEGV).
/// `std::process::exit` flushes stdout, as Rust's usual exit path does.
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    standard_fds_open();
    // SAFETY: setting a signal's disposition to ignore; no handler code is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let code = zygo_main();
    std::process::exit(i32::from(code))
}

/// Open `/dev/null` on whichever of descriptors 0, 1 and 2 is closed; abort if that fails
/// (as Rust's own start-up does).
fn standard_fds_open() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    let closed: [bool; 3] = loop {
        // SAFETY: fds is a valid array of three pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) };
        if r >= 0 {
            break fds.map(|p| p.revents & libc::POLLNVAL != 0);
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        // poll itself failed (e.g. a descriptor limit below 3): ask each one.
        // SAFETY: F_GETFD on a descriptor number only queries it.
        break [0, 1, 2].map(|fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1);
    };
    for (fd, closed) in closed.iter().enumerate() {
        // SAFETY: opening a static NUL-terminated path; the lowest free descriptor is fd,
        // since every lower one is open.
        if *closed && unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } != fd as i32 {
            std::process::abort();
        }
    }
}

fn zygo_main() -> u8 {
    let mut args = std::env::args_os();
    let _argv0 = args.next();
    let first = args.next();
    if first.as_deref().and_then(plumbing::Role::from_arg) == Some(plumbing::Role::Launcher) {
        init_logging();
        return zygo_launcher::main().clamp(0, 255) as u8;
    }
    if first.as_deref().and_then(plumbing::Role::from_arg) == Some(plumbing::Role::EgressFilter) {
        init_logging();
        return zygo_egress::main().clamp(0, 255) as u8;
    }
    init_logging();
    let rest: Vec<std::ffi::OsString> = args.collect();
    let code = match first.as_ref().and_then(|f| f.to_str()) {
        None | Some("help") | Some("--help") | Some("-h") => {
            say_raw!("{}", usage::TOP);
            0
        }
        Some("run") => run::main(rest),
        Some("supervisor") => fncmds::supervisor(rest),
        Some("up") => fncmds::up(rest),
        Some("serve") => fncmds::serve(rest),
        Some("stop") => fncmds::stop(rest),
        Some("exec") => fncmds::exec(rest),
        Some("scripts") => fncmds::scripts(rest),
        Some("deps") => deps::main(rest),
        Some("ls") => fncmds::ls(rest),
        Some("logs") => fncmds::logs(rest),
        Some("stats") => fncmds::stats(rest),
        Some("warm") => fncmds::warm(rest),
        Some("cancel") => fncmds::cancel(rest),
        Some("drain") => fncmds::drain(rest),
        Some("api") => api::main(rest),
        Some("token") => fncmds::token(rest),
        Some("secrets") => fncmds::secrets(rest),
        Some("mcp") => mcp::main(rest),
        Some(arg) if plumbing::Role::from_arg(arg.as_ref()) == Some(plumbing::Role::McpFront) => {
            mcp::front(rest)
        }
        Some("version") | Some("--version") | Some("-V") => version::main(rest),
        Some(other) => {
            let msg = format!("unknown command {other:?}; see `zygo --help`");
            if asks_json(&rest, &[], true) {
                say!("{}", output::json(&bad_request(&msg)));
            } else {
                eprintln!("zygo: {}", output::clean(&msg));
            }
            2
        }
    };
    code.clamp(0, 255) as u8
}

/// Log records go to stderr (the supervisor's log file, a launcher's, a terminal) as
/// `[LEVEL] message`. What a message carries may come from a sandbox (an import error, an
/// agent's diagnostics), so its control characters are escaped and each further line of it
/// starts with `    | `: no message can forge a record, move the cursor or retitle the
/// operator's terminal.
///
/// When stderr is systemd's journal (`$JOURNAL_STREAM` names it), each record is one line
/// with its syslog priority in front (`<6>message`), which journald takes as the entry's
/// level: one journal entry per event, with journald's own timestamp.
fn init_logging() {
    use std::io::Write;
    let env = env_logger::Env::new().filter_or("ZYGO_LOG", "warn");
    if stderr_is_journal() {
        env_logger::Builder::from_env(env)
            .format(|buf, record| {
                let prio = match record.level() {
                    log::Level::Error => 3,
                    log::Level::Warn => 4,
                    log::Level::Info => 6,
                    log::Level::Debug | log::Level::Trace => 7,
                };
                let text = record.args().to_string();
                let text = output::clean(&text).replace('\n', " | ");
                writeln!(buf, "<{prio}>{text}")
            })
            .init();
        return;
    }
    env_logger::Builder::from_env(env)
        .format(|buf, record| {
            let text = record.args().to_string();
            let text = output::clean(&text).replace('\n', "\n    | ");
            writeln!(buf, "[{:<5}] {text}", record.level())
        })
        .init();
}

/// Whether stderr is the journal stream `$JOURNAL_STREAM` (`<device>:<inode>`) names.
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let v = v.to_string_lossy();
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    // SAFETY: stat is plain old data, so all zeroes is a valid value for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of fd 2 into a valid, writable stat buffer.
    if unsafe { libc::fstat(2, &mut st) } != 0 {
        return false;
    }
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}

/// A usage error: one line, exit code 2.
pub fn usage_error(cmd: &str, msg: impl std::fmt::Display) -> i32 {
    let msg = msg.to_string();
    eprintln!(
        "zygo {cmd}: {}; see `zygo {cmd} --help`",
        output::clean(&msg)
    );
    2
}

/// A usage error answered as `--json` asked: one `{"code": "bad_request", "error"}` object
/// on stdout, or the line of [`usage_error`]; exit code 2 either way.
pub fn usage_refusal(json: bool, cmd: &str, msg: impl std::fmt::Display) -> i32 {
    if json {
        say!("{}", output::json(&bad_request(&msg.to_string())));
        2
    } else {
        usage_error(cmd, msg)
    }
}

/// The `--json` answer to a command line that could not be used.
fn bad_request(msg: &str) -> serde_json::Value {
    serde_json::json!({"code": "bad_request", "error": msg})
}

/// Whether `--json` is among the options of `raw`, read as lexopt reads them (`valued`
/// options take the next argument; with `operand_ends`, the first operand ends the
/// options, as `zygo run`'s command does), whatever else is wrong with them: a command
/// line that fails to parse is still answered the way it asked.
pub fn asks_json(raw: &[std::ffi::OsString], valued: &[&str], operand_ends: bool) -> bool {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(raw.iter().cloned());
    let mut json = false;
    // Each step takes at least one character of the arguments (a short option of a
    // cluster) or one argument: this many steps end any parse.
    let steps = raw.iter().map(|a| a.len() + 1).sum::<usize>() + 1;
    for _ in 0..steps {
        match p.next() {
            Ok(None) => return json,
            Ok(Some(Long("json"))) => json = true,
            Ok(Some(Long(f))) if valued.contains(&f) => {
                let _ = p.value();
            }
            Ok(Some(Short(c))) if valued.contains(&c.to_string().as_str()) => {
                let _ = p.value();
            }
            Ok(Some(Long(_))) => {
                let _ = p.optional_value();
            }
            Ok(Some(Value(_))) if operand_ends => return json,
            // After `--` everything is an operand.
            Ok(Some(_)) | Err(_) => {}
        }
    }
    json
}

#[cfg(test)]
mod tests {
    use super::asks_json;

    fn asks(args: &[&str], valued: &[&str], operand_ends: bool) -> bool {
        let raw: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        asks_json(&raw, valued, operand_ends)
    }

    #[test]
    fn json_is_seen_anywhere_among_the_options_even_past_a_bad_one() {
        assert!(asks(&["f", "{}", "--json"], &[], false));
        assert!(asks(&["--bogus", "--json"], &[], false));
        assert!(asks(&["--bogus=1", "-x", "--json"], &[], false));
        assert!(asks(&["--json", "--timeout"], &["timeout"], false));
        assert!(!asks(&["f", "{}"], &[], false));
    }

    #[test]
    fn json_as_an_option_value_or_an_operand_is_not_asked_for() {
        assert!(!asks(&["--key", "--json", "f"], &["key"], false));
        assert!(!asks(&["-n", "--json"], &["n"], false));
        assert!(!asks(&["f", "--", "--json"], &[], false));
        // `zygo run`: the command and its arguments are not zygo's.
        assert!(!asks(&["--mem", "1G", "prog", "--json"], &["mem"], true));
        assert!(!asks(&["--", "prog", "--json"], &[], true));
        assert!(asks(&["--json", "--mem", "1G", "prog"], &["mem"], true));
    }
}
