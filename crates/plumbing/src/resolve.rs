//! Opening a host path without following a symbolic link in any of its components.
//!
//! What a sandbox is given from the host (a mount source, a `dir:` image, a workspace) is
//! named by the operator, but a folder handed to a sandbox writable is the sandbox's to
//! fill: a link it leaves there would redirect a later mount of a path under that folder
//! to anywhere on the host, opened with the rights of whoever mounts it. So such paths are
//! opened with `openat2(RESOLVE_NO_SYMLINKS)`: every component must be what it says, and a
//! path through a link is refused, naming the link.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;

/// `openat2(dir, path, O_PATH | O_CLOEXEC)` refusing every symbolic link on the way
/// (`ELOOP`), the last component's too. `dir` is `libc::AT_FDCWD` for an absolute path.
pub fn open_path_no_links(dir: RawFd, path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    loop {
        // SAFETY: a valid C string and a properly sized open_how.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
}

/// The first component of `path` (from the left) that is a symbolic link, and what it
/// points to; `None` if there is none (or it cannot be told).
pub fn first_link(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut at = PathBuf::new();
    for c in path.components() {
        at.push(c);
        if let Ok(m) = std::fs::symlink_metadata(&at) {
            if m.file_type().is_symlink() {
                let to = std::fs::read_link(&at).unwrap_or_default();
                return Some((at, to));
            }
        }
    }
    None
}

/// [`open_path_no_links`] of an absolute path, with an error that names the link and what
/// to do when the path goes through one.
pub fn open_host_path(path: &Path) -> io::Result<OwnedFd> {
    match open_path_no_links(libc::AT_FDCWD, path) {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            let named = match first_link(path) {
                Some((link, to)) => format!(
                    "{} is a symbolic link (to {})",
                    link.display(),
                    to.display()
                ),
                None => "a component of it is a symbolic link".to_string(),
            };
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{named}: Zygo never follows a link in a path it mounts, since a sandbox \
                     given a folder may leave one there; name the folder the link points to"
                ),
            ))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_anywhere_in_the_path_is_refused_and_named() {
        let d = std::env::temp_dir().join(format!("zygo-resolve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("real/sub")).expect("mkdir");
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).expect("symlink");
        assert!(open_host_path(&d.join("real/sub")).is_ok());
        let e = open_host_path(&d.join("link/sub")).expect_err("through a link");
        assert!(
            e.to_string()
                .contains(&format!("{} is a symbolic link", d.join("link").display())),
            "{e}"
        );
        let e = open_host_path(&d.join("link")).expect_err("a link itself");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = open_host_path(&d.join("nothing")).expect_err("absent");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let _ = std::fs::remove_dir_all(&d);
    }
}
