//! Escape attempts from inside a sandbox. Each probe is a short Python script behind the
//! safety guard (see `zygo_tests::GUARD`); each asserts that the attempt fails, for the
//! right reason where the reason is part of the contract (the seccomp filter answers
//! `EPERM`, or `ENOSYS` for the calls libc falls back from).
//!
//! Syscall numbers are x86_64's.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::net::TcpListener;
use std::os::fd::FromRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixListener};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use serde_json::Value;
use zygo_tests::*;

/// What the seccomp filter answers for a refused syscall.
const DENIED: &[&str] = &["EPERM"];
/// A failed write to the filesystem: read-only mount, Landlock, or permissions.
const WRITE_DENIED: &[&str] = &["EROFS", "EACCES", "EPERM"];

both_tests! {
    /// The root, the image and /etc are read-only; /tmp and /work are writable.
    fn root_filesystem_is_read_only(who) {
        let r = probe(who, &[], r#"
def create(p):
    with open(p, "w") as f:
        f.write("x")
done(
    root=attempt(create, "/x"),
    root_dir=attempt(os.mkdir, "/newdir"),
    usr_bin=attempt(create, "/usr/bin/x"),
    etc=attempt(create, "/etc/x"),
    etc_passwd=attempt(create, "/etc/passwd"),
    python=attempt(os.open, "/usr/bin/python3", os.O_WRONLY),
    chmod_usr=attempt(os.chmod, "/usr/bin", 0o777),
    tmp=attempt(create, "/tmp/x"),
    work=attempt(create, "/work/x"),
)"#);
        for key in ["root", "root_dir", "usr_bin", "etc", "etc_passwd", "python", "chmod_usr"] {
            assert_result(who, &r, key, WRITE_DENIED);
        }
        assert_result(who, &r, "tmp", &["OK"]);
        assert_result(who, &r, "work", &["OK"]);
    }

    /// A file the sandbox may write by its permissions (0666) but that is bound read-only
    /// cannot be truncated: not by path, not by an open with O_TRUNC, not even one for
    /// reading. (Landlock leaves truncation to the mounts outside a pool: see harden.rs.)
    /// The file is the test's own, never a host file that matters.
    fn read_only_binds_cannot_be_truncated(who) {
        let dir = TempDir::new(0o777);
        let file = dir.file("victim", b"intact");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let mount = format!("{}:/ro", dir.str());
        let r = probe(who, &["--mount", &mount], r#"
p = "/ro/victim"
def ftrunc(flags):
    fd = os.open(p, flags)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
done(
    path=attempt(os.truncate, p, 0),
    rdonly_trunc=attempt(os.open, p, os.O_RDONLY | os.O_TRUNC),
    wronly_trunc=attempt(os.open, p, os.O_WRONLY | os.O_TRUNC),
    rdwr=attempt(os.open, p, os.O_RDWR),
    ftruncate_rdonly=attempt(ftrunc, os.O_RDONLY),
)"#);
        for key in ["path", "rdonly_trunc", "wronly_trunc", "rdwr"] {
            assert_result(who, &r, key, WRITE_DENIED);
        }
        assert_result(who, &r, "ftruncate_rdonly", &["EINVAL", "EBADF"]);
        assert_eq!(std::fs::read(&file).expect("read back"), b"intact", "[{}] {r}", who.name());
    }

    /// /proc shows only the sandbox's own few processes: not the test, not a host `sleep`.
    fn host_processes_are_invisible(who) {
        let mut sleeper = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .expect("start a host sleep");
        let code = format!(
            r#"
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
done(pids=pids, test_visible=os.path.exists("/proc/{test}"),
     sleep_visible=os.path.exists("/proc/{sleep}/cmdline"))"#,
            test = std::process::id(),
            sleep = sleeper.id()
        );
        let r = probe(who, &[], &code);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        let pids: Vec<u64> = r["pids"]
            .as_array()
            .expect("pids")
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        // pid 1 (the sandbox's init) and the probe itself.
        assert!(pids.len() <= 3 && pids.contains(&1), "[{}] sandbox pids: {pids:?}", who.name());
        for host_pid in [u64::from(std::process::id()), u64::from(sleeper.id())] {
            assert!(!pids.contains(&host_pid), "[{}] host pid {host_pid} visible", who.name());
        }
        assert_eq!(r["test_visible"], false, "[{}] {r}", who.name());
        assert_eq!(r["sleep_visible"], false, "[{}] {r}", who.name());
    }

    /// Host files are not there: /root, /home, /var, a file the test made in the host's
    /// /tmp, /etc/shadow, and the host's user database.
    fn host_files_are_invisible(who) {
        let dir = TempDir::new(0o755);
        let marker = dir.file("marker", b"host secret");
        let code = format!(
            r#"
passwd = open("/etc/passwd").read()
done(root=os.path.exists("/root"), home=os.path.exists("/home"), var=os.path.exists("/var"),
     marker=os.path.exists("{marker}"), marker_dir=os.path.exists("{dir}"),
     shadow=os.path.exists("/etc/shadow"), host_user="zygo-rootless" in passwd,
     tmp=os.listdir("/tmp"))"#,
            marker = marker.display(),
            dir = dir.str()
        );
        let r = probe(who, &[], &code);
        for key in ["root", "home", "var", "marker", "marker_dir", "shadow", "host_user"] {
            assert_eq!(r[key], false, "[{}] {key} is visible: {r}", who.name());
        }
        assert_eq!(r["tmp"], serde_json::json!([]), "[{}] the sandbox's /tmp is not empty: {r}", who.name());
    }

    /// The host's /etc bound in read-only: /etc/shadow is there but unreadable (EACCES).
    fn shadow_is_unreadable_through_a_mount(who) {
        let r = probe(who, &["--mount", "/etc:/hostetc"], r#"
done(exists=os.path.exists("/hostetc/shadow"), read=attempt(lambda: open("/hostetc/shadow").read()),
     gshadow=attempt(lambda: open("/hostetc/gshadow").read()),
     write=attempt(lambda: open("/hostetc/zygo-probe", "w")))"#);
        assert_eq!(r["exists"], true, "[{}] {r}", who.name());
        assert_result(who, &r, "read", &["EACCES"]);
        assert_result(who, &r, "gshadow", &["EACCES", "ENOENT"]);
        assert_result(who, &r, "write", WRITE_DENIED);
    }

    /// Inside, uid 0 maps onto a subordinate range (root) or the user's own uid
    /// (rootless), never onto host root; the same for gids.
    fn id_map_never_reaches_host_root(who) {
        let r = probe(who, &[], r#"
def parse(p):
    return [[int(x) for x in l.split()] for l in open(p).read().splitlines()]
done(uid=parse("/proc/self/uid_map"), gid=parse("/proc/self/gid_map"), ids=list(os.getresuid()))"#);
        for key in ["uid", "gid"] {
            let lines = r[key].as_array().expect("map lines");
            assert!(!lines.is_empty(), "[{}] empty {key} map", who.name());
            for l in lines {
                let n = |i: usize| l[i].as_u64().expect("id map numbers");
                let (inside, host, count) = (n(0), n(1), n(2));
                assert_ne!(host, 0, "[{}] {key} map reaches host id 0: {r}", who.name());
                assert!(host > 0 && host + count <= 1 << 32, "[{}] {r}", who.name());
                match who {
                    Who::Root => assert!(host >= 65536, "[root] {key} map {l:?} is not subordinate"),
                    Who::Rootless => {
                        let r = rootless_setup();
                        let mine = if key == "uid" { r.uid } else { r.gid };
                        assert_eq!((inside, host, count), (0, u64::from(mine), 1), "[rootless] {key}");
                    }
                }
            }
        }
        assert_eq!(r["ids"], serde_json::json!([0, 0, 0]), "[{}] {r}", who.name());
    }

    /// A file the sandbox creates in a writable bind mount belongs, on the host, to the
    /// folder's owner (root: here an unprivileged user's folder, open to all) or to the
    /// user (rootless) — never to host root, whose folder this is not.
    fn created_files_are_not_owned_by_host_root(who) {
        let dir = TempDir::new(0o777);
        let owner = match who {
            Who::Root => {
                std::os::unix::fs::chown(&dir.path, Some(4321), Some(4322)).expect("chown");
                (4321, 4322)
            }
            Who::Rootless => {
                let r = rootless_setup();
                (r.uid, r.gid)
            }
        };
        let mount = format!("{}:/out:rw", dir.str());
        let r = probe(who, &["--mount", &mount], r#"
open("/out/made-inside", "w").write("x")
os.mkdir("/out/dir-inside")
done(ok=True)"#);
        assert_eq!(r["ok"], true);
        for name in ["made-inside", "dir-inside"] {
            let m = std::fs::metadata(dir.path.join(name)).expect("the sandbox's file");
            assert_ne!(m.uid(), 0, "[{}] {name} is owned by host root", who.name());
            assert_ne!(m.gid(), 0, "[{}] {name} has host group root", who.name());
            assert_eq!((m.uid(), m.gid()), owner, "[{}] {name}", who.name());
        }
    }

    /// Mounting, unmounting, the new mount API, chroot and pivot_root are refused.
    fn mount_calls_are_refused(who) {
        let r = probe(who, &[], r#"
attr = ctypes.create_string_buffer(32)  # struct mount_attr, attr_set = 0
done(
    mount=sc(165, b"tmpfs", b"/tmp", b"tmpfs", 0, None),
    bind=sc(165, b"/usr", b"/tmp", None, 0x1000, None),
    umount2=sc(166, b"/tmp", 2),
    fsopen=sc(430, b"tmpfs", 0),
    open_tree=sc(428, -100, b"/usr", 1),
    move_mount=sc(429, -100, b"/usr", -100, b"/tmp", 0),
    mount_setattr=sc(442, -100, b"/tmp", 0, attr, 32),
    chroot=sc(161, b"/tmp"),
    pivot_root=sc(155, b"/tmp", b"/tmp"),
)"#);
        for key in ["mount", "bind", "umount2", "fsopen", "open_tree", "move_mount",
                    "mount_setattr", "chroot", "pivot_root"] {
            assert_result(who, &r, key, DENIED);
        }
    }

    /// No new namespaces and no joining one: unshare, setns, clone with namespace flags
    /// (EPERM), clone3 (ENOSYS, so libc falls back to clone). Plain fork still works.
    fn namespace_calls_are_refused(who) {
        let r = probe(who, &[], r#"
import struct
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
SIGCHLD = 17
args = ctypes.create_string_buffer(struct.pack("<11Q", CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0))
pid = os.fork()
if pid == 0:
    os._exit(0)
fork_ok = os.waitpid(pid, 0)[1] == 0
net = os.open("/proc/self/ns/net", os.O_RDONLY)
done(
    fork=fork_ok,
    unshare=sc(272, CLONE_NEWUSER | CLONE_NEWNS),
    unshare_user=sc(272, CLONE_NEWUSER),
    unshare_net=sc(272, CLONE_NEWNET),
    setns=sc(308, net, CLONE_NEWNET),
    setns_any=sc(308, net, 0),
    clone3=sc(435, args, 88),
    clone_newns=sc(56, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0),
    clone_newuser=sc(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
    clone_newpid=sc(56, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0),
)"#);
        assert_eq!(r["fork"], true, "[{}] plain fork failed: {r}", who.name());
        for key in ["unshare", "unshare_user", "unshare_net", "setns", "setns_any",
                    "clone_newns", "clone_newuser", "clone_newpid"] {
            assert_result(who, &r, key, DENIED);
        }
        assert_result(who, &r, "clone3", &["ENOSYS"]);
    }

    /// No reaching into other processes: ptrace (TRACEME, ATTACH to our own child),
    /// process_vm_readv, pidfd_getfd.
    fn process_inspection_is_refused(who) {
        let r = probe(who, &[], r#"
import signal, time
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
secret = ctypes.create_string_buffer(b"12345678")
local = ctypes.create_string_buffer(8)
iov_l = (ctypes.c_void_p * 2)(ctypes.addressof(local), 8)
iov_r = (ctypes.c_void_p * 2)(ctypes.addressof(secret), 8)
pidfd = os.pidfd_open(pid)
res = dict(
    traceme=sc(101, 0, 0, 0, 0),
    attach=sc(101, 16, pid, 0, 0),
    seize=sc(101, 0x4206, pid, 0, 0),
    vm_readv=sc(310, pid, iov_l, 1, iov_r, 1, 0),
    vm_writev=sc(311, pid, iov_l, 1, iov_r, 1, 0),
    pidfd_getfd=sc(438, pidfd, 0, 0),
    kcmp=sc(312, os.getpid(), pid, 0, 0, 0),
)
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
done(**res)"#);
        for key in ["traceme", "attach", "seize", "vm_readv", "vm_writev", "pidfd_getfd", "kcmp"] {
            assert_result(who, &r, key, DENIED);
        }
    }

    /// Large kernel subsystems are out of reach: bpf, the keyring, userfaultfd,
    /// perf_event_open, io_uring (ENOSYS), open_by_handle_at, module loading, kexec,
    /// the kernel log, port I/O, process accounting. Arguments are valid, so without the
    /// filter most of these would succeed or reach the kernel's permission check.
    fn kernel_subsystems_are_refused(who) {
        let r = probe(who, &[], r#"
import struct
bpf_attr = ctypes.create_string_buffer(struct.pack("<5I", 2, 4, 4, 1, 0), 72)   # an array map
perf_attr = ctypes.create_string_buffer(struct.pack("<IIQQQQQ", 1, 128, 0, 0, 0, 0, 0x61), 128)
uring = ctypes.create_string_buffer(120)
handle = ctypes.create_string_buffer(struct.pack("<Ii8s", 8, 1, b"\0" * 8))
module = ctypes.create_string_buffer(64)
null = os.open("/dev/null", os.O_RDONLY)
log = ctypes.create_string_buffer(4096)
done(
    bpf=sc(321, 0, bpf_attr, 72),
    keyctl=sc(250, 0, -3, 0, 0, 0),
    add_key=sc(248, b"user", b"zygo-probe", b"x", 1, -2),
    request_key=sc(249, b"user", b"zygo-probe", None, 0),
    userfaultfd=sc(323, 1 | 0o2000000),
    perf_event_open=sc(298, perf_attr, 0, -1, -1, 0),
    io_uring_setup=sc(425, 1, uring),
    open_by_handle_at=sc(304, -100, handle, 0),
    init_module=sc(175, module, 64, b""),
    finit_module=sc(313, null, b"", 0),
    delete_module=sc(176, b"zygo_probe", 0),
    kexec_load=sc(246, 0, 0, None, 0),
    syslog=sc(103, 3, log, 4096),
    iopl=sc(172, 3),
    ioperm=sc(173, 0x80, 1, 1),
    acct=sc(163, None),
    fanotify_init=sc(300, 0, 0),
    vsock=attempt(lambda: __import__("socket").socket(40, 1)),
    packet=attempt(lambda: __import__("socket").socket(17, 3)),
    alg=attempt(lambda: __import__("socket").socket(38, 5)),
)"#);
        for key in ["bpf", "keyctl", "add_key", "request_key", "userfaultfd", "perf_event_open",
                    "open_by_handle_at", "init_module", "finit_module",
                    "delete_module", "kexec_load", "syslog", "iopl", "ioperm", "acct",
                    "fanotify_init", "vsock", "packet", "alg"] {
            assert_result(who, &r, key, DENIED);
        }
        assert_result(who, &r, "io_uring_setup", &["ENOSYS"]);
    }

    /// Whole-machine controls are refused. Arguments are chosen to be harmless even if
    /// they went through: reboot with an invalid magic, the clock set to what it reads,
    /// swap off for a file that does not exist.
    fn machine_controls_are_refused(who) {
        let r = probe(who, &[], r#"
class timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]
now = timespec()
libc.clock_gettime(0, ctypes.byref(now))
tv = (ctypes.c_long * 2)(now.sec, now.nsec // 1000)
done(
    reboot=sc(169, 0xfee1dead, 0, 0, None),
    sethostname=sc(170, b"zygo-probe", 10),
    setdomainname=sc(171, b"zygo-probe", 10),
    clock_settime=sc(227, 0, ctypes.byref(now)),
    settimeofday=sc(164, tv, None),
    swapoff=sc(168, b"/nonexistent-zygo-probe"),
    swapon=sc(167, b"/nonexistent-zygo-probe", 0),
    hostname_after=os.uname().nodename,
)"#);
        for key in ["reboot", "sethostname", "setdomainname", "clock_settime", "settimeofday",
                    "swapoff", "swapon"] {
            assert_result(who, &r, key, DENIED);
        }
        assert_eq!(r["hostname_after"], "zygo", "[{}] {r}", who.name());
    }

    /// /proc/sys, /proc/sysrq-trigger and /sys cannot be written. (core_pattern is written
    /// with its own current value, so even a successful write would change nothing.)
    fn proc_and_sys_are_not_writable(who) {
        let r = probe(who, &[], r#"
def write(p, text):
    with open(p, "w") as f:
        f.write(text)
core = open("/proc/sys/kernel/core_pattern").read()
sys_writable = []
for root, dirs, files in os.walk("/sys"):
    for name in files:
        p = os.path.join(root, name)
        if attempt(os.open, p, os.O_WRONLY) == "OK":
            sys_writable.append(p)
done(
    hostname=attempt(write, "/proc/sys/kernel/hostname", "zygo"),
    core_pattern=attempt(write, "/proc/sys/kernel/core_pattern", core),
    sysrq=attempt(write, "/proc/sysrq-trigger", "h"),
    sys_create=attempt(write, "/sys/zygo-probe", "x"),
    sys_mkdir=attempt(os.mkdir, "/sys/zygo-probe-dir"),
    sys_writable=sys_writable,
)"#);
        for key in ["hostname", "core_pattern", "sys_create", "sys_mkdir"] {
            assert_result(who, &r, key, WRITE_DENIED);
        }
        // Absent on some kernels (this VM's has no sysrq): then ENOENT.
        assert_result(who, &r, "sysrq", &["EROFS", "EACCES", "EPERM", "ENOENT"]);
        assert_eq!(r["sys_writable"], serde_json::json!([]), "[{}] {r}", who.name());
    }

    /// Nothing in /proc outside the processes' own directories can even be opened for
    /// writing (open only: nothing is written).
    fn proc_has_nothing_writable(who) {
        let r = probe(who, &[], r#"
writable, checked = [], 0
for root, dirs, files in os.walk("/proc"):
    top = root.split("/")[2] if root.count("/") >= 2 else ""
    if top.isdigit() or top in ("self", "thread-self"):
        dirs[:] = []
        continue
    for name in files:
        p = os.path.join(root, name)
        checked += 1
        if attempt(os.open, p, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY) == "OK":
            writable.append(p)
done(writable=writable, checked=checked)"#);
        assert_eq!(r["writable"], serde_json::json!([]), "[{}] {r}", who.name());
        // /proc/sys alone has hundreds of files: the walk really looked.
        assert!(r["checked"].as_u64().unwrap_or(0) > 300, "[{}] {r}", who.name());
    }

    /// /proc/kcore and the other masked files yield no data.
    fn kernel_memory_is_unreadable(who) {
        let r = probe(who, &[], r#"
def read(p):
    try:
        with open(p, "rb") as f:
            return len(f.read(4096))
    except OSError as e:
        return ename(e.errno)
done(**{p.replace("/", "_"): read(p) for p in
        ["/proc/kcore", "/proc/kallsyms", "/proc/kmsg", "/proc/keys", "/proc/timer_list",
         "/proc/vmallocinfo", "/proc/sched_debug"]})"#);
        for (key, v) in r.as_object().expect("results") {
            assert!(
                v == 0 || v.is_string(),
                "[{}] {key} yielded {v} bytes of data: {r}", who.name()
            );
        }
    }

    /// Nothing in /proc names the host's paths or its kernel's command line: the sandbox's
    /// init (Zygo's own binary) shows only its name, and /proc/cmdline is empty.
    fn proc_names_no_host_path(who) {
        let host_path = zygo_bin().display().to_string();
        let r = probe(who, &[], r#"
def read(p):
    try:
        with open(p, "rb") as f:
            return f.read(65536).decode("utf-8", "replace")
    except OSError as e:
        return ename(e.errno)
done(init=read("/proc/1/cmdline"), cmdline=read("/proc/cmdline"))"#);
        let init = r["init"].as_str().unwrap_or("");
        assert!(!init.contains(&host_path), "[{}] {r}", who.name());
        assert!(init.starts_with("zygo\u{0}"), "[{}] {r}", who.name());
        assert_eq!(r["cmdline"], "", "[{}] {r}", who.name());
    }

    /// The program cannot open its own executable (the host's binary) for writing.
    fn proc_self_exe_is_not_writable(who) {
        let r = probe(who, &[], r#"
done(wronly=attempt(os.open, "/proc/self/exe", os.O_WRONLY),
     rdwr=attempt(os.open, "/proc/self/exe", os.O_RDWR),
     init_exe=attempt(os.open, "/proc/1/exe", os.O_RDONLY),
     trunc=attempt(os.truncate, "/proc/self/exe", 0))"#);
        for key in ["wronly", "rdwr", "trunc"] {
            assert_result(who, &r, key, &["EACCES", "EPERM", "EROFS", "ETXTBSY"]);
        }
        assert_result(who, &r, "init_exe", &["EACCES", "EPERM"]);
    }

    /// No terminal injection: TIOCSTI and TIOCLINUX are refused on every descriptor (also
    /// with high bits set in the request, which the kernel ignores); there is no /dev/tty.
    fn terminal_injection_is_refused(who) {
        let r = probe(who, &[], r#"
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
c = ctypes.c_char(b"x")
res = {}
for fd in (0, 1, 2):
    res["sti_%d" % fd] = sc(16, fd, TIOCSTI, ctypes.byref(c))
    res["sti_high_%d" % fd] = sc(16, fd, TIOCSTI | (1 << 32), ctypes.byref(c))
    res["linux_%d" % fd] = sc(16, fd, TIOCLINUX, ctypes.byref(c))
res["dev_tty"] = os.path.exists("/dev/tty")
if res["dev_tty"]:
    fd = os.open("/dev/tty", os.O_RDWR)
    res["sti_tty"] = sc(16, fd, TIOCSTI, ctypes.byref(c))
done(**res)"#);
        for fd in 0..3 {
            for k in ["sti", "sti_high", "linux"] {
                assert_result(who, &r, &format!("{k}_{fd}"), DENIED);
            }
        }
        assert_eq!(r["dev_tty"], false, "[{}] /dev/tty exists: {r}", who.name());
    }

    /// The host's loopback is another network: a TCP listener on the host's 127.0.0.1 and
    /// an abstract unix socket on the host are both unreachable.
    fn host_loopback_is_unreachable(who) {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind a host loopback listener");
        tcp.set_nonblocking(true).expect("nonblocking");
        let port = tcp.local_addr().expect("addr").port();
        let name = format!("zygo-tests-{:x}", unique());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
        let unix = UnixListener::bind_addr(&addr).expect("bind an abstract socket");
        unix.set_nonblocking(true).expect("nonblocking");
        let code = format!(
            r#"
import socket
def tcp():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(("127.0.0.1", {port}))
def unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect("\0{name}")
done(tcp=attempt(tcp), unix=attempt(unix))"#
        );
        let r = probe(who, &[], &code);
        assert_result(who, &r, "tcp", &["ECONNREFUSED", "ENETUNREACH", "EPERM", "EACCES"]);
        assert_result(who, &r, "unix", &["ECONNREFUSED", "ENOENT", "EPERM", "EACCES"]);
        for (what, got) in [("tcp", tcp.accept().err().map(|e| e.kind())),
                            ("unix", unix.accept().err().map(|e| e.kind()))] {
            let w = who.name();
            assert_eq!(got, Some(ErrorKind::WouldBlock), "[{w}] the host {what} listener was reached");
        }
    }

    /// Run from a terminal (plain mode, the terminal as stdin, stdout and stderr), the
    /// program still gets no terminal: pipes only, its own session, no /dev/tty.
    fn terminal_never_reaches_the_sandbox(who) {
        let (master, slave) = open_pty();
        let g = guard_flags();
        let mut cmd = zygo(who);
        cmd.arg("run")
            .args(&g)
            .args(["--", "python3", "-c"])
            .arg(probe_script(r#"
def link(fd):
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    except OSError as e:
        return ename(e.errno)
c = ctypes.c_char(b"x")
done(tty=[os.isatty(fd) for fd in (0, 1, 2)], links=[link(fd) for fd in (0, 1, 2)],
     dev_tty=attempt(os.open, "/dev/tty", os.O_RDWR), own_session=os.getsid(0) == os.getpid(),
     sti=sc(16, 0, 0x5412, ctypes.byref(c)))"#))
            .stdin(slave.try_clone().expect("dup pty"))
            .stdout(slave.try_clone().expect("dup pty"))
            .stderr(slave);
        let mut child = cmd.spawn().expect("spawn zygo on a terminal");
        drop(cmd); // our copies of the terminal's slave side
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = (&master).read_to_end(&mut out); // EIO once every slave fd is closed
            out
        });
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break st;
            }
            if t0.elapsed() > OUTER_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("[{}] zygo on a terminal did not finish", who.name());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        // Once zygo is gone, nothing may still hold the terminal open.
        let t1 = std::time::Instant::now();
        while !reader.is_finished() {
            assert!(
                t1.elapsed() < std::time::Duration::from_secs(10),
                "[{}] something still holds the terminal after zygo exited",
                who.name()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let out = String::from_utf8_lossy(&reader.join().expect("reader")).into_owned();
        assert!(status.success(), "[{}] {status}: {out}", who.name());
        assert!(!out.contains("REFUSED: not sandboxed"), "[{}] the guard refused: {out}", who.name());
        let line = out.lines().rev().find(|l| l.starts_with('{')).expect("the probe's line");
        let r: Value = serde_json::from_str(line.trim()).expect("probe json");
        assert_eq!(r["tty"], serde_json::json!([false, false, false]), "[{}] {r}", who.name());
        for l in r["links"].as_array().expect("links") {
            let l = l.as_str().unwrap_or("");
            assert!(l.starts_with("pipe:") || l == "/dev/null", "[{}] descriptor {l}: {r}", who.name());
        }
        assert_result(who, &r, "dev_tty", &["ENOENT"]);
        assert_result(who, &r, "sti", DENIED);
        assert_eq!(r["own_session"], true, "[{}] {r}", who.name());
    }

    /// The only network interface is `lo`.
    fn only_loopback_interface(who) {
        let r = probe(who, &[], r#"
import socket
done(ifaces=[name for _, name in socket.if_nameindex()])"#);
        assert_eq!(r["ifaces"], serde_json::json!(["lo"]), "[{}] {r}", who.name());
    }

    /// Every capability set is empty, no_new_privs is set, seccomp is in filter mode.
    fn no_capabilities_no_new_privs_seccomp(who) {
        let r = probe(who, &[], r#"
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
done(**{k: status.get(k, "").strip() for k in
        ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"]})"#);
        for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_result(who, &r, key, &["0000000000000000"]);
        }
        assert_result(who, &r, "NoNewPrivs", &["1"]);
        assert_result(who, &r, "Seccomp", &["2"]);
    }

    /// A setuid binary gains nothing: a copy of `id`, setuid to a uid that is mapped
    /// inside (root) and bound in, still reports euid 0; the image is mounted nosuid.
    fn setuid_binaries_gain_nothing(who) {
        let dir = TempDir::new(0o755);
        let id = dir.path.join("id");
        std::fs::copy("/usr/bin/id", &id).expect("copy /usr/bin/id");
        if who == Who::Root {
            // Owned by the host uid that is uid 1000 inside the sandbox.
            let (host_uid, host_gid) = sandbox_host_ids(who);
            std::os::unix::fs::chown(&id, Some(host_uid + 1000), Some(host_gid + 1000))
                .expect("chown the setuid copy");
        }
        std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o6755)).expect("chmod u+s");
        let mount = format!("{}:/suid", dir.str());
        let r = probe(who, &["--mount", &mount], r#"
import subprocess
def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    return [p.returncode, p.stdout.strip()]
st = os.stat("/suid/id")
mounts = [l.split() for l in open("/proc/self/mountinfo")]
opts = {m[4]: m[5] for m in mounts}
done(
    suid_bit=bool(st.st_mode & 0o4000),
    owner=st.st_uid,
    euid=run("/suid/id", "-u"),
    egid=run("/suid/id", "-g"),
    su=run("/usr/bin/su", "-c", "id -u"),
    usr_nosuid="nosuid" in opts.get("/usr", ""),
    suid_nosuid="nosuid" in opts.get("/suid", ""),
)"#);
        assert_eq!(r["suid_bit"], true, "[{}] the setuid bit is not visible: {r}", who.name());
        assert_eq!(r["euid"], serde_json::json!([0, "0"]), "[{}] setuid id changed the euid: {r}", who.name());
        assert_eq!(r["egid"], serde_json::json!([0, "0"]), "[{}] setgid id changed the egid: {r}", who.name());
        // su either fails or, at most, stays uid 0 inside.
        let su = &r["su"];
        assert!(su[0] != 0 || su[1] == "0", "[{}] su: {r}", who.name());
        assert_eq!(r["usr_nosuid"], true, "[{}] {r}", who.name());
        assert_eq!(r["suid_nosuid"], true, "[{}] {r}", who.name());
    }

    /// Every mount is nosuid; every one but the device nodes is nodev; everything is
    /// read-only except /tmp, /work, /dev/shm and /proc itself; the /proc masks, the
    /// read-only /proc folders and everything in /dev are also noexec.
    fn mount_flags(who) {
        let r = probe(who, &[], r#"
mounts = {}
for line in open("/proc/self/mountinfo"):
    f = line.split()
    mounts[f[4]] = f[5].split(",")
done(**mounts)"#);
        let mounts = r.as_object().expect("mount table");
        let has = |path: &str, flag: &str| {
            mounts[path].as_array().expect("flags").iter().any(|f| f == flag)
        };
        for needed in ["/", "/usr", "/proc", "/proc/kmsg", "/proc/acpi", "/proc/sys", "/dev/null", "/tmp", "/work"] {
            assert!(mounts.contains_key(needed), "[{}] no mount at {needed}: {r}", who.name());
        }
        for (path, _) in mounts {
            let device = path.starts_with("/dev/");
            let writable = ["/tmp", "/work", "/proc", "/dev/shm"].contains(&path.as_str());
            assert!(has(path, "nosuid"), "[{}] {path} is not nosuid: {r}", who.name());
            assert!(device || has(path, "nodev"), "[{}] {path} is not nodev: {r}", who.name());
            assert_eq!(has(path, "ro"), !writable, "[{}] {path}: {r}", who.name());
            if path.starts_with("/proc/") || device {
                assert!(has(path, "noexec"), "[{}] {path} is not noexec: {r}", who.name());
            }
        }
    }

    /// /dev holds only null, zero, full, random, urandom (character devices), the
    /// fd/stdin/stdout/stderr links and shm (a folder for POSIX shared memory): no tty, no
    /// block device.
    fn dev_is_minimal(who) {
        let r = probe(who, &[], r#"
import stat
kinds = {}
for name in os.listdir("/dev"):
    m = os.lstat("/dev/" + name).st_mode
    kinds[name] = "link" if stat.S_ISLNK(m) else "chr" if stat.S_ISCHR(m) else "blk" if stat.S_ISBLK(m) else "other"
done(**kinds)"#);
        let expected = serde_json::json!({
            "null": "chr", "zero": "chr", "full": "chr", "random": "chr", "urandom": "chr",
            "fd": "link", "stdin": "link", "stdout": "link", "stderr": "link",
            "shm": "other",
        });
        assert_eq!(r, expected, "[{}] /dev", who.name());
    }

    /// `kill -9 -1` inside kills only the sandbox's processes: a host `sleep` running as
    /// the very host uid the sandbox maps onto survives, and so does the test.
    fn kill_all_stays_inside(who) {
        let (host_uid, host_gid) = sandbox_host_ids(who);
        let mut sleeper = Command::new("sleep");
        sleeper.arg("30").stdin(Stdio::null());
        if am_root() {
            sleeper.uid(host_uid).gid(host_gid);
        }
        let mut sleeper = sleeper.spawn().expect("start a host sleep");
        let r = probe(who, &[], r#"
import signal, subprocess
inner = subprocess.Popen(["sleep", "30"])
kill = attempt(os.kill, -1, signal.SIGKILL)
_, st = os.waitpid(inner.pid, 0)
done(kill=kill, inner_killed=os.WIFSIGNALED(st) and os.WTERMSIG(st) == 9)"#);
        let survived = sleeper.try_wait().expect("try_wait").is_none();
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        assert_result(who, &r, "kill", &["OK"]);
        assert_eq!(r["inner_killed"], true, "[{}] kill -1 did not reach the sandbox's own sleep: {r}", who.name());
        assert!(survived, "[{}] kill -9 -1 inside the sandbox killed a host process", who.name());
    }

    /// personality() may not weaken the address space (ADDR_NO_RANDOMIZE,
    /// READ_IMPLIES_EXEC); a query still works.
    fn personality_is_restricted(who) {
        let r = probe(who, &[], r#"
done(no_randomize=sc(135, 0x0040000), read_implies_exec=sc(135, 0x0400000),
     query=sc(135, 0xffffffff))"#);
        assert_result(who, &r, "no_randomize", DENIED);
        assert_result(who, &r, "read_implies_exec", DENIED);
        assert_result(who, &r, "query", &["OK"]);
    }

    /// Other syscall ABIs are no way around the filter: an x32 unshare gets ENOSYS, and an
    /// i386 `int 0x80` unshare kills the process (or at least fails).
    fn foreign_syscall_abis_are_refused(who) {
        let r = probe(who, &[], r#"
import mmap
# push rbx; mov eax, 310 (i386 unshare); mov ebx, CLONE_NEWUSER|CLONE_NEWNS; int 0x80; pop rbx; ret
code = bytes([0x53, 0xb8, 0x36, 0x01, 0, 0, 0xbb, 0, 0, 0x02, 0x10, 0xcd, 0x80, 0x5b, 0xc3])
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
pid = os.fork()
if pid == 0:
    os._exit(0 if fn() == 0 else 3)
_, st = os.waitpid(pid, 0)
done(x32=sc(0x40000000 | 272, 0x10020000),
     i386="OK" if os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0 else
          "signal %d" % os.WTERMSIG(st) if os.WIFSIGNALED(st) else "failed")"#);
        assert_result(who, &r, "x32", &["ENOSYS", "EPERM"]);
        assert_result(who, &r, "i386", &["signal 31", "failed"]);
    }

    /// The program inherits only stdin, stdout and stderr, and only the environment it was
    /// given: nothing of zygo's own environment.
    fn no_leaked_descriptors_or_environment(who) {
        let g = guard_flags();
        let mut cmd = zygo(who);
        cmd.env("ZYGO_TESTS_HOST_SECRET", "hunter2")
            .args(["run", "--json", "--env", "GIVEN=1"])
            .args(&g)
            .args(["--", "python3", "-c"])
            .arg(probe_script(r#"
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
env = dict(os.environ)
done(fds=fds, env=sorted(k for k in env if not k.startswith("ZYGO_GUARD_")),
     secret="hunter2" in open("/proc/self/environ").read())"#));
        let f = finish(cmd);
        let v: Value = serde_json::from_slice(&f.stdout).expect("json");
        assert_not_refused(who, &v, f.code);
        assert_ok(who, &v, f.code);
        let r: Value = serde_json::from_str(s(&v, "stdout").trim()).expect("probe json");
        // 0, 1, 2, and the descriptor listdir itself opened.
        let fds: Vec<u64> = r["fds"].as_array().expect("fds").iter().filter_map(Value::as_u64).collect();
        assert!(fds.len() <= 4 && fds.starts_with(&[0, 1, 2]), "[{}] leaked descriptors: {r}", who.name());
        assert_eq!(r["secret"], false, "[{}] zygo's environment leaked: {r}", who.name());
        let env: Vec<&str> = r["env"].as_array().expect("env").iter().filter_map(Value::as_str).collect();
        for k in &env {
            assert!(
                ["GIVEN", "PATH", "HOME", "LANG", "TMPDIR", "LC_CTYPE"].contains(k),
                "[{}] unexpected variable {k} in the sandbox: {env:?}", who.name()
            );
        }
        assert!(env.contains(&"GIVEN"), "[{}] --env not delivered: {env:?}", who.name());
    }
}

/// The guard itself: run on the host (not sandboxed) it refuses with exit 99 before the
/// probe's own code, and it also refuses when the host's identity was not handed to it.
#[test]
fn guard_refuses_on_the_host() {
    let h = host_ids();
    let script = format!("{GUARD}\nprint('the probe ran')\n");
    let hex: String = h.init_cmdline.iter().map(|b| format!("{b:02x}")).collect();
    let mut with_ids = Command::new("/usr/bin/python3");
    with_ids
        .arg("-c")
        .arg(&script)
        .env("ZYGO_GUARD_PID", h.pid.to_string())
        .env("ZYGO_GUARD_INIT", hex);
    for (kind, inos) in &h.ns {
        let list: Vec<String> = inos.iter().map(u64::to_string).collect();
        with_ids.env(
            format!("ZYGO_GUARD_NS_{}", kind.to_uppercase()),
            list.join(" "),
        );
    }
    let mut without_ids = Command::new("/usr/bin/python3");
    without_ids.arg("-c").arg(&script).env_clear();
    for (what, cmd) in [
        ("with the host's ids", with_ids),
        ("without them", without_ids),
    ] {
        let f = finish(cmd);
        let out = String::from_utf8_lossy(&f.stdout);
        assert_eq!(
            f.code, REFUSED_CODE,
            "the guard ran on the host {what}: {out}"
        );
        assert!(
            out.contains("REFUSED: not sandboxed") && !out.contains("the probe ran"),
            "{what}: {out}"
        );
    }
}

/// A new pseudo-terminal: (master, slave).
fn open_pty() -> (File, File) {
    // SAFETY: plain libc calls on a descriptor we own; ptsname_r writes into `name`.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        let master = File::from_raw_fd(m);
        assert!(
            libc::grantpt(m) == 0 && libc::unlockpt(m) == 0,
            "grantpt/unlockpt"
        );
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(
            libc::ptsname_r(m, name.as_mut_ptr(), name.len()),
            0,
            "ptsname_r"
        );
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        assert!(
            s >= 0,
            "open the pty's slave: {}",
            std::io::Error::last_os_error()
        );
        (master, File::from_raw_fd(s))
    }
}
