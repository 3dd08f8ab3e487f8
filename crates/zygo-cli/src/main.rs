//! The `zygo` binary: one executable, several roles. `zygo __launcher` is the launcher role
//! (started only by the monitor, with its socket on fd 3); everything else is the CLI.

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

mod client;
mod flags;
mod fncmds;
mod mcp;
mod run;
mod usage;
mod version;

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let _argv0 = args.next();
    let first = args.next();
    if first.as_deref() == Some(std::ffi::OsStr::new("__launcher")) {
        init_logging();
        return ExitCode::from(zygo_launcher::main().clamp(0, 255) as u8);
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
        Some("ls") => fncmds::ls(rest),
        Some("logs") => fncmds::logs(rest),
        Some("stats") => fncmds::stats(rest),
        Some("warm") => fncmds::warm(rest),
        Some("cancel") => fncmds::cancel(rest),
        Some("drain") => fncmds::drain(rest),
        Some("mcp") => mcp::main(rest),
        Some("__mcp-front") => mcp::front(rest),
        Some("version") | Some("--version") | Some("-V") => version::main(rest),
        Some(other) => {
            eprintln!("zygo: unknown command {other:?}; see `zygo --help`");
            2
        }
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}

fn init_logging() {
    let env = env_logger::Env::new().filter_or("ZYGO_LOG", "warn");
    env_logger::Builder::from_env(env)
        .format_timestamp(None)
        .format_target(false)
        .init();
}

/// A usage error: one line, exit code 2.
pub fn usage_error(cmd: &str, msg: impl std::fmt::Display) -> i32 {
    eprintln!("zygo {cmd}: {msg}; see `zygo {cmd} --help`");
    2
}
