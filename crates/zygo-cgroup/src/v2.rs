//! cgroup v2: one directory per cgroup in the unified hierarchy, with the memory, pids and
//! cpu controllers enabled down to Zygo's tree. Kill is `cgroup.kill`; freeze is
//! `cgroup.freeze`; the OOM count is `memory.events`' `oom_kill`; the peak is `memory.peak`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{
    ensure_dir, join, procs, read_file, rmdir_retry, view::keyed, write_file, Cgroup, CgroupError,
    CgroupMount, CgroupView, HandedView, Limits, OwnCgroup, Usage, Weight,
};

const NEEDED: [&str; 3] = ["memory", "pids", "cpu"];

pub struct V2 {
    root: PathBuf,
}

fn has_all(list: &str) -> bool {
    NEEDED
        .iter()
        .all(|c| list.split_whitespace().any(|x| x == *c))
}

/// The leaf of the base cgroup Zygo moves itself into.
const LEAF: &str = "zygo-monitor";

/// Whether the cgroup path `inner` is `outer` or below it.
fn within(inner: &str, outer: &str) -> bool {
    let outer = outer.trim_end_matches('/');
    outer.is_empty()
        || inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Move this process into `<base>/zygo-monitor`. `in_base`: we are in the base itself,
/// which must then hold no other process, since the base is about to have children with
/// controllers and a v2 cgroup that does may hold no process.
fn enter_leaf(base_dir: &Path, in_base: bool) -> Result<(), CgroupError> {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    if in_base {
        let others: Vec<String> = procs(&base_dir.join("cgroup.procs"))?
            .into_iter()
            .filter(|p| *p != me)
            .map(|p| p.to_string())
            .collect();
        if !others.is_empty() {
            return Err(super::refused(
                &format!(
                    "the cgroup {} holds other processes (pid {}) besides Zygo, and a cgroup v2 \
                     that holds processes cannot hold the sandboxes' cgroups",
                    base_dir.display(),
                    others.join(", ")
                ),
                super::Fix::Alone {
                    base: base_dir.to_path_buf(),
                },
            ));
        }
    }
    let leaf = base_dir.join(LEAF);
    if let Err(e) = std::fs::create_dir(&leaf) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(super::refused(
                &format!("cannot create the cgroup {} ({e})", leaf.display()),
                super::Fix::Delegate,
            ));
        }
    }
    let procs_file = leaf.join("cgroup.procs");
    if let Err(e) = std::fs::write(&procs_file, me.to_string()) {
        return Err(match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::ENOENT) => super::refused(
                &format!(
                    "cannot move Zygo into {} ({e}): a process may move another only where it \
                     can write cgroup.procs of a cgroup that holds both, so an unprivileged \
                     Zygo must be started inside the cgroup delegated to it",
                    leaf.display()
                ),
                super::Fix::StartInside {
                    base: base_dir.to_path_buf(),
                },
            ),
            _ => super::io_err(&format!("write {me} to"), &procs_file, e),
        });
    }
    log::debug!("moved into the cgroup {}", leaf.display());
    Ok(())
}

/// Enabling the controllers for the base's children failed: why, and what to do.
fn enable_refused(base_dir: &Path, e: CgroupError) -> CgroupError {
    let busy =
        matches!(&e, CgroupError::Io { source, .. } if source.raw_os_error() == Some(libc::EBUSY));
    if busy {
        let listed = procs(&base_dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<String> = listed.iter().map(|p| p.to_string()).collect();
        return super::refused(
            &format!(
                "cannot enable memory, pids and cpu for the children of {}: it holds processes \
                 (pid {}), and a cgroup v2 that holds processes cannot have children with \
                 controllers",
                base_dir.display(),
                pids.join(", ")
            ),
            super::Fix::Alone {
                base: base_dir.to_path_buf(),
            },
        );
    }
    let denied = matches!(&e, CgroupError::Io { source, .. }
        if matches!(source.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)));
    if denied {
        return super::refused(&e.to_string(), super::Fix::Delegate);
    }
    e
}

impl V2 {
    /// Find Zygo's base cgroup on the unified hierarchy and make it usable: Zygo moves
    /// itself into a leaf of it when it is not already inside it (or is in the base itself,
    /// where no process may stay once the base has children with controllers), then enables
    /// memory, pids and cpu for the base's children and makes `<base>/zygo`. This runs
    /// before Zygo starts any process, so the only process it moves is itself.
    pub(crate) fn probe(
        own: &[OwnCgroup],
        base_override: Option<&str>,
        mounts: &[CgroupMount],
    ) -> Result<Option<V2>, CgroupError> {
        let Some(m) = mounts.iter().find(|m| m.v2) else {
            return Ok(None);
        };
        let Some(own_path) = own
            .iter()
            .find(|o| o.controllers.is_empty())
            .map(|o| o.path.as_str())
        else {
            return Ok(None);
        };
        // A v2 mount beside v1 hierarchies that hold the controllers (a hybrid host) is
        // not ours to use.
        let root_controllers = read_file(&m.point.join("cgroup.controllers")).unwrap_or_default();
        if !NEEDED
            .iter()
            .any(|c| root_controllers.split_whitespace().any(|x| x == *c))
        {
            return Ok(None);
        }
        let base = super::base_path(own_path, base_override);
        let base_dir = join(&m.point, &base);
        if !base_dir.is_dir() {
            return Err(super::refused(
                &format!(
                    "the cgroup {} (from $ZYGO_CGROUP) does not exist",
                    base_dir.display()
                ),
                super::Fix::Delegate,
            ));
        }
        let available = read_file(&base_dir.join("cgroup.controllers"))?;
        let missing: Vec<&str> = NEEDED
            .iter()
            .copied()
            .filter(|c| !available.split_whitespace().any(|x| x == *c))
            .collect();
        if !missing.is_empty() {
            return Err(super::refused(
                &format!(
                    "the cgroup {} does not have the {} controller{} (its parent has not \
                     delegated {})",
                    base_dir.display(),
                    missing.join(", "),
                    if missing.len() > 1 { "s" } else { "" },
                    if missing.len() > 1 { "them" } else { "it" },
                ),
                super::Fix::Delegate,
            ));
        }
        let subtree = base_dir.join("cgroup.subtree_control");
        let inside = own_path != base && within(own_path, &base);
        if !inside {
            if base == "/" {
                // The host's root cgroup may hold processes beside children with
                // controllers; the root of a cgroup namespace (a container's) may not.
                if !has_all(&read_file(&subtree).unwrap_or_default())
                    && write_file(&subtree, "+memory +pids +cpu").is_err()
                {
                    enter_leaf(&base_dir, own_path == base)?;
                }
            } else {
                enter_leaf(&base_dir, own_path == base)?;
            }
        }
        if !has_all(&read_file(&subtree).unwrap_or_default()) {
            if let Err(e) = write_file(&subtree, "+memory +pids +cpu") {
                return Err(enable_refused(&base_dir, e));
            }
        }
        let root = base_dir.join("zygo");
        enable_io(&base_dir);
        make_root(&root)?;
        Ok(Some(V2 { root }))
    }

    pub fn root(&self) -> String {
        self.root.display().to_string()
    }

    /// The names of the directories under `<tree>/<rel>`.
    /// Zygo's root directory.
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    pub fn child_names_in(&self, rel: &str) -> Vec<String> {
        super::subdirectories(&super::join(&self.root, rel))
    }

    /// An existing cgroup.
    pub fn open(&self, rel: &str) -> Option<V2Cgroup> {
        let dir = self.root.join(rel);
        dir.is_dir().then(|| V2Cgroup::new(dir))
    }

    /// Remove an (empty) intermediate directory of Zygo's tree; whether it is gone.
    pub fn prune(&self, rel: &str) -> bool {
        let _ = std::fs::remove_dir(self.root.join(rel));
        !self.root.join(rel).exists()
    }

    /// See `Backend::set_ceiling`.
    pub fn set_ceiling(&self, rel: &str, mem_bytes: Option<u64>) -> Result<(), CgroupError> {
        if !self.root.is_dir() {
            make_root(&self.root)?;
        }
        let mut level = self.root.clone();
        for part in Path::new(rel).components() {
            level = level.join(part);
            if !level.is_dir() {
                // Another Zygo process may make the same level meanwhile.
                match std::fs::create_dir(&level) {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                        return Err(super::io_err("create cgroup", &level, e));
                    }
                    _ => {}
                }
                write_file(&level.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
                enable_io(&level);
            }
        }
        let mem = mem_bytes.map_or("max".to_string(), |b| b.to_string());
        write_file(&level.join("memory.max"), &mem)
    }

    pub fn create(&self, name: &str) -> Result<V2Cgroup, CgroupError> {
        // Zygo's root may be gone (the last Zygo process that used it removed it as it
        // left): made again, with its controllers and the tree's weight.
        if !self.root.is_dir() {
            make_root(&self.root)?;
        }
        let dir = self.root.join(name);
        // Intermediate levels need the controllers enabled for their children.
        let mut level = self.root.clone();
        if let Some(parent) = Path::new(name).parent() {
            for part in parent.components() {
                level = level.join(part);
                if !level.is_dir() {
                    // Another Zygo process may make the same level meanwhile.
                    match std::fs::create_dir(&level) {
                        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                            return Err(super::io_err("create cgroup", &level, e));
                        }
                        _ => {}
                    }
                    write_file(&level.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
                    enable_io(&level);
                }
            }
        }
        std::fs::create_dir(&dir).map_err(|e| super::io_err("create cgroup", &dir, e))?;
        // A root or level that another Zygo process has just made may not have its
        // controllers enabled yet (it enables them right after making it), and a cgroup
        // made in it meanwhile has none until then: enabled here, down from the root, in
        // that case (enabling them again changes nothing).
        if !has_all(&read_file(&dir.join("cgroup.controllers")).unwrap_or_default()) {
            let mut levels = vec![self.root.clone()];
            if let Some(parent) = Path::new(name).parent() {
                for part in parent.components() {
                    let next = levels[levels.len() - 1].join(part);
                    levels.push(next);
                }
            }
            for l in &levels {
                let control = l.join("cgroup.subtree_control");
                if has_all(&read_file(&control).unwrap_or_default()) {
                    continue;
                }
                if let Err(e) = write_file(&control, "+memory +pids +cpu") {
                    let _ = std::fs::remove_dir(&dir);
                    return Err(e);
                }
                enable_io(l);
            }
        }
        Ok(V2Cgroup::new(dir))
    }
}

/// Make Zygo's root (if missing) with the controllers enabled for its children and the
/// tree's CPU weight.
fn make_root(root: &Path) -> Result<(), CgroupError> {
    // Another Zygo process leaving may remove it again at any point (see
    // `Backend::release_root`): then it is made again.
    super::again_if_root_went(|| make_root_once(root))
}

fn make_root_once(root: &Path) -> Result<(), CgroupError> {
    ensure_dir(root)?;
    if !has_all(&read_file(&root.join("cgroup.subtree_control")).unwrap_or_default()) {
        write_file(&root.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
    }
    enable_io(root);
    super::ensure_tree_weight(
        &root.join("cpu.weight"),
        100 * super::TREE_WEIGHT_QUARTERS / 4,
    );
    Ok(())
}

/// Enable the io controller for `dir`'s children where it is available: best effort, as
/// a delegated subtree may not have it (sandboxes then run without I/O limits).
fn enable_io(dir: &Path) {
    let available = read_file(&dir.join("cgroup.controllers")).unwrap_or_default();
    if available.split_whitespace().any(|c| c == "io") {
        if let Err(e) = write_file(&dir.join("cgroup.subtree_control"), "+io") {
            log::debug!("no I/O limits: {e}");
        }
    }
}

pub struct V2Cgroup {
    dir: PathBuf,
    /// `cpu.weight` in the foreground, as `set_limits` wrote it.
    weight: std::cell::Cell<u64>,
}

/// The kernel's `cpu.weight` for a new cgroup.
const DEFAULT_WEIGHT: u64 = 100;

impl V2Cgroup {
    fn new(dir: PathBuf) -> V2Cgroup {
        V2Cgroup {
            dir,
            weight: std::cell::Cell::new(DEFAULT_WEIGHT),
        }
    }
}

impl Cgroup for V2Cgroup {
    fn describe(&self) -> String {
        format!("v2 {}", self.dir.display())
    }

    fn set_limits(&self, l: &Limits) -> Result<(), CgroupError> {
        let mem = l.mem_bytes.map_or("max".to_string(), |b| b.to_string());
        write_file(&self.dir.join("memory.max"), &mem)?;
        let swap = self.dir.join("memory.swap.max");
        if swap.exists() {
            write_file(&swap, "0")?;
        }
        write_file(&self.dir.join("pids.max"), &l.pids.to_string())?;
        let period: u64 = 100_000;
        let quota = (u64::from(l.cpu_millis) * period / 1000).max(1000);
        write_file(&self.dir.join("cpu.max"), &format!("{quota} {period}"))?;
        // The weight follows the bandwidth (see v1's `cpu.shares`).
        let weight = l.cpu_weight();
        if weight != self.weight.get() {
            write_file(&self.dir.join("cpu.weight"), &weight.to_string())?;
            self.weight.set(weight);
        }
        // I/O: a throttle on every disk and a weight that follows the CPU bandwidth, where
        // the io controller is enabled for this cgroup.
        let io_max = self.dir.join("io.max");
        if io_max.exists() {
            for dev in super::disks::disks() {
                write_file(
                    &io_max,
                    &format!(
                        "{dev} rbps={bps} wbps={bps} riops={iops} wiops={iops}",
                        bps = l.io_bps,
                        iops = l.io_iops
                    ),
                )?;
            }
            let w = super::disks::weight(l.cpu_millis);
            if w != 100 {
                // Only where a disk's scheduler honours it (BFQ, or io.cost).
                let _ = write_file(&self.dir.join("io.weight"), &format!("default {w}"));
            }
        }
        Ok(())
    }

    fn set_weight(&self, w: Weight) -> Result<(), CgroupError> {
        let fg = self.weight.get();
        let weight = match w {
            Weight::Foreground => fg,
            Weight::Background => (fg / 4).max(1),
        };
        write_file(&self.dir.join("cpu.weight"), &weight.to_string())
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        write_file(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    fn attach_files(&self) -> Result<Vec<std::os::fd::OwnedFd>, CgroupError> {
        Ok(vec![super::open_write(&self.dir.join("cgroup.procs"))?])
    }

    fn contains(&self, pid: i32) -> Result<bool, CgroupError> {
        Ok(procs(&self.dir.join("cgroup.procs"))?.contains(&pid))
    }

    fn usage(&self) -> Result<Usage, CgroupError> {
        let events = read_file(&self.dir.join("memory.events"))?;
        let peak = read_file(&self.dir.join("memory.peak"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let cpu = read_file(&self.dir.join("cpu.stat"))?;
        Ok(Usage {
            oom_kills: keyed(&events, "oom_kill"),
            peak_bytes: peak,
            cpu_usec: keyed(&cpu, "usage_usec"),
        })
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        write_file(&self.dir.join("cgroup.freeze"), "1")?;
        let deadline = Instant::now() + Duration::from_secs(2);
        while keyed(&read_file(&self.dir.join("cgroup.events"))?, "frozen") != 1
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        write_file(&self.dir.join("cgroup.freeze"), "0")
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        if self.is_empty()? {
            return Ok(());
        }
        write_file(&self.dir.join("cgroup.kill"), "1")?;
        let start = Instant::now();
        let mut lifted = false;
        while !self.is_empty()? && start.elapsed() < Duration::from_secs(2) {
            // A killed process still needs the CPU to exit: one held back by the quota
            // would take until its next period, seconds under a small quota with many
            // threads.
            if !lifted && start.elapsed() > Duration::from_millis(20) {
                self.lift_cpu_quota()?;
                lifted = true;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        Ok(())
    }

    fn lift_cpu_quota(&self) -> Result<(), CgroupError> {
        write_file(&self.dir.join("cpu.max"), "max")?;
        // A small sandbox's small weight would starve its dying processes on a busy host.
        write_file(&self.dir.join("cpu.weight"), &DEFAULT_WEIGHT.to_string())
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        let events = read_file(&self.dir.join("cgroup.events"))?;
        Ok(keyed(&events, "populated") == 0)
    }

    fn view(&self) -> Result<Box<dyn CgroupView>, CgroupError> {
        Ok(Box::new(HandedView::v2(&self.dir, self.weight.get())?))
    }

    // `recycle` is left at "no": cpu.stat cannot be reset, and memory.peak only per open
    // file on recent kernels, so a v2 cgroup serves one request.

    fn remove(self: Box<Self>) -> Result<(), CgroupError> {
        let killed = self.kill_all();
        let removed = rmdir_retry(&self.dir);
        killed.and(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn within_is_by_path_components() {
        assert!(within("/a/b", "/a"));
        assert!(within("/a", "/a"));
        assert!(within("/a/b/c", "/a/b/"));
        assert!(within("/anything", "/"));
        assert!(!within("/ab", "/a"));
        assert!(!within("/a", "/a/b"));
        assert!(!within(
            "/user.slice/session-1.scope",
            "/system.slice/zygo.service"
        ));
    }
}
