//! A request's own `/tmp` and `/work`, placed by the launcher from outside the sandbox.
//!
//! Each request's process makes a mount namespace (and an IPC namespace) of its own right
//! after its fork, while the agent's CAP_SYS_ADMIN still lets it, and registers. Landlock
//! refuses it every mount, so it cannot make its scratch space itself. The launcher holds
//! every capability over the sandbox's user namespace (as root, or as the user who created
//! it); at the zygote's start it forks a helper, the *mounter*, that enters that user
//! namespace (and so keeps no capability over the host's) and waits. For each request the
//! launcher checks the registered process, opens its mount namespace and hands that to the
//! mounter, which enters it, mounts a fresh tmpfs on `/tmp` and one on `/work`, goes back
//! to the sandbox's own mount namespace (holding nothing of the request's) and answers.
//! Whatever the request writes in them is seen by no other request and is gone when its
//! last process is: the namespace, and the mounts with it, go when nothing is left in it.
//! The relay never waits for the mounter: it polls the mounter's answers with the rest.
//!
//! When a request is let go, the mounter may also shrink its `/tmp` and `/work` (a tenant's
//! scratch limit) and give it its secrets: a small tmpfs of the request's own on
//! `/run/secrets` (mode 0500, owned by the request's uid), one file per secret (mode 0400,
//! the request's uid), then made read-only. Nothing else can see it (no other process is
//! in that mount namespace), and it goes with the namespace when the request's last
//! process does.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Why a request could not be given its scratch space.
#[derive(Debug)]
pub struct ScratchError(pub String);

impl std::fmt::Display for ScratchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn open_ns(pid: i32, which: &str) -> Result<OwnedFd, ScratchError> {
    let path = CString::new(format!("/proc/{pid}/ns/{which}"))
        .map_err(|_| ScratchError("a namespace path with a NUL byte".into()))?;
    // SAFETY: open with a valid C string; the descriptor is ours.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(ScratchError(format!(
            "open the {which} namespace of process {pid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn inode(fd: &OwnedFd) -> Option<(u64, u64)> {
    // SAFETY: fstat into a zeroed stat buffer, on a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Whether the process behind `pidfd` is still alive: then a `/proc/<pid>` opened since
/// `pidfd` was made was that process's (its pid cannot have been reused meanwhile).
fn alive(pidfd: &OwnedFd) -> bool {
    plumbing::sys::pidfd_alive(pidfd)
}

/// The mounter of one zygote (see the module's notes): a helper process, and the
/// requests handed to it, answered in order.
pub struct Mounter {
    pid: libc::pid_t,
    sock: OwnedFd,
    /// Slots handed over and not answered yet, oldest first.
    waiting: std::collections::VecDeque<String>,
}

/// What the mounter answers: a step (0 when all went well) and its errno.
const ANSWER: usize = 5;

/// The largest message the mounter reads: a `c` header and the secrets.
const MAX_MESSAGE: usize = 32
    + proto::launch::MAX_REQUEST_SECRETS * (2 + 64 + 4)
    + proto::launch::MAX_REQUEST_SECRET_BYTES;

impl Mounter {
    /// Fork the mounter for a sandbox whose requests' scratch space is `size` bytes each.
    pub fn start(sandbox: &SandboxNs, size: u64) -> Result<Mounter, ScratchError> {
        let opts = CString::new(format!("mode=1777,size={size}"))
            .map_err(|_| ScratchError("mount options with a NUL byte".into()))?;
        let (ours, theirs) = plumbing::pipes::socketpair(libc::SOCK_SEQPACKET)
            .map_err(|e| ScratchError(format!("create the mounter's socket: {e}")))?;
        // Room for the largest message (secrets included) in one datagram.
        let buf = (2 * MAX_MESSAGE) as libc::c_int;
        // SAFETY: setsockopt with an int option on a socket we hold.
        unsafe {
            libc::setsockopt(
                ours.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&buf as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        // SAFETY: this process is single-threaded, so the forked child may go on running;
        // it only makes system calls (and ends with _exit).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(ScratchError(format!(
                "fork the mounter: {}",
                std::io::Error::last_os_error()
            )));
        }
        if pid == 0 {
            drop(ours);
            mounter_main(
                theirs.as_raw_fd(),
                sandbox.user.as_raw_fd(),
                sandbox.mnt.as_raw_fd(),
                &opts,
            );
        }
        drop(theirs);
        Ok(Mounter {
            pid,
            sock: ours,
            waiting: std::collections::VecDeque::new(),
        })
    }

    /// What to poll for the mounter's answers.
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Check the process `pid` registered for `slot` (see [`check`]) and hand its mount
    /// namespace to the mounter; the answer comes through [`Mounter::answer`].
    pub fn request(
        &mut self,
        slot: &str,
        pid: i32,
        sandbox: &SandboxNs,
    ) -> Result<(), ScratchError> {
        let mnt = check(pid, sandbox)?;
        plumbing::fds::send_with_fds(self.sock.as_raw_fd(), b"m", &[mnt.as_raw_fd()])
            .map_err(|e| ScratchError(format!("hand a request to the mounter: {e}")))?;
        self.waiting.push_back(slot.to_string());
        Ok(())
    }

    /// Before the request of `slot` reaches its parked process `pid` (checked as for
    /// [`Mounter::request`]): shrink its `/tmp` and `/work` to `shrink` bytes each (if
    /// given), and give it `secrets` in its own `/run/secrets`. The answer comes through
    /// [`Mounter::answer`] like a mount's.
    pub fn prepare(
        &mut self,
        slot: &str,
        pid: i32,
        sandbox: &SandboxNs,
        shrink: Option<u64>,
        secrets: &[proto::launch::SecretFile],
    ) -> Result<(), ScratchError> {
        let pidfd = plumbing::sys::pidfd_open(pid)
            .map_err(|e| ScratchError(format!("open process {pid}: {e}")))?;
        let mnt = check(pid, sandbox)?;
        let (uid, gid) = if secrets.is_empty() {
            (0, 0)
        } else {
            let ids = request_ids(pid, sandbox.init)?;
            if !alive(&pidfd) {
                return Err(ScratchError(format!(
                    "process {pid} exited before its secrets were written"
                )));
            }
            ids
        };
        let msg = prepare_message(shrink.unwrap_or(0), uid, gid, secrets)?;
        plumbing::fds::send_with_fds(self.sock.as_raw_fd(), &msg, &[mnt.as_raw_fd()])
            .map_err(|e| ScratchError(format!("hand a request to the mounter: {e}")))?;
        self.waiting.push_back(slot.to_string());
        Ok(())
    }

    /// The next answer (poll said one is there): its slot, and, when the mounts (or the
    /// preparation) are done, the root of the request's new `/work` (after a mount; `None`
    /// after a preparation). `Err` when the mounter itself is gone or broke its protocol.
    #[allow(clippy::type_complexity)]
    pub fn answer(
        &mut self,
    ) -> Result<(String, Result<Option<OwnedFd>, ScratchError>), ScratchError> {
        let mut buf = [0u8; ANSWER];
        let (n, mut fds) = plumbing::fds::recv_with_fds(self.sock.as_raw_fd(), &mut buf, 1)
            .map_err(|e| ScratchError(format!("the mounter's answer: {e}")))?;
        if n != ANSWER {
            return Err(ScratchError("the mounter ended".into()));
        }
        let slot = self
            .waiting
            .pop_front()
            .ok_or_else(|| ScratchError("the mounter answered what nobody asked".into()))?;
        let errno = i32::from_ne_bytes([buf[1], buf[2], buf[3], buf[4]]);
        let why = std::io::Error::from_raw_os_error(errno);
        let result = match buf[0] {
            0 => Ok(fds.pop()),
            11 => Err(ScratchError(format!(
                "enter the request's mount namespace: {why}"
            ))),
            12 => Err(ScratchError(format!(
                "mount the request's /tmp and /work: {why}"
            ))),
            14 => Err(ScratchError(format!(
                "shrink the request's /tmp and /work: {why}"
            ))),
            15 => Err(ScratchError(format!("open the request's new /work: {why}"))),
            16 => Err(ScratchError(format!(
                "mount the request's /run/secrets: {why}"
            ))),
            17 => Err(ScratchError(format!(
                "write a file in the request's /run/secrets: {why}"
            ))),
            13 => Err(ScratchError(format!(
                "leave the request's mount namespace: {why}"
            ))),
            other => Err(ScratchError(format!(
                "the mounter failed at step {other}: {why}"
            ))),
        };
        Ok((slot, result))
    }
}

impl Drop for Mounter {
    /// Closing its socket ends the mounter; it is reaped here.
    fn drop(&mut self) {
        // SAFETY: shutting down a socket we hold (the descriptor itself closes after).
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        let mut status = 0;
        // SAFETY: reaping our own child.
        while unsafe { libc::waitpid(self.pid, &mut status, libc::__WALL) } < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
    }
}

/// The mounter: enter the sandbox's user namespace, then for each mount namespace handed
/// over, enter it, mount, come back, answer. Never returns.
fn mounter_main(sock: RawFd, user: RawFd, home: RawFd, opts: &CString) -> ! {
    let _ = crate::sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // Nothing of the launcher's but what this needs.
    crate::sys::close_fds_from(3, &[sock, user, home]);

    // With the root of the request's new /work when all went well.
    let answer_with = |step: u8, errno: i32, work: &[RawFd]| {
        let mut buf = [0u8; ANSWER];
        buf[0] = step;
        buf[1..].copy_from_slice(&errno.to_ne_bytes());
        let _ = plumbing::fds::send_with_fds(sock, &buf, work);
    };
    let answer = |step: u8, errno: i32| answer_with(step, errno, &[]);
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: setns with a namespace descriptor we hold; this process is single-threaded.
    if unsafe { libc::setns(user, libc::CLONE_NEWUSER) } != 0 {
        // Every answer says so; the launcher parks nothing.
        let e = errno();
        loop {
            let mut tag = [0u8; 1];
            match plumbing::fds::recv_with_fds(sock, &mut tag, 1) {
                Ok((1, _)) => answer(10, e),
                _ => exit_now(1),
            }
        }
    }
    // Into the sandbox's own mount namespace at once, and confined (below) before the
    // first message: as the host's uid 0 (with no capability over the host) it never has
    // the host's files in view, and it makes only the calls its work needs.
    // SAFETY: setns with a namespace descriptor we hold; this process is single-threaded.
    if unsafe { libc::setns(home, libc::CLONE_NEWNS) } != 0 {
        log::error!(
            "launcher: the mounter could not enter the sandbox's mount namespace: {}",
            std::io::Error::last_os_error()
        );
        exit_now(1);
    }
    // Files it creates (a request's secrets) must belong to ids the sandbox maps: it
    // creates them as the namespace's root (where the launcher's own id is not mapped,
    // as when Zygo runs as root; otherwise this changes nothing).
    // SAFETY: setfsgid/setfsuid change only this process's file-system ids.
    unsafe {
        libc::setfsgid(0);
        libc::setfsuid(0);
    }
    if let Err(e) = crate::relay::confine_mounter() {
        log::error!("launcher: the mounter: {e}");
        exit_now(1);
    }
    let fstype = c"tmpfs";
    let mut msg = vec![0u8; MAX_MESSAGE];
    loop {
        // `m`: mount a request's /tmp and /work; `c`: prepare it to be let go (see
        // `prepare_message`).
        let (n, fds) = match plumbing::fds::recv_with_fds(sock, &mut msg, 1) {
            Ok((n, fds)) if n >= 1 && fds.len() == 1 => (n, fds),
            _ => exit_now(0),
        };
        let prep = match (msg[0], n) {
            (b'm', 1) => None,
            (b'c', _) => match parse_prepare(&msg[..n]) {
                Some(p) => Some(p),
                None => exit_now(1),
            },
            _ => exit_now(1),
        };
        let mnt = fds[0].as_raw_fd();
        let mut work: RawFd = -1;
        // SAFETY: setns, mount and open with descriptors and C strings that are valid here.
        let (step, e) = unsafe {
            if libc::setns(mnt, libc::CLONE_NEWNS) != 0 {
                (11, errno())
            } else {
                let failed = match &prep {
                    None => mount_scratch(fstype, opts).and_then(|()| {
                        // The new /work's root, opened here, where only the request's own
                        // (parked, waiting) process can see it: the launcher makes the
                        // request's directory in it and unpacks its workspace through it.
                        work = libc::open(
                            c"/work".as_ptr(),
                            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                        );
                        if work < 0 {
                            Err((15, last_errno()))
                        } else {
                            Ok(())
                        }
                    }),
                    Some(p) => prepare_request(fstype, p),
                };
                let mut failed = failed.err().unwrap_or((0, 0));
                // Back home: the request's namespace is held by nothing of ours.
                if libc::setns(home, libc::CLONE_NEWNS) != 0 && failed.0 == 0 {
                    failed = (13, errno());
                }
                failed
            }
        };
        drop(fds);
        if step == 0 && work >= 0 {
            answer_with(0, 0, &[work]);
        } else {
            answer(step, e);
        }
        if work >= 0 {
            crate::sys::close(work);
        }
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A request's `/tmp`, `/work` and `/dev/shm` (in the request's mount namespace).
fn mount_scratch(fstype: &std::ffi::CStr, opts: &CString) -> Result<(), (u8, i32)> {
    for (target, noexec) in [(c"/tmp", 0), (c"/work", 0), (c"/dev/shm", libc::MS_NOEXEC)] {
        // SAFETY: mount with valid C strings.
        let done = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | noexec,
                opts.as_ptr().cast(),
            )
        };
        if done != 0 {
            return Err((12, last_errno()));
        }
    }
    Ok(())
}

/// What a `c` message asks for.
struct Prepare {
    shrink: u64,
    uid: u32,
    gid: u32,
    secrets: Vec<(CString, Vec<u8>)>,
}

/// `c`, the size to shrink to (0: none), the request's uid and gid (in the sandbox's user
/// namespace), the number of secrets, then each: its name's length (1 byte), the name, its
/// value's length (4 bytes), the value.
fn prepare_message(
    shrink: u64,
    uid: u32,
    gid: u32,
    secrets: &[proto::launch::SecretFile],
) -> Result<Vec<u8>, ScratchError> {
    let total: usize = secrets.iter().map(|s| s.value.len()).sum();
    if secrets.len() > proto::launch::MAX_REQUEST_SECRETS
        || total > proto::launch::MAX_REQUEST_SECRET_BYTES
    {
        return Err(ScratchError("too many secrets, or too large".into()));
    }
    let mut m = Vec::with_capacity(32 + total);
    m.push(b'c');
    m.extend_from_slice(&shrink.to_ne_bytes());
    m.extend_from_slice(&uid.to_ne_bytes());
    m.extend_from_slice(&gid.to_ne_bytes());
    m.push(secrets.len() as u8);
    for s in secrets {
        if !valid_secret_name(s.name.as_bytes()) {
            return Err(ScratchError(format!("{:?} is not a secret name", s.name)));
        }
        m.push(s.name.len() as u8);
        m.extend_from_slice(s.name.as_bytes());
        m.extend_from_slice(&(s.value.len() as u32).to_ne_bytes());
        m.extend_from_slice(&s.value);
    }
    Ok(m)
}

/// `[A-Za-z_][A-Za-z0-9_]{0,63}`: a file name of its own, never a path.
fn valid_secret_name(n: &[u8]) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && (n[0].is_ascii_alphabetic() || n[0] == b'_')
        && n.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

fn parse_prepare(m: &[u8]) -> Option<Prepare> {
    let mut at = 1usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = m.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let shrink = u64::from_ne_bytes(take(8)?.try_into().ok()?);
    let uid = u32::from_ne_bytes(take(4)?.try_into().ok()?);
    let gid = u32::from_ne_bytes(take(4)?.try_into().ok()?);
    let count = take(1)?[0] as usize;
    let mut secrets = Vec::with_capacity(count);
    for _ in 0..count {
        let nlen = take(1)?[0] as usize;
        let name = take(nlen)?;
        if !valid_secret_name(name) {
            return None;
        }
        let name =
            CString::new(format!("/run/secrets/{}", std::str::from_utf8(name).ok()?)).ok()?;
        let vlen = u32::from_ne_bytes(take(4)?.try_into().ok()?) as usize;
        secrets.push((name, take(vlen)?.to_vec()));
    }
    (at == m.len()).then_some(Prepare {
        shrink,
        uid,
        gid,
        secrets,
    })
}

/// Shrink the request's `/tmp` and `/work`, and write its secrets (in the request's mount
/// namespace).
fn prepare_request(fstype: &std::ffi::CStr, p: &Prepare) -> Result<(), (u8, i32)> {
    if p.shrink > 0 {
        let size = CString::new(format!("size={}", p.shrink)).map_err(|_| (14, libc::EINVAL))?;
        for (target, noexec) in [(c"/tmp", 0), (c"/work", 0), (c"/dev/shm", libc::MS_NOEXEC)] {
            // The same flags again (a remount may not drop them), a smaller size: tmpfs
            // refuses one below what is in use (nothing, here).
            // SAFETY: mount with valid C strings.
            let done = unsafe {
                libc::mount(
                    std::ptr::null(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | noexec,
                    size.as_ptr().cast(),
                )
            };
            if done != 0 {
                return Err((14, last_errno()));
            }
        }
    }
    if p.secrets.is_empty() {
        return Ok(());
    }
    let bytes: usize = p.secrets.iter().map(|(_, v)| v.len() + 4096).sum();
    let opts = CString::new(format!(
        "mode=0500,uid={},gid={},size={},nr_inodes={}",
        p.uid,
        p.gid,
        bytes + 8192,
        p.secrets.len() + 4
    ))
    .map_err(|_| (16, libc::EINVAL))?;
    let dir = c"/run/secrets";
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: mount, open, write, fchown and close with valid C strings and buffers, on
    // descriptors opened here.
    unsafe {
        if libc::mount(
            fstype.as_ptr(),
            dir.as_ptr(),
            fstype.as_ptr(),
            flags,
            opts.as_ptr().cast(),
        ) != 0
        {
            return Err((16, last_errno()));
        }
        for (path, value) in &p.secrets {
            let fd = libc::open(
                path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o400,
            );
            if fd < 0 {
                return Err((17, last_errno()));
            }
            let mut off = 0;
            let mut failed = 0;
            while off < value.len() {
                let n = libc::write(fd, value[off..].as_ptr().cast(), value.len() - off);
                if n < 0 {
                    if last_errno() == libc::EINTR {
                        continue;
                    }
                    failed = last_errno();
                    break;
                }
                off += n as usize;
            }
            if failed == 0 && libc::fchown(fd, p.uid, p.gid) != 0 {
                failed = last_errno();
            }
            libc::close(fd);
            if failed != 0 {
                return Err((17, failed));
            }
        }
        // Nothing is added to it after this, by anybody.
        if libc::mount(
            std::ptr::null(),
            dir.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_RDONLY | flags,
            std::ptr::null(),
        ) != 0
        {
            return Err((16, last_errno()));
        }
    }
    Ok(())
}

/// The uid and gid of the process `pid` (host view) in the sandbox's user namespace (that
/// of its init `init`), through the sandbox's id maps.
fn request_ids(pid: i32, init: libc::pid_t) -> Result<(u32, u32), ScratchError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| ScratchError(format!("read the ids of process {pid}: {e}")))?;
    let field = |key: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let (Some(uid), Some(gid)) = (field("Uid:"), field("Gid:")) else {
        return Err(ScratchError(format!(
            "process {pid} has no ids in its status"
        )));
    };
    let inside = |which: &str, host: u32| -> Result<u32, ScratchError> {
        let map = std::fs::read_to_string(format!("/proc/{init}/{which}"))
            .map_err(|e| ScratchError(format!("read the sandbox's {which}: {e}")))?;
        map_inside(&map, host).ok_or_else(|| {
            ScratchError(format!(
                "id {host} of process {pid} is not mapped in the sandbox"
            ))
        })
    };
    Ok((inside("uid_map", uid)?, inside("gid_map", gid)?))
}

/// The inside id of `host` in an id map (`inside outside count` per line, `outside` as the
/// reader sees it).
fn map_inside(map: &str, host: u32) -> Option<u32> {
    map.lines().find_map(|l| {
        let mut f = l.split_whitespace().map(|x| x.parse::<u64>().ok());
        let (inside, outside, count) = (f.next()??, f.next()??, f.next()??);
        let h = host as u64;
        (h >= outside && h < outside + count).then(|| (inside + h - outside) as u32)
    })
}

fn exit_now(code: libc::c_int) -> ! {
    // SAFETY: _exit ends this process without running anything of the launcher's.
    unsafe { libc::_exit(code) }
}

/// The mount namespace of the process `pid` (a request's process, host pid), once checked.
///
/// The pid is what the kernel said of a registration's sender, which may have exited since
/// and its number gone to another process, anywhere on the host. So the process behind it
/// now is taken by a pidfd, its namespaces are opened, and it must still be alive after
/// that (its number was then not reused in between), in the sandbox's user and pid
/// namespaces, and in a mount namespace that is not the sandbox's own (mounts made there
/// would cover the sandbox's /tmp and /work, for every request to share).
pub fn check(pid: i32, sandbox: &SandboxNs) -> Result<OwnedFd, ScratchError> {
    let pidfd = plumbing::sys::pidfd_open(pid)
        .map_err(|e| ScratchError(format!("open process {pid}: {e}")))?;
    let user = open_ns(pid, "user")?;
    let pid_ns = open_ns(pid, "pid")?;
    let mnt = open_ns(pid, "mnt")?;
    if !alive(&pidfd) {
        return Err(ScratchError(format!(
            "process {pid} exited before its scratch space was mounted"
        )));
    }
    let same = |a: &OwnedFd, b: &OwnedFd| match (inode(a), inode(b)) {
        (Some(x), Some(y)) => Ok(x == y),
        _ => Err(ScratchError("compare namespaces: fstat failed".into())),
    };
    if !same(&user, &sandbox.user)? || !same(&pid_ns, &sandbox.pid)? {
        return Err(ScratchError(format!(
            "process {pid} is not in the sandbox (it left, and its number went to another process)"
        )));
    }
    if same(&mnt, &sandbox.mnt)? {
        return Err(ScratchError(
            "the request's process has no mount namespace of its own".into(),
        ));
    }
    Ok(mnt)
}

/// The namespaces of the sandbox's init (opened through `/proc/<init>/ns/`): a request's
/// process must be in the same user and pid namespaces, and in a mount namespace of its
/// own.
pub struct SandboxNs {
    /// The sandbox's init (host pid), whose id maps are the sandbox's.
    pub init: libc::pid_t,
    pub user: OwnedFd,
    pub pid: OwnedFd,
    pub mnt: OwnedFd,
}

impl SandboxNs {
    pub fn of(init: libc::pid_t) -> Result<SandboxNs, ScratchError> {
        Ok(SandboxNs {
            init,
            user: open_ns(init, "user")?,
            pid: open_ns(init, "pid")?,
            mnt: open_ns(init, "mnt")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_messages_round_trip_and_refuse_bad_names() {
        let secrets = vec![
            proto::launch::SecretFile {
                name: "A_1".into(),
                value: b"one".to_vec(),
            },
            proto::launch::SecretFile {
                name: "_b".into(),
                value: Vec::new(),
            },
        ];
        let m = prepare_message(4096, 70000, 70001, &secrets).expect("message");
        let p = parse_prepare(&m).expect("parsed");
        assert_eq!((p.shrink, p.uid, p.gid), (4096, 70000, 70001));
        assert_eq!(p.secrets[0].0.as_bytes(), b"/run/secrets/A_1");
        assert_eq!(p.secrets[0].1, b"one");
        assert_eq!(p.secrets[1].1, b"");
        assert!(parse_prepare(&m[..m.len() - 1]).is_none());
        let mut extra = m.clone();
        extra.push(0);
        assert!(parse_prepare(&extra).is_none());
        for bad in ["../x", "a/b", "", "1a"] {
            let s = [proto::launch::SecretFile {
                name: bad.into(),
                value: Vec::new(),
            }];
            assert!(prepare_message(0, 0, 0, &s).is_err(), "{bad:?}");
        }
        assert_eq!(
            map_inside("0 100000 65536\n65536 200000 10\n", 200003),
            Some(65539)
        );
        assert_eq!(map_inside("0 1000 1\n", 1001), None);
    }
    use std::process::{Child, Command};

    /// A `sleep` in a user and mount namespace of its own, once it is in them.
    fn in_own_namespaces() -> Child {
        let mut child = Command::new("unshare")
            .args(["-Urm", "--", "sleep", "30"])
            .spawn()
            .expect("run unshare");
        let ours = std::fs::read_link("/proc/self/ns/user").expect("our user namespace");
        let path = format!("/proc/{}/ns/user", child.id());
        for _ in 0..500 {
            if std::fs::read_link(&path).is_ok_and(|ns| ns != ours) {
                return child;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("unshare did not enter its namespaces");
    }

    #[test]
    fn a_process_outside_the_sandbox_or_in_its_mount_namespace_gets_no_mounts() {
        // One stands for the sandbox; the other for a process elsewhere on the host that
        // took the number of a registration's sender after it exited.
        let mut sandbox = in_own_namespaces();
        let mut stranger = in_own_namespaces();
        let ns = SandboxNs::of(sandbox.id() as i32).expect("the sandbox's namespaces");
        let refused = |pid: u32| match check(pid as i32, &ns) {
            Ok(_) => panic!("process {pid} passed the check"),
            Err(e) => e.to_string(),
        };
        let why = refused(stranger.id());
        assert!(why.contains("not in the sandbox"), "{why}");
        // In the sandbox's own mount namespace: mounts there would be every request's.
        let why = refused(sandbox.id());
        assert!(why.contains("no mount namespace of its own"), "{why}");
        for c in [&mut sandbox, &mut stranger] {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Gone: refused too, whatever its number is now.
        let why = refused(stranger.id());
        assert!(!why.is_empty());
    }
}
