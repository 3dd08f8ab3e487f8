//! The launcher's confinement once its sandbox is built: a zygote's relay installs it
//! before it reads one agent line or one byte of a caller's archive, a one-shot launcher
//! as soon as it has let the program start.
//!
//! Until then the launcher is root in the host's namespaces (or the rootless user): it
//! needs that to build the sandbox. What comes after (agent lines, requests' output,
//! workspace archives, pools' scripts) is hostile, so the relay first gives up what it no
//! longer needs:
//!
//! - **Ids.** As root it becomes the sandbox's owner (the host uid that created the
//!   sandbox's user namespace) for its real, effective and saved ids, with no
//!   supplementary groups. It is then root of nothing on the host: no file owned by root is
//!   its own. Owning the sandbox's user namespace is what it still needs over the sandbox:
//!   the kernel gives the namespace's owner every capability *inside* it, which is how the
//!   relay kills the sandbox's init, checks that a registered process is alive, and opens a
//!   request process's namespaces (`scratch::check`), all without a capability over the
//!   host.
//! - **Capabilities.** Only CAP_SETUID and CAP_SETGID stay, effective and permitted, for
//!   `setfsuid`/`setfsgid`: the relay writes a request's directory and a pool's scripts as
//!   the sandbox's own ids (`workspace::ActAs`, `script_space`). The seccomp table allows
//!   those two calls only for the sandbox's id range, and no other call that changes ids,
//!   so the two capabilities cannot reach a host user's files nor root's. The bounding,
//!   inheritable and ambient sets are emptied.
//! - **no_new_privs** and not dumpable (nothing in the sandbox, which shares the owner's
//!   uid, may trace the relay or read its memory).
//! - **Its own seccomp table** ([`allowlist`]): the calls a relay makes, each with why;
//!   every other call is refused with `EPERM`. No `execve`, no new sockets, no mounts, no
//!   namespaces, no tracing; signals only to the sandbox's init and its egress filter.
//!
//! A rootless launcher has no host privilege to give up: it keeps its ids, drops whatever
//! capabilities it holds, and installs the same table (with `setfsuid`/`setfsgid` free,
//! since without CAP_SETUID they can only name its own ids).
//!
//! Landlock is not used here: it refuses a confined process any ptrace-class access to a
//! process outside its own domain, and opening `/proc/<pid>/ns/*` of a request's process
//! is such an access. The relay holds no path to the host it could open for writing as
//! root; the ids above are what keep it off the host's files.

use plumbing::seccomp::{self as bpf, Allowed, Enosys, Table, Threads, When};
use plumbing::{allow, enosys};

/// Who the relay becomes, and whom it may signal.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// As root: the sandbox owner's host uid and gid (the user namespace's owner).
    pub owner: Option<(u32, u32)>,
    /// As root: the host uids and gids the sandbox's files may be written as, inclusive
    /// (`setfsuid`/`setfsgid` are allowed for these alone).
    pub uids: Option<(u32, u32)>,
    pub gids: Option<(u32, u32)>,
    /// The processes the relay may signal: the sandbox's init, and its egress filter.
    pub signals: Vec<libc::pid_t>,
}

/// Why the relay could not confine itself (the zygote then ends: no confinement, no relay).
#[derive(Debug)]
pub struct ConfineError {
    pub step: &'static str,
    pub source: std::io::Error,
}

impl std::fmt::Display for ConfineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "confine the relay: {}: {}", self.step, self.source)
    }
}

fn check(step: &'static str, r: libc::c_int) -> Result<(), ConfineError> {
    if r == 0 {
        Ok(())
    } else {
        Err(ConfineError {
            step,
            source: std::io::Error::last_os_error(),
        })
    }
}

fn caps_error(step: &'static str) -> impl Fn(caps::errors::CapsError) -> ConfineError {
    move |e| ConfineError {
        step,
        source: std::io::Error::other(e.to_string()),
    }
}

/// Give up the host's privileges as [`Confinement`] says, then install the relay's table.
/// The process must be single-threaded (it is: the launcher never starts a thread).
pub fn confine(c: &Confinement) -> Result<(), ConfineError> {
    use caps::{CapSet, Capability};
    // SAFETY: plain id and parent queries.
    let (euid, parent) = unsafe { (libc::geteuid(), libc::getppid()) };
    let keep: caps::CapsHashSet = match (euid, c.owner) {
        (0, Some(_)) => [Capability::CAP_SETUID, Capability::CAP_SETGID]
            .into_iter()
            .collect(),
        (0, None) => {
            return Err(ConfineError {
                step: "choose the ids",
                source: std::io::Error::other("running as root without a sandbox owner"),
            })
        }
        _ => caps::CapsHashSet::new(),
    };
    // The bounding set first: dropping from it takes CAP_SETPCAP, which goes next. (A
    // rootless relay has no CAP_SETPCAP, and nothing to bound: with no_new_privs and no
    // execve in its table, the bounding set never comes into play.)
    let setpcap = caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false);
    for cap in caps::all().into_iter().filter(|_| setpcap) {
        if caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(caps_error("empty the bounding set"))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(caps_error("clear the ambient set"))?;
    caps::clear(None, CapSet::Inheritable).map_err(caps_error("clear the inheritable set"))?;
    if let (0, Some((uid, gid))) = (euid, c.owner) {
        if uid == 0 || gid == 0 {
            return Err(ConfineError {
                step: "choose the ids",
                source: std::io::Error::other("the sandbox owner is id 0"),
            });
        }
        // SAFETY: prctl and id-setting calls with integer arguments; an empty group list
        // needs no buffer.
        unsafe {
            check(
                "keep capabilities across the uid change",
                libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0),
            )?;
            check(
                "drop the supplementary groups",
                libc::setgroups(0, std::ptr::null()),
            )?;
            check("take the owner's gid", libc::setresgid(gid, gid, gid))?;
            check("take the owner's uid", libc::setresuid(uid, uid, uid))?;
            check(
                "stop keeping capabilities",
                libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0),
            )?;
        }
    }
    caps::set(None, CapSet::Effective, &keep).map_err(caps_error("set the effective set"))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(caps_error("set the permitted set"))?;
    // SAFETY: prctl with integer arguments only.
    unsafe {
        // Changing ids cleared the parent-death signal: arm it again, then make sure the
        // monitor did not end in between.
        check(
            "arm the parent-death signal",
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0),
        )?;
        if libc::getppid() != parent {
            return Err(ConfineError {
                step: "arm the parent-death signal",
                source: std::io::Error::other("the monitor has ended"),
            });
        }
        check(
            "make the relay non-dumpable",
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0),
        )?;
        check(
            "set no_new_privs",
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        )?;
    }
    let prog = filter(c).map_err(|e| ConfineError {
        step: "build the seccomp filter",
        source: std::io::Error::other(e.to_string()),
    })?;
    bpf::install(&prog, Threads::Caller).map_err(|e| ConfineError {
        step: "install the seccomp filter",
        source: std::io::Error::other(e.to_string()),
    })
}

/// The relay's BPF program for `c`.
pub fn filter(c: &Confinement) -> Result<Vec<bpf::sock_filter>, bpf::TableError> {
    let allowed = allowlist(c);
    let table = Table {
        allowed: &allowed,
        enosys: ENOSYS,
        reviewed_up_to: None,
    };
    Ok(bpf::build(&table)?.as_slice().to_vec())
}

/// The relay's allowlist: what it does between the agent's start and its own end.
#[rustfmt::skip]
pub fn allowlist(c: &Confinement) -> Vec<Allowed> {
    use libc::*;
    // The values a `When` names must outlive the table; these are made once per relay.
    let signals: &'static [u32] =
        Box::leak(c.signals.iter().map(|&p| p as u32).collect::<Vec<u32>>().into_boxed_slice());
    let ids = |range: Option<(u32, u32)>| match range {
        Some((lo, hi)) => When::Between { arg: 0, lo, hi },
        None => When::Always,
    };
    let pid = std::process::id();
    let mut v = vec![
        // ---- The monitor, the agent, the requests' channels and pipes
        allow!(SYS_read, "frames from the monitor, agent and request lines, output"),
        allow!(SYS_write, "frames to the monitor, lines to the agent and requests, files of a workspace or script"),
        allow!(SYS_writev, "std's vectored writes (log lines)"),
        allow!(SYS_recvmsg, "registrations with their descriptors and credentials; the mounter's answers"),
        allow!(SYS_sendmsg, "namespaces handed to the mounter"),
        allow!(SYS_recvfrom, "reading a socket with recv"),
        allow!(SYS_sendto, "lines to the agent and to a request's process (send)"),
        allow!(SYS_getsockopt, When::OneOf { arg: 1, values: &[SOL_SOCKET as u32] },
               "checking that a registered descriptor is a stream socket; socket-level only"),
        allow!(SYS_shutdown, "ending the mounter's socket"),
        allow!(SYS_splice, "draining output past its cap into /dev/null"),
        allow!(SYS_fcntl, When::OneOf { arg: 1, values: &[F_GETFL as u32, F_SETFL as u32, F_GETFD as u32, F_SETFD as u32, F_DUPFD_CLOEXEC as u32] },
               "non-blocking descriptors; std duplicating a descriptor close-on-exec"),
        allow!(SYS_close, "descriptors of ended requests"),
        allow!(SYS_ppoll, "waiting on the monitor, the agent, the requests and the mounter"),
        // ---- A request's directory and a pool's scripts, by descriptor, as the sandbox's ids
        allow!(SYS_openat, "files and folders of a workspace (below a request's directory), /proc/<pid> of a request's process"),
        allow!(SYS_mkdirat, "a request's directory and a workspace's folders"),
        allow!(SYS_unlinkat, "removing a request's directory and a pool's evicted scripts"),
        allow!(SYS_getdents64, "listing a request's directory to pack or remove it"),
        allow!(SYS_fchmod, "a workspace's files and folders get fixed modes"),
        allow!(SYS_fstat, "checking what a descriptor is"),
        allow!(SYS_newfstatat, "std's metadata of a descriptor"),
        allow!(SYS_statx, "std's metadata of a descriptor"),
        allow!(SYS_fstatfs, "checking that a request's /work is its own tmpfs; a pool's script space"),
        allow!(SYS_lseek, "std's file reads and writes"),
        allow!(SYS_ftruncate, "a workspace file's size"),
        allow!(SYS_setfsuid, ids(c.uids), "writing as the request's or the sandbox's own uid; only the sandbox's ids"),
        allow!(SYS_setfsgid, ids(c.gids), "writing as the request's or the sandbox's own gid; only the sandbox's ids"),
        allow!(SYS_geteuid, "whether a request runs as the relay's own ids"),
        allow!(SYS_getegid, "whether a request runs as the relay's own ids"),
        allow!(SYS_getuid, "std and glibc asking who they are"),
        allow!(SYS_getgid, "std and glibc asking who they are"),
        // ---- The sandbox's processes
        allow!(SYS_pidfd_open, "holding a registered process while its namespaces are checked"),
        allow!(SYS_pidfd_send_signal, When::OneOf { arg: 1, values: &[0] },
               "whether a registered process is still alive (signal 0 only)"),
        allow!(SYS_wait4, "reaping the mounter, the egress filter and init"),
        allow!(SYS_waitid, "reaping a child"),
        // ---- Memory, never executable
        allow!(SYS_mmap, When::MaskClear { arg: 2, mask: PROT_EXEC as u32 }, "buffers; never executable"),
        allow!(SYS_mprotect, When::MaskClear { arg: 2, mask: PROT_EXEC as u32 }, "allocator guard pages; never executable"),
        allow!(SYS_munmap, "freeing buffers"),
        allow!(SYS_mremap, "growing a buffer in place"),
        allow!(SYS_madvise, "the allocator handing memory back"),
        allow!(SYS_brk, "the heap"),
        // ---- Time, randomness, signals, the end
        allow!(SYS_clock_gettime, "deadlines and paces (when the vDSO falls back)"),
        allow!(SYS_clock_nanosleep, "a pause"),
        allow!(SYS_getrandom, "a request directory's random name; HashMap seeds"),
        allow!(SYS_futex, "std's locks (the logger's)"),
        allow!(SYS_sched_yield, "std's locks yielding while they spin"),
        allow!(SYS_rt_sigaction, "abort() restoring SIGABRT's default"),
        allow!(SYS_rt_sigprocmask, "abort() and glibc blocking signals"),
        allow!(SYS_rt_sigreturn, "returning from a signal handler"),
        allow!(SYS_sigaltstack, "std's stack-overflow handler"),
        allow!(SYS_restart_syscall, "the kernel resuming a wait a signal interrupted"),
        allow!(SYS_getpid, "abort() naming its own process to tgkill"),
        allow!(SYS_gettid, "abort() naming its own thread to tgkill"),
        allow!(SYS_tgkill, When::Equals { arg: 0, value: u64::from(pid) },
               "abort() signalling its own thread; never another process"),
        allow!(SYS_exit, "the relay ending"),
        allow!(SYS_exit_group, "the relay ending"),
    ];
    if !signals.is_empty() {
        v.push(allow!(SYS_kill, When::OneOf { arg: 0, values: signals },
                      "killing the sandbox's init or its egress filter; no other process"));
    }
    #[cfg(target_arch = "x86_64")]
    v.extend([
        allow!(SYS_poll, "waiting on the monitor, the agent, the requests and the mounter"),
        allow!(SYS_open, "std on an older path: files below a request's directory"),
    ]);
    v
}

/// The mounter's table (see `scratch`): it lives in the sandbox's user and mount
/// namespaces and only mounts a request's scratch space and writes its secrets, in the
/// request's mount namespace the relay hands it. Installed once it is in the sandbox's
/// namespaces, before it reads its first message.
#[rustfmt::skip]
pub fn mounter_allowlist() -> Vec<Allowed> {
    use libc::*;
    let pid = std::process::id();
    let mut v = vec![
        allow!(SYS_recvmsg, "the relay's messages, with a request's mount namespace"),
        allow!(SYS_sendmsg, "answers, with the root of a request's new /work"),
        allow!(SYS_setns, When::OneOf { arg: 1, values: &[CLONE_NEWNS as u32] },
               "into a request's mount namespace and back; never another kind"),
        allow!(SYS_mount, "a request's /tmp, /work, /dev/shm and /run/secrets; remounting them"),
        allow!(SYS_openat, "the new /work's root; a request's secret files"),
        allow!(SYS_write, "a secret's value"),
        allow!(SYS_fchown, "a secret file belongs to the request's uid"),
        allow!(SYS_close, "descriptors it is done with"),
        allow!(SYS_fcntl, When::OneOf { arg: 1, values: &[F_GETFD as u32] },
               "std checking, in a debug build, that a descriptor it closes is open"),
        allow!(SYS_mmap, When::MaskClear { arg: 2, mask: PROT_EXEC as u32 }, "buffers; never executable"),
        allow!(SYS_munmap, "freeing buffers"),
        allow!(SYS_brk, "the heap"),
        allow!(SYS_rt_sigreturn, "returning from a signal handler"),
        allow!(SYS_restart_syscall, "the kernel resuming a wait a signal interrupted"),
        allow!(SYS_getpid, "abort() naming its own process to tgkill"),
        allow!(SYS_gettid, "abort() naming its own thread to tgkill"),
        allow!(SYS_tgkill, When::Equals { arg: 0, value: u64::from(pid) },
               "abort() signalling its own thread; never another process"),
        allow!(SYS_rt_sigprocmask, "abort()"),
        allow!(SYS_exit, "the mounter ending"),
        allow!(SYS_exit_group, "the mounter ending"),
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(allow!(SYS_open, "the new /work's root; a request's secret files (the older form)"));
    v
}

/// The mounter's confinement: no_new_privs, not dumpable, its table.
pub fn confine_mounter() -> Result<(), ConfineError> {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        check(
            "make the mounter non-dumpable",
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0),
        )?;
        check(
            "set no_new_privs",
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        )?;
    }
    let allowed = mounter_allowlist();
    let table = Table {
        allowed: &allowed,
        enosys: ENOSYS,
        reviewed_up_to: None,
    };
    let prog = bpf::build(&table).map_err(|e| ConfineError {
        step: "build the mounter's seccomp filter",
        source: std::io::Error::other(e.to_string()),
    })?;
    bpf::install(prog.as_slice(), Threads::Caller).map_err(|e| ConfineError {
        step: "install the mounter's seccomp filter",
        source: std::io::Error::other(e.to_string()),
    })
}

#[rustfmt::skip]
static ENOSYS: &[Enosys] = { use libc::*; &[
    enosys!(SYS_clone3, "its flags are in memory, out of seccomp's sight; the relay starts no thread or process anyway"),
]};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn root_confinement() -> Confinement {
        Confinement {
            owner: Some((200_065_536, 200_065_536)),
            uids: Some((200_000_000, 200_065_999)),
            gids: Some((200_000_000, 200_065_999)),
            signals: vec![4242, 4343],
        }
    }

    #[test]
    fn the_table_builds_and_reaches_no_program_socket_mount_or_id() {
        filter(&root_confinement()).unwrap();
        filter(&Confinement::default()).unwrap();
        let list = allowlist(&root_confinement());
        for nr in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_pidfd_getfd,
            libc::SYS_ioctl,
            libc::SYS_setns,
            libc::SYS_unshare,
            libc::SYS_mount,
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_setuid,
            libc::SYS_setresuid,
            libc::SYS_setreuid,
            libc::SYS_setgid,
            libc::SYS_setresgid,
            libc::SYS_setgroups,
            libc::SYS_capset,
            libc::SYS_prctl,
            libc::SYS_clone,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_fchown,
            libc::SYS_fchownat,
            libc::SYS_chmod,
            libc::SYS_fchmodat,
            libc::SYS_io_uring_setup,
            libc::SYS_bpf,
            libc::SYS_keyctl,
        ] {
            assert!(list.iter().all(|a| a.nr != nr), "{nr} is allowed");
        }
    }

    #[test]
    fn the_mounter_may_enter_mount_namespaces_alone() {
        let allowed = mounter_allowlist();
        let table = Table {
            allowed: &allowed,
            enosys: ENOSYS,
            reviewed_up_to: None,
        };
        bpf::build(&table).unwrap();
        let ask = |nr: i64, a: [u64; 6]| table.verdict(nr as u32, a);
        let ns = |flag: i32| [3, flag as u64, 0, 0, 0, 0];
        assert_eq!(ask(libc::SYS_setns, ns(libc::CLONE_NEWNS)), bpf::RET_ALLOW);
        for other in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            0,
        ] {
            assert_eq!(ask(libc::SYS_setns, ns(other)), bpf::RET_EPERM, "{other}");
        }
        for nr in [
            libc::SYS_execve,
            libc::SYS_socket,
            libc::SYS_ptrace,
            libc::SYS_unshare,
            libc::SYS_clone,
            libc::SYS_kill,
            libc::SYS_bpf,
        ] {
            assert!(allowed.iter().all(|a| a.nr != nr), "{nr} is allowed");
        }
    }

    #[test]
    fn ids_and_signals_are_the_sandbox_s_alone() {
        let c = root_confinement();
        let allowed = allowlist(&c);
        let table = Table {
            allowed: &allowed,
            enosys: ENOSYS,
            reviewed_up_to: None,
        };
        let prog = filter(&c).unwrap();
        assert_eq!(table.disagreement(&prog), None);
        let ask = |nr: i64, a0: u64, a1: u64| table.verdict(nr as u32, [a0, a1, 0, 0, 0, 0]);
        for nr in [libc::SYS_setfsuid, libc::SYS_setfsgid] {
            assert_eq!(ask(nr, 200_000_000, 0), bpf::RET_ALLOW);
            assert_eq!(ask(nr, 200_065_999, 0), bpf::RET_ALLOW);
            assert_eq!(ask(nr, 0, 0), bpf::RET_EPERM, "root");
            assert_eq!(ask(nr, 1000, 0), bpf::RET_EPERM, "a host user");
            assert_eq!(ask(nr, 200_066_000, 0), bpf::RET_EPERM, "past the range");
            assert_eq!(ask(nr, u64::from(u32::MAX), 0), bpf::RET_EPERM);
        }
        assert_eq!(ask(libc::SYS_kill, 4242, 9), bpf::RET_ALLOW);
        assert_eq!(ask(libc::SYS_kill, 4343, 9), bpf::RET_ALLOW);
        for pid in [1u64, 0, u64::from(u32::MAX), 4244] {
            assert_eq!(ask(libc::SYS_kill, pid, 9), bpf::RET_EPERM, "kill {pid}");
        }
        assert_eq!(ask(libc::SYS_pidfd_send_signal, 3, 0), bpf::RET_ALLOW);
        assert_eq!(ask(libc::SYS_pidfd_send_signal, 3, 9), bpf::RET_EPERM);
    }

    /// The steps of [`a_confined_relay_is_no_longer_root_and_cannot_exec_or_mount`], run in
    /// a process of their own (this test binary again, asked for this test alone): what the
    /// relay must no longer be able to do once confined. Does nothing unless asked.
    #[test]
    fn confined_child() {
        let Some(dir) = std::env::var_os("ZYGO_RELAY_TEST_DIR") else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let path = std::ffi::CString::new(dir.join("root-owned").to_str().unwrap()).unwrap();
        let tmp = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let c = Confinement {
            owner: Some((200_065_536, 200_065_536)),
            uids: Some((200_000_000, 200_065_536)),
            gids: Some((200_000_000, 200_065_536)),
            signals: vec![],
        };
        confine(&c).unwrap();
        // SAFETY: plain system calls with valid C strings.
        unsafe {
            assert_eq!(
                (libc::geteuid(), libc::getuid()),
                (200_065_536, 200_065_536)
            );
            assert!(
                libc::open(path.as_ptr(), libc::O_WRONLY) < 0,
                "wrote root's file"
            );
            let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
            assert!(
                libc::execv(c"/bin/true".as_ptr(), argv.as_ptr()) < 0,
                "exec"
            );
            let none = std::ptr::null();
            assert!(libc::mount(c"none".as_ptr(), tmp.as_ptr(), c"tmpfs".as_ptr(), 0, none) < 0);
            assert!(
                libc::setresuid(0, 0, 0) < 0 && libc::geteuid() != 0,
                "back to root"
            );
            assert!(
                libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) < 0,
                "a socket"
            );
            assert_eq!(libc::setfsuid(0), -1, "setfsuid(0) is refused by the table");
            assert!(libc::kill(1, 0) < 0, "signalled init of the host");
            // The sandbox's own ids are still there to write as.
            assert_eq!(libc::setfsuid(200_000_001) as u32, 200_065_536);
            assert_eq!(libc::setfsuid(200_000_001) as u32, 200_000_001);
        }
    }

    /// As root: the real confinement of a made-up sandbox, in a process of its own
    /// ([`confined_child`]). Skipped when not root (the ids are root's to change).
    #[test]
    fn a_confined_relay_is_no_longer_root_and_cannot_exec_or_mount() {
        // SAFETY: plain id query.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("zygo-relay-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("root-owned"), b"x").unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "relay::tests::confined_child",
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env("ZYGO_RELAY_TEST_DIR", &dir)
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
    }
}
