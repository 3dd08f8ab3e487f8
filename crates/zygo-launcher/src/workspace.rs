//! A request's workspace: a tar unpacked into the request's own directory before its
//! request is delivered, and that directory packed back into a tar once its handler has
//! answered (a call with `out`).
//!
//! Every request of a zygote has a tmpfs of its own on `/work`, mounted by the mounter in
//! the request's mount namespace (see `scratch`), which hands the launcher a descriptor of
//! that mount's root. The launcher makes the request's directory there itself,
//! `/work/<32 random hex digits>` (0700, owned by the request's user), holds a descriptor
//! of it, and tells the child its name; the child starts in it.
//!
//! Both directions run in the launcher, outside the sandbox, on a tree the sandbox may
//! have changed, so nothing in it is trusted:
//! - Everything is reached through directory descriptors, one name at a time
//!   (`openat`/`mkdirat` with `O_NOFOLLOW`; files created `O_CREAT|O_EXCL`), never by a
//!   path, and every descriptor is checked to be on the request's own tmpfs (its device).
//! - Both act as the request's user (its filesystem uid and gid, as root), so they can
//!   reach nothing the request could not.
//! - Unpacking: only regular files and directories; no links, devices or fifos; no `..`,
//!   no absolute path, no NUL; at most [`MAX_DEPTH`] levels; modes are Zygo's (0600 files,
//!   0700 folders), not the archive's; the entries (folders made on the way included) and
//!   the bytes are counted as they are written, never taken from a header. The `tar`
//!   crate only parses; it never touches the file system.
//! - Packing: each folder is opened from the one it was listed in, by name, with
//!   `O_NOFOLLOW|O_NONBLOCK`, and what was opened is checked with `fstat`. A name that has
//!   become a link, a fifo, a socket or a device since it was listed is skipped; the
//!   request's folder itself replaced by a link is not packed at all. Nothing waits on
//!   anything the sandbox holds. The output is written by [`TarWriter`], from bytes read
//!   through those descriptors, and stops at the caps (what does not fit is left out and
//!   the answer says so).

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most entries an archive may have, folders made on the way included; also the most
/// a packed directory may hold.
pub const MAX_ENTRIES: usize = 10_000;
/// The deepest path, in levels below the request's directory.
pub const MAX_DEPTH: usize = 64;
/// The longest name of one file or folder (the kernel's own limit).
const NAME_MAX: usize = 255;
/// Modes of what is unpacked.
const FILE_MODE: libc::mode_t = 0o600;
const DIR_MODE: libc::mode_t = 0o700;
/// How a tmpfs says what it is (`statfs(2)`).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Why a workspace was not unpacked: the message names the entry and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// A cap was reached (entries, bytes, the request's scratch space).
    pub too_large: bool,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn refuse(message: impl Into<String>) -> Refusal {
    Refusal {
        too_large: false,
        message: message.into(),
    }
}

fn too_large(message: impl Into<String>) -> Refusal {
    Refusal {
        too_large: true,
        message: message.into(),
    }
}

/// An entry's name for a message: lossy UTF-8, at most 120 characters.
fn shown(path: &[u8]) -> String {
    let text = String::from_utf8_lossy(path);
    let mut s: String = text.chars().take(120).collect();
    if text.chars().count() > 120 {
        s.push('…');
    }
    format!("{s:?}")
}

// --- System calls ---------------------------------------------------------------------------

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn c_name(name: &[u8]) -> std::io::Result<CString> {
    CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn openat(
    dir: RawFd,
    name: &[u8],
    flags: libc::c_int,
    mode: libc::mode_t,
) -> std::io::Result<OwnedFd> {
    let name = c_name(name)?;
    // SAFETY: openat relative to a descriptor the caller holds, with a C string name.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn mkdirat(dir: RawFd, name: &[u8], mode: libc::mode_t) -> std::io::Result<()> {
    let name = c_name(name)?;
    // SAFETY: mkdirat relative to a descriptor the caller holds, with a C string name.
    if unsafe { libc::mkdirat(dir, name.as_ptr(), mode) } < 0 {
        return Err(errno());
    }
    Ok(())
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat buffer is a valid argument; fstat fills it in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on a descriptor the caller holds.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(errno());
    }
    Ok(st)
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// A folder below `dir`, opened without following a link and without waiting.
fn open_dir(dir: RawFd, name: &[u8]) -> std::io::Result<OwnedFd> {
    openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    )
}

fn write_all(fd: RawFd, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: write from a buffer valid for its length, to a descriptor we hold.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = errno();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// The names in a folder (not `.` and `..`), read from its descriptor, at most `max` of
/// them; true as well when there were more.
fn list(dir: RawFd, max: usize) -> std::io::Result<(Vec<Vec<u8>>, bool)> {
    let mut names = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: getdents64 into a buffer of ours, valid for its length.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir,
                buf.as_mut_ptr(),
                buf.len() as libc::c_uint,
            )
        };
        if n < 0 {
            return Err(errno());
        }
        if n == 0 {
            return Ok((names, false));
        }
        let mut at = 0usize;
        // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
        while at + 19 < n as usize {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen < 20 || at + reclen > n as usize {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            let raw = &buf[at + 19..at + reclen];
            let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
            if name != b"." && name != b".." {
                if names.len() == max {
                    return Ok((names, true));
                }
                names.push(name.to_vec());
            }
            at += reclen;
        }
    }
}

/// While alive, this thread's file system ids are the request's (as root; see
/// `setfsuid(2)`: a non-zero fsuid also takes away the capabilities that bypass file
/// permissions). `None`: the launcher already is the request's user.
struct ActAs {
    before: Option<(u32, u32)>,
}

impl ActAs {
    fn new(ids: Option<(u32, u32)>) -> Result<ActAs, String> {
        let Some((uid, gid)) = ids else {
            return Ok(ActAs { before: None });
        };
        // SAFETY: setfsgid/setfsuid change only this thread's file system ids. Each
        // returns the ids from before the call, so a second call with the same id says
        // whether the first took (the relay's seccomp table refuses any id outside the
        // sandbox's, -1 included).
        let (old_gid, old_uid, now_gid, now_uid) = unsafe {
            let old_gid = libc::setfsgid(gid) as u32;
            let old_uid = libc::setfsuid(uid) as u32;
            (
                old_gid,
                old_uid,
                libc::setfsgid(gid) as u32,
                libc::setfsuid(uid) as u32,
            )
        };
        let guard = ActAs {
            before: Some((old_uid, old_gid)),
        };
        if (now_uid, now_gid) != (uid, gid) {
            return Err(format!(
                "could not act as the request's user ({uid}:{gid}) to reach its directory"
            ));
        }
        Ok(guard)
    }
}

impl Drop for ActAs {
    fn drop(&mut self) {
        if let Some((uid, gid)) = self.before {
            // SAFETY: back to the ids this thread had.
            unsafe {
                libc::setfsuid(uid);
                libc::setfsgid(gid);
            }
        }
    }
}

// --- The request's directory ----------------------------------------------------------------

/// A request's own directory: `/work/<name>` on the request's own tmpfs.
pub struct Workdir {
    /// The root of the request's `/work` tmpfs.
    root: OwnedFd,
    /// The directory as it was made.
    dir: OwnedFd,
    /// 32 lowercase hex digits (128 random bits).
    pub name: String,
    /// The tmpfs's device: everything reached must be on it.
    dev: u64,
    /// As root, the host ids the request runs as.
    ids: Option<(u32, u32)>,
}

fn random_name() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: getrandom into the rest of a buffer of ours.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = errno();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Workdir {
    /// Make the request's directory in `root` (the root of its own `/work` tmpfs, as the
    /// mounter opened it), acting as `ids` (host uid and gid; `None`: as we are).
    pub fn create(root: OwnedFd, ids: Option<(u32, u32)>) -> Result<Workdir, String> {
        // SAFETY: a zeroed statfs buffer is a valid argument; fstatfs fills it in.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on a descriptor we hold.
        if unsafe { libc::fstatfs(root.as_raw_fd(), &mut sfs) } < 0 {
            return Err(format!("statfs the request's /work: {}", errno()));
        }
        if sfs.f_type as i64 != TMPFS_MAGIC {
            return Err("the request's /work is not its own tmpfs".into());
        }
        let rst = fstat(root.as_raw_fd()).map_err(|e| format!("stat the request's /work: {e}"))?;
        if !is_dir(&rst) {
            return Err("the request's /work is not a directory".into());
        }
        let name = random_name().map_err(|e| format!("pick a directory name: {e}"))?;
        let _as = ActAs::new(ids)?;
        mkdirat(root.as_raw_fd(), name.as_bytes(), DIR_MODE)
            .map_err(|e| format!("make the request's directory: {e}"))?;
        let dir = open_dir(root.as_raw_fd(), name.as_bytes())
            .map_err(|e| format!("open the request's directory: {e}"))?;
        let st =
            fstat(dir.as_raw_fd()).map_err(|e| format!("stat the request's directory: {e}"))?;
        if st.st_dev != rst.st_dev {
            return Err("the request's directory is not on its /work".into());
        }
        // Whatever the launcher's umask made of it.
        if st.st_mode & 0o7777 != DIR_MODE {
            // SAFETY: fchmod on a descriptor we hold.
            if unsafe { libc::fchmod(dir.as_raw_fd(), DIR_MODE) } < 0 {
                return Err(format!("chmod the request's directory: {}", errno()));
            }
        }
        Ok(Workdir {
            root,
            dir,
            name,
            dev: rst.st_dev,
            ids,
        })
    }

    /// Unpack `tar` into the directory (before the request is delivered), writing at most
    /// `max_bytes` of file data.
    pub fn unpack(&self, tar: &[u8], max_bytes: u64) -> Result<Unpacked, Refusal> {
        let _as = ActAs::new(self.ids).map_err(refuse)?;
        unpack(
            self.dir.as_fd(),
            tar,
            &Limits {
                max_bytes,
                max_entries: MAX_ENTRIES,
                max_depth: MAX_DEPTH,
            },
        )
    }

    /// A call's workspace, if it has one, unpacked under the cap for a request whose
    /// scratch space is `scratch` bytes (at most `MAX_WORKSPACE` whatever that is).
    pub fn unpack_call(
        &self,
        tar: Option<&proto::bytes::Bytes>,
        scratch: u64,
    ) -> Result<(), Refusal> {
        match tar {
            Some(t) => {
                let cap = (proto::front::MAX_WORKSPACE as u64).min(scratch);
                self.unpack(t, cap).map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// Pack the directory as it is now (after the handler answered), reopening it by name
    /// from `/work`: a directory swapped for anything else is not packed.
    pub fn pack(&self, max_bytes: usize) -> Packed {
        let _as = match ActAs::new(self.ids) {
            Ok(a) => a,
            Err(e) => {
                return Packed {
                    tar: None,
                    truncated: false,
                    note: Some(e),
                }
            }
        };
        pack(
            self.root.as_fd(),
            self.name.as_bytes(),
            self.dev,
            &PackLimits {
                max_bytes,
                max_entries: MAX_ENTRIES,
                max_depth: MAX_DEPTH,
            },
        )
    }
}

// --- Unpacking ------------------------------------------------------------------------------

/// The caps of one unpack.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// File data written, in bytes.
    pub max_bytes: u64,
    /// Entries, folders made on the way included.
    pub max_entries: usize,
    /// Levels below the directory.
    pub max_depth: usize,
}

/// What an unpack wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    pub files: usize,
    pub dirs: usize,
    pub bytes: u64,
}

/// The components of an entry's path, each a plain name; the rules for paths enforced.
fn components(path: &[u8], max_depth: usize) -> Result<Vec<&[u8]>, Refusal> {
    let name = shown(path);
    if path.is_empty() {
        return Err(refuse("an entry with an empty name"));
    }
    if path.contains(&0) {
        return Err(refuse(format!("entry {name} has a NUL byte in its name")));
    }
    if path[0] == b'/' {
        return Err(refuse(format!(
            "entry {name} is an absolute path; only paths inside the directory are allowed"
        )));
    }
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                return Err(refuse(format!(
                "entry {name} has a '..' in its path; only paths inside the directory are allowed"
            )))
            }
            c if c.len() > NAME_MAX => {
                return Err(refuse(format!(
                    "entry {name} has a name longer than {NAME_MAX} bytes"
                )))
            }
            c => out.push(c),
        }
    }
    if out.len() > max_depth {
        return Err(refuse(format!(
            "entry {name} is {} levels deep (at most {max_depth})",
            out.len()
        )));
    }
    Ok(out)
}

/// Why an entry of this type is refused; None for the types that are unpacked or skipped.
fn refused_type(t: tar::EntryType) -> Option<&'static str> {
    use tar::EntryType as T;
    match t {
        T::Regular | T::Continuous | T::Directory | T::XGlobalHeader => None,
        T::Symlink => Some("a symbolic link"),
        T::Link => Some("a hard link"),
        T::Char => Some("a character device"),
        T::Block => Some("a block device"),
        T::Fifo => Some("a fifo"),
        T::GNUSparse => Some("a sparse file"),
        _ => Some("an entry of a type Zygo does not unpack"),
    }
}

/// The state of one unpack: the caps, what was counted, and the folders of the last path
/// still open (archives list a folder's entries together, so most entries reuse them).
struct Unpacker<'a> {
    top: BorrowedFd<'a>,
    dev: u64,
    lim: Limits,
    entries: usize,
    made: Unpacked,
    chain: Vec<(Vec<u8>, OwnedFd)>,
}

impl Unpacker<'_> {
    fn count(&mut self, name: &str) -> Result<(), Refusal> {
        self.entries += 1;
        if self.entries > self.lim.max_entries {
            return Err(too_large(format!(
                "the workspace has more than {} entries (at {name})",
                self.lim.max_entries
            )));
        }
        Ok(())
    }

    fn check_dev(&self, fd: RawFd, name: &str) -> Result<libc::stat, Refusal> {
        let st = fstat(fd).map_err(|e| refuse(format!("stat {name}: {e}")))?;
        if st.st_dev != self.dev {
            return Err(refuse(format!("{name} is not on the request's own /work")));
        }
        Ok(st)
    }

    /// The folder `parents` names (made where missing), as an open descriptor.
    fn parent(&mut self, parents: &[&[u8]], name: &str) -> Result<RawFd, Refusal> {
        let mut keep = 0;
        while keep < self.chain.len()
            && keep < parents.len()
            && self.chain[keep].0.as_slice() == parents[keep]
        {
            keep += 1;
        }
        self.chain.truncate(keep);
        for comp in &parents[keep..] {
            let cur = self
                .chain
                .last()
                .map_or(self.top.as_raw_fd(), |c| c.1.as_raw_fd());
            let fd = match open_dir(cur, comp) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    self.count(name)?;
                    mkdirat(cur, comp, DIR_MODE)
                        .map_err(|e| io_refusal(name, "make a folder for", e))?;
                    self.made.dirs += 1;
                    open_dir(cur, comp).map_err(|e| io_refusal(name, "open a folder for", e))?
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
                    return Err(refuse(format!(
                        "entry {name} is inside a path that an earlier entry made a file"
                    )))
                }
                Err(e) => return Err(io_refusal(name, "open a folder for", e)),
            };
            let st = self.check_dev(fd.as_raw_fd(), name)?;
            if !is_dir(&st) {
                return Err(refuse(format!("entry {name}: a parent is not a folder")));
            }
            self.chain.push((comp.to_vec(), fd));
        }
        Ok(self
            .chain
            .last()
            .map_or(self.top.as_raw_fd(), |c| c.1.as_raw_fd()))
    }

    fn entry<R: Read>(&mut self, e: &mut tar::Entry<'_, R>) -> Result<(), Refusal> {
        let kind = e.header().entry_type();
        let path = e.path_bytes().into_owned();
        let name = shown(&path);
        if kind == tar::EntryType::XGlobalHeader {
            // Archive-wide metadata (`git archive` writes one): nothing to unpack.
            return self.count(&name);
        }
        if let Some(why) = refused_type(kind) {
            return Err(refuse(format!(
                "entry {name} is {why}; a workspace may hold only regular files and folders"
            )));
        }
        let comps = components(&path, self.lim.max_depth)?;
        let Some((last, parents)) = comps.split_last() else {
            // "." or "./": the directory itself.
            if kind == tar::EntryType::Directory {
                return self.count(&name);
            }
            return Err(refuse(format!("entry {name} is a file with no name")));
        };
        let dir = self.parent(parents, &name)?;
        self.count(&name)?;
        if kind == tar::EntryType::Directory {
            match mkdirat(dir, last, DIR_MODE) {
                Ok(()) => self.made.dirs += 1,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    // Made on the way for an earlier entry, or named twice: fine if it is
                    // a folder.
                    let fd = open_dir(dir, last).map_err(|_| {
                        refuse(format!(
                            "entry {name} is a folder, and an earlier entry made it a file"
                        ))
                    })?;
                    self.check_dev(fd.as_raw_fd(), &name)?;
                }
                Err(e) => return Err(io_refusal(&name, "make", e)),
            }
            return Ok(());
        }
        // A regular file. Its header's size is a claim: refused at once when it could not
        // fit, and the bytes are counted as they are written all the same.
        let room = self.lim.max_bytes.saturating_sub(self.made.bytes);
        let claimed = e.size();
        if claimed > room {
            return Err(too_large(format!(
                "entry {name} ({claimed} bytes) takes the workspace past its cap of {} bytes",
                self.lim.max_bytes
            )));
        }
        let fd = openat(
            dir,
            last,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            FILE_MODE,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) => refuse(format!("entry {name} appears twice in the archive")),
            _ => io_refusal(&name, "create", e),
        })?;
        let st = self.check_dev(fd.as_raw_fd(), &name)?;
        if st.st_mode & 0o7777 != FILE_MODE {
            // SAFETY: fchmod on a descriptor we hold.
            if unsafe { libc::fchmod(fd.as_raw_fd(), FILE_MODE) } < 0 {
                return Err(io_refusal(&name, "chmod", errno()));
            }
        }
        let mut written: u64 = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = e.read(&mut buf).map_err(|err| {
                refuse(format!(
                    "entry {name} cannot be read from the archive: {err}"
                ))
            })?;
            if n == 0 {
                break;
            }
            written += n as u64;
            self.made.bytes += n as u64;
            if self.made.bytes > self.lim.max_bytes {
                return Err(too_large(format!(
                    "entry {name} takes the workspace past its cap of {} bytes",
                    self.lim.max_bytes
                )));
            }
            write_all(fd.as_raw_fd(), &buf[..n]).map_err(|err| io_refusal(&name, "write", err))?;
        }
        if written != claimed {
            return Err(refuse(format!(
                "the archive ends inside entry {name}: its header says {claimed} bytes, {written} are there"
            )));
        }
        self.made.files += 1;
        Ok(())
    }
}

fn io_refusal(name: &str, what: &str, e: std::io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => too_large(format!(
            "the workspace does not fit the request's /work (its scratch size) at entry {name}"
        )),
        _ => refuse(format!("{what} entry {name}: {e}")),
    }
}

/// Unpack `tar` into the folder `dir` under the rules in the module's notes.
pub fn unpack(dir: BorrowedFd<'_>, tar: &[u8], lim: &Limits) -> Result<Unpacked, Refusal> {
    let top =
        fstat(dir.as_raw_fd()).map_err(|e| refuse(format!("stat the request's directory: {e}")))?;
    if !is_dir(&top) {
        return Err(refuse("the request's directory is not a folder"));
    }
    let mut u = Unpacker {
        top: dir,
        dev: top.st_dev,
        lim: *lim,
        entries: 0,
        made: Unpacked {
            files: 0,
            dirs: 0,
            bytes: 0,
        },
        chain: Vec::new(),
    };
    let mut archive = tar::Archive::new(tar);
    let entries = archive
        .entries()
        .map_err(|e| refuse(format!("the workspace is not a tar archive: {e}")))?;
    for e in entries {
        let mut e = e.map_err(|err| {
            refuse(format!(
                "the workspace is not a well-formed tar archive (after {} entries): {err}",
                u.entries
            ))
        })?;
        u.entry(&mut e)?;
    }
    Ok(u.made)
}

// --- Packing --------------------------------------------------------------------------------

/// The caps of one pack.
#[derive(Debug, Clone, Copy)]
pub struct PackLimits {
    /// The whole tar, headers and end included.
    pub max_bytes: usize,
    pub max_entries: usize,
    pub max_depth: usize,
}

/// A packed directory.
#[derive(Debug, Default)]
pub struct Packed {
    /// None: the directory was not packed (`note` says why).
    pub tar: Option<Vec<u8>>,
    /// A cap left entries out.
    pub truncated: bool,
    /// Why nothing was packed, for the log.
    pub note: Option<String>,
}

/// The folder `name` of `parent` as a tar, under the rules in the module's notes.
pub fn pack(parent: BorrowedFd<'_>, name: &[u8], dev: u64, lim: &PackLimits) -> Packed {
    let not_packed = |why: String| Packed {
        tar: None,
        truncated: false,
        note: Some(why),
    };
    let top = match open_dir(parent.as_raw_fd(), name) {
        Ok(fd) => fd,
        Err(e) => {
            return not_packed(format!(
                "the request's directory cannot be opened as a folder (it was replaced?): {e}"
            ))
        }
    };
    match fstat(top.as_raw_fd()) {
        Ok(st) if is_dir(&st) && st.st_dev == dev => {}
        _ => return not_packed("the request's directory is no longer its own folder".into()),
    }
    let mut w = TarWriter::new(lim.max_bytes);
    let mut entries = 0usize;
    let mut truncated = false;
    // Depth first; a folder is opened (by name, from its parent) when its turn comes, so
    // only the folders on the way to it are open.
    struct Pending {
        parent: std::rc::Rc<OwnedFd>,
        name: Vec<u8>,
        path: Vec<u8>,
        depth: usize,
    }
    let mut todo: Vec<Pending> = Vec::new();
    let mut current: Option<(std::rc::Rc<OwnedFd>, Vec<u8>, usize)> =
        Some((std::rc::Rc::new(top), Vec::new(), 0));
    'walk: loop {
        let (dir, path, depth) = match current.take() {
            Some(c) => c,
            None => {
                let Some(p) = todo.pop() else { break };
                let fd = match open_dir(p.parent.as_raw_fd(), &p.name) {
                    Ok(fd) => fd,
                    Err(_) => continue, // no longer a folder: skipped
                };
                match fstat(fd.as_raw_fd()) {
                    Ok(st) if is_dir(&st) && st.st_dev == dev => {}
                    _ => continue,
                }
                if !w.dir(&p.path, 0) {
                    truncated = true;
                    break;
                }
                (std::rc::Rc::new(fd), p.path, p.depth)
            }
        };
        let room = lim.max_entries.saturating_sub(entries);
        let (mut names, more) = match list(dir.as_raw_fd(), room) {
            Ok(x) => x,
            Err(_) => continue,
        };
        truncated |= more;
        names.sort();
        let mut subdirs = Vec::new();
        for n in names {
            entries += 1;
            let mut p = path.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(&n);
            let fd = match openat(
                dir.as_raw_fd(),
                &n,
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
                0,
            ) {
                Ok(fd) => fd,
                Err(_) => continue, // a link (ELOOP), a socket (ENXIO), gone, unreadable
            };
            let Ok(st) = fstat(fd.as_raw_fd()) else {
                continue;
            };
            if st.st_dev != dev {
                continue;
            }
            if is_dir(&st) {
                if depth + 1 > lim.max_depth {
                    truncated = true;
                    continue;
                }
                // Reopened by name when its turn comes: whatever it is then is checked then.
                subdirs.push(Pending {
                    parent: dir.clone(),
                    name: n,
                    path: p,
                    depth: depth + 1,
                });
                continue;
            }
            if !is_reg(&st) {
                continue; // a fifo, a socket, a device: skipped
            }
            let size = st.st_size.max(0) as u64;
            if !w.fits_file(&p, size) {
                truncated = true;
                continue;
            }
            let mut data = Vec::with_capacity(size as usize);
            if read_up_to(fd.as_raw_fd(), &mut data, size as usize).is_err() {
                continue;
            }
            if !w.file(&p, &data, st.st_mtime.max(0) as u64) {
                truncated = true;
                break 'walk;
            }
        }
        // In name order when popped.
        subdirs.reverse();
        todo.extend(subdirs);
    }
    Packed {
        tar: Some(w.finish()),
        truncated,
        note: None,
    }
}

/// Read at most `max` bytes (stopping at the end of the file): a file that grows while it
/// is read is cut where it was when it was listed.
fn read_up_to(fd: RawFd, out: &mut Vec<u8>, max: usize) -> std::io::Result<()> {
    out.resize(max, 0);
    let mut got = 0;
    while got < max {
        // SAFETY: read into the rest of a buffer of ours.
        let n = unsafe { libc::read(fd, out[got..].as_mut_ptr().cast(), max - got) };
        if n < 0 {
            let e = errno();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    out.truncate(got);
    Ok(())
}

// --- Writing a tar --------------------------------------------------------------------------

const BLOCK: usize = 512;

/// A ustar writer fed only bytes the packer read through its own descriptors: one header
/// per entry (a pax `path` record before it when the name does not fit ustar's fields),
/// modes 0644 and 0755, owner 0, never past its cap.
pub struct TarWriter {
    out: Vec<u8>,
    max: usize,
}

fn padded(n: usize) -> usize {
    n.div_ceil(BLOCK) * BLOCK
}

/// Write `v` as a NUL-terminated octal number filling `field`.
fn octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let text = format!("{v:0digits$o}");
    let bytes = text.as_bytes();
    let bytes = &bytes[bytes.len().saturating_sub(digits)..];
    field[..digits].copy_from_slice(bytes);
    field[digits] = 0;
}

/// Split a path into ustar's prefix (≤ 155) and name (≤ 100) at a '/', if it can be.
fn ustar_split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.len() <= 100 {
        return Some((&[], path));
    }
    if path.len() > 256 {
        return None;
    }
    // The last '/' that leaves a name of at most 100 bytes and a prefix of at most 155.
    (0..path.len())
        .rev()
        .filter(|&i| path[i] == b'/')
        .find(|&i| i <= 155 && path.len() - i - 1 <= 100 && i > 0 && i + 1 < path.len())
        .map(|i| (&path[..i], &path[i + 1..]))
}

/// A pax record "LEN key=value\n", LEN counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

impl TarWriter {
    pub fn new(max: usize) -> TarWriter {
        TarWriter {
            out: Vec::new(),
            max,
        }
    }

    /// Bytes the entry for `path` takes in headers.
    fn header_cost(path: &[u8]) -> usize {
        if ustar_split(path).is_some() {
            BLOCK
        } else {
            2 * BLOCK + padded(pax_record("path", path).len())
        }
    }

    /// Whether an entry of `size` bytes named `path` fits (the end blocks kept in reserve).
    fn fits(&self, path: &[u8], size: u64) -> bool {
        let need = (Self::header_cost(path) as u64).saturating_add(padded(size as usize) as u64);
        self.out.len() as u64 + need + 2 * BLOCK as u64 <= self.max as u64
    }

    pub fn fits_file(&self, path: &[u8], size: u64) -> bool {
        self.fits(path, size)
    }

    fn header(&mut self, path: &[u8], kind: u8, mode: u64, size: u64, mtime: u64) {
        let (prefix, name) = match ustar_split(path) {
            Some(split) => split,
            None => {
                let rec = pax_record("path", path);
                self.header(b"././@PaxHeader", b'x', 0o644, rec.len() as u64, 0);
                self.out.extend_from_slice(&rec);
                self.out.resize(padded(self.out.len()), 0);
                // The ustar fields get a shortened name, which readers replace.
                let cut = &path[path.len() - 100.min(path.len())..];
                (&[][..], cut)
            }
        };
        let mut h = [0u8; BLOCK];
        h[..name.len()].copy_from_slice(name);
        octal(&mut h[100..108], mode);
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], size);
        octal(&mut h[136..148], mtime.min(0o77777777777));
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[345..345 + prefix.len()].copy_from_slice(prefix);
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        octal(&mut h[148..155], sum as u64);
        h[155] = b' ';
        self.out.extend_from_slice(&h);
    }

    /// A folder entry; false (nothing written) when it does not fit.
    pub fn dir(&mut self, path: &[u8], mtime: u64) -> bool {
        let mut p = path.to_vec();
        p.push(b'/');
        if !self.fits(&p, 0) {
            return false;
        }
        self.header(&p, b'5', 0o755, 0, mtime);
        true
    }

    /// A regular file; false (nothing written) when it does not fit.
    pub fn file(&mut self, path: &[u8], data: &[u8], mtime: u64) -> bool {
        if !self.fits(path, data.len() as u64) {
            return false;
        }
        self.header(path, b'0', 0o644, data.len() as u64, mtime);
        self.out.extend_from_slice(data);
        self.out.resize(padded(self.out.len()), 0);
        true
    }

    /// The archive, with its two end blocks.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.resize(self.out.len() + 2 * BLOCK, 0);
        self.out
    }
}

#[cfg(test)]
mod tests;
