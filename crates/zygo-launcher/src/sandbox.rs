//! One sandbox: everything the launcher does, for both modes — a one-shot program
//! (`zygo run`, an MCP `run_code`) and a zygote (a warm function's agent, which
//! [`crate::zygote`] serves once the sandbox is up).
//!
//! Three processes are involved:
//! - the **launcher** (this process, in the host's namespaces): clones the sandbox as soon
//!   as it has the plan, hands its init the cgroup files when the monitor sends them,
//!   writes its id maps, lets init start the program once the monitor has checked the
//!   placement, enforces the deadline, and reports to the monitor;
//! - the sandbox's **init** (pid 1 of the new pid namespace): builds the root, drops every
//!   privilege, starts the program and reaps; when it exits the kernel kills everything
//!   left in the namespace, so nothing the program started can outlive it;
//! - the **program**, started by init (`sys::spawn`) once init has installed the seccomp
//!   filter on itself (the program inherits it).
//!
//! The launcher talks to init over a seqpacket socket pair with three messages: `C`
//! carrying the cgroup attach files (init joins them before it does anything else), `M`
//! (the id maps are written: init builds the sandbox while the monitor checks the cgroup
//! placement), and `G` (the placement is confirmed: init drops its privileges, installs the
//! seccomp filter compiled into `zygo`, and starts the program).
//! init reports to the launcher over a close-on-exec pipe with one short line per event:
//! `P` (placed in its cgroups), `S` (the program was exec'd), `F <reason>` (building or
//! starting failed), `W <status>` (the program's wait status). The program itself holds
//! neither.

use std::ffi::CString;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use proto::launch::{
    FromLauncher, IdMap, LaunchPlan, Mode, Phase, ToLauncher, MAX_ATTACH_FILES, MAX_HANDED_MOUNTS,
    MAX_LAUNCH_FRAME,
};
use proto::{read_frame, write_frame};

use crate::sys::{self, SetupError};
use crate::{harden, rootfs, seccomp, zygote};

/// The longest a sandbox may take to build before the launcher gives up on it.
const BUILD_DEADLINE: Duration = Duration::from_secs(30);
/// The most init may say on its report pipe; more is a protocol violation.
const MAX_REPORT: usize = 64 * 1024;

/// The namespaces the sandbox is cloned into. Its network namespace comes from its init
/// (`build`), its cgroup namespace once it is placed (`finish`).
const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// What went wrong in the launcher itself (not in the sandbox).
#[derive(Debug)]
pub enum LaunchError {
    Channel(proto::ProtoError),
    Unexpected(&'static str),
    /// A zygote ended abnormally (protocol violation, kill).
    Sandbox(String),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Channel(e) => write!(f, "monitor channel: {e}"),
            LaunchError::Unexpected(what) => write!(f, "monitor sent {what}"),
            LaunchError::Sandbox(why) => write!(f, "zygote ended: {why}"),
        }
    }
}

impl From<proto::ProtoError> for LaunchError {
    fn from(e: proto::ProtoError) -> Self {
        LaunchError::Channel(e)
    }
}

fn send(sock: &mut UnixStream, msg: &FromLauncher) -> Result<(), LaunchError> {
    write_frame(sock, msg).map_err(LaunchError::Channel)
}

fn failed(sock: &mut UnixStream, phase: Phase, reason: String) -> Result<(), LaunchError> {
    send(sock, &FromLauncher::Failed { phase, reason })
}

/// One frame from the monitor with the descriptors sent with it. Only `Cgroup` and
/// `Mounts` may carry descriptors, exactly as many as they announce.
pub fn read_launch_frame(sock: RawFd) -> Result<(ToLauncher, Vec<OwnedFd>), proto::ProtoError> {
    let max = usize::from(MAX_ATTACH_FILES.max(MAX_HANDED_MOUNTS));
    let bad = |what: String| {
        proto::ProtoError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, what))
    };
    let mut len = [0u8; 4];
    let mut fds = match plumbing::fds::recv_exact_with_fds(sock, &mut len, max) {
        Ok(fds) => fds,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(proto::ProtoError::Closed)
        }
        Err(e) => return Err(e.into()),
    };
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_LAUNCH_FRAME {
        return Err(proto::ProtoError::TooLarge {
            len,
            max: MAX_LAUNCH_FRAME,
        });
    }
    let mut payload = vec![0u8; len];
    fds.extend(plumbing::fds::recv_exact_with_fds(
        sock,
        &mut payload,
        max - fds.len(),
    )?);
    let msg: ToLauncher = proto::codec::decode(&payload)?;
    match &msg {
        ToLauncher::Cgroup { files } if usize::from(*files) != fds.len() => Err(bad(format!(
            "a cgroup frame announcing {files} descriptors carried {}",
            fds.len()
        ))),
        ToLauncher::Cgroup { .. } => Ok((msg, fds)),
        ToLauncher::Mounts { count } if usize::from(*count) != fds.len() => Err(bad(format!(
            "a mounts frame announcing {count} descriptors carried {}",
            fds.len()
        ))),
        ToLauncher::Mounts { .. } => Ok((msg, fds)),
        _ if !fds.is_empty() => Err(bad(format!(
            "{} descriptors came with a frame that carries none",
            fds.len()
        ))),
        _ => Ok((msg, fds)),
    }
}

/// Run one sandbox for the monitor on `sock`, which has already sent `Start(plan)`, and
/// `Cgroup` before it if `attach` is `Some` (otherwise it follows). `handed` are the
/// plan's handed-over mounts (see `BindMount::handed`), in its order.
pub fn run(
    sock: &mut UnixStream,
    plan: &LaunchPlan,
    attach: Option<Vec<OwnedFd>>,
    handed: Vec<OwnedFd>,
) -> Result<(), LaunchError> {
    let want = usize::from(plan.image_handed)
        + plan.mounts.iter().filter(|m| m.handed).count()
        + usize::from(plan.work_handed);
    if handed.len() != want {
        return failed(
            sock,
            Phase::Start,
            format!(
                "the monitor handed over {} mounts for a plan with {want}",
                handed.len()
            ),
        );
    }
    if plan.argv.is_empty() {
        return failed(sock, Phase::Start, "no command to run".into());
    }
    // launcher → init: the cgroup files, then the word to go on.
    let (ctl, ctl_init) = match plumbing::pipes::socketpair(libc::SOCK_SEQPACKET) {
        Ok(p) => p,
        Err(e) => return failed(sock, Phase::Start, format!("create a socket pair: {e}")),
    };
    let (rep_r, rep_w) = match plumbing::pipes::pipe() {
        Ok((r, w)) => (r.into_raw_fd(), w.into_raw_fd()),
        Err(e) => return failed(sock, Phase::Start, format!("create a pipe: {e}")),
    };

    // Zygote: the agent's control channel and the registration socket. The sandbox's ends
    // become fds 3 and 4 of the agent.
    let agent_fds = match plan.mode {
        Mode::OneShot => None,
        Mode::Zygote => match zygote::channels() {
            Ok(c) => Some(c),
            Err(e) => {
                return failed(
                    sock,
                    Phase::Start,
                    format!("create the agent's channels: {e}"),
                )
            }
        },
    };
    let inner_fds = agent_fds.as_ref().map(|c| c.inner());

    // As root, create the user namespace *as* a subordinate id of this sandbox's own (see
    // `IdMap::Range`): the namespace's owner is then that id, so the per-user kernel
    // counters (inotify instances and watches, queued signals, locked memory, ...) the
    // sandbox uses are charged to it, never to the host's root nor to another sandbox. Only
    // the effective ids change; the real and saved ids stay 0 so we can change back.
    //
    // Id 0 inside maps onto that same owner id where there is one (see `crate::ids`): the
    // host folders handed in are idmapped so that on disk id 0 is the owner the monitor
    // named for each.
    let mut root_uid = None;
    let mut ns_owner = None;
    let mut _idmap_children = Vec::new();
    let as_subordinate = match plan.ids {
        IdMap::Range {
            uid_base,
            gid_base,
            count,
            owners,
        } => {
            let (uid, gid) = owner_ids(uid_base, gid_base, count, owners);
            ns_owner = Some((uid, gid));
            if owners > 0 {
                root_uid = Some(uid);
            }
            // Id 0 inside is host `uid` (`uid_base` without owner ids) and host `gid_base`.
            match idmap_handed(plan, &handed, uid, gid_base) {
                Ok(children) => _idmap_children = children,
                Err(e) => return failed(sock, Phase::Start, e),
            }
            // SAFETY: changing only the effective ids of this single-threaded process.
            let r = unsafe { libc::setresgid(u32::MAX, gid, u32::MAX) };
            // SAFETY: as above.
            let r2 = unsafe { libc::setresuid(u32::MAX, uid, u32::MAX) };
            if r < 0 || r2 < 0 {
                let e = std::io::Error::last_os_error();
                restore_root();
                return failed(
                    sock,
                    Phase::Start,
                    format!("take the sandbox's host ids: {e}"),
                );
            }
            true
        }
        IdMap::Single { .. } => false,
    };

    // init starts on this CPU, which this process leaves for it by waiting for its reports
    // (see `plumbing::cpu`); both give the affinity back at once.
    let pinned = plumbing::cpu::pin_here();
    // SAFETY: a raw clone with a null stack behaves like fork. The launcher is
    // single-threaded, so the child may go on running ordinary Rust code.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (NAMESPACES | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    // Taken before anything else can overwrite errno.
    let clone_err = std::io::Error::last_os_error();
    if let Some(p) = &pinned {
        p.restore();
    }
    if pid != 0 && as_subordinate {
        restore_root();
    }
    if pid < 0 {
        let e = clone_err;
        return failed(
            sock,
            Phase::Start,
            format!("create the sandbox's namespaces: {e}{}", userns_hint(&e)),
        );
    }
    if pid == 0 {
        drop(ctl);
        drop(attach);
        sys::close(rep_r);
        sys::close(plumbing::role::CHANNEL_FD);
        if let Some(c) = &agent_fds {
            c.close_outer();
        }
        init_main(plan, ctl_init, rep_w, inner_fds, &handed);
    }
    let pid = pid as libc::pid_t;
    let init = Init {
        pid,
        reaped: std::cell::Cell::new(false),
    };
    // init waits for its cgroup before it does anything else: that comes first.
    let handed = hand_over_cgroup(sock, &ctl, attach);
    // Hold the sandbox's mount namespace until this process ends. When init exits it then
    // only drops a reference, and the sandbox's mounts are taken down as this process
    // exits, after it has reported the end: the monitor reads the usage and removes the
    // cgroups meanwhile, instead of after. init is still ours to open (it becomes
    // undumpable only once this process lets it finish).
    let _mounts = std::fs::File::open(format!("/proc/{pid}/ns/mnt"));
    // A zygote's relay checks each request's process against the sandbox's namespaces.
    let sandbox_ns = match plan.mode {
        Mode::Zygote => Some(crate::scratch::SandboxNs::of(pid)),
        Mode::OneShot => None,
    };
    drop(ctl_init);
    sys::close(rep_w);
    // The program's stdout and stderr belong to the sandbox now: once it is gone, the
    // monitor sees them end without waiting for this process to exit.
    let _ = sys::stdout_to_dev_null();
    sys::close(plumbing::role::PROGRAM_STDERR_FD);
    if let Some(c) = &agent_fds {
        c.close_inner();
    }
    let outcome = match handed {
        Ok(true) => supervise(
            sock, plan, root_uid, ns_owner, &init, ctl, rep_r, agent_fds, sandbox_ns,
        ),
        other => other.map(drop),
    };
    // Whatever happened, nothing of the sandbox outlives this function.
    init.kill();
    init.reap();
    sys::close(rep_r);
    outcome
}

/// Receive init's egress listeners (`N`) and start the sandbox's egress filter with them
/// and the rules. `Ok(None)`: nothing to relay (no rules), or init ended before it sent
/// them (its report says why).
fn start_egress_filter(
    plan: &LaunchPlan,
    rules: &proto::launch::Egress,
    init_pid: libc::pid_t,
    ctl: &OwnedFd,
) -> Result<Option<EgressFilter>, String> {
    // init sends them once it has built the sandbox (or exits, closing its end): bounded by
    // the build deadline, as the rest of the start is.
    let mut p = libc::pollfd {
        fd: ctl.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = BUILD_DEADLINE.as_millis() as libc::c_int;
    // SAFETY: one valid pollfd.
    match unsafe { libc::poll(&mut p, 1, ms) } {
        0 => return Err("the sandbox did not set up its network in time".into()),
        n if n < 0 => {
            return Err(format!(
                "wait for init: {}",
                std::io::Error::last_os_error()
            ))
        }
        _ => {}
    }
    let mut tag = [0u8; 1];
    let listeners = match plumbing::fds::recv_with_fds(
        ctl.as_raw_fd(),
        &mut tag,
        proto::launch::MAX_EGRESS_RULES + 1,
    ) {
        Ok((1, fds)) if tag == *b"N" => fds,
        Ok((0, _)) => return Ok(None),
        Ok(_) => return Err("the sandbox's init broke its protocol".into()),
        Err(e) => return Err(format!("receive the listeners: {e}")),
    };
    if listeners.is_empty() {
        return Ok(None);
    }
    // As root, the filter's real ids are the sandbox's own owner ids (its id 0 on the
    // host) and its effective ids nobody's (`zygo_egress::confine::drop_ids` says why): the
    // kernel charges pipe buffer pages, descriptors in flight and threads to the real uid,
    // so the relay's 1 MiB pipes are this sandbox's and one sandbox's connections cannot
    // use up another's filter's allowance. The sandbox cannot name the filter (it is not in
    // the sandbox's pid namespace) and it is not dumpable. With no owner ids left, every
    // sandbox's id 0 is the same host id: the filter is then nobody (65534) throughout.
    // Rootless, it stays this user (it has no privilege to give up).
    let ids = match plan.ids {
        IdMap::Range {
            uid_base,
            gid_base,
            count,
            owners,
        } if owners > 0 => Some(owner_ids(uid_base, gid_base, count, owners)),
        IdMap::Range { .. } => Some((EGRESS_FILTER_ID, EGRESS_FILTER_ID)),
        IdMap::Single { .. } => None,
    };
    let start = egress_start(ids, init_pid, rules)?;
    let (mine, theirs) =
        plumbing::pipes::socketpair(libc::SOCK_SEQPACKET).map_err(|e| e.to_string())?;
    let child = plumbing::role::spawn(
        Path::new("/proc/self/exe"),
        plumbing::Role::EgressFilter,
        plumbing::role::RoleFds {
            stdin: plumbing::role::Stdio::Null,
            stdout: plumbing::role::Stdio::Null,
            channel: std::os::fd::AsFd::as_fd(&theirs),
            program_stderr: None,
        },
    )
    .map_err(|e| format!("spawn it: {e}"))?;
    drop(theirs);
    let raw: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
    let filter = EgressFilter { child, chan: mine };
    plumbing::fds::send_with_fds(filter.chan.as_raw_fd(), &start, &raw)
        .map_err(|e| format!("hand it the listeners: {e}"))?;
    Ok(Some(filter))
}

/// The egress filter's start message.
fn egress_start(
    ids: Option<(u32, u32)>,
    init_pid: libc::pid_t,
    egress: &proto::launch::Egress,
) -> Result<Vec<u8>, String> {
    let start = proto::launch::EgressStart {
        ids,
        label: format!("sandbox {init_pid} (launcher {})", std::process::id()),
        egress: egress.clone(),
    };
    let bytes = proto::codec::encode(&start).map_err(|e| e.to_string())?;
    if bytes.len() > proto::launch::MAX_EGRESS_START {
        return Err(format!(
            "its start message is {} bytes, over the {} it reads",
            bytes.len(),
            proto::launch::MAX_EGRESS_START
        ));
    }
    Ok(bytes)
}

/// The host uid and gid of an egress filter started as root where sandboxes have no owner
/// ids of their own: nobody.
const EGRESS_FILTER_ID: u32 = 65534;

/// A running egress filter: killed and reaped when the sandbox's launcher lets go of it
/// (and killed by the kernel if the launcher dies first: its parent-death signal).
struct EgressFilter {
    child: plumbing::role::Child,
    /// Its channel, on which it says it has confined itself.
    chan: OwnedFd,
}

/// How long a launcher waits for its egress filter to have confined itself.
const FILTER_CONFINED_WITHIN: Duration = Duration::from_secs(10);

impl EgressFilter {
    fn pid(&self) -> libc::pid_t {
        self.child.pid()
    }

    /// Wait until the filter says it has given up root (its ids dropped, Landlock and its
    /// seccomp table in place). The launcher confines itself only after that: a launcher
    /// that is no longer root may not signal a filter that still is, and the kernel does
    /// not deliver a parent-death signal its parent may not send.
    fn confined(&self) -> Result<(), String> {
        let mut fd = libc::pollfd {
            fd: self.chan.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = FILTER_CONFINED_WITHIN.as_millis() as libc::c_int;
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut fd, 1, ms) } {
            n if n > 0 => {}
            0 => return Err(format!("it did not confine itself within {ms} ms")),
            _ => return Err(std::io::Error::last_os_error().to_string()),
        }
        let mut byte = [0u8; 1];
        match sys::read_fd(self.chan.as_raw_fd(), &mut byte) {
            Ok(1) if byte == *b"c" => Ok(()),
            Ok(_) => Err("it ended before it confined itself".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for EgressFilter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The host ids that own this launcher's sandbox: one of the `owners` ids after the mapped
/// range, chosen by our pid (live launchers have different pids, so different owners when
/// there are as many owner ids as pids can be); `base` when there are none.
fn owner_ids(uid_base: u32, gid_base: u32, count: u32, owners: u32) -> (u32, u32) {
    if owners == 0 {
        return (uid_base, gid_base);
    }
    let i = std::process::id() % owners;
    (uid_base + count + i, gid_base + count + i)
}

/// Mount the host folders handed in (not the image, nor a fresh filesystem) idmapped for
/// a sandbox whose id 0 is host `root_uid` and `root_gid`, each for the owner the plan
/// names (see `crate::ids`), and refuse a writable one that cannot be. The children to
/// reap later.
fn idmap_handed(
    plan: &LaunchPlan,
    handed: &[OwnedFd],
    root_uid: u32,
    root_gid: u32,
) -> Result<Vec<crate::ids::Reap>, String> {
    // In the order the monitor sent them: the image, the handed mounts, the workspace.
    struct Folder<'a> {
        src: &'a str,
        dst: &'a str,
        rw: bool,
        fresh: bool,
        owner: Option<proto::launch::DiskOwner>,
    }
    let mut folders: Vec<Folder> = plan
        .mounts
        .iter()
        .filter(|m| m.handed)
        .map(|m| Folder {
            src: &m.src,
            dst: &m.dst,
            rw: m.rw,
            fresh: m.fresh,
            owner: m.owner,
        })
        .collect();
    if plan.work_handed {
        folders.push(Folder {
            src: plan.work.as_deref().unwrap_or("the workspace"),
            dst: "/work",
            rw: true,
            fresh: false,
            owner: plan.work_owner,
        });
    }
    let trees = handed.get(usize::from(plan.image_handed)..).unwrap_or(&[]);
    let mut mapped = Vec::new();
    let mut named = Vec::new();
    for (tree, f) in trees.iter().zip(&folders) {
        // A fresh mount (a filesystem made for this sandbox alone) is placed as it is.
        if f.fresh {
            continue;
        }
        match f.owner {
            Some(owner) => {
                mapped.push((tree, owner));
                named.push(f);
            }
            None if f.rw => {
                return Err(format!(
                    "the plan names no owner on disk for the writable folder {} (at {})",
                    f.src, f.dst
                ))
            }
            None => {}
        }
    }
    let (children, done) = crate::ids::idmap_trees(&mapped, root_uid, root_gid)
        .map_err(|e| format!("make the idmapping namespace of the folders handed in: {e}"))?;
    for (f, r) in named.iter().zip(&done) {
        match r {
            Ok(()) => {}
            // Read-only, nothing the sandbox may do there depends on who owns what.
            Err(e) if !f.rw => log::debug!("launcher: {} is not idmapped: {e}", f.dst),
            // Writable, the sandbox would write there as a host uid of its own, which a
            // later sandbox may be given: refused.
            Err(e) => {
                return Err(format!(
                    "the writable folder {} (at {}) cannot be mounted idmapped ({e}), so a \
                     sandbox cannot write there as its owner: mount it read-only, or keep it \
                     on a filesystem that supports idmapped mounts (ext4, xfs, btrfs; tmpfs \
                     from Linux 6.3)",
                    f.src, f.dst
                ))
            }
        }
    }
    Ok(children)
}

/// How long a one-shot launcher waits with nothing to do, once the program runs, before it
/// confines itself (see `supervise`).
const CONFINE_WHEN_IDLE_MS: libc::c_int = 2;

/// What a launcher keeps once its sandbox is built (see `relay`): as root, the ids of the
/// sandbox's owner, and the sandbox's id range to write its files as; rootless, its own
/// ids. It may signal `signals` alone.
fn relay_confinement(
    ids: &IdMap,
    ns_owner: Option<(u32, u32)>,
    signals: Vec<libc::pid_t>,
) -> crate::relay::Confinement {
    // SAFETY: plain id query.
    let root = unsafe { libc::geteuid() } == 0;
    let (uids, gids) = match *ids {
        IdMap::Range {
            uid_base,
            gid_base,
            count,
            owners,
        } if root => {
            let last = count.saturating_add(owners).saturating_sub(1);
            (
                Some((uid_base, uid_base.saturating_add(last))),
                Some((gid_base, gid_base.saturating_add(last))),
            )
        }
        _ => (None, None),
    };
    crate::relay::Confinement {
        owner: ns_owner.filter(|_| root),
        uids,
        gids,
        signals,
    }
}

/// Back to effective root after creating the sandbox as its subordinate uid.
fn restore_root() {
    // SAFETY: the real and saved ids are 0, so these only restore the effective ids.
    unsafe {
        libc::setresuid(u32::MAX, 0, u32::MAX);
        libc::setresgid(u32::MAX, 0, u32::MAX);
    }
}

fn userns_hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::ENOSPC) | Some(libc::EINVAL) => {
            " (user namespaces may be disabled: check kernel.unprivileged_userns_clone, \
             user.max_user_namespaces and AppArmor's restrict_unprivileged_userns)"
        }
        _ => "",
    }
}

/// The sandbox's init, a child of this process. Once reaped its pid may be anyone's, so it
/// is signalled only until then.
struct Init {
    pid: libc::pid_t,
    reaped: std::cell::Cell<bool>,
}

impl Init {
    /// SIGKILL to init: the kernel then kills every process in its pid namespace.
    fn kill(&self) {
        if !self.reaped.get() {
            // SAFETY: signalling our own child, which has not been reaped.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    /// Wait for init to end; its wait status, or `None` if it was reaped already.
    fn reap(&self) -> Option<libc::c_int> {
        if self.reaped.get() {
            return None;
        }
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::__WALL) };
            if r == self.pid {
                self.reaped.set(true);
                return Some(status);
            }
            if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return None;
        }
    }
}

/// Write init's id maps. `root_uid`: the host uid of id 0 inside, when it is the
/// sandbox's own rather than `uid_base` (see `crate::ids`).
fn write_id_maps(pid: libc::pid_t, ids: &IdMap, root_uid: Option<u32>) -> Result<(), String> {
    let proc_ = format!("/proc/{pid}");
    let write = |file: &str, text: &str| {
        std::fs::write(format!("{proc_}/{file}"), text).map_err(|e| format!("write {file}: {e}"))
    };
    match *ids {
        IdMap::Range {
            uid_base,
            gid_base,
            count,
            ..
        } => {
            if uid_base == 0 || gid_base == 0 {
                return Err("refusing an id map onto host id 0".into());
            }
            match root_uid {
                Some(root) if count > 1 => write(
                    "uid_map",
                    &format!("0 {root} 1\n1 {} {}\n", uid_base + 1, count - 1),
                )?,
                Some(root) => write("uid_map", &format!("0 {root} 1\n"))?,
                None => write("uid_map", &format!("0 {uid_base} {count}\n"))?,
            }
            write("gid_map", &format!("0 {gid_base} {count}\n"))?;
        }
        IdMap::Single { uid, gid } => {
            write("setgroups", "deny")?;
            write("uid_map", &format!("0 {uid} 1\n"))?;
            write("gid_map", &format!("0 {gid} 1\n"))?;
        }
    }
    Ok(())
}

enum Report {
    Started,
    Failed(String),
    Status(libc::c_int),
}

fn parse_report(line: &[u8]) -> Option<Report> {
    let line = std::str::from_utf8(line).ok()?;
    match line.split_once(' ').unwrap_or((line, "")) {
        ("S", "") => Some(Report::Started),
        ("F", why) if !why.is_empty() => Some(Report::Failed(why.to_string())),
        ("W", n) => n.parse().ok().map(Report::Status),
        _ => None,
    }
}

/// Read init's first report line (blocking, bounded by the build deadline).
fn wait_line(rep_r: RawFd, buf: &mut Vec<u8>) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + BUILD_DEADLINE;
    loop {
        if let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = buf.drain(..=nl).collect();
            line.pop();
            return Ok(line);
        }
        if buf.len() > MAX_REPORT {
            return Err("the sandbox's init said too much".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the sandbox did not start in time".into());
        }
        let mut fd = libc::pollfd {
            fd: rep_r,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut fd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(format!(
                "wait for the sandbox: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut chunk = [0u8; 512];
        let got = sys::read_fd(rep_r, &mut chunk).map_err(|e| e.to_string())?;
        if got == 0 {
            return Err("the sandbox's init exited before it started".into());
        }
        buf.extend_from_slice(&chunk[..got]);
    }
}

/// Steps 1 and 2 of the start: the sandbox's cgroup files, from the monitor now if they did
/// not come before the plan, go to init, which joins them before it does anything else.
/// `Ok(false)`: the start ends here (the monitor said to kill, or the failure is reported).
fn hand_over_cgroup(
    sock: &mut UnixStream,
    ctl: &OwnedFd,
    attach: Option<Vec<OwnedFd>>,
) -> Result<bool, LaunchError> {
    let attach = match attach {
        Some(fds) => fds,
        None => match read_launch_frame(sock.as_raw_fd())? {
            (ToLauncher::Cgroup { .. }, fds) => fds,
            (ToLauncher::Kill, _) => return Ok(false),
            _ => {
                return Err(LaunchError::Unexpected(
                    "a message other than Cgroup or Kill",
                ))
            }
        },
    };
    let raw: Vec<RawFd> = attach.iter().map(AsRawFd::as_raw_fd).collect();
    let handed = plumbing::fds::send_with_fds(ctl.as_raw_fd(), b"C", &raw);
    drop(attach);
    match handed {
        Ok(_) => Ok(true),
        Err(e) => failed(
            sock,
            Phase::Start,
            format!("hand the sandbox its cgroup: {e}"),
        )
        .map(|()| false),
    }
}

/// The rest of the start (init has its cgroup files), then the run. `sandbox_ns` are the
/// namespaces of a zygote's init, for the relay's checks.
#[allow(clippy::too_many_arguments)]
fn supervise(
    sock: &mut UnixStream,
    plan: &LaunchPlan,
    root_uid: Option<u32>,
    ns_owner: Option<(u32, u32)>,
    init: &Init,
    ctl: OwnedFd,
    rep_r: RawFd,
    mut agent_fds: Option<zygote::Channels>,
    mut sandbox_ns: Option<Result<crate::scratch::SandboxNs, crate::scratch::ScratchError>>,
) -> Result<(), LaunchError> {
    // 3. The id maps; init builds the sandbox once they are there.
    if let Err(e) = write_id_maps(init.pid, &plan.ids, root_uid) {
        return failed(
            sock,
            Phase::Start,
            format!("map the sandbox's user ids: {e}"),
        );
    }
    if let Err(e) = plumbing::fds::send_with_fds(ctl.as_raw_fd(), b"M", &[]) {
        return failed(sock, Phase::Start, format!("start the sandbox: {e}"));
    }
    // 4. The seccomp filter needs nothing from here: it is compiled into `zygo`, and init,
    // a clone of this process, installs it from its own memory.
    // 5. init says `P` once it is in its cgroups; the monitor checks that (and moves it
    // itself if not) before the program may start.
    let mut buf: Vec<u8> = Vec::new();
    match wait_line(rep_r, &mut buf) {
        Ok(line) if line == b"P" => {}
        Ok(line) => {
            let why = match parse_report(&line) {
                Some(Report::Failed(why)) => why,
                _ => "the sandbox's init broke its report protocol".into(),
            };
            return failed(sock, Phase::Start, why);
        }
        Err(e) => return failed(sock, Phase::Start, e),
    }
    send(sock, &FromLauncher::Cloned { pid: init.pid })?;
    match read_frame::<_, ToLauncher>(sock, MAX_LAUNCH_FRAME) {
        Ok(ToLauncher::Proceed) => {}
        Ok(ToLauncher::Kill) => return Ok(()),
        Ok(_) => {
            return Err(LaunchError::Unexpected(
                "a message other than Proceed or Kill",
            ))
        }
        Err(e) => return Err(e.into()),
    }
    // 5b. Egress: init's listeners go to an egress filter of this sandbox's own, which
    // lives as long as this process. If init failed instead, its report says why.
    let filter = match &plan.egress {
        Some(rules) => match start_egress_filter(plan, rules, init.pid, &ctl) {
            Ok(f) => f,
            Err(e) => {
                init.kill();
                return failed(sock, Phase::Start, format!("start the egress filter: {e}"));
            }
        },
        None => None,
    };
    // 6. Let init finish and start the program. If init has failed meanwhile, this send
    // fails too, and its report says why.
    let _ = plumbing::fds::send_with_fds(ctl.as_raw_fd(), b"G", &[]);
    drop(ctl);
    // A one-shot launcher has nothing left to build: it gives up the host's privileges, as
    // a zygote's relay does once its mounter is started (see `relay`), at its first idle
    // moment once the program runs. Doing it at once would put the work (about half a
    // millisecond) between a short program's end and its report; until then it reads only
    // init's report lines and the monitor.
    let mut confined = plan.mode != Mode::OneShot;

    // 7. Wait for init's reports, the monitor, or the deadline.
    let mut started: Option<Instant> = None;
    let mut status: Option<libc::c_int> = None;
    let mut failure: Option<String> = None;
    let mut timed_out = false;
    let mut killed = false;
    let mut ended: Option<Instant> = None;
    let build_deadline = Instant::now() + BUILD_DEADLINE;
    let timeout = Duration::from_millis(plan.timeout_ms);
    'events: loop {
        let deadline = match started {
            Some(t) => t + timeout,
            None => build_deadline,
        };
        let now = Instant::now();
        if !killed && now >= deadline {
            init.kill();
            killed = true;
            if started.is_some() {
                timed_out = true;
                ended = Some(now);
            } else {
                failure = Some(format!(
                    "the sandbox took longer than {}s to build",
                    BUILD_DEADLINE.as_secs()
                ));
            }
        }
        let wait_ms = if killed {
            -1
        } else {
            deadline
                .saturating_duration_since(now)
                .as_millis()
                .min(i32::MAX as u128) as i32
                + 1
        };
        let wait_ms = match (confined, started) {
            (false, Some(_)) if !(0..=CONFINE_WHEN_IDLE_MS).contains(&wait_ms) => {
                CONFINE_WHEN_IDLE_MS
            }
            _ => wait_ms,
        };
        let mut fds = [
            libc::pollfd {
                fd: rep_r,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            init.kill();
            break;
        }
        if n == 0 && !confined && started.is_some() {
            confined = true;
            if let Some(Err(e)) = filter.as_ref().map(EgressFilter::confined) {
                init.kill();
                killed = true;
                failure = Some(format!("the egress filter: {e}"));
                continue;
            }
            let mut signals = vec![init.pid];
            signals.extend(filter.as_ref().map(EgressFilter::pid));
            let c = relay_confinement(&plan.ids, ns_owner, signals);
            if let Err(e) = crate::relay::confine(&c) {
                init.kill();
                killed = true;
                failure = Some(e.to_string());
            }
            continue;
        }
        if fds[1].revents != 0 {
            match read_frame::<_, ToLauncher>(sock, MAX_LAUNCH_FRAME) {
                Ok(ToLauncher::Kill) => {
                    init.kill();
                    killed = true;
                    ended.get_or_insert_with(Instant::now);
                }
                Ok(_) => {
                    init.kill();
                    return Err(LaunchError::Unexpected("a message out of order"));
                }
                Err(e) => {
                    // The monitor is gone: nobody is left to report to.
                    init.kill();
                    log::warn!("launcher: {e}; killing the sandbox");
                    return Ok(());
                }
            }
        }
        if fds[0].revents != 0 {
            let mut chunk = [0u8; 4096];
            let n = sys::read_fd(rep_r, &mut chunk).unwrap_or(0);
            if n == 0 {
                break; // init is gone
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > MAX_REPORT {
                init.kill();
                failure = Some("the sandbox's init said too much".into());
                break;
            }
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                match parse_report(&line[..line.len() - 1]) {
                    Some(Report::Started) if started.is_none() => {
                        started = Some(Instant::now());
                        send(sock, &FromLauncher::Started)?;
                        if let Some(ch) = agent_fds.take() {
                            // A zygote has no overall deadline: the monitor ends it.
                            let rest = std::mem::take(&mut buf);
                            let script_owner = match plan.ids {
                                IdMap::Range {
                                    uid_base,
                                    gid_base,
                                    count,
                                    ..
                                } if count > 65534 => Some((uid_base + 65534, gid_base + 65534)),
                                IdMap::Range {
                                    uid_base, gid_base, ..
                                } => Some((uid_base, gid_base)),
                                IdMap::Single { .. } => None,
                            };
                            let ns = match sandbox_ns.take() {
                                Some(Ok(ns)) => ns,
                                Some(Err(e)) => {
                                    init.kill();
                                    return failed(
                                        sock,
                                        Phase::Start,
                                        format!("open the sandbox's namespaces: {e}"),
                                    );
                                }
                                None => {
                                    init.kill();
                                    return failed(
                                        sock,
                                        Phase::Start,
                                        "a zygote without its namespaces".into(),
                                    );
                                }
                            };
                            if let Some(Err(e)) = filter.as_ref().map(EgressFilter::confined) {
                                init.kill();
                                return failed(
                                    sock,
                                    Phase::Start,
                                    format!("the egress filter: {e}"),
                                );
                            }
                            let mut signals = vec![init.pid];
                            signals.extend(filter.as_ref().map(EgressFilter::pid));
                            let sandbox = zygote::Sandbox {
                                init_pid: init.pid,
                                ns,
                                scratch_bytes: plan.scratch_bytes,
                                script_owner,
                                scripts: plan.scripts,
                                confinement: relay_confinement(&plan.ids, ns_owner, signals),
                            };
                            return zygote::serve(sock, sandbox, rep_r, rest, ch);
                        }
                    }
                    Some(Report::Failed(why)) => failure = Some(why),
                    Some(Report::Status(s)) if started.is_some() => {
                        status = Some(s);
                        ended.get_or_insert_with(Instant::now);
                        // init exits right after this report: reap it now rather than
                        // wait to see its end of the pipe first.
                        break 'events;
                    }
                    _ => {
                        init.kill();
                        failure = Some("the sandbox's init broke its report protocol".into());
                    }
                }
            }
        }
    }
    let init_status = init.reap();
    // init is reaped only once every process of its pid namespace is gone: a killed
    // sandbox's time runs until then, teardown included, so a kill that is slow to land
    // shows in `wall_ms`.
    if killed {
        ended = Some(Instant::now());
    }
    if let Some(why) = failure {
        let phase = if started.is_some() {
            Phase::Run
        } else {
            Phase::Start
        };
        return failed(sock, phase, why);
    }
    let Some(t0) = started else {
        return failed(
            sock,
            Phase::Start,
            "the sandbox ended before its program started".into(),
        );
    };
    // The program's own status if init reported it; otherwise init's (killed with it).
    let s = status.or(init_status).unwrap_or(libc::SIGKILL);
    let (code, signal) = if libc::WIFSIGNALED(s) {
        (None, Some(libc::WTERMSIG(s)))
    } else {
        (Some(libc::WEXITSTATUS(s)), None)
    };
    let wall = ended
        .unwrap_or_else(Instant::now)
        .saturating_duration_since(t0);
    send(
        sock,
        &FromLauncher::Exited {
            code,
            signal,
            timed_out,
            wall_us: wall.as_micros() as u64,
        },
    )
}

// ---------------------------------------------------------------------------------------
// Inside the sandbox.

fn report(fd: RawFd, kind: &str, text: &str) {
    let clean: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .take(4000)
        .collect();
    let line = if clean.is_empty() {
        format!("{kind}\n")
    } else {
        format!("{kind} {clean}\n")
    };
    let _ = sys::write_fd(fd, line.as_bytes());
}

fn exit_now(code: libc::c_int) -> ! {
    // SAFETY: _exit ends the process without running the parent's atexit handlers.
    unsafe { libc::_exit(code) }
}

/// pid 1 of the sandbox. Never returns.
fn init_main(
    plan: &LaunchPlan,
    ctl: OwnedFd,
    rep_w: RawFd,
    agent_fds: Option<zygote::InnerFds>,
    handed: &[OwnedFd],
) -> ! {
    // If the launcher dies, so does the sandbox.
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // The launcher's first message carries the sandbox's cgroup files: join them before
    // anything else ("0" is the writer itself).
    let mut tag = [0u8; 1];
    let attach = match plumbing::fds::recv_with_fds(
        ctl.as_raw_fd(),
        &mut tag,
        usize::from(MAX_ATTACH_FILES),
    ) {
        Ok((1, fds)) if tag == *b"C" => fds,
        // The launcher gave up before the sandbox was placed.
        Ok((0, _)) => exit_now(1),
        Ok(_) => {
            report(rep_w, "F", "the launcher broke the init protocol");
            exit_now(1);
        }
        Err(e) => {
            report(rep_w, "F", &format!("receive the sandbox's cgroup: {e}"));
            exit_now(1);
        }
    };
    for fd in &attach {
        if let Err(e) = sys::write_fd(fd.as_raw_fd(), b"0") {
            report(rep_w, "F", &format!("join the sandbox's cgroup: {e}"));
            exit_now(1);
        }
    }
    drop(attach);
    report(rep_w, "P", "");
    // `M`: the id maps are written; build the sandbox meanwhile the monitor checks the
    // placement. Anything else (the launcher closing the socket) ends init.
    match plumbing::fds::recv_with_fds(ctl.as_raw_fd(), &mut tag, 0) {
        Ok((1, _)) if tag == *b"M" => {}
        _ => exit_now(1),
    }
    if let Err(e) = build(plan, agent_fds.map(|a| a.reg), handed) {
        report(rep_w, "F", &e.to_string());
        exit_now(1);
    }
    // Egress: listen on the rules' addresses inside the sandbox's network namespace (init
    // is in it now, still privileged there) and hand the listeners to the launcher, whose
    // egress filter relays from outside. `N` comes before the program exists.
    if let Some(rules) = &plan.egress {
        let listeners = match sys::egress_listeners(rules) {
            Ok(l) => l,
            Err(e) => {
                report(rep_w, "F", &format!("set up egress: {e}"));
                exit_now(1);
            }
        };
        let raw: Vec<RawFd> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
        if let Err(e) = plumbing::fds::send_with_fds(ctl.as_raw_fd(), b"N", &raw) {
            report(rep_w, "F", &format!("hand over the egress listeners: {e}"));
            exit_now(1);
        }
    }
    // `G`: the monitor found the sandbox in its cgroups. Anything else (the launcher
    // closing the socket) ends init.
    match plumbing::fds::recv_with_fds(ctl.as_raw_fd(), &mut tag, 0) {
        Ok((1, _)) if tag == *b"G" => {}
        _ => exit_now(1),
    }
    drop(ctl);
    let prepared = match finish(plan) {
        Ok(p) => p,
        Err(e) => {
            report(rep_w, "F", &e.to_string());
            exit_now(1);
        }
    };
    // The seccomp allowlist, last: init itself runs under it from here on, and the
    // program inherits it through the exec.
    if let Err(e) = seccomp::install(seccomp::sandbox_filter(plan.inotify)) {
        report(rep_w, "F", &format!("install the seccomp filter: {e}"));
        exit_now(1);
    }
    let child = match start_program(&prepared, agent_fds) {
        Ok(pid) => pid,
        Err(e) => {
            report(
                rep_w,
                "F",
                &format!("start {}: {e}", prepared.path.to_string_lossy()),
            );
            exit_now(1);
        }
    };
    report(rep_w, "S", "");
    loop {
        let mut status = 0;
        // SAFETY: waiting for any child of init (the program or an orphan it inherited).
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r == child {
            report(rep_w, "W", &status.to_string());
            exit_now(0);
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            exit_now(0);
        }
    }
}

/// What starting the program needs.
struct Prepared {
    path: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
}

/// Build the sandbox: init's ids, host name, loopback and root. This runs while the
/// monitor checks the cgroup placement; nothing of the program runs before that is done.
fn build(plan: &LaunchPlan, reg: Option<RawFd>, handed: &[OwnedFd]) -> Result<(), SetupError> {
    use crate::sys::step;
    // Become id 0 of the new user namespace (which holds no power over the host) and shed
    // every supplementary group the launcher had.
    // SAFETY: plain id-setting call.
    let r = unsafe { libc::setresgid(0, 0, 0) };
    step(check(r), || "become gid 0 in the sandbox".into())?;
    if matches!(plan.ids, IdMap::Range { .. }) {
        // SAFETY: an empty group list needs no buffer.
        let r = unsafe { libc::setgroups(0, std::ptr::null()) };
        step(check(r), || "drop supplementary groups".into())?;
    }
    // SAFETY: plain id-setting call.
    let r = unsafe { libc::setresuid(0, 0, 0) };
    step(check(r), || "become uid 0 in the sandbox".into())?;
    // Changing ids cleared the parent-death signal: arm it again.
    step(
        sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong),
        || "set the parent-death signal".into(),
    )?;
    // The network namespace (with its loopback up) is made on a helper thread while this
    // one builds the root: it is the slowest single step of a sandbox (the kernel registers
    // a namespace's sysctl tables and loopback device). This thread takes the namespace
    // below and waits for the thread's end before anything of the program runs; until
    // then init is only building.
    let mut net = step(sys::spawn_net_namespace(), || {
        "start the network namespace's thread".into()
    })?;
    // Through the host's /proc, which this mount namespace still sees.
    crate::harden::user_counters()?;
    let host = plan.hostname.as_bytes();
    // SAFETY: host is a valid byte slice for its length.
    let r = unsafe { libc::sethostname(host.as_ptr().cast(), host.len()) };
    step(check(r), || "set the host name".into())?;
    let sysctl_dir = rootfs::build(plan, handed)?;
    let ns = step(net.take(), || "create the network namespace".into())?;
    rootfs::detach_host(plan)?;
    if plan.scripts {
        if let Some(reg) = reg {
            hand_over_script_dir(reg)?;
        }
    }
    step(sys::enter_net_namespace(&ns), || {
        "enter the network namespace".into()
    })?;
    // Only now, from inside the namespace: `/proc/sys/net` shows the opener's.
    step(sys::small_tcp_buffers(&sysctl_dir), || {
        "set the sandbox's TCP buffer sizes".into()
    })?;
    drop(sysctl_dir);
    step(net.join(), || "end the network namespace's thread".into())
}

/// The last steps before the program, once the monitor has confirmed the cgroup
/// placement: the cgroup namespace, then every privilege dropped.
fn finish(plan: &LaunchPlan) -> Result<Prepared, SetupError> {
    use crate::sys::step;
    // Now that the monitor has placed us in our cgroups, make them our cgroup root.
    // SAFETY: unshare with a namespace flag only.
    let r = unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
    step(check(r), || "create the cgroup namespace".into())?;
    // Not dumpable: the program cannot open init's /proc entries or descriptors.
    step(sys::prctl(libc::PR_SET_DUMPABLE, 0), || {
        "make init undumpable".into()
    })?;
    harden::rlimits()?;
    harden::drop_privileges(kept_capabilities(plan))?;
    let writable: Vec<&str> = plan
        .mounts
        .iter()
        .filter(|m| m.rw)
        .map(|m| m.dst.as_str())
        .collect();
    harden::landlock(match plan.mode {
        Mode::OneShot => harden::Writes::Under(&writable),
        Mode::Zygote => harden::Writes::ByMounts,
    })?;

    let env: Vec<CString> = plan
        .env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let argv: Vec<CString> = plan
        .argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            sys::fail(
                "prepare the command",
                std::io::Error::other("argument contains a NUL byte"),
            )
        })?;
    let path_var = plan
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", |(_, v)| v.as_str());
    let path = resolve(&plan.argv[0], path_var).ok_or_else(|| {
        sys::fail(
            "command not found in the sandbox",
            std::io::Error::new(std::io::ErrorKind::NotFound, plan.argv[0].clone()),
        )
    })?;
    let path = sys::cstr(&path).map_err(|e| sys::fail("prepare the command", e))?;
    Ok(Prepared { path, argv, env })
}

/// A runtime pool's init hands its `/run/script` folder to the launcher (which writes the
/// scripts into it from outside) as the first message on the registration socket, before
/// anything untrusted runs in the sandbox: a writable mount of that tmpfs of the launcher's
/// own, detached from the tree, while the sandbox's own mount of it becomes read-only.
/// Nothing inside can then create, change, truncate or remove a script, nor change the
/// folder's mode (0311: it cannot be listed).
fn hand_over_script_dir(reg: RawFd) -> Result<(), SetupError> {
    let dir = Path::new("/run/script");
    let writable = sys::step(sys::open_tree_clone(dir), || {
        "clone the /run/script mount for the launcher".into()
    })?;
    sys::step(sys::mount_setattr(dir, sys::MOUNT_ATTR_RDONLY, 0), || {
        "make /run/script read-only".into()
    })?;
    plumbing::fds::send_with_fds(reg, b"scripts", &[writable.as_raw_fd()])
        .map(drop)
        .map_err(|e| sys::fail("hand /run/script to the launcher", e))
}

/// What the program keeps of init's capabilities: a zygote's agent needs some to isolate
/// its requests from each other (see `harden::Keep`).
fn kept_capabilities(plan: &LaunchPlan) -> harden::Keep {
    match (plan.mode, plan.request_ids) {
        (Mode::OneShot, _) => harden::Keep::Nothing,
        (Mode::Zygote, None) => harden::Keep::Agent,
        (Mode::Zygote, Some(_)) => harden::Keep::AgentWithIds,
    }
}

fn check(ret: libc::c_int) -> std::io::Result<()> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Open `path` read-only at a descriptor number of at least `min`, close-on-exec.
fn open_above(path: &std::ffi::CStr, min: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: open with a valid C string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    if fd.as_raw_fd() >= min {
        return Ok(fd);
    }
    plumbing::pipes::dup_above(&fd, min)
}

/// Find `cmd` the way a shell would, inside the sandbox's root.
fn resolve(cmd: &str, path_var: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if cmd.contains('/') {
        let p = Path::new(cmd).to_path_buf();
        return is_exec(&p).then_some(p);
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(cmd))
        .find(|p| is_exec(p))
}

/// Start the program: a new session (no controlling terminal, and no way to reach the
/// launcher's), nothing else open, every signal at its default (the launcher ignores
/// SIGPIPE, and ignored signals would otherwise survive exec) and none blocked.
///
/// A one-shot program's stdin and stdout are init's (the monitor's) and its stderr the
/// program's stderr pipe. A zygote's agent gets the sandbox's own `/dev/null` as stdin, the
/// diagnostics pipe the launcher reads as stdout and stderr, and its channels on fds 3 and
/// 4: none of its descriptors is a host file.
fn start_program(
    p: &Prepared,
    agent_fds: Option<zygote::InnerFds>,
) -> std::io::Result<libc::pid_t> {
    // Every source is above fd 4 until it is moved (the null device is opened there), so no
    // move clobbers a source not yet moved.
    let null = match agent_fds {
        Some(_) => Some(open_above(c"/dev/null", 5)?),
        None => None,
    };
    let (moves, close_from): (Vec<(RawFd, RawFd)>, RawFd) = match (agent_fds, &null) {
        (Some(a), Some(null)) => (
            vec![
                (null.as_raw_fd(), 0),
                (a.log, 1),
                (a.log, 2),
                (a.ctl, 3),
                (a.reg, 4),
            ],
            5,
        ),
        _ => (vec![(plumbing::role::PROGRAM_STDERR_FD, 2)], 3),
    };
    sys::spawn(&sys::Spawn {
        path: &p.path,
        argv: &p.argv,
        env: &p.env,
        moves: &moves,
        close_from,
    })
}
