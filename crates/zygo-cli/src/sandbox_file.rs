//! Reading a sandbox.toml the user named, as the user: `zygo up` checks it before it starts
//! a supervisor, `zygo api` takes its `[api]`, `zygo mcp` its `[defaults]`.

use std::io::Read;
use std::path::{Path, PathBuf};

use policy::file::{SandboxFile, MAX_FILE_BYTES};

/// `path` made absolute (as the supervisor is told it), read (at most 1 MiB) and parsed
/// whole: the file's path and what it says, or a message naming the file and the fault.
pub fn read(path: &Path) -> Result<(PathBuf, SandboxFile), String> {
    let abs = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let f = std::fs::File::open(&abs).map_err(|e| format!("{}: {e}", abs.display()))?;
    let mut text = String::new();
    f.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", abs.display()))?;
    if text.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{}: the file is over 1 MiB, the most a sandbox.toml may be",
            abs.display()
        ));
    }
    let parsed = policy::parse_sandbox_toml(&text, &abs).map_err(|e| e.to_string())?;
    Ok((abs, parsed))
}
