//! Starting a launcher: the `zygo` binary re-executed in its launcher role, by the one
//! spawn every role is started with ([`plumbing::role::spawn`]).

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
