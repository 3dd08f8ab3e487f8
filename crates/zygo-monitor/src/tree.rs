//! Trees a sandbox wrote, handled by descriptor.
//!
//! A dependency build writes its tree inside a sandbox, and the build's code (any
//! package's `setup.py`) decides what is in it: symbolic links to host paths, folders
//! nested thousands deep, device nodes, set-id bits, sparse files that claim terabytes.
//! What the monitor does with such a tree afterwards — copy it out, remove it — goes by
//! descriptor, one component at a time from a folder it opened itself, never following a
//! symbolic link (`O_NOFOLLOW` on every `openat`, `AT_SYMLINK_NOFOLLOW` on every
//! `fstatat`, links read with `readlinkat` and written as links), and iteratively, so
//! that no depth a tree has can exhaust a stack or the descriptor table.

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The bounds of a copied tree.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// The most folders nested below the top one.
    pub depth: usize,
    /// The most entries (files, folders, links, skipped ones too).
    pub entries: u64,
    /// The most bytes of file contents, counted as copied (so hard links and sparse files
    /// count every time they are read).
    pub bytes: u64,
}

/// What a copy made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub folders: u64,
    pub links: u64,
    pub bytes: u64,
    /// Device nodes, FIFOs and sockets, which were left out.
    pub skipped: u64,
}

/// Why a tree could not be copied or removed.
#[derive(Debug)]
pub enum TreeError {
    TooDeep {
        limit: usize,
        at: String,
    },
    TooMany {
        limit: u64,
    },
    TooBig {
        limit: u64,
    },
    /// The tree changed under the walk (a folder's `..` is not the folder it came from).
    Moved {
        at: String,
    },
    Io {
        op: &'static str,
        at: String,
        source: io::Error,
    },
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::TooDeep { limit, at } => {
                write!(f, "it has folders nested more than {limit} deep ({at})")
            }
            TreeError::TooMany { limit } => write!(f, "it has more than {limit} entries"),
            TreeError::TooBig { limit } => {
                write!(f, "its files hold more than {} bytes", limit)
            }
            TreeError::Moved { at } => write!(f, "{at} moved while it was being read"),
            TreeError::Io { op, at, source } => write!(f, "{op} {at}: {source}"),
        }
    }
}

impl std::error::Error for TreeError {}

fn io_err(op: &'static str, at: impl Into<String>) -> impl FnOnce(io::Error) -> TreeError {
    let at = at.into();
    move |source| TreeError::Io { op, at, source }
}

fn last(op: &'static str, at: impl Into<String>) -> TreeError {
    io_err(op, at)(io::Error::last_os_error())
}

fn retry<T: PartialEq + From<i8>>(mut f: impl FnMut() -> T) -> T {
    loop {
        let r = f();
        if r != T::from(-1) || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return r;
        }
    }
}

/// `openat` relative to `dir`, never following a link in the last component (and there
/// is no other component: `name` is one entry).
fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: a valid C string; openat returns a new descriptor or -1.
    let fd = retry(|| unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    });
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_dir_at(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// `fstatat` of one entry, not following a link.
fn lstat_at(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled in by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a valid stat buffer.
    let r = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled in by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and stat buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn fchmod(fd: RawFd, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: fchmod on a descriptor we hold.
    if unsafe { libc::fchmod(fd, mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A folder's entries, read from a descriptor of its own (so its offset is nobody else's).
struct Dir(*mut libc::DIR);

impl Dir {
    /// Read the folder `fd` refers to from its start.
    fn of(fd: RawFd) -> io::Result<Dir> {
        let own = open_dir_at(fd, c".")?;
        // SAFETY: fdopendir takes a descriptor we own; on success the stream owns it.
        let d = unsafe { libc::fdopendir(own.as_raw_fd()) };
        if d.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(own);
        Ok(Dir(d))
    }

    /// The next entry's name, `.` and `..` left out.
    fn next(&mut self) -> io::Result<Option<CString>> {
        loop {
            // SAFETY: readdir distinguishes the end from an error only through errno.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: a stream we opened and have not closed.
            let e = unsafe { libc::readdir(self.0) };
            if e.is_null() {
                let err = io::Error::last_os_error();
                return match err.raw_os_error() {
                    Some(0) | None => Ok(None),
                    _ => Err(err),
                };
            }
            // SAFETY: d_name is NUL-terminated within the entry readdir returned.
            let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) };
            if name == c"." || name == c".." {
                continue;
            }
            return Ok(Some(name.to_owned()));
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: a stream we opened, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

/// Open a folder of the caller's own (its path resolved as usual; the last component not
/// followed if it is a link), for [`copy_sealed`]'s destination.
pub fn open_folder(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    open_dir_at(libc::AT_FDCWD, &c)
}

/// Make sure the top of the tree at `root` has a folder `name`: make it if nothing is
/// there; `false` when something else (a link, a file) is.
pub fn ensure_folder(root: &OwnedFd, name: &CStr) -> io::Result<bool> {
    let top = open_dir_at(root.as_raw_fd(), c".")?;
    // SAFETY: a valid C string; mkdirat never follows a link in its last component.
    if unsafe { libc::mkdirat(top.as_raw_fd(), name.as_ptr(), 0o755) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EEXIST) {
        return Err(e);
    }
    Ok(lstat_at(top.as_raw_fd(), name)?.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// Make the folder at the absolute `path` and whatever of its parents is missing, never
/// following a symbolic link: each component is opened from the one before it with
/// `O_NOFOLLOW` (a link anywhere is refused with `ELOOP`), a missing one made with
/// `mkdirat` (parents 0755), and the last set to `mode` through a descriptor of its own,
/// whatever the umask. `Ok(false)` when it was there already (left as it is).
pub fn make_folders(path: &Path, mode: libc::mode_t) -> io::Result<bool> {
    use std::path::Component;
    if !path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an absolute path",
        ));
    }
    let names: Vec<CString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(
                CString::new(n.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)),
            ),
            Component::RootDir | Component::CurDir => None,
            Component::ParentDir | Component::Prefix(_) => Some(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a path with `..` in it",
            ))),
        })
        .collect::<io::Result<_>>()?;
    let mut at = open_dir_at(libc::AT_FDCWD, c"/")?;
    let mut made = false;
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        // SAFETY: a valid C string; mkdirat never follows a link in its last component.
        if unsafe { libc::mkdirat(at.as_raw_fd(), name.as_ptr(), 0o755) } == 0 {
            made = last;
        } else {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
        }
        at = open_dir_at(at.as_raw_fd(), name)?;
        if made {
            fchmod(at.as_raw_fd(), mode)?;
        }
    }
    Ok(made)
}

/// The first set-user-id or set-group-id regular file (or executable with file
/// capabilities) in the tree at `top` (a folder, or one file), as a path below
/// `shown_top`; `None` if there is none. Read by descriptor and
/// iteratively like the rest of this module, at most `depth` folders deep and `entries`
/// entries in all (past either, an error saying so).
///
/// A folder handed to a sandbox writable is written there as its owner: a sandbox cannot
/// make a set-id file (seccomp refuses the mode bits), but it could change one that is
/// already there without the kernel clearing the bit (a write through a shared mapping
/// leaves it), and whoever on the host runs it next would run the sandbox's code as the
/// file's owner. So such a folder is refused while it holds one.
pub fn find_set_id(
    top: RawFd,
    shown_top: &str,
    depth: usize,
    entries: u64,
) -> Result<Option<String>, TreeError> {
    let set_id = |st: &libc::stat| {
        st.st_mode & libc::S_IFMT == libc::S_IFREG
            && st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
    };
    let st = fstat(top).map_err(io_err("stat", shown_top))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        let caps = has_file_caps(top, c"", &st);
        return Ok((set_id(&st) || caps).then(|| shown_top.to_string()));
    }
    let mut stack: Vec<(OwnedFd, Dir, CString)> = Vec::new();
    let first = open_dir_at(top, c".").map_err(io_err("open", shown_top))?;
    let dir = Dir::of(first.as_raw_fd()).map_err(io_err("read", shown_top))?;
    stack.push((first, dir, CString::default()));
    let mut seen = 0u64;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let path = |stack: &[(OwnedFd, Dir, CString)], name: &CStr| {
        let names: Vec<&CStr> = stack
            .iter()
            .skip(1)
            .map(|(_, _, n)| n.as_c_str())
            .chain(std::iter::once(name))
            .collect();
        shown(shown_top, &names)
    };
    while let Some((fd, dir, _)) = stack.last_mut() {
        let parent = fd.as_raw_fd();
        let Some(name) = dir.next().map_err(|e| io_err("read", shown_top)(e))? else {
            stack.pop();
            continue;
        };
        seen += 1;
        if seen > entries {
            return Err(TreeError::TooMany { limit: entries });
        }
        let st = lstat_at(parent, &name).map_err(|e| io_err("stat", path(&stack, &name))(e))?;
        if set_id(&st) || has_file_caps(parent, &name, &st) {
            return Ok(Some(path(&stack, &name)));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            continue;
        }
        if stack.len() > depth {
            return Err(TreeError::TooDeep {
                limit: depth,
                at: path(&stack, &name),
            });
        }
        let sub = match open_dir_at(parent, &name) {
            Ok(sub) => sub,
            // Gone since it was listed: nothing to check there.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            // Someone else's folder this process may not read (rootless: a folder of
            // root's in the user's): nor may the sandbox, which is this user there. One of
            // this user's own it could open up with chmod, so that one is an error.
            Err(e) if e.raw_os_error() == Some(libc::EACCES) && st.st_uid != me => continue,
            Err(e) => return Err(io_err("open", path(&stack, &name))(e)),
        };
        let dir = Dir::of(sub.as_raw_fd()).map_err(|e| io_err("read", path(&stack, &name))(e))?;
        stack.push((sub, dir, name));
    }
    Ok(None)
}

/// Whether the executable regular file `name` in `dir` (`name` empty: `dir` itself) has
/// file capabilities (`security.capability`), which a write through a shared mapping keeps
/// as it keeps a set-id bit. One that cannot be asked is taken to have none.
fn has_file_caps(dir: RawFd, name: &CStr, st: &libc::stat) -> bool {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_mode & 0o111 == 0 {
        return false;
    }
    let held;
    let fd = if name.is_empty() {
        dir
    } else {
        match open_at(dir, name, libc::O_PATH, 0) {
            Ok(f) => {
                held = f;
                held.as_raw_fd()
            }
            Err(_) => return false,
        }
    };
    let Ok(proc_path) = CString::new(format!("/proc/self/fd/{fd}")) else {
        return false;
    };
    // SAFETY: valid C strings; a null buffer of size 0 asks only for the value's size.
    let r = unsafe {
        libc::getxattr(
            proc_path.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    r >= 0
}

/// A path for messages: the names from the top, joined.
fn shown(top: &str, names: &[&CStr]) -> String {
    let mut s = top.to_string();
    for n in names {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(n.to_bytes()));
    }
    s
}

/// One folder being copied: where it is read from and where it is written.
struct Frame {
    src: Dir,
    src_fd: OwnedFd,
    dst: OwnedFd,
    name: CString,
}

/// Copy the tree under the open folder `src` into the open, empty folder `dst`, held to
/// `caps`. What is made belongs to this process's user and nobody may write to it: files
/// are readable by all, and executable by all where any execute bit was set; folders are
/// readable and searchable by all; no set-id or sticky bit survives. Symbolic links are
/// copied as links (their targets as they are: they are followed only inside a sandbox,
/// which sees only its own root); device nodes, FIFOs and sockets are left out and
/// counted. `top` names the tree in messages.
pub fn copy_sealed(
    src: &OwnedFd,
    dst: &OwnedFd,
    caps: &Caps,
    top: &str,
) -> Result<Copied, TreeError> {
    let mut done = Copied::default();
    let mut entries: u64 = 0;
    let root_src = open_dir_at(src.as_raw_fd(), c".").map_err(io_err("open", top))?;
    let root_dst = open_dir_at(dst.as_raw_fd(), c".").map_err(io_err("open", top))?;
    let mut stack = vec![Frame {
        src: Dir::of(root_src.as_raw_fd()).map_err(io_err("read", top))?,
        src_fd: root_src,
        dst: root_dst,
        name: CString::default(),
    }];
    let mut buf = vec![0u8; 128 * 1024];
    while let Some(frame) = stack.last_mut() {
        let at = |stack: &[Frame], name: Option<&CStr>| {
            let mut names: Vec<&CStr> = stack.iter().skip(1).map(|f| f.name.as_c_str()).collect();
            names.extend(name);
            shown(top, &names)
        };
        let name = match frame.src.next() {
            Ok(Some(n)) => n,
            Ok(None) => {
                // Everything in it is copied: now nobody may write to it.
                if let Some(f) = stack.pop() {
                    fchmod(f.dst.as_raw_fd(), 0o555)
                        .map_err(|e| io_err("set the mode of", at(&stack, Some(&f.name)))(e))?;
                }
                continue;
            }
            Err(e) => return Err(io_err("read", at(&stack, None))(e)),
        };
        entries += 1;
        if entries > caps.entries {
            return Err(TreeError::TooMany {
                limit: caps.entries,
            });
        }
        let src_dir = frame.src_fd.as_raw_fd();
        let dst_dir = frame.dst.as_raw_fd();
        let st =
            lstat_at(src_dir, &name).map_err(|e| io_err("inspect", at(&stack, Some(&name)))(e))?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                if stack.len() > caps.depth {
                    return Err(TreeError::TooDeep {
                        limit: caps.depth,
                        at: at(&stack, Some(&name)),
                    });
                }
                // SAFETY: a valid C string; the folder is new (EEXIST otherwise).
                if unsafe { libc::mkdirat(dst_dir, name.as_ptr(), 0o700) } != 0 {
                    return Err(last("create", at(&stack, Some(&name))));
                }
                let s = open_dir_at(src_dir, &name)
                    .map_err(|e| io_err("open", at(&stack, Some(&name)))(e))?;
                let d = open_dir_at(dst_dir, &name)
                    .map_err(|e| io_err("open the copy of", at(&stack, Some(&name)))(e))?;
                let dir = Dir::of(s.as_raw_fd())
                    .map_err(|e| io_err("read", at(&stack, Some(&name)))(e))?;
                done.folders += 1;
                stack.push(Frame {
                    src: dir,
                    src_fd: s,
                    dst: d,
                    name,
                });
            }
            libc::S_IFREG => {
                let s = open_at(src_dir, &name, libc::O_RDONLY | libc::O_NONBLOCK, 0)
                    .map_err(|e| io_err("open", at(&stack, Some(&name)))(e))?;
                // What was opened is what was inspected (nothing runs in the tree now, but
                // a regular file is checked on the descriptor all the same).
                let sst = fstat(s.as_raw_fd())
                    .map_err(|e| io_err("inspect", at(&stack, Some(&name)))(e))?;
                if sst.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(TreeError::Moved {
                        at: at(&stack, Some(&name)),
                    });
                }
                let d = open_at(
                    dst_dir,
                    &name,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                )
                .map_err(|e| io_err("create", at(&stack, Some(&name)))(e))?;
                let room = caps.bytes - done.bytes;
                let n = copy_bytes(&s, &d, &mut buf, room)
                    .map_err(|e| io_err("copy", at(&stack, Some(&name)))(e))?;
                let Some(n) = n else {
                    return Err(TreeError::TooBig { limit: caps.bytes });
                };
                done.bytes += n;
                let exec = if sst.st_mode & 0o111 != 0 { 0o111 } else { 0 };
                fchmod(d.as_raw_fd(), 0o444 | exec)
                    .map_err(|e| io_err("set the mode of", at(&stack, Some(&name)))(e))?;
                done.files += 1;
            }
            libc::S_IFLNK => {
                let target = read_link_at(src_dir, &name)
                    .map_err(|e| io_err("read the link", at(&stack, Some(&name)))(e))?;
                // SAFETY: valid C strings.
                if unsafe { libc::symlinkat(target.as_ptr(), dst_dir, name.as_ptr()) } != 0 {
                    return Err(last("create the link", at(&stack, Some(&name))));
                }
                done.links += 1;
            }
            _ => {
                log::info!(
                    "{}: left out (a device node, FIFO or socket)",
                    at(&stack, Some(&name))
                );
                done.skipped += 1;
            }
        }
    }
    Ok(done)
}

/// Copy all of `src` to `dst`; `None` when it holds more than `room` bytes (whatever size
/// it claimed).
fn copy_bytes(src: &OwnedFd, dst: &OwnedFd, buf: &mut [u8], room: u64) -> io::Result<Option<u64>> {
    let mut total: u64 = 0;
    loop {
        // SAFETY: reading into a buffer of the length passed.
        let n =
            retry(|| unsafe { libc::read(src.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) });
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(Some(total));
        }
        let n = n as usize;
        total += n as u64;
        if total > room {
            return Ok(None);
        }
        let mut off = 0;
        while off < n {
            // SAFETY: writing from the part of the buffer that was read.
            let w = retry(|| unsafe {
                libc::write(dst.as_raw_fd(), buf[off..n].as_ptr().cast(), n - off)
            });
            if w < 0 {
                return Err(io::Error::last_os_error());
            }
            off += w as usize;
        }
    }
}

fn read_link_at(dir: RawFd, name: &CStr) -> io::Result<CString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: reading at most buf.len() bytes into buf.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n >= buf.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(n);
    CString::new(buf).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Remove `path` and, if it is a folder (not a link to one), everything under it, however
/// deep, holding one folder open at a time: the walk goes down by name and back up by
/// `..`, checked against the folder it came from. Folders a tree left without write
/// permission are given it first. A path that does not exist is removed already.
pub fn remove(path: &Path) -> Result<(), TreeError> {
    let top = path.display().to_string();
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io_err("remove", top)(io::Error::from_raw_os_error(
            libc::EINVAL,
        )));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_c = CString::new(parent.as_os_str().as_bytes())
        .map_err(|_| io_err("remove", top.clone())(io::Error::from_raw_os_error(libc::EINVAL)))?;
    let name = CString::new(name.as_bytes())
        .map_err(|_| io_err("remove", top.clone())(io::Error::from_raw_os_error(libc::EINVAL)))?;
    // The folder the tree is in is the caller's own (a set's folder), resolved as usual.
    // SAFETY: a valid C string.
    let pfd = unsafe {
        libc::open(
            parent_c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if pfd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(());
        }
        return Err(io_err("open", parent.display().to_string())(e));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let pfd = unsafe { OwnedFd::from_raw_fd(pfd) };
    let st = match lstat_at(pfd.as_raw_fd(), &name) {
        Ok(st) => st,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(io_err("inspect", top)(e)),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return unlink(pfd.as_raw_fd(), &name, 0).map_err(io_err("remove", top));
    }
    let mut cur = open_dir_at(pfd.as_raw_fd(), &name).map_err(io_err("open", top.clone()))?;
    let _ = fchmod(cur.as_raw_fd(), 0o700);
    // For each level below the top: the name of the folder gone into, and the identity
    // of the folder it is in (what its `..` must be).
    let mut path_down: Vec<(CString, libc::dev_t, libc::ino_t)> = Vec::new();
    let at = |down: &[(CString, libc::dev_t, libc::ino_t)], name: Option<&CStr>| {
        let mut names: Vec<&CStr> = down.iter().map(|(n, _, _)| n.as_c_str()).collect();
        names.extend(name);
        shown(&top, &names)
    };
    loop {
        let mut into: Option<(CString, OwnedFd)> = None;
        {
            let mut dir =
                Dir::of(cur.as_raw_fd()).map_err(|e| io_err("read", at(&path_down, None))(e))?;
            while let Some(entry) = dir
                .next()
                .map_err(|e| io_err("read", at(&path_down, None))(e))?
            {
                let est = lstat_at(cur.as_raw_fd(), &entry)
                    .map_err(|e| io_err("inspect", at(&path_down, Some(&entry)))(e))?;
                if est.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    let child = open_dir_at(cur.as_raw_fd(), &entry)
                        .map_err(|e| io_err("open", at(&path_down, Some(&entry)))(e))?;
                    let _ = fchmod(child.as_raw_fd(), 0o700);
                    into = Some((entry, child));
                    break;
                }
                unlink(cur.as_raw_fd(), &entry, 0)
                    .map_err(|e| io_err("remove", at(&path_down, Some(&entry)))(e))?;
            }
        }
        if let Some((entry, child)) = into {
            let here =
                fstat(cur.as_raw_fd()).map_err(|e| io_err("inspect", at(&path_down, None))(e))?;
            path_down.push((entry, here.st_dev, here.st_ino));
            cur = child;
            continue;
        }
        // `cur` is empty: remove it from the folder above.
        let Some((gone, dev, ino)) = path_down.pop() else {
            return unlink(pfd.as_raw_fd(), &name, libc::AT_REMOVEDIR)
                .map_err(io_err("remove", top));
        };
        let up = open_dir_at(cur.as_raw_fd(), c"..")
            .map_err(|e| io_err("open", at(&path_down, None))(e))?;
        let ust = fstat(up.as_raw_fd()).map_err(|e| io_err("inspect", at(&path_down, None))(e))?;
        if ust.st_dev != dev || ust.st_ino != ino {
            return Err(TreeError::Moved {
                at: at(&path_down, Some(&gone)),
            });
        }
        unlink(up.as_raw_fd(), &gone, libc::AT_REMOVEDIR)
            .map_err(|e| io_err("remove", at(&path_down, Some(&gone)))(e))?;
        cur = up;
    }
}

fn unlink(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid C string.
    if unsafe { libc::unlinkat(dir, name.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("zygo-tree-{tag}-{}", std::process::id()));
        let _ = remove(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    #[test]
    fn set_id_files_are_found_at_any_depth_and_links_are_not_followed() {
        let d = scratch("setid");
        std::fs::create_dir_all(d.join("a/b/c")).unwrap();
        let f = d.join("a/b/c/prog");
        std::fs::write(&f, "x").unwrap();
        let top = open_folder(&d).unwrap();
        let scan = |depth, entries| find_set_id(top.as_raw_fd(), "top", depth, entries);
        assert_eq!(scan(10, 100).unwrap(), None);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o2755)).unwrap();
        assert_eq!(scan(10, 100).unwrap().as_deref(), Some("top/a/b/c/prog"));
        assert!(matches!(scan(1, 100), Err(TreeError::TooDeep { .. })));
        assert!(matches!(scan(10, 2), Err(TreeError::TooMany { .. })));
        // A link to a set-id file elsewhere is a link, not the file.
        let other = scratch("setid-other");
        std::fs::write(other.join("su"), "x").unwrap();
        std::fs::set_permissions(other.join("su"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(other.join("su"), d.join("a/su")).unwrap();
        std::os::unix::fs::symlink(&other, d.join("a/dir")).unwrap();
        assert_eq!(scan(10, 100).unwrap(), None);
        // A single file is checked as itself.
        let one = open_folder(&other).unwrap();
        let su = open_at(one.as_raw_fd(), c"su", libc::O_PATH, 0).unwrap();
        assert_eq!(
            find_set_id(su.as_raw_fd(), "su", 10, 100)
                .unwrap()
                .as_deref(),
            Some("su")
        );
        // An executable with file capabilities (as root, where they can be set).
        let capped = d.join("a/b/capped");
        std::fs::write(&capped, "x").unwrap();
        std::fs::set_permissions(&capped, std::fs::Permissions::from_mode(0o755)).unwrap();
        // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE, then CAP_NET_RAW permitted.
        let mut blob = [0u8; 20];
        blob[..4].copy_from_slice(&0x0200_0001u32.to_le_bytes());
        blob[4..8].copy_from_slice(&(1u32 << 13).to_le_bytes());
        let c = CString::new(capped.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C strings and a buffer of the given size.
        let set = unsafe {
            libc::setxattr(
                c.as_ptr(),
                c"security.capability".as_ptr(),
                blob.as_ptr().cast(),
                blob.len(),
                0,
            )
        };
        if set == 0 {
            assert_eq!(scan(10, 100).unwrap().as_deref(), Some("top/a/b/capped"));
        }
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(&other);
    }

    fn open(p: &Path) -> OwnedFd {
        let c = CString::new(p.as_os_str().as_bytes()).expect("path");
        // SAFETY: a valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0, "open {}", p.display());
        // SAFETY: a fresh descriptor.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    const CAPS: Caps = Caps {
        depth: 16,
        entries: 1000,
        bytes: 1 << 20,
    };

    #[test]
    fn a_copy_is_sealed_keeps_links_as_links_and_leaves_out_special_files() {
        let d = scratch("copy");
        let src = d.join("src");
        let dst = d.join("dst");
        std::fs::create_dir_all(src.join("bin")).expect("mkdir");
        std::fs::create_dir(&dst).expect("mkdir");
        std::fs::write(src.join("bin/tool"), b"#!/bin/sh\n").expect("write");
        std::fs::set_permissions(
            src.join("bin/tool"),
            std::fs::Permissions::from_mode(0o6777),
        )
        .expect("chmod");
        std::fs::write(src.join("data"), b"x").expect("write");
        std::fs::set_permissions(src.join("data"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        // A link to a host folder: copied as a link, never followed.
        let outside = d.join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::os::unix::fs::symlink(&outside, src.join("node_modules")).expect("symlink");
        let fifo = CString::new(src.join("fifo").as_os_str().as_bytes()).expect("c");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        let got = copy_sealed(&open(&src), &open(&dst), &CAPS, "src").expect("copy");
        let mode = |p: &str| {
            std::fs::symlink_metadata(dst.join(p))
                .map(|m| m.mode() & 0o7777)
                .unwrap_or(0)
        };
        assert_eq!(
            (mode(""), mode("bin"), mode("bin/tool"), mode("data")),
            (0o555, 0o555, 0o555, 0o444)
        );
        assert!(!dst.join("fifo").exists());
        assert_eq!(
            std::fs::read_link(dst.join("node_modules")).expect("a link"),
            outside
        );
        assert_eq!(
            std::fs::metadata(&outside).expect("stat").mode() & 0o777,
            0o700,
            "the link's target was left alone"
        );
        assert_eq!(
            (got.files, got.folders, got.links, got.skipped),
            (2, 1, 1, 1)
        );
        remove(&d).expect("remove");
        assert!(!d.exists());
    }

    #[test]
    fn caps_hold() {
        let d = scratch("caps");
        let src = d.join("src");
        let mut deep = src.clone();
        for _ in 0..20 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).expect("mkdir");
        let dst = d.join("dst");
        std::fs::create_dir(&dst).expect("mkdir");
        let e = copy_sealed(&open(&src), &open(&dst), &CAPS, "src").expect_err("too deep");
        assert!(matches!(e, TreeError::TooDeep { limit: 16, .. }), "{e}");
        remove(&dst).expect("remove");
        std::fs::create_dir(&dst).expect("mkdir");
        // A sparse file that claims more than it holds counts what it gives when read.
        let big = std::fs::File::create(src.join("big")).expect("create");
        big.set_len(4 << 20).expect("truncate");
        let caps = Caps { depth: 64, ..CAPS };
        let e = copy_sealed(&open(&src), &open(&dst), &caps, "src").expect_err("too big");
        assert!(matches!(e, TreeError::TooBig { .. }), "{e}");
        remove(&dst).expect("remove");
        std::fs::create_dir(&dst).expect("mkdir");
        std::fs::remove_file(src.join("big")).expect("rm");
        for i in 0..30 {
            std::fs::write(src.join(format!("f{i}")), b"").expect("write");
        }
        let caps = Caps {
            depth: 64,
            entries: 40,
            bytes: 1 << 20,
        };
        let e = copy_sealed(&open(&src), &open(&dst), &caps, "src").expect_err("too many");
        assert!(matches!(e, TreeError::TooMany { limit: 40 }), "{e}");
        remove(&d).expect("remove");
    }

    #[test]
    fn remove_goes_any_depth_and_never_through_a_link() {
        let d = scratch("remove");
        // Deeper than any stack would take by recursion with a frame per level, and than
        // the descriptor table holds.
        let top = d.join("tree");
        std::fs::create_dir(&top).expect("mkdir");
        let mut dir = open(&top);
        for _ in 0..5000 {
            // SAFETY: valid C strings.
            let made = unsafe { libc::mkdirat(dir.as_raw_fd(), c"d".as_ptr(), 0o755) };
            assert_eq!(made, 0);
            dir = open_dir_at(dir.as_raw_fd(), c"d").expect("open");
        }
        // SAFETY: a valid C string; a read-only folder at the bottom.
        let made = unsafe { libc::mkdirat(dir.as_raw_fd(), c"ro".as_ptr(), 0o555) };
        assert_eq!(made, 0);
        drop(dir);
        let kept = d.join("kept");
        std::fs::create_dir(&kept).expect("mkdir");
        std::fs::write(kept.join("file"), b"keep me").expect("write");
        std::os::unix::fs::symlink(&kept, d.join("tree/link")).expect("symlink");
        remove(&d.join("tree")).expect("remove");
        assert!(!d.join("tree").exists());
        assert_eq!(std::fs::read(kept.join("file")).expect("kept"), b"keep me");
        remove(&d.join("nothing-here")).expect("absent is removed");
        remove(&d).expect("remove");
    }
}
