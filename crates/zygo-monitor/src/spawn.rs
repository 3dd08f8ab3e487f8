//! Starting a launcher: the `zygo` binary re-executed in its launcher role, by the one
//! spawn every role is started with ([`plumbing::role::spawn`]); and pidfds, which name a
//! process even after its pid is reused.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use plumbing::role::{self, Role, RoleFds, Stdio};

/// A launcher process: its pid, and whether it has been reaped.
pub type Launcher = role::Child;

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

/// Spawn `exe __launcher` with `fds` in place (see [`plumbing::role`]).
pub fn spawn_launcher(exe: &Path, fds: LauncherFds<'_>) -> io::Result<Launcher> {
    role::spawn(
        exe,
        Role::Launcher,
        RoleFds {
            stdin: fds.stdin.map_or(Stdio::Null, |f| Stdio::Fd(f.as_fd())),
            stdout: Stdio::Fd(fds.stdout.as_fd()),
            channel: fds.channel.as_fd(),
            program_stderr: Some(fds.program_stderr.as_fd()),
        },
    )
}

/// A pidfd for `pid` (pidfd_open(2)), or `None` if the process is gone or the kernel has
/// no pidfds. It refers to that process even if the pid is later reused.
pub(crate) fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    plumbing::sys::pidfd_open(pid).ok()
}

/// Whether the process behind `pidfd` has not exited: then its pid still names it.
pub(crate) fn pidfd_alive(pidfd: &OwnedFd) -> bool {
    plumbing::sys::pidfd_alive(pidfd)
}
