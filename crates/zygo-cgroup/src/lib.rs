//! The cgroup tree: one interface, two kernels' worth of implementation, and a recording
//! fake for tests (feature `fake`).
//!
//! Zygo builds its tree under the cgroup it was started in (or under `$ZYGO_CGROUP`, a
//! subtree delegated to the user running it), never anywhere else. Every sandbox gets its
//! own cgroup with its limits written before anything runs in it; kill, freeze, the OOM
//! counter and the memory peak are read from the kernel, never inferred.
//!
//! cgroup v2 is used where its memory, pids and cpu controllers are available to us;
//! otherwise the v1 memory, pids, cpu, cpuacct and freezer hierarchies. Where neither can
//! enforce limits, sandboxes are refused with the steps to fix it.
//!
//! Beside a [`Cgroup`], which whoever made it keeps, a cgroup has a view ([`CgroupView`]):
//! the descriptors that freeze, thaw, weigh and read it and nothing else, which the maker
//! hands to the code that schedules calls.

pub mod disks;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod v1;
mod v2;
mod view;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub use v1::V1;
pub use v2::V2;
pub use view::{CgroupView, HandedView};

/// A cgroup's CPU weight among its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// The kernel's default: a request being served, a one-shot sandbox.
    Foreground,
    /// A quarter of that: work done ahead of requests.
    Background,
}

/// Limits written into a sandbox's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory in bytes; `None` is unlimited (only a sandbox.toml may ask for that).
    pub mem_bytes: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU.
    pub cpu_millis: u32,
    pub pids: u32,
    /// Bytes a second read from, and written to, each disk ([`disks::disks`]).
    pub io_bps: u64,
    /// Operations a second on each disk, reads and writes each.
    pub io_iops: u32,
}

impl Limits {
    /// v1 `cpu.shares` in the foreground: the kernel's default (1024) per CPU of
    /// bandwidth, so that a sandbox's share of a contended CPU follows its `--cpu` as its
    /// quota does (within the kernel's range, 2 to 262144).
    pub fn cpu_shares(&self) -> u64 {
        (u64::from(self.cpu_millis) * 1024 / 1000).clamp(2, 262_144)
    }

    /// v2 `cpu.weight` in the foreground: the default (100) per CPU, within 1 to 10000.
    pub fn cpu_weight(&self) -> u64 {
        (u64::from(self.cpu_millis) * 100 / 1000).clamp(1, 10_000)
    }
}

/// What the kernel counted for a cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub oom_kills: u64,
    pub peak_bytes: u64,
    pub cpu_usec: u64,
}

#[derive(Debug)]
pub enum CgroupError {
    /// No hierarchy we can use: limits cannot be enforced.
    Unavailable(String),
    /// We may not create cgroups where we are: the fix is a delegated subtree.
    NotDelegated { path: PathBuf, source: io::Error },
    /// The cgroup we were given cannot hold the sandboxes' cgroups as it is: why, and the
    /// command that fixes it on this host.
    Refused(String),
    Io {
        what: String,
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupError::Unavailable(why) => write!(
                f,
                "cannot enforce memory, cpu and pids limits: {why}; Zygo refuses to run sandboxes without limits"
            ),
            CgroupError::NotDelegated { path, source } => {
                write!(f, "cannot create cgroups under {} ({source}); ", path.display())?;
                f.write_str(&fix_steps(&Fix::Delegate))
            }
            CgroupError::Refused(why) => f.write_str(why),
            CgroupError::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for CgroupError {}

pub(crate) fn io_err(what: &str, path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io {
        what: what.to_string(),
        path: path.to_path_buf(),
        source,
    }
}

/// What a refusal asks the user to do.
#[derive(Debug, Clone)]
pub(crate) enum Fix {
    /// Give Zygo a cgroup subtree with the memory, pids and cpu controllers.
    Delegate,
    /// Start Zygo as the only process of the cgroup `base` (or move the others out).
    Alone { base: PathBuf },
    /// Start Zygo inside the cgroup `base`: it may not move itself there.
    StartInside { base: PathBuf },
}

pub(crate) fn refused(why: &str, fix: Fix) -> CgroupError {
    CgroupError::Refused(format!("{why}; {}", fix_steps(&fix)))
}

/// The exact steps to give the current user a cgroup subtree of their own (for `--help`
/// texts and messages).
pub fn delegation_steps() -> String {
    fix_steps(&Fix::Delegate)
}

/// The command line to suggest: `zygo <subcommand> …` as this process was started.
fn this_command() -> String {
    match std::env::args().nth(1) {
        Some(sub) if !sub.starts_with('-') && sub.len() < 32 => format!("zygo {sub} …"),
        _ => "zygo …".to_string(),
    }
}

/// Whether systemd is the init system (its documented test: `/run/systemd/system` exists).
fn under_systemd() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// The steps that fix a refusal on this host: cgroup v1 or v2, systemd or not, root or
/// not, and for the supervisor the shipped unit.
fn fix_steps(fix: &Fix) -> String {
    // SAFETY: getuid/getgid/getppid cannot fail.
    let (uid, gid, ppid) = unsafe { (libc::getuid(), libc::getgid(), libc::getppid()) };
    let user = std::env::var("USER")
        .ok()
        .filter(|u| {
            !u.is_empty()
                && u.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
        .unwrap_or_else(|| uid.to_string());
    let cmd = this_command();
    let supervisor = cmd.starts_with("zygo supervisor") || cmd.starts_with("zygo up");
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        // cgroup v1 (or hybrid): each controller is a hierarchy of its own.
        return if uid == 0 {
            "run Zygo as root in a cgroup where it may create children, or name one with \
             `export ZYGO_CGROUP=/zygo` after `for c in memory pids cpu cpuacct freezer; do mkdir -p \
             /sys/fs/cgroup/$c/zygo; done`"
                .to_string()
        } else {
            format!(
                "give this user a cgroup subtree, as root: `for c in memory pids cpu cpuacct freezer; do \
                 mkdir -p /sys/fs/cgroup/$c/zygo-{user} && chown -R {uid}:{gid} /sys/fs/cgroup/$c/zygo-{user}; done` \
                 and then `export ZYGO_CGROUP=/zygo-{user}`"
            )
        };
    }
    if under_systemd() {
        let unit = if uid == 0 {
            "contrib/zygo.service (it has Delegate=yes)"
        } else {
            "contrib/zygo-user.service under `systemctl --user` (it has Delegate=yes)"
        };
        let run = if uid == 0 {
            format!("`systemd-run --scope -p Delegate=yes {cmd}`")
        } else {
            format!(
                "`systemd-run --user --scope -p Delegate=yes {cmd}` (the user's systemd \
                 delegates only memory and pids unless, as root, `mkdir -p /etc/systemd/system/user@.service.d && \
                 printf '[Service]\\nDelegate=cpu cpuset io memory pids\\n' > /etc/systemd/system/user@.service.d/delegate.conf && \
                 systemctl daemon-reload`, then a new login; without a login session, `loginctl enable-linger {user}`)"
            )
        };
        let how = match fix {
            Fix::Delegate | Fix::StartInside { .. } if supervisor => {
                format!("run the supervisor as a service with Delegate=yes, e.g. {unit}, or {run}")
            }
            Fix::Delegate | Fix::StartInside { .. } => {
                format!("start Zygo in a cgroup systemd delegates to it: {run}; inside a unit, add Delegate=yes to it")
            }
            Fix::Alone { base } => format!(
                "start Zygo as the only process of its cgroup: {run}, or first move the other \
                 processes into a leaf (for this shell: `mkdir {b}/sh && echo $$ > {b}/sh/cgroup.procs`) \
                 and `export ZYGO_CGROUP={rel}`",
                b = base.display(),
                rel = relative_to_mount(base),
            ),
        };
        return how;
    }
    // cgroup v2 without systemd: the steps by hand.
    let base = match fix {
        Fix::Alone { base } | Fix::StartInside { base } => base.display().to_string(),
        Fix::Delegate if uid == 0 => "/sys/fs/cgroup/zygo".to_string(),
        Fix::Delegate => format!("/sys/fs/cgroup/zygo-{user}"),
    };
    let rel = relative_to_mount(Path::new(&base));
    if uid == 0 {
        format!(
            "make Zygo a cgroup and start it from a shell inside it: `mkdir -p {base}/sh && \
             echo '+memory +pids +cpu +io' > /sys/fs/cgroup/cgroup.subtree_control && \
             echo $$ > {base}/sh/cgroup.procs && export ZYGO_CGROUP={rel}`"
        )
    } else {
        format!(
            "as root, give this user a cgroup and put this shell (pid {ppid}) in it: `mkdir -p {base}/sh && \
             echo '+memory +pids +cpu +io' > /sys/fs/cgroup/cgroup.subtree_control && chown -R {uid}:{gid} {base} && \
             echo {ppid} > {base}/sh/cgroup.procs`; then, in this shell, `export ZYGO_CGROUP={rel}`"
        )
    }
}

/// A directory under `/sys/fs/cgroup` as a cgroup path (`/sys/fs/cgroup/a/b` → `/a/b`).
fn relative_to_mount(dir: &Path) -> String {
    match dir.strip_prefix("/sys/fs/cgroup") {
        Ok(rel) => format!("/{}", rel.display()),
        Err(_) => dir.display().to_string(),
    }
}

/// A cgroup Zygo created for one sandbox (or one request).
pub trait Cgroup: Send {
    /// For logs and messages.
    fn describe(&self) -> String;
    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError>;
    /// Move a process (host pid) into this cgroup.
    fn add_pid(&self, pid: i32) -> Result<(), CgroupError>;
    /// Move a process that is most likely single-threaded (host pid) into this cgroup. On
    /// v1 a process with one thread has it written to `tasks`, which does not wait on the
    /// global threadgroup lock (and its RCU grace period) that `cgroup.procs` does; one
    /// with more is moved whole through `cgroup.procs`.
    fn add_single_threaded(&self, pid: i32) -> Result<(), CgroupError> {
        self.add_pid(pid)
    }
    /// Files a process writes "0" to in order to join this cgroup itself (opened here, so
    /// the kernel checks our permission, not the writer's).
    fn attach_files(&self) -> Result<Vec<std::os::fd::OwnedFd>, CgroupError>;
    /// Whether a process (host pid) is in this cgroup.
    fn contains(&self, pid: i32) -> Result<bool, CgroupError>;
    fn usage(&self) -> Result<Usage, CgroupError>;
    fn freeze(&self) -> Result<(), CgroupError>;
    fn thaw(&self) -> Result<(), CgroupError>;
    /// Kill every process in the cgroup, including ones that are forking. Processes that
    /// are slow to die (held back by the CPU quota, which a killed process still needs to
    /// exit) get the quota lifted, so the kill takes milliseconds whatever the limits.
    fn kill_all(&self) -> Result<(), CgroupError>;
    /// Lift the CPU quota (and put the weight back to the default): done at a deadline,
    /// just before or after the kill, so that the dying processes are neither throttled
    /// nor starved while they exit. A cgroup whose quota was lifted is never recycled.
    fn lift_cpu_quota(&self) -> Result<(), CgroupError>;
    /// Whether any process is still in the cgroup.
    fn is_empty(&self) -> Result<bool, CgroupError>;
    /// Kill what is left and remove the cgroup.
    fn remove(self: Box<Self>) -> Result<(), CgroupError>;
    /// Its share of the CPU against its siblings when the CPUs are contended: a zygote's
    /// agent and its parked children (forking, setting up) run in the background, so that
    /// a request being served never waits behind them. The foreground weight is the one
    /// `set_limits` wrote (it follows the CPU bandwidth); the background one a quarter.
    fn set_weight(&self, w: Weight) -> Result<(), CgroupError>;
    /// Make an emptied cgroup ready for another process of the same function, as if new:
    /// its counters reset, what its last process left charged to it reclaimed, thawed.
    /// `Ok(false)` when it cannot be made so (then it is removed instead).
    fn recycle(&self) -> Result<bool, CgroupError> {
        Ok(false)
    }
    /// What may be done to it without privilege, as descriptors opened now (see
    /// [`CgroupView`]): for the code that schedules calls, which never needs more.
    fn view(&self) -> Result<Box<dyn CgroupView>, CgroupError>;
}

/// A cgroup just created, and nobody's yet: removed (whatever is in it killed) when dropped,
/// unless [`Fresh::keep`] hands it on. Every cgroup Zygo creates starts as one, so no error
/// between its creation and its owner taking it (limits refused, a process that exited
/// before it could be placed, ...) leaves it behind.
pub struct Fresh(Option<Box<dyn Cgroup>>);

impl Fresh {
    /// Hand the cgroup on: its new owner removes it.
    pub fn keep(mut self) -> Box<dyn Cgroup> {
        match self.0.take() {
            Some(cg) => cg,
            // `keep` takes `self`, and only it and `drop` empty the option.
            None => unreachable!("a Fresh cgroup is kept once"),
        }
    }
}

impl std::ops::Deref for Fresh {
    type Target = dyn Cgroup;
    fn deref(&self) -> &(dyn Cgroup + 'static) {
        match &self.0 {
            Some(cg) => cg.as_ref(),
            None => unreachable!("a kept Fresh cgroup is never used again"),
        }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let Some(cg) = self.0.take() {
            let what = cg.describe();
            if let Err(e) = cg.remove() {
                log::warn!("remove the unused cgroup {what}: {e}");
            }
        }
    }
}

/// The backend chosen at start-up.
pub enum Backend {
    V1(V1),
    V2(V2),
}

impl Backend {
    /// Pick the backend this host supports, rooted at our own cgroup or `$ZYGO_CGROUP`.
    pub fn detect() -> Result<Backend, CgroupError> {
        let own = read_own_cgroups()?;
        let base_override = std::env::var("ZYGO_CGROUP").ok().filter(|s| !s.is_empty());
        let mounts = read_mounts()?;
        if let Some(v2) = V2::probe(&own, base_override.as_deref(), &mounts)? {
            return Ok(Backend::V2(v2));
        }
        if let Some(v1) = V1::probe(&own, base_override.as_deref(), &mounts)? {
            return Ok(Backend::V1(v1));
        }
        Err(CgroupError::Unavailable(format!(
            "no cgroup v2 hierarchy with the memory, pids and cpu controllers, and no cgroup v1 \
             memory, pids, cpu, cpuacct and freezer hierarchies are mounted; {}",
            fix_steps(&Fix::Delegate)
        )))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::V1(_) => "v1",
            Backend::V2(_) => "v2",
        }
    }

    /// Where Zygo's tree lives (for `zygo version` and logs).
    pub fn root(&self) -> String {
        match self {
            Backend::V1(b) => b.root(),
            Backend::V2(b) => b.root(),
        }
    }

    /// Remove the cgroups of one-shot sandboxes whose monitor is gone (a `zygo run` that was
    /// killed with SIGKILL cannot clean up after itself): `run-<pid>-...` where no process
    /// `<pid>` exists. A cgroup that still holds processes is left alone (rmdir refuses).
    ///
    /// The caller's own sandbox cgroup is expected to be there: the directories are only
    /// listed when some hierarchy's root holds more than that one (a cgroup directory's
    /// link count is two plus its subdirectories), which is rare, so a run pays one `statx`
    /// per hierarchy.
    pub fn sweep_stale_runs(&self) {
        if self
            .roots()
            .iter()
            .all(|r| subdirectory_count(r).is_some_and(|n| n <= 1))
        {
            return;
        }
        let names = self.child_names_of("");
        for name in names {
            let Some(pid) = name
                .strip_prefix("run-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if process_alive(pid) {
                continue;
            }
            log::info!("removing the cgroup {name} left by a monitor that is gone");
            self.prune(&name);
        }
    }

    /// Remove Zygo's root in each hierarchy if it is empty, as a Zygo process leaves: the
    /// kernel refuses while another Zygo process has cgroups there (nothing is removed
    /// then), and whoever next needs the root makes it again, with the tree's weight.
    pub fn release_root(&self) {
        for r in self.roots() {
            let _ = std::fs::remove_dir(r);
        }
    }

    /// The root directory of Zygo's tree in each hierarchy.
    fn roots(&self) -> Vec<&Path> {
        match self {
            Backend::V1(b) => b.roots().collect(),
            Backend::V2(b) => vec![b.root_dir()],
        }
    }

    /// The names of the directories under `<root>/<rel>`.
    pub fn child_names_of(&self, rel: &str) -> Vec<String> {
        match self {
            Backend::V1(b) => b.child_names_in(rel),
            Backend::V2(b) => b.child_names_in(rel),
        }
    }

    /// An existing cgroup of Zygo's tree, to kill and remove.
    pub fn open(&self, rel: &str) -> Option<Box<dyn Cgroup>> {
        match self {
            Backend::V1(b) => b.open(rel).map(|c| Box::new(c) as Box<dyn Cgroup>),
            Backend::V2(b) => b.open(rel).map(|c| Box::new(c) as Box<dyn Cgroup>),
        }
    }

    /// Remove an intermediate directory of Zygo's tree if it is empty; whether it is gone.
    pub fn prune(&self, rel: &str) -> bool {
        match self {
            Backend::V1(b) => b.prune(rel),
            Backend::V2(b) => b.prune(rel),
        }
    }

    /// Create `<root>/<name>` (parents as needed) with no limits yet. Fails if it exists.
    /// It is removed again if dropped before [`Fresh::keep`].
    pub fn create(&self, name: &str) -> Result<Fresh, CgroupError> {
        let cg: Box<dyn Cgroup> = again_if_root_went(|| match self {
            Backend::V1(b) => b.create(name).map(|c| Box::new(c) as Box<dyn Cgroup>),
            Backend::V2(b) => b.create(name).map(|c| Box::new(c) as Box<dyn Cgroup>),
        })?;
        Ok(Fresh(Some(cg)))
    }

    /// A memory ceiling on `<root>/<dir>`, a folder that holds the cgroups of one function
    /// (made if missing): what its zygotes and requests hold together, whatever any of them
    /// leaves charged behind, cannot pass it. `None` lifts it.
    pub fn set_ceiling(&self, dir: &str, mem_bytes: Option<u64>) -> Result<(), CgroupError> {
        again_if_root_went(|| match self {
            Backend::V1(b) => b.set_ceiling(dir, mem_bytes),
            Backend::V2(b) => b.set_ceiling(dir, mem_bytes),
        })
    }
}

/// Run `make` (which makes a cgroup, and Zygo's root first if it is missing) again when a
/// directory on its way vanished meanwhile: another Zygo process leaving removes the root
/// as soon as it is empty ([`Backend::release_root`]), which can fall between making the
/// root and making a cgroup in it. Each try either leaves its cgroup in the root (which
/// then cannot be removed) or nothing, so a few tries settle any such race.
pub(crate) fn again_if_root_went<T>(
    mut make: impl FnMut() -> Result<T, CgroupError>,
) -> Result<T, CgroupError> {
    const TRIES: u32 = 8;
    let mut tried = 1;
    loop {
        match make() {
            Err(CgroupError::Io { source, .. })
                if source.kind() == io::ErrorKind::NotFound && tried < TRIES =>
            {
                tried += 1;
            }
            done => return done,
        }
    }
}

/// How many threads a process has, from `/proc/<pid>/task`'s link count (procfs keeps it
/// at two plus the threads); `None` when it cannot be read (the process is gone).
pub fn thread_count(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/task"))
        .ok()
        .map(|m| m.nlink().saturating_sub(2))
}

/// Whether a process (in our pid namespace) exists and has not exited: a zombie waiting
/// for its parent to reap it is gone for our purposes.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(") ")
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// `/proc/self/cgroup`: (hierarchy id, controllers, path).
pub(crate) struct OwnCgroup {
    pub controllers: Vec<String>,
    pub path: String,
}

/// The CPU weight of Zygo's whole tree (its `zygo` root) against the processes beside it,
/// as a fraction of the kernel's default (1/4: v1 `cpu.shares` 256 of 1024, v2
/// `cpu.weight` 25 of 100). A sandbox's own weight, which follows `--cpu`, only divides
/// what the tree gets among sandboxes; it is the tree that meets the host's own processes
/// (and, under systemd, the service's other cgroups, such as the supervisor's leaf). At the
/// default weight a many-threaded sandbox between its quota's throttles would take half a
/// host process's CPU; at a quarter, a fifth. Sandboxes still get all the CPU their quotas
/// allow when nothing else wants it.
pub const TREE_WEIGHT_QUARTERS: u64 = 1;

/// Set a weight file of Zygo's root to `want` unless it holds that already (one read on
/// every start; a write only the first time, or after an older Zygo left the default).
/// Failing only costs fairness: logged, not refused.
pub(crate) fn ensure_tree_weight(file: &Path, want: u64) {
    let have = read_file(file)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    if have == Some(want) {
        return;
    }
    if let Err(e) = std::fs::write(file, want.to_string()) {
        log::debug!("set {} to {want}: {e}", file.display());
    }
}

/// Whether this host's cgroup v2 hierarchy could hold Zygo's tree, from
/// `/proc/self/cgroup` alone: not when memory, pids or cpu is bound to a v1 hierarchy (a
/// controller lives in one hierarchy at a time, and the v2 backend needs all three). Only
/// where it could must Zygo enter its tree before it starts any process (`V2::probe` may
/// move it into a leaf, which works only while it is alone); finding a v1 tree moves
/// nothing, so it may overlap a launcher's start. When the file cannot be read, the
/// answer is yes: the careful order.
pub fn v2_possible() -> bool {
    match read_file(Path::new("/proc/self/cgroup")) {
        Ok(text) => v2_possible_from(&parse_own_cgroups(&text)),
        Err(_) => true,
    }
}

fn v2_possible_from(own: &[OwnCgroup]) -> bool {
    !own.iter().any(|c| {
        c.controllers
            .iter()
            .any(|n| matches!(n.as_str(), "memory" | "pids" | "cpu"))
    })
}

fn read_own_cgroups() -> Result<Vec<OwnCgroup>, CgroupError> {
    let text = read_file(Path::new("/proc/self/cgroup"))?;
    Ok(parse_own_cgroups(&text))
}

fn parse_own_cgroups(text: &str) -> Vec<OwnCgroup> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let _id = it.next()?;
            let ctrls = it.next()?;
            let path = it.next()?;
            Some(OwnCgroup {
                controllers: ctrls
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// A cgroup filesystem mount: (mount point, fs type, super options).
pub(crate) struct CgroupMount {
    pub point: PathBuf,
    pub v2: bool,
    pub options: Vec<String>,
}

fn read_mounts() -> Result<Vec<CgroupMount>, CgroupError> {
    let text = read_file(Path::new("/proc/self/mountinfo"))?;
    let mut out = Vec::new();
    for line in text.lines() {
        // id parent maj:min root point opts [optional...] - fstype source superopts
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or("");
        let _src = r.next();
        let superopts = r.next().unwrap_or("");
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        out.push(CgroupMount {
            point: PathBuf::from(point.replace("\\040", " ")),
            v2: fstype == "cgroup2",
            options: superopts.split(',').map(str::to_string).collect(),
        });
    }
    Ok(out)
}

/// Where Zygo's tree goes in one hierarchy: `$ZYGO_CGROUP` when absolute, our own cgroup
/// joined with it when relative, or our own cgroup.
pub(crate) fn base_path(own: &str, base_override: Option<&str>) -> String {
    match base_override {
        Some(b) if b.starts_with('/') => b.to_string(),
        Some(b) => format!("{}/{}", own.trim_end_matches('/'), b.trim_matches('/')),
        None => own.to_string(),
    }
}

/// How many subdirectories a cgroup directory has, from its link count (cgroupfs keeps it
/// at two plus the number of subdirectories); `None` if it cannot be read.
fn subdirectory_count(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir)
        .ok()
        .map(|m| m.nlink().saturating_sub(2))
}

/// The names of the directories in `dir` (none when it cannot be read).
pub(crate) fn subdirectories(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Join a cgroup path (absolute within its hierarchy) onto a mount point.
pub(crate) fn join(mount: &Path, cg: &str) -> PathBuf {
    let rel = cg.trim_start_matches('/');
    if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    }
}

pub(crate) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|e| io_err(&format!("write {value:?} to"), path, e))
}

/// Read a procfs or cgroupfs file whole. These report a size of 0, so a plain
/// `read_to_string` starts from a 32-byte buffer and doubles it, one read per step;
/// starting from a page-sized one, most files take two reads.
pub(crate) fn read_file(path: &Path) -> Result<String, CgroupError> {
    use std::io::Read;
    let mut text = String::with_capacity(8192);
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|e| io_err("read", path, e))?;
    Ok(text)
}

/// Make the directory that holds Zygo's cgroups; a permission error means no delegation.
pub(crate) fn ensure_dir(path: &Path) -> Result<(), CgroupError> {
    let not_delegated = |source| CgroupError::NotDelegated {
        path: path.to_path_buf(),
        source,
    };
    // Another Zygo process leaving may remove the directory between our finding it there
    // and checking it (see `Backend::release_root`): then it is made again.
    let mut tries = 0;
    loop {
        tries += 1;
        return match std::fs::create_dir(path) {
            Ok(()) => Ok(()),
            // It exists; we must also be allowed to create children in it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match access_w(path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 8 => continue,
                Err(e) => Err(not_delegated(e)),
            },
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)
                ) =>
            {
                Err(not_delegated(e))
            }
            Err(e) => Err(io_err("create", path, e)),
        };
    }
}

pub(crate) fn access_w(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a valid C string.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Remove a cgroup directory, waiting briefly for exiting tasks to leave it.
pub(crate) fn rmdir_retry(path: &Path) -> Result<(), CgroupError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => return Err(io_err("remove", path, e)),
        }
    }
}

/// Parse `cgroup.procs`.
pub(crate) fn procs(path: &Path) -> Result<Vec<i32>, CgroupError> {
    Ok(read_file(path)?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

pub(crate) fn open_write(path: &Path) -> Result<std::os::fd::OwnedFd, CgroupError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map(std::os::fd::OwnedFd::from)
        .map_err(|e| io_err("open", path, e))
}

/// SIGKILL every process `listed` says is in a cgroup of Zygo's tree. A pid is held
/// through a pidfd and killed only if the cgroup still lists it after that: a listed
/// process that exited meanwhile may have left its pid to an unrelated one.
pub(crate) fn kill_listed(
    listed: &dyn Fn() -> Result<Vec<i32>, CgroupError>,
) -> Result<(), CgroupError> {
    let mut held: Vec<(i32, std::os::fd::OwnedFd)> = Vec::new();
    for pid in listed()? {
        if let Ok(fd) = plumbing::sys::pidfd_open(pid) {
            held.push((pid, fd));
        }
    }
    if held.is_empty() {
        return Ok(());
    }
    let still = listed()?;
    for (pid, fd) in &held {
        if still.contains(pid) {
            use std::os::fd::AsRawFd;
            // SAFETY: pidfd_send_signal(2) on a pidfd we hold, no siginfo, no flags.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod weight_tests {
    use super::Limits;

    fn at(cpu_millis: u32) -> Limits {
        Limits {
            mem_bytes: None,
            cpu_millis,
            pids: 64,
            io_bps: 1 << 27,
            io_iops: 4000,
        }
    }

    #[test]
    fn the_weight_follows_the_cpu_bandwidth() {
        assert_eq!(at(1000).cpu_shares(), 1024);
        assert_eq!(at(1000).cpu_weight(), 100);
        assert_eq!(at(500).cpu_shares(), 512);
        assert_eq!(at(500).cpu_weight(), 50);
        assert_eq!(at(2000).cpu_shares(), 2048);
        assert_eq!(at(2000).cpu_weight(), 200);
        // Within the kernel's ranges at both ends.
        assert_eq!(at(1).cpu_shares(), 2);
        assert_eq!(at(1).cpu_weight(), 1);
        assert_eq!(at(u32::MAX).cpu_shares(), 262_144);
        assert_eq!(at(u32::MAX).cpu_weight(), 10_000);
    }
}

#[cfg(test)]
mod tree_weight_tests {
    use super::ensure_tree_weight;

    #[test]
    fn the_trees_weight_is_written_once_and_left_when_right() {
        let dir = std::env::temp_dir().join(format!("zygo-tree-weight-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let f = dir.join("cpu.shares");
        std::fs::write(&f, "1024\n").expect("the default");
        ensure_tree_weight(&f, 256);
        assert_eq!(std::fs::read_to_string(&f).expect("read"), "256");
        // Right already: left as it is (a read only).
        std::fs::write(&f, "256\n").expect("write");
        ensure_tree_weight(&f, 256);
        assert_eq!(std::fs::read_to_string(&f).expect("read"), "256\n");
        // No such file (no cpu controller there): nothing, no panic.
        ensure_tree_weight(&dir.join("missing").join("cpu.weight"), 25);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod entry_tests {
    use super::{parse_own_cgroups, v2_possible_from};

    #[test]
    fn v2_is_possible_only_where_no_needed_controller_is_bound_to_v1() {
        // A pure v2 host (systemd's default), and v2 with v1 hierarchies of other
        // controllers beside it.
        assert!(v2_possible_from(&parse_own_cgroups(
            "0::/user.slice/x.scope\n"
        )));
        assert!(v2_possible_from(&parse_own_cgroups(
            "2:name=systemd:/\n1:devices:/\n0::/a\n"
        )));
        // Hybrid (memory, pids and cpu on v1) and plain v1: the v2 backend cannot be chosen.
        assert!(!v2_possible_from(&parse_own_cgroups(
            "9:name=systemd:/\n8:pids:/\n4:memory:/x\n1:cpu,cpuacct:/\n0::/\n"
        )));
        assert!(!v2_possible_from(&parse_own_cgroups("3:cpu,cpuacct:/\n")));
        // This machine's own file parses whatever it says.
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let _ = v2_possible_from(&parse_own_cgroups(&text));
    }
}
