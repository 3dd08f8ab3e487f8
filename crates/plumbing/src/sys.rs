//! System calls Zygo's roles share that `libc` has no wrapper for, each written once:
//! pidfds (a process named without pid-reuse races), and the new mount API's
//! `open_tree` and `mount_setattr` on descriptors.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A pidfd for `pid` (`pidfd_open(2)`): it refers to that process even if the pid is later
/// reused.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) with a plain pid and no flags returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process behind `pidfd` has not exited: then its pid still names it, and a
/// `/proc/<pid>` opened since the pidfd was made was that process's.
pub fn pidfd_alive(pidfd: &OwnedFd) -> bool {
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

/// `struct mount_attr` (include/uapi/linux/mount.h).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
/// `open_tree(2)`'s flag for a detached copy.
pub const OPEN_TREE_CLONE: libc::c_uint = 1;

/// `mount_setattr(2)` on `path` relative to `dirfd` (`c""` with `AT_EMPTY_PATH` in
/// `flags`: the mount `dirfd` itself is).
pub fn mount_setattr(
    dirfd: RawFd,
    path: &CStr,
    flags: libc::c_uint,
    attr: &MountAttr,
) -> io::Result<()> {
    // SAFETY: a valid C string and a properly sized mount_attr for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `open_tree(2)` of `path` relative to `dirfd`, with `flags` (`O_CLOEXEC` is added).
pub fn open_tree(dirfd: RawFd, path: &CStr, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: a valid C string; open_tree returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dirfd,
            path.as_ptr(),
            flags | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
