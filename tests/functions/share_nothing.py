"""Handlers for tests/tests/requests_share_nothing.rs: each tries, as a hostile request
would, to reach the host or another request through what a process of a warm zygote may
hold or leave behind, and reports what it found."""

import ctypes, errno, os, socket, stat, time

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.posix_fallocate.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_long]

IPC_PRIVATE, IPC_CREAT = 0, 0o1000


def _name(n):
    return errno.errorcode.get(n, str(n))


def _try(f):
    try:
        f()
        return "OK"
    except OSError as e:
        return _name(e.errno)


def _kind(mode):
    for test, name in ((stat.S_ISREG, "reg"), (stat.S_ISDIR, "dir"), (stat.S_ISCHR, "chr"),
                       (stat.S_ISBLK, "blk"), (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "sock")):
        if test(mode):
            return name
    return "other"


def descriptors(event):
    """Every descriptor this process holds, what it is, and what writing a marker,
    truncating, growing by 64 MB and reopening it read-write did. Sockets are left alone
    (one is the request channel); fd 1 and 2 are the output pipes."""
    marker = (event.get("marker", "FORGED") + "\n").encode()
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            st = os.fstat(fd)
        except OSError:
            continue  # the listing's own descriptor, closed by now
        d = {"fd": fd, "target": target, "kind": _kind(st.st_mode)}
        if d["kind"] != "sock":
            d["write"] = _try(lambda: os.write(fd, marker))
            d["truncate"] = _try(lambda: os.ftruncate(fd, 0))

            def grow():
                r = libc.posix_fallocate(fd, 0, 64 << 20)
                if r:
                    raise OSError(r, os.strerror(r))
            d["fallocate"] = _try(grow)

            def reopen():
                os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
            d["reopen"] = _try(reopen)
        found.append(d)
    return sorted(found, key=lambda d: d["fd"])


def _sysvipc():
    out = {}
    for k in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{k}") as f:
            out[k] = f.read().splitlines()[1:]
    return out


def ipc(event):
    """Make a shared-memory segment (touched, `mb` MB), a semaphore set, a message queue
    and a POSIX message queue, hold them `hold` seconds, return; report what System V IPC
    this process saw before it made anything."""
    r = {"seen_before": _sysvipc()}
    size = event.get("mb", 1) << 20
    shmid = libc.shmget(IPC_PRIVATE, size, IPC_CREAT | 0o666)
    if shmid < 0:
        r["shmget"] = _name(ctypes.get_errno())
    else:
        addr = libc.shmat(shmid, None, 0)
        ctypes.memset(addr, 1, size)
        libc.shmdt(addr)
    r["semget"] = libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o666)
    r["msgget"] = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o666)
    r["mq_open"] = libc.mq_open(b"/zygo-share-nothing", os.O_CREAT | os.O_RDWR, 0o600, None)
    r["seen_after"] = _sysvipc()
    time.sleep(event.get("hold", 0))
    return r


def tmp(event):
    """What this request finds in /tmp and /work, then leave things there: a file, a unix
    socket (held `hold` seconds), a symlink, and with `fill` a /tmp filled to ENOSPC."""
    r = {
        "uid": os.getuid(),
        "tmp_before": sorted(os.listdir("/tmp")),
        "work_before": sorted(os.listdir("/work")),
        "tmp_mode": oct(stat.S_IMODE(os.stat("/tmp").st_mode)),
        "shm_before": sorted(os.listdir("/dev/shm")),
    }
    with open("/tmp/result.txt", "w") as f:
        f.write(event.get("token", ""))
    with open("/dev/shm/zygo-shared-segment", "w") as f:
        f.write(event.get("token", ""))
    r["file_mode"] = oct(stat.S_IMODE(os.stat("/tmp/result.txt").st_mode))
    os.symlink("/etc/passwd", "/tmp/planted")
    if "connect" in event:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        r["connect"] = _try(lambda: s.connect("/tmp/zygo-share-nothing.sock"))
    if event.get("fill"):
        try:
            with open("/tmp/fill", "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
        except OSError as e:
            r["fill"] = _name(e.errno)
    if event.get("hold"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind("/tmp/zygo-share-nothing.sock")
        s.listen(1)
        s.settimeout(event["hold"])
        r["accepted"] = _try(lambda: s.accept())
    return r


# Drawn once per zygote: the handler's module is imported by each zygote's agent, and every
# request's process is a fork of that agent.
ZYGOTE = os.urandom(8).hex()


def uid(event):
    """This process's uid, and which zygote served it."""
    return [ZYGOTE, os.getuid()]


def inotify(event):
    """Open inotify instances until refused (at most `max`), hold them `hold` seconds."""
    fds, err = [], None
    while len(fds) < event.get("max", 1000):
        fd = libc.inotify_init1(0)
        if fd < 0:
            err = _name(ctypes.get_errno())
            break
        fds.append(fd)
    time.sleep(event.get("hold", 0))
    return {"opened": len(fds), "refused": err}


def neighbours(event):
    """Try to change the limits, CPUs and priority of another process of the sandbox (the
    agent, this request's parent), and this process's own (which must work)."""
    import resource
    other = os.getppid()
    r = {}
    r["prlimit_other"] = _try(lambda: resource.prlimit(other, resource.RLIMIT_NOFILE, (32, 32)))
    r["affinity_other"] = _try(lambda: os.sched_setaffinity(other, {0}))
    r["nice_other"] = _try(lambda: os.setpriority(os.PRIO_PROCESS, other, 19))
    r["nice_user"] = _try(lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    r["prlimit_self"] = _try(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft // 2, hard)))
    r["affinity_self"] = _try(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    r["nice_self"] = _try(lambda: os.setpriority(os.PRIO_PROCESS, 0, min(19, mine + 1)))
    return r
