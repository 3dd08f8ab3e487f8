//! One-shot runs in the supervisor (`Request::Run`, `POST /run`): the sandbox `zygo run`
//! builds, driven by the event loop instead of a blocking monitor.
//!
//! A run, in the order it happens:
//! 1. admitted ([`Functions::start_run`]): its spec parsed ([`super::run_spec`]) and
//!    narrowed by the caller's tenant limits, its plan checked against the host
//!    (`oneshot::launch_plan`; a refusal here is answered `started: false`, phase `plan`);
//! 2. started: its cgroup made under `tenants/<tenant>/_run/` (`_host` for the host's own
//!    callers) with its limits written before anything runs in it, its launcher spawned
//!    with the cgroup's attach files, then the plan; stdin, if any, is a sealed memfd
//!    (the program reads a file that nobody can change), stdout and stderr two pipes
//!    read by the loop;
//! 3. running: the launcher's `Cloned` is checked (the sandbox's init must be in the
//!    run's cgroup, else it is moved there) before the program may start; output is kept
//!    up to [`OUTPUT_CAP`] per stream, the rest read and dropped, marked truncated;
//! 4. ended: by the program (the launcher reports `Exited`), by its deadline (the
//!    launcher's own, and the loop's: at the same moment the loop sends `Kill` and kills
//!    the cgroup from outside; either way `timed_out`), by a cancel under its key or its
//!    caller leaving (`error: "cancelled"`), by the build taking too long, or by the
//!    launcher dying or going silent (then its whole cgroup is killed);
//! 5. answered ([`RunAnswer`]) once the launcher has reported and both output pipes have
//!    ended (or [`OUTPUT_DRAIN`] later): what the kernel counted (OOM kills, peak memory,
//!    CPU) is read from the cgroup before it goes (off the loop, by the cgroup worker);
//!    one usage record is written (function `api:run`); the launcher is reaped when it
//!    has exited, without waiting for it.
//!
//! Nothing here blocks the loop: every descriptor is non-blocking and registered with it.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Token};
use proto::api::{RunAnswer, TenantLimits, UsageRecord};
use proto::front::{ErrorCode, Outcome, Reply};
use proto::keeper::{FromKeeper, RunId, ToKeeper};
use proto::launch::{
    FromLauncher, Image, LaunchPlan, OneShotTalk, Phase, Placement, Said, ToLauncher,
    MAX_LAUNCH_FRAME,
};
use proto::readbuf::read_append;

use super::run_spec;
use super::{fail, now_ms, Ctx, Functions};
use crate::cgroup::Usage;
use crate::keeper::LocalKeeper;
use crate::spawn::Launcher;
use plumbing::conn::{Conn, Got};
use plumbing::pipes::{dev_null, pipe};
use plumbing::random_hex;

/// Runs going at once. One more is refused as busy: each holds a launcher, a sandbox, and
/// up to 2 × [`OUTPUT_CAP`] of output plus its stdin.
pub const MAX_RUNS: usize = 64;

/// The most runs at once: [`MAX_RUNS`], or fewer if `$ZYGO_MAX_RUNS` says so (for tests).
fn max_runs() -> usize {
    std::env::var("ZYGO_MAX_RUNS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(MAX_RUNS, |n| n.clamp(1, MAX_RUNS))
}

/// Output kept per stream per run (the same as for a function's call).
pub const OUTPUT_CAP: usize = 1024 * 1024;

/// The function name a run's usage record carries.
pub const USAGE_NAME: &str = "api:run";

/// How long the sandbox may take to build: the launcher's own limit (30 s) and a margin.
const BUILD_LIMIT: Duration = Duration::from_secs(35);

/// How long a launcher told to kill its sandbox has to report the end before it is
/// killed itself, with everything in the run's cgroup.
const REPORT_SLACK: Duration = Duration::from_secs(5);

/// How long output is still read after the launcher reported the end (the pipes end when
/// it exits).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// How long an answered run's launcher has to exit before it is killed.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Read from one output pipe at once, and at most this many times per event (the rest on
/// the next turn of the loop, so that one run's output cannot hold the loop).
const CHUNK: usize = 64 * 1024;
const CHUNKS_PER_TURN: usize = 16;

/// Why a run was ended from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Killed {
    /// Its time limit passed.
    Deadline,
    /// A cancel named its key, or its caller left.
    Cancelled,
    /// The sandbox took longer than [`BUILD_LIMIT`] to build.
    Build,
    /// The supervisor is stopping.
    Shutdown,
}

/// Which of a run's descriptors a loop token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Channel,
    Stdout,
    Stderr,
}

/// Past its cap, a stream is drained one chunk at a time, at most once in this long,
/// into `/dev/null` with splice (never copied through the loop): a program writing
/// without end waits on its full pipe instead of making the loop, which serves every
/// tenant, move its bytes. (Once the run has ended, what is left goes at once.)
const DRAIN_TICK: Duration = Duration::from_millis(4);

/// Move up to a chunk from the pipe `from` into `/dev/null` without copying it here (a
/// read into a buffer where splice cannot be used): how much went, 0 at the pipe's end.
fn drop_chunk(from: &File) -> std::io::Result<usize> {
    if let Some(null) = dev_null() {
        // SAFETY: splice(2) between two descriptors we hold, no offsets.
        let n = unsafe {
            libc::splice(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                null.as_raw_fd(),
                std::ptr::null_mut(),
                CHUNK,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
    }
    let mut scratch = Vec::new();
    read_append(from.as_raw_fd(), &mut scratch, CHUNK)
}

/// One output stream of a run, kept up to [`OUTPUT_CAP`].
struct Capture {
    token: Token,
    /// The pipe's read end, until it ends.
    fd: Option<File>,
    kept: Vec<u8>,
    truncated: bool,
    /// Read to the turn's limit with more waiting: read again on the next turn.
    more: bool,
    /// Past the cap: not drained again before this.
    resume_at: Option<Instant>,
}

impl Capture {
    fn new(token: Token, fd: File) -> Capture {
        Capture {
            token,
            fd: Some(fd),
            kept: Vec::new(),
            truncated: false,
            more: false,
            resume_at: None,
        }
    }

    /// Read what is there (up to [`CHUNKS_PER_TURN`] reads): kept up to the cap; past it
    /// dropped a chunk at a time (all of it once `ended`, the program being done). The
    /// pipe is closed at its end.
    fn pump(&mut self, cx: &Ctx, ended: bool) {
        self.more = false;
        for _ in 0..CHUNKS_PER_TURN {
            let Some(f) = self.fd.as_ref() else { return };
            let room = OUTPUT_CAP - self.kept.len();
            if room == 0 {
                return self.drop_past_cap(cx, ended);
            }
            match read_append(f.as_raw_fd(), &mut self.kept, room.min(CHUNK)) {
                Ok(0) => return self.close(cx),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(cx),
            }
        }
        self.more = self.fd.is_some();
    }

    /// Past the cap: one chunk into `/dev/null` (up to [`CHUNKS_PER_TURN`] once `ended`),
    /// then nothing until [`DRAIN_TICK`] has passed (the next is taken by the runs' tick).
    fn drop_past_cap(&mut self, cx: &Ctx, ended: bool) {
        let now = Instant::now();
        if !ended && self.resume_at.is_some_and(|t| now < t) {
            self.more = true;
            return;
        }
        let chunks = if ended { CHUNKS_PER_TURN } else { 1 };
        for _ in 0..chunks {
            let Some(f) = self.fd.as_ref() else { return };
            match drop_chunk(f) {
                Ok(0) => return self.close(cx),
                Ok(_) => self.truncated = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.resume_at = None;
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(cx),
            }
        }
        self.resume_at = Some(now + DRAIN_TICK);
        self.more = true;
    }

    fn close(&mut self, cx: &Ctx) {
        self.resume_at = None;
        if let Some(f) = self.fd.take() {
            let _ = cx.reg.deregister(&mut SourceFd(&f.as_raw_fd()));
        }
        self.more = false;
    }

    /// The kept bytes as text (invalid UTF-8 replaced).
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}

/// What the launcher reported of the program's end.
#[derive(Debug, Clone, Copy)]
struct Exit {
    code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    wall_us: u64,
}

/// A run, from its launcher's spawn until it is answered.
pub(super) struct Run {
    /// The front's connection that waits for the answer.
    client: Token,
    key: Option<String>,
    /// The caller's tenant; `None` for the host's own callers.
    tenant: Option<String>,
    launcher: Launcher,
    chan: Token,
    /// The launcher's channel, until it closes.
    conn: Option<Conn>,
    stdout: Capture,
    stderr: Capture,
    /// The run's cgroup (the keeper's), until what it counted has been read and it is
    /// removed.
    cgroup: Option<RunId>,
    usage: Option<Usage>,
    received: Instant,
    /// When the launcher said the program started.
    started: Option<Instant>,
    timeout: Duration,
    /// How far it got ("start" until the program runs).
    phase: Phase,
    error: Option<String>,
    exit: Option<Exit>,
    /// Why, and since when, it is being ended from outside.
    killed: Option<(Killed, Instant)>,
    /// When the launcher reported the end (or its channel closed, or it was given up on).
    ended: Option<Instant>,
    /// What the launcher may say next.
    talk: OneShotTalk,
}

/// The runs going, and the launchers of answered runs that have not exited yet.
#[derive(Default)]
pub(super) struct Runs {
    runs: HashMap<String, Run>,
    tokens: HashMap<Token, (String, Source)>,
    exiting: Vec<(Launcher, Instant)>,
}

impl Runs {
    pub(super) fn len(&self) -> usize {
        self.runs.len()
    }

    /// Whether nothing of a run is left to watch (the loop may sleep longer).
    pub(super) fn idle(&self) -> bool {
        self.runs.is_empty() && self.exiting.is_empty()
    }
}

/// A sealed memfd holding `bytes`, read from its start: the program's stdin as a file
/// nobody can change.
fn stdin_file(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: memfd_create with a static name and flags; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"zygo-run-stdin".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(bytes)?;
    // SAFETY: plain fcntl/lseek calls on a descriptor we own.
    unsafe {
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        if libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::lseek(f.as_raw_fd(), 0, libc::SEEK_SET) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(OwnedFd::from(f))
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// An answer for a run that never started.
fn refused_answer(id: &str, phase: Phase, error: String) -> RunAnswer {
    RunAnswer {
        request_id: id.to_string(),
        started: false,
        phase: phase.as_str().into(),
        error: Some(error),
        exit_code: None,
        signal: None,
        timed_out: false,
        oom_killed: false,
        wall_us: 0,
        cpu_us: 0,
        peak_rss_kb: 0,
        stdout: String::new(),
        stdout_truncated: false,
        stderr: String::new(),
        stderr_truncated: false,
        usage: None,
    }
}

/// The outcome word of a run's usage record.
fn outcome(a: &RunAnswer) -> Outcome {
    if a.error.as_deref() == Some(CANCELLED) {
        Outcome::Cancelled
    } else if a.timed_out {
        Outcome::Timeout
    } else if a.started && a.error.is_none() && a.exit_code == Some(0) {
        Outcome::Ok
    } else {
        Outcome::Error
    }
}

/// The error of a cancelled run's answer.
pub const CANCELLED: &str = "cancelled";

impl Functions {
    /// A one-shot run for `client`: `spec` as [`super::run_spec`] reads it, narrowed by
    /// the caller's tenant limits `narrow` (`None`: no tenant, or one without limits;
    /// `private_ok`: whether the caller may name private addresses in `allow`);
    /// `tenant` is whose run it is (its cgroup goes under `tenants/<tenant>/_run/`, and
    /// its usage record names it; `None` is the host's own caller). `None` means the
    /// answer comes later, through the outbox; a refusal (bad spec, busy) is answered now.
    pub fn start_run(
        &mut self,
        client: Token,
        spec: &proto::api::RunBody,
        tenant: Option<&str>,
        narrow: Option<&TenantLimits>,
        private_ok: bool,
        cx: &mut Ctx,
    ) -> Option<Reply> {
        if tenant.is_some_and(|t| !proto::api::is_tenant_id(t)) {
            return Some(fail(ErrorCode::BadRequest, "not a tenant id"));
        }
        let spec = match run_spec::plan(spec, narrow, private_ok) {
            Ok(s) => s,
            Err(why) => return Some(fail(ErrorCode::BadSpec, why)),
        };
        let most = max_runs();
        if self.runs.len() >= most {
            return Some(Reply::Error {
                code: ErrorCode::Busy,
                message: format!("{most} runs are going, the most at once; try again shortly"),
                retry_after: Some(1),
            });
        }
        let id = match random_hex(16) {
            Ok(id) => id,
            Err(e) => return Some(fail(ErrorCode::Internal, format!("name the run: {e}"))),
        };
        match self.spawn_run(client, spec, tenant, cx) {
            Ok(run) => {
                self.runs
                    .tokens
                    .insert(run.chan, (id.clone(), Source::Channel));
                self.runs
                    .tokens
                    .insert(run.stdout.token, (id.clone(), Source::Stdout));
                self.runs
                    .tokens
                    .insert(run.stderr.token, (id.clone(), Source::Stderr));
                log::debug!("run {id} started its launcher");
                self.runs.runs.insert(id, run);
                None
            }
            Err((phase, why)) => {
                log::info!("run {id} did not start ({}): {why}", phase.as_str());
                let mut answer = refused_answer(&id, phase, why);
                answer.usage = Some(Box::new(self.record_run(&answer, tenant, Duration::ZERO)));
                Some(Reply::RunAnswer(answer))
            }
        }
    }

    /// Make the run's cgroup, spawn its launcher, and send it the cgroup and the plan.
    /// Whatever was made is undone if a later step fails.
    fn spawn_run(
        &mut self,
        client: Token,
        spec: run_spec::RunSpec,
        tenant: Option<&str>,
        cx: &mut Ctx,
    ) -> Result<Run, (Phase, String)> {
        let plan_err = |e: String| (Phase::Plan, e);
        let (mut plan, limits) = crate::oneshot::launch_plan(&spec.plan).map_err(plan_err)?;
        if plan.image == Image::Host {
            plan.etc = crate::etc_cache::prepare();
        }
        let timeout = Duration::from_millis(plan.timeout_ms);
        // The keeper makes the run's cgroup in its caller's folder.
        let made = self.keeper.call(ToKeeper::MakeRun {
            tenant: tenant.map(str::to_string),
            limits: crate::keeper::limits_msg(&limits),
        });
        let cgroup = match made.reply {
            FromKeeper::Run { run } => run,
            FromKeeper::Refused { why } => return Err(plan_err(why)),
            other => return Err(plan_err(format!("the keeper made no run: {other:?}"))),
        };
        let launched = self.launch_run(client, spec, tenant, plan, timeout, made.files, cgroup, cx);
        if launched.is_err() {
            // Nothing ran in it: its cgroup goes.
            self.keeper.call(ToKeeper::EndRun {
                run: cgroup,
                kill: true,
            });
        }
        launched
    }

    /// Spawn a run's launcher and send it its cgroup's attach files (`attach`) and the
    /// plan.
    #[allow(clippy::too_many_arguments)]
    fn launch_run(
        &mut self,
        client: Token,
        spec: run_spec::RunSpec,
        tenant: Option<&str>,
        plan: LaunchPlan,
        timeout: Duration,
        attach: Vec<OwnedFd>,
        cgroup: RunId,
        cx: &mut Ctx,
    ) -> Result<Run, (Phase, String)> {
        let start_err = |what: &str, e: std::io::Error| (Phase::Start, format!("{what}: {e}"));
        let stdin = spec
            .stdin
            .as_deref()
            .map(stdin_file)
            .transpose()
            .map_err(|e| start_err("write the program's stdin", e))?;
        let (out_r, out_w) = pipe().map_err(|e| start_err("create a pipe", e))?;
        let (err_r, err_w) = pipe().map_err(|e| start_err("create a pipe", e))?;
        let (mon, launcher_end) =
            StdUnixStream::pair().map_err(|e| start_err("create the launcher channel", e))?;
        let launcher_end = OwnedFd::from(launcher_end);
        let fds = crate::spawn::LauncherFds {
            stdin: stdin.as_ref(),
            stdout: &out_w,
            channel: &launcher_end,
            program_stderr: &err_w,
        };
        let mut launcher = crate::spawn::spawn_launcher(&self.launcher, fds)
            .map_err(|e| start_err("start the launcher", e))?;
        drop((stdin, out_w, launcher_end, err_w));
        let mut stop = |why: String| {
            let _ = launcher.kill();
            let _ = launcher.wait();
            (Phase::Start, why)
        };
        // The launcher's first frame, on a fresh socket: it cannot block.
        if let Err(e) = crate::oneshot::send_cgroup_files(&mon, &attach) {
            return Err(stop(format!("send the run's cgroup to the launcher: {e}")));
        }
        drop(attach);
        let registered = (|| {
            mon.set_nonblocking(true)?;
            set_nonblocking(&out_r)?;
            set_nonblocking(&err_r)?;
            let mut stream = mio::net::UnixStream::from_std(mon);
            let chan = cx.token();
            cx.reg
                .register(&mut stream, chan, Interest::READABLE | Interest::WRITABLE)?;
            let out_t = cx.token();
            let err_t = cx.token();
            let out = File::from(out_r);
            let err = File::from(err_r);
            let reg_out =
                cx.reg
                    .register(&mut SourceFd(&out.as_raw_fd()), out_t, Interest::READABLE);
            let reg_err =
                cx.reg
                    .register(&mut SourceFd(&err.as_raw_fd()), err_t, Interest::READABLE);
            if let Err(e) = reg_out.and(reg_err) {
                let _ = cx.reg.deregister(&mut stream);
                let _ = cx.reg.deregister(&mut SourceFd(&out.as_raw_fd()));
                let _ = cx.reg.deregister(&mut SourceFd(&err.as_raw_fd()));
                return Err(e);
            }
            Ok::<_, std::io::Error>((
                stream,
                chan,
                Capture::new(out_t, out),
                Capture::new(err_t, err),
            ))
        })();
        let (stream, chan, stdout, stderr) = match registered {
            Ok(r) => r,
            Err(e) => return Err(stop(format!("watch the launcher: {e}"))),
        };
        let mut conn = Conn::new(stream, MAX_LAUNCH_FRAME);
        conn.send(&ToLauncher::Start(Box::new(plan)));
        Ok(Run {
            client,
            key: spec.key,
            tenant: tenant.map(str::to_string),
            launcher,
            chan,
            conn: Some(conn),
            stdout,
            stderr,
            cgroup: Some(cgroup),
            usage: None,
            received: Instant::now(),
            started: None,
            timeout,
            phase: Phase::Start,
            error: None,
            exit: None,
            killed: None,
            ended: None,
            talk: OneShotTalk::default(),
        })
    }

    /// Something happened on one of a run's descriptors. False when `t` is not a run's.
    pub(super) fn run_event(&mut self, t: Token, cx: &mut Ctx) -> bool {
        let Some((id, source)) = self.runs.tokens.get(&t).cloned() else {
            return false;
        };
        let Some(run) = self.runs.runs.get_mut(&id) else {
            self.runs.tokens.remove(&t);
            return true;
        };
        match source {
            Source::Stdout => run.stdout.pump(cx, run.ended.is_some()),
            Source::Stderr => run.stderr.pump(cx, run.ended.is_some()),
            Source::Channel => self.run_channel(&id, cx),
        }
        self.finish_run_if_over(&id, Instant::now(), cx);
        true
    }

    /// The launcher's messages, and its channel's end.
    fn run_channel(&mut self, id: &str, cx: &Ctx) {
        let Some(run) = self.runs.runs.get_mut(id) else {
            return;
        };
        let Some(conn) = run.conn.as_mut() else {
            return;
        };
        conn.flush();
        let (msgs, end) = receive(conn);
        for m in msgs {
            if let Err(why) = run_msg(run, m, &mut self.keeper) {
                log::error!("run {id}: the launcher {why}; killing it");
                run.error
                    .get_or_insert_with(|| format!("the launcher {why}"));
                let _ = run.launcher.kill();
                close_channel(run, cx);
                settle(run, &mut self.keeper);
                return;
            }
        }
        if let Some(why) = end {
            if run.ended.is_none() {
                // The launcher went without reporting the end: whatever it left goes.
                log::warn!("run {id}: the launcher ended before it reported ({why})");
                let what = if run.started.is_some() {
                    "the program ran"
                } else {
                    "building the sandbox"
                };
                run.error
                    .get_or_insert_with(|| format!("the launcher died while {what}"));
            }
            close_channel(run, cx);
            settle(run, &mut self.keeper);
        } else if let Some(c) = run.conn.as_ref() {
            if let Some(why) = c.closed.clone() {
                // After the report, a write that failed (a `Kill` crossing the launcher's
                // exit) changes nothing.
                if run.ended.is_none() {
                    run.error
                        .get_or_insert_with(|| format!("the launcher's channel failed: {why}"));
                }
                let _ = run.launcher.kill();
                close_channel(run, cx);
                settle(run, &mut self.keeper);
            }
        }
    }

    /// Timers of the runs: deadlines, builds that take too long, launchers that do not
    /// report after a kill, output still to read; and launchers of answered runs to reap.
    pub(super) fn runs_tick(&mut self, now: Instant, cx: &mut Ctx) {
        let ids: Vec<String> = self.runs.runs.keys().cloned().collect();
        for id in ids {
            let Some(run) = self.runs.runs.get_mut(&id) else {
                continue;
            };
            if run.killed.is_none() && run.ended.is_none() {
                match run.started {
                    Some(s) if now >= s + run.timeout => {
                        kill(run, Killed::Deadline, now, &mut self.keeper)
                    }
                    None if now >= run.received + BUILD_LIMIT => {
                        run.error = Some(format!(
                            "the sandbox took longer than {}s to build",
                            BUILD_LIMIT.as_secs()
                        ));
                        kill(run, Killed::Build, now, &mut self.keeper);
                    }
                    _ => {}
                }
            }
            if let (Some((_, at)), None) = (run.killed, run.ended) {
                if now >= at + REPORT_SLACK {
                    log::error!(
                        "run {id}: the launcher did not report within {}s of a kill; killing it",
                        REPORT_SLACK.as_secs()
                    );
                    run.error
                        .get_or_insert_with(|| "the launcher stopped answering".into());
                    let _ = run.launcher.kill();
                    close_channel(run, cx);
                    settle(run, &mut self.keeper);
                }
            }
            let ended = run.ended.is_some();
            if run.stdout.more {
                run.stdout.pump(cx, ended);
            }
            if run.stderr.more {
                run.stderr.pump(cx, ended);
            }
            self.finish_run_if_over(&id, now, cx);
        }
        self.runs.exiting.retain_mut(|(l, by)| match l.try_wait() {
            Ok(None) => {
                if now >= *by {
                    let _ = l.kill();
                }
                true
            }
            _ => false,
        });
    }

    /// `cancel`: end every run under this key (of this tenant, when one is named; every
    /// run under the key when `tenant` is `None`). How many were still going.
    pub fn cancel_runs(&mut self, key: &str, tenant: Option<&str>) -> u32 {
        let now = Instant::now();
        let mut n = 0;
        for run in self.runs.runs.values_mut() {
            let ours = tenant.is_none_or(|t| run.tenant.as_deref() == Some(t));
            if ours && run.key.as_deref() == Some(key) && run.ended.is_none() {
                n += 1;
                if run.killed.is_none() {
                    kill(run, Killed::Cancelled, now, &mut self.keeper);
                }
            }
        }
        n
    }

    /// A tenant is deleted: its runs are ended.
    pub(super) fn cancel_tenant_runs(&mut self, tenant: &str) {
        let now = Instant::now();
        for run in self.runs.runs.values_mut() {
            let theirs = run.tenant.as_deref() == Some(tenant);
            if theirs && run.killed.is_none() && run.ended.is_none() {
                kill(run, Killed::Cancelled, now, &mut self.keeper);
            }
        }
    }

    /// A front's connection closed: its runs are ended (nobody waits for them).
    pub(super) fn runs_client_gone(&mut self, t: Token) {
        let now = Instant::now();
        for run in self.runs.runs.values_mut() {
            if run.client == t && run.killed.is_none() && run.ended.is_none() {
                kill(run, Killed::Cancelled, now, &mut self.keeper);
            }
        }
    }

    /// The supervisor stops: every run is killed and answered, every launcher reaped,
    /// every run cgroup removed (the worker has stopped: removals are done here), and the
    /// runs' folders removed.
    pub(super) fn runs_shutdown(&mut self, cx: &Ctx) {
        let ids: Vec<String> = self.runs.runs.keys().cloned().collect();
        let now = Instant::now();
        for id in ids {
            let Some(run) = self.runs.runs.get_mut(&id) else {
                continue;
            };
            if run.ended.is_none() {
                if run.killed.is_none() {
                    kill(run, Killed::Shutdown, now, &mut self.keeper);
                }
                run.error
                    .get_or_insert_with(|| "the supervisor stopped before the run ended".into());
                let _ = run.launcher.kill();
                let _ = run.launcher.wait();
                close_channel(run, cx);
                settle(run, &mut self.keeper);
            }
            run.stdout.close(cx);
            run.stderr.close(cx);
            self.finish_run_if_over(&id, now, cx);
        }
        for (mut l, _) in std::mem::take(&mut self.runs.exiting) {
            let _ = l.kill();
            let _ = l.wait();
        }
        // Their callers' folders go with the rest of the tree (`LocalKeeper::shutdown`).
    }

    /// Answer a run whose launcher has reported (or is given up on) and whose output has
    /// ended (or had its time to).
    fn finish_run_if_over(&mut self, id: &str, now: Instant, cx: &Ctx) {
        let Some(run) = self.runs.runs.get(id) else {
            return;
        };
        let Some(ended) = run.ended else { return };
        let output_done = run.stdout.fd.is_none() && run.stderr.fd.is_none();
        if !output_done && now < ended + OUTPUT_DRAIN {
            return;
        }
        let Some(mut run) = self.runs.runs.remove(id) else {
            return;
        };
        for t in [run.chan, run.stdout.token, run.stderr.token] {
            self.runs.tokens.remove(&t);
        }
        run.stdout.close(cx);
        run.stderr.close(cx);
        close_channel(&mut run, cx);
        settle(&mut run, &mut self.keeper);
        // Reaped now if it has exited; otherwise on a later turn (see `runs_tick`).
        if let Ok(None) = run.launcher.try_wait() {
            self.runs.exiting.push((run.launcher, now + EXIT_WAIT));
        }
        let killed = run.killed.map(|(k, _)| k);
        let timed_out = killed == Some(Killed::Deadline) || run.exit.is_some_and(|e| e.timed_out);
        let error = match killed {
            Some(Killed::Cancelled) => Some(CANCELLED.to_string()),
            _ => run.error.clone(),
        };
        let wall = run.started.map_or(Duration::ZERO, |s| s.elapsed());
        let answer = RunAnswer {
            request_id: id.to_string(),
            started: run.started.is_some(),
            phase: run.phase.as_str().into(),
            error,
            exit_code: run.exit.map(|e| {
                e.code
                    .unwrap_or_else(|| 128 + e.signal.unwrap_or(libc::SIGKILL))
            }),
            signal: run.exit.and_then(|e| e.signal),
            timed_out,
            oom_killed: run.usage.is_some_and(|u| u.oom_kills > 0),
            wall_us: run
                .exit
                .map_or(wall.as_micros().min(u64::MAX as u128) as u64, |e| e.wall_us),
            cpu_us: run.usage.map_or(0, |u| u.cpu_usec),
            peak_rss_kb: run.usage.map_or(0, |u| u.peak_bytes / 1024),
            stdout: run.stdout.text(),
            stdout_truncated: run.stdout.truncated,
            stderr: run.stderr.text(),
            stderr_truncated: run.stderr.truncated,
            usage: None,
        };
        log::debug!(
            "run {id} answered: started {}, exit {:?}, timed out {}, oom {}, error {:?}",
            answer.started,
            answer.exit_code,
            answer.timed_out,
            answer.oom_killed,
            answer.error
        );
        let mut answer = answer;
        answer.usage = Some(Box::new(self.record_run(
            &answer,
            run.tenant.as_deref(),
            Duration::from_micros(answer.wall_us),
        )));
        self.outbox
            .push((run.client, Reply::RunAnswer(answer), true));
    }

    /// A finished run's usage record (written by [`Functions::write_usage`], after the
    /// answer has gone out).
    fn record_run(&mut self, a: &RunAnswer, tenant: Option<&str>, wall: Duration) -> UsageRecord {
        let rec = UsageRecord {
            tenant: tenant.unwrap_or(UsageRecord::HOST).to_string(),
            function: USAGE_NAME.to_string(),
            script: None,
            request_id: a.request_id.clone(),
            wall_us: wall.as_micros().min(u64::MAX as u128) as u64,
            cpu_us: a.cpu_us,
            peak_rss_kb: a.peak_rss_kb,
            outcome: outcome(a).as_str().to_string(),
            finished_ms: now_ms(),
        };
        self.usage.push(rec.json_line());
        rec
    }
}

/// Everything the launcher has sent, and why its channel ended if it did. The messages
/// that came before an error are kept: a launcher that reported the end and exited while
/// a `Kill` of ours was still unread in its socket leaves a reset behind its report.
fn receive(conn: &mut Conn) -> (Vec<FromLauncher>, Option<String>) {
    let mut msgs = Vec::new();
    loop {
        match conn.read_some(CHUNK) {
            Ok(Got::Bytes) => loop {
                match conn.take::<FromLauncher>() {
                    Ok(Some(m)) => msgs.push(m),
                    Ok(None) => break,
                    Err(e) => return (msgs, Some(format!("its channel broke: {e}"))),
                }
            },
            Ok(Got::Nothing) => return (msgs, None),
            Ok(Got::End) => {
                let why = match conn.end_of_stream() {
                    Ok(()) => "it closed the channel".to_string(),
                    Err(e) => format!("its channel broke: {e}"),
                };
                return (msgs, Some(why));
            }
            Err(e) => return (msgs, Some(format!("its channel broke: {e}"))),
        }
    }
}

/// One launcher message, in the order `OneShotTalk` allows. An error ends the launcher.
fn run_msg(run: &mut Run, m: FromLauncher, keeper: &mut LocalKeeper) -> Result<(), String> {
    match run.talk.hear(m)? {
        Said::Cloned { pid } => {
            // The sandbox's init joined the cgroup itself; the keeper checks, and moves it
            // if not.
            let placed = match run.cgroup {
                Some(id) => match keeper.call(ToKeeper::PlaceRunInit { run: id, pid }).reply {
                    FromKeeper::Done => Placement::Placed,
                    FromKeeper::Gone => Placement::Gone,
                    FromKeeper::Refused { why } => Placement::Failed(why),
                    other => Placement::Failed(format!("the keeper answered {other:?}")),
                },
                None => Placement::Gone,
            };
            let (reply, error) = OneShotTalk::answer_cloned(placed, run.killed.is_some());
            if error.is_some() {
                run.error = error;
            }
            if let Some(c) = run.conn.as_mut() {
                c.send(&reply);
            }
        }
        Said::Started => {
            run.started = Some(Instant::now());
            run.phase = Phase::Run;
        }
        Said::Exited {
            code,
            signal,
            timed_out,
            wall_us,
        } => {
            run.exit = Some(Exit {
                code,
                signal,
                timed_out,
                wall_us,
            });
            run.ended = Some(Instant::now());
        }
        Said::Failed { phase, reason } => {
            run.phase = phase;
            run.error.get_or_insert(reason);
            run.ended = Some(Instant::now());
        }
    }
    Ok(())
}

/// End a run from outside: the launcher is told to kill the sandbox, and its cgroup is
/// killed from here, which does not depend on the launcher or the sandbox.
fn kill(run: &mut Run, why: Killed, now: Instant, keeper: &mut LocalKeeper) {
    run.killed = Some((why, now));
    if let Some(c) = run.conn.as_mut() {
        c.send(&ToLauncher::Kill);
    }
    if let Some(id) = run.cgroup {
        if let FromKeeper::Refused { why } = keeper.call(ToKeeper::KillRun { run: id }).reply {
            log::error!("kill a run's cgroup: {why}");
        }
    }
}

/// The launcher's channel is over: it is closed, and the run has ended.
fn close_channel(run: &mut Run, cx: &Ctx) {
    if let Some(mut c) = run.conn.take() {
        let _ = cx.reg.deregister(&mut c.stream);
    }
    run.ended.get_or_insert_with(Instant::now);
}

/// Read what the run's cgroup counted and hand it to the keeper to be removed (once).
/// Unless the launcher reported a clean end, whatever is left in it is killed first.
fn settle(run: &mut Run, keeper: &mut LocalKeeper) {
    let Some(id) = run.cgroup.take() else { return };
    let kill = run.exit.is_none() || run.error.is_some() || run.killed.is_some();
    match keeper.call(ToKeeper::EndRun { run: id, kill }).reply {
        FromKeeper::Killed { usage } => run.usage = usage.map(super::requests::usage_of),
        other => log::warn!("end a run's cgroup: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> RunAnswer {
        refused_answer("r", Phase::Run, String::new())
    }

    #[test]
    fn a_runs_usage_outcome_says_how_it_ended() {
        let mut a = answer();
        a.error = None;
        a.started = true;
        a.exit_code = Some(0);
        assert_eq!(outcome(&a), Outcome::Ok);
        a.exit_code = Some(3);
        assert_eq!(outcome(&a), Outcome::Error);
        a.exit_code = Some(137);
        a.timed_out = true;
        assert_eq!(outcome(&a), Outcome::Timeout);
        a.error = Some(CANCELLED.into());
        assert_eq!(outcome(&a), Outcome::Cancelled);
        let never = refused_answer("r", Phase::Plan, "no such image".into());
        assert_eq!(outcome(&never), Outcome::Error);
        assert!(!never.started);
    }

    #[test]
    fn stdin_is_a_sealed_file_read_from_its_start() {
        use std::io::Read;
        let fd = stdin_file(b"hello").expect("memfd");
        let mut f = File::from(fd);
        let mut got = String::new();
        f.read_to_string(&mut got).expect("read");
        assert_eq!(got, "hello");
        assert!(f.write_all(b"x").is_err(), "a sealed stdin took a write");
        assert_eq!(f.metadata().expect("stat").len(), 5);
    }
}
