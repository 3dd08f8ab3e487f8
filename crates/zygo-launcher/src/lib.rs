//! The launcher: one process per sandbox, the `zygo` binary re-executed in its launcher
//! role by the monitor, holding one end of a socketpair on fd 3.
//!
//! It builds the sandbox it is told to build — namespaces, a fresh root, pivot_root,
//! rlimits, no capabilities, no_new_privs, Landlock, and seccomp last — runs the program,
//! enforces the deadline, and reports what the kernel said. It decides no policy: the plan
//! arrives finished and checked. It trusts the monitor and nothing that runs in the sandbox.

pub mod harden;
pub mod oneshot;
mod rootfs;
pub mod seccomp;
mod sys;
pub mod zygote;

use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

use proto::launch::{ToLauncher, MAX_LAUNCH_FRAME};

/// Entry point of the launcher role. Returns the process exit code.
pub fn main() -> i32 {
    // If the monitor dies, the launcher dies, and init's death signal takes the sandbox.
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // Only the descriptors of the launcher contract survive: the channel, the program's
    // stderr, and the sandbox's cgroup attach files (fds 5.., as many as the monitor said).
    let attach_count: i32 = std::env::var("ZYGO_ATTACH_FDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (0..=8).contains(n))
        .unwrap_or(0);
    let attach: Vec<i32> = (0..attach_count)
        .map(|i| oneshot::FD_PROGRAM_STDERR + 1 + i)
        .collect();
    sys::close_fds_from(oneshot::FD_PROGRAM_STDERR + 1 + attach_count, &[]);
    for fd in [oneshot::FD_MONITOR, oneshot::FD_PROGRAM_STDERR]
        .iter()
        .chain(attach.iter())
    {
        let _ = sys::set_cloexec(*fd);
    }
    // SAFETY: fd 3 is the monitor's socketpair end by the launcher contract; owned here once.
    let mut sock = unsafe { UnixStream::from_raw_fd(oneshot::FD_MONITOR) };
    let plan = match proto::read_frame::<_, ToLauncher>(&mut sock, MAX_LAUNCH_FRAME) {
        Ok(ToLauncher::Start(plan)) => plan,
        Ok(other) => {
            log::error!("launcher: expected Start, got {other:?}; ending the channel");
            return 2;
        }
        Err(e) => {
            log::error!("launcher: {e}; ending the channel");
            return 2;
        }
    };
    match oneshot::run(&mut sock, &plan, &attach) {
        Ok(()) => 0,
        Err(e) => {
            log::error!("launcher: {e}");
            1
        }
    }
}
