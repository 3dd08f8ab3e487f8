//! A program's output and stdin, pumped between its pipes and this process's own: each
//! output stream kept up to a cap, passed through to this process's stdout or stderr, or
//! drained ([`Stream`]); a file copied into the program's stdin pipe ([`relay`]); and what
//! lets a stream skip the pumping, reaching the program as it is ([`is_dev_null`],
//! [`own_pipe`]). The monitor's one-shot sandboxes (`zygo_monitor::oneshot`) drive them
//! from their loop; the decisions around them (how much to keep, when to stop waiting for
//! a reader) are the monitor's.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use proto::readbuf::read_append;

use crate::pipes::dev_null;

/// What to do with the program's stdout and stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Keep the first bytes of each, up to its [`Stream`]'s cap; drain and drop the rest.
    Capture,
    /// Copy to this process's own stdout and stderr as it arrives.
    PassThrough,
}

/// The most read from an output pipe at once.
const CHUNK: usize = 64 * 1024;

/// One output stream of the program, from its pipe (see [`Stream::pump`]).
pub struct Stream {
    fd: Option<File>,
    /// The most of it kept when capturing.
    cap: usize,
    kept: Vec<u8>,
    truncated: bool,
    /// What is read to be passed through or dropped.
    scratch: Vec<u8>,
    /// `splice` was refused for this stream's destination (a terminal, a file opened for
    /// appending): it is copied through `scratch` instead.
    no_splice: bool,
    /// Past the cap, a captured stream is drained at most one chunk per [`DRAIN_TICK`]:
    /// not read again before this.
    resume_at: Option<Instant>,
    /// Passing through: the destination (zygo's own stdout or stderr, a pipe) was full at
    /// the last splice; it is polled for room rather than the program's pipe for data, and
    /// the relay never blocks on it.
    dest_full: bool,
    /// Passing through by copying: where to, without ever blocking (see [`Copy`]); chosen
    /// at the first copy.
    copy_to: Option<Copy>,
    /// Read and not yet taken by the destination (a copy only; nothing more is read
    /// meanwhile).
    pending: Vec<u8>,
}

/// A destination that output is copied to rather than spliced, written without blocking:
/// a socket with `MSG_DONTWAIT` (a splice into a socket waits for room whatever its flags
/// say), anything else through a non-blocking description of its own (a terminal
/// reopened; the flags of zygo's own stdout and stderr are left as they are).
enum Copy {
    Socket(RawFd),
    Own(File),
    /// Neither could be had: written as it is, which may wait.
    Blocking(RawFd),
}

impl Copy {
    /// `fd` as a socket to copy to, or `Blocking` (not one).
    fn of_socket(fd: RawFd) -> Copy {
        // SAFETY: stat is plain old data, so all zeroes is a valid value to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of a descriptor number into a valid, writable buffer.
        if unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK {
            Copy::Socket(fd)
        } else {
            Copy::Blocking(fd)
        }
    }

    fn of(fd: RawFd) -> Copy {
        if let c @ Copy::Socket(_) = Copy::of_socket(fd) {
            return c;
        }
        // SAFETY: F_GETFL on a descriptor number.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let append = if flags >= 0 {
            flags & libc::O_APPEND
        } else {
            0
        };
        let Ok(path) = std::ffi::CString::new(format!("/proc/self/fd/{fd}")) else {
            return Copy::Blocking(fd);
        };
        let mode = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC | append;
        // SAFETY: open with a valid C string; the descriptor is ours.
        match unsafe { libc::open(path.as_ptr(), mode) } {
            // SAFETY: a fresh descriptor that nothing else owns.
            own if own >= 0 => Copy::Own(unsafe { File::from_raw_fd(own) }),
            _ => Copy::Blocking(fd),
        }
    }

    /// Write some of `buf`: how much was taken (`EAGAIN`: none, the destination is full).
    fn write(&self, buf: &[u8]) -> std::io::Result<usize> {
        let (fd, sock) = match self {
            Copy::Socket(fd) => (*fd, true),
            Copy::Own(f) => (f.as_raw_fd(), false),
            Copy::Blocking(fd) => (*fd, false),
        };
        loop {
            // SAFETY: send and write from a valid buffer of `buf.len()` bytes.
            let n = unsafe {
                if sock {
                    libc::send(
                        fd,
                        buf.as_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                } else {
                    libc::write(fd, buf.as_ptr().cast(), buf.len())
                }
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// How often a captured stream past its cap is drained (a chunk at a time): at most 16 MB
/// a second of output that is dropped anyway, so that a program writing as fast as it can
/// costs its caller next to no CPU (it waits on the full pipe instead).
const DRAIN_TICK: Duration = Duration::from_millis(4);

/// Move up to `len` bytes from the pipe `from` to `to` inside the kernel (no copy through
/// this process): `Ok(0)` at the end of the pipe.
fn splice(from: RawFd, to: RawFd, len: usize, flags: libc::c_uint) -> std::io::Result<usize> {
    loop {
        // SAFETY: splice(2) between two descriptors we hold, no offsets.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | flags,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A new open file description (`mode`: `O_RDONLY` or `O_WRONLY`) of the anonymous pipe
/// `fd` is, for the program to use directly: none when `fd` is anything else. (A pipe
/// whose other end is closed is handed over too: the kernel opens an anonymous pipe
/// without the reader check a named one gets, and the program's writes then fail with
/// `EPIPE`, as in a shell pipeline.) The program then reads or writes the caller's pipe with no
/// copy made outside its cgroups, and holds no descriptor of zygo's own (the flags it may
/// set, `O_NONBLOCK` say, are its description's). An anonymous pipe lives on no host
/// filesystem: what the program may do to it (`fchmod`, reopening it with `O_TRUNC`)
/// changes nothing on the host, unlike a named pipe, which is copied as a file is.
pub fn own_pipe(fd: RawFd, mode: libc::c_int) -> Option<OwnedFd> {
    const PIPEFS_MAGIC: libc::__fsword_t = 0x5049_5045;
    // SAFETY: statfs and stat are plain old data, so all zeroes is a valid value to fill.
    let (mut sfs, mut st): (libc::statfs, libc::stat) = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs and fstat of a descriptor number into valid, writable buffers.
    let known = unsafe { libc::fstatfs(fd, &mut sfs) == 0 && libc::fstat(fd, &mut st) == 0 };
    if !known || sfs.f_type != PIPEFS_MAGIC || st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return None;
    }
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).ok()?;
    // Non-blocking, so that should the path name a named pipe by now, the open cannot
    // wait for a partner (the check below then refuses it).
    // SAFETY: open with a valid C string; the descriptor is ours.
    let new = unsafe {
        libc::open(
            path.as_ptr(),
            mode | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if new < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let new = unsafe { OwnedFd::from_raw_fd(new) };
    // Its own description: blocking, as a program expects its stdin and stdout to be.
    // SAFETY: fcntl on the descriptor we hold.
    let ok = unsafe { libc::fcntl(new.as_raw_fd(), libc::F_SETFL, 0) } == 0;
    // The same pipe, not whatever the path names now.
    // SAFETY: stat is plain old data, so all zeroes is a valid value to fill.
    let mut now: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of the descriptor we hold into a valid buffer.
    let same = unsafe { libc::fstat(new.as_raw_fd(), &mut now) } == 0
        && (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino);
    (ok && same).then_some(new)
}

/// Whether `fd` is the null device (the same character device as `/dev/null`).
pub fn is_dev_null(fd: RawFd) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(null) = std::fs::metadata("/dev/null") else {
        return false;
    };
    // SAFETY: stat is plain old data, so all zeroes is a valid value for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of a descriptor number into a valid, writable stat buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    null.file_type().is_char_device()
        && st.st_mode & libc::S_IFMT == libc::S_IFCHR
        && st.st_rdev == null.rdev()
}

impl Stream {
    /// A stream from the program's pipe; none when it has none (it is at its end). `cap`:
    /// the most of it kept when capturing.
    pub fn new(fd: Option<OwnedFd>, cap: usize) -> Stream {
        Stream {
            fd: fd.map(File::from),
            cap,
            kept: Vec::new(),
            truncated: false,
            scratch: Vec::new(),
            no_splice: false,
            resume_at: None,
            dest_full: false,
            copy_to: None,
            pending: Vec::new(),
        }
    }

    /// Whether the program's pipe is still read (not at its end, nor given up).
    pub fn is_open(&self) -> bool {
        self.fd.is_some()
    }

    /// Passing through: whether the destination was full at the last attempt.
    pub fn dest_full(&self) -> bool {
        self.dest_full
    }

    /// What was kept, and whether more came than the cap let be kept.
    pub fn into_kept(self) -> (Vec<u8>, bool) {
        (self.kept, self.truncated)
    }

    /// The destination has room again: what is pending goes first.
    pub fn room(&mut self) {
        self.dest_full = false;
        self.flush();
    }

    /// Copy what is pending to the destination, as far as it takes it without waiting.
    fn flush(&mut self) {
        let Some(to) = self.copy_to.as_ref() else {
            return;
        };
        while !self.pending.is_empty() {
            match to.write(&self.pending) {
                Ok(0) => {
                    self.dest_full = true;
                    return;
                }
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    self.dest_full = true;
                    return;
                }
                // As a splice would: the relay ends.
                Err(_) => {
                    self.pending.clear();
                    self.fd = None;
                    return;
                }
            }
        }
    }

    /// The descriptor to poll for data: none while a drain waits for its next tick, nor
    /// while the destination is full.
    pub fn raw(&self, now: Instant) -> RawFd {
        match self.resume_at {
            Some(t) if t > now => -1,
            _ if self.dest_full => -1,
            _ => self.fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
        }
    }

    /// The destination to poll for room (`dest`, while it is full).
    pub fn out(&self, dest: RawFd) -> libc::pollfd {
        libc::pollfd {
            fd: if self.dest_full && self.fd.is_some() {
                dest
            } else {
                -1
            },
            events: libc::POLLOUT,
            revents: 0,
        }
    }

    /// What is left unread in the program's pipe, and read but not passed on (dropped
    /// when the relay gives up).
    pub fn unread(&self) -> u32 {
        let Some(f) = self.fd.as_ref() else { return 0 };
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD on a pipe we hold, into an int.
        if unsafe { libc::ioctl(f.as_raw_fd(), libc::FIONREAD, &mut n) } < 0 {
            n = 0;
        }
        (n.max(0) as u32).saturating_add(self.pending.len() as u32)
    }

    /// When a waiting drain is due.
    pub fn due(&self) -> Option<Instant> {
        self.resume_at.filter(|_| self.fd.is_some())
    }

    /// Read what is there; keep, forward or drop it. A captured stream is read straight
    /// into what is kept, up to the cap; a byte past the cap marks it truncated.
    ///
    /// Whatever is not kept is moved with `splice` where the kernel allows it (to
    /// `/dev/null`, to a pipe or a file), rather than copied through this process: the
    /// CPU a relay spends is charged to the caller, not to the sandbox, and a program
    /// writing as fast as its CPU quota allows would otherwise have its caller spend as
    /// much again copying it.
    pub fn pump(&mut self, mode: Output, to_stderr: bool, tee: Option<&File>) {
        if !self.pending.is_empty() {
            self.flush();
            return;
        }
        let Some(f) = self.fd.as_ref() else { return };
        let fd = f.as_raw_fd();
        let room = self.cap - self.kept.len();
        let keeping = mode == Output::Capture && room > 0;
        // Passing through: a socket takes a copy (a splice into it would wait for room).
        let own = if to_stderr {
            libc::STDERR_FILENO
        } else {
            libc::STDOUT_FILENO
        };
        if mode == Output::PassThrough && self.copy_to.is_none() && !self.no_splice {
            if let c @ Copy::Socket(_) = Copy::of_socket(own) {
                self.copy_to = Some(c);
                self.no_splice = true;
            }
        }
        if !self.no_splice && !keeping {
            let to = match mode {
                Output::Capture => dev_null().map(|n| n.as_raw_fd()),
                Output::PassThrough if to_stderr => Some(libc::STDERR_FILENO),
                Output::PassThrough => Some(libc::STDOUT_FILENO),
            };
            if let Some(to) = to {
                // Never blocking on the destination: zygo's own stdout may be a pipe that
                // nobody reads, and the sandbox's deadline, its kill and its cgroup's
                // removal must not wait for it.
                let flags = match mode {
                    Output::PassThrough => libc::SPLICE_F_NONBLOCK,
                    Output::Capture => 0,
                };
                match splice(fd, to, CHUNK, flags) {
                    Ok(0) => self.fd = None,
                    // The destination is full (or, spuriously, the pipe empty): wait for
                    // room.
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => self.dest_full = true,
                    Ok(_) if mode == Output::Capture => {
                        self.truncated = true;
                        self.resume_at = Some(Instant::now() + DRAIN_TICK);
                    }
                    Ok(_) => {}
                    // The destination takes no splice (a terminal, O_APPEND): copy.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.no_splice = true,
                    // As a write to it would: the relay ends.
                    Err(_) => self.fd = None,
                }
                if !self.no_splice {
                    return;
                }
            }
        }
        let before = self.kept.len();
        let read = if mode == Output::Capture && room > 0 {
            let read = read_append(fd, &mut self.kept, room.min(CHUNK));
            if let (Some(mut t), Some(new)) = (tee, self.kept.get(before..)) {
                if !new.is_empty() {
                    let _ = t.write_all(new);
                }
            }
            read
        } else {
            self.scratch.clear();
            read_append(fd, &mut self.scratch, CHUNK)
        };
        match read {
            Ok(0) | Err(_) => self.fd = None,
            Ok(_) => match mode {
                Output::Capture => {
                    if !self.scratch.is_empty() {
                        self.truncated = true;
                        self.scratch.clear();
                        self.resume_at = Some(Instant::now() + DRAIN_TICK);
                    }
                }
                Output::PassThrough => {
                    if self.copy_to.is_none() {
                        self.copy_to = Some(Copy::of(own));
                    }
                    self.pending.append(&mut self.scratch);
                    self.flush();
                }
            },
        }
    }
}

/// This process's stdin, duplicated (close-on-exec) so that a relay can own it.
pub fn own_stdin() -> std::io::Result<File> {
    // SAFETY: duplicating descriptor 0, which is open (the CLI's start-up sees to that).
    let fd = unsafe { libc::fcntl(libc::STDIN_FILENO, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fcntl returned a fresh descriptor that we now own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Copy `from` into the program's stdin pipe `to` (on a thread of its own), so that the
/// program sees only a pipe. Ends when `from` ends or fails, or once nothing reads the
/// pipe any more (the program and its launcher are gone: the write end then polls
/// `POLLERR`), whichever comes first, even while `from` has nothing to read. Nobody waits
/// for it: a process that exits takes a relay still blocked in a read or write with it.
pub fn relay(from: &File, to: OwnedFd) {
    let mut to = File::from(to);
    let mut buf = Vec::new();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: from.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: to.as_raw_fd(),
                events: 0,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid pollfd array for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents == 0 {
            continue;
        }
        buf.clear();
        match read_append(from.as_raw_fd(), &mut buf, CHUNK) {
            Ok(0) => return,
            Ok(_) => {
                if to.write_all(&buf).is_err() {
                    return;
                }
            }
            // A source someone else set non-blocking: wait for it again.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipes::pipe;
    use std::io::Read;

    /// A pipe whose write end has had `bytes` written and is closed: its read end.
    fn filled(bytes: &[u8]) -> OwnedFd {
        let (r, w) = pipe().expect("pipe");
        File::from(w).write_all(bytes).expect("write");
        r
    }

    fn read_all(fd: OwnedFd) -> Vec<u8> {
        let mut got = Vec::new();
        File::from(fd).read_to_end(&mut got).expect("read");
        got
    }

    #[test]
    fn a_captured_stream_keeps_up_to_its_cap_and_drains_the_rest() {
        let (tee_r, tee_w) = pipe().expect("pipe");
        let tee = File::from(tee_w);
        let mut s = Stream::new(Some(filled(b"0123456789")), 4);
        while s.is_open() {
            s.pump(Output::Capture, false, Some(&tee));
        }
        drop(tee);
        assert_eq!(s.unread(), 0);
        assert_eq!(s.into_kept(), (b"0123".to_vec(), true));
        assert_eq!(read_all(tee_r), b"0123");
    }

    #[test]
    fn a_captured_stream_under_its_cap_is_kept_whole() {
        let mut s = Stream::new(Some(filled(b"abc")), 4);
        while s.is_open() {
            s.pump(Output::Capture, false, None);
        }
        assert_eq!(s.into_kept(), (b"abc".to_vec(), false));
    }

    #[test]
    fn only_the_null_device_is_dev_null() {
        let null = File::open("/dev/null").expect("open /dev/null");
        let zero = File::open("/dev/zero").expect("open /dev/zero");
        let (r, _w) = pipe().expect("pipe");
        assert!(is_dev_null(null.as_raw_fd()));
        assert!(!is_dev_null(zero.as_raw_fd()));
        assert!(!is_dev_null(r.as_raw_fd()));
        assert!(!is_dev_null(-1));
    }

    #[test]
    fn an_anonymous_pipe_is_reopened_as_the_same_pipe_blocking() {
        let (r, w) = pipe().expect("pipe");
        let own = own_pipe(w.as_raw_fd(), libc::O_WRONLY).expect("a description of the pipe");
        drop(w);
        // SAFETY: F_GETFL on a descriptor we hold.
        let flags = unsafe { libc::fcntl(own.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        File::from(own).write_all(b"through").expect("write");
        assert_eq!(read_all(r), b"through");
    }

    #[test]
    fn a_named_pipe_or_a_file_is_not_handed_over() {
        use std::os::unix::fs::OpenOptionsExt;
        let d = std::env::temp_dir().join(format!("zygo-pump-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).expect("create a temp dir");
        let (fifo, file) = (d.join("fifo"), d.join("file"));
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo with a valid C string.
        let made = unsafe { libc::mkfifo(path.as_ptr(), 0o600) };
        let named = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
        let plain = std::fs::write(&file, b"x").and_then(|()| File::open(&file));
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(made, 0, "mkfifo");
        let named = named.expect("open the named pipe");
        assert!(own_pipe(named.as_raw_fd(), libc::O_RDONLY).is_none());
        let plain = plain.expect("open the file");
        assert!(own_pipe(plain.as_raw_fd(), libc::O_RDONLY).is_none());
    }

    #[test]
    fn the_relay_copies_until_its_source_ends() {
        let from = File::from(filled(b"stdin bytes"));
        let (r, w) = pipe().expect("pipe");
        relay(&from, w);
        assert_eq!(read_all(r), b"stdin bytes");
    }

    #[test]
    fn the_relay_ends_once_nothing_reads_its_pipe() {
        let (from, _writer) = pipe().expect("pipe");
        let (r, w) = pipe().expect("pipe");
        drop(r);
        // Returns although its source, still open, has nothing to read.
        relay(&File::from(from), w);
    }
}
