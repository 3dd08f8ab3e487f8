//! A cgroup's view: what may be done to a sandbox's cgroup through descriptors opened by
//! whoever made it, with no privilege of one's own. Freeze and thaw it, set its CPU weight
//! among its siblings, read what it counted and whether anything is left in it. Nothing
//! else: no limit file and no attach file (`cgroup.procs`, `tasks`) is among them, and the
//! one directory held (v1's freezer folder, to list its processes) is an `O_PATH`
//! descriptor, through which a file is opened with the holder's own rights.
//!
//! The kernel checks a cgroup file's permissions when it is opened, so a descriptor opened
//! by the process that made the cgroup keeps working in a process that could not have
//! opened it. That is what lets the event loop that schedules calls run without the rights
//! that make cgroups, and why the set is closed: a weight only shifts the CPU between
//! siblings under a folder whose limits the maker wrote, a freeze stops only this cgroup's
//! processes, and reading counters changes nothing.

use std::cell::Cell;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{io_err, CgroupError, Limits, Usage, Weight};

/// What may be done to a cgroup without privilege (see the module's comment).
pub trait CgroupView: Send {
    /// For logs and messages.
    fn describe(&self) -> String;
    fn usage(&self) -> Result<Usage, CgroupError>;
    /// Freeze it, and wait (two seconds at most) until its processes are frozen.
    fn freeze(&self) -> Result<(), CgroupError>;
    fn thaw(&self) -> Result<(), CgroupError>;
    /// Whether any process is still in it.
    fn is_empty(&self) -> Result<bool, CgroupError>;
    /// Its share of a contended CPU (see [`Weight`]).
    fn set_weight(&self, w: Weight) -> Result<(), CgroupError>;
    /// New limits were written to the cgroup since the view was made: its foreground
    /// weight follows them (as the maker's `set_limits` wrote it).
    fn follow(&self, limits: &Limits);
    /// Another view of the same cgroup (its descriptors duplicated), with the same
    /// foreground weight: the maker keeps one and hands out copies.
    fn duplicate(&self) -> Result<Box<dyn CgroupView>, CgroupError>;
}

/// A cgroup's view as a fixed set of descriptors (see the module's comment).
pub struct HandedView {
    /// The cgroup's folder (its memory folder on v1): for messages.
    dir: PathBuf,
    files: Files,
    /// The weight in the foreground (`cpu.shares` on v1, `cpu.weight` on v2).
    foreground: Cell<u64>,
}

enum Files {
    V1 {
        /// Its folders in the cpu, cpuacct and freezer hierarchies (the memory one is
        /// `HandedView::dir`): for messages only.
        cpu_dir: PathBuf,
        cpuacct_dir: PathBuf,
        freezer_path: PathBuf,
        /// Written to freeze and thaw, read to see it frozen.
        freezer_state: File,
        /// The freezer folder (`O_PATH`): its `cgroup.procs` is opened afresh for each
        /// listing, as v1 keeps the list a held descriptor read for a second.
        freezer_dir: OwnedFd,
        shares: File,
        oom_control: File,
        max_usage: File,
        cpuacct_usage: File,
    },
    V2 {
        freeze: File,
        events: File,
        memory_events: File,
        /// `memory.peak`, on kernels that have it.
        peak: Option<File>,
        cpu_stat: File,
        weight: File,
    },
}

/// Open `name` in the folder `dir` (a descriptor) with `flags`; `path` names it in errors.
pub(crate) fn open_at(
    dir: &impl AsRawFd,
    name: &str,
    flags: libc::c_int,
    path: &Path,
) -> Result<File, CgroupError> {
    let einval = || {
        io_err(
            "open",
            path,
            std::io::Error::from_raw_os_error(libc::EINVAL),
        )
    };
    let cname = CString::new(name).map_err(|_| einval())?;
    // SAFETY: openat on a directory descriptor the caller holds, with a NUL-terminated
    // name; the descriptor returned is ours alone.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), cname.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io_err("open", path, std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Open `name` in the folder `dir` (a path).
fn open_in(dir: &Path, name: &str, write: bool) -> Result<File, CgroupError> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open(dir.join(name))
        .map_err(|e| io_err("open", &dir.join(name), e))
}

/// A held cgroupfs file read whole from its start (each read regenerates it).
fn read_whole(file: &File, path: &Path) -> Result<String, CgroupError> {
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // A seq_file read stops short at a page of output: read on until nothing comes.
        let n = file
            .read_at(&mut buf, text.len() as u64)
            .map_err(|e| io_err("read", path, e))?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// A whole value written to a held cgroupfs file in one write(2).
fn write_whole(file: &File, value: &str, path: &Path) -> Result<(), CgroupError> {
    match file.write_at(value.as_bytes(), 0) {
        Ok(n) if n == value.len() => Ok(()),
        Ok(_) => Err(io_err(
            &format!("write {value:?} to"),
            path,
            std::io::ErrorKind::WriteZero.into(),
        )),
        Err(e) => Err(io_err(&format!("write {value:?} to"), path, e)),
    }
}

/// The number after `key ` on its own line of a flat-keyed file (0 when absent).
pub(crate) fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// How long a freeze is waited for.
const FREEZE_WAIT: Duration = Duration::from_secs(2);

impl HandedView {
    /// The view of a v1 cgroup, from its folders (path and descriptor) in the memory, cpu,
    /// cpuacct and freezer hierarchies, and its foreground `cpu.shares`.
    pub(crate) fn v1(
        memory: (&Path, &OwnedFd),
        cpu: (&Path, &OwnedFd),
        cpuacct: (&Path, &OwnedFd),
        freezer: (&Path, &OwnedFd),
        foreground: u64,
    ) -> Result<HandedView, CgroupError> {
        let at = |(dir, fd): (&Path, &OwnedFd), name: &str, flags| {
            open_at(fd, name, flags, &dir.join(name))
        };
        let freezer_dir = freezer
            .1
            .try_clone()
            .map_err(|e| io_err("hold", freezer.0, e))?;
        Ok(HandedView {
            dir: memory.0.to_path_buf(),
            files: Files::V1 {
                cpu_dir: cpu.0.to_path_buf(),
                cpuacct_dir: cpuacct.0.to_path_buf(),
                freezer_path: freezer.0.to_path_buf(),
                freezer_state: at(freezer, "freezer.state", libc::O_RDWR)?,
                freezer_dir,
                shares: at(cpu, "cpu.shares", libc::O_WRONLY)?,
                oom_control: at(memory, "memory.oom_control", libc::O_RDONLY)?,
                max_usage: at(memory, "memory.max_usage_in_bytes", libc::O_RDONLY)?,
                cpuacct_usage: at(cpuacct, "cpuacct.usage", libc::O_RDONLY)?,
            },
            foreground: Cell::new(foreground),
        })
    }

    /// The view of the v2 cgroup `dir`, whose foreground `cpu.weight` is `foreground`.
    pub(crate) fn v2(dir: &Path, foreground: u64) -> Result<HandedView, CgroupError> {
        let peak = match open_in(dir, "memory.peak", false) {
            Ok(f) => Some(f),
            Err(CgroupError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        Ok(HandedView {
            dir: dir.to_path_buf(),
            files: Files::V2 {
                freeze: open_in(dir, "cgroup.freeze", true)?,
                events: open_in(dir, "cgroup.events", false)?,
                memory_events: open_in(dir, "memory.events", false)?,
                peak,
                cpu_stat: open_in(dir, "cpu.stat", false)?,
                weight: open_in(dir, "cpu.weight", true)?,
            },
            foreground: Cell::new(foreground),
        })
    }

    /// Where the file `name` of this cgroup is, for messages.
    fn path(&self, name: &str) -> PathBuf {
        let dir = match &self.files {
            Files::V1 {
                cpu_dir,
                cpuacct_dir,
                freezer_path,
                ..
            } => match name.split('.').next() {
                Some("cpu") => cpu_dir,
                Some("cpuacct") => cpuacct_dir,
                Some("freezer" | "cgroup") => freezer_path,
                _ => &self.dir,
            },
            Files::V2 { .. } => &self.dir,
        };
        dir.join(name)
    }

    fn frozen(&self) -> Result<bool, CgroupError> {
        Ok(match &self.files {
            Files::V1 { freezer_state, .. } => {
                read_whole(freezer_state, &self.path("freezer.state"))?.trim() == "FROZEN"
            }
            Files::V2 { events, .. } => {
                keyed(&read_whole(events, &self.path("cgroup.events"))?, "frozen") == 1
            }
        })
    }
}

impl CgroupView for HandedView {
    fn describe(&self) -> String {
        match self.files {
            Files::V1 { .. } => format!("v1 {}", self.dir.display()),
            Files::V2 { .. } => format!("v2 {}", self.dir.display()),
        }
    }

    fn usage(&self) -> Result<Usage, CgroupError> {
        match &self.files {
            Files::V1 {
                oom_control,
                max_usage,
                cpuacct_usage,
                ..
            } => {
                let oom = read_whole(oom_control, &self.path("memory.oom_control"))?;
                let peak = read_whole(max_usage, &self.path("memory.max_usage_in_bytes"))?;
                let cpu = read_whole(cpuacct_usage, &self.path("cpuacct.usage"))?;
                let cpu_ns: u64 = cpu.trim().parse().unwrap_or(0);
                Ok(Usage {
                    oom_kills: keyed(&oom, "oom_kill"),
                    peak_bytes: peak.trim().parse().unwrap_or(0),
                    cpu_usec: cpu_ns / 1000,
                })
            }
            Files::V2 {
                memory_events,
                peak,
                cpu_stat,
                ..
            } => {
                let events = read_whole(memory_events, &self.path("memory.events"))?;
                let peak = match peak {
                    Some(f) => read_whole(f, &self.path("memory.peak"))?
                        .trim()
                        .parse()
                        .unwrap_or(0),
                    None => 0,
                };
                let cpu = read_whole(cpu_stat, &self.path("cpu.stat"))?;
                Ok(Usage {
                    oom_kills: keyed(&events, "oom_kill"),
                    peak_bytes: peak,
                    cpu_usec: keyed(&cpu, "usage_usec"),
                })
            }
        }
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        match &self.files {
            Files::V1 { freezer_state, .. } => {
                write_whole(freezer_state, "FROZEN", &self.path("freezer.state"))?
            }
            Files::V2 { freeze, .. } => write_whole(freeze, "1", &self.path("cgroup.freeze"))?,
        }
        let deadline = Instant::now() + FREEZE_WAIT;
        while !self.frozen()? && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        match &self.files {
            Files::V1 { freezer_state, .. } => {
                write_whole(freezer_state, "THAWED", &self.path("freezer.state"))
            }
            Files::V2 { freeze, .. } => write_whole(freeze, "0", &self.path("cgroup.freeze")),
        }
    }

    fn is_empty(&self) -> Result<bool, CgroupError> {
        match &self.files {
            Files::V1 { freezer_dir, .. } => {
                let path = self.path("cgroup.procs");
                let procs = open_at(freezer_dir, "cgroup.procs", libc::O_RDONLY, &path)?;
                let text = read_whole(&procs, &path)?;
                Ok(!text.lines().any(|l| l.trim().parse::<i32>().is_ok()))
            }
            Files::V2 { events, .. } => {
                let text = read_whole(events, &self.path("cgroup.events"))?;
                Ok(keyed(&text, "populated") == 0)
            }
        }
    }

    fn set_weight(&self, w: Weight) -> Result<(), CgroupError> {
        let fg = self.foreground.get();
        match &self.files {
            Files::V1 { shares, .. } => {
                let value = match w {
                    Weight::Foreground => fg,
                    Weight::Background => (fg / 4).max(2),
                };
                write_whole(shares, &value.to_string(), &self.path("cpu.shares"))
            }
            Files::V2 { weight, .. } => {
                let value = match w {
                    Weight::Foreground => fg,
                    Weight::Background => (fg / 4).max(1),
                };
                write_whole(weight, &value.to_string(), &self.path("cpu.weight"))
            }
        }
    }

    fn duplicate(&self) -> Result<Box<dyn CgroupView>, CgroupError> {
        let dup = |f: &File, name: &str| {
            f.try_clone()
                .map_err(|e| io_err("hold", &self.path(name), e))
        };
        let files = match &self.files {
            Files::V1 {
                cpu_dir,
                cpuacct_dir,
                freezer_path,
                freezer_state,
                freezer_dir,
                shares,
                oom_control,
                max_usage,
                cpuacct_usage,
            } => Files::V1 {
                cpu_dir: cpu_dir.clone(),
                cpuacct_dir: cpuacct_dir.clone(),
                freezer_path: freezer_path.clone(),
                freezer_state: dup(freezer_state, "freezer.state")?,
                freezer_dir: freezer_dir
                    .try_clone()
                    .map_err(|e| io_err("hold", freezer_path, e))?,
                shares: dup(shares, "cpu.shares")?,
                oom_control: dup(oom_control, "memory.oom_control")?,
                max_usage: dup(max_usage, "memory.max_usage_in_bytes")?,
                cpuacct_usage: dup(cpuacct_usage, "cpuacct.usage")?,
            },
            Files::V2 {
                freeze,
                events,
                memory_events,
                peak,
                cpu_stat,
                weight,
            } => Files::V2 {
                freeze: dup(freeze, "cgroup.freeze")?,
                events: dup(events, "cgroup.events")?,
                memory_events: dup(memory_events, "memory.events")?,
                peak: match peak {
                    Some(f) => Some(dup(f, "memory.peak")?),
                    None => None,
                },
                cpu_stat: dup(cpu_stat, "cpu.stat")?,
                weight: dup(weight, "cpu.weight")?,
            },
        };
        Ok(Box::new(HandedView {
            dir: self.dir.clone(),
            files,
            foreground: Cell::new(self.foreground.get()),
        }))
    }

    fn follow(&self, limits: &Limits) {
        self.foreground.set(match self.files {
            Files::V1 { .. } => limits.cpu_shares(),
            Files::V2 { .. } => limits.cpu_weight(),
        });
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use std::os::fd::RawFd;
    use std::process::Command;

    use super::*;
    use crate::Backend;

    const NAME: &str = "view::tests::a_view_works_without_privilege_and_grants_nothing_more";

    /// The test runs again in a process of its own (this binary, with only this test), so
    /// that what it does to cgroups happens to that process and not to the test runner.
    #[test]
    fn a_view_works_without_privilege_and_grants_nothing_more() {
        if std::env::var_os("ZYGO_VIEW_TEST_CHILD").is_some() {
            in_child();
            return;
        }
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("{NAME}: not run: it needs root (to make a cgroup and give root up)");
            return;
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env("ZYGO_VIEW_TEST_CHILD", "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the test did not run: {text}");
    }

    fn in_child() {
        let backend = Backend::detect().unwrap();
        let cg = backend
            .create(&format!("view-test-{}", std::process::id()))
            .unwrap();
        let limits = Limits {
            mem_bytes: Some(64 << 20),
            cpu_millis: 500,
            pids: 16,
            io_bps: 1 << 27,
            io_iops: 1000,
        };
        cg.set_limits(&limits).unwrap();
        let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = i32::try_from(sleeper.id()).unwrap();
        cg.add_pid(pid).unwrap();
        // The maker keeps the view it made and hands out a copy.
        let kept = cg.view().unwrap();
        let view = kept.duplicate().unwrap();
        let weight_file = match &backend {
            Backend::V1(_) => weight_path(pid, "cpu", "cpu.shares"),
            Backend::V2(_) => weight_path(pid, "", "cpu.weight"),
        };
        let background = match &backend {
            Backend::V1(_) => limits.cpu_shares() / 4,
            Backend::V2(_) => limits.cpu_weight() / 4,
        };
        // SAFETY: the child runs the checks below (system calls, reads of held files) and
        // leaves with _exit; this process has one thread running (--test-threads=1).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
        if child == 0 {
            // On v1 the view holds its freezer folder (and the cgroup object its folders).
            let folders = matches!(backend, Backend::V1(_));
            let step = unprivileged(&*view, &weight_file, background, folders);
            // SAFETY: leaving the child without running the parent's code again.
            unsafe { libc::_exit(step) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        let emptied = view.is_empty().unwrap();
        drop(cg);
        backend.release_root();
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the unprivileged process failed at step {} (status {status:#x})",
            libc::WEXITSTATUS(status)
        );
        assert!(
            emptied,
            "the view sees the cgroup empty once its process is gone"
        );
    }

    /// The weight file of the cgroup of `pid` in the hierarchy of `controller` ("" for v2),
    /// from `/proc/<pid>/cgroup` (each v1 hierarchy places a process on its own path).
    fn weight_path(pid: i32, controller: &str, file: &str) -> PathBuf {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let path = text
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let _ = parts.next()?;
                let controllers = parts.next()?;
                let path = parts.next()?;
                controllers
                    .split(',')
                    .any(|c| c == controller)
                    .then_some(path)
            })
            .unwrap();
        let base = match controller {
            "" => PathBuf::from("/sys/fs/cgroup"),
            c => Path::new("/sys/fs/cgroup").join(c),
        };
        base.join(path.trim_start_matches('/')).join(file)
    }

    /// As nobody (uid and gid 65534, no capability): the view does its work, and no cgroup
    /// descriptor this process holds opens an attach or limit file. 0, or the failed step.
    fn unprivileged(
        view: &dyn CgroupView,
        weight_file: &Path,
        background: u64,
        folders: bool,
    ) -> i32 {
        // SAFETY: plain system calls on this process's own ids.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(65534, 65534, 65534) != 0
                || libc::setresuid(65534, 65534, 65534) != 0
            {
                return 1;
            }
        }
        if view.freeze().is_err() || view.thaw().is_err() {
            return 2;
        }
        if view.set_weight(Weight::Background).is_err()
            || std::fs::read_to_string(weight_file)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                != Some(background)
        {
            return 3;
        }
        if view.usage().is_err() || view.is_empty().ok() != Some(false) {
            return 4;
        }
        if view.set_weight(Weight::Foreground).is_err() {
            return 5;
        }
        // Every descriptor of a cgroup folder held here (the view's, and those of the
        // cgroup object inherited from the parent) opens nothing that moves a process or
        // changes a limit.
        let held = held_cgroup_folders();
        if folders && held.is_empty() {
            return 7;
        }
        for fd in held {
            for name in [
                "cgroup.procs",
                "tasks",
                "memory.limit_in_bytes",
                "memory.max",
                "pids.max",
                "cpu.cfs_quota_us",
                "cpu.max",
                "cgroup.kill",
                "cgroup.subtree_control",
            ] {
                let path = Path::new(name);
                if open_at(&Raw(fd), name, libc::O_WRONLY, path).is_ok() {
                    return 6;
                }
            }
        }
        0
    }

    struct Raw(RawFd);

    impl AsRawFd for Raw {
        fn as_raw_fd(&self) -> RawFd {
            self.0
        }
    }

    /// This process's descriptors of folders under /sys/fs/cgroup.
    fn held_cgroup_folders() -> Vec<RawFd> {
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| {
                let e = e.ok()?;
                let target = std::fs::read_link(e.path()).ok()?;
                let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
                (target.starts_with("/sys/fs/cgroup") && target.is_dir()).then_some(fd)
            })
            .collect()
    }
}
