//! Starting a launcher: the `zygo` binary re-executed in its launcher role.
//!
//! The child is created with `CLONE_VM | CLONE_VFORK`: nothing of the monitor's address
//! space is copied, and the monitor waits only until the exec is done. The child puts its
//! descriptors in place (each a `dup2`, which clears close-on-exec on the target); every
//! other descriptor of the monitor is close-on-exec.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

/// A launcher process: its pid, and whether it has been reaped.
#[derive(Debug)]
pub struct Launcher {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
}

impl Launcher {
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

/// Descriptors a launcher starts with. `stdin` `None` is `/dev/null`; stderr is the
/// monitor's own.
pub struct LauncherFds<'a> {
    pub stdin: Option<&'a OwnedFd>,
    pub stdout: &'a OwnedFd,
    /// The monitor channel, fd 3 in the launcher.
    pub channel: &'a OwnedFd,
    /// The program's stderr, fd 4 in the launcher.
    pub program_stderr: &'a OwnedFd,
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains a NUL byte"))
}

/// What the child of [`spawn_launcher`] needs, made ready by the parent: the child runs on
/// the parent's memory and may not allocate, lock or unwind, only make system calls.
struct ChildPlan<'a> {
    program: proto::vfork::Program<'a>,
    /// Descriptor for fd 0; `None` opens `/dev/null`.
    stdin: Option<RawFd>,
    moves: [(RawFd, RawFd); 3],
}

/// The child: descriptors in place, SIGPIPE back to its default (this process ignores it,
/// and an ignored signal stays ignored across exec), no signal blocked, then exec.
/// Nothing else about signals changes: a signal this process ignores stays ignored in the
/// launcher, and none has a handler to reset (Zygo installs none; the supervisor reads its
/// signals from a signalfd), so none can run on this process's memory here.
extern "C" fn child_main(arg: *mut libc::c_void) -> ! {
    // SAFETY: `arg` is the parent's ChildPlan, which outlives this child: the parent is
    // suspended (CLONE_VFORK) until the exec below succeeds or this child exits.
    let plan = unsafe { &mut *arg.cast::<ChildPlan>() };
    // SAFETY: only async-signal-safe system calls on values the parent prepared; every
    // pointer in `plan` is valid until the parent resumes.
    unsafe {
        let stdin_ok = match plan.stdin {
            Some(fd) => libc::dup2(fd, 0) == 0,
            None => {
                let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
                fd == 0 || (fd > 0 && libc::dup2(fd, 0) == 0 && libc::close(fd) == 0)
            }
        };
        if stdin_ok
            && plan
                .moves
                .iter()
                .all(|&(from, to)| libc::dup2(from, to) == to)
        {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            plan.program.exec()
        }
        plan.program.fail()
    }
}

/// Spawn `exe __launcher` with `fds` in place, an empty signal mask, SIGPIPE at its
/// default, and an environment of only the logging variables.
///
/// The child is made by `proto::vfork`, as glibc's `posix_spawn` makes one, but without
/// `posix_spawn`'s pass over every signal (two calls per signal, ~50 µs, while this
/// process waits): nothing of this process's memory is copied, and this returns once the
/// exec is done or has failed.
pub fn spawn_launcher(exe: &Path, fds: LauncherFds<'_>) -> io::Result<Launcher> {
    let path = cstring(exe.as_os_str())?;
    let argv_c = [path.clone(), cstring(OsStr::new("__launcher"))?];
    let mut env_c: Vec<CString> = Vec::new();
    for key in ["RUST_LOG", "ZYGO_LOG"] {
        if let Some(v) = std::env::var_os(key) {
            let mut kv = OsStr::new(key).to_os_string();
            kv.push("=");
            kv.push(v);
            env_c.push(cstring(&kv)?);
        }
    }

    let moves: [(RawFd, RawFd); 3] = [
        (fds.stdout.as_raw_fd(), 1),
        (fds.channel.as_raw_fd(), 3),
        (fds.program_stderr.as_raw_fd(), 4),
    ];
    // No move may overwrite a source not yet moved: every source is above every target.
    if moves.iter().any(|&(src, _)| src <= 4) || fds.stdin.is_some_and(|f| f.as_raw_fd() <= 4) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a launcher descriptor is below 5",
        ));
    }
    let mut plan = ChildPlan {
        program: proto::vfork::Program::new(&path, &argv_c, &env_c),
        stdin: fds.stdin.map(|f| f.as_raw_fd()),
        moves,
    };
    // SAFETY: child_main only makes system calls with what `plan` points to, all of it
    // alive until this returns.
    let pid = unsafe { proto::vfork::spawn(child_main, (&mut plan as *mut ChildPlan).cast()) }?;
    let mut launcher = Launcher { pid, status: None };
    if plan.program.errno != 0 {
        // The child has exited (127) without exec: reap it.
        let _ = launcher.wait();
        return Err(io::Error::from_raw_os_error(plan.program.errno));
    }
    Ok(launcher)
}

/// A pidfd for `pid` (pidfd_open(2)), or `None` if the process is gone or the kernel has
/// no pidfds. It refers to that process even if the pid is later reused.
pub(crate) fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) with a plain pid and no flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: on success the kernel just gave us this descriptor; nothing else owns it.
    (fd >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process behind `pidfd` has not exited: then its pid still names it.
pub(crate) fn pidfd_alive(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with signal 0 only checks; no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Descriptors above 4 to hand a launcher: stdout, channel and program stderr.
    fn fds() -> (OwnedFd, OwnedFd, OwnedFd) {
        let open = || {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .expect("open /dev/null");
            crate::oneshot::high(&OwnedFd::from(f)).expect("dup above 10")
        };
        (open(), open(), open())
    }

    #[test]
    fn a_launcher_runs_and_is_reaped() {
        let (out, chan, err) = fds();
        let mut l = spawn_launcher(
            Path::new("/bin/true"),
            LauncherFds {
                stdin: None,
                stdout: &out,
                channel: &chan,
                program_stderr: &err,
            },
        )
        .expect("spawn /bin/true");
        assert!(l.wait().expect("wait").success());
    }

    #[test]
    fn a_missing_binary_is_an_error_the_child_reaped() {
        let (out, chan, err) = fds();
        let e = spawn_launcher(
            Path::new("/nonexistent/zygo"),
            LauncherFds {
                stdin: None,
                stdout: &out,
                channel: &chan,
                program_stderr: &err,
            },
        )
        .expect_err("no such binary");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
