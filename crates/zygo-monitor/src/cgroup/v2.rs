//! cgroup v2: one directory per cgroup in the unified hierarchy, with the memory, pids and
//! cpu controllers enabled down to Zygo's tree. Kill is `cgroup.kill`; freeze is
//! `cgroup.freeze`; the OOM count is `memory.events`' `oom_kill`; the peak is `memory.peak`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{
    ensure_dir, join, procs, read_file, rmdir_retry, write_file, Cgroup, CgroupError, CgroupMount,
    Limits, OwnCgroup, Usage, Weight,
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

impl V2 {
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
        let base = super::base_path(own_path, base_override);
        let base_dir = join(&m.point, &base);
        let available = read_file(&base_dir.join("cgroup.controllers")).unwrap_or_default();
        if !has_all(&available) {
            // A v2 mount without the controllers (a hybrid host): not ours to use.
            return Ok(None);
        }
        // Controllers must be enabled on our cgroup for its children to have them. That is
        // refused (EBUSY) while our cgroup holds processes, so leave it as a leaf if needed.
        let subtree = base_dir.join("cgroup.subtree_control");
        if !has_all(&read_file(&subtree).unwrap_or_default()) {
            if let Err(first) = write_file(&subtree, "+memory +pids +cpu") {
                let procs_here = procs(&base_dir.join("cgroup.procs")).unwrap_or_default();
                // SAFETY: getpid cannot fail.
                let me = unsafe { libc::getpid() };
                if procs_here == [me] {
                    let leaf = base_dir.join("zygo-monitor");
                    ensure_dir(&leaf)?;
                    write_file(&leaf.join("cgroup.procs"), &me.to_string())?;
                    write_file(&subtree, "+memory +pids +cpu")?;
                } else {
                    return Err(CgroupError::NotDelegated {
                        path: base_dir,
                        source: std::io::Error::other(first.to_string()),
                    });
                }
            }
        }
        let root = base_dir.join("zygo");
        ensure_dir(&root)?;
        write_file(&root.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
        enable_io(&base_dir);
        enable_io(&root);
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
        let mut level = self.root.clone();
        for part in Path::new(rel).components() {
            level = level.join(part);
            if !level.is_dir() {
                std::fs::create_dir(&level)
                    .map_err(|e| super::io_err("create cgroup", &level, e))?;
                write_file(&level.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
                enable_io(&level);
            }
        }
        let mem = mem_bytes.map_or("max".to_string(), |b| b.to_string());
        write_file(&level.join("memory.max"), &mem)
    }

    pub fn create(&self, name: &str) -> Result<V2Cgroup, CgroupError> {
        let dir = self.root.join(name);
        // Intermediate levels need the controllers enabled for their children.
        let mut level = self.root.clone();
        if let Some(parent) = Path::new(name).parent() {
            for part in parent.components() {
                level = level.join(part);
                if !level.is_dir() {
                    std::fs::create_dir(&level)
                        .map_err(|e| super::io_err("create cgroup", &level, e))?;
                    write_file(&level.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
                    enable_io(&level);
                }
            }
        }
        std::fs::create_dir(&dir).map_err(|e| super::io_err("create cgroup", &dir, e))?;
        Ok(V2Cgroup::new(dir))
    }
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

fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
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

    // `recycle` is left at "no": cpu.stat cannot be reset, and memory.peak only per open
    // file on recent kernels, so a v2 cgroup serves one request.

    fn remove(self: Box<Self>) -> Result<(), CgroupError> {
        let killed = self.kill_all();
        let removed = rmdir_retry(&self.dir);
        killed.and(removed)
    }
}
