//! Starting a launcher: the `zygo` binary re-executed in its launcher role, by the one
//! spawn every role is started with ([`plumbing::role::spawn`]); and pidfds, which name a
//! process even after its pid is reused.

use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
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
