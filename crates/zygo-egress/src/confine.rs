//! The egress filter's confinement: the sandbox owner's ids, Landlock, and its own
//! seccomp table (see the crate's documentation for why each right is there).

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
    RulesetCreatedAttr, ABI,
};
use plumbing::seccomp::{self as bpf, Allowed, Enosys, Table, Threads, When};
use plumbing::{allow, enosys};

/// As root, take `ids` (the sandbox owner's host ids) as the real ids and nobody as the
/// effective and saved ones, with no supplementary groups; otherwise stay who we are (a
/// rootless launcher's user).
pub fn drop_ids(ids: Option<(u32, u32)>) -> std::io::Result<()> {
    // SAFETY: plain id query.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    // SAFETY: plain query of our parent, the launcher.
    let launcher = unsafe { libc::getppid() };
    let Some((uid, gid)) = ids else {
        return Err(std::io::Error::other(
            "started as root without ids to drop to",
        ));
    };
    if uid == 0 || gid == 0 {
        return Err(std::io::Error::other("refusing to run as id 0"));
    }
    // The real ids are the sandbox owner's: the kernel charges pipe buffer pages,
    // descriptors in flight and thread counts to the real uid, so the relay's use of them is
    // that sandbox's. The effective and saved ids are nobody's: capabilities in a user
    // namespace go to a process whose *effective* uid owns it, and the sandbox owner owns
    // the sandbox's (its network namespace's sockets are in the filter's hands), so the
    // filter must never be that uid effectively. Its seccomp table has no `set*id` call to
    // change back with.
    let nobody: u32 = 65534;
    // The per-user limit on threads as high as it goes: the sandbox's own processes count
    // against the same real uid, and should not keep the filter from starting a relay (the
    // filter's threads are bounded by its connection cap; a thread it cannot start refuses
    // that connection).
    let mut nproc = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills in the struct we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut nproc) };
    nproc.rlim_cur = nproc.rlim_max;
    let step = |what: &str, r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            let e = std::io::Error::last_os_error();
            Err(std::io::Error::new(e.kind(), format!("{what}: {e}")))
        }
    };
    // SAFETY: plain id- and limit-setting calls; an empty group list needs no buffer.
    unsafe {
        step(
            "raise RLIMIT_NPROC",
            libc::setrlimit(libc::RLIMIT_NPROC, &nproc),
        )?;
        step("drop the groups", libc::setgroups(0, std::ptr::null()))?;
        step("set the gids", libc::setresgid(gid, nobody, nobody))?;
        step("set the uids", libc::setresuid(uid, nobody, nobody))?;
        // Changing ids cleared the parent-death signal: arm it again, then make sure the
        // launcher did not end in between.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() != launcher {
            return Err(std::io::Error::other("the launcher has ended"));
        }
    }
    Ok(())
}

/// No filesystem access at all; TCP `connect` only to `ports`; no TCP `bind`. Best effort:
/// a kernel without Landlock (or without its network rights, before ABI 4) keeps the
/// seccomp table and the ids.
pub fn landlock(ports: &[u16]) -> Result<(), landlock::RulesetError> {
    let abi = ABI::V4;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .create()?;
    for p in ports {
        ruleset = ruleset.add_rule(NetPort::new(*p, AccessNet::ConnectTcp))?;
    }
    ruleset.restrict_self()?;
    Ok(())
}

/// The filter's allowlist. `pid` is its own process id (for `tgkill`).
#[rustfmt::skip]
pub fn allowlist(pid: u32) -> Vec<Allowed> {
    use libc::*;
    let mut v = vec![
        // ---- Connections: accepted inside the sandbox, made outside
        allow!(SYS_accept4, "taking a connection the sandbox made to an allowed address and port"),
        allow!(SYS_socket, When::OneOf { arg: 0, values: &[AF_INET as u32] },
               "an IPv4 socket for the connection out; no other family"),
        allow!(SYS_connect, "connecting out to the address a rule allows (Landlock limits the ports)"),
        allow!(SYS_getsockname, "the address the sandbox asked for: an accepted connection's local address"),
        allow!(SYS_getsockopt, When::OneOf { arg: 1, values: &[SOL_SOCKET as u32] },
               "a non-blocking connect's result (SO_ERROR), a socket's type; socket-level only"),
        allow!(SYS_setsockopt, When::OneOf { arg: 1, values: &[SOL_SOCKET as u32, IPPROTO_TCP as u32] },
               "a refused connection's reset (SO_LINGER), idle timeouts, TCP_NODELAY; never the \
                IP level (netfilter, IPsec policies)"),
        allow!(SYS_fcntl, When::OneOf { arg: 1, values: &[F_GETFL as u32, F_SETFL as u32, F_SETPIPE_SZ as u32] },
               "making the connection out blocking once it is made; sizing a relay's pipe"),
        allow!(SYS_splice, "relaying bytes through a pipe without copying them"),
        allow!(SYS_pipe2, "the pipe a connection's bytes are spliced through"),
        allow!(SYS_read, "relaying bytes"),
        allow!(SYS_write, "relaying bytes, and log lines to stderr"),
        allow!(SYS_writev, "std's vectored writes of log lines"),
        allow!(SYS_recvfrom, "relaying bytes: std reads a TcpStream with recv"),
        allow!(SYS_sendto, "relaying bytes: std writes a TcpStream with send"),
        allow!(SYS_shutdown, "passing one side's end on to the other"),
        allow!(SYS_close, "ending connections"),
        allow!(SYS_ppoll, "waiting for connections and for a connect to finish"),
        // ---- Memory, never executable
        allow!(SYS_mmap, When::MaskClear { arg: 2, mask: PROT_EXEC as u32 },
               "buffers and thread stacks; never executable"),
        allow!(SYS_mprotect, When::MaskClear { arg: 2, mask: PROT_EXEC as u32 },
               "thread stacks' guard pages; never making memory executable"),
        allow!(SYS_munmap, "freeing buffers and ended threads' stacks"),
        allow!(SYS_mremap, "growing a buffer in place"),
        allow!(SYS_madvise, "glibc handing ended threads' stacks back to the kernel"),
        allow!(SYS_brk, "the heap"),
        // ---- Threads: one per connection and direction
        allow!(SYS_clone, When::MaskSet { arg: 0, mask: CLONE_THREAD as u32 },
               "a thread per connection and direction; CLONE_THREAD is required, so never a new process"),
        allow!(SYS_futex, "joining a connection's second thread"),
        allow!(SYS_set_robust_list, "glibc registering each new thread's robust mutexes"),
        allow!(SYS_rseq, "glibc registering each new thread for restartable sequences"),
        allow!(SYS_sigaltstack, "std's stack-overflow handler giving each new thread a signal stack"),
        allow!(SYS_rt_sigaction, "std's stack-overflow handler, and abort() restoring SIGABRT's default"),
        allow!(SYS_rt_sigprocmask, "glibc blocking signals while it starts a thread, and abort()"),
        allow!(SYS_rt_sigreturn, "returning from a signal handler"),
        allow!(SYS_sched_yield, "glibc's and std's locks yielding while they spin"),
        allow!(SYS_exit, "a connection's thread ending"),
        allow!(SYS_exit_group, "the filter ending"),
        // ---- Time
        allow!(SYS_clock_gettime, "log lines' time stamps (when the vDSO falls back)"),
        allow!(SYS_clock_nanosleep, "a thread pausing"),
        allow!(SYS_getrandom, "HashMap seeds"),
        allow!(SYS_restart_syscall, "the kernel resuming a wait a signal interrupted"),
        // ---- Itself, for abort()
        allow!(SYS_getpid, "abort() naming its own process to tgkill"),
        allow!(SYS_gettid, "abort() naming its own thread to tgkill"),
        allow!(SYS_tgkill, When::Equals { arg: 0, value: u64::from(pid) },
               "abort() signalling its own thread; never another process"),
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(allow!(SYS_poll, "waiting for connections and for a connect to finish (the older form)"));
    v
}

#[rustfmt::skip]
static ENOSYS: &[Enosys] = { use libc::*; &[
    enosys!(SYS_clone3, "its flags are in memory, out of seccomp's sight: glibc falls back to clone, whose CLONE_THREAD the allowlist checks"),
]};

/// Why the filter could not confine itself (it then exits: no confinement, no relay).
#[derive(Debug)]
pub struct ConfineError(String);

impl std::fmt::Display for ConfineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The filter's BPF program.
pub fn filter(pid: u32) -> Result<Vec<bpf::sock_filter>, bpf::TableError> {
    let allowed = allowlist(pid);
    let table = Table {
        allowed: &allowed,
        enosys: ENOSYS,
        reviewed_up_to: None,
    };
    Ok(bpf::build(&table)?.as_slice().to_vec())
}

/// Non-dumpable, no_new_privs, then the seccomp table on every thread.
pub fn confine() -> Result<(), ConfineError> {
    let prog = filter(std::process::id())
        .map_err(|e| ConfineError(format!("build the seccomp filter: {e}")))?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(ConfineError(format!(
            "make the filter non-dumpable: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfineError(format!(
            "set no_new_privs: {}",
            std::io::Error::last_os_error()
        )));
    }
    bpf::install(&prog, Threads::All)
        .map_err(|e| ConfineError(format!("install the seccomp filter: {e}")))
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_builds_and_has_nothing_that_reaches_files_or_programs() {
        filter(1).unwrap();
        let list = allowlist(1);
        for nr in [
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_ptrace,
            libc::SYS_ioctl,
            libc::SYS_kill,
            libc::SYS_setns,
            libc::SYS_unshare,
            libc::SYS_mount,
            libc::SYS_sendmsg,
            libc::SYS_recvmsg,
            libc::SYS_io_uring_setup,
        ] {
            assert!(list.iter().all(|a| a.nr != nr), "{nr} is allowed");
        }
    }

    #[test]
    fn only_ipv4_sockets_may_be_opened() {
        let allowed = allowlist(1);
        let table = Table {
            allowed: &allowed,
            enosys: ENOSYS,
            reviewed_up_to: None,
        };
        let nr = libc::SYS_socket as u32;
        let v4 = [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        let v6 = [libc::AF_INET6 as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        let unix = [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        assert_eq!(table.verdict(nr, v4), bpf::RET_ALLOW);
        assert_eq!(table.verdict(nr, v6), bpf::RET_EPERM);
        assert_eq!(table.verdict(nr, unix), bpf::RET_EPERM);
    }
}
