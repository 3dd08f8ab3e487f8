//! A request's own `/tmp` and `/work`, placed by the launcher from outside the sandbox.
//!
//! Each request's process makes a mount namespace (and an IPC namespace) of its own right
//! after its fork, while the agent's CAP_SYS_ADMIN still lets it, and registers. Landlock
//! refuses it every mount, so it cannot make its scratch space itself. The launcher holds
//! every capability over the sandbox's user namespace (as root, or as the user who created
//! it); at the zygote's start it forks a helper, the *mounter*, that enters that user
//! namespace (and so keeps no capability over the host's) and waits. For each request the
//! launcher checks the registered process, opens its mount namespace and hands that to the
//! mounter, which enters it, mounts a fresh tmpfs on `/tmp` and one on `/work`, goes back
//! to the sandbox's own mount namespace (holding nothing of the request's) and answers.
//! Whatever the request writes in them is seen by no other request and is gone when its
//! last process is: the namespace, and the mounts with it, go when nothing is left in it.
//! The relay never waits for the mounter: it polls the mounter's answers with the rest.

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

/// The mounter of one zygote (see the module's notes): a helper process, and the
/// requests handed to it, answered in order.
pub struct Mounter {
    pid: libc::pid_t,
    sock: OwnedFd,
    /// Slots handed over and not answered yet, oldest first.
    waiting: std::collections::VecDeque<String>,
}

/// What the mounter answers: a step (0 when all went well) and its errno.
const ANSWER: usize = 5;

impl Mounter {
    /// Fork the mounter for a sandbox whose requests' scratch space is `size` bytes each.
    pub fn start(sandbox: &SandboxNs, size: u64) -> Result<Mounter, ScratchError> {
        let opts = CString::new(format!("mode=1777,size={size}"))
            .map_err(|_| ScratchError("mount options with a NUL byte".into()))?;
        let (ours, theirs) = plumbing::pipes::socketpair(libc::SOCK_SEQPACKET)
            .map_err(|e| ScratchError(format!("create the mounter's socket: {e}")))?;
        // SAFETY: this process is single-threaded, so the forked child may go on running;
        // it only makes system calls (and ends with _exit).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(ScratchError(format!(
                "fork the mounter: {}",
                std::io::Error::last_os_error()
            )));
        }
        if pid == 0 {
            drop(ours);
            mounter_main(
                theirs.as_raw_fd(),
                sandbox.user.as_raw_fd(),
                sandbox.mnt.as_raw_fd(),
                &opts,
            );
        }
        drop(theirs);
        Ok(Mounter {
            pid,
            sock: ours,
            waiting: std::collections::VecDeque::new(),
        })
    }

    /// What to poll for the mounter's answers.
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Check the process `pid` registered for `slot` (see [`check`]) and hand its mount
    /// namespace to the mounter; the answer comes through [`Mounter::answer`].
    pub fn request(
        &mut self,
        slot: &str,
        pid: i32,
        sandbox: &SandboxNs,
    ) -> Result<(), ScratchError> {
        let mnt = check(pid, sandbox)?;
        plumbing::fds::send_with_fds(self.sock.as_raw_fd(), b"m", &[mnt.as_raw_fd()])
            .map_err(|e| ScratchError(format!("hand a request to the mounter: {e}")))?;
        self.waiting.push_back(slot.to_string());
        Ok(())
    }

    /// Shrink the `/tmp` and `/work` of the parked process `pid` of `slot` (checked as for
    /// [`Mounter::request`]) to `size` bytes each, before its request reaches it; the answer
    /// comes through [`Mounter::answer`] like a mount's.
    pub fn shrink(
        &mut self,
        slot: &str,
        pid: i32,
        sandbox: &SandboxNs,
        size: u64,
    ) -> Result<(), ScratchError> {
        let mnt = check(pid, sandbox)?;
        let mut msg = [0u8; 9];
        msg[0] = b's';
        msg[1..].copy_from_slice(&size.to_ne_bytes());
        plumbing::fds::send_with_fds(self.sock.as_raw_fd(), &msg, &[mnt.as_raw_fd()])
            .map_err(|e| ScratchError(format!("hand a request to the mounter: {e}")))?;
        self.waiting.push_back(slot.to_string());
        Ok(())
    }

    /// The next answer (poll said one is there): its slot, and, when the mounts (or the
    /// shrink) are done, the root of the request's new `/work` (after a mount; `None`
    /// after a shrink). `Err` when the mounter itself is gone or broke its protocol.
    #[allow(clippy::type_complexity)]
    pub fn answer(
        &mut self,
    ) -> Result<(String, Result<Option<OwnedFd>, ScratchError>), ScratchError> {
        let mut buf = [0u8; ANSWER];
        let (n, mut fds) = plumbing::fds::recv_with_fds(self.sock.as_raw_fd(), &mut buf, 1)
            .map_err(|e| ScratchError(format!("the mounter's answer: {e}")))?;
        if n != ANSWER {
            return Err(ScratchError("the mounter ended".into()));
        }
        let slot = self
            .waiting
            .pop_front()
            .ok_or_else(|| ScratchError("the mounter answered what nobody asked".into()))?;
        let errno = i32::from_ne_bytes([buf[1], buf[2], buf[3], buf[4]]);
        let why = std::io::Error::from_raw_os_error(errno);
        let result = match buf[0] {
            0 => Ok(fds.pop()),
            11 => Err(ScratchError(format!(
                "enter the request's mount namespace: {why}"
            ))),
            12 => Err(ScratchError(format!(
                "mount the request's /tmp and /work: {why}"
            ))),
            14 => Err(ScratchError(format!(
                "shrink the request's /tmp and /work: {why}"
            ))),
            15 => Err(ScratchError(format!("open the request's new /work: {why}"))),
            13 => Err(ScratchError(format!(
                "leave the request's mount namespace: {why}"
            ))),
            other => Err(ScratchError(format!(
                "the mounter failed at step {other}: {why}"
            ))),
        };
        Ok((slot, result))
    }
}

impl Drop for Mounter {
    /// Closing its socket ends the mounter; it is reaped here.
    fn drop(&mut self) {
        // SAFETY: shutting down a socket we hold (the descriptor itself closes after).
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        let mut status = 0;
        // SAFETY: reaping our own child.
        while unsafe { libc::waitpid(self.pid, &mut status, libc::__WALL) } < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
    }
}

/// The mounter: enter the sandbox's user namespace, then for each mount namespace handed
/// over, enter it, mount, come back, answer. Never returns.
fn mounter_main(sock: RawFd, user: RawFd, home: RawFd, opts: &CString) -> ! {
    let _ = crate::sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // Nothing of the launcher's but what this needs.
    crate::sys::close_fds_from(3, &[sock, user, home]);

    // With the root of the request's new /work when all went well.
    let answer_with = |step: u8, errno: i32, work: &[RawFd]| {
        let mut buf = [0u8; ANSWER];
        buf[0] = step;
        buf[1..].copy_from_slice(&errno.to_ne_bytes());
        let _ = plumbing::fds::send_with_fds(sock, &buf, work);
    };
    let answer = |step: u8, errno: i32| answer_with(step, errno, &[]);
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: setns with a namespace descriptor we hold; this process is single-threaded.
    if unsafe { libc::setns(user, libc::CLONE_NEWUSER) } != 0 {
        // Every answer says so; the launcher parks nothing.
        let e = errno();
        loop {
            let mut tag = [0u8; 1];
            match plumbing::fds::recv_with_fds(sock, &mut tag, 1) {
                Ok((1, _)) => answer(10, e),
                _ => exit_now(1),
            }
        }
    }
    let fstype = c"tmpfs";
    loop {
        // `m`: mount a request's /tmp and /work; `s` and a size: shrink them to it.
        let mut msg = [0u8; 9];
        let (fds, shrink) = match plumbing::fds::recv_with_fds(sock, &mut msg, 1) {
            Ok((1, fds)) if msg[0] == b'm' && fds.len() == 1 => (fds, None),
            Ok((9, fds)) if msg[0] == b's' && fds.len() == 1 => {
                let mut size = [0u8; 8];
                size.copy_from_slice(&msg[1..]);
                match CString::new(format!("size={}", u64::from_ne_bytes(size))) {
                    Ok(o) => (fds, Some(o)),
                    Err(_) => exit_now(1),
                }
            }
            _ => exit_now(0),
        };
        let mnt = fds[0].as_raw_fd();
        let mut work: RawFd = -1;
        // SAFETY: setns, mount and open with descriptors and C strings that are valid here.
        let (step, e) = unsafe {
            if libc::setns(mnt, libc::CLONE_NEWNS) != 0 {
                (11, errno())
            } else {
                let mut failed = (0, 0);
                for target in [c"/tmp", c"/work"] {
                    let done = match &shrink {
                        None => libc::mount(
                            fstype.as_ptr(),
                            target.as_ptr(),
                            fstype.as_ptr(),
                            libc::MS_NOSUID | libc::MS_NODEV,
                            opts.as_ptr().cast(),
                        ),
                        // The same flags again (a remount may not drop them), a smaller
                        // size: tmpfs refuses one below what is in use (nothing, here).
                        Some(size) => libc::mount(
                            std::ptr::null(),
                            target.as_ptr(),
                            std::ptr::null(),
                            libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV,
                            size.as_ptr().cast(),
                        ),
                    };
                    if done != 0 {
                        failed = (if shrink.is_some() { 14 } else { 12 }, errno());
                        break;
                    }
                }
                // The new /work's root, opened here, where only the request's own (parked,
                // waiting) process can see it: the launcher makes the request's directory
                // in it and unpacks its workspace through it.
                if failed.0 == 0 && shrink.is_none() {
                    work = libc::open(
                        c"/work".as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    );
                    if work < 0 {
                        failed = (15, errno());
                    }
                }
                // Back home: the request's namespace is held by nothing of ours.
                if libc::setns(home, libc::CLONE_NEWNS) != 0 && failed.0 == 0 {
                    failed = (13, errno());
                }
                failed
            }
        };
        drop(fds);
        if step == 0 && work >= 0 {
            answer_with(0, 0, &[work]);
        } else {
            answer(step, e);
        }
        if work >= 0 {
            crate::sys::close(work);
        }
    }
}

fn exit_now(code: libc::c_int) -> ! {
    // SAFETY: _exit ends this process without running anything of the launcher's.
    unsafe { libc::_exit(code) }
}

/// The mount namespace of the process `pid` (a request's process, host pid), once checked.
///
/// The pid is what the kernel said of a registration's sender, which may have exited since
/// and its number gone to another process, anywhere on the host. So the process behind it
/// now is taken by a pidfd, its namespaces are opened, and it must still be alive after
/// that (its number was then not reused in between), in the sandbox's user and pid
/// namespaces, and in a mount namespace that is not the sandbox's own (mounts made there
/// would cover the sandbox's /tmp and /work, for every request to share).
pub fn check(pid: i32, sandbox: &SandboxNs) -> Result<OwnedFd, ScratchError> {
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
    Ok(mnt)
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
        let refused = |pid: u32| match check(pid as i32, &ns) {
            Ok(_) => panic!("process {pid} passed the check"),
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
