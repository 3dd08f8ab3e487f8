//! Starting a launcher: `posix_spawn` of the `zygo` binary in its launcher role.
//!
//! glibc's `posix_spawn` creates the child with `CLONE_VM | CLONE_VFORK`: nothing of the
//! monitor's address space is copied, and the monitor waits only until the exec is done.
//! The child's descriptors are set by file actions (each a `dup2`, which clears
//! close-on-exec on the target); every other descriptor of the monitor is close-on-exec.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

/// A launcher process: its pid, and whether it has been reaped.
#[derive(Debug)]
pub struct Launcher {
    pid: libc::pid_t,
    status: Option<ExitStatus>,
}

impl Launcher {
    /// SIGKILL, unless it has already been reaped (its pid may then be someone else's).
    pub fn kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: signalling our own child, which has not been reaped.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wait for it to exit and reap it.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        self.reap(0)
            .map(|s| s.unwrap_or_else(|| ExitStatus::from_raw(0)))
    }

    /// Reap it if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        loop {
            let mut raw = 0;
            // SAFETY: waiting for our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
            if r == self.pid {
                let s = ExitStatus::from_raw(raw);
                self.status = Some(s);
                return Ok(Some(s));
            }
            if r == 0 {
                return Ok(None);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Descriptors a launcher starts with. `stdin` `None` is `/dev/null`; stderr is the
/// monitor's own.
pub struct LauncherFds<'a> {
    pub stdin: Option<&'a OwnedFd>,
    pub stdout: &'a OwnedFd,
    /// The monitor channel, fd 3 in the launcher.
    pub channel: &'a OwnedFd,
    /// The program's stderr, fd 4 in the launcher.
    pub program_stderr: &'a OwnedFd,
}

fn check(r: libc::c_int) -> io::Result<()> {
    // posix_spawn and its helpers return the error number instead of setting errno.
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains a NUL byte"))
}

/// Owns the spawn attributes and file actions, and destroys them however the call ends.
struct SpawnSetup {
    attr: libc::posix_spawnattr_t,
    actions: libc::posix_spawn_file_actions_t,
}

impl SpawnSetup {
    fn new() -> io::Result<Box<SpawnSetup>> {
        // SAFETY: both are plain C structs, initialised by the calls below before use.
        let mut s: Box<SpawnSetup> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: initialising a zeroed attribute object.
        check(unsafe { libc::posix_spawnattr_init(&mut s.attr) })?;
        // SAFETY: initialising a zeroed file-actions object.
        if let Err(e) = check(unsafe { libc::posix_spawn_file_actions_init(&mut s.actions) }) {
            // SAFETY: destroying the attribute object initialised above.
            unsafe { libc::posix_spawnattr_destroy(&mut s.attr) };
            return Err(e);
        }
        Ok(s)
    }
}

impl Drop for SpawnSetup {
    fn drop(&mut self) {
        // SAFETY: both objects were initialised in `new`.
        unsafe {
            libc::posix_spawn_file_actions_destroy(&mut self.actions);
            libc::posix_spawnattr_destroy(&mut self.attr);
        }
    }
}

/// Spawn `exe __launcher` with `fds` in place, an empty signal mask, SIGPIPE at its
/// default, and an environment of only the logging variables.
pub fn spawn_launcher(exe: &Path, fds: LauncherFds<'_>) -> io::Result<Launcher> {
    let path = cstring(exe.as_os_str())?;
    let argv_c = [path.clone(), cstring(OsStr::new("__launcher"))?];
    let mut env_c: Vec<CString> = Vec::new();
    for key in ["RUST_LOG", "ZYGO_LOG"] {
        if let Some(v) = std::env::var_os(key) {
            let mut kv = OsStr::new(key).to_os_string();
            kv.push("=");
            kv.push(v);
            env_c.push(cstring(&kv)?);
        }
    }
    let mut argv: Vec<*mut libc::c_char> = argv_c.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let mut envp: Vec<*mut libc::c_char> = env_c.iter().map(|a| a.as_ptr().cast_mut()).collect();
    envp.push(std::ptr::null_mut());

    let mut s = SpawnSetup::new()?;
    let moves: [(RawFd, RawFd); 3] = [
        (fds.stdout.as_raw_fd(), 1),
        (fds.channel.as_raw_fd(), 3),
        (fds.program_stderr.as_raw_fd(), 4),
    ];
    // No move may overwrite a source not yet moved: every source is above every target.
    if moves.iter().any(|&(src, _)| src <= 4) || fds.stdin.is_some_and(|f| f.as_raw_fd() <= 4) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a launcher descriptor is below 5",
        ));
    }
    // SAFETY: the attribute and file-action objects were initialised in `SpawnSetup::new`;
    // "/dev/null" is a NUL-terminated static string; the signal sets are initialised by
    // sigemptyset before use.
    unsafe {
        match fds.stdin {
            Some(f) => check(libc::posix_spawn_file_actions_adddup2(
                &mut s.actions,
                f.as_raw_fd(),
                0,
            ))?,
            None => check(libc::posix_spawn_file_actions_addopen(
                &mut s.actions,
                0,
                c"/dev/null".as_ptr(),
                libc::O_RDONLY,
                0,
            ))?,
        }
        for (src, dst) in moves {
            check(libc::posix_spawn_file_actions_adddup2(
                &mut s.actions,
                src,
                dst,
            ))?;
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        let mut pipe_only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe_only);
        libc::sigaddset(&mut pipe_only, libc::SIGPIPE);
        check(libc::posix_spawnattr_setsigmask(&mut s.attr, &empty))?;
        check(libc::posix_spawnattr_setsigdefault(&mut s.attr, &pipe_only))?;
        check(libc::posix_spawnattr_setflags(
            &mut s.attr,
            (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
        ))?;
    }
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is valid for the call: the path, the argv and envp arrays
    // (NULL-terminated, pointing into CStrings alive until the end of this function), and
    // the initialised attributes and file actions.
    check(unsafe {
        libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            &s.actions,
            &s.attr,
            argv.as_ptr(),
            envp.as_ptr(),
        )
    })?;
    Ok(Launcher { pid, status: None })
}
