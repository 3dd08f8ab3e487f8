"""Handlers for tests/tests/functions.rs: each function here is the entry of one [fn.*]
table of a sandbox.toml that the tests write into a temporary directory (this file is
copied next to it, and the sandbox sees that folder as /fn)."""

import ctypes, errno, glob, json, os, random, signal, sys, time

CLONE_NEWNS = 0x00020000


def hello(event):
    print("hello on stdout")
    print("hello on stderr", file=sys.stderr)
    return {"echo": event, "cwd": os.getcwd()}


def stream(event):
    for i in range(3):
        print(f"out {i}", flush=True)
        event.progress(f"step {i}")
        time.sleep(0.1)
    return {"steps": 3}


def boom(event):
    """Raise, unless the event says {"fail": false}."""
    print("about to fail")
    print("a warning first", file=sys.stderr)
    if isinstance(event, dict) and event.get("fail") is False:
        return "did not fail"
    raise ValueError("kaboom from the handler")


def unserialisable(event):
    return {"a set": {1, 2, 3}}


def garbage(event):
    """Write a line that is not the protocol on this request's own channel."""
    import __main__
    __main__._channel.sock.sendall(b"this is not a JSON line\n")
    time.sleep(1)
    return "should not get here"


def nap(event):
    secs = event.get("secs", 1) if isinstance(event, dict) else 1
    time.sleep(secs)
    return {"slept": secs}


def hog(event):
    """Allocate (and touch) event["bytes"] bytes, 1 GiB by default."""
    n = event.get("bytes", 1 << 30) if isinstance(event, dict) else 1 << 30
    b = bytearray(n)
    return len(b)


def selfstop(event):
    os.kill(os.getpid(), signal.SIGSTOP)
    return "resumed"


def close_stdout(event):
    print("before closing", flush=True)
    sys.stdout.close()
    os.close(1)
    return "closed"


def daemon(event):
    """Leave a daemon behind (double fork, new session) that holds stdout and stderr open;
    its command line carries the test's marker."""
    marker = event["marker"]
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c",
                                          "import time\nwhile True: time.sleep(1)", marker])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    seen = False
    deadline = time.monotonic() + 3
    while not seen and time.monotonic() < deadline:
        for p in os.listdir("/proc"):
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    seen = seen or marker.encode() in f.read()
            except OSError:
                pass
        time.sleep(0.05)
    print("daemon started", flush=True)
    return {"daemon_seen": seen}


def stubborn(event):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(30)
    return "outlived its deadline"


def big(event):
    """Sleep event["secs"], then return a string of event["n"] characters and the event's
    own length."""
    n = event.get("n", 0) if isinstance(event, dict) else 0
    time.sleep(event.get("secs", 0) if isinstance(event, dict) else 0)
    return {"event_len": len(json.dumps(event)), "big": "x" * n}


def _ename(n):
    return errno.errorcode.get(n, str(n))


def work(event):
    """One pool, three roles: "secret" writes a secret and waits, "snoop" looks for it,
    "stat" says whether a path exists."""
    role = event["role"]
    if role == "secret":
        return work_secret(event)
    if role == "snoop":
        return work_snoop(event)
    return {"exists": os.path.lexists(event["path"])}


def work_secret(event):
    """Write a secret into this request's own /work directory and wait."""
    with open("secret.txt", "w") as f:
        f.write(event["token"])
    time.sleep(event.get("secs", 2))
    with open("secret.txt") as f:
        still = f.read() == event["token"]
    return {"cwd": os.getcwd(), "still_there": still}


def work_snoop(event):
    """Look for another request's /work directory and the secret in it, everywhere a
    neighbour could show: /work itself, /proc/<pid>/{cwd,root,environ,fd}, /tmp."""
    token = event["token"]
    me = os.getpid()
    r = {"cwd": os.getcwd()}
    st = os.stat("/work")
    r["work_mode"] = oct(st.st_mode & 0o7777)
    r["cwd_mode"] = oct(os.stat(".").st_mode & 0o7777)
    try:
        r["listdir_work"] = sorted(os.listdir("/work"))
    except OSError as e:
        r["listdir_work"] = _ename(e.errno)
    r["glob_work"] = glob.glob("/work/*") + glob.glob("/work/.*")
    leaks = []
    neighbours = 0
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        neighbours += 1
        for link in ("cwd", "root"):
            try:
                t = os.readlink(f"/proc/{p}/{link}")
                if t.startswith("/work/") and t != os.getcwd():
                    leaks.append(f"/proc/{p}/{link} -> {t}")
            except OSError:
                pass
        for path in (f"/proc/{p}/cwd/secret.txt", f"/proc/{p}/root/work",
                     f"/proc/{p}/environ"):
            try:
                if os.path.isdir(path):
                    leaks.append(f"listed {path}: {os.listdir(path)}")
                else:
                    with open(path, "rb") as f:
                        if token.encode() in f.read():
                            leaks.append(f"read the token from {path}")
            except OSError:
                pass
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                t = os.readlink(f"/proc/{p}/fd/{fd}")
                if t.startswith("/work/"):
                    leaks.append(f"/proc/{p}/fd/{fd} -> {t}")
        except OSError:
            pass
    for top in ("/tmp", "/work"):
        for d, _, files in os.walk(top):
            for name in files:
                try:
                    with open(os.path.join(d, name), "rb") as f:
                        if token.encode() in f.read():
                            leaks.append(f"read the token from {d}/{name}")
                except OSError:
                    pass
    # Signals reach nothing outside this request (pid 1, the agent, a neighbour), whether
    # or not /proc shows it: every pid a small pid namespace has used so far is tried.
    signalled = []
    for pid in range(1, 4096):
        if pid == me:
            continue
        try:
            os.kill(pid, 0)
            signalled.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass
    r["neighbours"] = neighbours
    r["signalled"] = signalled
    r["leaks"] = leaks
    return r


def isolation(event):
    """unshare(CLONE_NEWNS) in this request process and in a child it forks; and values
    drawn from random and os.urandom."""
    libc = ctypes.CDLL(None, use_errno=True)

    def try_unshare():
        ctypes.set_errno(0)
        rc = libc.unshare(CLONE_NEWNS)
        return "OK" if rc == 0 else _ename(ctypes.get_errno())

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.write(w, json.dumps({"unshare": try_unshare(),
                                    "random": random.random(),
                                    "urandom": os.urandom(16).hex()}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.waitpid(pid, 0)
    return {
        "self_unshare": try_unshare(),
        "child": json.loads(data),
        "random": random.random(),
        "getrandbits": random.getrandbits(64),
        "urandom": os.urandom(16).hex(),
    }


def chatty(event):
    """Write event["out"] bytes to stdout (in 64 KiB lines) and a little to stderr."""
    n = event.get("out", 3 << 20) if isinstance(event, dict) else 3 << 20
    line = "y" * 65535 + "\n"
    while n > 0:
        sys.stdout.write(line[:n])
        n -= len(line)
    sys.stdout.flush()
    print("small", file=sys.stderr)
    return "chatted"
