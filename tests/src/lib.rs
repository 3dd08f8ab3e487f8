//! End-to-end test support: run the real `zygo` binary, as root and as an unprivileged
//! user, under a hard outer timeout, and probe the sandbox from inside with Python.
//!
//! - [`zygo_bin`] finds the binary (`$ZYGO_BIN`, else the `zygo` cargo built with the tests).
//! - [`Who`] says who runs it; [`both_tests!`] turns one test body (and
//!   [`root_and_rootless!`] each named function) into a `root` and a `rootless` test. The
//!   rootless side (a system user, a delegated cgroup subtree, a copy of the binary that
//!   user can execute) is set up once per test process.
//! - [`run_json`] / [`py`] run `zygo run --json` and parse its answer; [`finish`] runs any
//!   command with the outer timeout and reports its exit code, output, wall time and peak RSS.
//! - [`probe`] runs a Python probe behind the safety guard ([`GUARD`]): the script first
//!   proves it is in its own user, mount and pid namespaces, and exits with
//!   [`REFUSED_CODE`] without probing anything otherwise.
//! - [`Sup`] (module [`sup`]) is a supervisor of a test's own (`zygo up` with private
//!   runtime and state directories), checked at the end for leftover cgroups and processes.
//! - [`api`] talks to a test's supervisor as `zygo api` does, and starts a real `zygo api`
//!   in front of it; [`http`] is the raw HTTP/1.1 client the API suites share.
//! - [`netns`] makes a test host: a network namespace with a veth pair and a server of the
//!   test's own, the only thing besides loopback that network tests may talk to.
//! - [`skip`] is how a test that cannot run here (not root, a program missing) says so:
//!   `scripts/test` counts it as skipped, not passed, and under `ZYGO_TEST_NO_SKIPS=1`
//!   (CI) it fails.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod api;
pub mod http;
pub mod netns;
pub mod skip;
pub mod sup;
pub use skip::skip;
pub use sup::*;

/// Every zygo process is killed (and the test failed) after this long.
pub const OUTER_TIMEOUT: Duration = Duration::from_secs(60);
/// The system user rootless runs use.
pub const ROOTLESS_USER: &str = "zygo-rootless";
/// The cgroup subtree delegated to that user, relative to the test's own cgroup.
pub const ROOTLESS_CGROUP: &str = "zygo-rootless-test";
/// Everything this suite creates in /tmp starts with this.
pub const TMP_PREFIX: &str = "zygo-tests-";
/// The exit code of a probe whose guard found it was not sandboxed.
pub const REFUSED_CODE: i32 = 99;
/// The v1 controllers Zygo uses (the v2 ones are memory, pids, cpu).
pub const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
/// The v1 hierarchy of I/O limits, which Zygo uses when it may (on v2: the io controller).
pub const V1_IO_CONTROLLER: &str = "blkio";

/// The `zygo` binary under test: `$ZYGO_BIN`, else the one cargo built beside this test
/// (a test runs from `<target>/<triple>/<profile>/deps/`, the binary is in `<profile>/`).
pub fn zygo_bin() -> PathBuf {
    let path = match std::env::var_os("ZYGO_BIN") {
        Some(p) => PathBuf::from(p),
        None => built_beside_test(),
    };
    assert!(
        path.is_file(),
        "no zygo binary at {}: build it first with `cargo build`",
        path.display()
    );
    path
}

fn built_beside_test() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("zygo")))
        .unwrap_or_else(|| PathBuf::from("zygo"))
}

/// Who runs `zygo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// The test process itself, as root.
    Root,
    /// An unprivileged user with a delegated cgroup subtree.
    Rootless,
}

/// Every probe runs for both.
pub fn both() -> [Who; 2] {
    [Who::Root, Who::Rootless]
}

impl Who {
    pub fn name(self) -> &'static str {
        match self {
            Who::Root => "root",
            Who::Rootless => "rootless",
        }
    }

    /// Whether this kind of run is possible here (root runs need a root test process).
    pub fn available(self) -> bool {
        self == Who::Rootless || am_root()
    }
}

/// One test body, run as two tests: `NAME::root` and `NAME::rootless`.
///
/// ```text
/// both_tests! {
///     /// What this proves.
///     fn writes_fail(who) { let (v, _) = py(who, &[], "..."); }
/// }
/// ```
/// Attributes (e.g. `#[ignore = "..."]`) apply to both; to ignore only one of the two,
/// write the two tests by hand.
#[macro_export]
macro_rules! both_tests {
    ($($(#[$meta:meta])* fn $name:ident($who:ident) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($who: $crate::Who) $body

            $(#[$meta])*
            #[test]
            fn root() {
                $crate::run_as($crate::Who::Root, body)
            }

            $(#[$meta])*
            #[test]
            fn rootless() {
                $crate::run_as($crate::Who::Rootless, body)
            }
        }
    )*};
}

/// Functions `fn NAME(who: Who)` of the calling module, each run as two tests:
/// `NAME::root` and `NAME::rootless` (the functions stay ordinary code, which rustfmt
/// formats, unlike a body inside [`both_tests!`]).
///
/// ```text
/// root_and_rootless!(python_pool, warm_exec);
/// ```
#[macro_export]
macro_rules! root_and_rootless {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn root() {
                $crate::run_as($crate::Who::Root, super::$name)
            }

            #[test]
            fn rootless() {
                $crate::run_as($crate::Who::Rootless, super::$name)
            }
        }
    )*};
}

/// Run `body` as `who`, or [`skip`] the test when that kind of run is not possible here.
#[track_caller]
pub fn run_as(who: Who, body: fn(Who)) {
    if !who.available() {
        skip(&format!(
            "{} runs need the tests to run as root",
            who.name()
        ));
        return;
    }
    body(who)
}

/// Whether a root-only test can run here; when not, the test is [`skip`]ped and must
/// return.
#[track_caller]
pub fn root_only() -> bool {
    if Who::Root.available() {
        true
    } else {
        skip("this test needs to run as root");
        false
    }
}

/// The Landlock ABI of this kernel (0 without Landlock).
pub fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only
    // returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    v.max(0)
}

pub fn am_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------------------
// Rootless setup.

/// What a rootless run needs: the user's ids and a copy of zygo it can execute.
pub struct Rootless {
    pub uid: u32,
    pub gid: u32,
    pub bin: PathBuf,
}

/// The rootless setup, done once per test process (idempotent across processes).
pub fn rootless_setup() -> &'static Rootless {
    static SETUP: OnceLock<Rootless> = OnceLock::new();
    SETUP.get_or_init(|| {
        if !am_root() {
            // Already unprivileged: run as ourselves, with whatever ZYGO_CGROUP says.
            // SAFETY: getuid/getgid cannot fail.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            return Rootless {
                uid,
                gid,
                bin: zygo_bin(),
            };
        }
        let (uid, gid) = match user_ids(ROOTLESS_USER) {
            Some(ids) => ids,
            None => {
                let st = Command::new("useradd")
                    .args([
                        "--system",
                        "--no-create-home",
                        "--shell",
                        "/usr/sbin/nologin",
                        ROOTLESS_USER,
                    ])
                    .status()
                    .expect("run useradd");
                // Another test process may have created it meanwhile (exit 9: exists).
                assert!(
                    st.success() || st.code() == Some(9),
                    "useradd {ROOTLESS_USER}: {st}"
                );
                user_ids(ROOTLESS_USER).expect("the rootless user exists after useradd")
            }
        };
        delegate_cgroups(uid, gid);
        // One folder per checkout: two checkouts' suites may run at once on one machine.
        let src = zygo_bin();
        let tag = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            src.hash(&mut h);
            h.finish()
        };
        let dir = PathBuf::from(format!("/tmp/zygo-tests-bin-{tag:016x}"));
        let bin = copy_binary(&src, &dir, "zygo");
        Rootless { uid, gid, bin }
    })
}

/// uid and gid of a user, read from `/etc/passwd` itself. Never through glibc's
/// `getpwnam`: this binary is linked statically, and static glibc's NSS crashes looking
/// past `files` for a user that does not exist (see `no_code_of_ours_calls_glibc_nss`).
pub fn user_ids(name: &str) -> Option<(u32, u32)> {
    passwd_ids(&fs::read_to_string("/etc/passwd").ok()?, name)
}

/// uid and gid of `name` in a passwd-format text (`name:x:uid:gid:...`).
pub fn passwd_ids(text: &str, name: &str) -> Option<(u32, u32)> {
    text.lines().find_map(|line| {
        let mut f = line.split(':');
        if f.next()? != name {
            return None;
        }
        let _password = f.next()?;
        Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
    })
}

/// Copy `src` to `dir/name` (dir 0755, file 0755) by rename, so that a concurrently
/// running copy is never overwritten in place.
pub fn copy_binary(src: &Path, dir: &Path, name: &str) -> PathBuf {
    fs::create_dir_all(dir).expect("create the binary directory");
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).expect("chmod the bin dir");
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    fs::copy(src, &tmp).expect("copy the zygo binary");
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).expect("chmod zygo");
    let dst = dir.join(name);
    fs::rename(&tmp, &dst).expect("rename the zygo binary into place");
    dst
}

/// Give the rootless user `<base>/zygo-rootless-test` in every hierarchy Zygo uses, where
/// the base is the test's own cgroup or, on cgroup v2, the one `$ZYGO_CGROUP` names (a
/// cgroup v2 that holds processes, like the test's own, cannot give its children
/// controllers). On v2 the subtree has a leaf, `zygo-monitor`, that the rootless `zygo`
/// is started in, as `systemd-run --user --scope -p Delegate=yes` would start it.
fn delegate_cgroups(uid: u32, gid: u32) {
    if is_cgroup_v2_host() {
        let base = v2_base_dir();
        let dir = base.join(ROOTLESS_CGROUP);
        let _ = fs::create_dir_all(dir.join("zygo-monitor"));
        // Best effort: controllers can only be enabled where the no-internal-process rule
        // allows it; Zygo's refusal says so when they are missing.
        let _ = fs::write(base.join("cgroup.subtree_control"), "+memory +pids +cpu");
        let _ = fs::write(base.join("cgroup.subtree_control"), "+io");
        chown_tree(&dir, uid, gid);
        return;
    }
    for ctrl in V1_CONTROLLERS.into_iter().chain([V1_IO_CONTROLLER]) {
        let Some(own) = v1_own_dir(ctrl) else {
            continue;
        };
        let dir = own.join(ROOTLESS_CGROUP);
        if let Err(e) = fs::create_dir(&dir) {
            assert!(
                e.kind() == std::io::ErrorKind::AlreadyExists,
                "create {}: {e}",
                dir.display()
            );
        }
        chown_tree(&dir, uid, gid);
    }
}

/// On a cgroup v2 host, the directory Zygo's tree goes under for root runs: the one
/// `$ZYGO_CGROUP` names (absolute, or relative to our own cgroup), else our own cgroup.
pub fn v2_base_dir() -> PathBuf {
    match std::env::var("ZYGO_CGROUP").ok().filter(|s| !s.is_empty()) {
        Some(b) if b.starts_with('/') => {
            let point = cgroup_mounts()
                .into_iter()
                .find(|(_, v2, _)| *v2)
                .map_or_else(|| PathBuf::from("/sys/fs/cgroup"), |(p, _, _)| p);
            join_cg(&point, &b)
        }
        Some(b) => unified_own_dir().join(b.trim_matches('/')),
        None => unified_own_dir(),
    }
}

/// The rootless subtree as a cgroup path, for the rootless user's `$ZYGO_CGROUP`.
fn rootless_cgroup_env() -> String {
    if !is_cgroup_v2_host() {
        return ROOTLESS_CGROUP.to_string();
    }
    let dir = v2_base_dir().join(ROOTLESS_CGROUP);
    let point = cgroup_mounts()
        .into_iter()
        .find(|(_, v2, _)| *v2)
        .map_or_else(|| PathBuf::from("/sys/fs/cgroup"), |(p, _, _)| p);
    match dir.strip_prefix(&point) {
        Ok(rel) => format!("/{}", rel.display()),
        Err(_) => ROOTLESS_CGROUP.to_string(),
    }
}

fn chown_tree(dir: &Path, uid: u32, gid: u32) {
    let _ = std::os::unix::fs::chown(dir, Some(uid), Some(gid));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                chown_tree(&p, uid, gid);
            } else {
                let _ = std::os::unix::fs::chown(&p, Some(uid), Some(gid));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Host cgroups and processes.

/// A pure cgroup v2 host (no v1 hierarchies at /sys/fs/cgroup).
pub fn is_cgroup_v2_host() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// `/proc/self/cgroup`: (controllers, path) per line.
pub fn own_cgroups() -> Vec<(Vec<String>, String)> {
    parse_cgroups(&fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup"))
}

/// The lines of a `/proc/<pid>/cgroup`: (controllers, path) per line.
pub fn parse_cgroups(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let _id = it.next()?;
            let ctrls = it.next()?;
            let path = it.next()?;
            Some((
                ctrls
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path.to_string(),
            ))
        })
        .collect()
}

/// A process's cgroup path in the memory hierarchy (the unified one on a v2 host); ""
/// when it cannot be read.
pub fn memory_cgroup(pid: i32) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let v2 = is_cgroup_v2_host();
    parse_cgroups(&text)
        .into_iter()
        .find(|(ctrls, _)| {
            if v2 {
                ctrls.is_empty()
            } else {
                ctrls.iter().any(|c| c == "memory")
            }
        })
        .map(|(_, path)| path)
        .unwrap_or_default()
}

/// cgroup mounts from `/proc/self/mountinfo`: (mount point, is v2, super options).
pub fn cgroup_mounts() -> Vec<(PathBuf, bool, Vec<String>)> {
    let text = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let _src = r.next();
            let opts = r.next().unwrap_or("");
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            let point = left.split(' ').nth(4)?;
            Some((
                PathBuf::from(point),
                fstype == "cgroup2",
                opts.split(',').map(str::to_string).collect(),
            ))
        })
        .collect()
}

fn join_cg(mount: &Path, cg: &str) -> PathBuf {
    let rel = cg.trim_start_matches('/');
    if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    }
}

/// `<v1 mount of ctrl><our own cgroup for ctrl>`, if that hierarchy is mounted.
pub fn v1_own_dir(ctrl: &str) -> Option<PathBuf> {
    let (point, _, _) = cgroup_mounts()
        .into_iter()
        .find(|(_, v2, opts)| !v2 && opts.iter().any(|o| o == ctrl))?;
    let (_, own) = own_cgroups()
        .into_iter()
        .find(|(c, _)| c.iter().any(|c| c == ctrl))?;
    Some(join_cg(&point, &own))
}

/// `<cgroup2 mount><our own unified cgroup>`.
pub fn unified_own_dir() -> PathBuf {
    let point = cgroup_mounts()
        .into_iter()
        .find(|(_, v2, _)| *v2)
        .map_or_else(|| PathBuf::from("/sys/fs/cgroup"), |(p, _, _)| p);
    let own = own_cgroups()
        .into_iter()
        .find(|(c, _)| c.is_empty())
        .map_or_else(|| "/".to_string(), |(_, p)| p);
    join_cg(&point, &own)
}

/// Every directory Zygo creates per-sandbox cgroups in, for root and rootless runs.
pub fn zygo_cgroup_roots() -> Vec<PathBuf> {
    let bases: Vec<PathBuf> = if is_cgroup_v2_host() {
        vec![v2_base_dir()]
    } else {
        V1_CONTROLLERS
            .into_iter()
            .chain([V1_IO_CONTROLLER])
            .filter_map(v1_own_dir)
            .collect()
    };
    bases
        .into_iter()
        .flat_map(|b| [b.join("zygo"), b.join(ROOTLESS_CGROUP).join("zygo")])
        .collect()
}

/// Every host process: (pid, cmdline with NUL separators).
pub fn host_processes() -> Vec<(i32, Vec<u8>)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").expect("list /proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) {
            out.push((pid, cmd));
        }
    }
    out
}

/// Host pids whose command line contains `needle`.
pub fn host_pids_with(needle: &[u8]) -> Vec<i32> {
    host_processes()
        .into_iter()
        .filter(|(_, cmd)| contains(cmd, needle))
        .map(|(pid, _)| pid)
        .collect()
}

/// Host pids whose command line starts with `prefix` (NUL-separated arguments).
pub fn host_pids_starting_with(prefix: &[u8]) -> Vec<i32> {
    host_processes()
        .into_iter()
        .filter(|(_, cmd)| cmd.starts_with(prefix))
        .map(|(pid, _)| pid)
        .collect()
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Host processes with an open descriptor on `path`: (pid, cmdline).
pub fn pids_holding(path: &Path) -> Vec<(i32, Vec<u8>)> {
    let mut out = Vec::new();
    for (pid, cmd) in host_processes() {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|e| fs::read_link(e.path()).is_ok_and(|t| t == path))
        {
            out.push((pid, cmd));
        }
    }
    out
}

/// A host process's parent.
pub fn ppid(pid: i32) -> Option<i32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether host process `pid` descends from `ancestor` (within 16 generations).
pub fn descends_from(pid: i32, ancestor: i32) -> bool {
    let mut at = pid;
    for _ in 0..16 {
        match ppid(at) {
            Some(q) if q == ancestor => return true,
            Some(q) if q > 1 => at = q,
            _ => return false,
        }
    }
    false
}

/// Whether a host process is alive (and not a zombie).
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// How many times slower than a development machine this one runs: `$ZYGO_TEST_SLOWDOWN`
/// (a whole number, default 1; the guest's software emulation sets 4). The harness's
/// waits are stretched by it, never what a test asserts about Zygo's own deadlines.
pub fn slowdown() -> u32 {
    std::env::var("ZYGO_TEST_SLOWDOWN")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| (1..=20).contains(n))
        .unwrap_or(1)
}

/// A wait of the harness, stretched by [`slowdown`].
pub fn slow(d: Duration) -> Duration {
    d * slowdown()
}

/// Poll `cond` every 50 ms; panic naming `what` after `limit` (stretched by [`slowdown`]).
#[track_caller]
pub fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let limit = slow(limit);
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < limit,
            "timed out after {}s waiting for {what}",
            limit.as_secs_f32()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Poll `cond` every 50 ms for at most `limit` (stretched by [`slowdown`]); whether it came
/// true.
pub fn wait_for_quietly(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let limit = slow(limit);
    let t0 = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if t0.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A unique number for names and markers.
pub fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    (u64::from(std::process::id()) << 32) ^ (N.fetch_add(1, Ordering::Relaxed) << 20) ^ t
}

// ---------------------------------------------------------------------------------------
// Temporary host directories.

/// A directory under /tmp, removed on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    /// `/tmp/zygo-tests-<unique>`, with `mode` (e.g. 0o755 so the rootless user can enter).
    pub fn new(mode: u32) -> TempDir {
        let path = std::env::temp_dir().join(format!("{TMP_PREFIX}{:x}", unique()));
        fs::create_dir(&path).expect("create a temp dir");
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod temp dir");
        TempDir { path }
    }

    /// A file in this directory with `text`, mode 0644.
    pub fn file(&self, name: &str, text: &[u8]) -> PathBuf {
        let p = self.path.join(name);
        fs::write(&p, text).expect("write a temp file");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod temp file");
        p
    }

    pub fn str(&self) -> &str {
        self.path.to_str().expect("temp paths are UTF-8")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

// ---------------------------------------------------------------------------------------
// Running zygo.

/// A `zygo` command for `who`, from the given binary, with a clean environment.
pub fn zygo_with(who: Who, bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir("/")
        .stdin(Stdio::null());
    for key in ["ZYGO_LOG", "RUST_LOG", "ZYGO_ALLOW_UNSCOPED_REQUESTS"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    match who {
        Who::Root => {
            cmd.env("HOME", "/root");
            for key in ["ZYGO_SUBID", "ZYGO_CGROUP"] {
                if let Some(v) = std::env::var_os(key) {
                    cmd.env(key, v);
                }
            }
        }
        Who::Rootless => {
            let r = rootless_setup();
            cmd.env("HOME", "/tmp");
            if am_root() {
                cmd.uid(r.uid)
                    .gid(r.gid)
                    .env("ZYGO_CGROUP", rootless_cgroup_env());
                if is_cgroup_v2_host() {
                    start_in_rootless_leaf(&mut cmd);
                }
            } else if let Some(v) = std::env::var_os("ZYGO_CGROUP") {
                cmd.env("ZYGO_CGROUP", v);
            }
        }
    }
    cmd
}

/// Start the rootless `zygo` in the leaf of its delegated subtree. On cgroup v2 a process
/// may move another only where it can write `cgroup.procs` of a cgroup holding both, which
/// the rootless user cannot where the test runs; the file is opened here, as root, and
/// the kernel checks the opener's credentials when the child writes "0" to it.
fn start_in_rootless_leaf(cmd: &mut Command) {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let procs = v2_base_dir()
        .join(ROOTLESS_CGROUP)
        .join("zygo-monitor")
        .join("cgroup.procs");
    let file = match fs::OpenOptions::new().write(true).open(&procs) {
        Ok(f) => f,
        Err(e) => panic!("open {}: {e}", procs.display()),
    };
    // SAFETY: the closure only writes to a file descriptor it owns (no allocation beyond
    // the fixed buffer, no locks), between fork and exec.
    unsafe {
        cmd.pre_exec(move || (&file).write_all(b"0"));
    }
}

/// A raw `zygo` command for `who` (add the arguments yourself; run it with [`finish`]).
pub fn zygo(who: Who) -> Command {
    match who {
        Who::Root => zygo_with(who, &zygo_bin()),
        Who::Rootless => zygo_with(who, &rootless_setup().bin),
    }
}

/// How a command ended.
#[derive(Debug)]
pub struct Finished {
    pub pid: i32,
    /// Exit code, or 128+signal.
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// From spawn to exit, measured here.
    pub elapsed: Duration,
    /// Peak RSS of the process and the descendants it waited for (wait4's rusage), in KiB.
    pub max_rss_kb: i64,
}

impl Finished {
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The last non-empty line of stdout as JSON (Null if it is not).
    pub fn last_json(&self) -> Value {
        String::from_utf8_lossy(&self.stdout)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null)
    }

    /// Every non-empty line of stdout as JSON (panics on one that is not).
    pub fn json_lines(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))
            })
            .collect()
    }
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Spawn `cmd`, again for a moment while the program is "Text file busy": a binary a test
/// has just copied can still be open for writing in a child another test thread forked
/// meanwhile (until that child execs), and exec refuses it then.
pub fn spawn_retrying(cmd: &mut Command) -> std::process::Child {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Ok(c) => return c,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("spawn {cmd:?}: {e}"),
        }
    }
}

/// Run a command to completion with pipes for stdout and stderr, killing it (and failing
/// the test) after [`OUTER_TIMEOUT`].
// The child is reaped with wait4 (for its rusage), which clippy cannot see.
#[allow(clippy::zombie_processes)]
pub fn finish(mut cmd: Command) -> Finished {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = spawn_retrying(&mut cmd);
    let pid = child.id() as i32;
    let out = reader(child.stdout.take().expect("stdout is piped"));
    let err = reader(child.stderr.take().expect("stderr is piped"));
    let mut status = 0;
    // SAFETY: rusage is plain old data; zeroes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child with valid out-pointers. std's Child never
        // waits for it after this (we do not call wait on it).
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4 {pid}: {}", std::io::Error::last_os_error());
        if t0.elapsed() > slow(OUTER_TIMEOUT) {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::wait4(pid, &mut status, 0, &mut ru);
            }
            panic!(
                "{cmd:?} did not finish within {}s; killed it",
                slow(OUTER_TIMEOUT).as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    let elapsed = t0.elapsed();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Finished {
        pid,
        code,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
        elapsed,
        max_rss_kb: ru.ru_maxrss,
    }
}

/// `zygo run --json FLAGS -- CMD...`: the parsed answer and all the rest.
pub fn run_json_full(who: Who, flags: &[&str], cmd: &[&str]) -> (Value, Finished) {
    let mut c = zygo(who);
    c.args(["run", "--json"]).args(flags).arg("--").args(cmd);
    let f = finish(c);
    let text = String::from_utf8_lossy(&f.stdout);
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "[{}] zygo run {flags:?} -- {cmd:?}: stdout is not one JSON object ({e}); exit {}\nstdout: {}\nstderr: {}",
            who.name(),
            f.code,
            truncate(&text, 2000),
            f.stderr_text()
        )
    });
    (v, f)
}

/// `zygo run --json FLAGS -- CMD...`: the parsed answer and zygo's exit code.
pub fn run_json(who: Who, flags: &[&str], cmd: &[&str]) -> (Value, i32) {
    let (v, f) = run_json_full(who, flags, cmd);
    (v, f.code)
}

/// `python3 -c CODE` in a sandbox.
pub fn py(who: Who, flags: &[&str], code: &str) -> (Value, i32) {
    run_json(who, flags, &["python3", "-c", code])
}

pub fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}... ({} bytes)", &s[..end], s.len())
    }
}

/// A field of a `--json` answer as a string ("" when missing or not a string).
pub fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// [`s`] under a name that code where `s` is a supervisor can call.
pub fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    s(v, key)
}

/// Whether `s` is `len` hex digits.
pub fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Assert that the program started and exited 0.
#[track_caller]
pub fn assert_ok(who: Who, v: &Value, code: i32) {
    assert!(
        v["started"] == true && v["exit_code"] == 0 && code == 0,
        "[{}] expected a clean run, got exit {code}: {}",
        who.name(),
        truncate(&v.to_string(), 4000)
    );
}

// ---------------------------------------------------------------------------------------
// Probes and their safety guard.

/// Python that refuses (exit 99, "REFUSED: not sandboxed") unless it runs in its own user,
/// mount and pid namespaces (inode numbers differ from the host's, passed in the
/// environment), with a pid other than the test's and a pid 1 that is not the host's init.
/// Any doubt (a missing variable, an unreadable file) also refuses.
pub const GUARD: &str = r#"
import os, sys
def _zygo_sandboxed():
    try:
        for kind in ("user", "mnt", "pid"):
            host = {int(x) for x in os.environ["ZYGO_GUARD_NS_" + kind.upper()].split()}
            if not host or os.stat("/proc/self/ns/" + kind).st_ino in host:
                return False
        if os.getpid() == int(os.environ["ZYGO_GUARD_PID"]):
            return False
        host_init = bytes.fromhex(os.environ["ZYGO_GUARD_INIT"])
        with open("/proc/1/cmdline", "rb") as f:
            if not host_init or f.read() == host_init:
                return False
        return True
    except Exception:
        return False
if not _zygo_sandboxed():
    print("REFUSED: not sandboxed")
    sys.stderr.write("REFUSED: not sandboxed\n")
    sys.exit(99)
"#;

/// Helpers every probe may use (after the guard):
/// `sc(nr, *args)` a raw x86_64 syscall → "OK" or the errno's name; `attempt(f, *args)`
/// → "OK" or the errno's name of the OSError it raised; `done(**results)` prints them as
/// one JSON line; `libc` is the C library (use_errno).
pub const PRELUDE: &str = r#"
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def ename(n):
    return errno.errorcode.get(n, str(n))
def _arg(a):
    return ctypes.c_long(a) if isinstance(a, int) else a
def raw(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return r, ctypes.get_errno()
def sc(nr, *args):
    r, e = raw(nr, *args)
    if r == 0 and nr in (56, 57, 58, 435):
        os._exit(0)  # a fork-like call that succeeded: this is the child
    return ename(e) if r == -1 else "OK"
def attempt(f, *args):
    try:
        f(*args)
        return "OK"
    except OSError as e:
        return ename(e.errno)
def done(**r):
    print(json.dumps(r))
"#;

/// The host's identity, as the guard compares it.
pub struct HostIds {
    /// (kind, inode numbers of the test process's and pid 1's namespaces of that kind)
    pub ns: Vec<(&'static str, Vec<u64>)>,
    pub pid: u32,
    pub init_cmdline: Vec<u8>,
}

pub fn host_ids() -> HostIds {
    let ns = ["user", "mnt", "pid"]
        .into_iter()
        .map(|kind| {
            let mut inos = Vec::new();
            for who in ["self", "1"] {
                if let Ok(m) = fs::metadata(format!("/proc/{who}/ns/{kind}")) {
                    inos.push(m.ino());
                }
            }
            assert!(!inos.is_empty(), "cannot read the host's {kind} namespace");
            (kind, inos)
        })
        .collect();
    HostIds {
        ns,
        pid: std::process::id(),
        init_cmdline: fs::read("/proc/1/cmdline").expect("read the host's /proc/1/cmdline"),
    }
}

/// The `--env` flags that hand the host's identity to [`GUARD`].
pub fn guard_flags() -> Vec<String> {
    let h = host_ids();
    let mut f = Vec::new();
    for (kind, inos) in &h.ns {
        let list: Vec<String> = inos.iter().map(u64::to_string).collect();
        f.push("--env".to_string());
        f.push(format!(
            "ZYGO_GUARD_NS_{}={}",
            kind.to_uppercase(),
            list.join(" ")
        ));
    }
    let hex: String = h.init_cmdline.iter().map(|b| format!("{b:02x}")).collect();
    f.push("--env".into());
    f.push(format!("ZYGO_GUARD_PID={}", h.pid));
    f.push("--env".into());
    f.push(format!("ZYGO_GUARD_INIT={hex}"));
    f
}

/// The full script of a probe: guard, prelude, then `code`.
pub fn probe_script(code: &str) -> String {
    format!("{GUARD}\n{PRELUDE}\n{code}\n")
}

/// Run `code` as a guarded Python probe; return the sandbox's answer and zygo's exit code.
pub fn guarded_py(who: Who, flags: &[&str], code: &str) -> (Value, i32) {
    let g = guard_flags();
    let mut all: Vec<&str> = g.iter().map(String::as_str).collect();
    all.extend_from_slice(flags);
    let script = probe_script(code);
    let (v, code) = py(who, &all, &script);
    assert_not_refused(who, &v, code);
    (v, code)
}

/// Assert that a guarded probe did not refuse to run.
#[track_caller]
pub fn assert_not_refused(who: Who, v: &Value, code: i32) {
    assert!(
        code != REFUSED_CODE && !s(v, "stdout").contains("REFUSED: not sandboxed"),
        "[{}] the probe's guard refused: it did not find itself sandboxed: {}",
        who.name(),
        truncate(&v.to_string(), 4000)
    );
}

/// Run a guarded probe that must exit 0 and end by calling `done(...)`; return what it
/// reported.
pub fn probe(who: Who, flags: &[&str], code: &str) -> Value {
    let (v, exit) = guarded_py(who, flags, code);
    assert_ok(who, &v, exit);
    let out = s(&v, "stdout");
    let last = out.lines().last().unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "[{}] the probe's last line is not JSON ({e}): {}",
            who.name(),
            truncate(&v.to_string(), 4000)
        )
    })
}

/// The host uid and gid that own, on disk, what id 0 inside a sandbox of `who` writes
/// into a host folder: the first ids of the subordinate range as root (each sandbox's root
/// is a host uid of its own, and handed folders are idmapped onto these), the user
/// rootless.
pub fn sandbox_host_ids(who: Who) -> (u32, u32) {
    let (v, code) = run_json(
        who,
        &[],
        &[
            "sh",
            "-c",
            "cat /proc/self/uid_map; echo; cat /proc/self/gid_map",
        ],
    );
    assert_ok(who, &v, code);
    let out = s(&v, "stdout");
    let (uid_map, gid_map) = out
        .split_once("\n\n")
        .unwrap_or_else(|| panic!("two maps: {v}"));
    let lines = |map: &str| -> Vec<Vec<u64>> {
        map.lines()
            .map(|l| {
                l.split_whitespace()
                    .map(|n| n.parse().expect("id map numbers"))
                    .collect()
            })
            .collect()
    };
    // The base: where inside 0 maps when one line maps everything, else one below
    // where inside 1 maps.
    let base = |map: &[Vec<u64>]| -> u32 {
        match map {
            [one] => one[1] as u32,
            _ => {
                let l = map
                    .iter()
                    .find(|l| l[0] == 1)
                    .unwrap_or_else(|| panic!("no id 1: {v}"));
                (l[1] - 1) as u32
            }
        }
    };
    (base(&lines(uid_map)), base(&lines(gid_map)))
}

/// Assert that a probe's result `key` is one of `expected` (errno names, or "OK").
#[track_caller]
pub fn assert_result(who: Who, r: &Value, key: &str, expected: &[&str]) {
    let got = match &r[key] {
        Value::String(s) => s.clone(),
        Value::Null => "<missing>".to_string(),
        other => other.to_string(),
    };
    assert!(
        expected.contains(&got.as_str()),
        "[{}] {key}: expected one of {expected:?}, got {got}\nall results: {r}",
        who.name()
    );
}

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.2, say): another
/// peer as the front counts them. Built by hand: std connects only from the default.
pub fn connect_from(from: std::net::Ipv4Addr, addr: &str) -> std::net::TcpStream {
    let to: std::net::SocketAddr = addr.parse().expect("an IP:PORT address");
    let std::net::SocketAddr::V4(to) = to else {
        panic!("{addr} is not IPv4")
    };
    let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, bound and connected with sockaddr_in values that live across
    // the calls; the descriptor is handed to TcpStream, which owns it from then on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let a = sin(from, 0);
        let r = libc::bind(fd, &a as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "bind {from}: {}", std::io::Error::last_os_error());
        let b = sin(*to.ip(), to.port());
        let r = libc::connect(fd, &b as *const _ as *const libc::sockaddr, len);
        assert_eq!(r, 0, "connect {addr}: {}", std::io::Error::last_os_error());
        <std::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd)
    }
}

/// A cgroup base of the test's own (under the test's cgroup in each hierarchy, named to
/// `$ZYGO_CGROUP`), so that no other Zygo process keeps Zygo's root in it alive: the runs
/// of a test make and remove `<base>/zygo` themselves. Removed when dropped.
pub struct OwnRoot {
    bases: Vec<PathBuf>,
    pub env: String,
    pub roots: Vec<PathBuf>,
}

impl OwnRoot {
    pub fn make() -> OwnRoot {
        let tag = format!("zygo-roottest-{:x}", crate::unique() & 0xff_ffff);
        // The base in each hierarchy, and what $ZYGO_CGROUP says for it.
        let (bases, env): (Vec<PathBuf>, String) = if is_cgroup_v2_host() {
            let point = cgroup_mounts()
                .into_iter()
                .find(|(_, v2, _)| *v2)
                .map(|(p, _, _)| p)
                .expect("a cgroup2 mount");
            let base = v2_base_dir().join(&tag);
            let rel = base
                .strip_prefix(&point)
                .expect("the base is under the cgroup2 mount")
                .display()
                .to_string();
            (vec![base], format!("/{rel}"))
        } else {
            let bases = V1_CONTROLLERS
                .into_iter()
                .chain([V1_IO_CONTROLLER])
                .filter_map(v1_own_dir)
                .map(|d| d.join(&tag))
                .collect();
            (bases, tag.clone())
        };
        for b in &bases {
            fs::create_dir(b).unwrap_or_else(|e| panic!("create {}: {e}", b.display()));
        }
        let roots = bases.iter().map(|b| b.join("zygo")).collect();
        OwnRoot { bases, env, roots }
    }

    /// The roots still there.
    pub fn left(&self) -> Vec<PathBuf> {
        self.roots.iter().filter(|r| r.exists()).cloned().collect()
    }

    /// Remove every (empty) cgroup under the bases, and the bases.
    pub fn cleanup(&self) {
        for b in &self.bases {
            let _ = Command::new("find")
                .args([
                    b.to_str().unwrap_or(""),
                    "-depth",
                    "-type",
                    "d",
                    "-exec",
                    "rmdir",
                    "{}",
                    "+",
                ])
                .status();
        }
    }
}

impl Drop for OwnRoot {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A pipe for a zygo run by `who`: (the test's end, the run's end). The run reads it when
/// `run_reads`. Rootless under a root test, the pipe is the rootless user's, as a pipe its
/// own shell made would be (zygo reopens its pipes through /proc, which checks the owner).
pub fn pipe_for(who: Who, run_reads: bool) -> (std::fs::File, Stdio) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 into an array of two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: two fresh descriptors that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    if who == Who::Rootless && am_root() {
        let u = rootless_setup();
        // SAFETY: fchown of a descriptor we hold.
        assert_eq!(unsafe { libc::fchown(r.as_raw_fd(), u.uid, u.gid) }, 0);
    }
    if run_reads {
        (std::fs::File::from(w), Stdio::from(r))
    } else {
        (std::fs::File::from(r), Stdio::from(w))
    }
}
