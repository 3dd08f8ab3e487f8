//! Dependency sets: a `requirements.txt` (Python) or a `package.json` with its
//! `package-lock.json` (Node), installed once into a tree that sandboxes get read-only at
//! `/venv`.
//!
//! A set's id is `deps_` and the SHA-256 of its image and files (names and bytes), so the
//! same inputs are one set whoever sends them. Everything about a set lives under
//! `<state dir>/deps/<id>/`:
//!
//! | file | what |
//! |---|---|
//! | `record.json` | `{"id", "image", "kind", "state": "building"\|"ready"\|"failed", "error"}`, replaced atomically |
//! | `input/` | the files as sent, mounted read-only into the build at `/deps-input` |
//! | `tree/` | the installed set: a sealed copy of the build's `/venv`, read-only for everyone |
//! | `build.log` | the resolver's own output (pip's, npm's), then one line of Zygo's |
//! | `lock` | held (`flock`) by the process building the set, so one build runs per id |
//!
//! The build is a one-shot sandbox on the set's image with `network = "egress"` allowed
//! only the package registries ([`registries`]); a host that cannot give a sandbox egress
//! refuses the build, which never falls back to the host's network.
//!
//! The build never writes on the host's disk. Its `/venv` is a tmpfs made for it alone
//! ([`crate::mounts::private_tmpfs`]), capped at the set's size limit
//! (`ZYGO_DEPS_MAX_SIZE`, [`DEFAULT_MAX_SIZE`]) and [`MAX_ENTRIES`] entries, and counted
//! in the build's memory. Once the build has ended well, the tree is copied out of that
//! tmpfs by descriptor ([`crate::tree::copy_sealed`]): no link in it is ever followed,
//! folders deeper than [`MAX_DEPTH`] fail the set, device nodes, FIFOs and sockets are
//! left out, no set-id bit survives, and the copy belongs to the building user and is
//! read-only for everyone. A build's code decides what the tree holds; it never decides
//! what Zygo does with its own rights.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cgroup::Backend;
use crate::oneshot::{self, Outcome, Output, Request, Stdin};

/// The most bytes one file of a set may have.
pub const MAX_FILE: usize = 1 << 20;
/// The most of the resolver's output kept in `build.log`.
pub const MAX_LOG: usize = oneshot::OUTPUT_CAP;

/// The registries a build may reach unless `ZYGO_DEPS_REGISTRIES` names others.
pub const DEFAULT_REGISTRIES: [&str; 3] = [
    "pypi.org:443",
    "files.pythonhosted.org:443",
    "registry.npmjs.org:443",
];

/// Where a set is mounted in every sandbox that uses it, and where it is built.
pub const MOUNT: &str = "/venv";
/// Where a Node set's `node_modules` is mounted as well: an ES module's bare `import`
/// ignores `NODE_PATH` and looks in `node_modules` folders from the importing file's up to
/// the root, which this one ends every such walk in.
pub const NODE_MODULES_MOUNT: &str = "/node_modules";
/// Where a build finds the files it was sent.
const INPUT_MOUNT: &str = "/deps-input";

/// The limits of a build's sandbox (its memory is this plus the set's size limit, which
/// its `/venv` tmpfs takes from it).
const BUILD_MEM: u64 = 2 << 30;
const BUILD_CPU: &str = "2";
const BUILD_PIDS: &str = "256";
const BUILD_TIMEOUT: &str = "15m";
const BUILD_SCRATCH: &str = "1G";

/// The most a set's tree may hold unless `ZYGO_DEPS_MAX_SIZE` says otherwise.
pub const DEFAULT_MAX_SIZE: u64 = 1 << 30;
/// The most entries (files, folders, links) a set's tree may have.
pub const MAX_ENTRIES: u64 = 500_000;
/// The deepest a set's folders may nest (a venv's deepest are about 15).
pub const MAX_DEPTH: usize = 100;

/// What a set installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `requirements.txt` → a venv.
    Python,
    /// `package.json` + `package-lock.json` → `node_modules`.
    Node,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Python => "python",
            Kind::Node => "node",
        }
    }

    /// The kind the names of a set's files make, or why they make none.
    pub fn of_names(names: &[&str]) -> Result<Kind, String> {
        let mut sorted: Vec<&str> = names.to_vec();
        sorted.sort_unstable();
        match sorted.as_slice() {
            ["requirements.txt"] => Ok(Kind::Python),
            ["package-lock.json", "package.json"] => Ok(Kind::Node),
            _ => Err(format!(
                "a dependency set is either {{\"requirements.txt\"}} (Python) or \
                 {{\"package.json\", \"package-lock.json\"}} (Node); got {}",
                if names.is_empty() {
                    "no files".to_string()
                } else {
                    format!("{sorted:?}")
                }
            )),
        }
    }
}

/// Where a set is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Building,
    Ready,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Building => "building",
            State::Ready => "ready",
            State::Failed => "failed",
        }
    }
}

/// A set's `record.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub id: String,
    pub image: String,
    pub kind: Kind,
    pub state: State,
    /// Why a failed build failed, in one line (the log has the resolver's words).
    #[serde(default)]
    pub error: Option<String>,
    /// What a ready set's files hold, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// A set's image and files, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    pub image: String,
    pub kind: Kind,
    /// Sorted by name.
    pub files: Vec<(String, Vec<u8>)>,
    /// The tenant a set is built for (see [`Inputs::for_tenant`]); `None`: the host's.
    pub tenant: Option<String>,
}

impl Inputs {
    /// Check an image and files: the image parses (`host` or `dir:/path`), the names make
    /// a [`Kind`], each file is UTF-8 text of at most [`MAX_FILE`] bytes.
    pub fn new(image: &str, mut files: Vec<(String, Vec<u8>)>) -> Result<Inputs, String> {
        policy::Image::parse("image", image).map_err(|e| e.to_string())?;
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        let kind = Kind::of_names(&names)?;
        for (name, bytes) in &files {
            if bytes.len() > MAX_FILE {
                return Err(format!(
                    "{name} has {} bytes; a dependency set's file may have at most {MAX_FILE}",
                    bytes.len()
                ));
            }
            if std::str::from_utf8(bytes).is_err() {
                return Err(format!("{name} is not UTF-8 text"));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Inputs {
            image: image.to_string(),
            kind,
            files,
            tenant: None,
        })
    }

    /// The same inputs as a tenant's own set: its id is another (a hash of the tenant's id
    /// too), so what a tenant sends never meets, nor tells it of, another's set of the
    /// same files.
    pub fn for_tenant(mut self, tenant: &str) -> Inputs {
        self.tenant = Some(tenant.to_string());
        self
    }

    /// `deps_` and the SHA-256 of the image and every file's name and bytes, each
    /// length-prefixed so that no two different inputs hash the same bytes.
    pub fn id(&self) -> String {
        let mut h = Sha256::new();
        let mut part = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        part(b"zygo deps 1");
        if let Some(t) = &self.tenant {
            part(b"tenant");
            part(t.as_bytes());
        }
        part(self.image.as_bytes());
        for (name, bytes) in &self.files {
            part(name.as_bytes());
            part(bytes);
        }
        let digest = h.finalize();
        let mut id = String::with_capacity(5 + 64);
        id.push_str("deps_");
        for b in digest {
            id.push_str(&format!("{b:02x}"));
        }
        id
    }
}

/// Whether `s` has the form of a set's id (`deps_` and 64 lowercase hex digits).
pub fn is_id(s: &str) -> bool {
    policy::file::is_deps_id(s)
}

/// The operator's settings for builds, read from the environment of the process that
/// builds (the supervisor, or `zygo deps build`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `ZYGO_DEPS_REGISTRIES` (`HOST:PORT,...`), else [`DEFAULT_REGISTRIES`]: all a build
    /// may reach.
    pub registries: Vec<String>,
    /// `ZYGO_DEPS_PIP_INDEX_URL`: pip's index (a mirror).
    pub pip_index_url: Option<String>,
    /// `ZYGO_DEPS_NPM_REGISTRY`: npm's registry (a mirror).
    pub npm_registry: Option<String>,
    /// `ZYGO_DEPS_CA_BUNDLE`: a PEM file of CA certificates the build trusts besides the
    /// resolvers' own (where the host's network re-signs TLS), read-only at
    /// [`CA_MOUNT`].
    pub ca_bundle: Option<PathBuf>,
    /// `ZYGO_DEPS_MAX_SIZE`, else [`DEFAULT_MAX_SIZE`]: the most bytes a set's tree may
    /// hold.
    pub max_size: u64,
    /// `ZYGO_DEPS_TENANT_SETS`, else [`DEFAULT_TENANT_SETS`]: the most sets one tenant
    /// holds (failed ones too).
    pub tenant_sets: usize,
    /// `ZYGO_DEPS_TENANT_BYTES`, else [`DEFAULT_TENANT_BYTES`]: the most bytes one
    /// tenant's ready sets hold together.
    pub tenant_bytes: u64,
}

/// The most sets a tenant holds unless `ZYGO_DEPS_TENANT_SETS` says otherwise.
pub const DEFAULT_TENANT_SETS: usize = 16;
/// The most bytes a tenant's sets hold unless `ZYGO_DEPS_TENANT_BYTES` says otherwise.
pub const DEFAULT_TENANT_BYTES: u64 = 4 << 30;

/// Where a build finds `ZYGO_DEPS_CA_BUNDLE`.
const CA_MOUNT: &str = "/deps-ca.pem";

impl Settings {
    pub fn from_env() -> Result<Settings, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let registries = match var("ZYGO_DEPS_REGISTRIES") {
            Some(v) => {
                let list: Vec<String> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                for r in &list {
                    policy::AllowRule::parse("ZYGO_DEPS_REGISTRIES", r)
                        .map_err(|e| e.to_string())?;
                }
                list
            }
            None => DEFAULT_REGISTRIES.iter().map(|s| s.to_string()).collect(),
        };
        let ca_bundle = var("ZYGO_DEPS_CA_BUNDLE").map(PathBuf::from);
        if let Some(p) = &ca_bundle {
            if !p.is_absolute() || !p.is_file() {
                return Err(format!(
                    "ZYGO_DEPS_CA_BUNDLE={} is not an absolute path to a file",
                    p.display()
                ));
            }
        }
        let max_size = match var("ZYGO_DEPS_MAX_SIZE") {
            Some(v) => {
                policy::limits::parse_size("ZYGO_DEPS_MAX_SIZE", v.trim())
                    .map_err(|e| e.to_string())?
                    .0
            }
            None => DEFAULT_MAX_SIZE,
        };
        let tenant_sets = match var("ZYGO_DEPS_TENANT_SETS") {
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    format!("ZYGO_DEPS_TENANT_SETS={v:?} is not a whole number above 0")
                })?,
            None => DEFAULT_TENANT_SETS,
        };
        let tenant_bytes = match var("ZYGO_DEPS_TENANT_BYTES") {
            Some(v) => {
                policy::limits::parse_size("ZYGO_DEPS_TENANT_BYTES", v.trim())
                    .map_err(|e| e.to_string())?
                    .0
            }
            None => DEFAULT_TENANT_BYTES,
        };
        Ok(Settings {
            registries,
            pip_index_url: var("ZYGO_DEPS_PIP_INDEX_URL"),
            npm_registry: var("ZYGO_DEPS_NPM_REGISTRY"),
            ca_bundle,
            max_size,
            tenant_sets,
            tenant_bytes,
        })
    }

    /// The environment a build gets on top of the sandbox's own: the package index the
    /// operator named, the CA bundle, and quiet, non-interactive resolvers.
    fn env(&self, kind: Kind) -> Vec<String> {
        let mut env = Vec::new();
        match kind {
            Kind::Python => {
                env.push("PIP_DISABLE_PIP_VERSION_CHECK=1".to_string());
                env.push("PIP_NO_INPUT=1".to_string());
                env.push("PYTHONDONTWRITEBYTECODE=1".to_string());
                if let Some(url) = &self.pip_index_url {
                    // pip ignores an index over plain http unless its host is trusted.
                    if let Some(host) = url
                        .strip_prefix("http://")
                        .and_then(|r| r.split('/').next())
                    {
                        env.push(format!("PIP_TRUSTED_HOST={host}"));
                    }
                    env.push(format!("PIP_INDEX_URL={url}"));
                }
                if self.ca_bundle.is_some() {
                    env.push(format!("PIP_CERT={CA_MOUNT}"));
                    env.push(format!("SSL_CERT_FILE={CA_MOUNT}"));
                }
            }
            Kind::Node => {
                env.push("npm_config_update_notifier=false".to_string());
                env.push("npm_config_fund=false".to_string());
                env.push("npm_config_audit=false".to_string());
                // A refused download is retried twice, quickly, rather than over a minute.
                env.push("npm_config_fetch_retries=2".to_string());
                env.push("npm_config_fetch_retry_mintimeout=1000".to_string());
                env.push("npm_config_fetch_retry_maxtimeout=5000".to_string());
                if let Some(url) = &self.npm_registry {
                    env.push(format!("npm_config_registry={url}"));
                }
                if self.ca_bundle.is_some() {
                    env.push(format!("NODE_EXTRA_CA_CERTS={CA_MOUNT}"));
                }
            }
        }
        env
    }
}

/// The shell script a build runs. Everything it prints goes to one stream, the log.
fn build_script(kind: Kind) -> String {
    match kind {
        Kind::Python => format!(
            "exec 2>&1\nset -e\npython3 -m venv {MOUNT}\n\
             exec {MOUNT}/bin/pip install --no-cache-dir -r {INPUT_MOUNT}/requirements.txt\n"
        ),
        Kind::Node => format!(
            "exec 2>&1\nset -e\ncp {INPUT_MOUNT}/package.json {INPUT_MOUNT}/package-lock.json {MOUNT}/\n\
             cd {MOUNT}\nexec npm ci --ignore-scripts --no-audit --no-fund --cache /tmp/npm-cache\n"
        ),
    }
}

/// The plan of a set's build: a one-shot sandbox on its image, egress only to the
/// registries, its files read-only. Its writable [`MOUNT`] is added to the launch plan
/// ([`fresh_mount`]).
pub fn build_plan(
    settings: &Settings,
    inputs: &Inputs,
    input: &Path,
) -> Result<policy::OneShotPlan, String> {
    let path = |p: &Path| {
        p.to_str()
            .map(str::to_string)
            .ok_or_else(|| format!("path {} is not valid UTF-8", p.display()))
    };
    let mut mounts = vec![format!("{}:{INPUT_MOUNT}:ro", path(input)?)];
    if let Some(ca) = &settings.ca_bundle {
        mounts.push(format!("{}:{CA_MOUNT}:ro", path(ca)?));
    }
    let args = policy::OneShotArgs {
        mem: Some(build_mem(settings).to_string()),
        cpu: Some(BUILD_CPU.into()),
        pids: Some(BUILD_PIDS.into()),
        timeout: Some(BUILD_TIMEOUT.into()),
        scratch: Some(BUILD_SCRATCH.into()),
        net: Some("egress".into()),
        allow: settings.registries.clone(),
        image: Some(inputs.image.clone()),
        mounts,
        env: settings.env(inputs.kind),
        argv: vec!["/bin/sh".into(), "-c".into(), build_script(inputs.kind)],
        ..policy::OneShotArgs::default()
    };
    policy::one_shot(&args).map_err(|e| e.to_string())
}

/// A build's memory limit: the resolver's own and the tree's.
fn build_mem(settings: &Settings) -> u64 {
    BUILD_MEM.saturating_add(settings.max_size)
}

/// The launch plan's entry for the build's `/venv`: the fresh tmpfs, handed over.
fn fresh_mount() -> proto::launch::BindMount {
    proto::launch::BindMount {
        src: "tmpfs".into(),
        dst: MOUNT.into(),
        rw: true,
        handed: true,
        fresh: true,
        owner: None,
    }
}

/// `<state dir>/deps`.
pub fn root(state_dir: &Path) -> PathBuf {
    state_dir.join("deps")
}

/// A set's directory.
pub fn dir(state_dir: &Path, id: &str) -> PathBuf {
    root(state_dir).join(id)
}

/// A set's installed tree (what is mounted at [`MOUNT`]).
pub fn tree(state_dir: &Path, id: &str) -> PathBuf {
    dir(state_dir, id).join("tree")
}

/// When a set's record was last written (its folder's, if it has none): for choosing the
/// oldest.
pub fn modified(state_dir: &Path, id: &str) -> std::time::SystemTime {
    let d = dir(state_dir, id);
    std::fs::metadata(d.join("record.json"))
        .or_else(|_| std::fs::metadata(&d))
        .and_then(|m| m.modified())
        .unwrap_or(std::time::UNIX_EPOCH)
}

/// Read a set's record; `Ok(None)` when there is no such set.
pub fn read_record(state_dir: &Path, id: &str) -> Result<Option<Record>, String> {
    let p = dir(state_dir, id).join("record.json");
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("read {}: {e}", p.display())),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("{} is damaged: {e}", p.display()))
}

/// A set's record as it stands, with a build whose builder died (`building` with nobody
/// holding its lock) seen as failed.
pub fn status(state_dir: &Path, id: &str) -> Result<Option<Record>, String> {
    let Some(mut rec) = read_record(state_dir, id)? else {
        return Ok(None);
    };
    if rec.state == State::Building {
        if let Ok(lock) = Lock::try_take(&dir(state_dir, id)) {
            if lock.is_some() {
                rec.state = State::Failed;
                rec.error =
                    Some("the build stopped before it finished (its builder exited)".into());
            }
        }
    }
    Ok(Some(rec))
}

/// A set's `build.log`, at most [`MAX_LOG`] bytes of it.
pub fn read_log(state_dir: &Path, id: &str) -> String {
    let p = dir(state_dir, id).join("build.log");
    match std::fs::read(&p) {
        Ok(mut b) => {
            b.truncate(MAX_LOG + 4096);
            String::from_utf8_lossy(&b).into_owned()
        }
        Err(_) => String::new(),
    }
}

/// The ids of every set on this host, sorted.
pub fn list(state_dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = match std::fs::read_dir(root(state_dir)) {
        Ok(rd) => rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| is_id(n))
            .collect(),
        Err(_) => Vec::new(),
    };
    ids.sort();
    ids
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let mut f =
        std::fs::File::create(&tmp).map_err(|e| format!("create {}: {e}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("rename {}: {e}", tmp.display()))
}

fn write_record(dir: &Path, rec: &Record) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(rec).map_err(|e| e.to_string())?;
    write_atomic(&dir.join("record.json"), &bytes)
}

/// The tenants that sent a set (`owners.json`, a sorted list of tenant ids); the host's
/// callers see every set.
pub fn owners(state_dir: &Path, id: &str) -> Vec<String> {
    std::fs::read(dir(state_dir, id).join("owners.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Record that `tenant` sent set `id` (making the set's folder if it is new).
pub fn add_owner(state_dir: &Path, id: &str, tenant: &str) -> Result<(), String> {
    let mut list = owners(state_dir, id);
    if list.iter().any(|t| t == tenant) {
        return Ok(());
    }
    plumbing::paths::make_private_dir(state_dir)
        .map_err(|e| format!("create {}: {e}", state_dir.display()))?;
    make_dir(&root(state_dir), 0o711)?;
    let d = dir(state_dir, id);
    make_dir(&d, 0o711)?;
    list.push(tenant.to_string());
    list.sort();
    let bytes = serde_json::to_vec(&list).map_err(|e| e.to_string())?;
    write_atomic(&d.join("owners.json"), &bytes)
}

/// Forget that `tenant` sent set `id` (a tenant deleted).
pub fn remove_owner(state_dir: &Path, id: &str, tenant: &str) -> Result<(), String> {
    let mut list = owners(state_dir, id);
    let before = list.len();
    list.retain(|t| t != tenant);
    if list.len() == before {
        return Ok(());
    }
    let bytes = serde_json::to_vec(&list).map_err(|e| e.to_string())?;
    write_atomic(&dir(state_dir, id).join("owners.json"), &bytes)
}

/// Forget a set: its folder and everything in it.
pub fn remove(state_dir: &Path, id: &str) -> Result<(), String> {
    remove_tree(&dir(state_dir, id))
}

/// The `flock` on a set's `lock` file, held while it builds.
pub struct Lock {
    /// Closing it releases the lock.
    _held: std::fs::File,
}

impl Lock {
    /// Take the lock without waiting: `Ok(None)` when another process holds it.
    pub fn try_take(dir: &Path) -> Result<Option<Lock>, String> {
        Lock::take(dir, libc::LOCK_EX | libc::LOCK_NB)
    }

    /// Wait until whoever builds the set in `dir` has finished.
    pub fn wait_for(dir: &Path) -> Result<(), String> {
        Lock::take(dir, libc::LOCK_SH).map(drop)
    }

    fn take(dir: &Path, how: libc::c_int) -> Result<Option<Lock>, String> {
        let p = dir.join("lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| format!("open {}: {e}", p.display()))?;
        loop {
            // SAFETY: flock on a descriptor we own.
            let r = unsafe { libc::flock(f.as_raw_fd(), how) };
            if r == 0 {
                return Ok(Some(Lock { _held: f }));
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(format!("lock {}: {e}", p.display()))
        }
    }
}

/// What [`claim`] found.
pub enum Claim {
    /// This process builds the set: run [`build`] with the lock, then drop it.
    Build(Lock, Record),
    /// The set is ready, or another process is building it.
    Exists(Record),
}

/// Make a set's directory and record for `inputs`, unless it is ready or building
/// already: then that record. A set whose build failed (or whose builder died) is built
/// again.
pub fn claim(state_dir: &Path, inputs: &Inputs) -> Result<Claim, String> {
    let id = inputs.id();
    let root = root(state_dir);
    plumbing::paths::make_private_dir(state_dir)
        .map_err(|e| format!("create {}: {e}", state_dir.display()))?;
    make_dir(&root, 0o711)?;
    let d = root.join(&id);
    make_dir(&d, 0o711)?;
    let Some(lock) = Lock::try_take(&d)? else {
        // Someone holds the lock: building, unless its record says it has just finished.
        let rec = read_record(state_dir, &id)?.unwrap_or(Record {
            id: id.clone(),
            image: inputs.image.clone(),
            kind: inputs.kind,
            state: State::Building,
            error: None,
            bytes: None,
        });
        return Ok(Claim::Exists(rec));
    };
    if let Some(rec) = read_record(state_dir, &id)? {
        if rec.state == State::Ready {
            return Ok(Claim::Exists(rec));
        }
    }
    let rec = Record {
        id: id.clone(),
        image: inputs.image.clone(),
        kind: inputs.kind,
        state: State::Building,
        error: None,
        bytes: None,
    };
    // What an earlier attempt left goes first.
    for sub in ["tree", "tree.new", "input"] {
        remove_tree(&d.join(sub))?;
    }
    let _ = std::fs::remove_file(d.join("build.log"));
    let input = d.join("input");
    make_dir(&input, 0o755)?;
    for (name, bytes) in &inputs.files {
        write_atomic(&input.join(name), bytes)?;
    }
    write_record(&d, &rec)?;
    Ok(Claim::Build(lock, rec))
}

fn make_dir(p: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(mode).create(p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("create {}: {e}", p.display())),
    }
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("set the mode of {}: {e}", p.display()))
}

/// Remove a tree that a build made or left (by descriptor, never through a link; see
/// [`crate::tree::remove`]).
fn remove_tree(p: &Path) -> Result<(), String> {
    crate::tree::remove(p).map_err(|e| format!("remove {}: {e}", p.display()))
}

/// Build a claimed set: run its build sandbox, keep the log, and write its final record.
/// Returns that record. `launcher` is the `zygo` binary; when `cancel` becomes readable
/// (or its write end closes) the build is killed and fails.
pub fn build(
    state_dir: &Path,
    inputs: &Inputs,
    lock: Lock,
    launcher: PathBuf,
    backend: &Backend,
    cancel: Option<std::os::fd::OwnedFd>,
    narrowing: &Narrowing,
) -> Record {
    let id = inputs.id();
    let d = dir(state_dir, &id);
    let (ok, error, bytes) = match run_build(&d, inputs, launcher, backend, cancel, narrowing) {
        Ok(bytes) => (true, None, Some(bytes)),
        Err(why) => (false, Some(why), None),
    };
    let rec = Record {
        id,
        image: inputs.image.clone(),
        kind: inputs.kind,
        state: if ok { State::Ready } else { State::Failed },
        error,
        bytes,
    };
    if !ok {
        for sub in ["tree", "tree.new"] {
            if let Err(e) = remove_tree(&d.join(sub)) {
                log::warn!("dependency set {}: {e}", rec.id);
            }
        }
    }
    if let Err(e) = write_record(&d, &rec) {
        log::error!("dependency set {}: {e}", rec.id);
    }
    drop(lock);
    rec
}

/// What narrows a build below the host's settings: the limits of the tenant it is built
/// for, and what is left of its quota in bytes.
#[derive(Debug, Clone, Default)]
pub struct Narrowing {
    pub limits: Option<proto::api::TenantLimits>,
    pub max_size: Option<u64>,
}

/// Build a set; what its tree holds, in bytes.
fn run_build(
    d: &Path,
    inputs: &Inputs,
    launcher: PathBuf,
    backend: &Backend,
    cancel: Option<std::os::fd::OwnedFd>,
    narrowing: &Narrowing,
) -> Result<u64, String> {
    let log_path = d.join("build.log");
    let input = d.join("input");
    // A copy of the cancel pipe's read end, to tell afterwards whether the build was
    // stopped (a sandbox stopped while it was being built reports only that it died).
    let stopped = cancel.as_ref().and_then(|c| c.try_clone().ok());
    // A build the host cannot give its sandbox (egress to the registries, above all) is
    // refused here, before anything runs: it never runs with another network instead.
    let planned = Settings::from_env().and_then(|mut settings| {
        if let Some(cap) = narrowing.max_size {
            settings.max_size = settings.max_size.min(cap.max(1));
        }
        let mut plan = build_plan(&settings, inputs, &input)?;
        if let Some(t) = &narrowing.limits {
            plan.limits = crate::supervisor::functions::run_spec::narrow(plan.limits, t);
        }
        let (mut launch, limits) = oneshot::launch_plan(&plan)?;
        launch.mounts.push(fresh_mount());
        let venv = crate::mounts::private_tmpfs(settings.max_size, MAX_ENTRIES).map_err(|e| {
            format!(
                "make the build's {MOUNT} (a tmpfs of {} bytes): {e}",
                settings.max_size
            )
        })?;
        Ok((settings, launch, limits, venv, plan.limits))
    });
    let (settings, launch, limits, venv, applied) = match planned {
        Ok(p) => p,
        Err(e) => {
            let why = format!(
                "its sandbox was refused before anything ran (a build reaches the registries, \
                 ZYGO_DEPS_REGISTRIES, or nothing): {e}"
            );
            if let Err(e) = write_atomic(
                &log_path,
                format!("[zygo] the build failed: {why}\n").as_bytes(),
            ) {
                log::warn!("deps: write the refused build's log: {e}");
            }
            return Err(why);
        }
    };
    // The tree is read through this once the sandbox has gone.
    let held = venv
        .try_clone()
        .map_err(|e| format!("keep the build's {MOUNT}: {e}"))?;
    // The resolver's output goes to the log as it comes (a build in progress shows how
    // far it is); the log is written whole, with Zygo's last line, when the build ends.
    let live = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&log_path)
        .map_err(|e| {
            log::warn!(
                "deps: open {} for the build's output: {e}",
                log_path.display()
            )
        })
        .ok();
    let out = oneshot::run(
        backend,
        Request {
            plan: launch,
            limits,
            stdin: Stdin::Null,
            output: Output::Capture,
            launcher,
            cancel,
            fresh: vec![venv],
            tee: live,
        },
    );
    let mut verdict = if stopped.as_ref().is_some_and(was_cancelled) {
        Err("the build was stopped (its supervisor stopped)".to_string())
    } else {
        verdict(&out, &applied)
    };
    if verdict.is_err() && is_full(&held) {
        verdict = Err(format!(
            "the set's tree filled its limit of {} bytes or {MAX_ENTRIES} entries \
             (ZYGO_DEPS_MAX_SIZE sets the size)",
            settings.max_size
        ));
    }
    let mut log = out.stdout.clone();
    if out.stdout_truncated {
        log.extend_from_slice(b"\n[zygo] the output above was cut at 1 MiB\n");
    }
    log.extend_from_slice(&out.stderr);
    let mut bytes = 0;
    if verdict.is_ok() {
        match seal_out(&held, d, inputs.kind, &settings) {
            Ok(c) => {
                bytes = c.bytes;
                log.extend_from_slice(
                    format!(
                        "\n[zygo] the set holds {} files, {} folders and {} links, {} bytes{}\n",
                        c.files,
                        c.folders,
                        c.links,
                        c.bytes,
                        if c.skipped > 0 {
                            format!(
                                "; {} device nodes, FIFOs or sockets were left out",
                                c.skipped
                            )
                        } else {
                            String::new()
                        }
                    )
                    .as_bytes(),
                )
            }
            Err(why) => verdict = Err(why),
        }
    }
    match &verdict {
        Ok(()) => log.extend_from_slice(b"[zygo] the build succeeded\n"),
        Err(why) => log.extend_from_slice(format!("\n[zygo] the build failed: {why}\n").as_bytes()),
    }
    write_atomic(&log_path, &log)?;
    verdict.map(|()| bytes)
}

/// Whether the build's tmpfs has no room left (in bytes or entries).
fn is_full(venv: &std::os::fd::OwnedFd) -> bool {
    // SAFETY: statfs is plain data, filled in by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and statfs buffer.
    let r = unsafe { libc::fstatfs(venv.as_raw_fd(), &mut st) };
    r == 0 && (st.f_bavail == 0 || st.f_ffree == 0)
}

/// Copy the built tree out of the build's tmpfs into `tree/`, sealed (see
/// [`crate::tree::copy_sealed`]), replacing what was there.
fn seal_out(
    venv: &std::os::fd::OwnedFd,
    d: &Path,
    kind: Kind,
    settings: &Settings,
) -> Result<crate::tree::Copied, String> {
    if kind == Kind::Node {
        // Sandboxes get node_modules at /node_modules too (see [`NODE_MODULES_MOUNT`]),
        // so it exists even for a set with no packages.
        match crate::tree::ensure_folder(venv, c"node_modules") {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "the build left {MOUNT}/node_modules as something other than a folder"
                ))
            }
            Err(e) => return Err(format!("make {MOUNT}/node_modules: {e}")),
        }
    }
    let new = d.join("tree.new");
    remove_tree(&new)?;
    make_dir(&new, 0o700)?;
    let dst = crate::tree::open_folder(&new).map_err(|e| format!("open {}: {e}", new.display()))?;
    let caps = crate::tree::Caps {
        depth: MAX_DEPTH,
        entries: MAX_ENTRIES,
        bytes: settings.max_size,
    };
    let copied = match crate::tree::copy_sealed(venv, &dst, &caps, MOUNT) {
        Ok(c) => c,
        Err(e) => {
            drop(dst);
            let _ = remove_tree(&new);
            return Err(format!("the set's tree was refused: {e}"));
        }
    };
    drop(dst);
    let tree = d.join("tree");
    remove_tree(&tree)?;
    std::fs::rename(&new, &tree)
        .map_err(|e| format!("rename {} to {}: {e}", new.display(), tree.display()))?;
    Ok(copied)
}

/// Whether a cancel pipe's read end says cancel: readable, or its write end closed.
fn was_cancelled(fd: &std::os::fd::OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
}

/// Whether a build's sandbox ended well, or why not in one line.
fn verdict(out: &Outcome, limits: &policy::ResolvedLimits) -> Result<(), String> {
    if let Some(e) = &out.error {
        return Err(format!("the build sandbox could not run: {e}"));
    }
    if out.cancelled {
        return Err("the build was stopped (its supervisor stopped)".into());
    }
    if out.timed_out {
        return Err(format!(
            "the build ran past its time limit ({})",
            policy::Dur(limits.timeout)
        ));
    }
    if out.oom_killed {
        return Err(format!(
            "the build ran out of memory (limit {}, its tree's files included)",
            limits.mem
        ));
    }
    if let Some(sig) = out.signal {
        return Err(format!("the build was killed by signal {sig}"));
    }
    match out.exit_code {
        Some(0) => Ok(()),
        Some(c) => Err(format!(
            "the resolver exited with status {c}; its log says why"
        )),
        None => Err("the build ended without an exit status".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(text: &str) -> Inputs {
        Inputs::new(
            "host",
            vec![("requirements.txt".into(), text.as_bytes().to_vec())],
        )
        .expect("inputs")
    }

    #[test]
    fn the_id_is_a_hash_of_the_image_and_every_files_name_and_bytes() {
        let a = py("six==1.16.0\n");
        assert!(is_id(&a.id()), "{}", a.id());
        assert_eq!(a.id(), py("six==1.16.0\n").id());
        assert_ne!(a.id(), py("six==1.15.0\n").id());
        let other_image = Inputs::new(
            "dir:/srv/img",
            vec![("requirements.txt".into(), b"six==1.16.0\n".to_vec())],
        )
        .expect("inputs");
        assert_ne!(a.id(), other_image.id());
        // The order the files come in does not matter; which name holds which bytes does.
        let n1 = Inputs::new(
            "host",
            vec![
                ("package.json".into(), b"{}".to_vec()),
                ("package-lock.json".into(), b"[]".to_vec()),
            ],
        )
        .expect("inputs");
        let n2 = Inputs::new(
            "host",
            vec![
                ("package-lock.json".into(), b"[]".to_vec()),
                ("package.json".into(), b"{}".to_vec()),
            ],
        )
        .expect("inputs");
        let n3 = Inputs::new(
            "host",
            vec![
                ("package-lock.json".into(), b"{}".to_vec()),
                ("package.json".into(), b"[]".to_vec()),
            ],
        )
        .expect("inputs");
        assert_eq!(n1.id(), n2.id());
        assert_ne!(n1.id(), n3.id());
        assert_eq!(n1.kind, Kind::Node);
    }

    #[test]
    fn only_the_known_files_make_a_set() {
        let f = |names: &[&str]| {
            Inputs::new(
                "host",
                names
                    .iter()
                    .map(|n| (n.to_string(), b"x".to_vec()))
                    .collect(),
            )
        };
        assert!(f(&[]).is_err());
        assert!(f(&["setup.py"]).is_err());
        assert!(f(&["requirements.txt", "package.json"]).is_err());
        assert!(f(&["package.json"]).is_err());
        assert!(f(&["requirements.txt", "requirements.txt"]).is_err());
        assert!(f(&["../requirements.txt"]).is_err());
        assert!(f(&["requirements.txt"]).is_ok());
        let big = Inputs::new(
            "host",
            vec![("requirements.txt".into(), vec![b'a'; MAX_FILE + 1])],
        );
        assert!(big.expect_err("too big").contains("at most"));
        let binary = Inputs::new("host", vec![("requirements.txt".into(), vec![0xff, 0xfe])]);
        assert!(binary.expect_err("not UTF-8").contains("UTF-8"));
        let image = Inputs::new("python:3.12", vec![("requirements.txt".into(), vec![])]);
        assert!(image.is_err());
    }

    #[test]
    fn ids_are_checked_by_form() {
        assert!(is_id(&format!("deps_{}", "a".repeat(64))));
        assert!(!is_id(&format!("deps_{}", "A".repeat(64))));
        assert!(!is_id(&format!("deps_{}", "a".repeat(63))));
        assert!(!is_id("deps_../../etc"));
        assert!(!is_id(&"a".repeat(69)));
    }

    #[test]
    fn the_build_may_reach_only_the_registries() {
        let tmp = std::env::temp_dir();
        let settings = Settings {
            registries: DEFAULT_REGISTRIES.iter().map(|s| s.to_string()).collect(),
            pip_index_url: None,
            npm_registry: None,
            ca_bundle: None,
            max_size: DEFAULT_MAX_SIZE,
            tenant_sets: DEFAULT_TENANT_SETS,
            tenant_bytes: DEFAULT_TENANT_BYTES,
        };
        let plan = build_plan(&settings, &py("six\n"), &tmp.join("i")).expect("plan");
        assert_eq!(plan.network, policy::Network::Egress);
        assert_eq!(plan.allow.len(), DEFAULT_REGISTRIES.len());
        // Nothing of the host's is writable: the tree is a fresh tmpfs, added at launch.
        assert_eq!(plan.mounts.len(), 1);
        assert!(plan.mounts.iter().all(|m| !m.rw));
        assert_eq!(
            plan.limits.mem,
            policy::Mem::Limited(policy::Bytes(BUILD_MEM + DEFAULT_MAX_SIZE))
        );
        assert!(fresh_mount().fresh && fresh_mount().rw);
        assert!(plan
            .mounts
            .iter()
            .any(|m| !m.rw && m.dst == Path::new(INPUT_MOUNT)));
        // A CA bundle of the operator's: read-only, and named to pip.
        let with_ca = Settings {
            ca_bundle: Some(PathBuf::from("/etc/hostname")),
            pip_index_url: Some("http://10.0.0.1:8080/simple/".into()),
            ..settings
        };
        let plan = build_plan(&with_ca, &py("six\n"), &tmp.join("i")).expect("plan");
        assert!(plan
            .mounts
            .iter()
            .any(|m| !m.rw && m.dst == Path::new(CA_MOUNT)));
        let env: Vec<String> = plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for want in [
            "PIP_CERT=/deps-ca.pem",
            "PIP_INDEX_URL=http://10.0.0.1:8080/simple/",
            "PIP_TRUSTED_HOST=10.0.0.1:8080",
        ] {
            assert!(env.iter().any(|e| e == want), "{want} not in {env:?}");
        }
    }
}
