//! Pipes, socket pairs and descriptor flags: every descriptor Zygo's own processes make for
//! one another is close-on-exec from the start, and crosses an exec only where a spawn puts
//! it in place on purpose (`dup2`, which clears the flag on the copy). And the one
//! `/dev/null` a process drops what a pipe carries past its cap into ([`dev_null`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A pipe with both ends close-on-exec: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a two-element array as pipe2 requires.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A connected pair of close-on-exec unix sockets of `kind` (`SOCK_STREAM`,
/// `SOCK_SEQPACKET`, `SOCK_DGRAM`).
pub fn socketpair(kind: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a two-element array as socketpair requires.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            kind | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair returned two fresh descriptors that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Set close-on-exec on a descriptor this process holds.
pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number; at worst EBADF.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A close-on-exec duplicate of `fd` at descriptor number `min` or above, so that moving
/// descriptors into a child's fixed places cannot clobber one not moved yet.
pub fn dup_above(fd: &impl AsRawFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor at `min` or above, or -1.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl returned a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// `/dev/null`, opened once for the life of the process (write-only, close-on-exec):
/// where what a pipe carries past its cap is spliced to be dropped. `None` if it could not
/// be opened.
pub fn dev_null() -> Option<&'static std::fs::File> {
    static NULL: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    NULL.get_or_init(|| {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .ok()
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cloexec(fd: RawFd) -> bool {
        // SAFETY: F_GETFD on an open descriptor.
        unsafe { libc::fcntl(fd, libc::F_GETFD) & libc::FD_CLOEXEC != 0 }
    }

    #[test]
    fn everything_made_here_is_close_on_exec() {
        let (r, w) = pipe().expect("pipe");
        let (a, b) = socketpair(libc::SOCK_STREAM).expect("socketpair");
        let hi = dup_above(&r, 20).expect("dup");
        assert!(hi.as_raw_fd() >= 20);
        for fd in [&r, &w, &a, &b, &hi] {
            assert!(cloexec(fd.as_raw_fd()));
        }
    }
}
