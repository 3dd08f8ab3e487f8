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
//! Files keep their owner on disk, whatever sandbox wrote them: a host folder handed into
//! the sandbox (a workspace, a `--mount`, a function's `mounts`) is mounted *idmapped*, so
//! that on disk the sandbox's id 0 is the owner the monitor named for that folder
//! (`DiskOwner`): a writable folder's own owner (root's folder, root's files; the owner's
//! files are id 0's inside), and the subordinate range's base in a read-only one. Each
//! sandbox has another host uid, and every one of them writes as that same owner. A folder
//! on a filesystem that cannot be idmapped (proc, sysfs, some network filesystems, tmpfs
//! before Linux 6.3) is mounted as it is when read-only (that changes nothing the sandbox
//! could do), and a writable one is refused: the sandbox would leave files of its own uid
//! there.
//!
//! Every handed tree is also made private first (recursively): a clone of a shared mount
//! would otherwise stay a peer of the host's, and a mount made under it would show on the
//! host.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use plumbing::sys::{MountAttr, MOUNT_ATTR_IDMAP};
use proto::launch::DiskOwner;

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

/// Mount every tree in `trees` (detached, from the monitor) idmapped for the owner named
/// with it: host ids `root_uid` and `root_gid` (the sandbox's id 0) read and write as that
/// owner on disk; every other id as itself. Returns the children to reap once the sandbox
/// is under way (one per distinct owner), and for each tree whether it is idmapped.
pub fn idmap_trees(
    trees: &[(&OwnedFd, DiskOwner)],
    root_uid: u32,
    root_gid: u32,
) -> io::Result<(Vec<Reap>, Vec<io::Result<()>>)> {
    let mut children = Vec::new();
    let mut namespaces: Vec<(DiskOwner, OwnedFd)> = Vec::new();
    let mut done = Vec::with_capacity(trees.len());
    for &(tree, owner) in trees {
        let userns = match namespaces.iter().find(|(o, _)| *o == owner) {
            Some((_, ns)) => ns.as_raw_fd(),
            None => {
                let (ns, child) = mapping_namespace(
                    &mount_id_map(owner.uid, root_uid),
                    &mount_id_map(owner.gid, root_gid),
                )?;
                children.push(child);
                namespaces.push((owner, ns));
                namespaces[namespaces.len() - 1].1.as_raw_fd()
            }
        };
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
            userns_fd: userns as u64,
        };
        done.push(plumbing::sys::mount_setattr(
            tree.as_raw_fd(),
            c"",
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr,
        ));
    }
    Ok((children, done))
}

/// One id map (of uids or of gids) of an idmapping namespace: on-disk id `disk` is host id
/// `host` (the sandbox's id 0 there); every other id is itself, except those two, which
/// stay unmapped on the side where the pair took them (no other process writes as `disk`,
/// and no file on disk reads as `host`). Covers every valid id, `0 ..= u32::MAX - 1`.
pub fn mount_id_map(disk: u32, host: u32) -> String {
    const END: u64 = u32::MAX as u64;
    let mut holes = [u64::from(disk), u64::from(host)];
    holes.sort_unstable();
    let mut s = String::new();
    let mut from = 0u64;
    for hole in holes {
        if hole > from {
            s.push_str(&format!("{from} {from} {}\n", hole - from));
        }
        from = from.max(hole + 1);
    }
    if END > from {
        s.push_str(&format!("{from} {from} {}\n", END - from));
    }
    s.push_str(&format!("{disk} {host} 1\n"));
    s
}

/// A user namespace holding these maps (see [`mount_id_map`]), made by a child that is
/// killed as soon as its maps are written and the namespace is held (it never needs to
/// run).
fn mapping_namespace(uid_map: &str, gid_map: &str) -> io::Result<(OwnedFd, Reap)> {
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
        std::fs::write(format!("/proc/{pid}/uid_map"), uid_map)?;
        std::fs::write(format!("/proc/{pid}/gid_map"), gid_map)?;
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
    fn the_mount_map_makes_the_sandboxs_root_the_folders_owner() {
        // Root's folder, a sandbox whose id 0 is host uid 2000131079.
        assert_eq!(
            mount_id_map(0, 2_000_131_079),
            "1 1 2000131078\n2000131080 2000131080 2294836215\n0 2000131079 1\n"
        );
        // A user's folder, below the sandbox's id.
        assert_eq!(
            mount_id_map(1000, 1005),
            "0 0 1000\n1001 1001 4\n1006 1006 4294966289\n1000 1005 1\n"
        );
        // The owner is the sandbox's id itself: every id is itself.
        assert_eq!(mount_id_map(7, 7), "0 0 7\n8 8 4294967287\n7 7 1\n");
        // Each line covers ids no other line does, on either side.
        for (disk, host) in [(0, 2_000_131_079), (1000, 1005), (1005, 1000), (7, 7)] {
            let mut inside = Vec::new();
            let mut outside = Vec::new();
            for line in mount_id_map(disk, host).lines() {
                let n: Vec<u64> = line
                    .split(' ')
                    .map(|x| x.parse().expect("a number"))
                    .collect();
                inside.push((n[0], n[0] + n[2]));
                outside.push((n[1], n[1] + n[2]));
            }
            for side in [&mut inside, &mut outside] {
                side.sort_unstable();
                assert!(side.windows(2).all(|w| w[0].1 <= w[1].0), "{side:?}");
                assert!(side.last().is_some_and(|l| l.1 <= u64::from(u32::MAX)));
            }
        }
    }
}
