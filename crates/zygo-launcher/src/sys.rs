//! Thin wrappers over the system calls the launcher makes. Each failure names the
//! operation and its paths, so a failed build says exactly which step broke.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// One failed setup step: what was being done, and what the kernel said.
#[derive(Debug)]
pub struct SetupError {
    pub step: String,
    pub source: io::Error,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.step, self.source)
    }
}

impl std::error::Error for SetupError {}

pub type Result<T> = std::result::Result<T, SetupError>;

/// Attach a step name to an io::Error.
pub fn step<T>(r: io::Result<T>, what: impl FnOnce() -> String) -> Result<T> {
    r.map_err(|source| SetupError {
        step: what(),
        source,
    })
}

pub fn fail(what: impl Into<String>, source: io::Error) -> SetupError {
    SetupError {
        step: what.into(),
        source,
    }
}

pub fn cstr(p: impl AsRef<Path>) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_ref().as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn mount(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(cstr).transpose()?;
    let dst = cstr(dst)?;
    let fstype = fstype.map(CString::new).transpose()?;
    let data = data.map(CString::new).transpose()?;
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    check(unsafe { libc::mount(p(&src), dst.as_ptr(), p(&fstype), flags, p(&data).cast()) })?;
    Ok(())
}

pub use plumbing::sys::{
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};

/// Set and clear mount attributes on `path` and every mount below it (mount_setattr,
/// AT_RECURSIVE). Unlike a remount, this reaches submounts of a recursive bind.
pub fn mount_setattr_recursive(path: &Path, set: u64, clear: u64) -> io::Result<()> {
    setattr(path, set, clear, 0, libc::AT_RECURSIVE as libc::c_uint)
}

/// [`mount_setattr_recursive`] that also makes every mount there private: nothing mounted
/// under `path` afterwards propagates to a peer, nor comes from one.
pub fn mount_setattr_recursive_private(path: &Path, set: u64) -> io::Result<()> {
    setattr(
        path,
        set,
        0,
        libc::MS_PRIVATE,
        libc::AT_RECURSIVE as libc::c_uint,
    )
}

/// Set and clear mount attributes on the mount at `path` alone (which must be the root of
/// a mount: EINVAL otherwise).
pub fn mount_setattr(path: &Path, set: u64, clear: u64) -> io::Result<()> {
    setattr(path, set, clear, 0, 0)
}

fn setattr(
    path: &Path,
    set: u64,
    clear: u64,
    propagation: libc::c_ulong,
    flags: libc::c_uint,
) -> io::Result<()> {
    let p = cstr(path)?;
    let attr = plumbing::sys::MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation,
        userns_fd: 0,
    };
    plumbing::sys::mount_setattr(libc::AT_FDCWD, &p, flags, &attr)
}

/// A detached copy of the mount at `path` (`open_tree(OPEN_TREE_CLONE)`): a descriptor to
/// its root through which it can be used whatever later happens to `path`'s own mount.
pub fn open_tree_clone(path: &Path) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    plumbing::sys::open_tree(libc::AT_FDCWD, &p, plumbing::sys::OPEN_TREE_CLONE)
}

/// A detached copy of the mount tree at a held path (`O_PATH` descriptor), submounts
/// included (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`): what a recursive bind of it
/// would mount, with its flags.
pub fn open_tree_clone_recursive(held: &OwnedFd) -> io::Result<OwnedFd> {
    plumbing::sys::open_tree(
        held.as_raw_fd(),
        c"",
        plumbing::sys::OPEN_TREE_CLONE
            | libc::AT_EMPTY_PATH as libc::c_uint
            | libc::AT_RECURSIVE as libc::c_uint,
    )
}

/// Attach the detached mount tree `tree` (from `open_tree(OPEN_TREE_CLONE)`) at `dst`.
pub fn move_mount_here(tree: &OwnedFd, dst: &Path) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    let d = cstr(dst)?;
    // SAFETY: move_mount from a descriptor we hold ("" with F_EMPTY_PATH) to a valid path.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            d.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

pub fn umount_detach(path: &Path) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: valid C string.
    check(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) })?;
    Ok(())
}

pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let n = cstr(new_root)?;
    let o = cstr(put_old)?;
    // SAFETY: valid C strings.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, n.as_ptr(), o.as_ptr()) })?;
    Ok(())
}

pub fn chdir(path: &Path) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: valid C string.
    check(unsafe { libc::chdir(p.as_ptr()) })?;
    Ok(())
}

pub fn write_fd(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is a valid slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Read until `buf` is full or end of file; returns the bytes read.
pub fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid mutable slice for its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(n as usize);
    }
}

pub fn close(fd: RawFd) {
    // SAFETY: closing a descriptor this process owns; errors are irrelevant here.
    unsafe { libc::close(fd) };
}

/// Close every descriptor from `from` up, except those in `keep`.
pub fn close_fds_from(from: RawFd, keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&k| k >= from).collect();
    keep.sort_unstable();
    let mut lo = from as libc::c_uint;
    for k in keep {
        let k = k as libc::c_uint;
        if k > lo {
            // SAFETY: close_range on this process's own descriptor table.
            unsafe { libc::syscall(libc::SYS_close_range, lo, k - 1, 0) };
        }
        lo = k + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, lo, libc::c_uint::MAX, 0) };
}

pub fn prctl(option: libc::c_int, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe {
        libc::prctl(
            option,
            arg,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })?;
    Ok(())
}

pub fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: lim is a valid rlimit struct.
    check(unsafe { libc::setrlimit(resource, &lim) })?;
    Ok(())
}

pub fn get_rlimit(resource: libc::__rlimit_resource_t) -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit struct to fill in.
    check(unsafe { libc::getrlimit(resource, &mut lim) })?;
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Create a network namespace for the calling thread (owned by its user namespace), bring
/// its loopback interface up, and return a descriptor for it, to `setns` another thread
/// into.
pub fn new_net_namespace() -> io::Result<OwnedFd> {
    // SAFETY: unshare with a namespace flag only; it applies to this thread.
    check(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
    // SAFETY: plain socket creation.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: the socket was just created by this process.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the flags of the named interface in `req`.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: the union member written by SIOCGIFFLAGS is ifru_flags.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads `req`.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) })?;
    // SAFETY: SIOCGSKNS returns a new close-on-exec descriptor for the socket's network
    // namespace, which is this thread's new one.
    let ns = check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGSKNS as _) })?;
    // SAFETY: `ns` was just opened by the kernel for this process.
    Ok(unsafe { OwnedFd::from_raw_fd(ns) })
}

/// TCP's buffer sizes (minimum, initial, most autotuning may grow to) in a sandbox's own
/// network namespace, smaller than a host's usual defaults. Under memory pressure the
/// kernel still grants every TCP socket a few pages past its cgroup's limit (so that every
/// connection makes progress), more the larger these are: with the host's defaults, one
/// sandbox filling loopback connection pairs held about 74 KB per pair past its limit;
/// with these, about 16 KB. 1 MiB still lets loopback transfers reach full speed once
/// autotuned.
const TCP_BUFFERS: [(&str, &str); 2] = [
    ("net/ipv4/tcp_rmem", "4096 16384 1048576"),
    ("net/ipv4/tcp_wmem", "4096 16384 1048576"),
];

/// Write [`TCP_BUFFERS`] through `sysctl_dir`, a descriptor of a writable `/proc/sys`.
/// These sysctls are per network namespace, and a lookup under `/proc/sys/net` finds the
/// namespace of the process making it: the caller must already be in the sandbox's own
/// network namespace (and hold its owner's capabilities). A kernel without IPv4 has no
/// such files: nothing to write.
pub fn small_tcp_buffers(sysctl_dir: &OwnedFd) -> io::Result<()> {
    for (path, value) in TCP_BUFFERS {
        let written = openat_write(sysctl_dir, path).and_then(|f| {
            use std::io::Write;
            (&f).write_all(value.as_bytes())
        });
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("write {value:?} to /proc/sys/{path}: {e}"),
                ))
            }
        }
    }
    Ok(())
}

/// An `O_PATH` descriptor of a directory (close-on-exec, not following a final symlink).
pub fn open_path_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: open with a NUL-terminated path; O_PATH gives no access to contents.
    let fd = check(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    })?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn openat_write(dir: &OwnedFd, path: &str) -> io::Result<std::fs::File> {
    let c = cstr(path)?;
    // SAFETY: openat on a descriptor we own with a NUL-terminated relative path.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    })?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A thread making a network namespace ([`new_net_namespace`]), started by
/// [`spawn_net_namespace`]. [`NetThread::take`] waits for the namespace, [`NetThread::join`]
/// for the thread's end.
pub struct NetThread {
    thread: libc::pthread_t,
    /// Shared with the thread until `join` frees it.
    slot: *mut NetSlot,
    /// The thread was placed on another CPU than its creator's.
    elsewhere: bool,
    /// pthread_join has returned.
    joined: bool,
}

/// What the thread hands back: `result`, then `done` set (release), after which the thread
/// touches neither again.
struct NetSlot {
    done: AtomicBool,
    result: Option<io::Result<OwnedFd>>,
}

/// The longest [`NetThread::take`] watches for the namespace before it sleeps instead.
const NET_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

extern "C" fn net_thread_main(arg: *mut libc::c_void) -> *mut libc::c_void {
    let slot = arg.cast::<NetSlot>();
    let r = std::panic::catch_unwind(new_net_namespace)
        .unwrap_or_else(|_| Err(io::Error::other("its thread panicked")));
    // SAFETY: `slot` is the Box that spawn_net_namespace leaked for this thread. Its creator
    // reads `result` only after seeing `done` (acquire) or after pthread_join, and frees
    // the slot only after pthread_join.
    unsafe {
        (*slot).result = Some(r);
        (*slot).done.store(true, Ordering::Release);
    }
    std::ptr::null_mut()
}

/// Start [`new_net_namespace`] on a thread of its own, placed on another CPU than the
/// caller's when the caller may use more than one. The scheduler puts a new thread on
/// the least loaded CPU at the moment it is made; while a sandbox starts that is often the
/// creator's own (the monitor and launcher keep the other busy for a moment), and an idle
/// CPU does not pull a queued thread over for up to a tick, so the namespace, which takes
/// about half a millisecond to make, was made after the root instead of beside it. glibc
/// sets the thread's CPU mask before the thread first runs. The mask only applies to this
/// thread, which ends once the namespace exists.
pub fn spawn_net_namespace() -> io::Result<NetThread> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pthread_attr_t is plain data that pthread_attr_init fills in.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: attr is initialised before use and destroyed on every path below.
    let r = unsafe { libc::pthread_attr_init(&mut attr) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    let result = (|| {
        // SAFETY: attr was initialised above.
        let r = unsafe { libc::pthread_attr_setstacksize(&mut attr, 64 * 1024) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        // SAFETY: `set` is a valid cpu_set_t of the size passed.
        let got =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        // SAFETY: plain query of the calling thread's CPU.
        let here = unsafe { libc::sched_getcpu() };
        let mut elsewhere = false;
        if got == 0 && here >= 0 && (here as usize) < libc::CPU_SETSIZE as usize {
            // SAFETY: `here` is within the set's bounds (checked above).
            unsafe { libc::CPU_CLR(here as usize, &mut set) };
            // SAFETY: `set` is a valid cpu_set_t.
            if unsafe { libc::CPU_COUNT(&set) } > 0 {
                // SAFETY: attr was initialised; `set` outlives the call (glibc copies it).
                let r = unsafe {
                    libc::pthread_attr_setaffinity_np(
                        &mut attr,
                        std::mem::size_of::<libc::cpu_set_t>(),
                        &set,
                    )
                };
                if r != 0 {
                    return Err(io::Error::from_raw_os_error(r));
                }
                elsewhere = true;
            }
        }
        let slot = Box::into_raw(Box::new(NetSlot {
            done: AtomicBool::new(false),
            result: None,
        }));
        // SAFETY: pthread_t is plain data that pthread_create fills in.
        let mut thread: libc::pthread_t = unsafe { std::mem::zeroed() };
        // SAFETY: the thread gets `slot`, which stays alive until join() reclaims it; the
        // start routine catches panics, so none unwinds across the C boundary.
        let r = unsafe { libc::pthread_create(&mut thread, &attr, net_thread_main, slot.cast()) };
        if r != 0 {
            // SAFETY: no thread was made, so `slot` is still only ours.
            drop(unsafe { Box::from_raw(slot) });
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(NetThread {
            thread,
            slot,
            elsewhere,
            joined: false,
        })
    })();
    // SAFETY: attr was initialised above and is not used again.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    result
}

impl NetThread {
    /// Wait for the namespace the thread made. When the thread runs on another CPU this
    /// watches for its answer (for up to [`NET_SPIN`]) rather than sleeping: the namespace is
    /// usually a few dozen microseconds from done when the root is built, and a sleeping
    /// init was woken only once the thread had fully exited, often then to wait behind
    /// the launcher or the monitor on its CPU (~0.1 ms in all). Otherwise, or after that,
    /// it waits for the thread to end.
    pub fn take(&mut self) -> io::Result<OwnedFd> {
        let slot = self.slot;
        let taken = || {
            // SAFETY: `done` was seen set (acquire) or the thread was joined: the thread
            // wrote `result` before and does not touch the slot again.
            unsafe { (*slot).result.take() }
                .unwrap_or_else(|| Err(io::Error::other("its thread ended without an answer")))
        };
        if self.elsewhere {
            let t0 = std::time::Instant::now();
            let mut spins: u32 = 0;
            loop {
                // SAFETY: the slot lives until `join`.
                if unsafe { (*slot).done.load(Ordering::Acquire) } {
                    return taken();
                }
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) && t0.elapsed() >= NET_SPIN {
                    break;
                }
            }
        }
        self.wait_end()?;
        taken()
    }

    fn wait_end(&mut self) -> io::Result<()> {
        if self.joined {
            return Ok(());
        }
        // SAFETY: the thread was created joinable and is joined at most once (`joined`).
        let r = unsafe { libc::pthread_join(self.thread, std::ptr::null_mut()) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        self.joined = true;
        Ok(())
    }

    /// Wait for the thread to end (at once, some time after `take`) and free what it
    /// shared. On an error the slot is left leaked: the thread may still be using it.
    pub fn join(mut self) -> io::Result<()> {
        self.wait_end()?;
        // SAFETY: the thread has ended, so the slot is only ours again; `self` is consumed.
        drop(unsafe { Box::from_raw(self.slot) });
        Ok(())
    }
}

/// Move the calling thread into the network namespace `ns`.
pub fn enter_net_namespace(ns: &OwnedFd) -> io::Result<()> {
    // SAFETY: setns on a namespace descriptor we own.
    check(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
    Ok(())
}

/// Create an empty regular file (for a file to be mounted onto). Fails if it exists.
pub fn mknod_file(path: &Path, mode: libc::mode_t) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: valid C string; S_IFREG with device 0 creates a plain file.
    check(unsafe { libc::mknod(p.as_ptr(), libc::S_IFREG | mode, 0) })?;
    Ok(())
}

/// Open `path` with `flags` (close-on-exec added) and `mode`.
fn open(path: &Path, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    // SAFETY: valid C string; the returned descriptor is new and owned here.
    let fd = check(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: `fd` was just opened by this process.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Create `path` (it must not exist) holding `contents`, with exactly `mode` whatever the
/// umask.
pub fn create_file(path: &Path, contents: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let fd = open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)?;
    write_fd(fd.as_raw_fd(), contents)?;
    // SAFETY: fchmod on a descriptor we own.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
    Ok(())
}

/// Copy the first `len` bytes of the regular file `src` (fewer if it is shorter) into a new
/// file `dst` with exactly `mode`.
pub fn copy_file(src: &Path, dst: &Path, len: u64, mode: libc::mode_t) -> io::Result<()> {
    let from = open(src, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
    let to = open(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)?;
    let mut left = len;
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        // SAFETY: both descriptors are open and owned here; a null offset uses the file's.
        let n = unsafe {
            libc::sendfile(
                to.as_raw_fd(),
                from.as_raw_fd(),
                std::ptr::null_mut(),
                chunk,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        left -= n as u64;
    }
    // SAFETY: fchmod on a descriptor we own.
    check(unsafe { libc::fchmod(to.as_raw_fd(), mode) })?;
    Ok(())
}

/// Point fd 1 at `/dev/null`, letting go of whatever it was.
pub fn stdout_to_dev_null() -> io::Result<()> {
    let null = open(Path::new("/dev/null"), libc::O_WRONLY, 0)?;
    // SAFETY: dup2 of a descriptor we own onto fd 1.
    check(unsafe { libc::dup2(null.as_raw_fd(), 1) })?;
    Ok(())
}

/// What `spawn` starts: `path` with `argv` and `env`, after moving each `(from, to)`
/// descriptor in order and closing every descriptor from `close_from` up.
pub struct Spawn<'a> {
    pub path: &'a std::ffi::CStr,
    pub argv: &'a [CString],
    pub env: &'a [CString],
    pub moves: &'a [(RawFd, RawFd)],
    pub close_from: RawFd,
}

/// What the child of [`spawn`] needs, made ready by the parent: the child runs on the
/// parent's memory (`CLONE_VM`) and may not allocate, lock or unwind, only make system
/// calls.
struct SpawnChild<'a> {
    program: plumbing::vfork::Program<'a>,
    moves: &'a [(RawFd, RawFd)],
    close_from: RawFd,
    /// The signals this process ignores or handles, to be reset to their defaults: an
    /// ignored signal would stay ignored across exec, and a handler of this process must
    /// not run in the child, which shares its memory (it gets a copy of the handler table,
    /// so resetting it here leaves the parent's alone).
    reset: &'a [libc::c_int],
}

// Other architectures order or size the kernel's struct sigaction differently.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("KernelSigaction matches the kernel's struct sigaction on x86_64 and aarch64 only");

/// `struct sigaction` as the kernel takes it (x86_64 and arm64 alike).
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

extern "C" fn spawn_child(arg: *mut libc::c_void) -> ! {
    // SAFETY: `arg` is the parent's SpawnChild, which outlives this child: the parent is
    // suspended (CLONE_VFORK) until the exec below succeeds or this child exits.
    let plan = unsafe { &mut *arg.cast::<SpawnChild>() };
    // SAFETY: only async-signal-safe system calls on values the parent prepared, all valid
    // until the parent resumes.
    unsafe {
        let placed = libc::setsid() >= 0
            && plan.moves.iter().all(|&(from, to)| {
                if from == to {
                    // dup2 onto itself keeps close-on-exec: clear it instead.
                    libc::fcntl(to, libc::F_SETFD, 0) == 0
                } else {
                    libc::dup2(from, to) == to
                }
            })
            && libc::syscall(
                libc::SYS_close_range,
                plan.close_from as libc::c_uint,
                libc::c_uint::MAX,
                0,
            ) == 0;
        if placed {
            // The system call itself: glibc's wrappers refuse the two signals it keeps for
            // itself (32 and 33), which have handlers here and which a parent may have left
            // ignored.
            let default = KernelSigaction {
                handler: libc::SIG_DFL,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            for &sig in plan.reset {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &default as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    std::mem::size_of::<u64>(),
                );
            }
            plan.program.exec()
        }
        plan.program.fail()
    }
}

/// The signals this process ignores or handles, from `SigIgn` and `SigCgt` in
/// `/proc/self/status`; every signal (bar SIGKILL and SIGSTOP, which keep their defaults)
/// if that cannot be read.
fn signals_to_reset() -> Vec<libc::c_int> {
    let every = || {
        (1..=libc::SIGRTMAX())
            .filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP)
            .collect()
    };
    // One read: the kernel makes the whole file (~1.5 KiB) on the first, where
    // `read_to_string` would start small and double its way up, a call each time.
    let mut buf = [0u8; 4096];
    let n = match std::fs::File::open("/proc/self/status").and_then(|mut f| {
        use std::io::Read;
        f.read(&mut buf)
    }) {
        Ok(n) if n < buf.len() => n,
        _ => return every(),
    };
    let text = String::from_utf8_lossy(&buf[..n]);
    let mask = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
    };
    match (mask("SigIgn:"), mask("SigCgt:")) {
        (Some(ignored), Some(caught)) => (1..=64)
            .filter(|&s| (ignored | caught) & (1u64 << (s - 1)) != 0)
            .collect(),
        _ => every(),
    }
}

/// Start `s` and return its pid: in a new session, with every signal at its default and
/// none blocked. The child is made by `plumbing::vfork` (as glibc's `posix_spawn` makes one:
/// nothing of this process's memory is copied, and this returns once the exec is done or
/// has failed), but it resets only the signals this process ignores or handles where
/// `posix_spawn` makes a call per signal, and it starts on this CPU.
pub fn spawn(s: &Spawn<'_>) -> io::Result<libc::pid_t> {
    let reset = signals_to_reset();
    let mut plan = SpawnChild {
        program: plumbing::vfork::Program::new(s.path, s.argv, s.env),
        moves: s.moves,
        close_from: s.close_from,
        reset: &reset,
    };
    // SAFETY: spawn_child only makes system calls with what `plan` points to, all of it
    // alive until this returns.
    let pid =
        unsafe { plumbing::vfork::spawn(spawn_child, (&mut plan as *mut SpawnChild).cast()) }?;
    if plan.program.errno != 0 {
        // The child has exited (127) without exec: reap it.
        let mut status = 0;
        // SAFETY: waiting for our own child, which has exited.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
        return Err(io::Error::from_raw_os_error(plan.program.errno));
    }
    Ok(pid)
}

/// In the calling thread's network namespace (a sandbox's, while init still holds
/// `CAP_NET_ADMIN` over it): make every IPv4 address local (`local 0.0.0.0/0 dev lo` in the
/// `local` table), then listen on each address and port the egress rules name — on the port
/// for every address where a rule is a block. A connection to anything else is then
/// refused inside the namespace; these listeners are handed to the egress filter.
///
/// With name rules, their ports are listened on for every address (the name's addresses
/// are known only when the filter resolves it), and a UDP socket on port 53 of every
/// address, the last of the list, takes the sandbox's DNS queries to the filter's resolver.
pub fn egress_listeners(egress: &proto::launch::Egress) -> io::Result<Vec<OwnedFd>> {
    route_everything_local()?;
    let rules = &egress.rules;
    let wide_ports: Vec<u16> = rules
        .iter()
        .filter(|o| o.prefix < 32 || o.addr == [0; 4])
        .map(|o| o.port)
        .chain(egress.names.iter().map(|n| n.port))
        .collect();
    let mut binds: Vec<([u8; 4], u16)> = Vec::new();
    let all = rules
        .iter()
        .map(|r| (r.addr, r.port))
        .chain(egress.names.iter().map(|n| ([0; 4], n.port)));
    for (addr, port) in all {
        let at = if wide_ports.contains(&port) {
            [0; 4]
        } else {
            addr
        };
        if !binds.contains(&(at, port)) {
            binds.push((at, port));
        }
    }
    let mut out = Vec::with_capacity(binds.len());
    for (addr, port) in binds {
        // SAFETY: plain socket creation.
        let fd = check(unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: the socket was just created by this process.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_be_bytes(addr).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: sa is a valid sockaddr_in of the size passed.
        check(unsafe {
            libc::bind(
                fd,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("listen on {}:{port}: {e}", std::net::Ipv4Addr::from(addr)),
            )
        })?;
        // SAFETY: listen on the socket bound above.
        check(unsafe { libc::listen(fd, 128) })?;
        out.push(sock);
    }
    if !egress.names.is_empty() {
        out.push(bound_v4(libc::SOCK_DGRAM, [0; 4], 53)?);
    }
    Ok(out)
}

/// A socket of `kind` bound to `addr:port`.
fn bound_v4(kind: libc::c_int, addr: [u8; 4], port: u16) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = check(unsafe { libc::socket(libc::AF_INET, kind | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: the socket was just created by this process.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in of the size passed.
    check(unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })
    .map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("bind {}:{port}: {e}", std::net::Ipv4Addr::from(addr)),
        )
    })?;
    Ok(sock)
}

/// `ip route add local 0.0.0.0/0 dev lo table local`, over rtnetlink.
fn route_everything_local() -> io::Result<()> {
    // SAFETY: plain socket creation.
    let fd = check(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    // SAFETY: the socket was just created by this process.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a static NUL-terminated name.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(io::Error::last_os_error());
    }
    // nlmsghdr (16) + rtmsg (12) + one rtattr RTA_OIF (4 + 4).
    let mut msg = [0u8; 36];
    msg[0..4].copy_from_slice(&36u32.to_ne_bytes());
    msg[4..6].copy_from_slice(&libc::RTM_NEWROUTE.to_ne_bytes());
    let flags =
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16;
    msg[6..8].copy_from_slice(&flags.to_ne_bytes());
    msg[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence number
    msg[16] = libc::AF_INET as u8; // rtm_family
    msg[17] = 0; // rtm_dst_len: 0.0.0.0/0
    msg[20] = libc::RT_TABLE_LOCAL; // rtm_table
    msg[21] = libc::RTPROT_BOOT; // rtm_protocol
    msg[22] = libc::RT_SCOPE_HOST; // rtm_scope
    msg[23] = libc::RTN_LOCAL; // rtm_type
    msg[28..30].copy_from_slice(&8u16.to_ne_bytes());
    msg[30..32].copy_from_slice(&libc::RTA_OIF.to_ne_bytes());
    msg[32..36].copy_from_slice(&lo.to_ne_bytes());
    // SAFETY: sockaddr_nl is plain data; all zeroes addresses the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: msg and kernel are valid for their lengths.
    let sent = unsafe {
        libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent != msg.len() as isize {
        return Err(io::Error::last_os_error());
    }
    let mut ack = [0u8; 512];
    let got = read_fd(sock.as_raw_fd(), &mut ack)?;
    // The answer: nlmsghdr with type NLMSG_ERROR, then nlmsgerr whose error is 0 (an ack)
    // or a negative errno.
    if got < 20 || u16::from_ne_bytes([ack[4], ack[5]]) != libc::NLMSG_ERROR as u16 {
        return Err(io::Error::other(
            "rtnetlink answered something other than an ack",
        ));
    }
    let err = i32::from_ne_bytes([ack[16], ack[17], ack[18], ack[19]]);
    if err != 0 {
        return Err(io::Error::from_raw_os_error(-err));
    }
    Ok(())
}
