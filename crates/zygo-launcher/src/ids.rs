//! Host ids of one sandbox (as root): id 0 inside is a host uid of this sandbox's own.
//!
//! The kernel counts some allowances per host user and checks them against every process
//! of that user, wherever it runs: pipe buffer pages (`fs.pipe-user-pages-soft`, past which
//! new pipes get one page and `F_SETPIPE_SZ` fails), descriptors in flight over unix
//! sockets (checked against `RLIMIT_NOFILE`, past which `SCM_RIGHTS` fails with
//! `ETOOMANYREFS`) and epoll watches. If id 0 of every sandbox were the same host uid,
//! one sandbox could use these up for all of them. So id 0 inside maps onto the
//! sandbox's owner id (see `IdMap::Range`), which no other live sandbox has; ids 1..count
//! map onto the shared range as before (no process of a one-shot sandbox can become one of
//! them: it has no capabilities).
//!
//! Files keep one owner on disk, whatever sandbox wrote them: a host folder handed into
//! the sandbox (a workspace, a `--mount`) is mounted *idmapped*, so that on disk the
//! sandbox's root is still `uid_base` (as it was when every sandbox's root was that id)
//! and the next sandbox, with another uid, owns the same files. A folder on a filesystem
//! that cannot be idmapped (proc, sysfs, some network filesystems, tmpfs before Linux 6.3)
//! is mounted as it is when read-only (that changes nothing the sandbox could do), and a
//! writable one is refused: the sandbox would leave files of its own uid there.
//!
//! Every handed tree is also made private first (recursively): a clone of a shared mount
//! would otherwise stay a peer of the host's, and a mount made under it would show on the
//! host.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use plumbing::sys::{MountAttr, MOUNT_ATTR_IDMAP};

/// A child of this process, killed already, reaped when this is dropped: waiting for it to
/// exit would put a trip through the scheduler on the sandbox's start.
pub struct Reap(libc::pid_t);

impl Drop for Reap {
    fn drop(&mut self) {
        let mut status = 0;
        // SAFETY: our own child, killed, not yet reaped.
        while unsafe { libc::waitpid(self.0, &mut status, 0) } < 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
    }
}

/// Mount every tree in `trees` (detached, from the monitor) idmapped: host uid `root` (the
/// sandbox's id 0) reads and writes as `uid_base` on disk; every other id as itself.
/// Returns the child to reap once the sandbox is under way (if one was made), and for each
/// tree whether it is idmapped.
pub fn idmap_trees<'a>(
    trees: impl ExactSizeIterator<Item = &'a OwnedFd>,
    uid_base: u32,
    count: u32,
    root: u32,
) -> io::Result<(Option<Reap>, Vec<io::Result<()>>)> {
    if trees.len() == 0 {
        return Ok((None, Vec::new()));
    }
    let (userns, child) = mapping_namespace(uid_base, count, root)?;
    let mut done = Vec::new();
    for tree in trees {
        let private = MountAttr {
            attr_set: 0,
            attr_clr: 0,
            propagation: libc::MS_PRIVATE,
            userns_fd: 0,
        };
        let r = plumbing::sys::mount_setattr(
            tree.as_raw_fd(),
            c"",
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &private,
        );
        if let Err(e) = r {
            done.push(Err(e));
            continue;
        }
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        done.push(plumbing::sys::mount_setattr(
            tree.as_raw_fd(),
            c"",
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr,
        ));
    }
    Ok((Some(child), done))
}

/// The uid map of the idmapping namespace: on-disk id `uid_base` is host `root`; ids below
/// `uid_base` and the rest of the mapped range are themselves. (`root` lies past the
/// mapped range, so no two lines overlap on either side.)
pub fn mount_uid_map(uid_base: u32, count: u32, root: u32) -> String {
    let mut s = format!("0 0 {uid_base}\n{uid_base} {root} 1\n");
    if count > 1 {
        s.push_str(&format!(
            "{} {} {}\n",
            uid_base + 1,
            uid_base + 1,
            count - 1
        ));
    }
    s
}

/// A user namespace holding the mapping of [`mount_uid_map`] (gids unchanged), made by a
/// child that is killed as soon as its maps are written and the namespace is held (it
/// never needs to run).
fn mapping_namespace(uid_base: u32, count: u32, root: u32) -> io::Result<(OwnedFd, Reap)> {
    // SAFETY: a raw clone with a null stack behaves like fork; the launcher is
    // single-threaded, and the child only calls async-signal-safe functions.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: the child waits to be killed (or for the launcher's death).
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            loop {
                libc::pause();
            }
        }
    }
    let pid = pid as libc::pid_t;
    let made = (|| {
        std::fs::write(
            format!("/proc/{pid}/uid_map"),
            mount_uid_map(uid_base, count, root),
        )?;
        std::fs::write(format!("/proc/{pid}/gid_map"), "0 0 4294967295\n")?;
        let path = std::ffi::CString::new(format!("/proc/{pid}/ns/user"))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a valid C string.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })();
    // SAFETY: our own child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let child = Reap(pid);
    made.map(|ns| (ns, child))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_map_sends_the_shared_root_to_the_sandboxs_own() {
        assert_eq!(
            mount_uid_map(1000, 131072, 1000 + 131072 + 7),
            "0 0 1000\n1000 132079 1\n1001 1001 131071\n"
        );
        assert_eq!(mount_uid_map(1000, 1, 1005), "0 0 1000\n1000 1005 1\n");
    }
}
