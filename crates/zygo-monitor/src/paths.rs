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

/// Create a private directory (0700) and its parents.
pub fn make_private_dir(p: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))
}
