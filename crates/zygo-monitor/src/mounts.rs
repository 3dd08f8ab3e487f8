//! What a sandbox mounts from the host, opened by the monitor.
//!
//! The monitor decides what a sandbox may see; so, as root, it also opens each host path it
//! hands over (a `--mount`, a sandbox.toml `mounts` entry, a function's folder), with its
//! own rights, as a detached copy of that mount tree (`open_tree(OPEN_TREE_CLONE)`), made
//! read-only (unless writable), `nosuid` and `nodev` (`mount_setattr`), and sends the
//! descriptors to the launcher (`ToLauncher::Mounts`), which only places them
//! (`move_mount`). The launcher never resolves a host path of a mount: a folder only root
//! can enter (a project under `/root`) is served, and a path swapped for a symlink after
//! the monitor opened it changes nothing of what is mounted.
//!
//! Rootless, the monitor has no right to clone mounts; the sandbox's root is the user
//! itself, so the launcher binds the path from inside as before, with exactly the user's
//! rights.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use proto::launch::{Image, LaunchPlan, ToLauncher, MAX_HANDED_MOUNTS};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `struct mount_attr` (include/uapi/linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Whether this process may hand mounts over (it runs as root).
pub fn can_hand_over() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn open_tree(dirfd: RawFd, path: &[u8], flags: libc::c_uint) -> io::Result<OwnedFd> {
    let p = std::ffi::CString::new(path)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: open_tree with a valid C string; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, p.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A host path handed over to every sandbox of a function: the detached tree made when
/// the function was registered, and the path itself, resolved then and held (`O_PATH`).
/// Each sandbox gets a copy of the tree; a kernel that cannot clone a detached tree
/// (before Linux 6.15: EINVAL) gets one cloned from the held path instead, with the same
/// flags, so what a symlink swapped in later points to is never mounted either way.
pub struct Handed {
    tree: OwnedFd,
    source: OwnedFd,
    rw: bool,
}

impl Handed {
    /// The tree alone, for one sandbox (a one-shot sandbox needs no copies).
    pub fn into_tree(self) -> OwnedFd {
        self.tree
    }
}

/// Open `src` as an `O_PATH` descriptor (following symlinks, as a mount would).
fn hold(src: &Path) -> io::Result<OwnedFd> {
    let p = std::ffi::CString::new(src.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: open with a valid C string; it returns a new descriptor or -1.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A detached copy of the mount tree at `src` (submounts included), read-only unless
/// `rw`, `nosuid` and `nodev` throughout.
pub fn detach(src: &Path, rw: bool) -> io::Result<Handed> {
    let source = hold(src)?;
    let tree = detach_from(&source, rw)?;
    Ok(Handed { tree, source, rw })
}

/// A detached copy of the mount tree at a held path, with the flags of [`detach`].
fn detach_from(source: &OwnedFd, rw: bool) -> io::Result<OwnedFd> {
    let fd = open_tree(
        source.as_raw_fd(),
        b"",
        OPEN_TREE_CLONE
            | libc::AT_RECURSIVE as libc::c_uint
            | libc::AT_EMPTY_PATH as libc::c_uint
            | libc::O_CLOEXEC as libc::c_uint,
    )?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | if rw { 0 } else { MOUNT_ATTR_RDONLY },
        attr_clr: if rw { MOUNT_ATTR_RDONLY } else { 0 },
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr on our detached tree ("" with AT_EMPTY_PATH), with a properly
    // sized mount_attr.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Another detached copy of a tree [`detach`] made (each sandbox gets its own; the flags
/// come along).
pub fn copy(handed: &Handed) -> io::Result<OwnedFd> {
    match open_tree(
        handed.tree.as_raw_fd(),
        b"",
        OPEN_TREE_CLONE
            | libc::AT_RECURSIVE as libc::c_uint
            | libc::AT_EMPTY_PATH as libc::c_uint
            | libc::O_CLOEXEC as libc::c_uint,
    ) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => detach_from(&handed.source, handed.rw),
        other => other,
    }
}

/// As root, detach a plan's `dir:` image and every mount (marking them handed over) and
/// return the trees: the image's first, then the mounts' in the plan's order. Rootless,
/// nothing (the launcher binds the paths itself).
pub fn hand_over(plan: &mut LaunchPlan) -> Result<Vec<Handed>, String> {
    if !can_hand_over() {
        return Ok(Vec::new());
    }
    let image = match &plan.image {
        Image::Dir(d) => Some(d.clone()),
        Image::Host => None,
    };
    let count = plan.mounts.len() + usize::from(image.is_some()) + usize::from(plan.work.is_some());
    if count > usize::from(MAX_HANDED_MOUNTS) {
        return Err(format!(
            "{count} mounts; a sandbox may have at most {MAX_HANDED_MOUNTS}"
        ));
    }
    let mut trees = Vec::with_capacity(count);
    if let Some(d) = image {
        let tree = detach(Path::new(&d), false)
            .map_err(|e| format!("open the image directory {d}: {e}"))?;
        plan.image_handed = true;
        trees.push(tree);
    }
    for m in plan.mounts.iter_mut() {
        let tree = detach(Path::new(&m.src), m.rw)
            .map_err(|e| format!("open the mount source {}: {e}", m.src))?;
        m.handed = true;
        trees.push(tree);
    }
    if let Some(w) = &plan.work {
        let tree =
            detach(Path::new(w), true).map_err(|e| format!("open the workspace {w}: {e}"))?;
        plan.work_handed = true;
        trees.push(tree);
    }
    Ok(trees)
}

/// Send `ToLauncher::Mounts` with these trees as `SCM_RIGHTS` (before `Start`).
pub fn send(sock: &UnixStream, trees: &[OwnedFd]) -> io::Result<()> {
    if trees.is_empty() {
        return Ok(());
    }
    let count = u8::try_from(trees.len())
        .ok()
        .filter(|&n| n <= MAX_HANDED_MOUNTS)
        .ok_or_else(|| io::Error::other(format!("{} mounts", trees.len())))?;
    let frame = proto::encode_frame(&ToLauncher::Mounts { count })
        .map_err(|e| io::Error::other(e.to_string()))?;
    let raw: Vec<RawFd> = trees.iter().map(AsRawFd::as_raw_fd).collect();
    let n = plumbing::fds::send_with_fds(sock.as_raw_fd(), &frame, &raw)?;
    // The descriptors went with the first byte; the rest of a short write follows plainly.
    (&*sock).write_all(&frame[n..])
}
