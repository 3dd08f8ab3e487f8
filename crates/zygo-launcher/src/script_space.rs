//! A runtime pool's `/run/script`: the launcher writes each call's script there, from
//! outside, through the writable mount init handed over (the sandbox's own mount of it is
//! read-only). A script is there only while calls in flight run it: the last of them to
//! end removes it. So a call can find (even by `stat` on a guessed digest) only the
//! scripts of the calls running beside it, and those are its own tenant's: the supervisor
//! never gives two tenants children of one zygote at the same time. The space is a tmpfs
//! of the pool's scratch size: a script is refused (the call with it, before anything
//! runs) when it is larger than the whole space, or when scripts of calls in flight fill
//! it.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Why a call's script could not be placed.
#[derive(Debug)]
pub enum Refused {
    /// It is larger than the whole script space.
    TooLarge(String),
    /// Scripts of calls in flight fill the space: retry.
    Full(String),
    /// Anything else (a bad digest, an I/O error).
    Failed(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooLarge(m) | Refused::Full(m) | Refused::Failed(m) => f.write_str(m),
        }
    }
}

struct Held {
    bytes: u64,
    /// Calls in flight running it.
    users: usize,
}

pub struct ScriptSpace {
    dir: OwnedFd,
    /// As root, the host ids scripts are written as (the sandbox's `nobody`).
    owner: Option<(u32, u32)>,
    held: HashMap<String, Held>,
    /// The script each slot's call runs.
    by_slot: HashMap<String, String>,
}

/// What a file of `bytes` takes in the tmpfs: its pages, and one for good measure (the
/// inode and the directory entry).
fn cost(bytes: u64) -> u64 {
    bytes.div_ceil(4096) * 4096 + 4096
}

fn digest_name(digest: &str) -> Result<CString, Refused> {
    if digest.len() != 64
        || !digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(Refused::Failed(
            "a script digest that is not 64 lowercase hex digits".into(),
        ));
    }
    CString::new(digest).map_err(|_| Refused::Failed("a digest with a NUL byte".into()))
}

impl ScriptSpace {
    pub fn new(dir: OwnedFd, owner: Option<(u32, u32)>) -> ScriptSpace {
        ScriptSpace {
            dir,
            owner,
            held: HashMap::new(),
            by_slot: HashMap::new(),
        }
    }

    /// (total, free) bytes of the space.
    fn space(&self) -> std::io::Result<(u64, u64)> {
        // SAFETY: fstatvfs into a zeroed struct, on a descriptor we hold.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstatvfs(self.dir.as_raw_fd(), &mut st) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let unit = st.f_frsize;
        Ok((st.f_blocks * unit, st.f_bavail * unit))
    }

    /// Put the script of `slot`'s call in the space (if it is not there already); its path
    /// inside the sandbox.
    pub fn place(&mut self, slot: &str, s: &proto::launch::Script) -> Result<String, Refused> {
        let name = digest_name(&s.digest)?;
        let path = format!("/run/script/{}", s.digest);
        if let Some(h) = self.held.get_mut(&s.digest) {
            h.users += 1;
            self.by_slot.insert(slot.to_string(), s.digest.clone());
            return Ok(path);
        }
        let need = cost(s.source.len() as u64);
        let io = |what: &str, e: std::io::Error| Refused::Failed(format!("{what}: {e}"));
        let (total, free) = self
            .space()
            .map_err(|e| io("read the script space's size", e))?;
        if need > total {
            return Err(Refused::TooLarge(format!(
                "a script of {} bytes does not fit this pool's script space of {} bytes (its scratch size; raise scratch in sandbox.toml)",
                s.source.len(),
                total
            )));
        }
        if free < need {
            return Err(Refused::Full(format!(
                "this pool's script space ({total} bytes) is full of the scripts of calls in flight; retry when one ends"
            )));
        }
        match self.write(&name, &s.source) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                return Err(Refused::Full(format!(
                    "this pool's script space ({total} bytes) is full; retry when a call ends"
                )))
            }
            Err(e) => return Err(io("write a script into the sandbox", e)),
        }
        self.held.insert(
            s.digest.clone(),
            Held {
                bytes: s.source.len() as u64,
                users: 1,
            },
        );
        self.by_slot.insert(slot.to_string(), s.digest.clone());
        Ok(path)
    }

    /// The call of `slot` is over (or never ran): once no call runs its script, the
    /// script is removed, so the next call (perhaps another tenant's) cannot find it.
    pub fn release(&mut self, slot: &str) {
        if let Some(d) = self.by_slot.remove(slot) {
            let unused = self.held.get_mut(&d).is_some_and(|h| {
                h.users = h.users.saturating_sub(1);
                h.users == 0
            });
            if unused {
                self.evict(&d);
            }
        }
    }

    fn evict(&mut self, digest: &str) {
        let Some(h) = self.held.remove(digest) else {
            return;
        };
        let Ok(name) = CString::new(digest) else {
            return;
        };
        // SAFETY: unlinkat relative to our directory descriptor, with a C string name.
        let removed =
            self.as_owner(|| unsafe { libc::unlinkat(self.dir.as_raw_fd(), name.as_ptr(), 0) });
        if removed < 0 {
            log::warn!(
                "launcher: evict script {digest} from the sandbox: {}",
                std::io::Error::last_os_error()
            );
        } else {
            log::debug!(
                "launcher: removed script {digest} ({} bytes): no call runs it",
                h.bytes
            );
        }
    }

    /// Write a new file, 0444, as the sandbox's `nobody` when running as root (so the
    /// sandbox sees it owned by someone it is not). A partial file is removed.
    fn write(&self, name: &CString, source: &[u8]) -> std::io::Result<()> {
        self.as_owner(|| {
            let r = write_new(self.dir.as_raw_fd(), name, source);
            if r.is_err() {
                // SAFETY: unlinkat relative to our directory descriptor.
                unsafe { libc::unlinkat(self.dir.as_raw_fd(), name.as_ptr(), 0) };
            }
            r
        })
    }

    /// Run `f` with the filesystem ids of the folder's owner (the sandbox's `nobody`, as
    /// root), who alone may write and remove its files (it is 0311 and the relay is not
    /// root once confined); then back to the relay's own.
    fn as_owner<T>(&self, f: impl FnOnce() -> T) -> T {
        // SAFETY: setfsgid/setfsuid only change this thread's filesystem ids; each returns
        // the id from before, to go back to.
        let before = self
            .owner
            .map(|(uid, gid)| unsafe { (libc::setfsuid(uid), libc::setfsgid(gid)) });
        let r = f();
        if let Some((uid, gid)) = before {
            // SAFETY: back to the relay's own filesystem ids.
            unsafe {
                libc::setfsuid(uid as u32);
                libc::setfsgid(gid as u32);
            }
        }
        r
    }
}

fn write_new(dir: RawFd, name: &CString, source: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let open = || {
        // SAFETY: openat relative to a directory descriptor we hold, with a C string name.
        unsafe {
            libc::openat(
                dir,
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o444 as libc::c_uint,
            )
        }
    };
    let mut fd = open();
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
        // Nothing inside can create files here, so this is one of ours whose record went
        // (an earlier write that failed half-way): replace it.
        // SAFETY: unlinkat relative to our directory descriptor.
        unsafe { libc::unlinkat(dir, name.as_ptr(), 0) };
        fd = open();
    }
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat returned a fresh descriptor that we now own.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.write_all(source)
}
