//! Signals a long-lived Zygo process handles itself: blocked in the calling thread (and so
//! in every thread it starts after), then read from a signalfd or waited for by a thread of
//! its own. No handler ever runs on a Zygo process's memory.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Block `signals` in the calling thread; the set blocked, to wait on or to read through
/// [`signalfd`].
pub fn block_signals(signals: &[libc::c_int]) -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: building a signal set on the stack and blocking it in this thread.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
    }
    Ok(set)
}

/// A non-blocking, close-on-exec signalfd for `set` (blocked first with [`block_signals`]).
pub fn signalfd(set: &libc::sigset_t) -> io::Result<OwnedFd> {
    // SAFETY: a valid signal set; the kernel returns a new descriptor or -1.
    let fd = unsafe { libc::signalfd(-1, set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
