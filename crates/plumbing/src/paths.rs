//! Where the supervisor keeps its socket (runtime directory) and what must survive a
//! restart (state directory).

use std::path::PathBuf;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn env_dir(key: &str) -> Option<PathBuf> {
    std::env::var_os(key)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `$ZYGO_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/zygo`, else `/run/zygo` as root, else
/// `/tmp/zygo-<uid>`.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = env_dir("ZYGO_RUNTIME_DIR") {
        return d;
    }
    if let Some(d) = env_dir("XDG_RUNTIME_DIR") {
        return d.join("zygo");
    }
    if is_root() {
        PathBuf::from("/run/zygo")
    } else {
        // SAFETY: getuid cannot fail.
        PathBuf::from(format!("/tmp/zygo-{}", unsafe { libc::getuid() }))
    }
}

/// `$ZYGO_STATE_DIR`, else `$XDG_STATE_HOME/zygo`, else `/var/lib/zygo` as root, else
/// `~/.local/state/zygo`.
pub fn state_dir() -> PathBuf {
    if let Some(d) = env_dir("ZYGO_STATE_DIR") {
        return d;
    }
    if let Some(d) = env_dir("XDG_STATE_HOME") {
        return d.join("zygo");
    }
    if is_root() {
        return PathBuf::from("/var/lib/zygo");
    }
    match env_dir("HOME") {
        Some(h) => h.join(".local/state/zygo"),
        None => runtime_dir().join("state"),
    }
}

pub fn socket_path() -> PathBuf {
    runtime_dir().join("zygo.sock")
}

/// Where a client looks for the supervisor's socket, in order. `$ZYGO_RUNTIME_DIR`, when
/// set, is the only place. Otherwise [`socket_path`] comes first, then the other places
/// this user's supervisor starts in under another environment: `/run/user/<uid>/zygo` (a
/// login session's `$XDG_RUNTIME_DIR`, which an MCP host's reduced environment leaves out),
/// then `/run/zygo` as root, or `/tmp/zygo-<uid>` otherwise.
pub fn socket_candidates() -> Vec<PathBuf> {
    let first = socket_path();
    if env_dir("ZYGO_RUNTIME_DIR").is_some() {
        return vec![first];
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut all = vec![first];
    for dir in [
        PathBuf::from(format!("/run/user/{uid}/zygo")),
        if is_root() {
            PathBuf::from("/run/zygo")
        } else {
            PathBuf::from(format!("/tmp/zygo-{uid}"))
        },
    ] {
        let p = dir.join("zygo.sock");
        if !all.contains(&p) {
            all.push(p);
        }
    }
    all
}

/// Create a private directory (0700) and its parents, unless it is there already (then
/// its mode is left as it is).
pub fn make_private_dir_if_missing(p: &std::path::Path) -> std::io::Result<()> {
    if p.is_dir() {
        return Ok(());
    }
    make_private_dir(p)
}

/// Create a private directory (0700) and its parents.
pub fn make_private_dir(p: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))
}
