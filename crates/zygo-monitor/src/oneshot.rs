//! A one-shot sandbox, from the monitor's side: create its cgroup and write its limits,
//! spawn a launcher, place the sandbox in the cgroup when the launcher says it exists,
//! collect the program's output within its caps, read what the kernel counted, and leave
//! nothing behind — no cgroup, no process — whatever happened.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use plumbing::pipes::pipe;
use plumbing::pump::{is_dev_null, own_pipe, own_stdin, relay, Stream};
use proto::launch::{
    FromLauncher, LaunchPlan, OneShotTalk, Phase, Placement, Said, ToLauncher, MAX_LAUNCH_FRAME,
};
use proto::{write_frame, FrameBuf};

use crate::cgroup::{Backend, Cgroup, CgroupError, Limits, Usage};
use crate::shape::Shape;
use crate::spawn::{spawn_launcher, Launcher, LauncherFds};

/// What to do with the program's stdout and stderr: kept up to [`OUTPUT_CAP`] each, or
/// passed through.
pub use plumbing::pump::Output;

/// The most of each output stream kept for a captured answer.
pub const OUTPUT_CAP: usize = 1024 * 1024;

/// The launcher's own build deadline plus this is the monitor's watchdog beyond the
/// program's timeout: if the launcher has not reported by then, the monitor kills it all.
const WATCHDOG_SLACK: Duration = Duration::from_secs(35);

/// Where the program's stdin comes from.
///
/// The program is never handed a host file: it gets a pipe the monitor copies into, or,
/// when zygo's own stdin is an anonymous pipe, a description of that pipe of its own
/// (`own_pipe`), which lives on no host filesystem. A host file gives the sandbox more than
/// bytes to read: a terminal takes ioctls that change it for the host (`TCSETS`: the
/// operator's echo switched off for good), a device has ioctls of its own, a directory is a
/// way into the host's file tree past the sandbox's root (`openat(0, "..")`), and a regular
/// file or a named pipe can be changed through it (its mode, times and attributes with
/// `fchmod` and the like, its length by opening `/proc/self/fd/0` again with `O_TRUNC`)
/// wherever the sandbox's root is the file's owner, as it is rootless. A directory or a
/// socket is refused.
pub enum Stdin {
    /// Nothing: the program reads end of file.
    Null,
    /// A file opened by the monitor (see [`Stdin::open`]). [`start`] looks at what it is:
    /// a regular file, a pipe, a terminal or a device is copied through a pipe, anything
    /// else refused.
    File(File),
    /// The monitor's own stdin: an anonymous pipe reopened for the program, anything else
    /// copied through a pipe (never handed over directly: a terminal must not reach the
    /// sandbox).
    Forward,
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
}

/// How a descriptor may reach the program as its stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StdinKind {
    /// A regular file, a pipe, a terminal or a character or block device: copied through
    /// a pipe.
    Copied,
    /// A directory.
    Directory,
    /// A socket.
    Socket,
    /// Any other kind of file.
    Other,
}

impl StdinKind {
    fn of_mode(mode: libc::mode_t) -> StdinKind {
        match mode & libc::S_IFMT {
            libc::S_IFREG | libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK => StdinKind::Copied,
            libc::S_IFDIR => StdinKind::Directory,
            libc::S_IFSOCK => StdinKind::Socket,
            _ => StdinKind::Other,
        }
    }

    fn of(f: &File) -> std::io::Result<StdinKind> {
        use std::os::unix::fs::MetadataExt;
        Ok(StdinKind::of_mode(f.metadata()?.mode() as libc::mode_t))
    }

    /// Why a file of this kind is refused, after `what` names it; None when it is not.
    fn refusal(self, what: &str) -> Option<String> {
        match self {
            StdinKind::Copied => None,
            StdinKind::Directory => Some(format!(
                "{what} is a directory, which would open the host's files to the sandbox; \
                 give a file, a pipe or a terminal"
            )),
            StdinKind::Socket => Some(format!(
                "{what} is a socket, which zygo does not read from; pipe its data in \
                 instead (`... | zygo run --stdin /dev/stdin`)"
            )),
            StdinKind::Other => Some(format!(
                "{what} is neither a file, a pipe nor a terminal; give one of those"
            )),
        }
    }
}

impl Stdin {
    /// Open `path` (read-only, never as a controlling terminal) for the program's stdin,
    /// or say, naming it, why it cannot be. A FIFO's open waits for a writer, as it does
    /// for any reader.
    pub fn open(path: &Path) -> Result<Stdin, String> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let what = path.display().to_string();
        // A socket cannot be opened (ENXIO, which names no cause): say what it is first.
        if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
            return Err(StdinKind::Socket.refusal(&what).unwrap_or_default());
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOCTTY)
            .open(path)
            .map_err(|e| format!("{what}: {e}"))?;
        // What was opened decides, not what the path named a moment before.
        let kind = StdinKind::of(&f).map_err(|e| format!("{what}: {e}"))?;
        match kind.refusal(&what) {
            Some(why) => Err(why),
            None => Ok(Stdin::File(f)),
        }
    }
}

pub struct Request {
    pub plan: LaunchPlan,
    pub limits: Limits,
    pub stdin: Stdin,
    pub output: Output,
    /// The `zygo` binary to run as the launcher.
    pub launcher: PathBuf,
    /// When this descriptor becomes readable (or its write end closes), the sandbox is
    /// killed and the outcome says `cancelled`.
    pub cancel: Option<OwnedFd>,
    /// The descriptors of the plan's `fresh` mounts (its last ones), in their order.
    pub fresh: Vec<OwnedFd>,
    /// Capturing: a file every byte kept of stdout and stderr is also written to as it
    /// arrives (a dependency build's growing log).
    pub tee: Option<File>,
}

/// What happened, in the words `zygo run --json` prints.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub started: bool,
    pub phase: Option<Phase>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub cancelled: bool,
    pub peak_rss_kb: u64,
    /// Microseconds (shown as fractional milliseconds).
    pub wall_us: u64,
    pub cpu_us: u64,
    pub stdout: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr: Vec<u8>,
    pub stderr_truncated: bool,
    /// Passing output through: bytes of the program's output left undelivered because
    /// zygo's own stdout or stderr took nothing more once the sandbox had ended (nothing
    /// read them). Dropped rather than waited for: the sandbox is gone by then.
    pub output_dropped: u32,
}

impl Outcome {
    fn refused(phase: Phase, why: String) -> Outcome {
        Outcome {
            phase: Some(phase),
            error: Some(why),
            ..Outcome::default()
        }
    }
}

fn unique_name() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("run-{}-{n}-{t:08x}", std::process::id())
}

/// Run one sandbox to completion.
pub fn run(backend: &Backend, req: Request) -> Outcome {
    match start(req) {
        Ok(started) => started.finish(backend, || {}),
        Err(out) => *out,
    }
}

/// A launcher spawned for one sandbox and sent its plan: it starts up and creates the
/// sandbox's namespaces while the monitor prepares the sandbox's cgroup, which the
/// sandbox's first process must join before it does anything else.
pub struct Started {
    t0: Instant,
    child: Launcher,
    sock: UnixStream,
    /// The program's output pipes (none for a stream that goes to `/dev/null`).
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    timeout_ms: u64,
    limits: Limits,
    output: Output,
    cancel: Option<OwnedFd>,
    tee: Option<File>,
}

/// Where the program's stdin pipe (the write end, here) is fed from.
enum Feeder {
    /// Copied from this file: the monitor's own stdin, a terminal, a device.
    Relay(File, OwnedFd),
    /// These bytes.
    Bytes(OwnedFd, Vec<u8>),
}

/// Spawn the launcher for `req` and send it the plan. Nothing runs in the sandbox until
/// [`Started::finish`] has placed it in its cgroup.
pub fn start(req: Request) -> Result<Started, Box<Outcome>> {
    let t0 = Instant::now();
    let start_err = |what: &str, e: std::io::Error| {
        Box::new(Outcome::refused(Phase::Start, format!("{what}: {e}")))
    };
    let (sock_mon, sock_launcher) =
        UnixStream::pair().map_err(|e| start_err("create the launcher channel", e))?;
    // Output passed through to a `/dev/null` goes straight to a `/dev/null` of the
    // program's own: nothing to relay (nor to reopen through it: a device that takes and
    // gives nothing).
    // Output passed through to a pipe goes into that pipe, through a description of the
    // program's own (see `own_pipe`): nothing to copy outside the sandbox's CPU quota.
    let stream = |own: RawFd| -> Result<(Option<OwnedFd>, OwnedFd), Box<Outcome>> {
        if matches!(req.output, Output::PassThrough) && is_dev_null(own) {
            if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                return Ok((None, OwnedFd::from(null)));
            }
        }
        if matches!(req.output, Output::PassThrough) {
            if let Some(pipe) = own_pipe(own, libc::O_WRONLY) {
                return Ok((None, pipe));
            }
        }
        let (r, w) = pipe().map_err(|e| start_err("create a pipe", e))?;
        Ok((Some(r), w))
    };
    let (out_r, out_w) = stream(1)?;
    let (err_r, err_w) = stream(2)?;
    // A thread that feeds the program's stdin is started once the launcher is: a thread
    // starting or ending meanwhile slows the spawn down a lot (they contend for the
    // address space the spawn shares until the launcher has exec'd).
    let (stdin, feeder): (Option<OwnedFd>, Option<Feeder>) = match req.stdin {
        Stdin::Null => (None, None),
        Stdin::File(f) => {
            let kind =
                StdinKind::of(&f).map_err(|e| start_err("inspect the program's stdin", e))?;
            if let Some(why) = kind.refusal("the program's stdin") {
                return Err(Box::new(Outcome::refused(Phase::Plan, why)));
            }
            let (r, w) = pipe().map_err(|e| start_err("create a pipe", e))?;
            (Some(r), Some(Feeder::Relay(f, w)))
        }
        // A pipe reaches the program as a description of its own, with nothing to copy.
        Stdin::Forward => match own_pipe(libc::STDIN_FILENO, libc::O_RDONLY) {
            Some(pipe) => (Some(pipe), None),
            None => {
                let own = own_stdin().map_err(|e| start_err("duplicate zygo's stdin", e))?;
                let (r, w) = pipe().map_err(|e| start_err("create a pipe", e))?;
                (Some(r), Some(Feeder::Relay(own, w)))
            }
        },
        Stdin::Bytes(bytes) => {
            let (r, w) = pipe().map_err(|e| start_err("create a pipe", e))?;
            (Some(r), Some(Feeder::Bytes(w, bytes)))
        }
    };
    let launcher_sock = OwnedFd::from(sock_launcher);
    let fds = LauncherFds {
        stdin: stdin.as_ref(),
        stdout: &out_w,
        channel: &launcher_sock,
        program_stderr: &err_w,
    };
    let mut child = spawn_launcher(&req.launcher, fds)
        .map_err(|e| start_err(&format!("start the launcher {}", req.launcher.display()), e))?;
    drop((stdin, out_w, launcher_sock, err_w));
    match feeder {
        Some(Feeder::Relay(from, w)) => {
            std::thread::spawn(move || relay(&from, w));
        }
        Some(Feeder::Bytes(w, bytes)) => {
            std::thread::spawn(move || {
                let _ = File::from(w).write_all(&bytes);
            });
        }
        None => {}
    }
    log::debug!("launcher spawned after {:?}", t0.elapsed());
    let mut sock = sock_mon;
    let mut plan = req.plan;
    // While the launcher starts up (it reads the plan only once it has), the host image's
    // /etc is checked and, if the host's has changed, prepared again.
    if plan.image == proto::launch::Image::Host && plan.etc.is_none() {
        plan.etc = crate::etc_cache::prepare();
    }
    let timeout_ms = plan.timeout_ms;
    // As root, the monitor opens what the sandbox mounts (see `crate::mounts`).
    let fresh = req.fresh;
    let handed = crate::mounts::hand_over(&mut plan).and_then(|handed| {
        let mut trees: Vec<_> = handed
            .into_iter()
            .map(crate::mounts::Handed::into_tree)
            .collect();
        // The fresh mounts' trees go after the other mounts', before the workspace's.
        let work = if plan.work_handed { trees.pop() } else { None };
        trees.extend(fresh);
        trees.extend(work);
        crate::mounts::send(&sock, &trees)
            .map_err(|e| format!("send the mounts to the launcher: {e}"))
    });
    if let Err(e) = handed {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Box::new(Outcome::refused(Phase::Start, e)));
    }
    if let Err(e) = write_frame(&mut sock, &ToLauncher::Start(Box::new(plan))) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Box::new(Outcome::refused(
            Phase::Start,
            format!("send the plan to the launcher: {e}"),
        )));
    }
    Ok(Started {
        t0,
        child,
        sock,
        stdout: out_r,
        stderr: err_r,
        timeout_ms,
        limits: req.limits,
        output: req.output,
        cancel: req.cancel,
        tee: req.tee,
    })
}

impl Started {
    /// Create the sandbox's cgroup and hand it to the launcher, run the sandbox to
    /// completion, read what the kernel counted, and remove the cgroup. `meanwhile` runs
    /// once, while the program runs (or once the sandbox has ended, if it never started):
    /// the monitor has nothing else to do then, and the machine is least busy.
    ///
    /// The sandbox's init, waiting for its cgroup, gets it before the limits are written:
    /// it joins and builds meanwhile, and nothing of the program runs before the placement
    /// check that follows them (see `drive`).
    pub fn finish(self, backend: &Backend, meanwhile: impl FnOnce()) -> Outcome {
        let cg = match backend.create(&unique_name()) {
            Ok(cg) => cg,
            Err(e) => {
                let out = self.abandon(Outcome::refused(Phase::Plan, e.to_string()));
                meanwhile();
                return out;
            }
        };
        // init joins the cgroup itself by writing "0" to these, before it does anything
        // else: cheaper than moving it from outside (no wait on the kernel's global cgroup
        // lock), and the monitor checks the result before letting the sandbox go on.
        let sent = cg
            .attach_files()
            .map_err(|e| format!("open the sandbox's cgroup: {e}"))
            .and_then(|files| {
                send_cgroup_files(&self.sock, &files)
                    .map_err(|e| format!("send the sandbox's cgroup to the launcher: {e}"))
            });
        if let Err(e) = sent {
            // Removed: nothing ever ran in it.
            drop(cg);
            // A launcher that refused the plan (a writable folder that cannot be idmapped,
            // say) said why before it went: that is the answer, not the channel it closed.
            let out = match launchers_last_word(&self.sock) {
                Some((phase, reason)) => Outcome::refused(phase, reason),
                None => Outcome::refused(Phase::Start, e),
            };
            let out = self.abandon(out);
            meanwhile();
            return out;
        }
        if let Err(e) = cg.set_limits(&self.limits) {
            // The kernel refuses a memory limit below what the cgroup holds: init, building
            // meanwhile, was already using more than that.
            let busy = matches!(&e, CgroupError::Io { source, .. }
                if source.raw_os_error() == Some(libc::EBUSY));
            let why = if busy {
                format!(
                    "write the sandbox's limits: {e} (the memory limit is below what the \
                     sandbox uses to start; raise --mem)"
                )
            } else {
                format!("write the sandbox's limits: {e}")
            };
            // init may have joined already: it dies with the launcher, then the cgroup goes.
            let out = self.abandon(Outcome::refused(Phase::Plan, why));
            drop(cg); // what joined it is killed, and it is removed
            meanwhile();
            return out;
        }
        log::debug!(
            "cgroup {} ready after {:?}",
            cg.describe(),
            self.t0.elapsed()
        );
        // The first reading opens the counter files (v1 keeps them open): done now, while
        // the sandbox builds and this process has nothing else to do, rather than after
        // the end, when every step counts.
        let _ = cg.usage();
        let t0 = self.t0;
        let mut ending = Ending {
            cg: Some(cg.keep()),
            usage: None,
        };
        let (mut out, mut launcher, held) = drive(&mut ending, self, meanwhile);
        ending.settle();
        match ending.usage {
            Some(Ok(u)) => {
                out.oom_killed = u.oom_kills > 0;
                out.peak_rss_kb = u.peak_bytes / 1024;
                out.cpu_us = u.cpu_usec;
            }
            Some(Err(e)) => log::warn!("read the sandbox's usage: {e}"),
            None => {}
        }
        // A launcher that reported the end has nothing left to do but exit (taking the
        // sandbox's mounts down as it goes); it did that while the cgroup was read and
        // removed. Reaping it here leaves no orphan for the host's init to collect.
        let _ = launcher.wait();
        log::debug!("sandbox cleaned up after {:?}", t0.elapsed());
        drop(held);
        out
    }

    /// Give up before the sandbox is placed: the launcher is killed and reaped. A sandbox
    /// init it may have cloned has run nothing and dies with it (its parent-death signal,
    /// or its control socket closing while it waits for its cgroup).
    pub fn abandon(mut self, out: Outcome) -> Outcome {
        let _ = self.child.kill();
        let _ = self.child.wait();
        out
    }
}

/// The `Failed` report a launcher left on its channel before it closed it, if it did: what
/// remains to be read of a channel whose other end is gone (a short wait at most, should
/// it not be gone after all).
fn launchers_last_word(sock: &UnixStream) -> Option<(Phase, String)> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .ok()?;
    let mut frames = FrameBuf::new(MAX_LAUNCH_FRAME);
    let mut buf = [0u8; 4096];
    loop {
        match frames.next_frame::<FromLauncher>() {
            Ok(Some(FromLauncher::Failed { phase, reason })) => return Some((phase, reason)),
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(_) => return None,
        }
        match (&*sock).read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => frames.push(&buf[..n]).ok()?,
        }
    }
}

/// Send `ToLauncher::Cgroup` with the sandbox's cgroup attach files as `SCM_RIGHTS`.
pub(crate) fn send_cgroup_files(sock: &UnixStream, files: &[OwnedFd]) -> std::io::Result<()> {
    let count = u8::try_from(files.len())
        .ok()
        .filter(|&n| n <= proto::launch::MAX_ATTACH_FILES)
        .ok_or_else(|| std::io::Error::other(format!("{} cgroup files", files.len())))?;
    let frame = proto::encode_frame(&ToLauncher::Cgroup { files: count })
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
    let n = plumbing::fds::send_with_fds(sock.as_raw_fd(), &frame, &raw)?;
    // The descriptors went with the first byte; the rest of a short write follows plainly.
    (&*sock).write_all(&frame[n..])
}

/// The sandbox's cgroup until it has been read and removed, and what was read.
struct Ending {
    cg: Option<Box<dyn Cgroup>>,
    usage: Option<Result<Usage, CgroupError>>,
}

impl Ending {
    fn cg(&self) -> Option<&dyn Cgroup> {
        self.cg.as_deref()
    }

    /// Read what the kernel counted and remove the cgroup, once. Called as soon as the
    /// sandbox's init has exited (its whole pid namespace has then ended), or else once
    /// the launcher has reported the end.
    fn settle(&mut self) {
        if let Some(cg) = self.cg.take() {
            self.usage = Some(cg.usage());
            if let Err(e) = cg.remove() {
                log::error!("remove the sandbox's cgroup: {e}");
            }
        }
    }
}

/// The sandbox's init (a pidfd, from its `Cloned` until it has exited) and the namespaces
/// taken through it once it has `Started` the program.
///
/// Holding the network and IPC namespaces until the run is over means the kernel starts
/// tearing them down (on its own worker threads; the network namespace's is the larger
/// job) only then, rather than as soon as init exits, while the monitor and the launcher
/// are still reading the usage, removing the cgroup and taking the mounts down on the same
/// CPUs. It takes the right to inspect init, which an unprivileged monitor lacks once init
/// is undumpable: rootless, nothing is held and the kernel starts at init's exit, as before.
#[derive(Default)]
struct Held {
    init: Option<OwnedFd>,
    namespaces: Vec<OwnedFd>,
}

/// `PIDFD_GET_IPC_NAMESPACE` and `PIDFD_GET_NET_NAMESPACE` (linux/pidfd.h, Linux 6.11):
/// `_IO(0xFF, 2)` and `_IO(0xFF, 4)`. An older kernel refuses them (nothing is held then).
const PIDFD_GET_NAMESPACES: [libc::c_ulong; 2] = [0xFF02, 0xFF04];

impl Held {
    /// `Cloned`: the launcher waits for the answer, so `pid` is still its unreaped init.
    fn init_cloned(&mut self, pid: i32) {
        self.init = plumbing::sys::pidfd_open(pid).ok();
    }

    /// `Started`: init is in its final namespaces.
    fn init_started(&mut self) {
        let Some(init) = &self.init else { return };
        for request in PIDFD_GET_NAMESPACES {
            // SAFETY: a pidfd ioctl that only returns a new descriptor.
            let fd = unsafe { libc::ioctl(init.as_raw_fd(), request as _, 0) };
            if fd >= 0 {
                // SAFETY: the kernel just gave us this descriptor.
                self.namespaces.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
}

/// Follow the sandbox until the launcher has reported its end (or died) and the program's
/// output has ended; read and remove its cgroup as soon as its init has exited. The
/// launcher may still be exiting: it is returned to be reaped.
fn drive(ending: &mut Ending, st: Started, meanwhile: impl FnOnce()) -> (Outcome, Launcher, Held) {
    let Started {
        t0,
        mut child,
        mut sock,
        stdout,
        stderr,
        timeout_ms,
        output,
        cancel,
        tee,
        ..
    } = st;
    let mut out = Outcome {
        phase: Some(Phase::Start),
        ..Outcome::default()
    };
    let mut meanwhile = Some(meanwhile);
    let mut held = Held::default();
    let _ = sock.set_nonblocking(true);
    let mut frames = FrameBuf::new(MAX_LAUNCH_FRAME);
    let mut stdout = Stream::new(stdout, OUTPUT_CAP);
    let mut stderr = Stream::new(stderr, OUTPUT_CAP);
    let mut sock_open = true;
    let mut finished = false;
    let mut talk = OneShotTalk::default();
    let watchdog = Instant::now() + Duration::from_millis(timeout_ms) + WATCHDOG_SLACK;
    let mut drain_deadline: Option<Instant> = None;
    // The program's deadline as seen from here (a little after the launcher's own, which
    // it counts from the same report): at it the CPU quota is lifted and every process of
    // the sandbox killed from here too, so that the kill completes within milliseconds
    // however little CPU the sandbox had (its init, which the launcher kills, would
    // otherwise have to kill the rest while throttled, or while they burn the CPU).
    let mut run_deadline: Option<Instant> = None;
    let mut killed_at_deadline = false;

    // Once the launcher has reported the end (its sandbox is gone by then), only the
    // output is still awaited: the launcher's own exit is not.
    while (sock_open && !finished) || stdout.is_open() || stderr.is_open() {
        let listening = sock_open && !finished;
        let now = Instant::now();
        if now >= watchdog && listening {
            log::error!("the launcher missed its deadline; killing the sandbox");
            let _ = write_frame(&mut sock, &ToLauncher::Kill);
            let _ = child.kill();
            if let Some(cg) = ending.cg() {
                let _ = cg.kill_all();
            }
            out.error
                .get_or_insert_with(|| "the launcher stopped answering".into());
            sock_open = false;
        }
        if !listening {
            // The sandbox is gone; what is left is its output in the pipes. A program that
            // ended on its own has it all passed on however long the reader takes (as any
            // pipe would), but not one that zygo ended: at the deadline, on cancel or a
            // failure, output that zygo's own stdout or stderr does not take within
            // moments is dropped (and counted), so zygo returns.
            let ended_by_zygo =
                out.timed_out || killed_at_deadline || out.cancelled || out.error.is_some();
            if !ended_by_zygo && (stdout.dest_full() || stderr.dest_full()) {
                drain_deadline = None;
            } else {
                let d = *drain_deadline.get_or_insert(now + Duration::from_secs(2));
                if now >= d {
                    break;
                }
            }
        }
        if let Some(d) = run_deadline {
            if now >= d {
                run_deadline = None;
                if let Some(cg) = ending.cg() {
                    if let Err(e) = cg.lift_cpu_quota() {
                        log::warn!("lift the CPU quota for the kill at the deadline: {e}");
                    }
                    if let Err(e) = cg.kill_all() {
                        log::warn!("kill the sandbox at its deadline: {e}");
                    }
                    killed_at_deadline = !finished;
                }
            }
        }
        let mut wait = if listening {
            let next = run_deadline.map_or(watchdog, |d| d.min(watchdog));
            next.saturating_duration_since(now)
        } else {
            // No deadline: waiting for the reader to make room.
            drain_deadline.map_or(Duration::from_secs(3600), |d| {
                d.saturating_duration_since(now)
            })
        };
        for due in [stdout.due(), stderr.due()].into_iter().flatten() {
            wait = wait.min(due.saturating_duration_since(now));
        }
        let cancel_fd = match &cancel {
            Some(fd) if listening && !out.cancelled => fd.as_raw_fd(),
            _ => -1,
        };
        let poll_in = |fd: RawFd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // init's pidfd turns readable when init has exited: the cgroup is then read and
        // removed at once, while the launcher reaps init and reports, rather than after.
        let init_fd = match &held.init {
            Some(fd) if ending.cg.is_some() => fd.as_raw_fd(),
            _ => -1,
        };
        let mut fds = [
            poll_in(if listening { sock.as_raw_fd() } else { -1 }),
            poll_in(stdout.raw(now)),
            poll_in(stderr.raw(now)),
            poll_in(cancel_fd),
            poll_in(init_fd),
            stdout.out(libc::STDOUT_FILENO),
            stderr.out(libc::STDERR_FILENO),
        ];
        let ms = wait.as_millis().min(i32::MAX as u128) as i32 + 1;
        // SAFETY: fds is a valid pollfd array for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        if fds[4].revents != 0 {
            held.init = None;
            ending.settle();
        }
        // Room again (or an error, which the next splice reports).
        if fds[5].revents != 0 {
            stdout.room();
        }
        if fds[6].revents != 0 {
            stderr.room();
        }
        if fds[3].revents != 0 {
            out.cancelled = true;
            let _ = sock.set_nonblocking(false);
            let _ = write_frame(&mut sock, &ToLauncher::Kill);
            let _ = sock.set_nonblocking(true);
        }
        if fds[1].revents != 0 {
            stdout.pump(output, false, tee.as_ref());
        }
        if fds[2].revents != 0 {
            stderr.pump(output, true, tee.as_ref());
        }
        if fds[0].revents != 0 {
            let mut buf = [0u8; 4096];
            match sock.read(&mut buf) {
                Ok(0) => sock_open = false,
                Ok(n) => {
                    if let Err(e) = frames.push(&buf[..n]) {
                        log::error!("launcher channel: {e}; ending it");
                        sock_open = false;
                        let _ = child.kill();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => sock_open = false,
            }
            loop {
                match frames.next_frame::<FromLauncher>() {
                    Ok(Some(msg)) => {
                        log::debug!("launcher: {} after {:?}", msg.kind(), t0.elapsed());
                        let started = matches!(msg, FromLauncher::Started);
                        let went_on =
                            handle(msg, &mut talk, ending.cg(), &mut sock, &mut out, &mut held);
                        finished = talk.ended();
                        if !went_on {
                            let _ = child.kill();
                            sock_open = false;
                            break;
                        }
                        if started {
                            run_deadline = Some(Instant::now() + Duration::from_millis(timeout_ms));
                            if let Some(work) = meanwhile.take() {
                                work();
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        log::error!("launcher channel: {e}; ending it");
                        let _ = child.kill();
                        sock_open = false;
                        break;
                    }
                }
            }
        }
    }
    if let Some(work) = meanwhile.take() {
        work();
    }
    if !finished && out.error.is_none() {
        let how = match child.wait() {
            Ok(s) => format!("{s}"),
            Err(e) => e.to_string(),
        };
        out.error = Some(format!(
            "the launcher died while {} ({how})",
            if out.started {
                "the program ran"
            } else {
                "building the sandbox"
            }
        ));
        if out.started {
            out.phase = Some(Phase::Run);
        }
    }
    // Killed here at the deadline, maybe a moment before the launcher's own kill: that
    // is the time limit, whoever's SIGKILL landed first.
    if killed_at_deadline && out.signal == Some(libc::SIGKILL) {
        out.timed_out = true;
    }
    // Anything still in the cgroup (the launcher died without killing its sandbox) goes now.
    // After a reported end there is nothing: the launcher reaped init first, and with the
    // sandbox's pid 1 gone the kernel has ended its whole pid namespace.
    if !finished || out.error.is_some() {
        if let Some(cg) = ending.cg() {
            let _ = cg.kill_all();
        }
    }
    if output == Output::PassThrough {
        out.output_dropped = stdout.unread().saturating_add(stderr.unread());
    }
    (out.stdout, out.stdout_truncated) = stdout.into_kept();
    (out.stderr, out.stderr_truncated) = stderr.into_kept();
    (out, child, held)
}

/// Where the sandbox's init `pid` is once it says it is `Cloned`: in `cg` (where it put
/// itself, or is moved now), gone already (its cgroup with it), or not placeable. The same
/// check for `zygo run` and the supervisor's runs.
pub(crate) fn place_init(cg: Option<&dyn Cgroup>, pid: i32) -> Placement {
    match cg {
        Some(cg) if cg.contains(pid).unwrap_or(false) => Placement::Placed,
        Some(cg) => match cg.add_pid(pid) {
            Ok(()) => Placement::Placed,
            Err(CgroupError::Io { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {
                Placement::Gone
            }
            Err(e) => Placement::Failed(e.to_string()),
        },
        None => Placement::Gone,
    }
}

/// One launcher message, in the order `OneShotTalk` allows. Returns false when the channel
/// must end.
fn handle(
    msg: FromLauncher,
    talk: &mut OneShotTalk,
    cg: Option<&dyn Cgroup>,
    sock: &mut UnixStream,
    out: &mut Outcome,
    held: &mut Held,
) -> bool {
    let said = match talk.hear(msg) {
        Ok(said) => said,
        Err(why) => {
            log::error!("the launcher {why}; ending the channel");
            return false;
        }
    };
    match said {
        Said::Cloned { pid } => {
            held.init_cloned(pid);
            // Re-check what the launcher's sandbox claims to have done; move it if not.
            let (reply, error) = OneShotTalk::answer_cloned(place_init(cg, pid), out.cancelled);
            if error.is_some() {
                out.error = error;
            }
            let _ = sock.set_nonblocking(false);
            let sent = write_frame(sock, &reply).is_ok();
            let _ = sock.set_nonblocking(true);
            sent
        }
        Said::Started => {
            held.init_started();
            out.started = true;
            out.phase = Some(Phase::Run);
            true
        }
        Said::Exited {
            code,
            signal,
            timed_out,
            wall_us,
        } => {
            out.exit_code = Some(code.unwrap_or_else(|| 128 + signal.unwrap_or(libc::SIGKILL)));
            out.signal = signal;
            out.timed_out = timed_out;
            out.wall_us = wall_us;
            true
        }
        Said::Failed { phase, reason } => {
            out.phase = Some(phase);
            out.error = Some(reason);
            true
        }
    }
}

/// The monitor's checks of a policy plan against the host, and the launcher plan that
/// follows from it. A refusal here is phase `plan`: nothing was created.
pub fn launch_plan(plan: &policy::plan::OneShotPlan) -> Result<(LaunchPlan, Limits), String> {
    use policy::plan::{Image, Network};
    let egress = match plan.network {
        Network::None => None,
        Network::Egress => Some(egress_rules(
            &plan.allow,
            crate::cgroup_limits(&plan.limits).mem_bytes,
        )?),
        Network::Host => {
            return Err(
                "network host is not available for one-shot sandboxes; use --net none or \
                 --net egress"
                    .into(),
            )
        }
    };
    let image = match &plan.image {
        Image::Host => proto::launch::Image::Host,
        Image::Dir(d) => {
            if !d.is_dir() {
                return Err(format!(
                    "image directory {} does not exist or is not a directory",
                    d.display()
                ));
            }
            proto::launch::Image::Dir(path_str(d)?)
        }
    };
    let mut mounts = Vec::new();
    for m in &plan.mounts {
        if !m.src.exists() {
            return Err(format!("mount source {} does not exist", m.src.display()));
        }
        // No link is followed in a mount source (see `plumbing::resolve`); said here, at
        // once, in the operator's own path.
        plumbing::resolve::open_host_path(&m.src)
            .map_err(|e| format!("mount source {}: {e}", m.src.display()))?;
        // A writable one the sandbox could not write is refused now, naming it.
        if m.rw {
            crate::mounts::check_writable(&m.src, "mount it read-only")?;
        }
        mounts.push(proto::launch::BindMount {
            src: path_str(&m.src)?,
            dst: path_str(&m.dst)?,
            rw: m.rw,
            handed: false,
            fresh: false,
            owner: None,
        });
    }
    let ids = crate::identity::id_map().map_err(|e| e.to_string())?;
    let l = &plan.limits;
    let limits = crate::cgroup_limits(l);
    let launch = LaunchPlan {
        mode: proto::launch::Mode::OneShot,
        files: Vec::new(),
        work: None,
        scripts: false,
        etc: None,
        argv: plan.argv.clone(),
        env: plan.env.clone(),
        cwd: "/work".into(),
        image,
        mounts,
        scratch_bytes: l.scratch.0,
        timeout_ms: l.timeout.as_millis().min(u64::MAX as u128) as u64,
        ids,
        hostname: "zygo".into(),
        request_ids: None,
        inotify: plan.inotify,
        image_handed: false,
        work_handed: false,
        work_owner: None,
        hide_pids: Shape::ONE_SHOT.hide_pids,
        work_mode: Shape::ONE_SHOT.work_mode,
        agents: Vec::new(),
        egress,
        secrets: false,
    };
    Ok((launch, limits))
}

/// The launcher's form of egress rules the policy has checked, with the host's DNS
/// servers when there are name rules, and the sandbox's memory limit (which bounds what
/// its egress filter holds for it).
pub fn egress_rules(
    rules: &policy::egress::Rules,
    mem_bytes: Option<u64>,
) -> Result<proto::launch::Egress, String> {
    let resolvers = if rules.names.is_empty() {
        Vec::new()
    } else {
        // What to do about either failure below.
        let fix = "add a `nameserver` line with an IPv4 address there (or set ZYGO_RESOLV_CONF \
                   to a file that has one), or name the destinations by IPv4 address";
        let path = resolv_conf_path();
        let servers = host_resolvers(&path).map_err(|e| {
            format!("egress rules by name need the host's DNS servers, and {e}: {fix}")
        })?;
        if servers.is_empty() {
            return Err(format!(
                "egress rules by name need a DNS server, and {path} names no IPv4 nameserver: \
                 {fix}"
            ));
        }
        servers
    };
    Ok(proto::launch::Egress {
        rules: rules
            .addrs
            .iter()
            .map(|r| proto::launch::EgressRule {
                addr: r.net.octets(),
                prefix: r.prefix,
                port: r.port,
            })
            .collect(),
        names: rules
            .names
            .iter()
            .map(|n| proto::launch::EgressName {
                name: n.name.clone(),
                port: n.port,
                private_ok: n.private_ok,
            })
            .collect(),
        resolvers,
        mem_bytes,
    })
}

/// The file the host's DNS servers are read from: `$ZYGO_RESOLV_CONF` (the operator's
/// choice, and how the tests point Zygo at a resolver of their own), else /etc/resolv.conf.
fn resolv_conf_path() -> String {
    std::env::var("ZYGO_RESOLV_CONF").unwrap_or_else(|_| "/etc/resolv.conf".into())
}

/// The IPv4 `nameserver` lines of the host's resolv.conf (at most three, as libc reads).
fn host_resolvers(path: &str) -> Result<Vec<[u8; 4]>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path} cannot be read: {e}"))?;
    Ok(parse_resolvers(&text))
}

fn parse_resolvers(text: &str) -> Vec<[u8; 4]> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("nameserver"))
                .then(|| w.next()?.parse::<std::net::Ipv4Addr>().ok())
                .flatten()
        })
        .map(|a| a.octets())
        .take(3)
        .collect()
}

fn path_str(p: &Path) -> Result<String, String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| format!("path {} is not valid UTF-8", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "zygo-oneshot-{tag}-{}-{}",
            std::process::id(),
            unique_name()
        ));
        std::fs::create_dir(&d).expect("create a temp dir");
        d
    }

    #[test]
    fn nameservers_are_read_as_libc_reads_them() {
        let text = "# x\nnameserver 10.0.0.1\nnameserver ::1\nsearch a\nnameserver 1.1.1.1 # c\n\
                    nameserver 8.8.8.8\nnameserver 9.9.9.9\n";
        assert_eq!(
            parse_resolvers(text),
            vec![[10, 0, 0, 1], [1, 1, 1, 1], [8, 8, 8, 8]]
        );
    }

    #[test]
    fn files_pipes_terminals_and_devices_are_copied_and_the_rest_refused() {
        let cases = [
            (libc::S_IFREG, StdinKind::Copied),
            (libc::S_IFIFO, StdinKind::Copied),
            (libc::S_IFCHR, StdinKind::Copied),
            (libc::S_IFBLK, StdinKind::Copied),
            (libc::S_IFDIR, StdinKind::Directory),
            (libc::S_IFSOCK, StdinKind::Socket),
            (libc::S_IFLNK, StdinKind::Other),
        ];
        for (mode, kind) in cases {
            assert_eq!(StdinKind::of_mode(mode | 0o644), kind, "mode {mode:o}");
        }
    }

    #[test]
    fn a_regular_file_opens_as_a_file() {
        let d = temp_dir("file");
        let p = d.join("input");
        std::fs::write(&p, b"bytes").expect("write");
        let got = Stdin::open(&p);
        let _ = std::fs::remove_dir_all(&d);
        assert!(matches!(got, Ok(Stdin::File(_))));
    }

    #[test]
    fn a_device_opens_to_be_copied_through_a_pipe() {
        let Ok(Stdin::File(f)) = Stdin::open(Path::new("/dev/zero")) else {
            panic!("/dev/zero did not open");
        };
        assert_eq!(StdinKind::of(&f).expect("fstat"), StdinKind::Copied);
    }

    #[test]
    fn a_directory_given_as_stdin_is_refused_naming_it() {
        let d = temp_dir("dir");
        let got = Stdin::open(&d);
        let _ = std::fs::remove_dir_all(&d);
        let Err(why) = got else {
            panic!("a directory was accepted as stdin");
        };
        assert!(why.contains(&d.display().to_string()), "{why}");
        assert!(why.contains("is a directory"), "{why}");
    }

    #[test]
    fn a_socket_given_as_stdin_is_refused_naming_it() {
        let d = temp_dir("sock");
        let p = d.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&p).expect("bind");
        let got = Stdin::open(&p);
        drop(listener);
        let _ = std::fs::remove_dir_all(&d);
        let Err(why) = got else {
            panic!("a socket was accepted as stdin");
        };
        assert!(why.contains(&p.display().to_string()), "{why}");
        assert!(why.contains("is a socket"), "{why}");
    }
}
