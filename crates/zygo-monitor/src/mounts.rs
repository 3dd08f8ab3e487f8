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
use std::os::unix::net::UnixStream;
use std::path::Path;

use proto::launch::{DiskOwner, IdMap, Image, LaunchPlan, ToLauncher, MAX_HANDED_MOUNTS};

use plumbing::sys::{
    MountAttr, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, OPEN_TREE_CLONE,
};

/// Whether this process may hand mounts over (it runs as root).
pub fn can_hand_over() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
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

/// Open `src` as an `O_PATH` descriptor, following no symbolic link in any component (a
/// sandbox given a folder writable may have left one there; see `plumbing::resolve`): a
/// path through a link is refused, naming it.
fn hold(src: &Path) -> io::Result<OwnedFd> {
    plumbing::resolve::open_host_path(src)
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
    let fd = plumbing::sys::open_tree(
        source.as_raw_fd(),
        c"",
        OPEN_TREE_CLONE | libc::AT_RECURSIVE as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
    )?;
    // Every mount of the tree: no set-id programs, no devices, and read-only unless the
    // tree is handed writable. A writable tree has only its top mount made writable (the
    // host's is, `check_writable` saw to it): a read-only mount under it stays so, as it is
    // for the host.
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | if rw { 0 } else { MOUNT_ATTR_RDONLY },
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    plumbing::sys::mount_setattr(
        fd.as_raw_fd(),
        c"",
        (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
        &attr,
    )?;
    if rw {
        let top = MountAttr {
            attr_set: 0,
            attr_clr: MOUNT_ATTR_RDONLY,
            propagation: 0,
            userns_fd: 0,
        };
        plumbing::sys::mount_setattr(
            fd.as_raw_fd(),
            c"",
            libc::AT_EMPTY_PATH as libc::c_uint,
            &top,
        )?;
    }
    Ok(fd)
}

/// Another detached copy of a tree [`detach`] made (each sandbox gets its own; the flags
/// come along).
pub fn copy(handed: &Handed) -> io::Result<OwnedFd> {
    match plumbing::sys::open_tree(
        handed.tree.as_raw_fd(),
        c"",
        OPEN_TREE_CLONE | libc::AT_RECURSIVE as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
    ) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => detach_from(&handed.source, handed.rw),
        other => other,
    }
}

/// Who the sandbox's id 0 is on disk in a host tree handed to it (see `DiskOwner`): for a
/// writable one, the owner of its root as the detached tree itself says (so what the
/// sandbox writes there keeps the folder's owner); for a read-only one, the subordinate
/// range's base ids. `None` where ids are not mapped onto a range (rootless: nothing is
/// handed).
fn disk_owner(tree: &OwnedFd, rw: bool, ids: &IdMap) -> io::Result<Option<DiskOwner>> {
    let IdMap::Range {
        uid_base, gid_base, ..
    } = *ids
    else {
        return Ok(None);
    };
    if !rw {
        return Ok(Some(DiskOwner {
            uid: uid_base,
            gid: gid_base,
        }));
    }
    let st = fstat(tree.as_raw_fd())?;
    Ok(Some(DiskOwner {
        uid: st.st_uid,
        gid: st.st_gid,
    }))
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data; zeroed is a valid starting value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor of ours and a stat to fill.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Refuse, before anything is made, a host folder (or file) handed to a sandbox writable
/// that the sandbox could not write, naming it: every write there would fail with
/// `EACCES` or `EROFS` otherwise. As root the sandbox writes there as its owner (see
/// `DiskOwner`), with no capability, so the owner's mode bits decide; rootless, as the user
/// running this process, so the kernel's own answer for this user does (groups and ACLs
/// included). No symbolic link is followed in `src` (see `plumbing::resolve`). `instead`
/// is the way out that needs no change to the folder ("mount it read-only").
pub fn check_writable(src: &Path, instead: &str) -> Result<(), String> {
    let held = hold(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let st = fstat(held.as_raw_fd()).map_err(|e| format!("{}: {e}", src.display()))?;
    let dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let what = if dir { "folder" } else { "file" };
    let shown = src.display();
    // SAFETY: statvfs is plain old data; zeroed is a valid starting value.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor of ours and a statvfs to fill.
    if unsafe { libc::fstatvfs(held.as_raw_fd(), &mut vfs) } == 0
        && vfs.f_flag & libc::ST_RDONLY != 0
    {
        return Err(format!(
            "the writable {what} {shown} is on a read-only filesystem: {instead}"
        ));
    }
    let mode = st.st_mode & 0o7777;
    if can_hand_over() {
        let needed = if dir { 0o300 } else { 0o200 };
        if mode & needed != needed {
            return Err(format!(
                "the writable {what} {shown} is not writable by its owner (uid {}, mode \
                 {mode:04o}), whom a sandbox writes there as: {instead}, or give its owner \
                 the right (chmod u+w{} {shown})",
                st.st_uid,
                if dir { "x" } else { "" }
            ));
        }
        return check_no_set_id(&held, src, what, instead);
    }
    let bits = if dir {
        libc::W_OK | libc::X_OK
    } else {
        libc::W_OK
    };
    // SAFETY: a descriptor of ours and an empty C string (AT_EMPTY_PATH: the descriptor
    // itself).
    let r = unsafe {
        libc::faccessat(
            held.as_raw_fd(),
            c"".as_ptr(),
            bits,
            libc::AT_EMPTY_PATH | libc::AT_EACCESS,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        return Err(format!(
            "the writable {what} {shown} (owner uid {}, mode {mode:04o}) cannot be written by \
             uid {me}, who runs zygo and whom a sandbox without root writes there as ({e}): \
             {instead}, or give uid {me} the right to write it",
            st.st_uid
        ));
    }
    check_no_set_id(&held, src, what, instead)
}

/// The most folders nested, and entries in all, of a writable folder checked for set-id
/// programs ([`crate::tree::find_set_id`]).
const SET_ID_SCAN_DEPTH: usize = 200;
const SET_ID_SCAN_ENTRIES: u64 = 1_000_000;

/// Refuse a writable folder (or file) that holds a set-user-id or set-group-id program,
/// naming it: the sandbox writes there as its owner and could change it (see
/// [`crate::tree::find_set_id`]).
fn check_no_set_id(held: &OwnedFd, src: &Path, what: &str, instead: &str) -> Result<(), String> {
    let shown = src.display().to_string();
    match crate::tree::find_set_id(
        held.as_raw_fd(),
        &shown,
        SET_ID_SCAN_DEPTH,
        SET_ID_SCAN_ENTRIES,
    ) {
        Ok(None) => Ok(()),
        Ok(Some(file)) => Err(format!(
            "the writable {what} {shown} holds a set-user-id or set-group-id program, {file}: \
             a sandbox writes there as its owner and could change what it runs; {instead}, or \
             take the bits off it (chmod u-s,g-s {file})"
        )),
        Err(e) => Err(format!(
            "the writable {what} {shown} could not be checked for set-id programs ({e}): \
             {instead}, or hand a smaller folder"
        )),
    }
}

/// As root, detach a plan's `dir:` image and every mount (marking them handed over, with
/// whom the sandbox's id 0 is on disk in each) and return the trees: the image's first,
/// then the mounts' in the plan's order, then the workspace's. Rootless, nothing (the
/// launcher binds the paths itself). A `fresh` mount is left to its maker, whose
/// descriptor goes after the others' (before the workspace).
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
        if m.fresh {
            // Made by the caller, who hands its descriptor over (see `BindMount::fresh`).
            continue;
        }
        let tree = detach(Path::new(&m.src), m.rw)
            .map_err(|e| format!("open the mount source {}: {e}", m.src))?;
        m.owner = disk_owner(&tree.tree, m.rw, &plan.ids)
            .map_err(|e| format!("the mount source {}: {e}", m.src))?;
        m.handed = true;
        trees.push(tree);
    }
    if let Some(w) = &plan.work {
        let tree =
            detach(Path::new(w), true).map_err(|e| format!("open the workspace {w}: {e}"))?;
        plan.work_owner = disk_owner(&tree.tree, true, &plan.ids)
            .map_err(|e| format!("the workspace {w}: {e}"))?;
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

/// A new tmpfs of at most `bytes` and `inodes`, detached (in no mount namespace, so no
/// path on the host reaches it): a filesystem for one sandbox alone, a dependency build's
/// output. Its root is `0777` (whoever the sandbox's root is on the host may write there;
/// nobody else ever sees it), and it is `nosuid` and `nodev`. Whoever holds the
/// descriptor reads the tree through it after the sandbox has gone, and the filesystem
/// ends when the last descriptor and mount of it do.
///
/// As root it is made here; rootless, by a child of this process in a user and mount
/// namespace of its own (an unprivileged user may make a tmpfs only there), which sends
/// the descriptor back and exits. A sandbox's launcher can place either (`move_mount`).
pub fn private_tmpfs(bytes: u64, inodes: u64) -> io::Result<OwnedFd> {
    let opts = TmpfsOpts {
        size: cstring(format!("{bytes}"))?,
        inodes: cstring(format!("{inodes}"))?,
    };
    if can_hand_over() {
        return make_tmpfs(&opts)
            .map_err(|(what, e)| io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    // SAFETY: these calls cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let uid_map = format!("0 {uid} 1");
    let gid_map = format!("0 {gid} 1");
    let (ours, theirs) = plumbing::pipes::socketpair(libc::SOCK_STREAM)?;
    // SAFETY: the child calls only async-signal-safe functions (system calls on buffers
    // made before the fork) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        drop(ours);
        let code = tmpfs_child(
            &opts,
            uid_map.as_bytes(),
            gid_map.as_bytes(),
            theirs.as_raw_fd(),
        );
        // SAFETY: leaving the child without running anything of the parent's.
        unsafe { libc::_exit(code) };
    }
    drop(theirs);
    let mut status = [0u8; 1];
    let got = plumbing::fds::recv_exact_with_fds(ours.as_raw_fd(), &mut status, 1);
    let mut wstatus = 0;
    // SAFETY: our own child, reaped once.
    while unsafe { libc::waitpid(pid, &mut wstatus, 0) } < 0
        && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
    let fds = got.map_err(|e| io::Error::new(e.kind(), format!("receive the tmpfs: {e}")))?;
    match (status[0], fds.into_iter().next()) {
        (0, Some(fd)) => Ok(fd),
        (step, _) => Err(io::Error::other(format!(
            "a user namespace of this user could not make a tmpfs (step {step} of {}; exit \
             status {wstatus:#x})",
            TMPFS_STEPS.len()
        ))),
    }
}

/// The steps of [`tmpfs_child`], for its failure messages.
const TMPFS_STEPS: [&str; 5] = [
    "unshare",
    "write setgroups",
    "write uid_map",
    "write gid_map",
    "make the tmpfs",
];

struct TmpfsOpts {
    size: std::ffi::CString,
    inodes: std::ffi::CString,
}

fn cstring(s: String) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `fsopen` + `fsconfig` + `fsmount` of a tmpfs with `opts`; what failed, and why.
fn make_tmpfs(opts: &TmpfsOpts) -> Result<OwnedFd, (&'static str, io::Error)> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // SAFETY: a valid C string; a new descriptor or -1.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(("open a tmpfs context", io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    for (key, value) in [
        (c"size", opts.size.as_c_str()),
        (c"nr_inodes", opts.inodes.as_c_str()),
        (c"mode", c"0777"),
    ] {
        // SAFETY: valid C strings for a key and its value.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        if r < 0 {
            return Err(("set a tmpfs option", io::Error::last_os_error()));
        }
    }
    // SAFETY: no key or value for the create command.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    };
    if r < 0 {
        return Err(("create a tmpfs", io::Error::last_os_error()));
    }
    // SAFETY: fsmount on the created context; a new descriptor or -1.
    let m = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) as libc::c_uint,
        )
    };
    if m < 0 {
        return Err(("mount a tmpfs", io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(m as RawFd) })
}

/// The child of [`private_tmpfs`], rootless: a user namespace whose root is this user, a
/// mount namespace, the tmpfs, and the descriptor sent on `sock` after a status byte (the
/// 1-based step that failed, or 0). Returns the exit status.
fn tmpfs_child(opts: &TmpfsOpts, uid_map: &[u8], gid_map: &[u8], sock: RawFd) -> i32 {
    let say = |step: u8, fd: Option<RawFd>| send_status(sock, step, fd);
    // SAFETY: unshare in this single-threaded child.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        say(1, None);
        return 1;
    }
    let write = |path: &std::ffi::CStr, data: &[u8]| -> bool {
        // SAFETY: a valid C string; the descriptor is closed below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return false;
        }
        // SAFETY: writing from a buffer of the length passed.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        n == data.len() as isize
    };
    for (step, path, data) in [
        (2u8, c"/proc/self/setgroups", b"deny".as_slice()),
        (3, c"/proc/self/uid_map", uid_map),
        (4, c"/proc/self/gid_map", gid_map),
    ] {
        if !write(path, data) {
            say(step, None);
            return 1;
        }
    }
    match make_tmpfs(opts) {
        Ok(fd) => {
            say(0, Some(fd.as_raw_fd()));
            0
        }
        Err(_) => {
            say(5, None);
            1
        }
    }
}

/// One status byte on `sock`, with `fd` as `SCM_RIGHTS` if given, from buffers on the
/// stack (the child of a fork in a process with threads may not allocate). Nothing is
/// done about a failure: the parent then sees the channel close.
fn send_status(sock: RawFd, status: u8, fd: Option<RawFd>) {
    let byte = [status];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain old data; zeroed is a valid starting value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let len = std::mem::size_of::<RawFd>() as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE of one descriptor (24 bytes), within the 32 of `control`.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(len) } as usize;
        // SAFETY: filling in the one control message the buffer was sized for.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(len) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: msg points at buffers that live for the call.
    unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
}
