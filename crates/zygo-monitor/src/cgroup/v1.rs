//! cgroup v1: one directory per controller (memory, pids, cpu, cpuacct, freezer), created
//! side by side under the same relative path in each hierarchy.
//!
//! v1 has no `cgroup.kill`: a tree is killed by freezing it (so nothing can fork or exit
//! while we look), SIGKILLing every task listed, then thawing so the kills are delivered.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{
    ensure_dir, io_err, join, kill_listed, procs, read_file, rmdir_retry, write_file, Cgroup,
    CgroupError, CgroupMount, Limits, OwnCgroup, Usage,
};

const CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// Zygo's tree in each v1 hierarchy: `<mount>/<base>/zygo`.
pub struct V1 {
    /// Per controller in CONTROLLERS order: the directory holding Zygo's cgroups.
    roots: [PathBuf; 5],
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
            if !base_dir.is_dir() {
                return Err(CgroupError::NotDelegated {
                    path: base_dir,
                    source: std::io::Error::from_raw_os_error(libc::ENOENT),
                });
            }
            let root = base_dir.join("zygo");
            ensure_dir(&root)?;
            roots.push(root);
        }
        let roots: [PathBuf; 5] = roots
            .try_into()
            .map_err(|_| CgroupError::Unavailable("v1 controllers missing".into()))?;
        Ok(Some(V1 { roots }))
    }

    pub fn root(&self) -> String {
        self.roots[0].display().to_string()
    }

    /// The names under `rel` in any hierarchy: a supervisor killed while it was creating a
    /// cgroup leaves it in the first few hierarchies only, and those must be found too.
    pub fn child_names_in(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .roots
            .iter()
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
        Some(V1Cgroup { dirs })
    }

    /// Remove an (empty) intermediate directory of Zygo's tree in every hierarchy.
    pub fn prune(&self, rel: &str) {
        for r in self.roots.iter().rev() {
            let _ = std::fs::remove_dir(r.join(rel));
        }
    }

    pub fn create(&self, name: &str) -> Result<V1Cgroup, CgroupError> {
        let dirs: Vec<PathBuf> = self.roots.iter().map(|r| r.join(name)).collect();
        let mut made: Vec<PathBuf> = Vec::new();
        for d in &dirs {
            if let Some(parent) = d.parent() {
                if let Err(e) = std::fs::create_dir_all(parent) {
                    return Err(io_err("create cgroup", parent, e));
                }
            }
            if let Err(e) = std::fs::create_dir(d) {
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
        Ok(V1Cgroup { dirs })
    }
}

/// The most a recycled cgroup may still have charged to it in pages (its next request's
/// peak counts them).
const RECYCLE_MAX_CHARGED: u64 = 64 << 10;

/// One sandbox's cgroup in every v1 hierarchy.
pub struct V1Cgroup {
    dirs: [PathBuf; 5],
}

impl V1Cgroup {
    fn memory(&self) -> &Path {
        &self.dirs[0]
    }
    fn pids(&self) -> &Path {
        &self.dirs[1]
    }
    fn cpu(&self) -> &Path {
        &self.dirs[2]
    }
    fn cpuacct(&self) -> &Path {
        &self.dirs[3]
    }
    fn freezer(&self) -> &Path {
        &self.dirs[4]
    }

    fn wait_frozen(&self) -> Result<(), CgroupError> {
        let state = self.freezer().join("freezer.state");
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            if read_file(&state)?.trim() == "FROZEN" || Instant::now() > deadline {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Cgroup for V1Cgroup {
    fn describe(&self) -> String {
        format!("v1 {}", self.memory().display())
    }

    fn set_limits(&self, l: &Limits) -> Result<(), CgroupError> {
        let mem = self.memory();
        match l.mem_bytes {
            Some(b) => {
                write_file(&mem.join("memory.limit_in_bytes"), &b.to_string())?;
                // With swap accounting, memory+swap gets the same cap, so the limit cannot
                // be dodged by swapping.
                let memsw = mem.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write_file(&memsw, &b.to_string())?;
                }
                // v1 charges socket buffers to a cgroup only once this is set: without it a
                // sandbox could park unbounded memory in TCP buffers.
                let tcp = mem.join("memory.kmem.tcp.limit_in_bytes");
                if tcp.exists() {
                    write_file(&tcp, &b.to_string())?;
                }
            }
            None => write_file(&mem.join("memory.limit_in_bytes"), "-1")?,
        }
        // Best effort: not every kernel lets a child cgroup set swappiness.
        let _ = std::fs::write(mem.join("memory.swappiness"), "0");
        write_file(&self.pids().join("pids.max"), &l.pids.to_string())?;
        let period: u64 = 100_000;
        let quota = (u64::from(l.cpu_millis) * period / 1000).max(1000);
        write_file(&self.cpu().join("cpu.cfs_period_us"), &period.to_string())?;
        write_file(&self.cpu().join("cpu.cfs_quota_us"), &quota.to_string())?;
        Ok(())
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        for d in &self.dirs {
            write_file(&d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    fn add_single_threaded(&self, pid: i32) -> Result<(), CgroupError> {
        for d in &self.dirs {
            write_file(&d.join("tasks"), &pid.to_string())?;
        }
        Ok(())
    }

    fn attach_files(&self) -> Result<Vec<std::os::fd::OwnedFd>, CgroupError> {
        // `tasks` moves just the writing thread, without the global threadgroup lock that
        // `cgroup.procs` takes; the writer is single-threaded, so that is the whole process.
        self.dirs
            .iter()
            .map(|d| super::open_write(&d.join("tasks")))
            .collect()
    }

    fn contains(&self, pid: i32) -> Result<bool, CgroupError> {
        // The memory hierarchy is the one whose limit matters most, and a process joins the
        // hierarchies in order (memory first, freezer last), so freezer membership implies
        // the others: check the first and the last.
        Ok(procs(&self.memory().join("cgroup.procs"))?.contains(&pid)
            && procs(&self.freezer().join("cgroup.procs"))?.contains(&pid))
    }

    fn usage(&self) -> Result<Usage, CgroupError> {
        let oom = read_file(&self.memory().join("memory.oom_control"))?;
        let oom_kills = oom
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let peak_bytes = read_file(&self.memory().join("memory.max_usage_in_bytes"))?
            .trim()
            .parse()
            .unwrap_or(0);
        let cpu_ns: u64 = read_file(&self.cpuacct().join("cpuacct.usage"))?
            .trim()
            .parse()
            .unwrap_or(0);
        Ok(Usage {
            oom_kills,
            peak_bytes,
            cpu_usec: cpu_ns / 1000,
        })
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        write_file(&self.freezer().join("freezer.state"), "FROZEN")?;
        self.wait_frozen()
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        write_file(&self.freezer().join("freezer.state"), "THAWED")
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        let listed = self.freezer().join("cgroup.procs");
        if procs(&listed)?.is_empty() {
            return Ok(());
        }
        // Most often what is left is already on its way out (a request's process that has
        // answered): kill it and let it finish, without the freezer. Freezing the first
        // cgroup of a host switches a kernel static key, which stalls every CPU briefly.
        kill_listed(&listed)?;
        let deadline = Instant::now() + Duration::from_millis(20);
        while Instant::now() < deadline {
            if procs(&listed)?.is_empty() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Something keeps forking: freeze, kill, thaw until nothing is left.
        for _ in 0..10 {
            if procs(&listed)?.is_empty() {
                return Ok(());
            }
            self.freeze()?;
            kill_listed(&listed)?;
            self.thaw()?;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        Ok(procs(&self.freezer().join("cgroup.procs"))?.is_empty())
    }

    fn recycle(&self) -> Result<bool, CgroupError> {
        self.kill_all()?;
        if !self.is_empty()? {
            log::debug!("not reusing {}: it does not empty", self.describe());
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
        let mem = self.memory();
        let stat = read_file(&mem.join("memory.stat"))?;
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
        write_file(&mem.join("memory.max_usage_in_bytes"), "0")?;
        let memsw = mem.join("memory.memsw.max_usage_in_bytes");
        if memsw.exists() {
            write_file(&memsw, "0")?;
        }
        write_file(&self.cpuacct().join("cpuacct.usage"), "0")?;
        self.thaw()?;
        Ok(true)
    }

    fn remove(self: Box<Self>) -> Result<(), CgroupError> {
        let killed = self.kill_all();
        let mut first_err = killed.err();
        for d in self.dirs.iter().rev() {
            if let Err(e) = rmdir_retry(d) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
