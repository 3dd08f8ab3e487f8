//! The launcher: one process per sandbox, the `zygo` binary re-executed in its launcher
//! role by the monitor, holding one end of a socketpair on fd 3 (the layout is
//! [`plumbing::role`]'s).
//!
//! It builds the sandbox it is told to build — namespaces, a fresh root, pivot_root,
//! rlimits, no capabilities, no_new_privs, Landlock, and seccomp last — runs the program,
//! enforces the deadline, and reports what the kernel said. It decides no policy: the plan
//! arrives finished and checked. It trusts the monitor and nothing that runs in the sandbox.

mod agent_log;
mod agents;
/// Public only for the `agent_lines` fuzz target (`fuzz/`): [`child_line::parse`] is the
/// launcher's check of a request process's lines.
pub mod child_line;
pub mod harden;
mod ids;
pub mod relay;
mod rootfs;
pub mod sandbox;
mod scratch;
mod script_space;
pub mod seccomp;
mod sys;
pub mod workspace;
pub mod zygote;

use std::os::fd::AsRawFd;

use plumbing::Role;

use proto::launch::ToLauncher;

/// Entry point of the launcher role. Returns the process exit code.
pub fn main() -> i32 {
    // If the monitor dies, the launcher dies, and init's death signal takes the sandbox.
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // Only the descriptors of the launcher's layout survive: stdin, stdout, stderr, the
    // channel and the program's stderr.
    let mut sock = match Role::Launcher.take_channel() {
        Ok(s) => s,
        Err(e) => {
            log::error!("launcher: {e}; this role is started by the monitor, not by hand");
            return 2;
        }
    };
    // The plan, and possibly the cgroup files before it (a one-shot monitor sends them
    // after the plan, once it has made the cgroup; the launcher clones meanwhile).
    let mut attach = None;
    let mut handed = None;
    let plan = loop {
        match sandbox::read_launch_frame(sock.as_raw_fd()) {
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
    match sandbox::run(&mut sock, &plan, attach, handed.unwrap_or_default()) {
        Ok(()) => 0,
        Err(e) => {
            log::error!("launcher: {e}");
            1
        }
    }
}
