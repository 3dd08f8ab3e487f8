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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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

/// A helper mounting a request's scratch space, running: the relay polls [`Mounting::fd`]
/// and, once it is readable (the helper has exited), calls [`Mounting::finish`]. The relay
/// never waits for it, so it goes on relaying other requests meanwhile.
pub struct Mounting {
    /// Until it is reaped.
    helper: Option<libc::pid_t>,
    /// The helper's errno comes back on this pipe; its end means the helper is done.
    done: OwnedFd,
}

impl Mounting {
    pub fn fd(&self) -> RawFd {
        self.done.as_raw_fd()
    }

    /// The helper has finished (its pipe ended): reap it, and say whether the mounts are
    /// in place.
    pub fn finish(mut self) -> Result<(), ScratchError> {
        let Some(helper) = self.helper.take() else {
            return Err(ScratchError("the scratch helper was reaped already".into()));
        };
        let mut errno = [0u8; 4];
        let why = match crate::sys::read_fd(self.done.as_raw_fd(), &mut errno) {
            Ok(4) => std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno)).to_string(),
            _ => "no reason given".into(),
        };
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child, which has closed its pipe (exiting).
            let r = unsafe { libc::waitpid(helper, &mut status, libc::__WALL) };
            if r == helper {
                break;
            }
            if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return Err(ScratchError(format!(
                    "wait for the scratch helper: {}",
                    std::io::Error::last_os_error()
                )));
            }
        }
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
}

impl Drop for Mounting {
    /// A helper nobody waits for any more (its slot was dropped, the zygote is ending): it
    /// ends in a moment anyway (two setns and two mounts); reap it so it does not linger.
    fn drop(&mut self) {
        if let Some(helper) = self.helper.take() {
            let mut status = 0;
            // SAFETY: reaping our own child, not reaped before.
            while unsafe { libc::waitpid(helper, &mut status, libc::__WALL) } < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
        }
    }
}

/// The namespaces of the sandbox's init (opened through `/proc/<init>/ns/`): a request's
/// process must be in the same user and pid namespaces, and in a mount namespace of its
/// own.
pub struct SandboxNs {
    pub user: OwnedFd,
    pub pid: OwnedFd,
    pub mnt: OwnedFd,
}

impl SandboxNs {
    pub fn of(init: libc::pid_t) -> Result<SandboxNs, ScratchError> {
        Ok(SandboxNs {
            user: open_ns(init, "user")?,
            pid: open_ns(init, "pid")?,
            mnt: open_ns(init, "mnt")?,
        })
    }
}

/// Start mounting a fresh `/tmp` and `/work` (tmpfs, `size` bytes each) in the mount
/// namespace of `pid` (a request's process, host pid).
///
/// The pid is what the kernel said of a registration's sender, which may have exited since
/// and its number gone to another process, anywhere on the host. So the process behind it
/// now is taken by a pidfd, its namespaces are opened, and it must still be alive after
/// that (its number was then not reused in between), in the sandbox's user and pid
/// namespaces, and in a mount namespace that is not the sandbox's own (mounts made there
/// would cover the sandbox's /tmp and /work, for every request to share).
pub fn start(pid: i32, sandbox: &SandboxNs, size: u64) -> Result<Mounting, ScratchError> {
    let pidfd = crate::sys::pidfd_open(pid)
        .map_err(|e| ScratchError(format!("open process {pid}: {e}")))?;
    let user = open_ns(pid, "user")?;
    let pid_ns = open_ns(pid, "pid")?;
    let mnt = open_ns(pid, "mnt")?;
    if !alive(&pidfd) {
        return Err(ScratchError(format!(
            "process {pid} exited before its scratch space was mounted"
        )));
    }
    let same = |a: &OwnedFd, b: &OwnedFd| match (inode(a), inode(b)) {
        (Some(x), Some(y)) => Ok(x == y),
        _ => Err(ScratchError("compare namespaces: fstat failed".into())),
    };
    if !same(&user, &sandbox.user)? || !same(&pid_ns, &sandbox.pid)? {
        return Err(ScratchError(format!(
            "process {pid} is not in the sandbox (it left, and its number went to another process)"
        )));
    }
    if same(&mnt, &sandbox.mnt)? {
        return Err(ScratchError(
            "the request's process has no mount namespace of its own".into(),
        ));
    }
    let opts = CString::new(format!("mode=1777,size={size}"))
        .map_err(|_| ScratchError("mount options with a NUL byte".into()))?;
    let fstype = c"tmpfs";
    let targets = [c"/tmp", c"/work"];
    // The helper's errno, if a step fails, comes back on this pipe; its end says it is done.
    let (done_r, done_w) =
        crate::sys::pipe_cloexec().map_err(|e| ScratchError(format!("create a pipe: {e}")))?;
    // SAFETY: this process is single-threaded, so the forked child may go on running; it
    // only makes system calls on values prepared above, and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        crate::sys::close(done_r);
        crate::sys::close(done_w);
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
                libc::write(done_w, (&errno as *const libc::c_int).cast(), 4);
            }
            libc::_exit(code)
        }
    }
    crate::sys::close(done_w);
    // SAFETY: the pipe's read end, ours alone from here on.
    let done = unsafe { OwnedFd::from_raw_fd(done_r) };
    Ok(Mounting {
        helper: Some(child),
        done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    /// A `sleep` in a user and mount namespace of its own, once it is in them.
    fn in_own_namespaces() -> Child {
        let mut child = Command::new("unshare")
            .args(["-Urm", "--", "sleep", "30"])
            .spawn()
            .expect("run unshare");
        let ours = std::fs::read_link("/proc/self/ns/user").expect("our user namespace");
        let path = format!("/proc/{}/ns/user", child.id());
        for _ in 0..500 {
            if std::fs::read_link(&path).is_ok_and(|ns| ns != ours) {
                return child;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("unshare did not enter its namespaces");
    }

    #[test]
    fn a_process_outside_the_sandbox_or_in_its_mount_namespace_gets_no_mounts() {
        // One stands for the sandbox; the other for a process elsewhere on the host that
        // took the number of a registration's sender after it exited.
        let mut sandbox = in_own_namespaces();
        let mut stranger = in_own_namespaces();
        let ns = SandboxNs::of(sandbox.id() as i32).expect("the sandbox's namespaces");
        let refused = |pid: u32| match start(pid as i32, &ns, 1 << 20) {
            Ok(m) => {
                let _ = m.finish();
                panic!("mounts were started in process {pid}")
            }
            Err(e) => e.to_string(),
        };
        let why = refused(stranger.id());
        assert!(why.contains("not in the sandbox"), "{why}");
        // In the sandbox's own mount namespace: mounts there would be every request's.
        let why = refused(sandbox.id());
        assert!(why.contains("no mount namespace of its own"), "{why}");
        for c in [&mut sandbox, &mut stranger] {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Gone: refused too, whatever its number is now.
        let why = refused(stranger.id());
        assert!(!why.is_empty());
    }
}
