//! A zygote, from the launcher's side: a strict relay between the monitor (proto frames)
//! and the agent and its request children inside the sandbox (JSON lines, see
//! `docs/agent-protocol.md`).
//!
//! Everything read from the sandbox is hostile. Lines are capped and parsed into closed
//! enums that reject unknown kinds and fields (a request process's, which a handler can
//! write itself, in one pass that builds nothing: `child_line`); a child that breaks the
//! protocol is disowned (its channel closed, the monitor told, its cgroup killed by the
//! monitor); an agent that breaks it ends the zygote. Registrations carry the kernel-checked pid of the sender
//! (`SCM_CREDENTIALS`, translated into our pid namespace), which is how the monitor can
//! place exactly that process in its request's cgroup.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use proto::launch::{FromLauncher, Stream, ToLauncher, MAX_LAUNCH_FRAME};
use proto::read_frame;
use proto::readbuf::read_append;
use serde::Deserialize;

use crate::child_line::ChildMsg;
use crate::sandbox::LaunchError;
use crate::script_space::Refused;
use crate::sys;

/// The longest line the agent may send on its control channel.
const MAX_CONTROL_LINE: usize = 1024 * 1024;
/// The most read from a pipe or socket at once.
const CHUNK: usize = 64 * 1024;
/// The longest line a child may send (a result value; the monitor caps it again).
const MAX_CHILD_LINE: usize = 20 * 1024 * 1024;

/// The launcher's ends of the agent's channels, and the sandbox's ends until the clone.
/// `log` is the read end of the pipe that is the agent's stdout and stderr: its own
/// diagnostics, which the launcher logs with a cap (the agent never holds a host file).
pub struct Channels {
    ctl: RawFd,
    reg: RawFd,
    log: RawFd,
    inner_ctl: RawFd,
    inner_reg: RawFd,
    inner_log: RawFd,
}

/// Create the control channel and the registration socket.
pub fn channels() -> std::io::Result<Channels> {
    let pair =
        |kind| plumbing::pipes::socketpair(kind).map(|(a, b)| (a.into_raw_fd(), b.into_raw_fd()));
    let (ctl, inner_ctl) = pair(libc::SOCK_STREAM)?;
    let (reg, inner_reg) = pair(libc::SOCK_SEQPACKET)?;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to an int of the right size.
    let r = unsafe {
        libc::setsockopt(
            reg,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (log, inner_log) =
        plumbing::pipes::pipe().map(|(r, w)| (r.into_raw_fd(), w.into_raw_fd()))?;
    Ok(Channels {
        ctl,
        reg,
        log,
        inner_ctl,
        inner_reg,
        inner_log,
    })
}

/// The sandbox's ends of a zygote's channels, as init hands them to the agent.
#[derive(Debug, Clone, Copy)]
pub struct InnerFds {
    /// The control channel: the agent's fd 3.
    pub ctl: RawFd,
    /// The registration socket: the agent's fd 4.
    pub reg: RawFd,
    /// The write end of the agent's diagnostics pipe: its fd 1 and fd 2.
    pub log: RawFd,
}

impl Channels {
    pub fn inner(&self) -> InnerFds {
        InnerFds {
            ctl: self.inner_ctl,
            reg: self.inner_reg,
            log: self.inner_log,
        }
    }
    pub fn close_inner(&self) {
        sys::close(self.inner_ctl);
        sys::close(self.inner_reg);
        sys::close(self.inner_log);
    }
    pub fn close_outer(&self) {
        sys::close(self.ctl);
        sys::close(self.reg);
        sys::close(self.log);
    }
}

// --- What the sandbox may say ------------------------------------------------------------

/// A line on the agent's control channel. (Public, with [`Registration`], for the
/// `agent_lines` fuzz target, which parses hostile lines as [`serve`] does:
/// `proto::json::from_slice_strict`.)
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentMsg {
    Ready {
        #[serde(rename = "pid")]
        _pid: i64,
    },
    ImportError {
        message: String,
        traceback: String,
    },
    Heartbeat,
    ParkFailed {
        slot: String,
        message: String,
    },
}

/// A request process's registration datagram.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Registration {
    Register { slot: String },
}

/// A slot name the monitor chose; anything else from the sandbox is refused.
fn valid_slot(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

// --- Lines ---------------------------------------------------------------------------------

/// Bytes read so far on a line-oriented channel.
struct Lines {
    buf: Vec<u8>,
    /// Where the next line starts in `buf`: the lines before it have been taken, and are
    /// dropped before the next read.
    start: usize,
    /// How much of the next line has been searched for its end: each byte is looked at
    /// once, however many reads a long line takes.
    searched: usize,
    max: usize,
}

enum Read_ {
    Data,
    Eof,
}

/// A line longer than this is taken with the buffer it was read into rather than copied
/// out of it (what was read after it is copied instead: less than one read).
const TAKE_WHOLE: usize = 64 * 1024;

impl Lines {
    fn new(max: usize) -> Lines {
        Lines {
            buf: Vec::new(),
            start: 0,
            searched: 0,
            max,
        }
    }

    fn fill(&mut self, fd: RawFd) -> Result<Read_, String> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let n = read_append(fd, &mut self.buf, CHUNK).map_err(|e| e.to_string())?;
        if n == 0 {
            if !self.buf.is_empty() {
                return Err("the channel closed in the middle of a line".into());
            }
            return Ok(Read_::Eof);
        }
        Ok(Read_::Data)
    }

    /// The next whole line, if any. A line over the cap is an error.
    fn next_line(&mut self) -> Result<Option<Vec<u8>>, String> {
        let from = self.start + self.searched;
        let Some(nl) = self.buf[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|i| from + i)
        else {
            self.searched = self.buf.len() - self.start;
            if self.searched > self.max {
                return Err(format!("a line over {} bytes", self.max));
            }
            return Ok(None);
        };
        let len = nl - self.start;
        if len > self.max {
            return Err(format!("a line over {} bytes", self.max));
        }
        self.searched = 0;
        if self.start == 0 && len > TAKE_WHOLE {
            let rest = self.buf.split_off(nl + 1);
            let mut line = std::mem::replace(&mut self.buf, rest);
            line.truncate(len);
            return Ok(Some(line));
        }
        let line = self.buf[self.start..nl].to_vec();
        self.start = nl + 1;
        Ok(Some(line))
    }
}

fn parse<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, String> {
    // Strict JSON: a key named twice anywhere in the line (a result's value too) fails it.
    proto::json::from_slice_strict(line).map_err(|e| format!("bad line: {e}"))
}

/// Send a short line on a socket from the sandbox without ever waiting for it: all of it
/// now, or an error (`WouldBlock` when the other end has let the socket fill up). The
/// launcher must not be made to wait by anything inside the sandbox.
fn send_now(fd: RawFd, line: &[u8]) -> std::io::Result<()> {
    // SAFETY: send on a descriptor we hold, from a buffer valid for its length.
    let n = unsafe {
        libc::send(
            fd,
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    match n {
        n if n < 0 => Err(std::io::Error::last_os_error()),
        n if n as usize == line.len() => Ok(()),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "the socket took part of a line",
        )),
    }
}

// --- The relay -----------------------------------------------------------------------------

struct Child {
    /// Its process (checked again before its scratch space is shrunk for a request).
    pid: i32,
    fd: OwnedFd,
    lines: Lines,
    done: bool,
    /// Its channel closed after the agent's did: the zygote is dying, and the child is
    /// reported with the zygote's end (after `Exited`), not as a handler that quit.
    orphaned: bool,
    out: Relay,
    err: Relay,
    /// Its own directory in its `/work`.
    work: crate::workspace::Workdir,
    /// Its call asked for the directory back (`out`): packed when its handler answers.
    pack: bool,
    /// Its caller takes progress as it comes (else a progress line is a heartbeat).
    progress: bool,
    /// When its last heartbeat went up (see [`beat_due`]).
    beat_sent: Option<Instant>,
}

/// A child's heartbeats go up to the monitor at most once in this long. The monitor's
/// check for a stuck request works in seconds; a handler writing heartbeat lines in a loop
/// (a few bytes each) would otherwise make a frame, a write and a decode on the
/// supervisor's loop, which serves everyone, out of every 22 bytes it writes.
const BEAT_EVERY: Duration = Duration::from_millis(250);

/// Whether a heartbeat that came `now` goes up, given when the last one went (updated
/// when it does).
fn beat_due(last: &mut Option<Instant>, now: Instant) -> bool {
    if last.is_some_and(|t| now.saturating_duration_since(t) < BEAT_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

/// Output a child's process tree writes to fd 1 or fd 2: the read end of that pipe, relayed
/// as `Output` messages, one byte past the monitor's 1 MiB cap (so it sees the cut), the
/// rest read and dropped. UTF-8 split across reads is carried over, never mangled.
struct Relay {
    fd: Option<OwnedFd>,
    stream: Stream,
    sent: usize,
    carry: Vec<u8>,
    /// What one read brought.
    scratch: Vec<u8>,
    /// Past [`MAX_RELAY`] the pipe is drained one chunk per [`DRAIN_TICK`]: not polled
    /// again before this.
    resume_at: Option<Instant>,
}

/// What is relayed of each stream; the monitor keeps one byte less.
const MAX_RELAY: usize = 1024 * 1024 + 1;

/// How often a stream past [`MAX_RELAY`] is drained, a chunk at a time, into `/dev/null`
/// with splice (never copied through this process): at most 16 MB a second of output
/// that is dropped anyway, so a handler writing as fast as it can costs the launcher,
/// which runs outside the sandbox's cgroup, next to no CPU; the handler waits on its full
/// pipe instead.
pub(crate) const DRAIN_TICK: Duration = Duration::from_millis(4);

impl Relay {
    fn new(fd: OwnedFd, stream: Stream) -> Relay {
        // SAFETY: fcntl on a descriptor we own, adding O_NONBLOCK.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Relay {
            fd: Some(fd),
            stream,
            sent: 0,
            carry: Vec::new(),
            scratch: Vec::new(),
            resume_at: None,
        }
    }

    /// The descriptor to poll: none while a drain waits for its next tick.
    fn raw(&self) -> RawFd {
        match self.resume_at {
            Some(t) if t > Instant::now() => -1,
            _ => self.fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
        }
    }

    /// How long until a waiting drain is due, in milliseconds (rounded up).
    fn due_ms(&self) -> Option<libc::c_int> {
        let t = self.resume_at.filter(|_| self.fd.is_some())?;
        Some(
            t.saturating_duration_since(Instant::now())
                .as_micros()
                .div_ceil(1000) as libc::c_int,
        )
    }

    /// Past [`MAX_RELAY`]: move one chunk (all there is, up to 64 of them, when `drain`)
    /// into `/dev/null`. False if splice cannot be used here.
    fn drop_spliced(&mut self, drain: bool) -> bool {
        let (Some(fd), Some(null)) = (self.fd.as_ref(), plumbing::pipes::dev_null()) else {
            return false;
        };
        for _ in 0..if drain { 64 } else { 1 } {
            // SAFETY: splice(2) between two descriptors we hold, no offsets.
            let n = unsafe {
                libc::splice(
                    fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    null.as_raw_fd(),
                    std::ptr::null_mut(),
                    CHUNK,
                    libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
                )
            };
            match n {
                0 => {
                    self.fd = None;
                    return true;
                }
                n if n > 0 => {}
                _ => match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EAGAIN) => return true,
                    Some(libc::EINTR) => {}
                    Some(libc::EINVAL) => return false,
                    _ => {
                        self.fd = None;
                        return true;
                    }
                },
            }
        }
        if !drain {
            self.resume_at = Some(Instant::now() + DRAIN_TICK);
        }
        true
    }

    /// Read what is in the pipe now (all of it when `drain`), and send it on.
    fn pump(&mut self, slot: &str, up: &mut Up, drain: bool) -> Result<(), LaunchError> {
        if self.sent >= MAX_RELAY && self.carry.is_empty() && self.drop_spliced(drain) {
            return Ok(());
        }
        // A drain is bounded: a daemon the handler left behind may write without end.
        for _ in 0..64 {
            let Some(fd) = self.fd.as_ref() else {
                return Ok(());
            };
            self.scratch.clear();
            let n = match read_append(fd.as_raw_fd(), &mut self.scratch, CHUNK) {
                Ok(0) => {
                    self.fd = None;
                    0
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(_) => {
                    self.fd = None;
                    0
                }
            };
            let eof = self.fd.is_none();
            if self.sent < MAX_RELAY && (n > 0 || (eof && !self.carry.is_empty())) {
                let mut bytes = std::mem::take(&mut self.carry);
                bytes.extend_from_slice(&self.scratch);
                // Keep an incomplete UTF-8 sequence at the end for the next read.
                let cut = if eof {
                    bytes.len()
                } else {
                    complete_utf8_prefix(&bytes)
                };
                self.carry = bytes.split_off(cut);
                let mut text = String::from_utf8_lossy(&bytes).into_owned();
                let room = MAX_RELAY - self.sent;
                if text.len() > room {
                    let mut at = room;
                    while !text.is_char_boundary(at) {
                        at -= 1;
                    }
                    text.truncate(at);
                    self.sent = MAX_RELAY;
                } else {
                    self.sent += text.len();
                }
                if !text.is_empty() {
                    up.send(&FromLauncher::Output {
                        slot: slot.to_string(),
                        stream: self.stream,
                        data: text,
                    })?;
                }
            }
            if eof || !drain {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// The length of `b` without a trailing, possibly incomplete, UTF-8 sequence.
fn complete_utf8_prefix(b: &[u8]) -> usize {
    let start = b.len().saturating_sub(3);
    for i in (start..b.len()).rev() {
        let byte = b[i];
        if byte & 0xC0 != 0x80 {
            // A lead byte (or ASCII): is its sequence complete?
            let need = match byte {
                0x00..=0x7F => 1,
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            return if b.len() - i >= need { b.len() } else { i };
        }
    }
    b.len()
}

/// One datagram from the registration socket with its kernel-checked sender (pid, and host
/// uid and gid) and any descriptors. `None` when nothing is waiting.
type Datagram = (Vec<u8>, Sender, Vec<OwnedFd>);

/// Who sent a datagram, as the kernel says: host pid, uid and gid.
#[derive(Debug, Clone, Copy)]
struct Sender {
    pid: i32,
    uid: u32,
    gid: u32,
}

fn recv_with_creds(reg: RawFd, max_fds: usize) -> Result<Option<Datagram>, String> {
    let mut data = [0u8; 4096];
    let got = match plumbing::fds::recv(reg, &mut data, max_fds, libc::MSG_DONTWAIT) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(format!("a malformed registration: {e}"))
        }
        Err(e) => return Err(e.to_string()),
    };
    if got.len == 0 {
        return Err("the registration socket closed".into());
    }
    let (Some(pid), Some((uid, gid))) = (got.sender.filter(|&p| p > 0), got.sender_ids) else {
        return Err("a registration without credentials".into());
    };
    Ok(Some((
        data[..got.len].to_vec(),
        Sender { pid, uid, gid },
        got.fds,
    )))
}

/// Receive one registration: (slot, who sent it, the child's channel).
/// A registered child: its request channel and the read ends of its stdout and stderr.
type Registered = (String, Sender, OwnedFd, OwnedFd, OwnedFd);

fn receive_registration(reg: RawFd) -> Result<Option<Registered>, String> {
    let Some((data, pid, mut fds)) = recv_with_creds(reg, 3)? else {
        return Ok(None);
    };
    if fds.len() != 3 {
        return Err(format!(
            "a registration with {} descriptors (want 3)",
            fds.len()
        ));
    }
    let (Some(err), Some(out)) = (fds.pop(), fds.pop()) else {
        return Err("a registration without its pipes".into());
    };
    for p in [&out, &err] {
        let meta = std::fs::File::from(p.try_clone().map_err(|e| e.to_string())?)
            .metadata()
            .map_err(|e| e.to_string())?;
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_fifo() {
            return Err("a registration whose output descriptor is not a pipe".into());
        }
    }
    let Registration::Register { slot } = parse(&data)?;
    if !valid_slot(&slot) {
        return Err("a registration with an invalid slot".into());
    }
    let fd = fds.pop().ok_or("no descriptor")?;
    // The descriptor must be a unix stream socket, nothing else.
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt with a pointer to an int and its size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 || ty != libc::SOCK_STREAM {
        return Err("a registration whose descriptor is not a stream socket".into());
    }
    Ok(Some((slot, pid, fd, out, err)))
}

/// A pool's sandbox hands its `/run/script` folder to the launcher as the first message on
/// the registration socket, from its init (checked by the kernel-supplied pid), before
/// anything untrusted ran in it.
fn receive_script_dir(reg: RawFd, init_pid: libc::pid_t) -> Result<OwnedFd, String> {
    // The message was sent before the program started; wait for it briefly all the same.
    let mut fd = libc::pollfd {
        fd: reg,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut fd, 1, 5000) } <= 0 {
        return Err("the sandbox did not hand over its script folder".into());
    }
    let Some((data, pid, fds)) = recv_with_creds(reg, 1)? else {
        return Err("the sandbox did not hand over its script folder".into());
    };
    if data != b"scripts" || pid.pid != init_pid {
        return Err(
            "the first message on the registration socket is not init's script folder".into(),
        );
    }
    let mut fds = fds;
    let dir = match (fds.pop(), fds.is_empty()) {
        (Some(d), true) => d,
        _ => return Err("the script folder came with the wrong number of descriptors".into()),
    };
    let meta = std::fs::File::from(dir.try_clone().map_err(|e| e.to_string())?)
        .metadata()
        .map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err("the script folder is not a directory".into());
    }
    Ok(dir)
}

/// How long the end of a child that has answered may wait to leave with the next frame.
/// Its caller has the answer and its replacement was asked for when it was handed the
/// request, so the monitor has nothing urgent to do with it; sent on its own, it would wake
/// the monitor once more per request.
const HOLD: Duration = Duration::from_millis(2);

/// A frame's payload up to this size is copied behind its length (and what is held) to
/// go in one write.
const COPIED_FRAME: usize = 64 * 1024;

/// The frames going up to the monitor, in order; some are held back up to [`HOLD`].
struct Up {
    sock: UnixStream,
    held: Vec<u8>,
    since: Option<Instant>,
}

impl Up {
    /// Send `msg` now, after whatever is held, in one write; a large frame (a handler's
    /// value) in two more, so that it is never copied: its payload is written as it was
    /// encoded, after its length.
    fn send(&mut self, msg: &FromLauncher) -> Result<(), LaunchError> {
        let payload = proto::codec::encode(msg).map_err(LaunchError::Channel)?;
        if payload.len() > proto::frame::MAX_FRAME {
            return Err(LaunchError::Channel(proto::ProtoError::TooLarge {
                len: payload.len(),
                max: proto::frame::MAX_FRAME,
            }));
        }
        let len = (payload.len() as u32).to_le_bytes();
        if payload.len() > COPIED_FRAME {
            self.flush()?;
            self.write(&len)?;
            return self.write(&payload);
        }
        self.held.extend_from_slice(&len);
        self.held.extend_from_slice(&payload);
        self.flush()
    }

    /// Send `msg` with the next frame that goes, or once it has waited [`HOLD`].
    fn hold(&mut self, msg: &FromLauncher) -> Result<(), LaunchError> {
        let frame = proto::encode_frame(msg).map_err(LaunchError::Channel)?;
        self.held.extend_from_slice(&frame);
        self.since.get_or_insert_with(Instant::now);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), LaunchError> {
        let held = std::mem::take(&mut self.held);
        self.since = None;
        self.write(&held)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), LaunchError> {
        self.sock
            .write_all(bytes)
            .map_err(|e| LaunchError::Channel(e.into()))
    }

    /// How long poll(2) may sleep: until what is held is due (rounded up), or without end.
    fn timeout_ms(&self) -> libc::c_int {
        self.since.map_or(-1, |t| {
            HOLD.saturating_sub(t.elapsed()).as_micros().div_ceil(1000) as libc::c_int
        })
    }

    /// Send what is held once it has waited long enough.
    fn flush_due(&mut self) -> Result<(), LaunchError> {
        match self.since {
            Some(t) if t.elapsed() >= HOLD => self.flush(),
            _ => Ok(()),
        }
    }
}

/// The launcher's first line to a parked child: its `/tmp` and `/work` are in place, and
/// the name of its own directory in `/work` (32 lowercase hex digits), which the launcher
/// made. Always [`MOUNTED_LEN`] bytes.
fn mounted_line(workdir: &str) -> Vec<u8> {
    format!("{{\"kind\":\"mounted\",\"workdir\":\"{workdir}\"}}\n").into_bytes()
}

/// The length of every `mounted` line.
#[cfg(test)]
const MOUNTED_LEN: usize = 64;

/// A registered child whose `/tmp` and `/work` are being mounted: it becomes a [`Child`]
/// (and is reported parked) once the mounter says they are there.
struct Mounting {
    sender: Sender,
    fd: OwnedFd,
    out: OwnedFd,
    err: OwnedFd,
}

/// What the zygote's sandbox is, for the relay.
pub struct Sandbox {
    pub init_pid: libc::pid_t,
    /// The namespaces of the sandbox's init (see `scratch::SandboxNs`).
    pub ns: crate::scratch::SandboxNs,
    /// The size of each request's `/tmp` and of its `/work`, in bytes.
    pub scratch_bytes: u64,
    /// As root, the host ids scripts are written as (the sandbox's `nobody`).
    pub script_owner: Option<(u32, u32)>,
    /// A runtime pool: scripts are written into its `/run/script`.
    pub scripts: bool,
    /// What the relay gives up before it reads anything from the sandbox.
    pub confinement: crate::relay::Confinement,
}

/// A request held back while its child's `/tmp` and `/work` are shrunk: its line, its
/// workspace (unpacked once the space has its size), and that size.
struct Held {
    line: Vec<u8>,
    workspace: Option<proto::bytes::Bytes>,
    size: u64,
}

/// A call the monitor hands to a slot's parked child: `ToLauncher::Call` without its slot.
struct Call {
    request_id: String,
    /// JSON text the monitor has already parsed and re-serialised.
    event: String,
    script: Option<proto::launch::Script>,
    workspace: Option<proto::bytes::Bytes>,
    /// Pack the child's directory once its handler answered.
    out: bool,
    /// The caller takes progress as it comes.
    progress: bool,
    /// The size the child's `/tmp` and `/work` are to have, if not the plan's.
    shrink_to: Option<u64>,
    secrets: Vec<proto::launch::SecretFile>,
}

/// The request line a child is handed: its id, its script's path (a pool's), its event.
fn request_line(request_id: String, script: Option<String>, event: &str) -> Vec<u8> {
    let mut line = Vec::with_capacity(event.len() + 128);
    line.extend_from_slice(b"{\"kind\":\"request\",\"id\":");
    line.extend_from_slice(serde_json::Value::from(request_id).to_string().as_bytes());
    if let Some(p) = script {
        line.extend_from_slice(b",\"script\":");
        line.extend_from_slice(serde_json::Value::from(p).to_string().as_bytes());
    }
    line.extend_from_slice(b",\"event\":");
    line.extend_from_slice(event.as_bytes());
    line.extend_from_slice(b"}\n");
    line
}

/// The host ids the launcher acts as in a request's directory: the request's own, or
/// `None` when the launcher already runs as them.
fn act_as(sender: Sender) -> Option<(u32, u32)> {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    ((sender.uid, sender.gid) != (uid, gid)).then_some((sender.uid, sender.gid))
}

/// Serve the zygote until the agent exits or the monitor ends it. `report` is init's report
/// pipe (a `W` line means the agent exited), with any bytes already read in `pending`.
pub fn serve(
    sock: &mut UnixStream,
    sandbox: Sandbox,
    report: RawFd,
    pending: Vec<u8>,
    ch: Channels,
) -> Result<(), LaunchError> {
    let Sandbox {
        init_pid,
        ns,
        scratch_bytes,
        script_owner,
        scripts,
        confinement,
    } = sandbox;
    // SAFETY: fcntl on a descriptor we own, adding O_NONBLOCK.
    unsafe {
        let flags = libc::fcntl(ch.log, libc::F_GETFL);
        libc::fcntl(ch.log, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let agent_log = crate::agent_log::AgentLog::new(format!("sandbox {init_pid} (agent)"));
    let script_space = if scripts {
        match receive_script_dir(ch.reg, init_pid) {
            Ok(d) => Some(crate::script_space::ScriptSpace::new(d, script_owner)),
            Err(why) => return Err(end(init_pid, why)),
        }
    } else {
        None
    };
    let up = Up {
        sock: sock
            .try_clone()
            .map_err(|e| LaunchError::Channel(e.into()))?,
        held: Vec::new(),
        since: None,
    };
    let mounter = match crate::scratch::Mounter::start(&ns, scratch_bytes) {
        Ok(m) => m,
        Err(e) => return Err(end(init_pid, format!("start the mounter: {e}"))),
    };
    let mut zygote = Zygote {
        mounter,
        shrinking: HashMap::new(),
        mounting: HashMap::new(),
        children: HashMap::new(),
        report_buf: pending,
        ctl_lines: Lines::new(MAX_CONTROL_LINE),
        up,
        script_space,
        agent_log,
        ns,
        monitor: sock,
        report,
        ctl: ch.ctl,
        reg: ch.reg,
        log_fd: ch.log,
        init_pid,
        scratch_bytes,
        ready: false,
        ctl_open: true,
        reg_open: true,
        log_open: true,
        agent_status: None,
    };
    // Everything from here on is read from the sandbox: the relay gives up the host's
    // privileges first (see `relay`). /dev/null is opened while it still may.
    if plumbing::pipes::dev_null().is_none() {
        return Err(end(init_pid, "open /dev/null".into()));
    }
    if let Err(e) = crate::relay::confine(&confinement) {
        return Err(end(init_pid, e.to_string()));
    }
    zygote.run()?;
    zygote.exited()
}

/// End the zygote: kill the sandbox's init (every process in the sandbox goes with it),
/// and say why.
fn end(init_pid: libc::pid_t, why: String) -> LaunchError {
    // SAFETY: signalling our own child (the sandbox's init).
    unsafe { libc::kill(init_pid, libc::SIGKILL) };
    LaunchError::Sandbox(why)
}

/// A poll entry that waits for `fd` to be readable (-1: for nothing).
fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// The relay's state while it serves a zygote. Fields are dropped in the order they are
/// declared: the mounter is reaped first, then the children's channels close.
struct Zygote<'a> {
    mounter: crate::scratch::Mounter,
    /// Requests held while their child's /tmp and /work are shrunk: the line to send it.
    shrinking: HashMap<String, Held>,
    mounting: HashMap<String, Mounting>,
    children: HashMap<String, Child>,
    /// What init has reported that is not a whole line yet.
    report_buf: Vec<u8>,
    ctl_lines: Lines,
    up: Up,
    script_space: Option<crate::script_space::ScriptSpace>,
    agent_log: crate::agent_log::AgentLog,
    ns: crate::scratch::SandboxNs,
    /// The monitor's channel (frames from it are read here; `up` writes to it).
    monitor: &'a mut UnixStream,
    /// init's report pipe.
    report: RawFd,
    /// The agent's control channel.
    ctl: RawFd,
    /// The registration socket.
    reg: RawFd,
    /// The read end of the agent's diagnostics pipe.
    log_fd: RawFd,
    init_pid: libc::pid_t,
    /// The size of each request's `/tmp` and of its `/work`, in bytes.
    scratch_bytes: u64,
    /// The agent said it is ready.
    ready: bool,
    /// Whether the control channel, the registration socket and the diagnostics pipe are
    /// still open: each is polled until its end.
    ctl_open: bool,
    reg_open: bool,
    log_open: bool,
    /// The agent's wait status, once init has reported it.
    agent_status: Option<i32>,
}

/// What the loop does once a handler has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Go on to the next ready source of this pass.
    Go,
    /// Poll again: the sources after this one are looked at on the next pass.
    Poll,
    /// init is gone: the relay ends.
    InitGone,
}

impl Zygote<'_> {
    // Where each source is in the poll set: these first, then three for each child (see
    // `poll_set`).
    const MONITOR: usize = 0;
    const REPORT: usize = 1;
    const AGENT: usize = 2;
    const REGISTRATIONS: usize = 3;
    const AGENT_LOG: usize = 4;
    const MOUNTER: usize = 5;
    const CHILDREN: usize = 6;

    /// End the zygote (see [`end`]).
    fn end(&self, why: String) -> LaunchError {
        end(self.init_pid, why)
    }

    /// Relay until init is gone: wait for events, hand each ready source to its handler in
    /// this order, and send what is held once it is due.
    fn run(&mut self) -> Result<(), LaunchError> {
        loop {
            let (mut fds, slots) = self.poll_set();
            let timeout = self.timeout_ms();
            // SAFETY: fds is a valid pollfd array for its length.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(self.end("poll failed".into()));
            }
            let ready = |i: usize| fds[i].revents != 0;
            if ready(Self::MONITOR) && self.on_monitor()? == Then::Poll {
                continue;
            }
            if ready(Self::AGENT) {
                self.on_agent()?;
            }
            if ready(Self::REGISTRATIONS) {
                self.on_registration()?;
            }
            if ready(Self::AGENT_LOG) {
                self.on_agent_log();
            }
            if ready(Self::MOUNTER) && self.on_mounter()? == Then::Poll {
                continue;
            }
            for (i, slot) in slots.iter().enumerate() {
                let base = Self::CHILDREN + 3 * i;
                self.on_child(slot, [base, base + 1, base + 2].map(ready))?;
            }
            if ready(Self::REPORT) && self.on_report()? == Then::InitGone {
                return Ok(());
            }
            self.up.flush_due()?;
        }
    }

    /// What to poll, in the order of the indices above; then each child's channel, stdout
    /// and stderr, in the order of the slots returned (-1 for an orphaned child's).
    fn poll_set(&self) -> (Vec<libc::pollfd>, Vec<String>) {
        let mut fds: Vec<libc::pollfd> = vec![
            pollin(self.monitor.as_raw_fd()),
            pollin(self.report),
            pollin(if self.ctl_open { self.ctl } else { -1 }),
            pollin(if self.reg_open { self.reg } else { -1 }),
            pollin(if self.log_open {
                self.agent_log.poll_fd(self.log_fd)
            } else {
                -1
            }),
            pollin(self.mounter.fd()),
        ];
        let slots: Vec<String> = self.children.keys().cloned().collect();
        for s in &slots {
            let (fd, out, err) = self
                .children
                .get(s)
                .filter(|c| !c.orphaned)
                .map_or((-1, -1, -1), |c| {
                    (c.fd.as_raw_fd(), c.out.raw(), c.err.raw())
                });
            fds.extend([fd, out, err].map(pollin));
        }
        (fds, slots)
    }

    /// Until what is held is due, or the next drain of a stream past its cap (or of the
    /// agent's diagnostics past their budget).
    fn timeout_ms(&self) -> libc::c_int {
        let mut timeout = self.up.timeout_ms();
        if let Some(ms) = self.agent_log.due_ms().filter(|_| self.log_open) {
            timeout = if timeout < 0 { ms } else { timeout.min(ms) };
        }
        for c in self.children.values().filter(|c| !c.orphaned) {
            for ms in [c.out.due_ms(), c.err.due_ms()].into_iter().flatten() {
                timeout = if timeout < 0 { ms } else { timeout.min(ms) };
            }
        }
        timeout
    }

    // --- The monitor ------------------------------------------------------------------

    /// A frame from the monitor.
    fn on_monitor(&mut self) -> Result<Then, LaunchError> {
        match read_frame::<_, ToLauncher>(self.monitor, MAX_LAUNCH_FRAME) {
            Ok(ToLauncher::Park { slot }) if valid_slot(&slot) => self.park(slot)?,
            Ok(ToLauncher::Call {
                slot,
                request_id,
                event,
                script,
                workspace,
                out,
                progress,
                scratch_bytes,
                secrets,
            }) => {
                let call = Call {
                    request_id,
                    event,
                    script,
                    workspace,
                    out,
                    progress,
                    shrink_to: scratch_bytes,
                    secrets,
                };
                return self.call(slot, call);
            }
            // An unused parked child: dropping its channel ends it (it sees the end of
            // its request channel and exits; its directory goes with its /work).
            Ok(ToLauncher::Reap { slot }) if valid_slot(&slot) => self.reap(&slot),
            Ok(ToLauncher::Kill) => return Err(self.end("killed by the monitor".into())),
            Ok(other) => return Err(self.end(format!("the monitor sent {other:?} to a zygote"))),
            Err(e) => return Err(self.end(format!("monitor channel: {e}"))),
        }
        Ok(Then::Go)
    }

    /// Ask the agent for a parked child for `slot`.
    fn park(&mut self, slot: String) -> Result<(), LaunchError> {
        let mut line = serde_json::json!({"kind": "park", "slot": slot}).to_string();
        line.push('\n');
        if send_now(self.ctl, line.as_bytes()).is_err() {
            self.up.send(&FromLauncher::ParkFailed {
                slot,
                message: "the agent is not reading".into(),
            })?;
        }
        Ok(())
    }

    /// Hand a call to `slot`'s parked child: its script placed, its workspace unpacked,
    /// then its request line. A refused script or workspace ends the pass (see [`Then`]).
    fn call(&mut self, slot: String, call: Call) -> Result<Then, LaunchError> {
        // A pool's script goes into the sandbox before its request does.
        let placed = self.place_script(&slot, call.script.as_ref());
        let refused = match &placed {
            Err(Refused::TooLarge(m)) => Some((true, m.clone())),
            Err(Refused::Full(m)) => Some((false, m.clone())),
            _ => None,
        };
        if let Some((too_large, message)) = refused {
            self.children.remove(&slot);
            self.up.send(&FromLauncher::ScriptRefused {
                slot: slot.clone(),
                too_large,
                message,
            })?;
            self.up.send(&FromLauncher::SlotClosed {
                slot,
                violation: None,
            })?;
            return Ok(Then::Poll);
        }
        let shrink = call.shrink_to.filter(|s| *s < self.scratch_bytes);
        if let Some(c) = self.children.get_mut(&slot) {
            c.pack = call.out;
            c.progress = call.progress;
        }
        // The workspace is unpacked into the child's directory before the child has its
        // request: nothing of the call runs until it is all there. Where the child's
        // scratch space is shrunk first, it is unpacked after that, into the smaller space.
        if shrink.is_none() {
            if let Some(refusal) = self.children.get(&slot).and_then(|c| {
                c.work
                    .unpack_call(call.workspace.as_ref(), self.scratch_bytes)
                    .err()
            }) {
                self.refuse_workspace(slot, refusal)?;
                return Ok(Then::Poll);
            }
        }
        let delivered = match placed {
            Ok(path) => self.deliver(&slot, path, call, shrink),
            Err(e) => {
                log::error!("launcher: place a script in the sandbox: {e}");
                false
            }
        };
        if !delivered {
            self.drop_undelivered(slot, "the child could not take the request")?;
        }
        Ok(Then::Go)
    }

    /// Place a pool's script for `slot`'s call: its path in the sandbox, or none when the
    /// call has none (or `slot` has no child).
    fn place_script(
        &mut self,
        slot: &str,
        script: Option<&proto::launch::Script>,
    ) -> Result<Option<String>, Refused> {
        match (script, self.script_space.as_mut()) {
            (Some(s), Some(space)) if self.children.contains_key(slot) => {
                space.place(slot, s).map(Some)
            }
            (Some(_), None) => Err(Refused::Failed("this zygote is not a runtime pool".into())),
            _ => Ok(None),
        }
    }

    /// Write `slot`'s request line to its child now, or hold it while the mounter shrinks
    /// the child's scratch space and writes its secrets. False if the child could not take
    /// it (or there is no child).
    fn deliver(
        &mut self,
        slot: &str,
        script: Option<String>,
        call: Call,
        shrink: Option<u64>,
    ) -> bool {
        let Some(c) = self.children.get(slot) else {
            return false;
        };
        let line = request_line(call.request_id, script, &call.event);
        if shrink.is_none() && call.secrets.is_empty() {
            return sys::write_fd(c.fd.as_raw_fd(), &line).is_ok();
        }
        // Its /tmp and /work are shrunk and its secrets written first; the request follows
        // once the mounter says so (and the workspace, where the space was shrunk, after
        // that).
        if let Err(e) = self
            .mounter
            .prepare(slot, c.pid, &self.ns, shrink, &call.secrets)
        {
            log::error!("launcher: {e}");
            return false;
        }
        self.shrinking.insert(
            slot.to_string(),
            Held {
                line,
                workspace: if shrink.is_some() {
                    call.workspace
                } else {
                    None
                },
                size: shrink.unwrap_or(self.scratch_bytes),
            },
        );
        true
    }

    /// Drop `slot`'s child, unused (see [`Zygote::on_monitor`]).
    fn reap(&mut self, slot: &str) {
        if let Some(space) = self.script_space.as_mut() {
            space.release(slot);
        }
        self.children.remove(slot);
        self.mounting.remove(slot);
        self.shrinking.remove(slot);
    }

    /// A call whose workspace was refused: nothing of it ran; its child is dropped and the
    /// monitor told why.
    fn refuse_workspace(
        &mut self,
        slot: String,
        refusal: crate::workspace::Refusal,
    ) -> Result<(), LaunchError> {
        if let Some(space) = self.script_space.as_mut() {
            space.release(&slot);
        }
        self.children.remove(&slot);
        self.up.send(&FromLauncher::WorkspaceRefused {
            slot: slot.clone(),
            too_large: refusal.too_large,
            message: format!("the workspace was refused: {}", refusal.message),
        })?;
        self.up.send(&FromLauncher::SlotClosed {
            slot,
            violation: None,
        })
    }

    /// A call whose request never reached its child: the child is dropped, and the monitor
    /// told why.
    fn drop_undelivered(&mut self, slot: String, why: &str) -> Result<(), LaunchError> {
        if let Some(space) = self.script_space.as_mut() {
            space.release(&slot);
        }
        self.children.remove(&slot);
        self.up.send(&FromLauncher::SlotClosed {
            slot,
            violation: Some(why.into()),
        })
    }

    // --- The agent ----------------------------------------------------------------------

    /// The agent's control channel: its lines, each relayed to the monitor.
    fn on_agent(&mut self) -> Result<(), LaunchError> {
        match self.ctl_lines.fill(self.ctl) {
            Ok(Read_::Eof) => self.ctl_open = false,
            Ok(Read_::Data) => {}
            Err(e) => return Err(self.end(format!("the agent broke the protocol: {e}"))),
        }
        loop {
            let line = match self.ctl_lines.next_line() {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(e) => return Err(self.end(format!("the agent broke the protocol: {e}"))),
            };
            let msg = match parse::<AgentMsg>(&line) {
                Ok(m) => m,
                Err(e) => return Err(self.end(format!("the agent broke the protocol: {e}"))),
            };
            let out = self.agent_message(msg)?;
            self.up.send(&out)?;
        }
        Ok(())
    }

    /// What the monitor is told of one agent line, if it came in its turn.
    fn agent_message(&mut self, msg: AgentMsg) -> Result<FromLauncher, LaunchError> {
        Ok(match msg {
            AgentMsg::Ready { .. } if !self.ready => {
                self.ready = true;
                FromLauncher::Ready
            }
            AgentMsg::ImportError { message, traceback } if !self.ready => {
                FromLauncher::ImportError {
                    message: crate::child_line::cut_message(message),
                    traceback: crate::child_line::cut_traceback(traceback),
                }
            }
            AgentMsg::Heartbeat if self.ready => FromLauncher::Heartbeat,
            AgentMsg::ParkFailed { slot, message } if self.ready && valid_slot(&slot) => {
                FromLauncher::ParkFailed { slot, message }
            }
            other => {
                return Err(self.end(format!(
                    "the agent broke the protocol: {other:?} out of order"
                )))
            }
        })
    }

    /// A registration: a request process asks to be parked.
    fn on_registration(&mut self) -> Result<(), LaunchError> {
        match receive_registration(self.reg) {
            Ok(Some((slot, sender, fd, out, err))) => {
                if self.children.contains_key(&slot) || self.mounting.contains_key(&slot) {
                    return Err(self.end(format!("slot {slot} registered twice")));
                }
                // The request's own /tmp and /work, mounted by a helper this loop does
                // not wait for; the child is parked once they are there. A child that
                // gets neither sees its channel close, and exits.
                match self.mounter.request(&slot, sender.pid, &self.ns) {
                    Err(e) => self.up.send(&FromLauncher::ParkFailed {
                        slot,
                        message: format!("give the request its own /tmp and /work: {e}"),
                    })?,
                    Ok(()) => {
                        self.mounting.insert(
                            slot,
                            Mounting {
                                sender,
                                fd,
                                out,
                                err,
                            },
                        );
                    }
                }
            }
            Ok(None) => {}
            Err(e) if e.contains("closed") => self.reg_open = false,
            Err(e) => return Err(self.end(format!("the agent broke the protocol: {e}"))),
        }
        Ok(())
    }

    /// The agent's own diagnostics.
    fn on_agent_log(&mut self) {
        self.log_open = self.agent_log.pump(self.log_fd);
    }

    // --- The mounter --------------------------------------------------------------------

    /// The mounter's answer: that child is parked now (or failed). A slot dropped
    /// meanwhile has no entry any more; its answer is dropped.
    fn on_mounter(&mut self) -> Result<Then, LaunchError> {
        let (slot, result) = match self.mounter.answer() {
            Ok(a) => a,
            Err(e) => return Err(self.end(format!("the mounter failed: {e}"))),
        };
        // A request held while its child's scratch space was shrunk goes on now, or
        // (not shrunk) never reaches the child.
        if let Some(held) = self.shrinking.remove(&slot) {
            return self.prepared(slot, result, held);
        }
        if let Some(m) = self.mounting.remove(&slot) {
            self.mounted(slot, result, m)?;
        }
        Ok(Then::Go)
    }

    /// The mounter has shrunk `slot`'s scratch space and written its secrets (or failed
    /// to): the request held for it goes on.
    fn prepared(
        &mut self,
        slot: String,
        result: Result<Option<OwnedFd>, crate::scratch::ScratchError>,
        held: Held,
    ) -> Result<Then, LaunchError> {
        // Its workspace goes into the space as it is now.
        if let (Ok(_), Some(c)) = (&result, self.children.get(&slot)) {
            if let Err(refusal) = c.work.unpack_call(held.workspace.as_ref(), held.size) {
                self.refuse_workspace(slot, refusal)?;
                return Ok(Then::Poll);
            }
        }
        let line = held.line;
        let delivered = match (&result, self.children.get(&slot)) {
            (Ok(_), Some(c)) => sys::write_fd(c.fd.as_raw_fd(), &line).is_ok(),
            (Err(e), Some(_)) => {
                log::error!("launcher: {e}");
                false
            }
            (_, None) => true,
        };
        if !delivered {
            self.drop_undelivered(
                slot,
                "the request's /tmp and /work could not be shrunk to its scratch limit",
            )?;
        }
        Ok(Then::Go)
    }

    /// The mounter has given `slot`'s registered process its own `/tmp` and `/work` (or
    /// failed to): it gets its directory and is told it is parked, and the monitor is told.
    fn mounted(
        &mut self,
        slot: String,
        result: Result<Option<OwnedFd>, crate::scratch::ScratchError>,
        m: Mounting,
    ) -> Result<(), LaunchError> {
        let placed = result
            .map_err(|e| format!("give the request its own /tmp and /work: {e}"))
            .and_then(|work| {
                work.ok_or_else(|| "the mounter did not hand over its /work".to_string())
            })
            .and_then(|work| {
                crate::workspace::Workdir::create(work, act_as(m.sender))
                    .map_err(|e| format!("give the request its own directory: {e}"))
            })
            .and_then(|work| {
                send_now(m.fd.as_raw_fd(), &mounted_line(&work.name))
                    .map(|()| work)
                    .map_err(|e| {
                        format!("the request's process could not be told it was parked: {e}")
                    })
            });
        let work = match placed {
            Ok(work) => work,
            Err(message) => return self.up.send(&FromLauncher::ParkFailed { slot, message }),
        };
        self.children.insert(
            slot.clone(),
            Child {
                pid: m.sender.pid,
                fd: m.fd,
                lines: Lines::new(MAX_CHILD_LINE),
                done: false,
                orphaned: false,
                beat_sent: None,
                out: Relay::new(m.out, Stream::Stdout),
                err: Relay::new(m.err, Stream::Stderr),
                work,
                pack: false,
                progress: false,
            },
        );
        self.up.send(&FromLauncher::Parked {
            slot,
            pid: m.sender.pid,
        })
    }

    // --- Children and init --------------------------------------------------------------

    /// A child's channel, stdout and stderr, as `ready` says which of them poll found ready.
    fn on_child(&mut self, slot: &str, ready: [bool; 3]) -> Result<(), LaunchError> {
        let Some(c) = self.children.get_mut(slot) else {
            return Ok(());
        };
        // Output first: it belongs before anything the channel says after it.
        if ready[1] {
            c.out.pump(slot, &mut self.up, false)?;
        }
        if ready[2] {
            c.err.pump(slot, &mut self.up, false)?;
        }
        if !ready[0] {
            return Ok(());
        }
        let (violation, closed) = c.read_lines(slot, &mut self.up)?;
        if violation.is_none() && closed && !self.ctl_open && !c.done {
            // The agent went first: this child is going down with the zygote.
            c.drain(slot, &mut self.up)?;
            c.orphaned = true;
            return Ok(());
        }
        if violation.is_none() && !closed {
            return Ok(());
        }
        c.drain(slot, &mut self.up)?;
        // The end of a child that has answered can wait for company (see HOLD); a child
        // that broke the protocol or died unanswered is reported at once.
        let answered = c.done && violation.is_none();
        self.children.remove(slot);
        if let Some(space) = self.script_space.as_mut() {
            space.release(slot);
        }
        let msg = FromLauncher::SlotClosed {
            slot: slot.to_string(),
            violation,
        };
        if answered {
            self.up.hold(&msg)
        } else {
            self.up.send(&msg)
        }
    }

    /// init: the agent exited (W) or init itself is gone (EOF).
    fn on_report(&mut self) -> Result<Then, LaunchError> {
        let mut chunk = [0u8; 512];
        let n = sys::read_fd(self.report, &mut chunk).unwrap_or(0);
        if n == 0 {
            return Ok(Then::InitGone);
        }
        self.report_buf.extend_from_slice(&chunk[..n]);
        if self.report_buf.len() > 4096 {
            return Err(self.end("the sandbox's init said too much".into()));
        }
        while let Some(nl) = self.report_buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.report_buf.drain(..=nl).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).to_string();
            match text.strip_prefix("W ").and_then(|n| n.parse::<i32>().ok()) {
                Some(s) => self.agent_status = Some(s),
                None => return Err(self.end("the sandbox's init broke its report protocol".into())),
            }
        }
        Ok(Then::Go)
    }

    /// init is gone, and every child went with it. Say so first, so the monitor blames the
    /// zygote, not the handlers, for the requests that were running.
    fn exited(mut self) -> Result<(), LaunchError> {
        let s = self.agent_status.unwrap_or(libc::SIGKILL);
        let (code, signal) = if libc::WIFSIGNALED(s) {
            (None, Some(libc::WTERMSIG(s)))
        } else {
            (Some(libc::WEXITSTATUS(s)), None)
        };
        self.up.send(&FromLauncher::Exited {
            code,
            signal,
            timed_out: false,
            wall_us: 0,
        })?;
        for (slot, _) in self.children.drain() {
            self.up.send(&FromLauncher::SlotClosed {
                slot,
                violation: None,
            })?;
        }
        Ok(())
    }
}

impl Child {
    /// Read its channel and relay each whole line: how it broke the protocol, if it did,
    /// and whether its channel closed.
    fn read_lines(
        &mut self,
        slot: &str,
        up: &mut Up,
    ) -> Result<(Option<String>, bool), LaunchError> {
        let mut violation: Option<String> = None;
        let mut closed = false;
        match self.lines.fill(self.fd.as_raw_fd()) {
            Ok(Read_::Eof) => closed = true,
            Ok(Read_::Data) => {}
            Err(e) => violation = Some(e),
        }
        while violation.is_none() {
            let line = match self.lines.next_line() {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(e) => {
                    violation = Some(e);
                    break;
                }
            };
            let msg = match crate::child_line::parse(line) {
                Ok(m) => m,
                Err(e) => {
                    violation = Some(e);
                    break;
                }
            };
            if self.done {
                violation = Some("a line after the terminal result".into());
                break;
            }
            self.pass_on(slot, msg, up)?;
        }
        Ok((violation, closed))
    }

    /// Relay one of its lines to the monitor.
    fn pass_on(&mut self, slot: &str, msg: ChildMsg, up: &mut Up) -> Result<(), LaunchError> {
        let s = slot.to_string();
        if matches!(msg, ChildMsg::Result { .. } | ChildMsg::Error { .. }) {
            // Everything the handler wrote is in the pipes by now: relay all of it
            // before its answer.
            self.drain(slot, up)?;
            // The handler is done: its directory, as it left it, goes with the
            // answer (before it, so the monitor has it when it answers).
            if self.pack {
                let p = self.work.pack(proto::front::MAX_WORKSPACE_OUT);
                if let Some(why) = &p.note {
                    log::warn!("launcher: request {slot}: its directory was not packed: {why}");
                }
                up.send(&FromLauncher::WorkspaceOut {
                    slot: slot.to_string(),
                    tar: p.tar.map(proto::bytes::Bytes),
                    truncated: p.truncated,
                })?;
            }
        }
        if matches!(msg, ChildMsg::Heartbeat)
            || (matches!(msg, ChildMsg::Progress { .. }) && !self.progress)
        {
            // It rides with the next frame that goes (or after `HOLD`).
            if beat_due(&mut self.beat_sent, Instant::now()) {
                up.hold(&FromLauncher::ChildHeartbeat { slot: s })?;
            }
            return Ok(());
        }
        let out = match msg {
            ChildMsg::Progress { text } => FromLauncher::Progress { slot: s, text },
            ChildMsg::Heartbeat => FromLauncher::ChildHeartbeat { slot: s },
            ChildMsg::Result { value } => {
                self.done = true;
                FromLauncher::Returned {
                    slot: s,
                    value: value.to_string(),
                }
            }
            ChildMsg::Error {
                message,
                traceback,
                exit_code,
            } => {
                self.done = true;
                FromLauncher::Raised {
                    slot: s,
                    message,
                    traceback,
                    exit_code,
                }
            }
        };
        up.send(&out)
    }

    /// Relay all that its pipes hold now, stdout first.
    fn drain(&mut self, slot: &str, up: &mut Up) -> Result<(), LaunchError> {
        self.out.pump(slot, up, true)?;
        self.err.pump(slot, up, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_heartbeats_go_up_at_most_once_a_quarter_second() {
        let t0 = Instant::now();
        let mut last = None;
        let sent = (0..3000u64)
            .filter(|i| beat_due(&mut last, t0 + Duration::from_micros(i * 100)))
            .count();
        // 3,000 lines over 0.3 s: the first, and one 250 ms later.
        assert_eq!(sent, 2);
        assert!(beat_due(&mut last, t0 + Duration::from_millis(600)));
        assert!(!beat_due(&mut last, t0 + Duration::from_millis(700)));
    }
    use proto::read_frame;

    fn closed(slot: &str) -> FromLauncher {
        FromLauncher::SlotClosed {
            slot: slot.into(),
            violation: None,
        }
    }

    fn slot_of(m: FromLauncher) -> String {
        match m {
            FromLauncher::SlotClosed { slot, .. } | FromLauncher::Parked { slot, .. } => slot,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn pending(s: &UnixStream) -> bool {
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// Every line a channel carries, read through `Lines` from a socket `chunks` at a time.
    fn lines_of(chunks: &[&[u8]], max: usize) -> Result<Vec<Vec<u8>>, String> {
        let (mut ours, theirs) = UnixStream::pair().expect("socketpair");
        let mut lines = Lines::new(max);
        let mut out = Vec::new();
        for chunk in chunks {
            ours.write_all(chunk).expect("write");
            // A chunk larger than a read is read in several.
            let mut left = chunk.len();
            while left > 0 {
                let before = lines.buf.len() - lines.start;
                lines.fill(theirs.as_raw_fd())?;
                left -= lines.buf.len() - before;
                while let Some(l) = lines.next_line()? {
                    out.push(l);
                }
            }
        }
        drop(ours);
        match lines.fill(theirs.as_raw_fd())? {
            Read_::Eof => Ok(out),
            Read_::Data => Err("more data than was written".into()),
        }
    }

    #[test]
    fn lines_are_cut_at_newlines_however_they_arrive() {
        let got = lines_of(&[b"a\nbb\ncc", b"c\n\nd", b"dd\n"], 100).expect("lines");
        assert_eq!(got, [&b"a"[..], b"bb", b"ccc", b"", b"ddd"]);
        // A line longer than a read, taken with the buffer it was read into, and what
        // followed it in the same read.
        let long = vec![b'x'; 3 * CHUNK + 17];
        let mut first = long.clone();
        first.extend_from_slice(b"\nnext");
        let got = lines_of(&[&first, b"\nlast\n"], 4 * CHUNK).expect("lines");
        assert_eq!(got, [long, b"next".to_vec(), b"last".to_vec()]);
        // Exactly at the cap is a line; one byte more is not, with or without its newline.
        assert_eq!(lines_of(&[b"12345\n"], 5).expect("lines"), [b"12345"]);
        for text in [&b"123456\n"[..], b"123456"] {
            let e = lines_of(&[text], 5).expect_err("over the cap");
            assert_eq!(e, "a line over 5 bytes");
        }
        let e = lines_of(&[b"ok\npart"], 100).expect_err("a partial line");
        assert_eq!(e, "the channel closed in the middle of a line");
    }

    #[test]
    fn a_large_frame_leaves_whole_after_what_is_held() {
        let (ours, mut theirs) = UnixStream::pair().expect("socketpair");
        let mut up = Up {
            sock: ours,
            held: Vec::new(),
            since: None,
        };
        up.hold(&closed("a")).expect("hold");
        let value = format!("[{}0]", "0,".repeat(4 << 20));
        let reader = std::thread::spawn(move || {
            let first: FromLauncher = read_frame(&mut theirs, MAX_LAUNCH_FRAME).expect("frame");
            let second: FromLauncher = read_frame(&mut theirs, MAX_LAUNCH_FRAME).expect("frame");
            let third: FromLauncher = read_frame(&mut theirs, MAX_LAUNCH_FRAME).expect("frame");
            (first, second, third)
        });
        up.send(&FromLauncher::Returned {
            slot: "b".into(),
            value: value.clone(),
        })
        .expect("send");
        up.send(&closed("c")).expect("send");
        let (first, second, third) = reader.join().expect("reader");
        assert_eq!(slot_of(first), "a");
        match second {
            FromLauncher::Returned { slot, value: v } => assert!(slot == "b" && v == value),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(slot_of(third), "c");
    }

    #[test]
    fn every_mounted_line_is_as_long_as_the_agents_read() {
        let line = mounted_line(&"0123456789abcdef".repeat(2));
        assert_eq!(line.len(), MOUNTED_LEN);
        let v: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
        assert_eq!(v["kind"], "mounted");
    }

    #[test]
    fn held_frames_leave_in_order_with_the_next_or_when_due() {
        let (ours, mut theirs) = UnixStream::pair().expect("socketpair");
        let mut up = Up {
            sock: ours,
            held: Vec::new(),
            since: None,
        };
        assert_eq!(
            up.timeout_ms(),
            -1,
            "nothing held: poll may sleep without end"
        );

        // Held: nothing reaches the monitor yet, and poll wakes in time to send it.
        up.hold(&closed("a")).expect("hold");
        assert!(!pending(&theirs));
        let t = up.timeout_ms();
        assert!((1..=2).contains(&t), "timeout {t} ms");
        up.flush_due().expect("not due yet");
        assert!(!pending(&theirs));

        // The next frame takes it along, first.
        up.send(&FromLauncher::Parked {
            slot: "b".into(),
            pid: 7,
        })
        .expect("send");
        let first: FromLauncher = read_frame(&mut theirs, MAX_LAUNCH_FRAME).expect("frame");
        let second: FromLauncher = read_frame(&mut theirs, MAX_LAUNCH_FRAME).expect("frame");
        assert_eq!((slot_of(first), slot_of(second)), ("a".into(), "b".into()));
        assert_eq!(up.timeout_ms(), -1);

        // Alone, it goes once it has waited HOLD.
        up.hold(&closed("c")).expect("hold");
        std::thread::sleep(HOLD + Duration::from_millis(1));
        assert_eq!(up.timeout_ms(), 0);
        up.flush_due().expect("due");
        let third: FromLauncher = read_frame(&mut theirs, MAX_LAUNCH_FRAME).expect("frame");
        assert_eq!(slot_of(third), "c");
        assert!(!pending(&theirs));
        assert_eq!(up.timeout_ms(), -1);
    }
}
