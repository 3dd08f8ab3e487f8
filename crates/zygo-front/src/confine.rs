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
//! 3. installs one seccomp filter on every thread (TSYNC), compiled from the role's table
//!    ([`allowlist`] and [`enosys_list`], a `plumbing::seccomp::Table` like the sandbox's):
//!    `clone3` fails with `ENOSYS`, so glibc falls back to `clone`, whose flags seccomp can
//!    read (`clone3` passes them in memory); anything not in the allowlist fails with
//!    `EPERM`. There is no `open`/`openat`, no `execve`, no `socket`/`connect`, no `fork`
//!    (`clone` only with `CLONE_THREAD`), no `kill` (`tgkill` only at its own process, for
//!    `abort`), no executable memory (`mmap`/`mprotect` without `PROT_EXEC`), no `ioctl`,
//!    no `ptrace`, no `io_uring`, no `prctl` or `seccomp` (so nothing can be loosened or
//!    re-installed).
//!
//! Refused calls fail with an errno rather than killing the process: a confined front
//! that reaches for something it may not have gets an error it can report, and a hostile
//! one gains nothing either way. Another architecture's syscalls (i386 through `int 0x80`)
//! kill it. The kernel evaluates every installed filter and keeps the most restrictive
//! verdict, so nothing installed later could widen this one.
//!
//! What this does not do: limit what the front can ask for over the descriptors it keeps
//! (that is the monitor's dispatch table), or bound its memory and CPU (a confined front
//! can still spin or allocate; the host that started it owns it).

use plumbing::seccomp::{
    self as bpf, sock_filter, Allowed, Enosys, InstallError, Table, TableError, Threads, When,
};
use plumbing::{allow, enosys};

/// Which front is confining itself. Each role has its own allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontRole {
    /// `zygo mcp`'s JSON-RPC front: stdin, stdout, stderr and its socket to the monitor
    /// side, plus threads.
    Mcp,
    /// `zygo api`'s HTTP front: everything the MCP front has, plus taking connections on
    /// the listener it already holds, the socket options of those connections (timeouts),
    /// a second descriptor for each connection (its read and write halves), and waiting
    /// for SIGTERM. Before the seccomp filter it also drops every capability and puts
    /// itself in a Landlock domain with no filesystem access and no TCP bind or connect.
    Api,
}

/// Why a front could not confine itself. A front that cannot confine itself must not go
/// on to read its input.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("build the front's seccomp filter: {0}")]
    Build(#[from] TableError),
    #[error("make the front non-dumpable: {0}")]
    Dumpable(std::io::Error),
    #[error("set no_new_privs on the front: {0}")]
    NoNewPrivs(std::io::Error),
    #[error("install the front's seccomp filter (the kernel needs CONFIG_SECCOMP_FILTER): {0}")]
    Install(InstallError),
    #[error("drop the front's capabilities: {0}")]
    Caps(String),
    #[error("put the front in a Landlock domain: {0}")]
    Landlock(String),
}

/// The allowlist of a role. `pid` is the front's own process id (for `tgkill`).
#[rustfmt::skip]
pub fn allowlist(role: FrontRole, pid: u32) -> Vec<Allowed> {
    use libc::*;
    let mut v = vec![
        // ---- Its descriptors: stdin, stdout, stderr and the channel to the monitor side
        allow!(SYS_read, "JSON-RPC requests from stdin"),
        allow!(SYS_readv, "std's vectored reads (read_vectored) of stdin, should a buffered reader pass one through"),
        allow!(SYS_write, "answers to stdout, log lines to stderr"),
        allow!(SYS_writev, "std's vectored writes (write_vectored) to stdout and stderr"),
        allow!(SYS_recvfrom, "replies from the monitor side: std reads a UnixStream with recv"),
        allow!(SYS_sendto, "calls to the monitor side: std writes a UnixStream with send"),
        allow!(SYS_recvmsg, "replies from the monitor side, should the channel be read with recvmsg (vectored or with ancillary data)"),
        allow!(SYS_sendmsg, "calls to the monitor side, should the channel be written with sendmsg (vectored or with ancillary data)"),
        allow!(SYS_shutdown, "ending the channel, so the monitor side stops what the front started"),
        allow!(SYS_close, "dropping descriptors it already holds (its clone of the channel)"),
        allow!(SYS_ppoll, "waiting until a descriptor it holds is ready"),
        // ---- Memory, never executable
        allow!(SYS_mmap, When::MaskClear { arg: 2, mask: PROT_EXEC as u32 },
               "large allocations and thread stacks; never executable, so no code can be loaded"),
        allow!(SYS_mprotect, When::MaskClear { arg: 2, mask: PROT_EXEC as u32 },
               "thread stacks' guard pages; never making memory executable"),
        allow!(SYS_munmap, "freeing large allocations and ended threads' stacks"),
        allow!(SYS_mremap, "growing a large buffer in place (a long request or answer)"),
        allow!(SYS_madvise, "glibc handing ended threads' stacks back to the kernel"),
        allow!(SYS_brk, "the heap: requests, answers and JSON values"),
        // ---- Threads: the channel's reader and one per request
        allow!(SYS_clone, When::MaskSet { arg: 0, mask: CLONE_THREAD as u32 },
               "a thread per request and the channel's reader; CLONE_THREAD is required, so never a new process"),
        allow!(SYS_futex, "the locks, condition variables and channels between its threads"),
        allow!(SYS_set_robust_list, "glibc registering each new thread's robust mutexes"),
        allow!(SYS_rseq, "glibc registering each new thread for restartable sequences"),
        allow!(SYS_sigaltstack, "std's stack-overflow handler giving each new thread a signal stack"),
        allow!(SYS_rt_sigaction, "std's stack-overflow handler, and abort() restoring SIGABRT's default"),
        allow!(SYS_rt_sigprocmask, "glibc blocking signals while it starts a thread, and abort() unblocking SIGABRT"),
        allow!(SYS_rt_sigreturn, "returning from a signal handler (std's stack-overflow handler)"),
        allow!(SYS_sched_yield, "glibc's and std's locks yielding while they spin"),
        allow!(SYS_sched_getaffinity, "std::thread::available_parallelism, should a library size a pool by it"),
        allow!(SYS_exit, "a request's thread ending once it has answered"),
        allow!(SYS_exit_group, "the front ending when stdin closes"),
        // ---- Time and randomness
        allow!(SYS_clock_gettime, "request deadlines and the end-of-input grace (when the vDSO falls back)"),
        allow!(SYS_clock_getres, "the resolution of the clocks its timeouts use (when the vDSO falls back)"),
        allow!(SYS_clock_nanosleep, "a thread pausing: std::thread::sleep and glibc's nanosleep come here"),
        allow!(SYS_nanosleep, "a thread pausing, as code built for older kernels asks for it"),
        allow!(SYS_gettimeofday, "wall-clock time for log lines, should code ask this way (when the vDSO falls back)"),
        allow!(SYS_getrandom, "HashMap seeds, so request ids a client chooses cannot be made to collide"),
        allow!(SYS_restart_syscall, "the kernel resuming a sleep or wait a signal interrupted"),
        // ---- Itself, for abort()
        allow!(SYS_getpid, "abort() naming its own process to tgkill"),
        allow!(SYS_gettid, "abort() naming its own thread to tgkill"),
        allow!(SYS_tgkill, When::Equals { arg: 0, value: u64::from(pid) },
               "abort() signalling its own thread; never another process"),
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(allow!(SYS_poll, "waiting until a descriptor it holds is ready (the older form)"));
    if role == FrontRole::Api {
        v.extend([
            allow!(SYS_accept4, "taking a connection on the listener it bound before confining itself"),
            allow!(SYS_setsockopt, When::Equals { arg: 1, value: SOL_SOCKET as u64 },
                   "read and write timeouts on its connections and channels (SO_RCVTIMEO, SO_SNDTIMEO), and SO_LINGER 0 to reset a connection whose client does not take its answer"),
            allow!(SYS_getsockname, "the listener's own address, which the HTTP server asks for once"),
            allow!(SYS_getpeername, "a connection's peer address, kept with its requests"),
            allow!(SYS_fcntl, When::Equals { arg: 1, value: F_DUPFD_CLOEXEC as u64 },
                   "a second descriptor for a connection it holds (its read and write halves); nothing else fcntl does"),
            allow!(SYS_rt_sigtimedwait, "the signal thread waiting for SIGTERM or SIGINT, which every thread blocks"),
        ]);
    }
    v
}

/// The syscalls a role has answered with `ENOSYS`.
pub fn enosys_list(role: FrontRole) -> &'static [Enosys] {
    match role {
        FrontRole::Mcp | FrontRole::Api => MCP_ENOSYS,
    }
}

#[rustfmt::skip]
static MCP_ENOSYS: &[Enosys] = { use libc::*; &[
    enosys!(SYS_clone3, "its flags are in memory, out of seccomp's sight: glibc falls back to clone, whose CLONE_THREAD the allowlist checks"),
]};

/// The BPF program of a role: its table compiled (`plumbing::seccomp::compile` describes the
/// code). Built before fork in tests, so a forked child only has to install it.
pub fn filter(role: FrontRole, pid: u32) -> Result<Vec<sock_filter>, ConfineError> {
    let allowed = allowlist(role, pid);
    let table = Table {
        allowed: &allowed,
        enosys: enosys_list(role),
        // Anything it does not name, however new, is refused: nothing to review.
        reviewed_up_to: None,
    };
    Ok(bpf::build(&table)?.as_slice().to_vec())
}

/// Non-dumpable, no_new_privs, then install `prog` on every thread of the process. Only
/// system calls, no allocation: safe in a forked child.
pub fn apply(prog: &[sock_filter]) -> Result<(), ConfineError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(ConfineError::Dumpable(std::io::Error::last_os_error()));
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfineError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    bpf::install(prog, Threads::All).map_err(ConfineError::Install)
}

/// Confine the calling process for `role`. Call it before reading untrusted input; if it
/// fails, exit instead of going on. For the API role, call it before any thread is started:
/// capabilities and the Landlock domain are per thread, inherited by threads started later.
pub fn confine(role: FrontRole) -> Result<(), ConfineError> {
    let prog = filter(role, std::process::id())?;
    if role == FrontRole::Api {
        drop_capabilities()?;
        landlock_nothing()?;
    }
    apply(&prog)
}

/// Every capability gone from every set, the bounding set first (that needs
/// CAP_SETPCAP, which goes last). A front run without capabilities (by a user other than
/// root) cannot change its bounding set and has nothing else to drop; its bounding set
/// gives it nothing either, since the seccomp filter that follows sets `no_new_privs`, so
/// no program it could start gains a capability.
pub fn drop_capabilities() -> Result<(), ConfineError> {
    use caps::{CapSet, Capability};
    let err = |what: &str| {
        let what = what.to_string();
        move |e: caps::errors::CapsError| ConfineError::Caps(format!("{what}: {e}"))
    };
    let may_drop = caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)
        .map_err(err("read the effective set"))?;
    if may_drop {
        let bounding = caps::read(None, CapSet::Bounding).map_err(err("read the bounding set"))?;
        for cap in bounding {
            caps::drop(None, CapSet::Bounding, cap).map_err(err("drop from the bounding set"))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(err("clear the ambient set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(err("clear the inheritable set"))?;
    caps::clear(None, CapSet::Effective).map_err(err("clear the effective set"))?;
    caps::clear(None, CapSet::Permitted).map_err(err("clear the permitted set"))?;
    Ok(())
}

/// A Landlock domain that handles every filesystem right and TCP bind and connect (as far
/// as this kernel's ABI goes) and grants none, and scopes abstract unix sockets and
/// signals to the domain. `Ok(false)`: this kernel has no Landlock (the seccomp filter
/// still refuses every call that opens a file or a socket).
pub fn landlock_nothing() -> Result<bool, ConfineError> {
    use landlock::{
        Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetStatus,
        Scope, ABI,
    };
    let abi = ABI::V6;
    let io = |e: landlock::RulesetError| ConfineError::Landlock(e.to_string());
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(io)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(io)?
        .scope(Scope::from_all(abi))
        .map_err(io)?
        .create()
        .map_err(io)?
        .restrict_self()
        .map_err(io)?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
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
        let clone = list.iter().find(|e| e.nr == libc::SYS_clone).unwrap();
        assert_eq!(
            clone.when,
            When::MaskSet {
                arg: 0,
                mask: libc::CLONE_THREAD as u32
            }
        );
        for nr in [libc::SYS_mmap, libc::SYS_mprotect] {
            let e = list.iter().find(|e| e.nr == nr).unwrap();
            let no_exec = When::MaskClear {
                arg: 2,
                mask: libc::PROT_EXEC as u32,
            };
            assert_eq!(e.when, no_exec, "{}", e.name());
        }
    }

    /// Every entry says why the front needs the call, in more words than its name.
    #[test]
    fn every_entry_says_why_the_front_needs_it() {
        let list = allowlist(FrontRole::Mcp, 1);
        let enosys = enosys_list(FrontRole::Mcp);
        let reasons = list
            .iter()
            .map(|e| (e.name(), e.reason))
            .chain(enosys.iter().map(|e| (e.name(), e.reason)));
        for (name, reason) in reasons {
            assert!(
                reason.split_whitespace().count() >= 4 && reason != name,
                "{name}: {reason:?} is no reason"
            );
        }
    }

    /// For every syscall number, sample arguments (the pid among them) and foreign
    /// architectures, the program answers what the table says.
    #[test]
    fn front_program_answers_as_its_table_says() {
        let pid = std::process::id();
        let allowed = allowlist(FrontRole::Mcp, pid);
        let table = Table {
            allowed: &allowed,
            enosys: enosys_list(FrontRole::Mcp),
            reviewed_up_to: None,
        };
        let prog = filter(FrontRole::Mcp, pid).unwrap();
        assert_eq!(table.disagreement(&prog), None);
        let ask =
            |nr: i64, args: [u64; 6]| bpf::evaluate(&prog, bpf::AUDIT_ARCH, nr as u32, args).ret;
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(
            ask(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]),
            bpf::RET_ALLOW
        );
        let fork = libc::SIGCHLD as u64;
        assert_eq!(ask(libc::SYS_clone, [fork, 0, 0, 0, 0, 0]), bpf::RET_EPERM);
        let rx = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        assert_eq!(ask(libc::SYS_mmap, [0, 4096, rx, 0, 0, 0]), bpf::RET_EPERM);
        assert_eq!(
            ask(libc::SYS_tgkill, [pid.into(), 0, 6, 0, 0, 0]),
            bpf::RET_ALLOW
        );
        assert_eq!(ask(libc::SYS_tgkill, [1, 1, 9, 0, 0, 0]), bpf::RET_EPERM);
        assert_eq!(ask(libc::SYS_clone3, [0; 6]), bpf::RET_ENOSYS);
        assert_eq!(ask(libc::SYS_openat, [0; 6]), bpf::RET_EPERM);
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
            let prog = match filter(FrontRole::Mcp, std::process::id()) {
                Ok(p) => p,
                // SAFETY: leaving the forked child.
                Err(_) => unsafe { libc::_exit(100) },
            };
            if apply(&prog).is_err() {
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

    /// The API front's allowlist: what an HTTP server needs on descriptors it already
    /// holds, and still nothing that opens a file or a socket, starts a program or a
    /// process, or loosens the filter.
    #[test]
    fn api_allowlist_adds_only_what_a_server_needs() {
        let list = allowlist(FrontRole::Api, 1);
        let mut forbidden = vec![
            libc::SYS_openat,
            libc::SYS_openat2,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_kill,
            libc::SYS_ptrace,
            libc::SYS_ioctl,
            libc::SYS_prctl,
            libc::SYS_seccomp,
            libc::SYS_landlock_create_ruleset,
            libc::SYS_landlock_restrict_self,
            libc::SYS_capset,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_mount,
            libc::SYS_bpf,
            libc::SYS_memfd_create,
            libc::SYS_dup3,
            libc::SYS_unlinkat,
        ];
        #[cfg(target_arch = "x86_64")]
        forbidden.extend([
            libc::SYS_open,
            libc::SYS_creat,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_dup2,
        ]);
        for nr in forbidden {
            assert!(
                !list.iter().any(|e| e.nr == nr),
                "syscall {nr} must not be in the API front's allowlist"
            );
        }
        let fcntl = list.iter().find(|e| e.nr == libc::SYS_fcntl).unwrap();
        assert_eq!(
            fcntl.when,
            When::Equals {
                arg: 1,
                value: libc::F_DUPFD_CLOEXEC as u64
            }
        );
        let sso = list.iter().find(|e| e.nr == libc::SYS_setsockopt).unwrap();
        assert_eq!(
            sso.when,
            When::Equals {
                arg: 1,
                value: libc::SOL_SOCKET as u64
            }
        );
        let reasons = list.iter().map(|e| (e.name(), e.reason));
        for (name, reason) in reasons {
            assert!(
                reason.split_whitespace().count() >= 4,
                "{name}: {reason:?} is no reason"
            );
        }
    }

    fn landlock_abi() -> i64 {
        // SAFETY: landlock_create_ruleset with LANDLOCK_CREATE_RULESET_VERSION only asks.
        unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, 0usize, 0usize, 1u32) }
    }

    /// A TCP listener on loopback and a socket not yet connected, made before fork.
    fn tcp_pair() -> (std::net::TcpListener, i32, libc::sockaddr_in) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // SAFETY: creating a socket; the number is ours.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        assert!(fd >= 0);
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        (l, fd, addr)
    }

    /// Run `body` in a forked child; its exit code (a bit per wrong answer) comes back.
    fn in_child(body: impl FnOnce() -> i32) -> i32 {
        // SAFETY: fork in a test; the child makes system calls and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = body();
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// The whole API confinement in a forked child: afterwards no file opens, no program
    /// starts, no socket is made, a socket it holds cannot connect (to TCP on loopback or
    /// to a unix socket), fcntl does nothing but duplicate; duplicating and threads work.
    #[test]
    fn confined_api_front_cannot_open_exec_or_connect() {
        let path = CString::new("/etc/hostname").unwrap();
        let prog = CString::new("/bin/true").unwrap();
        let argv = [prog.as_ptr(), std::ptr::null()];
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        let (_l, tcp, addr) = tcp_pair();
        let dir = std::env::temp_dir().join(format!("zygo-front-confine-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let _ul = std::os::unix::net::UnixListener::bind(&dir).unwrap();
        // SAFETY: a unix socket for the child to try to connect.
        let ufd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
        let mut uaddr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        uaddr.sun_family = libc::AF_UNIX as u16;
        for (i, b) in dir.as_os_str().as_encoded_bytes().iter().enumerate() {
            uaddr.sun_path[i] = *b as libc::c_char;
        }
        let code = in_child(|| {
            if confine(FrontRole::Api).is_err() {
                return 100;
            }
            let mut bad = 0;
            // SAFETY: raw system calls with valid pointers; each is expected to fail.
            unsafe {
                if libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), 0) != -1
                    || errno() != libc::EPERM
                {
                    bad |= 1;
                }
                if libc::syscall(
                    libc::SYS_execve,
                    prog.as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                ) != -1
                {
                    bad |= 2;
                }
                if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) != -1 {
                    bad |= 4;
                }
                let r = libc::connect(
                    tcp,
                    (&addr as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                );
                if r != -1 {
                    bad |= 8;
                }
                let r = libc::connect(
                    ufd,
                    (&uaddr as *const libc::sockaddr_un).cast(),
                    std::mem::size_of::<libc::sockaddr_un>() as u32,
                );
                if r != -1 {
                    bad |= 16;
                }
                if libc::fcntl(tcp, libc::F_SETFL, libc::O_NONBLOCK) != -1 {
                    bad |= 32;
                }
                let d = libc::fcntl(tcp, libc::F_DUPFD_CLOEXEC, 3);
                if d < 0 {
                    bad |= 64;
                }
            }
            let t = std::thread::spawn(|| 7);
            if t.join().ok() != Some(7) {
                bad |= 64;
            }
            bad
        });
        let _ = std::fs::remove_file(&dir);
        assert!(code < 100, "the child could not confine itself");
        let names = [
            "openat",
            "execve",
            "socket",
            "connect tcp",
            "connect unix",
            "fcntl F_SETFL",
            "dup/threads",
        ];
        let failed: Vec<&str> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| code & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        assert!(
            failed.is_empty(),
            "after confinement these behaved wrongly: {failed:?}"
        );
    }

    /// Landlock on its own (should the filter ever let a call through): no file opens,
    /// and where the kernel's ABI has it (4+), no TCP connect.
    #[test]
    fn landlock_alone_denies_files_and_tcp() {
        let abi = landlock_abi();
        if abi < 1 {
            eprintln!("this kernel has no Landlock");
            return;
        }
        let path = CString::new("/etc/hostname").unwrap();
        let (_l, tcp, addr) = tcp_pair();
        let code = in_child(|| {
            match landlock_nothing() {
                Ok(true) => {}
                _ => return 100,
            }
            let mut bad = 0;
            // SAFETY: raw system calls with valid pointers.
            unsafe {
                let r = libc::open(path.as_ptr(), libc::O_RDONLY);
                if r != -1 || errno() != libc::EACCES {
                    bad |= 1;
                }
                let r = libc::connect(
                    tcp,
                    (&addr as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                );
                if abi >= 4 && (r != -1 || errno() != libc::EACCES) {
                    bad |= 2;
                }
            }
            bad
        });
        assert_eq!(
            code,
            0,
            "Landlock let through: {}",
            if code & 1 != 0 { "open" } else { "tcp connect" }
        );
    }
}
