//! What a front does to itself before it reads one byte of untrusted input.
//!
//! A front (the MCP front today) parses bytes an attacker may have written: JSON-RPC from
//! an agent host that reads web pages. If that parser is ever taken over, the process it
//! takes over must be able to do nothing but what the front already does: read and write
//! the descriptors it holds, allocate memory, run its own threads, tell the time. So
//! [`confine`]:
//!
//! 1. makes the process non-dumpable (no ptrace attach or `/proc/PID/mem` from other
//!    processes of the same user);
//! 2. sets `no_new_privs`;
//! 3. installs two seccomp filters on every thread (TSYNC):
//!    - `clone3` fails with `ENOSYS`, so glibc falls back to `clone`, whose flags seccomp can
//!      read (`clone3` passes them in memory);
//!    - last, an allowlist ([`allowlist`]): anything else fails with `EPERM`. There is no
//!      `open`/`openat`, no `execve`, no `socket`/`connect`, no `fork` (`clone` only with
//!      `CLONE_THREAD`), no `kill` (`tgkill` only at its own process, for `abort`), no
//!      executable memory (`mmap`/`mprotect` without `PROT_EXEC`), no `ioctl`, no `ptrace`,
//!      no `io_uring`, no `prctl` or `seccomp` (so nothing can be loosened or re-installed).
//!
//! Refused calls fail with an errno rather than killing the process: a confined front
//! that reaches for something it may not have gets an error it can report, and a hostile
//! one gains nothing either way.
//! The kernel evaluates every installed filter and keeps the most restrictive verdict, so
//! the `ENOSYS` for `clone3` wins over the allowlist's `ALLOW`, and nothing installed later
//! can widen either filter.
//!
//! What this does not do: limit what the front can ask for over the descriptors it keeps
//! (that is the monitor's dispatch table), or bound its memory and CPU (a confined front
//! can still spin or allocate; the host that started it owns it).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Which front is confining itself. Each role has its own allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontRole {
    /// `zygo mcp`'s JSON-RPC front: stdin, stdout, stderr and its socket to the monitor
    /// side, plus threads.
    Mcp,
}

/// Why a front could not confine itself. A front that cannot confine itself must not go
/// on to read its input.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("this architecture ({0}) has no seccomp allowlist for fronts; fronts run only on x86_64 and aarch64")]
    UnsupportedArch(&'static str),
    #[error("build the front's seccomp filter: {0}")]
    Build(String),
    #[error("make the front non-dumpable: {0}")]
    Dumpable(std::io::Error),
    #[error("set no_new_privs on the front: {0}")]
    NoNewPrivs(std::io::Error),
    #[error("install the front's seccomp filter (the kernel needs CONFIG_SECCOMP_FILTER): {0}")]
    Install(String),
}

/// How a syscall in the allowlist is restricted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Whatever its arguments.
    Always,
    /// Only when `(arg[index] & mask) == value`.
    Masked { index: u8, mask: u64, value: u64 },
    /// Only when `arg[index] == value`.
    Equals { index: u8, value: u64 },
}

/// One allowlist entry: the syscall, when it is allowed, and why the front needs it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub nr: i64,
    pub name: &'static str,
    pub when: When,
    pub why: &'static str,
}

const fn always(nr: i64, name: &'static str, why: &'static str) -> Entry {
    Entry {
        nr,
        name,
        when: When::Always,
        why,
    }
}

const EXEC_BIT: u64 = libc::PROT_EXEC as u64;
const THREAD_BIT: u64 = libc::CLONE_THREAD as u64;

/// The allowlist of a role. `pid` is the front's own process id (for `tgkill`).
pub fn allowlist(role: FrontRole, pid: u32) -> Vec<Entry> {
    use libc::*;
    let FrontRole::Mcp = role;
    let mut v = vec![
        always(SYS_read, "read", "stdin and the monitor channel"),
        always(SYS_readv, "readv", "buffered reads"),
        always(SYS_write, "write", "stdout, stderr and the monitor channel"),
        always(SYS_writev, "writev", "buffered writes"),
        always(SYS_recvfrom, "recvfrom", "std reads sockets with recv"),
        always(SYS_sendto, "sendto", "std writes sockets with send"),
        always(SYS_recvmsg, "recvmsg", "socket reads"),
        always(SYS_sendmsg, "sendmsg", "socket writes"),
        always(SYS_shutdown, "shutdown", "ending the monitor channel"),
        always(SYS_close, "close", "dropping descriptors it already holds"),
        always(SYS_ppoll, "ppoll", "waiting on its descriptors"),
        always(
            SYS_futex,
            "futex",
            "locks, condition variables, thread joins",
        ),
        always(SYS_munmap, "munmap", "freeing memory"),
        always(SYS_mremap, "mremap", "growing allocations"),
        always(
            SYS_madvise,
            "madvise",
            "glibc returning freed thread stacks",
        ),
        always(SYS_brk, "brk", "the heap"),
        always(
            SYS_set_robust_list,
            "set_robust_list",
            "glibc, at thread start",
        ),
        always(SYS_rseq, "rseq", "glibc, at thread start"),
        always(
            SYS_sigaltstack,
            "sigaltstack",
            "std's stack-overflow handler, per thread",
        ),
        always(SYS_rt_sigaction, "rt_sigaction", "signal dispositions"),
        always(
            SYS_rt_sigprocmask,
            "rt_sigprocmask",
            "glibc blocks signals around clone",
        ),
        always(
            SYS_rt_sigreturn,
            "rt_sigreturn",
            "returning from a signal handler",
        ),
        always(
            SYS_clock_gettime,
            "clock_gettime",
            "timeouts (when the vDSO falls back)",
        ),
        always(SYS_clock_getres, "clock_getres", "timers"),
        always(SYS_clock_nanosleep, "clock_nanosleep", "sleeping"),
        always(SYS_nanosleep, "nanosleep", "sleeping"),
        always(
            SYS_gettimeofday,
            "gettimeofday",
            "the time (when the vDSO falls back)",
        ),
        always(SYS_getrandom, "getrandom", "hash map seeds"),
        always(SYS_sched_yield, "sched_yield", "spin locks"),
        always(
            SYS_sched_getaffinity,
            "sched_getaffinity",
            "thread pools sizing",
        ),
        always(SYS_getpid, "getpid", "its own id"),
        always(SYS_gettid, "gettid", "its own thread id"),
        always(SYS_exit, "exit", "a thread ending"),
        always(SYS_exit_group, "exit_group", "the process ending"),
        always(
            SYS_restart_syscall,
            "restart_syscall",
            "an interrupted sleep resuming",
        ),
        Entry {
            nr: SYS_mmap,
            name: "mmap",
            when: When::Masked {
                index: 2,
                mask: EXEC_BIT,
                value: 0,
            },
            why: "memory and thread stacks, never executable",
        },
        Entry {
            nr: SYS_mprotect,
            name: "mprotect",
            when: When::Masked {
                index: 2,
                mask: EXEC_BIT,
                value: 0,
            },
            why: "guard pages, never making memory executable",
        },
        Entry {
            nr: SYS_clone,
            name: "clone",
            when: When::Masked {
                index: 0,
                mask: THREAD_BIT,
                value: THREAD_BIT,
            },
            why: "threads only: CLONE_THREAD is required, so no new process",
        },
        Entry {
            nr: SYS_clone3,
            name: "clone3",
            when: When::Always,
            why: "answered ENOSYS by the second filter (its flags are in memory, out of \
                  seccomp's sight), so glibc falls back to clone",
        },
        Entry {
            nr: SYS_tgkill,
            name: "tgkill",
            when: When::Equals {
                index: 0,
                value: u64::from(pid),
            },
            why: "abort() signalling itself; never another process",
        },
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(always(SYS_poll, "poll", "waiting on its descriptors"));
    v
}

fn target_arch() -> Result<TargetArch, ConfineError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        "aarch64" => Ok(TargetArch::aarch64),
        other => Err(ConfineError::UnsupportedArch(other)),
    }
}

fn build_err(e: impl std::fmt::Display) -> ConfineError {
    ConfineError::Build(e.to_string())
}

/// The two BPF programs of a role, in the order they are installed: the `clone3` →
/// `ENOSYS` filter, then the allowlist (last, because installing a filter takes `prctl`
/// and `seccomp`, which the allowlist refuses). Built before fork in tests, so a forked
/// child only has to install them.
pub fn filters(role: FrontRole, pid: u32) -> Result<Vec<BpfProgram>, ConfineError> {
    let arch = target_arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for e in allowlist(role, pid) {
        let conds = match e.when {
            When::Always => None,
            When::Masked { index, mask, value } => Some(
                SeccompCondition::new(
                    index,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(mask),
                    value,
                )
                .map_err(build_err)?,
            ),
            When::Equals { index, value } => Some(
                SeccompCondition::new(index, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, value)
                    .map_err(build_err)?,
            ),
        };
        let slot = rules.entry(e.nr).or_default();
        if let Some(c) = conds {
            slot.push(SeccompRule::new(vec![c]).map_err(build_err)?);
        }
    }
    let allow = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(build_err)?;
    let mut enosys = BTreeMap::new();
    enosys.insert(libc::SYS_clone3, Vec::new());
    let clone3 = SeccompFilter::new(
        enosys,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(build_err)?;
    Ok(vec![
        BpfProgram::try_from(clone3).map_err(build_err)?,
        BpfProgram::try_from(allow).map_err(build_err)?,
    ])
}

/// Non-dumpable, no_new_privs, then install `progs` on every thread of the process. Only
/// system calls, no allocation: safe in a forked child.
pub fn apply(progs: &[BpfProgram]) -> Result<(), ConfineError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(ConfineError::Dumpable(std::io::Error::last_os_error()));
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfineError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    for p in progs {
        seccompiler::apply_filter_all_threads(p)
            .map_err(|e| ConfineError::Install(e.to_string()))?;
    }
    Ok(())
}

/// Confine the calling process for `role`. Call it before reading untrusted input; if it
/// fails, exit instead of going on.
pub fn confine(role: FrontRole) -> Result<(), ConfineError> {
    let progs = filters(role, std::process::id())?;
    apply(&progs)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::ffi::CString;

    /// Nothing that reaches the filesystem, starts a program or a process, or opens a
    /// socket may ever be in the MCP front's allowlist.
    #[test]
    fn allowlist_has_no_dangerous_calls() {
        let list = allowlist(FrontRole::Mcp, 1);
        let mut forbidden = vec![
            libc::SYS_openat,
            libc::SYS_openat2,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_accept4,
            libc::SYS_kill,
            libc::SYS_ptrace,
            libc::SYS_ioctl,
            libc::SYS_io_uring_setup,
            libc::SYS_process_vm_writev,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_mount,
            libc::SYS_bpf,
            libc::SYS_memfd_create,
            libc::SYS_pidfd_open,
            libc::SYS_dup3,
            libc::SYS_fcntl,
            libc::SYS_unlinkat,
            libc::SYS_mkdirat,
            libc::SYS_renameat2,
        ];
        #[cfg(target_arch = "x86_64")]
        forbidden.extend([
            libc::SYS_open,
            libc::SYS_creat,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_accept,
        ]);
        for nr in forbidden {
            assert!(
                !list.iter().any(|e| e.nr == nr),
                "syscall {nr} must not be in the front's allowlist"
            );
        }
        for e in &list {
            assert!(!e.why.is_empty(), "{} has no reason", e.name);
        }
        let clone = list.iter().find(|e| e.nr == libc::SYS_clone).unwrap();
        assert_eq!(
            clone.when,
            When::Masked {
                index: 0,
                mask: THREAD_BIT,
                value: THREAD_BIT
            }
        );
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// Confinement in a forked child: afterwards openat, execve, socket, fork and
    /// executable memory fail, while threads, memory and the descriptors it already holds
    /// keep working. The child reports each check as one bit of its exit code.
    #[test]
    fn confined_front_cannot_open_exec_or_connect() {
        // Everything that allocates happens before fork.
        let path = CString::new("/etc/hostname").unwrap();
        let prog = CString::new("/bin/true").unwrap();
        let argv = [prog.as_ptr(), std::ptr::null()];
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        let mut fds = [0; 2];
        // SAFETY: a two-element array for pipe.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fork in a test; the child only makes system calls, spawns one thread and
        // exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let progs = match filters(FrontRole::Mcp, std::process::id()) {
                Ok(p) => p,
                // SAFETY: leaving the forked child.
                Err(_) => unsafe { libc::_exit(100) },
            };
            if apply(&progs).is_err() {
                // SAFETY: leaving the forked child.
                unsafe { libc::_exit(101) };
            }
            let mut bad = 0;
            // SAFETY: raw system calls with valid pointers; each is expected to fail.
            unsafe {
                let r = libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), 0);
                if r != -1 || errno() != libc::EPERM {
                    bad |= 1;
                }
                let r = libc::syscall(
                    libc::SYS_execve,
                    prog.as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                );
                if r != -1 || errno() != libc::EPERM {
                    bad |= 2;
                }
                let r = libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if r != -1 || errno() != libc::EPERM {
                    bad |= 4;
                }
                // A new process (fork is clone without CLONE_THREAD).
                let r = libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                if r == 0 {
                    libc::_exit(0);
                }
                if r != -1 || errno() != libc::EPERM {
                    bad |= 8;
                }
                let m = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if m != libc::MAP_FAILED || errno() != libc::EPERM {
                    bad |= 16;
                }
                let r = libc::syscall(libc::SYS_kill, 1, 0);
                if r != -1 || errno() != libc::EPERM {
                    bad |= 32;
                }
                let r = libc::syscall(libc::SYS_clone3, 0, 0);
                if r != -1 || errno() != libc::ENOSYS {
                    bad |= 64;
                }
            }
            // What the front does keep: threads (through glibc's clone fallback), memory,
            // and writing to a descriptor it already holds.
            let t = std::thread::spawn(|| vec![7u8; 1 << 20].len());
            match t.join() {
                Ok(n) if n == 1 << 20 => {}
                _ => bad |= 128,
            }
            let byte = [b'x'];
            // SAFETY: writing one byte from a valid buffer to our pipe.
            if unsafe { libc::write(fds[1], byte.as_ptr().cast(), 1) } != 1 {
                bad |= 128;
            }
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(bad) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        let mut got = [0u8; 1];
        // SAFETY: closing our write end, then reading one byte into a valid buffer.
        let n = unsafe {
            libc::close(fds[1]);
            let n = libc::read(fds[0], got.as_mut_ptr().cast(), 1);
            libc::close(fds[0]);
            n
        };
        assert!(
            libc::WIFEXITED(status),
            "the confined child died: {status:#x}"
        );
        let code = libc::WEXITSTATUS(status);
        let names = [
            "openat",
            "execve",
            "socket",
            "fork",
            "PROT_EXEC",
            "kill",
            "clone3",
            "threads",
        ];
        let failed: Vec<&str> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| code & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        assert!(
            code < 100,
            "the child could not confine itself (exit {code})"
        );
        assert!(
            failed.is_empty(),
            "after confinement these behaved wrongly: {failed:?}"
        );
        assert_eq!(
            (n, got[0]),
            (1, b'x'),
            "the child could not write to its pipe"
        );
    }
}
