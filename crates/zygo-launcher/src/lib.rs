//! The launcher: one process per sandbox, the `zygo` binary re-executed in its launcher
//! role by the monitor, holding one end of a socketpair on fd 3.
//!
//! It builds the sandbox it is told to build — namespaces, a fresh root, pivot_root,
//! rlimits, no capabilities, no_new_privs, Landlock, and seccomp last — runs the program,
//! enforces the deadline, and reports what the kernel said. It decides no policy: the plan
//! arrives finished and checked. It trusts the monitor and nothing that runs in the sandbox.

mod agent_log;
mod agents;
pub mod harden;
pub mod oneshot;
mod rootfs;
mod scratch;
mod script_space;
pub mod seccomp;
mod sys;
pub mod workspace;
pub mod zygote;

use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;

use proto::launch::ToLauncher;

/// Entry point of the launcher role. Returns the process exit code.
pub fn main() -> i32 {
    // If the monitor dies, the launcher dies, and init's death signal takes the sandbox.
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // Only the descriptors of the launcher contract survive: stdin, stdout, stderr, the
    // channel and the program's stderr.
    sys::close_fds_from(oneshot::FD_PROGRAM_STDERR + 1, &[]);
    for fd in [oneshot::FD_MONITOR, oneshot::FD_PROGRAM_STDERR] {
        let _ = sys::set_cloexec(fd);
    }
    // SAFETY: fd 3 is the monitor's socketpair end by the launcher contract; owned here once.
    let mut sock = unsafe { UnixStream::from_raw_fd(oneshot::FD_MONITOR) };
    // The plan, and possibly the cgroup files before it (a one-shot monitor sends them
    // after the plan, once it has made the cgroup; the launcher clones meanwhile).
    let mut attach = None;
    let mut handed = None;
    let plan = loop {
        match oneshot::read_launch_frame(sock.as_raw_fd()) {
            Ok((ToLauncher::Start(plan), _)) => break plan,
            Ok((ToLauncher::Cgroup { .. }, fds)) if attach.is_none() => attach = Some(fds),
            Ok((ToLauncher::Mounts { .. }, fds)) if handed.is_none() => handed = Some(fds),
            Ok((other, _)) => {
                log::error!("launcher: expected Start, got {other:?}; ending the channel");
                return 2;
            }
            Err(e) => {
                log::error!("launcher: {e}; ending the channel");
                return 2;
            }
        }
    };
    match oneshot::run(&mut sock, &plan, attach, handed.unwrap_or_default()) {
        Ok(()) => 0,
        Err(e) => {
            log::error!("launcher: {e}");
            1
        }
    }
}
