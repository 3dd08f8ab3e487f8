//! cgroup v1: one directory per controller (memory, pids, cpu, cpuacct, freezer), created
//! side by side under the same relative path in each hierarchy.
//!
//! v1 has no `cgroup.kill`: a tree is killed by freezing it (so nothing can fork or exit
//! while we look), SIGKILLing every task listed, then thawing so the kills are delivered.

use std::cell::{Cell, OnceCell, RefCell};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{
    ensure_dir, io_err, join, kill_listed, rmdir_retry, Cgroup, CgroupError, CgroupMount,
    CgroupView, HandedView, Limits, OwnCgroup, Usage, Weight,
};

const CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// Zygo's tree in each v1 hierarchy: `<mount>/<base>/zygo`.
pub struct V1 {
    /// Per controller in CONTROLLERS order: the directory holding Zygo's cgroups.
    roots: [PathBuf; 5],
    /// Whether the kernel accounts swap (`memory.memsw.*` files exist).
    memsw: bool,
    /// Zygo's root in the blkio hierarchy, where I/O limits are written: used when it is
    /// mounted and ours to use (an unprivileged user is often given only the five above,
    /// and then sandboxes run without I/O limits; see `io_limited`).
    blkio: Option<PathBuf>,
}

impl V1 {
    pub(crate) fn probe(
        own: &[OwnCgroup],
        base_override: Option<&str>,
        mounts: &[CgroupMount],
    ) -> Result<Option<V1>, CgroupError> {
        let mut roots: Vec<PathBuf> = Vec::new();
        for ctrl in CONTROLLERS {
            let Some(m) = mounts
                .iter()
                .find(|m| !m.v2 && m.options.iter().any(|o| o == ctrl))
            else {
                return Ok(None);
            };
            let Some(own_path) = own
                .iter()
                .find(|o| o.controllers.iter().any(|c| c == ctrl))
                .map(|o| o.path.as_str())
            else {
                return Ok(None);
            };
            let base = super::base_path(own_path, base_override);
            let base_dir = join(&m.point, &base);
            let root = base_dir.join("zygo");
            // The usual case, in one system call: Zygo's root is there and ours to use.
            if super::access_w(&root).is_ok() {
                roots.push(root);
                continue;
            }
            if !base_dir.is_dir() {
                return Err(CgroupError::NotDelegated {
                    path: base_dir,
                    source: std::io::Error::from_raw_os_error(libc::ENOENT),
                });
            }
            ensure_dir(&root)?;
            roots.push(root);
        }
        let roots: [PathBuf; 5] = roots
            .try_into()
            .map_err(|_| CgroupError::Unavailable("v1 controllers missing".into()))?;
        super::ensure_tree_weight(
            &roots[CPU].join("cpu.shares"),
            DEFAULT_SHARES * super::TREE_WEIGHT_QUARTERS / 4,
        );
        let memsw = roots[0].join("memory.memsw.limit_in_bytes").exists();
        let blkio = blkio_root(own, base_override, mounts);
        Ok(Some(V1 {
            roots,
            memsw,
            blkio,
        }))
    }

    /// Whether sandboxes get I/O limits (the blkio hierarchy is ours to use).
    pub fn io_limited(&self) -> bool {
        self.blkio.is_some()
    }

    pub fn root(&self) -> String {
        self.roots[0].display().to_string()
    }

    /// The names under `rel` in any hierarchy: a supervisor killed while it was creating a
    /// cgroup leaves it in the first few hierarchies only, and those must be found too.
    /// Zygo's root in each hierarchy.
    pub fn roots(&self) -> impl Iterator<Item = &Path> {
        self.roots
            .iter()
            .chain(self.blkio.as_ref())
            .map(PathBuf::as_path)
    }

    pub fn child_names_in(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .roots()
            .flat_map(|r| super::subdirectories(&super::join(r, rel)))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// An existing cgroup, present in every hierarchy.
    pub fn open(&self, rel: &str) -> Option<V1Cgroup> {
        let dirs: Vec<PathBuf> = self.roots.iter().map(|r| r.join(rel)).collect();
        if !dirs.iter().all(|d| d.is_dir()) {
            // Partly removed already: finish the job on what is there.
            for d in dirs.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
            return None;
        }
        let dirs: [PathBuf; 5] = dirs.try_into().ok()?;
        let blkio = self
            .blkio
            .as_ref()
            .map(|r| r.join(rel))
            .filter(|d| d.is_dir());
        V1Cgroup::new(dirs, self.memsw, blkio).ok()
    }

    /// Remove an (empty) intermediate directory of Zygo's tree in every hierarchy; whether
    /// it is gone from all of them.
    pub fn prune(&self, rel: &str) -> bool {
        if let Some(b) = &self.blkio {
            let _ = std::fs::remove_dir(b.join(rel));
        }
        for r in self.roots.iter().rev() {
            let _ = std::fs::remove_dir(r.join(rel));
        }
        !self.roots().any(|r| r.join(rel).exists())
    }

    /// See `Backend::set_ceiling`. The folder is made in every hierarchy (as `create` makes
    /// parents), the ceiling written in the memory one.
    pub fn set_ceiling(&self, rel: &str, mem_bytes: Option<u64>) -> Result<(), CgroupError> {
        // Zygo's root may be gone (see `Backend::release_root`): made again with its weight.
        let root_gone = !self.roots[CPU].is_dir();
        for r in &self.roots {
            let d = r.join(rel);
            std::fs::create_dir_all(&d).map_err(|e| io_err("create cgroup", &d, e))?;
        }
        if root_gone {
            super::ensure_tree_weight(
                &self.roots[CPU].join("cpu.shares"),
                DEFAULT_SHARES * super::TREE_WEIGHT_QUARTERS / 4,
            );
        }
        if let Some(b) = &self.blkio {
            // Where the function's cgroups go; without it they get no I/O limits.
            let _ = std::fs::create_dir_all(b.join(rel));
        }
        let mem = self.roots[MEMORY].join(rel);
        let value = mem_bytes.map_or("-1".to_string(), |b| b.to_string());
        let write = |file: &str| {
            let p = mem.join(file);
            std::fs::write(&p, &value).map_err(|e| io_err(&format!("write {value:?} to"), &p, e))
        };
        // The kernel keeps memory ≤ memory+swap: raising both, memory+swap goes first.
        match write("memory.limit_in_bytes") {
            Ok(()) if self.memsw => write("memory.memsw.limit_in_bytes"),
            Ok(()) => Ok(()),
            Err(CgroupError::Io { source, .. })
                if self.memsw && source.raw_os_error() == Some(libc::EINVAL) =>
            {
                write("memory.memsw.limit_in_bytes")?;
                write("memory.limit_in_bytes")
            }
            Err(e) => Err(e),
        }
    }

    pub fn create(&self, name: &str) -> Result<V1Cgroup, CgroupError> {
        let dirs: Vec<PathBuf> = self.roots.iter().map(|r| r.join(name)).collect();
        let mut made: Vec<PathBuf> = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            // Parents are made only when missing: most cgroups go straight under one.
            let mut made_dir = std::fs::create_dir(d);
            if matches!(&made_dir, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
                // Zygo's root itself may be gone (the last Zygo process that used it removed
                // it as it left): made again, with the tree's weight.
                let root_gone = !self.roots[i].is_dir();
                if let Some(parent) = d.parent() {
                    if let Err(e) = std::fs::create_dir_all(parent) {
                        for m in made.iter().rev() {
                            let _ = std::fs::remove_dir(m);
                        }
                        return Err(io_err("create cgroup", parent, e));
                    }
                }
                if root_gone && i == CPU {
                    super::ensure_tree_weight(
                        &self.roots[CPU].join("cpu.shares"),
                        DEFAULT_SHARES * super::TREE_WEIGHT_QUARTERS / 4,
                    );
                }
                made_dir = std::fs::create_dir(d);
            }
            if let Err(e) = made_dir {
                for m in made.iter().rev() {
                    let _ = std::fs::remove_dir(m);
                }
                return Err(io_err("create cgroup", d, e));
            }
            made.push(d.clone());
        }
        let dirs: [PathBuf; 5] = dirs
            .try_into()
            .map_err(|_| CgroupError::Unavailable("v1 controllers missing".into()))?;
        let blkio = self.blkio.as_ref().and_then(|r| {
            let d = r.join(name);
            let mut made = std::fs::create_dir(&d);
            if matches!(&made, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
                if let Some(parent) = d.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                made = std::fs::create_dir(&d);
            }
            match made {
                Ok(()) => Some(d),
                Err(e) => {
                    log::warn!("no I/O limits for {name}: create {}: {e}", d.display());
                    None
                }
            }
        });
        let cg = V1Cgroup::new(dirs, self.memsw, blkio.clone());
        if cg.is_err() {
            if let Some(b) = &blkio {
                let _ = std::fs::remove_dir(b);
            }
            for m in made.iter().rev() {
                let _ = std::fs::remove_dir(m);
            }
        }
        cg
    }
}

/// Zygo's root in the blkio hierarchy (made if missing), if that is mounted and ours to
/// use; `None` otherwise.
fn blkio_root(
    own: &[OwnCgroup],
    base_override: Option<&str>,
    mounts: &[CgroupMount],
) -> Option<PathBuf> {
    let m = mounts
        .iter()
        .find(|m| !m.v2 && m.options.iter().any(|o| o == "blkio"))?;
    let own_path = own
        .iter()
        .find(|o| o.controllers.iter().any(|c| c == "blkio"))?;
    let base = super::base_path(&own_path.path, base_override);
    let root = join(&m.point, &base).join("zygo");
    if super::access_w(&root).is_ok() {
        return Some(root);
    }
    match ensure_dir(&root) {
        Ok(()) => Some(root),
        Err(e) => {
            log::debug!("no I/O limits: {e}");
            None
        }
    }
}

/// The most a recycled cgroup may still have charged to it in pages (its next request's
/// peak counts them).
const RECYCLE_MAX_CHARGED: u64 = 64 << 10;

/// Indexes into a cgroup's directories, in CONTROLLERS order.
const MEMORY: usize = 0;
const PIDS: usize = 1;
const CPU: usize = 2;
const CPUACCT: usize = 3;
const FREEZER: usize = 4;

/// One sandbox's cgroup in every v1 hierarchy. Its files are opened relative to a
/// descriptor of each directory, held for the cgroup's life: a cgroup serves many
/// requests, and each would otherwise look up every long path again.
pub struct V1Cgroup {
    dirs: [PathBuf; 5],
    dirfds: [OwnedFd; 5],
    memsw: bool,
    /// The three files `usage` reads when a request is answered, opened on first use and
    /// read again from the start each time (None: they could not all be opened).
    counters: OnceCell<Option<[File; 3]>>,
    /// The other files a reused cgroup touches for every request (`HELD`), opened once.
    held: RefCell<Vec<(usize, &'static str, libc::c_int, File)>>,
    /// Its CPU quota was lifted to let a kill finish: it is not reused.
    quota_lifted: Cell<bool>,
    /// `cpu.shares` in the foreground, as `set_limits` wrote it.
    shares: Cell<u64>,
    /// Its directory in the blkio hierarchy, if I/O limits are used.
    blkio: Option<PathBuf>,
    /// That directory, held (`O_PATH`) from the cgroup's creation: its `tasks` is opened
    /// relative to it, never by its path again.
    blkio_dirfd: Option<OwnedFd>,
    /// That directory's `tasks`, opened on first use and held, as `HELD` files are: a
    /// reused cgroup takes every request's process into it.
    blkio_tasks: OnceCell<File>,
}

/// Files read or written for every request a reused cgroup serves: kept open after first
/// use rather than opened and closed each time (cgroupfs opens are not cheap). Each read
/// starts at offset 0 and each write is a whole value, so a held file behaves as a fresh one.
/// Never `cgroup.procs`: v1 caches the pid list it reads per open file for a second, so a
/// held descriptor would keep listing processes that are gone.
const HELD: [&str; 7] = [
    "tasks",
    "cpu.shares",
    "freezer.state",
    "memory.stat",
    "memory.max_usage_in_bytes",
    "memory.memsw.max_usage_in_bytes",
    "cpuacct.usage",
];

/// v1 caps a sandbox's TCP buffers at this fraction of its memory limit...
const V1_TCP_SHARE: u64 = 4;
/// ...but never below this.
const V1_TCP_MIN: u64 = 1 << 20;

/// The kernel's `cpu.shares` for a new cgroup.
const DEFAULT_SHARES: u64 = 1024;

/// What `usage` reads, in the order of `V1Cgroup::counters`.
const COUNTERS: [(usize, &str); 3] = [
    (MEMORY, "memory.oom_control"),
    (MEMORY, "memory.max_usage_in_bytes"),
    (CPUACCT, "cpuacct.usage"),
];

impl V1Cgroup {
    fn new(
        dirs: [PathBuf; 5],
        memsw: bool,
        blkio: Option<PathBuf>,
    ) -> Result<V1Cgroup, CgroupError> {
        let mut fds = Vec::with_capacity(5);
        for d in &dirs {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(d)
                .map_err(|e| io_err("open", d, e))?;
            fds.push(OwnedFd::from(f));
        }
        let dirfds: [OwnedFd; 5] = fds
            .try_into()
            .map_err(|_| CgroupError::Unavailable("v1 controllers missing".into()))?;
        let blkio_dirfd = match &blkio {
            Some(d) => Some(OwnedFd::from(
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                    .open(d)
                    .map_err(|e| io_err("open", d, e))?,
            )),
            None => None,
        };
        Ok(V1Cgroup {
            dirs,
            dirfds,
            memsw,
            counters: OnceCell::new(),
            held: RefCell::new(Vec::new()),
            quota_lifted: Cell::new(false),
            shares: Cell::new(DEFAULT_SHARES),
            blkio,
            blkio_dirfd,
            blkio_tasks: OnceCell::new(),
        })
    }

    /// Move the (single-threaded) process `pid` into `dir`, this cgroup's blkio directory,
    /// through its held `tasks` file.
    fn blkio_add_task(&self, dir: &Path, pid: &str) -> Result<(), CgroupError> {
        use std::os::unix::fs::FileExt;
        let path = dir.join("tasks");
        let file = match self.blkio_tasks.get() {
            Some(f) => f,
            None => {
                let Some(held) = &self.blkio_dirfd else {
                    return Err(io_err(
                        "open",
                        &path,
                        std::io::Error::from_raw_os_error(libc::EBADF),
                    ));
                };
                // SAFETY: openat on a directory descriptor we own, with a NUL-terminated name.
                let fd = unsafe {
                    libc::openat(
                        held.as_raw_fd(),
                        c"tasks".as_ptr(),
                        libc::O_WRONLY | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    return Err(io_err("open", &path, std::io::Error::last_os_error()));
                }
                // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
                let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                self.blkio_tasks.get_or_init(|| f)
            }
        };
        match file.write_at(pid.as_bytes(), 0) {
            Ok(n) if n == pid.len() => Ok(()),
            Ok(_) => Err(io_err(
                &format!("write {pid:?} to"),
                &path,
                std::io::Error::from(std::io::ErrorKind::WriteZero),
            )),
            Err(e) => Err(io_err(&format!("write {pid:?} to"), &path, e)),
        }
    }

    /// Run `f` on `name` of hierarchy `h` opened with `flags`: held open after first use if
    /// `name` is in `HELD`, else opened for this once.
    fn with_file<T>(
        &self,
        h: usize,
        name: &str,
        flags: libc::c_int,
        f: impl FnOnce(&File) -> std::io::Result<T>,
    ) -> Result<std::io::Result<T>, CgroupError> {
        let Some(key) = HELD.iter().find(|n| **n == name) else {
            return Ok(f(&self.open_in(h, name, flags)?));
        };
        let mut held = self.held.borrow_mut();
        if let Some((.., file)) = held
            .iter()
            .find(|(hh, n, fl, _)| *hh == h && n == key && *fl == flags)
        {
            return Ok(f(file));
        }
        let file = self.open_in(h, name, flags)?;
        let out = f(&file);
        held.push((h, key, flags, file));
        Ok(out)
    }

    fn open_in(&self, h: usize, name: &str, flags: libc::c_int) -> Result<File, CgroupError> {
        super::view::open_at(&self.dirfds[h], name, flags, &self.dirs[h].join(name))
    }

    fn write_in(&self, h: usize, name: &str, value: &str) -> Result<(), CgroupError> {
        use std::os::unix::fs::FileExt;
        self.with_file(h, name, libc::O_WRONLY, |file| {
            // One write(2) per value: cgroupfs takes each write whole, whatever the offset.
            match file.write_at(value.as_bytes(), 0)? {
                n if n == value.len() => Ok(()),
                _ => Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
            }
        })?
        .map_err(|e| io_err(&format!("write {value:?} to"), &self.dirs[h].join(name), e))
    }

    fn read_in(&self, h: usize, name: &str) -> Result<String, CgroupError> {
        use std::os::unix::fs::FileExt;
        self.with_file(h, name, libc::O_RDONLY, |file| {
            // From offset 0 every time: a held file is read afresh.
            let mut text = Vec::new();
            let mut buf = [0u8; 4096];
            // To the end: a seq_file read stops short at a page of output, so a short read
            // is not the end (cgroup.procs of a cgroup with many tasks runs longer).
            loop {
                let n = file.read_at(&mut buf, text.len() as u64)?;
                if n == 0 {
                    break;
                }
                text.extend_from_slice(&buf[..n]);
            }
            Ok(String::from_utf8_lossy(&text).into_owned())
        })?
        .map_err(|e| io_err("read", &self.dirs[h].join(name), e))
    }

    /// One of `COUNTERS`, read from the start of its held file (or opened afresh).
    fn counter(&self, i: usize) -> Result<String, CgroupError> {
        let (h, name) = COUNTERS[i];
        let held = self.counters.get_or_init(|| {
            let files: Vec<File> = COUNTERS
                .iter()
                .filter_map(|(h, n)| self.open_in(*h, n, libc::O_RDONLY).ok())
                .collect();
            files.try_into().ok()
        });
        if let Some(files) = held {
            use std::os::unix::fs::FileExt;
            let mut buf = [0u8; 512];
            let n = files[i]
                .read_at(&mut buf, 0)
                .map_err(|e| io_err("read", &self.dirs[h].join(name), e))?;
            if n < buf.len() {
                return Ok(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        self.read_in(h, name)
    }

    fn procs_in(&self, h: usize) -> Result<Vec<i32>, CgroupError> {
        Ok(self
            .read_in(h, "cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Kill everything in the cgroup. Ok(false): it was empty when first listed; Ok(true):
    /// something had to be killed (`is_empty` says whether that worked).
    fn kill_all_found(&self) -> Result<bool, CgroupError> {
        let listed = || self.procs_in(FREEZER);
        if listed()?.is_empty() {
            return Ok(false);
        }
        // Most often what is left is already on its way out (a request's process that has
        // answered): kill it and let it finish, without the freezer. Freezing the first
        // cgroup of a host switches a kernel static key, which stalls every CPU briefly.
        kill_listed(&listed)?;
        let deadline = Instant::now() + Duration::from_millis(20);
        while Instant::now() < deadline {
            if listed()?.is_empty() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Something is slow to die or keeps forking. A process held back by the CPU quota
        // cannot exit (nor be frozen) until its next period, and under a small quota with
        // many threads that takes seconds: lift the quota first. Then freeze, kill, thaw
        // until nothing is left.
        self.lift_cpu_quota()?;
        for _ in 0..10 {
            if listed()?.is_empty() {
                return Ok(true);
            }
            self.freeze()?;
            kill_listed(&listed)?;
            self.thaw()?;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(true)
    }

    /// I/O limits: the throttle on every disk, and (where BFQ schedules a disk) a weight
    /// that follows the CPU bandwidth.
    fn set_io(&self, dir: &Path, l: &Limits) -> Result<(), CgroupError> {
        for dev in super::disks::disks() {
            for (file, value) in [
                ("blkio.throttle.read_bps_device", l.io_bps.to_string()),
                ("blkio.throttle.write_bps_device", l.io_bps.to_string()),
                ("blkio.throttle.read_iops_device", l.io_iops.to_string()),
                ("blkio.throttle.write_iops_device", l.io_iops.to_string()),
            ] {
                super::write_file(&dir.join(file), &format!("{dev} {value}"))?;
            }
        }
        let weight = super::disks::weight(l.cpu_millis);
        if weight != 100 {
            // Only there when BFQ is loaded, and it applies only where it schedules a disk.
            let _ = std::fs::write(dir.join("blkio.bfq.weight"), weight.to_string());
        }
        Ok(())
    }

    fn wait_frozen(&self) -> Result<(), CgroupError> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            if self.read_in(FREEZER, "freezer.state")?.trim() == "FROZEN"
                || Instant::now() > deadline
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Cgroup for V1Cgroup {
    fn describe(&self) -> String {
        format!("v1 {}", self.dirs[MEMORY].display())
    }

    fn set_limits(&self, l: &Limits) -> Result<(), CgroupError> {
        match l.mem_bytes {
            Some(b) => {
                let b = b.to_string();
                // With swap accounting, memory+swap gets the same cap, so the limit cannot
                // be dodged by swapping. The kernel keeps memory ≤ memory+swap: when the
                // limit rises past the old memory+swap one, memory+swap goes first.
                match self.write_in(MEMORY, "memory.limit_in_bytes", &b) {
                    Ok(()) if self.memsw => {
                        self.write_in(MEMORY, "memory.memsw.limit_in_bytes", &b)?
                    }
                    Ok(()) => {}
                    Err(CgroupError::Io { source, .. })
                        if self.memsw && source.raw_os_error() == Some(libc::EINVAL) =>
                    {
                        self.write_in(MEMORY, "memory.memsw.limit_in_bytes", &b)?;
                        self.write_in(MEMORY, "memory.limit_in_bytes", &b)?;
                    }
                    Err(e) => return Err(e),
                }
                // v1 charges socket buffers to a cgroup only once this is set: without it a
                // sandbox could park unbounded memory in TCP buffers. They are counted apart
                // from the memory limit, and past this one the kernel still grants each
                // socket a minimum (a few pages, with the sandbox network namespace's small
                // buffer sizes): a quarter of the memory limit keeps the sum near `--mem`
                // for a sandbox with as many sockets as one process may hold. See
                // docs/security.md. (Not every kernel has the file.)
                let tcp = (l.mem_bytes.unwrap_or(0) / V1_TCP_SHARE).max(V1_TCP_MIN);
                match self.write_in(MEMORY, "memory.kmem.tcp.limit_in_bytes", &tcp.to_string()) {
                    Err(CgroupError::Io { source, .. })
                        if source.raw_os_error() == Some(libc::ENOENT) => {}
                    other => other?,
                }
            }
            None => {
                // Unlimited: memory+swap is lifted first, so memory may follow it.
                if self.memsw {
                    self.write_in(MEMORY, "memory.memsw.limit_in_bytes", "-1")?;
                }
                self.write_in(MEMORY, "memory.limit_in_bytes", "-1")?
            }
        }
        // Best effort: not every kernel lets a child cgroup set swappiness.
        let _ = self.write_in(MEMORY, "memory.swappiness", "0");
        self.write_in(PIDS, "pids.max", &l.pids.to_string())?;
        let period: u64 = 100_000;
        let quota = (u64::from(l.cpu_millis) * period / 1000).max(1000);
        self.write_in(CPU, "cpu.cfs_period_us", &period.to_string())?;
        self.write_in(CPU, "cpu.cfs_quota_us", &quota.to_string())?;
        // The weight follows the bandwidth: without it a small sandbox with many threads
        // competes for a contended CPU as hard as any other. (A new cgroup has the default
        // already, which `--cpu 1` asks for.)
        let shares = l.cpu_shares();
        if shares != self.shares.get() {
            self.write_in(CPU, "cpu.shares", &shares.to_string())?;
            self.shares.set(shares);
        }
        if let Some(b) = &self.blkio {
            self.set_io(b, l)?;
        }
        Ok(())
    }

    fn set_weight(&self, w: Weight) -> Result<(), CgroupError> {
        let fg = self.shares.get();
        let shares = match w {
            Weight::Foreground => fg,
            Weight::Background => (fg / 4).max(2),
        };
        self.write_in(CPU, "cpu.shares", &shares.to_string())
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        for h in 0..5 {
            self.write_in(h, "cgroup.procs", &pid.to_string())?;
        }
        if let Some(b) = &self.blkio {
            super::write_file(&b.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    fn add_single_threaded(&self, pid: i32) -> Result<(), CgroupError> {
        // `tasks` moves one thread. A process that has more (a Node process: V8's and
        // libuv's threads) is moved whole, through `cgroup.procs`; left behind, its other
        // threads would stay in the zygote's cgroup and die with what is killed there.
        if super::thread_count(pid) != Some(1) {
            return self.add_pid(pid);
        }
        let text = pid.to_string();
        for h in 0..5 {
            self.write_in(h, "tasks", &text)?;
        }
        if let Some(b) = &self.blkio {
            self.blkio_add_task(b, &text)?;
        }
        // The count above may be stale: a child that was between its fork and its exec (a
        // Node spare) starts threads of its own, and one started before the move stayed
        // behind. Threads started after it follow the thread that starts them, so a second
        // count of one means the whole process is here; more, and `cgroup.procs` moves the
        // rest (it takes the threadgroup lock, so none can be started meanwhile).
        if super::thread_count(pid) != Some(1) {
            return self.add_pid(pid);
        }
        Ok(())
    }

    fn attach_files(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        // `tasks` moves just the writing thread, without the global threadgroup lock that
        // `cgroup.procs` takes; the writer is single-threaded, so that is the whole process.
        let mut files: Vec<OwnedFd> = (0..5)
            .map(|h| self.open_in(h, "tasks", libc::O_WRONLY).map(OwnedFd::from))
            .collect::<Result<_, _>>()?;
        if let Some(b) = &self.blkio {
            files.push(super::open_write(&b.join("tasks"))?);
        }
        Ok(files)
    }

    fn contains(&self, pid: i32) -> Result<bool, CgroupError> {
        // The memory hierarchy is the one whose limit matters most, and a process joins the
        // hierarchies in order (memory first, freezer last), so freezer membership implies
        // the others: check the first and the last.
        Ok(self.procs_in(MEMORY)?.contains(&pid) && self.procs_in(FREEZER)?.contains(&pid))
    }

    fn usage(&self) -> Result<Usage, CgroupError> {
        let oom = self.counter(0)?;
        let oom_kills = oom
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let peak_bytes = self.counter(1)?.trim().parse().unwrap_or(0);
        let cpu_ns: u64 = self.counter(2)?.trim().parse().unwrap_or(0);
        Ok(Usage {
            oom_kills,
            peak_bytes,
            cpu_usec: cpu_ns / 1000,
        })
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        self.write_in(FREEZER, "freezer.state", "FROZEN")?;
        self.wait_frozen()
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        self.write_in(FREEZER, "freezer.state", "THAWED")
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        self.kill_all_found().map(|_| ())
    }

    fn lift_cpu_quota(&self) -> Result<(), CgroupError> {
        self.quota_lifted.set(true);
        self.write_in(CPU, "cpu.cfs_quota_us", "-1")?;
        // A small sandbox's small weight would starve its dying processes on a busy host.
        self.write_in(CPU, "cpu.shares", &DEFAULT_SHARES.to_string())
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(self.procs_in(FREEZER)?.is_empty())
    }

    fn view(&self) -> Result<Box<dyn CgroupView>, CgroupError> {
        let at = |h: usize| (self.dirs[h].as_path(), &self.dirfds[h]);
        Ok(Box::new(HandedView::v1(
            at(MEMORY),
            at(CPU),
            at(CPUACCT),
            at(FREEZER),
            self.shares.get(),
        )?))
    }

    fn recycle(&self) -> Result<bool, CgroupError> {
        if self.quota_lifted.get() {
            log::debug!("not reusing {}: its CPU quota was lifted", self.describe());
            return Ok(false);
        }
        // The usual case: nothing left to kill, so no second listing.
        if self.kill_all_found()? && !self.is_empty()? {
            log::debug!("not reusing {}: it does not empty", self.describe());
            return Ok(false);
        }
        // That kill may have lifted the quota (see `kill_all_found`).
        if self.quota_lifted.get() {
            log::debug!("not reusing {}: its CPU quota was lifted", self.describe());
            return Ok(false);
        }
        // The kernel's OOM-kill counter cannot be reset: a cgroup that counted one is not
        // reused, or the next request would be reported as killed.
        if self.usage()?.oom_kills > 0 {
            log::debug!("not reusing {}: it counted an OOM kill", self.describe());
            return Ok(false);
        }
        // Pages its last process left charged to it (files it wrote in a tmpfs, page cache
        // it read in) would count against the next one: only a cgroup with next to none
        // left is reused. (`memory.usage_in_bytes` is no guide: it also counts charges the
        // kernel holds in advance per CPU, and kernel memory freed lazily.) Reclaiming
        // instead, with force_empty, costs more than a new cgroup.
        let stat = self.read_in(MEMORY, "memory.stat")?;
        let pages: u64 = ["cache", "rss"]
            .iter()
            .map(|k| {
                stat.lines()
                    .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix(' ')))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(u64::MAX / 4)
            })
            .sum();
        if pages > RECYCLE_MAX_CHARGED {
            log::debug!(
                "not reusing {}: {pages} bytes of pages still charged to it",
                self.describe()
            );
            return Ok(false);
        }
        self.write_in(MEMORY, "memory.max_usage_in_bytes", "0")?;
        if self.memsw {
            self.write_in(MEMORY, "memory.memsw.max_usage_in_bytes", "0")?;
        }
        self.write_in(CPUACCT, "cpuacct.usage", "0")?;
        self.thaw()?;
        Ok(true)
    }

    fn remove(self: Box<Self>) -> Result<(), CgroupError> {
        let killed = self.kill_all();
        let mut first_err = killed.err();
        for d in self.blkio.iter().chain(self.dirs.iter().rev()) {
            if let Err(e) = rmdir_retry(d) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
