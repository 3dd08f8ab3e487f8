//! The internal roles the `zygo` binary runs in, started by the monitor side: each one's
//! argv name, the descriptors it starts with, and the one spawn that starts any of them.
//!
//! Every role runs as `zygo <arg>` with an environment of only the logging variables, and
//! with these descriptors:
//!
//! | fd | [`Role::Launcher`]              | [`Role::McpFront`]      | [`Role::EgressFilter`] |
//! |----|---------------------------------|-------------------------|------------------------|
//! | 0  | the program's stdin (or null)   | the host's stdin        | null                   |
//! | 1  | the program's stdout            | the host's stdout       | null                   |
//! | 2  | the monitor's stderr            | the monitor's stderr    | the launcher's stderr  |
//! | 3  | [`CHANNEL_FD`]: the monitor     | [`CHANNEL_FD`]: the monitor side | [`CHANNEL_FD`]: its launcher |
//! | 4  | [`PROGRAM_STDERR_FD`]           | —                       | —                      |
//!
//! A role is killed (SIGKILL) when the thread that started it exits. A new role (another
//! front) is a variant here, its `arg`, its layout, and its match arm in `zygo`'s `main`.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use crate::pipes::{dup_above, set_cloexec};
use crate::vfork::{self, Program};

/// Every role's channel to the process that started it.
pub const CHANNEL_FD: RawFd = 3;
/// The launcher's second descriptor: where the sandbox's program writes its stderr.
pub const PROGRAM_STDERR_FD: RawFd = 4;

/// The environment variables a role inherits; nothing else of the environment crosses.
const PASSED_ENV: [&str; 2] = ["RUST_LOG", "ZYGO_LOG"];

/// An internal role of the `zygo` binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// One per sandbox, started by the monitor (a one-shot run or the supervisor).
    Launcher,
    /// `zygo mcp`'s confined JSON-RPC front, started by `zygo mcp`'s monitor side.
    McpFront,
    /// A sandbox's egress filter, started by its launcher when the sandbox has egress: it
    /// relays the connections the rules allow, from outside the sandbox.
    EgressFilter,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Launcher, Role::McpFront, Role::EgressFilter];

    /// The first argument that selects the role: `zygo <arg>`.
    pub const fn arg(self) -> &'static str {
        match self {
            Role::Launcher => "__launcher",
            Role::McpFront => "__mcp-front",
            Role::EgressFilter => "__egress-filter",
        }
    }

    /// The role `arg` names, if any.
    pub fn from_arg(arg: &OsStr) -> Option<Role> {
        Role::ALL.into_iter().find(|r| OsStr::new(r.arg()) == arg)
    }

    /// The highest descriptor of the role's layout; every one above it is closed when the
    /// role takes its channel.
    pub const fn top_fd(self) -> RawFd {
        match self {
            Role::Launcher => PROGRAM_STDERR_FD,
            Role::McpFront | Role::EgressFilter => CHANNEL_FD,
        }
    }

    /// The role it says hello as, for a front (a launcher says none).
    pub const fn front(self) -> Option<proto::front::Role> {
        match self {
            Role::Launcher | Role::EgressFilter => None,
            Role::McpFront => Some(proto::front::Role::Mcp),
        }
    }

    /// In the started process, first thing: check that [`CHANNEL_FD`] is a socket, close
    /// every descriptor above the role's layout, mark the layout's own close-on-exec (the
    /// role's children get none of them), and take the channel.
    pub fn take_channel(self) -> io::Result<UnixStream> {
        // SAFETY: stat is plain data; fstat fills it or fails.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on a descriptor number with a valid out-pointer.
        if unsafe { libc::fstat(CHANNEL_FD, &mut st) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("fd {CHANNEL_FD} is not open ({e})"),
            ));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fd {CHANNEL_FD} is not a socket"),
            ));
        }
        // SAFETY: close_range on this process's own descriptor table, above the layout.
        let r = unsafe { libc::syscall(libc::SYS_close_range, self.top_fd() + 1, u32::MAX, 0) };
        if r != 0 {
            log::warn!(
                "close_range: {}; other descriptors stay open",
                io::Error::last_os_error()
            );
        }
        for fd in CHANNEL_FD..=self.top_fd() {
            set_cloexec(fd)?;
        }
        // SAFETY: fd 3 is an open socket handed to this process for exactly this use by the
        // role's layout; it is owned here once.
        Ok(unsafe { UnixStream::from_raw_fd(CHANNEL_FD) })
    }
}

/// Where one of a role's standard descriptors comes from.
#[derive(Debug, Clone, Copy)]
pub enum Stdio<'a> {
    /// The starting process's own.
    Inherit,
    /// `/dev/null`.
    Null,
    Fd(BorrowedFd<'a>),
}

/// The descriptors a role starts with (stderr is always the starting process's own).
#[derive(Debug, Clone, Copy)]
pub struct RoleFds<'a> {
    pub stdin: Stdio<'a>,
    pub stdout: Stdio<'a>,
    /// [`CHANNEL_FD`] in the role.
    pub channel: BorrowedFd<'a>,
    /// [`PROGRAM_STDERR_FD`]: given for a launcher and for no other role.
    pub program_stderr: Option<BorrowedFd<'a>>,
}

/// A started role: its pid, and whether it has been reaped.
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
}

impl Child {
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// SIGKILL, unless it has already been reaped (its pid may then be someone else's).
    pub fn kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: signalling our own child, which has not been reaped.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wait for it to exit and reap it.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        self.reap(0)
            .map(|s| s.unwrap_or_else(|| ExitStatus::from_raw(0)))
    }

    /// Reap it if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        loop {
            let mut raw = 0;
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
            if r == self.pid {
                let s = ExitStatus::from_raw(raw);
                self.status = Some(s);
                return Ok(Some(s));
            }
            if r == 0 {
                return Ok(None);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains a NUL byte"))
}

/// Where a child's descriptor comes from, as the child sees it (raw numbers, ready).
#[derive(Clone, Copy)]
enum Source {
    Inherit,
    Null,
    Fd(RawFd),
}

/// What the child of [`spawn`] needs, made ready by the parent: the child runs on the
/// parent's memory and may not allocate, lock or unwind, only make system calls.
struct ChildPlan<'a> {
    program: Program<'a>,
    /// (target, source), in ascending target order.
    slots: [(RawFd, Source); 4],
}

/// The child: descriptors in place, the parent-death signal set, SIGPIPE back to its
/// default (the monitor ignores it, and an ignored signal stays ignored across exec), no
/// signal blocked, then exec. Nothing else about signals changes: none has a handler to
/// reset (Zygo installs none; long-lived processes read their signals from a signalfd or
/// a thread of their own), so none can run on the parent's memory here.
extern "C" fn child_main(arg: *mut libc::c_void) -> ! {
    // SAFETY: `arg` is the parent's ChildPlan, which outlives this child: the parent is
    // suspended (CLONE_VFORK) until the exec below succeeds or this child exits.
    let plan = unsafe { &mut *arg.cast::<ChildPlan>() };
    // SAFETY: only async-signal-safe system calls on values the parent prepared; every
    // pointer in `plan` is valid until the parent resumes.
    unsafe {
        let placed = plan.slots.iter().all(|&(to, from)| match from {
            Source::Inherit => true,
            Source::Fd(fd) => libc::dup2(fd, to) == to,
            Source::Null => {
                let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                fd == to || (fd >= 0 && libc::dup2(fd, to) == to && libc::close(fd) == 0)
            }
        });
        if placed && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == 0 {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            plan.program.exec()
        }
        plan.program.fail()
    }
}

/// Start `exe <role's arg>` with `fds` in place (see the module's table), an empty signal
/// mask, SIGPIPE at its default, SIGKILL as its parent-death signal, and an environment of
/// only the logging variables; return once the exec is done or has failed.
///
/// The child is made by [`vfork::spawn`], as glibc's `posix_spawn` makes one, but without
/// `posix_spawn`'s pass over every signal (two calls per signal, ~50 µs, while this
/// process waits): nothing of this process's memory is copied. A source descriptor that
/// sits within the layout's numbers is first duplicated above them, so that no move
/// clobbers another.
pub fn spawn(exe: &Path, role: Role, fds: RoleFds<'_>) -> io::Result<Child> {
    if fds.program_stderr.is_some() != (role == Role::Launcher) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the {} role's descriptors do not fit its layout",
                role.arg()
            ),
        ));
    }
    let path = cstring(exe.as_os_str())?;
    // argv[0] is the program's name, not its path: a sandbox's init is this binary, and
    // its command line is readable inside the sandbox (/proc/1/cmdline), which has no need
    // to learn the host's paths.
    let argv_c = [
        cstring(OsStr::new("zygo"))?,
        cstring(OsStr::new(role.arg()))?,
    ];
    let mut env_c: Vec<CString> = Vec::new();
    for key in PASSED_ENV {
        if let Some(v) = std::env::var_os(key) {
            let mut kv = OsStr::new(key).to_os_string();
            kv.push("=");
            kv.push(v);
            env_c.push(cstring(&kv)?);
        }
    }
    let top = role.top_fd();
    // Sources within the layout's numbers, lifted above them; held until the spawn is done.
    let mut lifted: Vec<OwnedFd> = Vec::new();
    let mut source = |s: Stdio<'_>| -> io::Result<Source> {
        Ok(match s {
            Stdio::Inherit => Source::Inherit,
            Stdio::Null => Source::Null,
            Stdio::Fd(fd) if fd.as_raw_fd() > top => Source::Fd(fd.as_raw_fd()),
            Stdio::Fd(fd) => {
                let hi = dup_above(&fd, top + 1)?;
                let raw = hi.as_raw_fd();
                lifted.push(hi);
                Source::Fd(raw)
            }
        })
    };
    let slots = [
        (0, source(fds.stdin)?),
        (1, source(fds.stdout)?),
        (CHANNEL_FD, source(Stdio::Fd(fds.channel))?),
        (
            PROGRAM_STDERR_FD,
            match fds.program_stderr {
                Some(fd) => source(Stdio::Fd(fd))?,
                None => Source::Inherit,
            },
        ),
    ];
    let mut plan = ChildPlan {
        program: Program::new(&path, &argv_c, &env_c),
        slots,
    };
    // SAFETY: child_main only makes system calls with what `plan` points to, all of it
    // alive until this returns.
    let pid = unsafe { vfork::spawn(child_main, (&mut plan as *mut ChildPlan).cast()) }?;
    drop(lifted);
    let mut child = Child { pid, status: None };
    if plan.program.errno != 0 {
        // The child has exited (127) without exec: reap it.
        let _ = child.wait();
        return Err(io::Error::from_raw_os_error(plan.program.errno));
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipes::pipe;
    use std::os::fd::AsFd;

    #[test]
    fn every_role_is_named_once_and_found_by_its_name() {
        for r in Role::ALL {
            assert_eq!(Role::from_arg(OsStr::new(r.arg())), Some(r));
        }
        assert_eq!(Role::from_arg(OsStr::new("run")), None);
    }

    fn start(exe: &str, role: Role, stderr: bool) -> io::Result<Child> {
        let (_r, w) = pipe()?;
        let (a, _b) = crate::pipes::socketpair(libc::SOCK_STREAM)?;
        spawn(
            Path::new(exe),
            role,
            RoleFds {
                stdin: Stdio::Null,
                stdout: Stdio::Fd(w.as_fd()),
                channel: a.as_fd(),
                program_stderr: stderr.then(|| w.as_fd()),
            },
        )
    }

    #[test]
    fn a_role_runs_and_is_reaped() {
        let mut c = start("/bin/true", Role::Launcher, true).expect("spawn /bin/true");
        assert!(c.wait().expect("wait").success());
        let mut c = start("/bin/true", Role::McpFront, false).expect("spawn /bin/true");
        assert!(c.wait().expect("wait").success());
    }

    #[test]
    fn a_missing_binary_is_an_error_the_child_reaped() {
        let e = start("/nonexistent/zygo", Role::Launcher, true).expect_err("no such binary");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn descriptors_that_do_not_fit_the_layout_are_refused() {
        let e = start("/bin/true", Role::McpFront, true).expect_err("a front has no fd 4");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
