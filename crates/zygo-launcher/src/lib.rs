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

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use proto::launch::{ToLauncher, MAX_ATTACH_FILES, MAX_LAUNCH_FRAME};

/// The largest `Cgroup` frame payload (an enum tag and a small integer).
const MAX_CGROUP_FRAME: usize = 16;

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
    let attach = match read_cgroup_files(&sock) {
        Ok(files) => files,
        Err(e) => {
            log::error!("launcher: {e}; ending the channel");
            return 2;
        }
    };
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
    // Raw from here on: `oneshot::run` closes them once the sandbox's init holds its copies.
    let attach: Vec<RawFd> = attach.into_iter().map(IntoRawFd::into_raw_fd).collect();
    match oneshot::run(&mut sock, &plan, &attach) {
        Ok(()) => 0,
        Err(e) => {
            log::error!("launcher: {e}");
            1
        }
    }
}

/// The monitor's first frame, `Cgroup { files }`, and exactly that many descriptors with it.
fn read_cgroup_files(sock: &UnixStream) -> Result<Vec<OwnedFd>, String> {
    let fd = sock.as_raw_fd();
    let max = usize::from(MAX_ATTACH_FILES);
    let mut len = [0u8; 4];
    let mut fds = sys::recv_exact_with_fds(fd, &mut len, max)
        .map_err(|e| format!("read the cgroup frame: {e}"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_CGROUP_FRAME {
        return Err(format!(
            "a first frame of {len} bytes (a cgroup frame has at most {MAX_CGROUP_FRAME})"
        ));
    }
    let mut payload = [0u8; MAX_CGROUP_FRAME];
    let more = sys::recv_exact_with_fds(fd, &mut payload[..len], max - fds.len())
        .map_err(|e| format!("read the cgroup frame: {e}"))?;
    fds.extend(more);
    match proto::codec::decode::<ToLauncher>(&payload[..len]) {
        Ok(ToLauncher::Cgroup { files }) if usize::from(files) == fds.len() => Ok(fds),
        Ok(ToLauncher::Cgroup { files }) => Err(format!(
            "the cgroup frame announced {files} descriptors and carried {}",
            fds.len()
        )),
        Ok(other) => Err(format!("expected Cgroup, got {other:?}")),
        Err(e) => Err(format!("read the cgroup frame: {e}")),
    }
}
