//! The seccomp allowlist: the last layer installed, by the sandbox's init on itself right
//! before it starts the program (which inherits it through its exec), in every sandbox.
//!
//! # What it defends against
//!
//! The kernel's attack surface. The other layers (user, mount, pid, net, ipc, uts and cgroup
//! namespaces, an empty capability set, no_new_privs, Landlock, cgroup limits) decide what a
//! program may *touch*; this filter decides which kernel *code* it may reach at all. It
//! refuses:
//!
//! - everything that builds or leaves a sandbox: `mount` and the new mount API, `unshare`
//!   (bar a new mount and IPC namespace, which a zygote's agent makes for each request;
//!   never a user namespace, the one a process without capabilities could make), `setns`,
//!   namespace flags on `clone`, `chroot`, `pivot_root`;
//! - reaching into other processes: `ptrace`, `process_vm_readv/writev`, `kcmp`,
//!   `pidfd_getfd`;
//! - large, bug-prone kernel subsystems ordinary programs never need: `bpf`, `perf_event_open`,
//!   `userfaultfd`, the keyring, `io_uring` (whose operations also bypass seccomp), socket
//!   families other than unix/inet/inet6/netlink (`AF_VSOCK` is not namespaced and reaches
//!   the VM host), `open_by_handle_at`, fanotify, NUMA page placement;
//! - whole-machine controls: modules, kexec, reboot, swap, accounting, quotas, clocks,
//!   host/domain names, `syslog`, `iopl`/`ioperm`;
//! - terminal injection: `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)`;
//! - evicting the shared image from the host's page cache: `fadvise64(POSIX_FADV_DONTNEED)`;
//! - personality flags that weaken the address space (`ADDR_NO_RANDOMIZE`,
//!   `READ_IMPLIES_EXEC`, ...).
//!
//! Anything not listed fails with `EPERM`. A few syscalls fail with `ENOSYS` instead, so
//! that libc and libuv take their fallback paths (`clone3` → `clone`, whose flags we can
//! read; `io_uring` → epoll and a thread pool; unless the plan allows inotify, an inotify
//! instance → polling), as does every syscall number above [`NEWEST_REVIEWED`] (syscalls
//! newer than this review, so fallbacks work on newer kernels, and the x32 ABI). A foreign
//! architecture (i386 via `int 0x80`, arm32 compat) kills the process.
//!
//! # What it does not defend against
//!
//! Bugs in the syscalls it allows (read, mmap, futex, sockets, ... are still a large
//! surface); what a program does with the files, sockets and processes it may legitimately
//! reach (Landlock, the mount namespace and the network namespace decide that); resource
//! exhaustion (cgroups and rlimits); side channels. Arguments passed by pointer cannot be
//! inspected by seccomp at all. `chmod`, `chown`, xattr writes, `set*id` and `kill` are
//! allowed: inside the user and pid namespaces they only reach what the sandbox already owns.
//! (Landlock does not mediate chmod, chown or xattrs; ownership and read-only mounts do.)
//! But no mode a sandbox gives a file may be set-user-id or set-group-id ([`SET_ID`]): in a
//! writable host folder the sandbox writes as the folder's owner.
//!
//! # `seccomp()` itself
//!
//! Allowed. A filter a program installs is evaluated together with this one and the most
//! restrictive verdict wins, so it can only narrow: an `EPERM` here beats an `ALLOW` (or a
//! user-notification `CONTINUE`) there. Browsers and language runtimes sandbox themselves
//! this way.
//!
//! # Reading the table
//!
//! [`SANDBOX`] is the whole policy, a [`Table`] of the plumbing crate's shape (the same as
//! every front's): one line per allowed syscall, with the reason a normal program needs it.
//! The entries that filter an argument say so ([`When`]); the `ENOSYS` answers have a list
//! of their own. `plumbing::seccomp::compile` turns the table into BPF while `zygo` is
//! compiled: after the architecture check, a balanced binary search on the syscall number
//! (about 300 instructions, a dozen or so run per call; see [`sandbox_filter`]). Since
//! Linux 5.11 the kernel caches the verdict of every syscall allowed whatever its
//! arguments, so only the filtered ones (`openat` the most frequent of them, about 0.1 µs
//! each) and refused calls evaluate the program.

use plumbing::seccomp::{
    self as bpf, sock_filter, Allowed, Enosys, InstallError, Program, Table, Threads, When,
};
use plumbing::{allow, enosys};

/// Syscall numbers: libc's, plus the one it lacks on some architecture.
mod sys {
    pub use libc::*;

    /// `fchmodat2` (Linux 6.6) is 452 on every architecture; libc names it only for x86_64.
    #[cfg(target_arch = "aarch64")]
    #[allow(non_upper_case_globals)]
    pub const SYS_fchmodat2: libc::c_long = 452;

    /// `io_pgetevents` (Linux 4.18) is 333 on x86_64 and 292 on aarch64; libc lacks it.
    #[cfg(target_arch = "x86_64")]
    #[allow(non_upper_case_globals)]
    pub const SYS_io_pgetevents: libc::c_long = 333;
    #[cfg(target_arch = "aarch64")]
    #[allow(non_upper_case_globals)]
    pub const SYS_io_pgetevents: libc::c_long = 292;
}

/// `clone` flags that create namespaces. (`CLONE_NEWTIME` shares its bit with the exit
/// signal in `clone`, and is reachable only through `clone3` and `unshare`, both refused.)
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u32;

/// Every `unshare` flag but the two a zygote's agent uses for each request (a mount and an
/// IPC namespace: see `harden::Keep::Agent`). Making either needs CAP_SYS_ADMIN, which only
/// the agent holds; the flags that un-share within the process (files, fs, sysvsem) are
/// refused too, as nothing needs them.
const UNSHARE_REFUSED: u32 = !((libc::CLONE_NEWNS | libc::CLONE_NEWIPC) as u32);

/// The argument value that names the calling process itself (pid 0, or `who` 0). Calls
/// that act on a process by pid are allowed on the caller only: rootless, every process of
/// a zygote (the agent, every request) has one uid, and the kernel lets a uid change the
/// limits, CPUs and priorities of all its processes; `/proc` hiding does not stop a call
/// that names a pid directly.
const SELF: &[u32] = &[0];

/// The set-user-id and set-group-id mode bits, which no file a sandbox makes or changes may
/// have: a writable host folder is written as its owner (root, for a folder of root's), so
/// a set-id program left there would run as that owner for whoever on the host starts it.
/// (The sandbox's own mounts are `nosuid`; the host's mount of the same folder is not.)
/// Refused where the mode is an argument: `open`, `openat`, `creat`, `mknod`, `mknodat`
/// and the `chmod` calls. `openat2` passes it in memory and answers `ENOSYS`; `mkdir`
/// drops these bits itself.
const SET_ID: u32 = libc::S_ISUID | libc::S_ISGID;

/// Terminal ioctls that inject input into, or reconfigure, a terminal the sandbox may share.
const TERMINAL_INJECTION: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// `fadvise64` advice that drops clean pages from the page cache, wherever they came from:
/// on the read-only image (shared by every sandbox and the host) it would let one sandbox
/// evict what everyone else reads, making their next start and imports read the disk. It
/// is only a hint, and callers carry on when it fails.
const CACHE_EVICTION: &[u32] = &[libc::POSIX_FADV_DONTNEED as u32];

/// `personality` values that change nothing dangerous: PER_LINUX, PER_LINUX32, UNAME26,
/// UNAME26|PER_LINUX32, and 0xffffffff, which only queries.
const SAFE_PERSONALITIES: &[u32] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Socket families ordinary programs use. The others are either privileged (packet), not
/// namespaced (vsock), or rarely used kernel code with a history of bugs (alg, tipc, rds, ...).
const SOCKET_FAMILIES: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
    libc::AF_NETLINK as u32, // getaddrinfo, getifaddrs, `ip`
];

/// The allowlist. Lines marked `#[cfg(target_arch = "x86_64")]` are legacy forms aarch64
/// never had (it has only the `*at` and other modern calls). (`use sys::*`: the entries
/// name each syscall by its bare constant, which `allow!` also turns into its name.)
#[rustfmt::skip]
static ALLOWLIST: &[Allowed] = { use sys::*; &[
    // ---- Processes and threads
    allow!(SYS_execve, "start programs: shells, subprocess, a request's command"),
    allow!(SYS_execveat, "start a program by descriptor (fexecve, launchers that open first)"),
    allow!(SYS_exit, "end a thread (every threaded runtime)"),
    allow!(SYS_exit_group, "end the process (exit, _exit, main returning)"),
    allow!(SYS_clone, When::MaskClear { arg: 0, mask: NAMESPACE_FLAGS },
           "threads, fork, posix_spawn; never with namespace-creating flags"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_fork, "fork, where a libc or runtime calls it directly rather than through clone"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_vfork, "vfork and posix_spawn, where a libc calls vfork directly"),
    allow!(SYS_wait4, "reap children and read their status (shells, waitpid, subprocess)"),
    allow!(SYS_waitid, "reap children by id or pidfd (Python's subprocess, supervisors)"),
    allow!(SYS_set_tid_address, "thread and process start-up in libc"),
    allow!(SYS_set_robust_list, "thread start-up: glibc registers each thread's robust mutexes"),
    allow!(SYS_rseq, "restartable sequences, registered by glibc at start-up"),
    allow!(SYS_prctl, "thread names, PDEATHSIG, dumpable; privileged options need capabilities"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_arch_prctl, "set the TLS register at start-up"),
    allow!(SYS_personality, When::OneOf { arg: 0, values: SAFE_PERSONALITIES },
           "query, linux32, uname26 (setarch); not ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC"),
    allow!(SYS_seccomp, "a program may add its own filter; filters only narrow"),
    allow!(SYS_landlock_create_ruleset, "a program may restrict itself further"),
    allow!(SYS_landlock_add_rule, "a program may restrict itself further"),
    allow!(SYS_landlock_restrict_self, "a program may restrict itself further"),
    allow!(SYS_unshare, When::MaskClear { arg: 0, mask: UNSHARE_REFUSED },
           "a zygote's agent gives each request a mount and an IPC namespace (needs the agent's CAP_SYS_ADMIN); no other flag"),
    allow!(SYS_capget, "read capability sets (libcap, runtimes' checks)"),
    allow!(SYS_capset, "drop capabilities; all are already dropped, none can be regained"),
    allow!(SYS_restart_syscall, "the kernel restarting a call interrupted by a signal"),

    // ---- Identity, sessions, process groups (inside the user and pid namespaces)
    allow!(SYS_getpid, "own pid: pid files, temporary names, runtimes' fork checks"),
    allow!(SYS_getppid, "parent pid: orphan checks, shells' $PPID"),
    allow!(SYS_gettid, "thread id: raise(), thread-aware logging, runtimes' thread registries"),
    allow!(SYS_getuid, "own user ids: a program looking up its home directory, permission decisions"),
    allow!(SYS_geteuid, "own user ids: a program looking up its home directory, permission decisions"),
    allow!(SYS_getresuid, "own user ids: a program looking up its home directory, permission decisions"),
    allow!(SYS_getgid, "own group ids: permission decisions, id(1)"),
    allow!(SYS_getegid, "own group ids: permission decisions, id(1)"),
    allow!(SYS_getresgid, "own group ids: permission decisions, id(1)"),
    allow!(SYS_getgroups, "supplementary groups: permission decisions, id(1)"),
    allow!(SYS_setuid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setgid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setreuid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setregid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setresuid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setresgid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setfsuid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setfsgid, "drop or switch ids (su, setpriv, daemons), only within the namespace's id map"),
    allow!(SYS_setgroups, "drop supplementary groups (su, setpriv)"),
    allow!(SYS_getpgid, "job control in shells"),
    allow!(SYS_setpgid, "job control in shells"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_getpgrp, "job control in shells"),
    allow!(SYS_getsid, "which session a process belongs to (shells, ps, daemons)"),
    allow!(SYS_setsid, "start a new session: daemons, subprocess(start_new_session)"),

    // ---- Signals
    allow!(SYS_rt_sigaction, "install signal handlers (SIGINT, SIGCHLD, runtimes' fault handlers)"),
    allow!(SYS_rt_sigprocmask, "block signals around critical sections (libc, threads, shells)"),
    allow!(SYS_rt_sigreturn, "return from a signal handler (every handler ends with it)"),
    allow!(SYS_rt_sigpending, "check for blocked pending signals (shells, signal-safe waits)"),
    allow!(SYS_rt_sigtimedwait, "wait for a signal synchronously (sigwait: runtimes' signal threads, shells)"),
    allow!(SYS_rt_sigsuspend, "wait for a signal with a mask (sigsuspend: shells waiting for children)"),
    allow!(SYS_rt_sigqueueinfo, "queue a signal with data to a process (sigqueue)"),
    allow!(SYS_rt_tgsigqueueinfo, "queue a signal with data to a thread (pthread_sigqueue)"),
    allow!(SYS_sigaltstack, "alternate signal stacks (stack-overflow handlers)"),
    allow!(SYS_kill, "signal a process; the pid namespace bounds who"),
    allow!(SYS_tkill, "signal a thread, as older threading code asks for it"),
    allow!(SYS_tgkill, "signal a thread (raise, abort)"),
    allow!(SYS_pidfd_open, "race-free child handling (systemd, Python 3.9+)"),
    allow!(SYS_pidfd_send_signal, "signal a child without pid-reuse races (Python, systemd)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_signalfd, "receive signals as a descriptor in an event loop"),
    allow!(SYS_signalfd4, "signals as a descriptor (libuv, systemd)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_pause, "wait for a signal (pause(), older sleep implementations)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_alarm, "SIGALRM timeouts (alarm(), shell scripts' timeout helpers)"),
    allow!(SYS_getitimer, "interval timers: profilers and SIGALRM timeouts (signal.setitimer)"),
    allow!(SYS_setitimer, "interval timers: profilers and SIGALRM timeouts (signal.setitimer)"),

    // ---- Scheduling, limits, system information
    allow!(SYS_sched_yield, "yield the CPU in spin-then-wait locks (runtimes, databases)"),
    allow!(SYS_sched_getaffinity, "count usable CPUs (nproc, os.cpu_count, V8)"),
    allow!(SYS_sched_setaffinity, When::OneOf { arg: 0, values: SELF },
           "pin this process to CPUs; never another's (a neighbour of one uid could pin a request to a CPU)"),
    allow!(SYS_sched_getparam, "read scheduling parameters (runtimes, chrt)"),
    allow!(SYS_sched_setparam, When::OneOf { arg: 0, values: SELF },
           "this process's scheduling parameters; realtime needs rlimits/caps"),
    allow!(SYS_sched_getscheduler, "read the scheduling policy (runtimes, chrt)"),
    allow!(SYS_sched_setscheduler, When::OneOf { arg: 0, values: SELF },
           "this process's scheduling policy (e.g. SCHED_IDLE for batch work)"),
    allow!(SYS_sched_getattr, "read scheduling attributes (runtimes, chrt)"),
    allow!(SYS_sched_setattr, When::OneOf { arg: 0, values: SELF },
           "this process's scheduling attributes (chrt, runtimes lowering their own priority)"),
    allow!(SYS_sched_get_priority_max, "the valid priority range of a policy (pthread attributes, chrt)"),
    allow!(SYS_sched_get_priority_min, "the valid priority range of a policy (pthread attributes, chrt)"),
    allow!(SYS_sched_rr_get_interval, "the round-robin time slice (POSIX conformance, chrt)"),
    allow!(SYS_getpriority, "read nice values (nice, ps, runtimes)"),
    allow!(SYS_setpriority, When::OneOf { arg: 1, values: SELF },
           "own nice value (who = 0); raising priority needs CAP_SYS_NICE"),
    allow!(SYS_ioprio_get, "read an I/O priority (ionice)"),
    allow!(SYS_ioprio_set, When::OneOf { arg: 1, values: SELF },
           "own I/O priority (ionice, who = 0)"),
    allow!(SYS_getrlimit, "read resource limits (ulimit, runtimes sizing stacks and descriptor tables)"),
    allow!(SYS_setrlimit, "lower own resource limits (ulimit); raising hard limits needs CAP_SYS_RESOURCE"),
    allow!(SYS_prlimit64, When::OneOf { arg: 0, values: SELF },
           "this process's resource limits (glibc's getrlimit/setrlimit pass pid 0); never another's, which a neighbour of one uid could shrink"),
    allow!(SYS_getrusage, "own CPU and memory usage (time(1), Python's resource module, benchmarks)"),
    allow!(SYS_times, "own CPU times (times(), clock(), shells' `times`)"),
    allow!(SYS_sysinfo, "memory and uptime (free, Node's os module)"),
    allow!(SYS_uname, "kernel name and version (uname, runtimes' and installers' feature checks)"),
    allow!(SYS_getcpu, "the CPU a thread runs on (sched_getcpu: per-CPU caches in allocators)"),
    allow!(SYS_getrandom, "random bytes: hash seeds, keys, UUIDs (os.urandom, crypto libraries)"),

    // ---- Time
    allow!(SYS_clock_gettime, "read clocks (when the vDSO falls back)"),
    allow!(SYS_clock_getres, "clock resolution (time.get_clock_info, timer set-up)"),
    allow!(SYS_clock_nanosleep, "sleep (sleep(1), time.sleep, timers)"),
    allow!(SYS_nanosleep, "sleep, as older code asks for it (nanosleep, usleep)"),
    allow!(SYS_gettimeofday, "wall-clock time, as older code asks for it (when the vDSO falls back)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_time, "wall-clock seconds, as time() asks on x86_64 (when the vDSO falls back)"),
    allow!(SYS_timer_create, "POSIX per-process timers (profilers, runtimes' timeouts)"),
    allow!(SYS_timer_settime, "arm a POSIX timer (see timer_create)"),
    allow!(SYS_timer_gettime, "read a POSIX timer (see timer_create)"),
    allow!(SYS_timer_getoverrun, "count a POSIX timer's missed expiries (see timer_create)"),
    allow!(SYS_timer_delete, "delete a POSIX timer (see timer_create)"),
    allow!(SYS_timerfd_create, "timers as descriptors (event loops)"),
    allow!(SYS_timerfd_settime, "arm a timer descriptor (event loops' timeouts)"),
    allow!(SYS_timerfd_gettime, "read a timer descriptor (event loops' timeouts)"),

    // ---- Memory
    allow!(SYS_brk, "the heap, for malloc"),
    allow!(SYS_mmap, "memory for allocators and thread stacks, shared libraries, mapped files"),
    allow!(SYS_munmap, "free mappings (allocators, unloading libraries)"),
    allow!(SYS_mprotect, "page protections (loader, JITs)"),
    allow!(SYS_mremap, "grow large allocations in place (realloc)"),
    allow!(SYS_madvise, "memory hints (allocators, GCs)"),
    allow!(SYS_msync, "write a mapped file's changes back (databases, mmap-based I/O)"),
    allow!(SYS_mincore, "which pages are in memory (databases, page-cache-aware tools)"),
    allow!(SYS_mlock, "keep secrets out of swap (gpg, password managers), bounded by RLIMIT_MEMLOCK"),
    allow!(SYS_mlock2, "keep secrets out of swap (gpg, password managers), bounded by RLIMIT_MEMLOCK"),
    allow!(SYS_munlock, "release memory locked before (see mlock)"),
    allow!(SYS_mlockall, "keep a whole process out of swap (latency-sensitive servers), bounded by RLIMIT_MEMLOCK"),
    allow!(SYS_munlockall, "release memory locked before (see mlockall)"),
    allow!(SYS_membarrier, "process-wide barriers (JITs, liburcu, .NET)"),
    allow!(SYS_memfd_create, "anonymous files (JITs, shared memory)"),
    allow!(SYS_pkey_alloc, "memory protection keys (V8, OpenJDK)"),
    allow!(SYS_pkey_free, "free a memory protection key (see pkey_alloc)"),
    allow!(SYS_pkey_mprotect, "protect pages with a key (V8, OpenJDK; see pkey_alloc)"),
    allow!(SYS_get_mempolicy, "read NUMA policy (libnuma, JVMs probe it)"),
    allow!(SYS_mseal, "seal own mappings; only narrows"),

    // ---- Descriptors and file I/O
    allow!(SYS_read, "read files, pipes, sockets and terminals (every program)"),
    allow!(SYS_write, "write files, pipes, sockets and terminals (every program)"),
    allow!(SYS_readv, "read into several buffers at once (stdio, runtimes' buffered I/O)"),
    allow!(SYS_writev, "write several buffers at once (stdio, servers, loggers)"),
    allow!(SYS_pread64, "read at an offset without seeking (databases, loaders, zip readers)"),
    allow!(SYS_pwrite64, "write at an offset without seeking (databases, package managers)"),
    allow!(SYS_preadv, "vectored read at an offset (databases, runtimes' file APIs)"),
    allow!(SYS_pwritev, "vectored write at an offset (databases, runtimes' file APIs)"),
    allow!(SYS_preadv2, "vectored read at an offset with flags (os.preadv, RWF_NOWAIT)"),
    allow!(SYS_pwritev2, "vectored write at an offset with flags (os.pwritev, RWF_APPEND)"),
    allow!(SYS_lseek, "move a file's offset (stdio, archives, databases)"),
    allow!(SYS_close, "release a descriptor (every program)"),
    allow!(SYS_close_range, "close descriptors before exec"),
    allow!(SYS_dup, "duplicate a descriptor (shells' redirections, subprocess)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_dup2, "duplicate onto a chosen number (shells' redirections, subprocess)"),
    allow!(SYS_dup3, "duplicate onto a chosen number (shells' redirections, subprocess)"),
    allow!(SYS_fcntl, "descriptor flags and record locks"),
    allow!(SYS_flock, "whole-file locks (pip, package managers, databases)"),
    allow!(SYS_ioctl, When::NoneOf { arg: 1, values: TERMINAL_INJECTION },
           "terminals, FIONREAD, FIOCLEX...; not TIOCSTI/TIOCLINUX (terminal injection)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_open, When::MaskClear { arg: 2, mask: SET_ID },
           "open files and directories, as older code asks for it; Landlock and the mounts decide which; no set-id mode"),
    allow!(SYS_openat, When::MaskClear { arg: 3, mask: SET_ID },
           "open files and directories (every program); Landlock and the mounts decide which; no set-id mode"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_creat, When::MaskClear { arg: 1, mask: SET_ID },
           "create a file, as older code asks for it; no set-id mode"),
    allow!(SYS_truncate, "set a file's size (editors, databases, log rotation)"),
    allow!(SYS_ftruncate, "set a file's size (editors, databases, shared memory objects)"),
    allow!(SYS_fallocate, "reserve file space ahead (databases, downloaders, cp)"),
    allow!(SYS_fadvise64, When::NoneOf { arg: 3, values: CACHE_EVICTION },
           "tell the kernel how a file will be read (cp, databases, sort); not DONTNEED, which drops the shared image's pages from the host's page cache"),
    allow!(SYS_readahead, "prefetch file data (loaders, databases)"),
    allow!(SYS_fsync, "make a file durable (editors, databases, package managers)"),
    allow!(SYS_fdatasync, "make a file's data durable (databases, SQLite)"),
    allow!(SYS_sync_file_range, "flush part of a file (databases writing back in the background)"),
    allow!(SYS_syncfs, "flush a filesystem (dpkg, databases)"),
    allow!(SYS_sync, "flush everything (sync(1)); costs I/O, grants nothing"),
    allow!(SYS_copy_file_range, "in-kernel copy (cp, shutil)"),
    allow!(SYS_sendfile, "in-kernel copy (cp, servers)"),
    allow!(SYS_splice, "move data between a pipe and a descriptor without copying (cat, servers)"),
    allow!(SYS_tee, "duplicate pipe data without copying (tee-like tools)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_pipe, "pipes between processes (shells, subprocess) and event loops' wakeups"),
    allow!(SYS_pipe2, "pipes between processes (shells, subprocess) and event loops' wakeups"),

    // ---- Paths, directories, metadata
    #[cfg(target_arch = "x86_64")] allow!(SYS_stat, "file metadata: size, type, mode, times, as older code asks for it"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_lstat, "a symlink's own metadata (ls -l, find, tar)"),
    allow!(SYS_fstat, "metadata of an open file (stdio buffers, runtimes)"),
    allow!(SYS_newfstatat, "file metadata: size, type, mode, times (every program)"),
    allow!(SYS_statx, "file status (coreutils, Node, Rust std)"),
    allow!(SYS_statfs, "free space and filesystem type (df, runtimes checking for tmpfs)"),
    allow!(SYS_fstatfs, "free space and filesystem type of an open file (df, runtimes)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_access, "check access to a path (shells' test, PATH lookups), as older code asks for it"),
    allow!(SYS_faccessat, "check access to a path (shells' test, PATH lookups)"),
    allow!(SYS_faccessat2, "check access to a path with flags (AT_EACCESS in newer libcs)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_readlink, "resolve symlinks (realpath, /proc/self/exe, ls -l), as older code asks for it"),
    allow!(SYS_readlinkat, "resolve symlinks (realpath, /proc/self/exe, ls -l)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_getdents, "list a directory, as older code asks for it"),
    allow!(SYS_getdents64, "list a directory (ls, find, os.listdir, globbing)"),
    allow!(SYS_getcwd, "the working directory (pwd, relative paths, runtimes at start-up)"),
    allow!(SYS_chdir, "change the working directory (cd, subprocess's cwd, find)"),
    allow!(SYS_fchdir, "change the working directory to an open one (find, fts, shells)"),
    allow!(SYS_umask, "the file creation mask (shells, daemons, tempfile)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_mkdir, "make directories, as older code asks for it"),
    allow!(SYS_mkdirat, "make directories (mkdir, pip, caches)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_rmdir, "remove empty directories, as older code asks for it"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_unlink, "remove files, as older code asks for it"),
    allow!(SYS_unlinkat, "remove files and directories (rm, temporary files)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_rename, "rename and atomically replace files, as older code asks for it"),
    allow!(SYS_renameat, "rename and atomically replace files (editors, pip, databases)"),
    allow!(SYS_renameat2, "rename with flags: no-replace, atomic exchange (mv, newer libcs)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_link, "hard links, as older code asks for it"),
    allow!(SYS_linkat, "hard links (cp -l, git, package managers)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_symlink, "symbolic links, as older code asks for it"),
    allow!(SYS_symlinkat, "symbolic links (ln -s, virtualenvs, npm)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_mknod, When::MaskClear { arg: 1, mask: SET_ID },
           "FIFOs and sockets; device nodes need CAP_MKNOD; no set-id mode"),
    allow!(SYS_mknodat, When::MaskClear { arg: 2, mask: SET_ID },
           "FIFOs and sockets (mkfifo); device nodes need CAP_MKNOD; no set-id mode"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_chmod, When::MaskClear { arg: 1, mask: SET_ID },
           "file modes, as older code asks for it; not set-id"),
    allow!(SYS_fchmod, When::MaskClear { arg: 1, mask: SET_ID },
           "file modes of an open file (tempfile, cp -p, tar); not set-id"),
    allow!(SYS_fchmodat, When::MaskClear { arg: 2, mask: SET_ID },
           "file modes (chmod, making a script executable, tar); not set-id"),
    allow!(SYS_fchmodat2, When::MaskClear { arg: 2, mask: SET_ID },
           "file mode with flags (lchmod in newer libcs); not set-id"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_chown, "file owner, within the namespace's id map"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_lchown, "file owner, within the namespace's id map"),
    allow!(SYS_fchown, "file owner, within the namespace's id map"),
    allow!(SYS_fchownat, "file owner, within the namespace's id map"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_utime, "file times, as older code asks for it"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_utimes, "file times, as older code asks for it"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_futimesat, "file times, as older code asks for it"),
    allow!(SYS_utimensat, "file times (touch, tar, cp -p)"),
    allow!(SYS_getxattr, "read extended attributes (ls, cp, tar)"),
    allow!(SYS_lgetxattr, "read a symlink's extended attributes (cp -a, tar --xattrs)"),
    allow!(SYS_fgetxattr, "read an open file's extended attributes (cp -a, ACL checks)"),
    allow!(SYS_listxattr, "list extended attributes (cp -a, tar --xattrs, rsync)"),
    allow!(SYS_llistxattr, "list a symlink's extended attributes (cp -a, rsync)"),
    allow!(SYS_flistxattr, "list an open file's extended attributes (cp -a, rsync)"),
    allow!(SYS_setxattr, "write xattrs and POSIX ACLs (cp -a sets system.posix_acl_access)"),
    allow!(SYS_lsetxattr, "write xattrs and ACLs; like chmod, bounded by ownership"),
    allow!(SYS_fsetxattr, "write xattrs and ACLs; like chmod, bounded by ownership"),
    allow!(SYS_removexattr, "remove xattrs and ACLs (setfacl -b); bounded by ownership"),
    allow!(SYS_lremovexattr, "remove a symlink's xattrs; bounded by ownership"),
    allow!(SYS_fremovexattr, "remove an open file's xattrs and ACLs; bounded by ownership"),

    // ---- Waiting for events
    #[cfg(target_arch = "x86_64")] allow!(SYS_poll, "wait until descriptors are ready, as older code asks for it"),
    allow!(SYS_ppoll, "wait until descriptors are ready (servers, shells, subprocess pipes)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_select, "wait until descriptors are ready, as older code asks for it"),
    allow!(SYS_pselect6, "wait until descriptors are ready (select, shells' read -t)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_epoll_create, "event loops, as older code asks for it"),
    allow!(SYS_epoll_create1, "event loops (libuv, asyncio, servers)"),
    allow!(SYS_epoll_ctl, "register descriptors with an event loop (libuv, asyncio, servers)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_epoll_wait, "wait in an event loop, as older code asks for it"),
    allow!(SYS_epoll_pwait, "wait in an event loop (libuv, asyncio, servers)"),
    allow!(SYS_epoll_pwait2, "event loops with a precise timeout"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_eventfd, "wake an event loop from another thread, as older code asks for it"),
    allow!(SYS_eventfd2, "event counters (event loops, wakeups)"),
    #[cfg(target_arch = "x86_64")] allow!(SYS_inotify_init, "watch files for changes, as older code asks for it (ENOSYS unless the plan allows inotify)"),
    allow!(SYS_inotify_init1, "file change notification (watchers, tail -f)"),
    allow!(SYS_inotify_add_watch, "watch a file for changes (file watchers, tail -f)"),
    allow!(SYS_inotify_rm_watch, "stop watching a file (file watchers, tail -f)"),
    allow!(SYS_futex, "locks, condition variables and thread joins (every threaded program)"),
    allow!(SYS_futex_waitv, "wait on several futexes (Wine, game runtimes)"),

    // ---- Sockets (the sandbox has its own network namespace)
    allow!(SYS_socket, When::OneOf { arg: 0, values: SOCKET_FAMILIES },
           "unix, inet, inet6 and netlink sockets"),
    allow!(SYS_socketpair, When::OneOf { arg: 0, values: SOCKET_FAMILIES },
           "connected socket pairs (unix)"),
    allow!(SYS_bind, "bind a socket to an address (servers, unix sockets)"),
    allow!(SYS_listen, "accept connections (servers, test fixtures)"),
    allow!(SYS_accept, "take a connection (servers)"),
    allow!(SYS_accept4, "take a connection with flags (servers)"),
    allow!(SYS_connect, "connect a socket (clients, DNS, servers inside the sandbox)"),
    allow!(SYS_shutdown, "end one direction of a connection (HTTP clients, socket pipes)"),
    allow!(SYS_getsockname, "a socket's own address (servers on port 0, resolvers)"),
    allow!(SYS_getpeername, "a connection's peer address (servers, logging)"),
    allow!(SYS_getsockopt, "read socket options and errors (non-blocking connect, buffer sizes)"),
    allow!(SYS_setsockopt, "set socket options (address reuse, timeouts, TCP_NODELAY)"),
    allow!(SYS_sendto, "send on a socket (send, datagrams, DNS queries)"),
    allow!(SYS_recvfrom, "receive on a socket (recv, datagrams, DNS answers)"),
    allow!(SYS_sendmsg, "send with control data: descriptors, credentials (multiprocessing, systemd)"),
    allow!(SYS_recvmsg, "receive with control data: descriptors, credentials (multiprocessing, systemd)"),
    allow!(SYS_sendmmsg, "sockets, batched (DNS resolvers)"),
    allow!(SYS_recvmmsg, "receive several datagrams at once (resolvers, QUIC)"),

    // ---- System V and POSIX IPC (the IPC namespace is private)
    allow!(SYS_shmget, "shared memory (PostgreSQL, X clients)"),
    allow!(SYS_shmat, "attach a shared memory segment (see shmget)"),
    allow!(SYS_shmdt, "detach a shared memory segment (see shmget)"),
    allow!(SYS_shmctl, "control and remove a shared memory segment (see shmget)"),
    allow!(SYS_semget, "System V semaphores (PostgreSQL, older C programs)"),
    allow!(SYS_semop, "operate on System V semaphores (see semget)"),
    allow!(SYS_semtimedop, "operate on System V semaphores with a timeout (see semget)"),
    allow!(SYS_semctl, "control and remove System V semaphores (see semget)"),
    allow!(SYS_msgget, "System V message queues (older C programs' IPC)"),
    allow!(SYS_msgsnd, "send to a System V message queue (see msgget)"),
    allow!(SYS_msgrcv, "receive from a System V message queue (see msgget)"),
    allow!(SYS_msgctl, "control and remove a System V message queue (see msgget)"),
    allow!(SYS_mq_open, "POSIX message queues between processes of the sandbox"),
    allow!(SYS_mq_unlink, "remove a POSIX message queue (see mq_open)"),
    allow!(SYS_mq_timedsend, "send to a POSIX message queue (see mq_open)"),
    allow!(SYS_mq_timedreceive, "receive from a POSIX message queue (see mq_open)"),
    allow!(SYS_mq_notify, "be told of a message on a POSIX message queue (see mq_open)"),
    allow!(SYS_mq_getsetattr, "read or set a POSIX message queue's flags (see mq_open)"),
]};

/// Syscalls answered with `ENOSYS`, so that callers fall back to something we can filter.
#[rustfmt::skip]
static ENOSYS_LIST: &[Enosys] = { use sys::*; &[
    enosys!(SYS_clone3, "flags are passed in memory, out of seccomp's sight; glibc falls back to clone"),
    enosys!(SYS_openat2, "its mode is passed in memory, out of seccomp's sight (see SET_ID); callers fall back to openat"),
    enosys!(SYS_io_uring_setup, "io_uring's operations bypass seccomp; libuv falls back to epoll and threads"),
    enosys!(SYS_io_uring_enter, "io_uring's other half: with io_uring_setup refused there is no ring, and probes fall back the same way"),
    enosys!(SYS_io_uring_register, "io_uring's other half: with io_uring_setup refused there is no ring, and probes fall back the same way"),
    enosys!(SYS_io_setup, "Linux AIO contexts come from one host-wide budget (fs.aio-max-nr) a sandbox could exhaust; libaio users fall back to threads"),
    enosys!(SYS_io_destroy, "Linux AIO's other calls answer like io_setup, so libaio's callers fall back the same way"),
    enosys!(SYS_io_submit, "Linux AIO's other calls answer like io_setup, so libaio's callers fall back the same way"),
    enosys!(SYS_io_cancel, "Linux AIO's other calls answer like io_setup, so libaio's callers fall back the same way"),
    enosys!(SYS_io_getevents, "Linux AIO's other calls answer like io_setup, so libaio's callers fall back the same way"),
    enosys!(SYS_io_pgetevents, "Linux AIO's other calls answer like io_setup, so libaio's callers fall back the same way"),
]};

/// The highest syscall number this table was reviewed against (`mseal`, 462, Linux 6.10).
/// Higher numbers — syscalls added since (`setxattrat`, `open_tree_attr`, `file_getattr`, ...
/// on 6.18), and on x86_64 the whole x32 ABI (bit 30 set) — get `ENOSYS`, so that libc falls
/// back as it would on an older kernel. Raise this after reviewing the syscalls in between.
pub const NEWEST_REVIEWED: i64 = sys::SYS_mseal;

/// The sandbox's whole seccomp policy, as data: for review, for tests, and compiled into
/// [`sandbox_filter`] for a plan that allows inotify.
pub const SANDBOX: Table<'static> = Table {
    allowed: ALLOWLIST,
    enosys: ENOSYS_LIST,
    reviewed_up_to: Some(NEWEST_REVIEWED),
};

/// The syscalls that make an inotify instance (aarch64 never had `inotify_init`).
#[cfg(target_arch = "x86_64")]
const INOTIFY_INSTANCE: &[i64] = &[sys::SYS_inotify_init, sys::SYS_inotify_init1];
#[cfg(not(target_arch = "x86_64"))]
const INOTIFY_INSTANCE: &[i64] = &[sys::SYS_inotify_init1];

/// Unless the plan allows inotify, making an inotify instance fails with `ENOSYS`, as on a
/// kernel built without it, so programs take their polling fallback (`tail -f`, file
/// watchers). A watch on a file of the read-only image, which the host and every other
/// sandbox share, would see each time anyone opens or reads it. Without an instance,
/// `inotify_add_watch` has nothing to add to.
#[rustfmt::skip]
static INOTIFY_ENOSYS: &[Enosys] = { use sys::*; &[
    #[cfg(target_arch = "x86_64")]
    enosys!(SYS_inotify_init, "a watch on the shared read-only image would see every open and read of it by anyone; programs fall back to polling"),
    enosys!(SYS_inotify_init1, "a watch on the shared read-only image would see every open and read of it by anyone; programs fall back to polling"),
]};

/// [`ALLOWLIST`] without the calls that make an inotify instance.
static ALLOWED_NO_INOTIFY: [Allowed; ALLOWLIST.len() - INOTIFY_INSTANCE.len()] =
    without(ALLOWLIST, INOTIFY_INSTANCE);

/// [`ENOSYS_LIST`] and [`INOTIFY_ENOSYS`].
static ENOSYS_NO_INOTIFY: [Enosys; ENOSYS_LIST.len() + INOTIFY_ENOSYS.len()] =
    joined(ENOSYS_LIST, INOTIFY_ENOSYS);

/// [`SANDBOX`] for a plan that does not allow inotify (the default): the same table, but
/// for the calls that make an inotify instance, which answer `ENOSYS` (`INOTIFY_ENOSYS`).
pub const SANDBOX_NO_INOTIFY: Table<'static> = Table {
    allowed: &ALLOWED_NO_INOTIFY,
    enosys: &ENOSYS_NO_INOTIFY,
    reviewed_up_to: Some(NEWEST_REVIEWED),
};

/// `list` without the entries for the syscalls `nrs`; `N` is how many are left.
const fn without<const N: usize>(list: &[Allowed], nrs: &[i64]) -> [Allowed; N] {
    let mut out = [list[0]; N];
    let (mut i, mut n) = (0, 0);
    while i < list.len() {
        let mut dropped = false;
        let mut j = 0;
        while j < nrs.len() {
            dropped |= list[i].nr == nrs[j];
            j += 1;
        }
        if !dropped {
            out[n] = list[i];
            n += 1;
        }
        i += 1;
    }
    assert!(n == N, "every syscall to drop is in the list once");
    out
}

/// `a` then `b`; `N` is their total length.
const fn joined<const N: usize>(a: &[Enosys], b: &[Enosys]) -> [Enosys; N] {
    assert!(a.len() + b.len() == N, "N is the total length");
    let mut out = [a[0]; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < a.len() { a[i] } else { b[i - a.len()] };
        i += 1;
    }
    out
}

/// The sandbox's programs, compiled with `zygo` (`plumbing::seccomp::compile` describes the
/// code). Every syscall number runs 4 instructions of architecture check and 6 or 7
/// comparisons (log2 of the number of runs of numbers with the same answer) before its
/// `ret` or argument check: at most 12 instructions, or 17 through `personality`'s check,
/// where the linear scan `seccompiler` generated (1474 instructions) ran up to 581. The
/// kernel also walks the program once per syscall number at install, to find the calls it
/// may allow without running it, so a shorter walk is also a cheaper install (0.61 ms to
/// 0.06 ms on x86_64, see the `seccomp_timing` test).
///
/// A table that names a syscall twice, an argument check the compiler cannot express or a
/// program over `BPF_MAXINSNS` instructions fails the build. Building them while compiling
/// spares every launcher the work (~55 µs, most of it first touches of cold code and data),
/// and the sandbox's init, a clone of the launcher, finds them in its own memory.
const BUILT: Program = bpf::compile(&SANDBOX);
const BUILT_NO_INOTIFY: Program = bpf::compile(&SANDBOX_NO_INOTIFY);

static FILTER: [sock_filter; BUILT.len()] = BUILT.to_array();
static FILTER_NO_INOTIFY: [sock_filter; BUILT_NO_INOTIFY.len()] = BUILT_NO_INOTIFY.to_array();

/// The sandbox's seccomp filter: [`SANDBOX`] compiled, or [`SANDBOX_NO_INOTIFY`] unless
/// `inotify` (see [`BUILT`]).
pub fn sandbox_filter(inotify: bool) -> &'static [sock_filter] {
    if inotify {
        &FILTER
    } else {
        &FILTER_NO_INOTIFY
    }
}

/// Install `prog` on the calling thread (and so on everything it execs).
///
/// Call it last, with no_new_privs already set: the calling process keeps it, and every
/// program it starts inherits it.
pub fn install(prog: &[sock_filter]) -> Result<(), InstallError> {
    bpf::install(prog, Threads::Caller)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    /// Syscalls the module must never allow unconditionally.
    fn must_deny() -> Vec<(i64, &'static str)> {
        let v = vec![
            (sys::SYS_mount, "mount"),
            (sys::SYS_umount2, "umount2"),
            (sys::SYS_fsopen, "fsopen"),
            (sys::SYS_fsmount, "fsmount"),
            (sys::SYS_fsconfig, "fsconfig"),
            (sys::SYS_fspick, "fspick"),
            (sys::SYS_move_mount, "move_mount"),
            (sys::SYS_open_tree, "open_tree"),
            (sys::SYS_mount_setattr, "mount_setattr"),
            (sys::SYS_unshare, "unshare"),
            (sys::SYS_setns, "setns"),
            (sys::SYS_clone, "clone"),
            (sys::SYS_clone3, "clone3"),
            (sys::SYS_ptrace, "ptrace"),
            (sys::SYS_process_vm_readv, "process_vm_readv"),
            (sys::SYS_process_vm_writev, "process_vm_writev"),
            (sys::SYS_bpf, "bpf"),
            (sys::SYS_keyctl, "keyctl"),
            (sys::SYS_add_key, "add_key"),
            (sys::SYS_request_key, "request_key"),
            (sys::SYS_userfaultfd, "userfaultfd"),
            (sys::SYS_perf_event_open, "perf_event_open"),
            (sys::SYS_io_uring_setup, "io_uring_setup"),
            (sys::SYS_io_uring_enter, "io_uring_enter"),
            (sys::SYS_io_uring_register, "io_uring_register"),
            (sys::SYS_open_by_handle_at, "open_by_handle_at"),
            (sys::SYS_name_to_handle_at, "name_to_handle_at"),
            (sys::SYS_kexec_load, "kexec_load"),
            (sys::SYS_kexec_file_load, "kexec_file_load"),
            (sys::SYS_init_module, "init_module"),
            (sys::SYS_finit_module, "finit_module"),
            (sys::SYS_delete_module, "delete_module"),
            (sys::SYS_reboot, "reboot"),
            (sys::SYS_swapon, "swapon"),
            (sys::SYS_swapoff, "swapoff"),
            (sys::SYS_acct, "acct"),
            (sys::SYS_quotactl, "quotactl"),
            (sys::SYS_quotactl_fd, "quotactl_fd"),
            (sys::SYS_chroot, "chroot"),
            (sys::SYS_pivot_root, "pivot_root"),
            (sys::SYS_clock_settime, "clock_settime"),
            (sys::SYS_clock_adjtime, "clock_adjtime"),
            (sys::SYS_settimeofday, "settimeofday"),
            (sys::SYS_adjtimex, "adjtimex"),
            (sys::SYS_ioctl, "ioctl"),
            (sys::SYS_personality, "personality"),
            (sys::SYS_socket, "socket"),
            (sys::SYS_lookup_dcookie, "lookup_dcookie"),
            (sys::SYS_vhangup, "vhangup"),
            (sys::SYS_syslog, "syslog"),
            (sys::SYS_kcmp, "kcmp"),
            (sys::SYS_pidfd_getfd, "pidfd_getfd"),
            (sys::SYS_fanotify_init, "fanotify_init"),
            (sys::SYS_nfsservctl, "nfsservctl"),
            (sys::SYS_mbind, "mbind"),
            (sys::SYS_set_mempolicy, "set_mempolicy"),
            (sys::SYS_migrate_pages, "migrate_pages"),
            (sys::SYS_move_pages, "move_pages"),
            (sys::SYS_sethostname, "sethostname"),
            (sys::SYS_setdomainname, "setdomainname"),
            (sys::SYS_process_madvise, "process_madvise"),
            (sys::SYS_memfd_secret, "memfd_secret"),
        ];
        #[cfg(target_arch = "x86_64")]
        let v = [
            v,
            vec![
                (sys::SYS_iopl, "iopl"),
                (sys::SYS_ioperm, "ioperm"),
                (sys::SYS_uselib, "uselib"),
                (sys::SYS_sysfs, "sysfs"),
                (sys::SYS__sysctl, "_sysctl"),
                (sys::SYS_modify_ldt, "modify_ldt"),
            ],
        ]
        .concat();
        v
    }

    /// Both tables, with the `inotify` argument of [`sandbox_filter`] that selects each.
    const TABLES: [(bool, Table<'static>); 2] = [(true, SANDBOX), (false, SANDBOX_NO_INOTIFY)];

    #[test]
    fn seccomp_filter_compiles() {
        for (inotify, table) in TABLES {
            let prog = sandbox_filter(inotify);
            // The static is the table's program, and a node and a leaf per run of numbers.
            let fields = |p: &[sock_filter]| -> Vec<_> {
                p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
            };
            assert_eq!(fields(prog), fields(bpf::compile(&table).as_slice()));
            assert!(prog.len() > 2 * runs(&table));
            assert!(
                prog.len() <= libc::BPF_MAXINSNS as usize,
                "{} instructions",
                prog.len()
            );
        }
    }

    #[test]
    fn seccomp_tables_are_consistent() {
        let mut seen = std::collections::HashSet::new();
        for e in ALLOWLIST {
            assert!(seen.insert(e.nr), "{} listed twice", e.name());
            assert!(
                !e.reason.is_empty() && !e.name().starts_with("SYS"),
                "{e:?}"
            );
            assert!(
                e.nr <= NEWEST_REVIEWED,
                "{} is above NEWEST_REVIEWED",
                e.name()
            );
        }
        for e in ENOSYS_LIST {
            assert!(seen.insert(e.nr), "{} listed twice", e.name());
        }
        let filtered: Vec<_> = ALLOWLIST
            .iter()
            .filter(|e| e.when != When::Always)
            .map(|e| e.name())
            .collect();
        assert_eq!(
            filtered,
            [
                "clone",
                "personality",
                "unshare",
                "sched_setaffinity",
                "sched_setparam",
                "sched_setscheduler",
                "sched_setattr",
                "setpriority",
                "ioprio_set",
                "prlimit64",
                "ioctl",
                #[cfg(target_arch = "x86_64")]
                "open",
                "openat",
                #[cfg(target_arch = "x86_64")]
                "creat",
                "fadvise64",
                #[cfg(target_arch = "x86_64")]
                "mknod",
                "mknodat",
                #[cfg(target_arch = "x86_64")]
                "chmod",
                "fchmod",
                "fchmodat",
                "fchmodat2",
                "socket",
                "socketpair"
            ]
        );
    }

    /// Every entry says why a program needs the answer, in more words than the call's name.
    #[test]
    fn seccomp_every_entry_says_why_a_program_needs_it() {
        let reasons = ALLOWLIST
            .iter()
            .map(|e| (e.name(), e.reason))
            .chain(ENOSYS_LIST.iter().map(|e| (e.name(), e.reason)));
        for (name, reason) in reasons {
            assert!(
                reason.split_whitespace().count() >= 4 && !reason.starts_with("see "),
                "{name}: {reason:?} is no reason"
            );
        }
    }

    #[test]
    fn seccomp_dangerous_syscalls_are_not_allowed_unconditionally() {
        for (nr, name) in must_deny() {
            let entry = ALLOWLIST.iter().find(|e| e.nr == nr);
            assert!(
                !matches!(entry, Some(e) if e.when == When::Always),
                "{name} is allowed unconditionally"
            );
        }
    }

    // ---- The program, evaluated in user space

    /// How many runs of numbers with the same answer the table makes (as the compiler
    /// counts them: neighbours with the same verdict, or the same argument check, share one).
    fn runs(table: &Table) -> usize {
        let answer = |nr: i64| {
            if table.enosys.iter().any(|e| e.nr == nr) || nr > NEWEST_REVIEWED {
                return Err(bpf::RET_ENOSYS);
            }
            match table.allowed.iter().find(|e| e.nr == nr) {
                Some(e) if e.when == When::Always => Err(bpf::RET_ALLOW),
                Some(e) => Ok(e.when),
                None => Err(bpf::RET_EPERM),
            }
        };
        let answers: Vec<_> = (0..=NEWEST_REVIEWED + 1).map(answer).collect();
        1 + answers.windows(2).filter(|w| w[0] != w[1]).count()
    }

    /// For every syscall number, sample arguments and foreign architectures, the program
    /// answers what the tables say, and reads an argument only where an entry checks one
    /// (every other verdict the kernel can cache).
    #[test]
    fn seccomp_program_answers_as_the_tables_say() {
        for (inotify, table) in TABLES {
            assert_eq!(
                table.disagreement(sandbox_filter(inotify)),
                None,
                "{inotify}"
            );
        }
    }

    /// Without inotify, the calls that make an instance answer `ENOSYS`; nothing else
    /// changes.
    #[test]
    fn seccomp_tables_differ_only_in_inotify() {
        for nr in 0..=NEWEST_REVIEWED as u32 + 1 {
            let args = [0; 6];
            let (with, without) = (
                SANDBOX.verdict(nr, args),
                SANDBOX_NO_INOTIFY.verdict(nr, args),
            );
            if INOTIFY_INSTANCE.contains(&i64::from(nr)) {
                assert_eq!(
                    (with, without),
                    (bpf::RET_ALLOW, bpf::RET_ENOSYS),
                    "nr {nr}"
                );
            } else {
                assert_eq!(with, without, "nr {nr}");
            }
        }
        let when = |t: &Table, nr: i64| t.allowed.iter().find(|e| e.nr == nr).map(|e| e.when);
        for e in ALLOWLIST {
            if !INOTIFY_INSTANCE.contains(&e.nr) {
                assert_eq!(
                    when(&SANDBOX_NO_INOTIFY, e.nr),
                    Some(e.when),
                    "{}",
                    e.name()
                );
            }
        }
    }

    /// A few arguments real programs pass, and attacks on them.
    #[test]
    fn seccomp_program_checks_real_arguments() {
        let ask = |nr: i64, arg: usize, value: u64| {
            let mut args = [0; 6];
            args[arg] = value;
            let with = bpf::evaluate(sandbox_filter(true), bpf::AUDIT_ARCH, nr as u32, args);
            let without = bpf::evaluate(sandbox_filter(false), bpf::AUDIT_ARCH, nr as u32, args);
            assert_eq!(with.ret, without.ret, "syscall {nr}");
            with.ret
        };
        let (allow, eperm) = (bpf::RET_ALLOW, bpf::RET_EPERM);
        let thread = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND)
            as u64
            | (libc::CLONE_THREAD | libc::CLONE_SYSVSEM | libc::CLONE_SETTLS) as u64;
        let cases = [
            (libc::SYS_clone, 0, thread, allow),
            (
                libc::SYS_clone,
                0,
                (libc::CLONE_VFORK | libc::CLONE_VM | libc::SIGCHLD) as u64,
                allow,
            ),
            (
                libc::SYS_clone,
                0,
                (libc::CLONE_NEWUSER | libc::SIGCHLD) as u64,
                eperm,
            ),
            (
                libc::SYS_unshare,
                0,
                (libc::CLONE_NEWNS | libc::CLONE_NEWIPC) as u64,
                allow,
            ),
            (libc::SYS_unshare, 0, libc::CLONE_NEWUSER as u64, eperm),
            (libc::SYS_ioctl, 1, libc::FIONREAD, allow),
            (libc::SYS_ioctl, 1, libc::TCGETS, allow),
            (libc::SYS_ioctl, 1, libc::TIOCSTI, eperm),
            (
                libc::SYS_fadvise64,
                3,
                libc::POSIX_FADV_DONTNEED as u64,
                eperm,
            ),
            (
                libc::SYS_fadvise64,
                3,
                libc::POSIX_FADV_WILLNEED as u64,
                allow,
            ),
            (
                libc::SYS_fadvise64,
                3,
                libc::POSIX_FADV_SEQUENTIAL as u64,
                allow,
            ),
            (libc::SYS_ioctl, 1, libc::TIOCSTI | 1 << 32, eperm),
            (libc::SYS_personality, 0, 0xffff_ffff, allow),
            (
                libc::SYS_personality,
                0,
                libc::ADDR_NO_RANDOMIZE as u64,
                eperm,
            ),
            (
                libc::SYS_personality,
                0,
                libc::READ_IMPLIES_EXEC as u64,
                eperm,
            ),
            (libc::SYS_socket, 0, libc::AF_INET6 as u64, allow),
            (libc::SYS_socket, 0, libc::AF_VSOCK as u64, eperm),
            (libc::SYS_socket, 0, libc::AF_PACKET as u64, eperm),
            (libc::SYS_socket, 0, libc::AF_ALG as u64, eperm),
            (libc::SYS_prlimit64, 0, 0, allow),
            (libc::SYS_prlimit64, 0, 1, eperm),
            (libc::SYS_setpriority, 1, 0, allow),
            (libc::SYS_setpriority, 1, 1, eperm),
        ];
        for (nr, arg, value, want) in cases {
            assert_eq!(
                ask(nr, arg, value),
                want,
                "syscall {nr}, arg {arg} = {value:#x}"
            );
        }
    }

    #[test]
    fn seccomp_tree_is_shallow() {
        for (inotify, table) in TABLES {
            let prog = sandbox_filter(inotify);
            // 4 for the prefix, one comparison per level, and the leaf's `ret`.
            let depth = runs(&table).next_power_of_two().trailing_zeros() as usize;
            for nr in 0..=NEWEST_REVIEWED as u32 + 1 {
                let r = bpf::evaluate(prog, bpf::AUDIT_ARCH, nr, [0; 6]);
                if !r.read_args {
                    assert!(r.steps <= 4 + depth + 1, "nr {nr}: {} steps", r.steps);
                }
            }
        }
    }

    /// Install time in a fresh child, and the cost of two calls that run the filter (neither
    /// is cached): `ioctl`, argument-filtered, and `setns`, refused. (The linear scan
    /// `seccompiler` generated, timed here until it went: 1474 instructions, install
    /// 0.61 ms.) Run with
    /// `cargo test -p zygo-launcher --release seccomp_timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing only"]
    fn seccomp_timing() {
        const STARTS: usize = 300;
        const CALLS: u32 = 10_000;
        /// In a child: ns to install, ns per ioctl, ns per setns; sent back through a pipe.
        fn measure(prog: &[sock_filter]) -> [u64; 3] {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: the child makes only raw syscalls and clock reads, then _exits.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                let per_call = |call: &dyn Fn()| {
                    let t = std::time::Instant::now();
                    (0..CALLS).for_each(|_| call());
                    (t.elapsed() / CALLS).as_nanos() as u64
                };
                let t = std::time::Instant::now();
                let ok = install(prog).is_ok();
                let out = [
                    t.elapsed().as_nanos() as u64,
                    per_call(&|| {
                        let mut n: libc::c_int = 0;
                        // SAFETY: invalid descriptor; `n` is a valid out-pointer.
                        unsafe { libc::ioctl(-1, libc::FIONREAD, &mut n) };
                    }),
                    // SAFETY: invalid descriptor: EBADF even unfiltered.
                    per_call(&|| unsafe {
                        libc::setns(-1, 0);
                    }),
                ];
                // SAFETY: writing a local array to our pipe, then leaving without cleanup.
                unsafe {
                    libc::write(fds[1], out.as_ptr().cast(), 24);
                    libc::_exit(if ok { 0 } else { 1 });
                }
            }
            let mut out = [0u64; 3];
            // SAFETY: reading into a local array of 24 bytes; closing our own descriptors;
            // reaping our own child.
            unsafe {
                libc::close(fds[1]);
                assert_eq!(libc::read(fds[0], out.as_mut_ptr().cast(), 24), 24);
                libc::close(fds[0]);
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
            }
            out
        }
        let median = |i: usize, runs: &[[u64; 3]]| {
            let mut v: Vec<u64> = runs.iter().map(|r| r[i]).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        for inotify in [true, false] {
            let prog = sandbox_filter(inotify);
            let runs: Vec<_> = (0..STARTS).map(|_| measure(prog)).collect();
            eprintln!(
                "inotify {inotify}: {:4} instructions; medians: install {} us, ioctl {} ns, \
                 setns {} ns",
                prog.len(),
                median(0, &runs) as f64 / 1e3,
                median(1, &runs),
                median(2, &runs),
            );
        }
    }

    // ---- Running under the filter

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// `ret` is -1 with `errno` set to `want`.
    fn fails_with(ret: libc::c_long, want: i32) -> bool {
        ret == -1 && errno() == want
    }

    /// A NUL-terminated byte string as a C string pointer.
    fn cstr(s: &'static [u8]) -> *const libc::c_char {
        assert_eq!(s.last(), Some(&0));
        s.as_ptr().cast()
    }

    const NOWHERE: &[u8] = b"/nonexistent-zygo-seccomp-test\0";

    /// Checks run inside the filtered child. None may allocate (the parent is multithreaded),
    /// and every call uses arguments that would fail harmlessly were the filter missing.
    #[allow(clippy::type_complexity)]
    const CHECKS: &[(&str, fn() -> bool)] = &[
        ("getpid works", || {
            // SAFETY: no arguments, no memory.
            let pid = unsafe { libc::getpid() };
            pid > 0
        }),
        ("unshare(CLONE_NEWUSER) -> EPERM", || {
            // SAFETY: only affects this throwaway child, and should fail anyway.
            fails_with(
                unsafe { libc::unshare(libc::CLONE_NEWUSER) }.into(),
                libc::EPERM,
            )
        }),
        ("unshare(CLONE_NEWNS | CLONE_NEWNET) -> EPERM", || {
            // SAFETY: as above.
            fails_with(
                unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET) }.into(),
                libc::EPERM,
            )
        }),
        ("unshare(CLONE_FILES) -> EPERM", || {
            // SAFETY: as above.
            fails_with(
                unsafe { libc::unshare(libc::CLONE_FILES) }.into(),
                libc::EPERM,
            )
        }),
        ("setns -> EPERM", || {
            // SAFETY: invalid descriptor; EBADF unfiltered.
            fails_with(unsafe { libc::setns(-1, 0) }.into(), libc::EPERM)
        }),
        ("clone3 -> ENOSYS", || {
            // SAFETY: null args and size 0: EINVAL unfiltered, nothing created.
            let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
            fails_with(r, libc::ENOSYS)
        }),
        ("clone(CLONE_NEWUSER) -> EPERM", || {
            let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
            // SAFETY: fork-like raw clone (no new stack). Should the filter let it through,
            // the new child exits at once without touching any state, and is reaped below.
            let r =
                unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
            match r {
                // SAFETY: in the unexpected child: leave immediately.
                0 => unsafe { libc::_exit(0) },
                pid if pid > 0 => {
                    // SAFETY: reaping our own child.
                    unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
                    false
                }
                r => fails_with(r, libc::EPERM),
            }
        }),
        ("fork works (clone without namespace flags)", || {
            // SAFETY: the child exits immediately; the parent reaps it.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: in the child: leave immediately.
                unsafe { libc::_exit(7) };
            }
            let mut status = 0;
            // SAFETY: reaping our own child into a local.
            pid > 0
                && unsafe { libc::waitpid(pid, &mut status, 0) } == pid
                && libc::WIFEXITED(status)
                && libc::WEXITSTATUS(status) == 7
        }),
        ("ptrace(PTRACE_TRACEME) -> EPERM", || {
            // SAFETY: at worst makes this throwaway child traceable by its parent.
            fails_with(
                unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) },
                libc::EPERM,
            )
        }),
        ("process_vm_readv -> EPERM", || {
            // SAFETY: zero iovecs: reads nothing even unfiltered.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_vm_readv,
                    libc::getppid(),
                    0usize,
                    0,
                    0usize,
                    0,
                    0,
                )
            };
            fails_with(r, libc::EPERM)
        }),
        ("mount -> EPERM", || {
            // SAFETY: valid C strings; the target does not exist (ENOENT unfiltered).
            let r = unsafe {
                libc::mount(
                    cstr(b"none\0"),
                    cstr(NOWHERE),
                    cstr(b"tmpfs\0"),
                    0,
                    std::ptr::null(),
                )
            };
            fails_with(r.into(), libc::EPERM)
        }),
        ("umount2 -> EPERM", || {
            // SAFETY: the target does not exist (ENOENT unfiltered).
            fails_with(
                unsafe { libc::umount2(cstr(NOWHERE), 0) }.into(),
                libc::EPERM,
            )
        }),
        ("chroot -> EPERM", || {
            // SAFETY: the target does not exist (ENOENT unfiltered).
            fails_with(unsafe { libc::chroot(cstr(NOWHERE)) }.into(), libc::EPERM)
        }),
        ("reboot(bad magic) -> EPERM", || {
            // SAFETY: magic 0 is invalid: EINVAL unfiltered, the machine is never rebooted.
            let r = unsafe { libc::syscall(libc::SYS_reboot, 0, 0, 0, 0usize) };
            fails_with(r, libc::EPERM)
        }),
        ("sethostname -> EPERM", || {
            // SAFETY: an over-long length: EINVAL unfiltered, nothing is changed.
            fails_with(
                unsafe { libc::sethostname(cstr(b"x\0"), usize::MAX) }.into(),
                libc::EPERM,
            )
        }),
        ("clock_settime -> EPERM", || {
            // SAFETY: null timespec: EFAULT unfiltered, the clock is not changed.
            let r = unsafe { libc::syscall(libc::SYS_clock_settime, libc::CLOCK_REALTIME, 0usize) };
            fails_with(r, libc::EPERM)
        }),
        ("ioctl(TIOCSTI) -> EPERM", || {
            let c = b'x';
            // SAFETY: invalid descriptor (EBADF unfiltered): nothing can be injected.
            fails_with(
                unsafe { libc::ioctl(-1, libc::TIOCSTI, &c) }.into(),
                libc::EPERM,
            )
        }),
        ("ioctl(TIOCSTI | 1<<32) -> EPERM", || {
            let c = b'x';
            let cmd: u64 = libc::TIOCSTI | 1 << 32;
            // SAFETY: invalid descriptor (EBADF unfiltered): nothing can be injected.
            fails_with(
                unsafe { libc::syscall(libc::SYS_ioctl, -1, cmd, &c) },
                libc::EPERM,
            )
        }),
        ("ioctl(TIOCLINUX) -> EPERM", || {
            let c = 0u8;
            // SAFETY: invalid descriptor (EBADF unfiltered).
            fails_with(
                unsafe { libc::ioctl(-1, libc::TIOCLINUX, &c) }.into(),
                libc::EPERM,
            )
        }),
        ("ioctl(FIONREAD) allowed -> EBADF", || {
            let mut n: libc::c_int = 0;
            // SAFETY: invalid descriptor; n is a valid out-pointer.
            fails_with(
                unsafe { libc::ioctl(-1, libc::FIONREAD, &mut n) }.into(),
                libc::EBADF,
            )
        }),
        ("personality(ADDR_NO_RANDOMIZE) -> EPERM", || {
            // SAFETY: would only change this throwaway child's personality.
            let r = unsafe { libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) };
            fails_with(r.into(), libc::EPERM)
        }),
        ("personality(query) allowed", || {
            // SAFETY: 0xffffffff only queries.
            let r = unsafe { libc::personality(0xffff_ffff) };
            r >= 0
        }),
        ("bpf -> EPERM", || {
            // SAFETY: null attr, size 0: EINVAL/EFAULT unfiltered.
            let r = unsafe { libc::syscall(libc::SYS_bpf, 0, 0usize, 0) };
            fails_with(r, libc::EPERM)
        }),
        ("perf_event_open -> EPERM", || {
            // SAFETY: null attr: EFAULT unfiltered.
            let r = unsafe { libc::syscall(libc::SYS_perf_event_open, 0usize, 0, -1, -1, 0) };
            fails_with(r, libc::EPERM)
        }),
        ("keyctl -> EPERM", || {
            // SAFETY: an invalid operation: EOPNOTSUPP unfiltered.
            let r = unsafe { libc::syscall(libc::SYS_keyctl, -1, 0, 0, 0, 0) };
            fails_with(r, libc::EPERM)
        }),
        ("open_by_handle_at -> EPERM", || {
            // SAFETY: invalid descriptor and null handle: EBADF/EFAULT unfiltered.
            let r = unsafe { libc::syscall(libc::SYS_open_by_handle_at, -1, 0usize, 0) };
            fails_with(r, libc::EPERM)
        }),
        ("finit_module -> EPERM", || {
            // SAFETY: invalid descriptor: EBADF unfiltered.
            let r = unsafe { libc::syscall(libc::SYS_finit_module, -1, cstr(b"\0"), 0) };
            fails_with(r, libc::EPERM)
        }),
        ("io_uring_setup -> ENOSYS", || {
            // SAFETY: null params: EFAULT unfiltered.
            let r = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, 0usize) };
            fails_with(r, libc::ENOSYS)
        }),
        ("socket(AF_VSOCK) -> EPERM", || {
            // SAFETY: plain socket creation; closed if it unexpectedly succeeds.
            let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) };
            if fd >= 0 {
                // SAFETY: our own descriptor.
                unsafe { libc::close(fd) };
            }
            fails_with(fd.into(), libc::EPERM)
        }),
        ("socket(AF_INET) allowed", || {
            // SAFETY: plain socket creation, closed at once.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            // SAFETY: our own descriptor.
            fd >= 0 && unsafe { libc::close(fd) } == 0
        }),
        ("seccomp(GET_ACTION_AVAIL) allowed", || {
            let action = libc::SECCOMP_RET_ERRNO;
            // SAFETY: a query; action is a valid u32.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_GET_ACTION_AVAIL,
                    0,
                    &action,
                )
            };
            r == 0
        }),
        ("newer than reviewed (463, setxattrat) -> ENOSYS", || {
            // SAFETY: bad descriptor and null pointers: EBADF/EFAULT unfiltered.
            let r = unsafe { libc::syscall(463, -1, 0usize, 0, 0usize, 0usize) };
            fails_with(r, libc::ENOSYS)
        }),
        #[cfg(target_arch = "x86_64")]
        ("x32 ABI getpid -> ENOSYS", || {
            // SAFETY: x32 getpid, harmless either way.
            fails_with(
                unsafe { libc::syscall(libc::SYS_getpid | 0x4000_0000) },
                libc::ENOSYS,
            )
        }),
    ];

    /// Fork; in the child set no_new_privs, install the filter and run `body`, whose value
    /// becomes the exit code. Returns the child's wait status and pid.
    fn in_filtered_child(prog: &[sock_filter], body: impl FnOnce() -> i32) -> (i32, libc::pid_t) {
        // SAFETY: the child only makes raw syscalls and async-signal-safe calls, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain prctl in our own process.
            let code = if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                201
            } else if install(prog).is_err() {
                202
            } else {
                body()
            };
            // SAFETY: leave the child without running the parent's destructors or atexit.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: reaping our own child into a local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
        (status, pid)
    }

    fn describe(status: i32) -> String {
        if libc::WIFEXITED(status) {
            format!("exit {}", libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            format!("killed by signal {}", libc::WTERMSIG(status))
        } else {
            format!("status {status:#x}")
        }
    }

    #[test]
    fn seccomp_denies_and_allows_in_a_child() {
        for inotify in [true, false] {
            let (status, _) = in_filtered_child(sandbox_filter(inotify), || {
                for (i, (_, check)) in CHECKS.iter().enumerate() {
                    if !check() {
                        return i as i32 + 1;
                    }
                }
                0
            });
            let code = libc::WEXITSTATUS(status);
            if libc::WIFEXITED(status) && (1..=CHECKS.len() as i32).contains(&code) {
                panic!(
                    "check failed: {} (inotify {inotify})",
                    CHECKS[code as usize - 1].0
                );
            }
            assert_eq!(describe(status), "exit 0");
        }
    }

    #[test]
    fn inotify_is_refused_with_enosys_unless_the_plan_allows_it() {
        fn inotify() -> libc::c_int {
            // SAFETY: creates a descriptor in a throwaway child, or fails.
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            if fd >= 0 {
                return 0;
            }
            // SAFETY: reading errno.
            unsafe { *libc::__errno_location() }
        }
        let (status, _) = in_filtered_child(sandbox_filter(true), inotify);
        assert_eq!(
            describe(status),
            "exit 0",
            "the sandbox filter allows inotify"
        );
        let (status, _) = in_filtered_child(sandbox_filter(false), || {
            let e = inotify();
            // SAFETY: getpid takes nothing; a call the filter must still allow.
            if unsafe { libc::getpid() } <= 0 {
                return 203;
            }
            e
        });
        assert_eq!(describe(status), format!("exit {}", libc::ENOSYS));
    }

    /// Run `argv` under the filter with a minimal environment (stdout to /dev/null, stderr
    /// kept for diagnostics). Returns the wait status and the pid, which exec keeps.
    fn run_filtered(argv: &[&str], extra_env: &[&str]) -> (i32, libc::pid_t) {
        let prog = sandbox_filter(false);
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(*a).expect("no NUL"))
            .collect();
        let mut env = vec![
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "HOME=/tmp",
            "LANG=C.UTF-8",
        ];
        env.extend_from_slice(extra_env);
        let cenv: Vec<CString> = env
            .iter()
            .map(|a| CString::new(*a).expect("no NUL"))
            .collect();
        let mut argp: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
        argp.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = cenv.iter().map(|a| a.as_ptr()).collect();
        envp.push(std::ptr::null());
        let devnull = std::fs::File::options()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null");
        let devnull = std::os::fd::AsRawFd::as_raw_fd(&devnull);

        in_filtered_child(prog, || {
            // SAFETY: dup2 onto stdout; execve with NUL-terminated arrays of C strings that
            // outlive the call (built before fork).
            unsafe {
                libc::dup2(devnull, 1);
                libc::execve(argp[0], argp.as_ptr(), envp.as_ptr());
            }
            127
        })
    }

    fn have(path: &str) -> bool {
        let exists = std::path::Path::new(path).exists();
        if !exists {
            eprintln!("skipping: {path} not installed");
        }
        exists
    }

    #[test]
    fn seccomp_python_runs() {
        if !have("/usr/bin/python3") {
            return;
        }
        let script = "\
import json, os, subprocess, threading, tempfile, socket, hashlib, random
box = []
t = threading.Thread(target=lambda: box.append(hashlib.sha256(os.urandom(64)).hexdigest()))
t.start(); t.join()
assert len(box) == 1
out = subprocess.run(['/bin/sh', '-c', 'echo hi'], capture_output=True, check=True).stdout
assert out == b'hi\\n', out
with tempfile.NamedTemporaryFile('w') as f:
    json.dump({'r': random.random(), 'pid': os.getpid()}, f)
    f.flush()
    assert os.path.getsize(f.name) > 0
a, b = socket.socketpair()
a.sendall(b'ping')
assert b.recv(4) == b'ping'
a.close(); b.close()
";
        let (status, _) = run_filtered(&["/usr/bin/python3", "-c", script], &[]);
        assert_eq!(describe(status), "exit 0");
    }

    #[test]
    fn seccomp_node_runs() {
        if !have("/usr/bin/node") {
            return;
        }
        let script = "const fs=require('fs'); const cp=require('child_process'); \
            fs.writeFileSync('/tmp/zygo-seccomp-test-'+process.pid, 'x'); \
            console.log(cp.execSync('echo hi').toString()); \
            setTimeout(()=>{},10); Promise.resolve().then(()=>{})";
        // UV_USE_IO_URING=1 makes libuv try io_uring, so the ENOSYS fallback is exercised.
        let (status, pid) = run_filtered(&["/usr/bin/node", "-e", script], &["UV_USE_IO_URING=1"]);
        let marker = format!("/tmp/zygo-seccomp-test-{pid}");
        let wrote = std::fs::remove_file(&marker).is_ok();
        assert_eq!(describe(status), "exit 0");
        assert!(wrote, "node did not write {marker}");
    }

    #[test]
    fn seccomp_shell_runs() {
        let (status, _) = run_filtered(
            &["/bin/sh", "-c", "ls / | wc -l; cat /etc/hostname; date"],
            &[],
        );
        assert_eq!(describe(status), "exit 0");
    }

    #[test]
    fn seccomp_coreutils_run() {
        let script = "set -e; d=$(mktemp -d); cd \"$d\"; echo x > a; cp -a a b; mv b c; \
            ln -s c l; chmod 600 c; mkdir -p e/f; mkfifo p; touch -d 2020-01-01 a; \
            tar -cf t.tar a c e; tar -tf t.tar >/dev/null; ls -la >/dev/null; stat c >/dev/null; \
            sort a | uniq | head -1 >/dev/null; find . -type f | xargs cat >/dev/null; \
            cd /; rm -rf \"$d\"";
        let (status, _) = run_filtered(&["/bin/sh", "-c", script], &[]);
        assert_eq!(describe(status), "exit 0");
    }

    #[test]
    fn seccomp_pip_runs() {
        if !have("/usr/bin/python3") {
            return;
        }
        let argv = [
            "/usr/bin/python3",
            "-m",
            "pip",
            "list",
            "--disable-pip-version-check",
        ];
        let (status, _) = run_filtered(&argv, &["PIP_NO_INDEX=1"]);
        assert_eq!(describe(status), "exit 0");
    }
}
