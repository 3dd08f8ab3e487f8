//! A request's own `/tmp` and `/work`, placed by the launcher from outside the sandbox.
//!
//! Each request's process makes a mount namespace (and an IPC namespace) of its own right
//! after its fork, while the agent's CAP_SYS_ADMIN still lets it, and registers. Landlock
//! refuses it every mount, so it cannot make its scratch space itself: the launcher, which
//! holds every capability over the sandbox's user namespace (as root, or as the user who
//! created it), forks a helper that enters that process's user and mount namespaces and
//! mounts a fresh tmpfs on `/tmp` and one on `/work` there. Whatever the request writes in
//! them is seen by no other request and is gone when its last process is: the namespace,
//! and the mounts with it, go when nothing is left in it.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Why a request could not be given its scratch space.
#[derive(Debug)]
pub struct ScratchError(pub String);

impl std::fmt::Display for ScratchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn open_ns(pid: i32, which: &str) -> Result<OwnedFd, ScratchError> {
    let path = CString::new(format!("/proc/{pid}/ns/{which}"))
        .map_err(|_| ScratchError("a namespace path with a NUL byte".into()))?;
    // SAFETY: open with a valid C string; the descriptor is ours.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(ScratchError(format!(
            "open the {which} namespace of process {pid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn inode(fd: &OwnedFd) -> Option<(u64, u64)> {
    // SAFETY: fstat into a zeroed stat buffer, on a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Whether the process behind `pidfd` is still alive: then a `/proc/<pid>` opened since
/// `pidfd` was made was that process's (its pid cannot have been reused meanwhile).
fn alive(pidfd: &OwnedFd) -> bool {
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

/// Mount a fresh `/tmp` and `/work` (tmpfs, `size` bytes each) in the mount namespace of
/// `pid` (a request's process, host pid), which must not be the sandbox's own: `sandbox_mnt`
/// is the namespace of the sandbox's init.
pub fn give(pid: i32, sandbox_mnt: &OwnedFd, size: u64) -> Result<(), ScratchError> {
    let pidfd = crate::sys::pidfd_open(pid)
        .map_err(|e| ScratchError(format!("open process {pid}: {e}")))?;
    let user = open_ns(pid, "user")?;
    let mnt = open_ns(pid, "mnt")?;
    if !alive(&pidfd) {
        return Err(ScratchError(format!(
            "process {pid} exited before its scratch space was mounted"
        )));
    }
    // A process that did not make its own mount namespace would have these mounts made over
    // the sandbox's /tmp and /work, for every request to share: refuse it.
    match (inode(&mnt), inode(sandbox_mnt)) {
        (Some(a), Some(b)) if a != b => {}
        (Some(_), Some(_)) => {
            return Err(ScratchError(
                "the request's process has no mount namespace of its own".into(),
            ))
        }
        _ => {
            return Err(ScratchError(
                "compare mount namespaces: fstat failed".into(),
            ))
        }
    }
    let opts = CString::new(format!("mode=1777,size={size}"))
        .map_err(|_| ScratchError("mount options with a NUL byte".into()))?;
    let fstype = c"tmpfs";
    let targets = [c"/tmp", c"/work"];
    // The helper's errno, if a step fails, comes back on this pipe.
    let (err_r, err_w) =
        crate::sys::pipe_cloexec().map_err(|e| ScratchError(format!("create a pipe: {e}")))?;
    // SAFETY: this process is single-threaded, so the forked child may go on running; it
    // only makes system calls on values prepared above, and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        crate::sys::close(err_r);
        crate::sys::close(err_w);
        return Err(ScratchError(format!(
            "fork a helper to mount the request's scratch space: {}",
            std::io::Error::last_os_error()
        )));
    }
    if child == 0 {
        // SAFETY: setns and mount with descriptors and C strings that are valid here; the
        // exit status names the step that failed, and its errno goes up the pipe.
        unsafe {
            let code = if libc::setns(user.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
                10
            } else if libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                11
            } else if targets.iter().any(|t| {
                libc::mount(
                    fstype.as_ptr(),
                    t.as_ptr(),
                    fstype.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    opts.as_ptr().cast(),
                ) != 0
            }) {
                12
            } else {
                0
            };
            if code != 0 {
                let errno = *libc::__errno_location();
                libc::write(err_w, (&errno as *const libc::c_int).cast(), 4);
            }
            libc::_exit(code)
        }
    }
    crate::sys::close(err_w);
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(child, &mut status, libc::__WALL) };
        if r == child {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(ScratchError(format!(
                "wait for the scratch helper: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    let mut errno = [0u8; 4];
    let why = match crate::sys::read_fd(err_r, &mut errno) {
        Ok(4) => std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno)).to_string(),
        _ => "no reason given".into(),
    };
    crate::sys::close(err_r);
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, 10) => Err(ScratchError(format!(
            "enter the sandbox's user namespace: {why}"
        ))),
        (true, 11) => Err(ScratchError(format!(
            "enter the request's mount namespace: {why}"
        ))),
        (true, 12) => Err(ScratchError(format!(
            "mount the request's /tmp and /work: {why}"
        ))),
        _ => Err(ScratchError(format!(
            "the scratch helper ended with status {status:#x}"
        ))),
    }
}
