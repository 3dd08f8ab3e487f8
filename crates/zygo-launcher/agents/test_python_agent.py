"""Tests of python_agent.py against a fake launcher (docs/agent-protocol.md).

The agent runs as a real /usr/bin/python3 -I process with fd 3 and fd 4 as in the sandbox;
a temporary directory stands in for /fn and (through ZYGO_WORK_ROOT) for /work. As the
launcher does, the fake launcher here mounts a fresh tmpfs on that /work in each request
process's own mount namespace before it says `mounted` (with nsenter): run as root.

    python3 -m unittest discover -s crates/zygo-launcher/agents -p 'test_*.py'
"""

import array, codecs, select
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
AGENT = os.path.join(HERE, "python_agent.py")
BOOT = os.path.join(HERE, "python_boot.py")
PYTHON = "/usr/bin/python3"

# Put the two descriptors named by argv[1] and argv[2] at fd 3 and fd 4, set no_new_privs (as
# the sandbox's init does), then exec the rest.
WRAP = textwrap.dedent("""
    import ctypes, fcntl, os, resource, sys
    assert ctypes.CDLL(None).prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    ctl, reg, nofile = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    a = fcntl.fcntl(ctl, fcntl.F_DUPFD_CLOEXEC, 10)
    b = fcntl.fcntl(reg, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(ctl); os.close(reg)
    os.dup2(a, 3); os.dup2(b, 4)
    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    os.execv(sys.argv[4], sys.argv[4:])
""")

HANDLER = textwrap.dedent("""
    import json, os, random, subprocess, sys, time

    # What a program started at import time can see: fd 3 and fd 4 must not be there.
    LIST_FDS = ["/usr/bin/python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"]
    IMPORT_FDS = subprocess.run(LIST_FDS, close_fds=False, capture_output=True, text=True).stdout

    def handler(event):
        case = event["case"] if isinstance(event, dict) else "echo"
        if case == "echo":
            if not isinstance(event, dict) and hasattr(event, "progress"):
                event.progress(type(event).__mro__[-2].__name__)
            return {"event": event, "type": type(event).__name__, "isdict": isinstance(event, dict),
                    "same": event == json.loads(json.dumps(event))}
        if case == "output":
            print("hello")
            os.system("echo hi")
            print("oops", file=sys.stderr)
            os.system("echo err >&2")
            sys.stdout.write("no newline")
            return "done"
        if case == "progress":
            event.progress("half")
            event.progress(42)
            return 1
        if case == "raise":
            raise ValueError("bad input")
        if case == "exit":
            sys.exit(event["code"])
        if case == "interrupt":
            raise KeyboardInterrupt
        if case == "set":
            return {1, 2}
        if case == "nan":
            return float("nan")
        if case == "surrogate":
            return "\\ud800"
        if case == "random":
            return [random.random(), os.urandom(16).hex()]
        if case == "workdir":
            st = os.stat(".")
            with open("file", "w") as f:
                f.write("x")
            os.makedirs("sub/deeper")
            os.chmod("sub", 0)
            return {"cwd": os.getcwd(), "mode": stat_mode(st.st_mode)}
        if case == "fds":
            os.system("/usr/bin/python3 -c 'import os; print(sorted(os.listdir(\\"/proc/self/fd\\")))'")
            return IMPORT_FDS
        if case == "daemon":
            print("before", flush=True)
            os.system("sleep 3 &")
            return "quick"
        if case == "sleep":
            with open("file", "w") as f:
                f.write("x")
            print(os.getcwd(), flush=True)
            time.sleep(event["seconds"])
            return "slept"
        if case == "exit0":
            with open("file", "w") as f:
                f.write("x")
            print(os.getcwd(), flush=True)
            os._exit(0)
        if case == "big":
            sys.stdout.write("x" * (3 << 20))
            return len(event["case"])
        if case == "ownfds":
            kinds = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    kinds.append(os.readlink(f"/proc/self/fd/{fd}").split(":")[0])
                except OSError:
                    pass  # the directory listing itself
            return sorted(kinds)
        if case == "dumpable":
            import ctypes
            return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        if case == "peek":
            try:
                return os.readlink(f"/proc/{event['pid']}/cwd")
            except PermissionError:
                return "denied"
        if case == "utf8":
            os.write(1, "é€😀".encode()[:-1] + b"\\xff\\n")
            return None
        raise AssertionError(case)

    def stat_mode(m):
        import stat
        return oct(stat.S_IMODE(m))

    not_callable = 3
""")


class Agent:
    """One agent process and the launcher's ends of its channels."""

    def __init__(self, cleanup, source=HANDLER, func="handler", entry=None, nofile=0, files=()):
        self.tmp = tempfile.mkdtemp(prefix="zygo-agent-test-")
        cleanup(self.close)
        self.fn = os.path.join(self.tmp, "fn")
        self.work = os.path.join(self.tmp, "work")
        os.mkdir(self.fn)
        os.mkdir(self.work)
        for name, text in dict(files, **{"handler.py": source}).items():
            with open(os.path.join(self.fn, name), "w") as f:
                f.write(text)
        entry = entry or os.path.join(self.fn, "handler.py")
        self.ctl, ctl_inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.reg, reg_inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.reg.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [PYTHON, "-I", "-c", WRAP, str(ctl_inner.fileno()), str(reg_inner.fileno()), str(nofile),
             PYTHON, "-I", AGENT, entry, func],
            pass_fds=(ctl_inner.fileno(), reg_inner.fileno()), cwd=self.fn,
            env={"ZYGO_WORK_ROOT": self.work, "PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        ctl_inner.close()
        reg_inner.close()
        self.buf = b""
        self.children = []

    def close(self):
        for s in [self.ctl, self.reg] + self.children:
            s.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()
        # A request's process may still be removing its own folder (it outlives a killed
        # agent for a moment): one that is gone needs nothing.
        for top, dirs, _ in os.walk(self.tmp):
            for d in dirs:
                try:
                    os.chmod(os.path.join(top, d), 0o700)
                except FileNotFoundError:
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def send(self, data):
        self.ctl.sendall(data)

    def command(self, kind, slot):
        self.send(json.dumps({"kind": kind, "slot": slot}).encode() + b"\n")

    def line(self, timeout=5.0, heartbeats=False):
        """The next line from the agent (skipping heartbeats unless asked), or None at EOF."""
        end = time.monotonic() + timeout
        while True:
            while b"\n" not in self.buf:
                self.ctl.settimeout(max(0.01, end - time.monotonic()))
                chunk = self.ctl.recv(65536)
                if not chunk:
                    assert self.buf == b"", f"a partial line at EOF: {self.buf!r}"
                    return None
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\n", 1)
            msg = parse(raw, AGENT_SAYS)
            if heartbeats or msg != {"kind": "heartbeat"}:
                return msg

    def ready(self):
        msg = self.line()
        assert msg["kind"] == "ready", msg
        return msg

    def exit_code(self, timeout=5.0):
        return self.proc.wait(timeout)

    def log(self):
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def park(self, slot):
        """Park a child; return (registration, its pid, its request channel)."""
        self.command("park", slot)
        return self.registration()

    def registration(self):
        self.reg.settimeout(5)
        data, anc, flags, _ = self.reg.recvmsg(4096, socket.CMSG_SPACE(12) + socket.CMSG_SPACE(16))
        assert flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) == 0
        pid, fds = None, []
        for level, kind, payload in anc:
            assert level == socket.SOL_SOCKET
            if kind == socket.SCM_CREDENTIALS:
                pid, uid, gid = struct.unpack("iII", payload)
            elif kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
        assert len(fds) == 3, fds
        chan = socket.socket(fileno=fds[0])
        for fd in fds[1:]:
            assert stat.S_ISFIFO(os.fstat(fd).st_mode), "fd 1 and 2 are pipes"
            os.set_blocking(fd, False)
        PIPES[chan.fileno()] = (fds[1], fds[2])
        self.children.append(chan)
        chan.sendall(mounted(give_scratch(pid, uid, gid, self.work)))
        return json.loads(data), pid, chan

    def call(self, event, slot="s"):
        """Park a child, send it one request, return its lines."""
        _, _, chan = self.park(slot)
        request(chan, event)
        return read_child(chan)


# What the launcher accepts (crates/zygo-launcher/src/zygote.rs): kind -> {field: type}.
AGENT_SAYS = {"ready": {"pid": int}, "import_error": {"message": str, "traceback": str},
              "heartbeat": {}, "park_failed": {"slot": str, "message": str}}
CHILD_SAYS = {"progress": {"text": str}, "heartbeat": {}, "result": {"value": object},
              "error": {"message": str, "traceback": str, "exit_code": int}}

def mounted(workdir):
    return b'{"kind":"mounted","workdir":"' + workdir.encode() + b'"}\n'


def give_scratch(pid, uid, gid, work):
    """What the launcher does for each request process (crates/zygo-launcher/src/scratch.rs
    and workspace.rs): a fresh tmpfs in its own mount namespace, here on the stand-in for
    /work only, and the request's own directory in it (0700, the request's). The host's
    mounts may propagate to peers, so the copies in that namespace are made private first.
    Returns the directory's name."""
    name = os.urandom(16).hex()
    subprocess.run(["nsenter", "-t", str(pid), "-m", "--", "sh", "-c",
                    'mount --make-rprivate / && mount -t tmpfs -o mode=1777,size=16m tmpfs "$1"'
                    ' && mkdir -m 0700 "$1/$2" && chown "$3:$4" "$1/$2"',
                    "sh", work, name, str(uid), str(gid)], check=True, timeout=10)
    return name


# A child's stdout and stderr pipes (read ends, as the launcher gets them), by channel fd.
PIPES = {}
MAX_RELAY = (1 << 20) + 1  # what the launcher relays of each stream


class Relay:
    """The launcher's relay of one pipe, as crates/zygo-launcher/src/zygote.rs does it."""

    def __init__(self, fd, kind):
        self.fd, self.kind, self.sent = fd, kind, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def pump(self, lines, drain):
        while self.fd is not None:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            text = self.decoder.decode(data, final=not data)
            if not data:
                os.close(self.fd)
                self.fd = None
            text = text[:max(0, MAX_RELAY - self.sent)]
            self.sent += len(text.encode())
            if text:
                lines.append({"kind": self.kind, "data": text})
            if not drain:
                return


# Fields a line may leave out.
CHILD_MAY_OMIT = {"error": {"exit_code"}}


def parse(raw, schema):
    """One line as strictly as the launcher parses it."""
    assert len(raw) < 20 << 20, "a line over 20 MiB"
    msg = json.loads(raw.decode("utf-8"), parse_constant=lambda c: 1 / 0)
    fields = dict(schema[msg["kind"]])
    for name in CHILD_MAY_OMIT.get(msg["kind"], ()) if schema is CHILD_SAYS else ():
        if name not in msg:
            del fields[name]
    assert set(msg) == {"kind", *fields}, msg
    for name, kind in fields.items():
        assert isinstance(msg[name], kind), msg
    return msg


def request(chan, event, id="r"):
    chan.sendall(json.dumps({"kind": "request", "id": id, "event": event}).encode() + b"\n")


def read_child(chan, timeout=10.0, heartbeats=False):
    """Every line from a child up to its terminal line, with its output relayed from its
    pipes as stdout/stderr entries (all of it before the terminal line, as the launcher
    does); check that EOF follows the terminal line."""
    end = time.monotonic() + timeout
    out, err = PIPES.get(chan.fileno(), (None, None))
    relays = [Relay(fd, kind) for fd, kind in ((out, "stdout"), (err, "stderr")) if fd is not None]
    buf, lines = b"", []
    while True:
        while b"\n" not in buf:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no terminal line in time: {lines} {buf!r}")
            ready, _, _ = select.select([chan] + [r.fd for r in relays if r.fd is not None], [], [], left)
            for r in relays:
                if r.fd in ready:
                    r.pump(lines, drain=False)
            if chan in ready:
                chunk = chan.recv(1 << 20)
                if not chunk:
                    raise AssertionError(f"EOF before a terminal line: {lines} {buf!r}")
                buf += chunk
        raw, buf = buf.split(b"\n", 1)
        msg = parse(raw, CHILD_SAYS)
        if msg["kind"] in ("result", "error"):
            for r in relays:
                r.pump(lines, drain=True)
        if heartbeats or msg != {"kind": "heartbeat"}:
            lines.append(msg)
        if msg["kind"] in ("result", "error"):
            chan.settimeout(5)
            rest = buf + chan.recv(65536)
            assert rest == b"", f"bytes after the terminal line: {rest!r}"
            return lines


def output(lines, kind):
    return "".join(m["data"] for m in lines if m["kind"] == kind)


def can_ptrace():
    with open("/proc/self/status") as f:
        caps = [int(line.split()[1], 16) for line in f if line.startswith("CapEff:")][0]
    return bool(caps & (1 << 19))  # CAP_SYS_PTRACE


def wait_until(check, timeout=5.0):
    """Whether `check()` becomes true within the timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return check()


def gone(pid, timeout=5.0):
    """Whether the process disappears (is reaped) within the timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.02)
    return False


class Startup(unittest.TestCase):
    def test_ready_first_and_once(self):
        a = Agent(self.addCleanup)
        msg = a.line(heartbeats=True)
        self.assertEqual(msg, {"kind": "ready", "pid": a.proc.pid})
        end = time.monotonic() + 1.3
        while time.monotonic() < end:
            self.assertEqual(a.line(heartbeats=True), {"kind": "heartbeat"})
        a.ctl.shutdown(socket.SHUT_WR)
        self.assertEqual(a.exit_code(), 0)

    def import_error(self, **kw):
        a = Agent(self.addCleanup, **kw)
        msg = a.line(heartbeats=True)
        self.assertEqual(msg["kind"], "import_error", msg)
        self.assertEqual(set(msg), {"kind", "message", "traceback"})
        self.assertEqual(a.exit_code(), 1)
        self.assertIsNone(a.line(timeout=1))
        return msg

    def test_missing_file(self):
        msg = self.import_error(entry="/nonexistent/x.py")
        self.assertEqual(msg["message"], "cannot import /nonexistent/x.py: FileNotFoundError: "
                         "[Errno 2] No such file or directory: '/nonexistent/x.py'")

    def test_syntax_error(self):
        msg = self.import_error(source="def handler(:\n    pass\n")
        self.assertIn("SyntaxError", msg["message"])
        self.assertIn("def handler(:", msg["traceback"])
        self.assertNotIn("python_agent.py", msg["traceback"])

    def test_missing_module(self):
        msg = self.import_error(source="import no_such_module_zygo\ndef handler(e): pass\n")
        self.assertTrue(msg["message"].startswith("cannot import /"), msg)
        self.assertTrue(msg["message"].endswith(
            "handler.py: ModuleNotFoundError: No module named 'no_such_module_zygo'"), msg)
        self.assertIn("import no_such_module_zygo", msg["traceback"])

    def test_exception_at_import(self):
        msg = self.import_error(source="raise RuntimeError('boom')\n")
        self.assertTrue(msg["message"].endswith("RuntimeError: boom"), msg)
        self.assertIn("raise RuntimeError('boom')", msg["traceback"])
        msg = self.import_error(source="import sys\nsys.exit(0)\n")
        self.assertTrue(msg["message"].endswith("SystemExit: 0"), msg)

    def test_missing_function(self):
        msg = self.import_error(func="nope")
        self.assertTrue(msg["message"].endswith("handler.py has no function 'nope'"), msg)
        self.assertEqual(msg["traceback"], "")
        msg = self.import_error(func="not_callable")
        self.assertIn("'not_callable', but it is a int, not a function", msg["message"])

    def test_handler_dir_on_path(self):
        a = Agent(self.addCleanup, source="import helper\ndef handler(e):\n    return helper.X\n",
                  files={"helper.py": "X = 7\n"})
        a.ready()
        lines = a.call(None)
        self.assertEqual(lines[-1], {"kind": "result", "value": 7})


class Requests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.agent = Agent(cls.addClassCleanup)
        cls.agent.ready()
        cls.n = 0

    def call(self, event, **kw):
        type(self).n += 1
        return self.agent.call(event, slot=f"slot-{self.n}", **kw)

    def test_registration(self):
        msg, pid, chan = self.agent.park("reg_1")
        self.assertEqual(msg, {"kind": "register", "slot": "reg_1"})
        with open(f"/proc/{pid}/status") as f:
            ppid = [line.split()[1] for line in f if line.startswith("PPid:")][0]
        self.assertEqual(int(ppid), self.agent.proc.pid)
        self.assertEqual(chan.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE), socket.SOCK_STREAM)
        chan.sendall(b'{"kind":"request","id":"x","event":[1]}\n')
        self.assertEqual(read_child(chan)[-1]["value"]["event"], [1])
        self.assertTrue(gone(pid))

    def test_result(self):
        lines = self.call({"case": "echo", "x": [1, "é"]})
        self.assertEqual(lines, [{"kind": "result", "value": {
            "event": {"case": "echo", "x": [1, "é"]}, "type": "Event", "isdict": True, "same": True}}])
        # Every event that Python can give a method to has event.progress, and is still
        # the value sent (equal to it, the same JSON back); None, True and False come as
        # they are.
        for event, name, progress in (
                ([1, 2], "EventList", "list"), ("s", "EventStr", "str"), (7, "EventInt", "int"),
                (1.5, "EventFloat", "float"), ([], "EventList", "list"), ("", "EventStr", "str"),
                (None, "NoneType", None), (True, "bool", None), (False, "bool", None)):
            lines = self.call(event)
            self.assertEqual(lines[-1]["value"],
                             {"event": event, "type": name, "isdict": False, "same": True}, event)
            said = [m["text"] for m in lines if m["kind"] == "progress"]
            self.assertEqual(said, [progress] if progress else [], event)

    def test_output(self):
        lines = self.call({"case": "output"})
        self.assertEqual(lines[-1], {"kind": "result", "value": "done"})
        self.assertEqual(output(lines, "stdout"), "hello\nhi\nno newline")
        self.assertEqual(output(lines, "stderr"), "oops\nerr\n")
        self.assertEqual({m["kind"] for m in lines[:-1]}, {"stdout", "stderr"})

    def test_output_utf8_and_cap(self):
        lines = self.call({"case": "utf8"})
        self.assertEqual(output(lines, "stdout"), "é€\ufffd\ufffd\n")
        lines = self.call({"case": "big"})
        self.assertEqual(lines[-1], {"kind": "result", "value": 3})
        # one byte past the 1 MiB cap is relayed, so the launcher can flag the cut
        self.assertEqual(output(lines, "stdout"), "x" * ((1 << 20) + 1))

    def test_progress(self):
        lines = self.call({"case": "progress"})
        self.assertEqual(lines, [{"kind": "progress", "text": "half"}, {"kind": "progress", "text": "42"},
                                 {"kind": "result", "value": 1}])

    def test_exception(self):
        lines = self.call({"case": "raise"})
        self.assertEqual(len(lines), 1)
        self.assertEqual(lines[0]["kind"], "error")
        self.assertEqual(lines[0]["message"], "ValueError: bad input")
        tb = lines[0]["traceback"]
        self.assertIn('raise ValueError("bad input")', tb)
        self.assertIn("handler.py", tb)
        self.assertNotIn("python_agent.py", tb)

    def test_exit_and_interrupt(self):
        lines = self.call({"case": "exit", "code": 0})
        self.assertEqual(lines, [{"kind": "result", "value": None}])
        lines = self.call({"case": "exit", "code": None})
        self.assertEqual(lines, [{"kind": "result", "value": None}])
        # Exited: the code the process would have exited with, on the error line.
        lines = self.call({"case": "exit", "code": 3})
        self.assertEqual(lines[-1]["message"], "SystemExit: 3")
        self.assertEqual(lines[-1]["exit_code"], 3)
        lines = self.call({"case": "exit", "code": "a message"})
        self.assertEqual(lines[-1]["exit_code"], 1)
        lines = self.call({"case": "exit", "code": -1})
        self.assertEqual(lines[-1]["exit_code"], 255)
        lines = self.call({"case": "interrupt"})
        self.assertEqual(lines[-1]["message"], "KeyboardInterrupt")
        # Raised, not exited: no exit_code.
        self.assertNotIn("exit_code", self.call({"case": "raise"})[-1])

    def test_not_serialisable(self):
        lines = self.call({"case": "set"})
        self.assertEqual(lines, [{"kind": "error", "traceback": "", "message":
                                  "result is not JSON-serialisable: Object of type set is not JSON serializable"}])
        for case in ("nan", "surrogate"):
            lines = self.call({"case": case})
            self.assertEqual(lines[-1]["kind"], "error")
            self.assertTrue(lines[-1]["message"].startswith("result is not JSON-serialisable: "), lines)

    def test_random_differs(self):
        a, b = self.call({"case": "random"}), self.call({"case": "random"})
        ra, rb = a[-1]["value"], b[-1]["value"]
        self.assertNotEqual(ra[0], rb[0])
        self.assertNotEqual(ra[1], rb[1])

    def test_workdir_is_the_requests_own(self):
        slot = f"slot-w{self.n}"
        lines = self.agent.call({"case": "workdir"}, slot=slot)
        path = lines[-1]["value"]["cwd"]
        self.assertEqual(os.path.dirname(path), self.agent.work)
        self.assertRegex(os.path.basename(path), r"^[0-9a-f]{32}$")
        self.assertEqual(lines[-1], {"kind": "result", "value": {"cwd": path, "mode": "0o700"}})
        # It lived on the request's own mount: nothing of it ever reached the agent's /work.
        self.assertEqual(os.listdir(self.agent.work), [])
        lines = self.agent.call({"case": "workdir"}, slot=f"{slot}-again")
        self.assertNotEqual(lines[-1]["value"]["cwd"], path)

    def test_a_killed_child_leaves_nothing_behind(self):
        _, pid, chan = self.agent.park("killed")
        request(chan, {"case": "sleep", "seconds": 30})
        out, _ = PIPES[chan.fileno()]
        select.select([out], [], [], 5)
        path = os.read(out, 65536).decode().split("\n")[0].strip()
        self.assertEqual(os.path.dirname(path), self.agent.work)
        self.assertFalse(os.path.exists(path))  # not in our namespace, only in its own
        os.kill(pid, 9)
        self.assertTrue(gone(pid))
        self.assertEqual(os.listdir(self.agent.work), [])
        # and the slot's name is free again
        self.agent.call(None, slot="killed")

    def test_line_split_across_writes(self):
        self.agent.send(b'{"kind":"pa')
        time.sleep(0.1)
        self.agent.send(b'rk","slot":"split"}')
        time.sleep(0.1)
        self.agent.send(b'\n')
        self.assertEqual(self.agent.registration()[0], {"kind": "register", "slot": "split"})

    def test_unused_child_exits_and_leaves_nothing(self):
        before = set(os.listdir(self.agent.work))
        _, pid, chan = self.agent.park("unused")
        # What the launcher does with a slot it drops unused: it closes the channel.
        chan.close()
        self.assertTrue(gone(pid))
        self.assertEqual(set(os.listdir(self.agent.work)), before)

    def test_reap_is_not_a_control_line(self):
        a = Agent(self.addCleanup)
        a.ready()
        a.command("reap", "one")
        self.assertIsNone(a.line())  # a protocol violation ends the agent

    def test_no_descriptor_leaks(self):
        lines = self.call({"case": "fds"})
        self.assertEqual(output(lines, "stdout"), "['0', '1', '2', '3']\n")
        self.assertEqual(lines[-1]["value"], "['0', '1', '2', '3']\n")

    def test_non_dumpable(self):
        lines = self.call({"case": "dumpable"})
        self.assertEqual(lines[-1], {"kind": "result", "value": 0})

    @unittest.skipIf(can_ptrace(), "with CAP_SYS_PTRACE we may read any process's /proc entries")
    def test_neighbours_unreachable_through_proc(self):
        _, pid, _ = self.agent.park("neighbour")
        lines = self.call({"case": "peek", "pid": pid})
        self.assertEqual(lines[-1], {"kind": "result", "value": "denied"})

    def test_nothing_of_the_neighbours_nor_of_the_agent_inherited(self):
        self.agent.park("neighbour-1")
        self.agent.park("neighbour-2")
        lines = self.call({"case": "ownfds"})
        # fd 0 (/dev/null), fd 1 and fd 2 (pipes to the launcher), our channel: no copy of
        # the agent's own stderr (a temp file here, the launcher's pipe in a sandbox).
        self.assertEqual(lines[-1]["value"], ["/dev/null", "pipe", "pipe", "socket"])

    def test_daemon_holding_the_pipe(self):
        start = time.monotonic()
        lines = self.call({"case": "daemon"})
        self.assertLess(time.monotonic() - start, 0.7)
        self.assertEqual(output(lines, "stdout"), "before\n")
        self.assertEqual(lines[-1], {"kind": "result", "value": "quick"})

    def test_heartbeats(self):
        _, _, chan = self.agent.park("beats")
        request(chan, {"case": "sleep", "seconds": 2.5})
        # the agent's heartbeats meanwhile
        start = last = time.monotonic()
        gaps = []
        while time.monotonic() - start < 2.4:
            self.assertEqual(self.agent.line(heartbeats=True), {"kind": "heartbeat"})
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        self.assertGreaterEqual(len(gaps), 2)
        self.assertTrue(all(g < 1.3 for g in gaps), gaps)
        lines = read_child(chan, heartbeats=True)
        self.assertIn(lines.count({"kind": "heartbeat"}), (2, 3))
        self.assertEqual(lines[-1], {"kind": "result", "value": "slept"})

    def test_hostile_requests(self):
        bad = [
            b'{"kind":"request","id":"x","event":1,"extra":1}\n',
            b'{"kind":"request","id":"x","event":1,"workdir":"../../../../tmp/zygo-escape"}\n',
            b'{"kind":"request","id":7,"event":1}\n',
            b'{"kind":"request","id":null,"event":1}\n',
            b'{"kind":"request","id":"x"}\n',
            b'{"kind":"result","id":"x","event":1}\n',
            b'{"kind":"request","id":"x","event":NaN}\n',
            b'{"kind":"request","id":"x","event":{"a":1,"a":2}}\n',
            b'{"kind":"request","id":"\xff","event":1}\n',
            b'{"kind":"request","id":"x","event":1}\n{}\n',
            b'{"kind":"request","id":"x","event":1}',  # then EOF
            b'{"kind":"request","id":"x","event":1',
            b'[1]\n',
            b'\n',
        ]
        pids = []
        for i, line in enumerate(bad):
            _, pid, chan = self.agent.park(f"bad-{i}")
            chan.sendall(line)
            chan.shutdown(socket.SHUT_WR)
            chan.settimeout(5)
            self.assertEqual(chan.recv(65536), b"", line)
            pids.append(pid)
        for pid in pids:
            self.assertTrue(gone(pid))
        self.assertFalse(os.path.exists("/tmp/zygo-escape"))
        log = self.agent.log()
        for pid in pids:
            self.assertIn(f"request process {pid} exited with status 2", log)

    def test_huge_request(self):
        _, pid, chan = self.agent.park("huge")
        try:
            chan.sendall(b"[" * ((20 << 20) + 100))
        except OSError:
            pass
        chan.settimeout(5)
        self.assertEqual(chan.recv(65536), b"")
        self.assertTrue(gone(pid))


class Hostile(unittest.TestCase):
    def assert_fails(self, data, close=False):
        a = Agent(self.addCleanup)
        a.ready()
        try:
            a.send(data)
            if close:
                a.ctl.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # it may stop reading a huge line early
        self.assertEqual(a.exit_code(), 2, data[:100])
        self.assertIn("protocol violation", a.log())
        self.assertIsNone(a.line(timeout=2))

    def test_hostile_control_lines(self):
        cases = [
            b'{"kind":"bogus","slot":"a"}\n',
            b'{"kind":"park","slot":"a","extra":1}\n',
            b'{"kind":"park"}\n',
            b'{"slot":"a"}\n',
            b'{"kind":"park","slot":1}\n',
            b'{"kind":"park","slot":null}\n',
            b'{"kind":["park"],"slot":"a"}\n',
            b'["park","a"]\n',
            b'"park"\n',
            b'not json\n',
            b'\n',
            b'{"kind":"park","slot":"\xff"}\n',
            b'{"kind":"park","slot":""}\n',
            b'{"kind":"park","slot":"a/b"}\n',
            b'{"kind":"park","slot":"a\\n"}\n',
            b'{"kind":"park","slot":"%s"}\n' % (b"a" * 65),
            b'{"kind":"park","slot":"a","slot":"b"}\n',
            b'{"kind":"park","slot":"a"}\n{"kind":"park","slot":"a"}\n',
            b"x" * ((1 << 20) + 10),
        ]
        for data in cases:
            with self.subTest(data=data[:80]):
                self.assert_fails(data)

    def test_partial_line_at_close(self):
        self.assert_fails(b'{"kind":"park","slot":"a"}', close=True)

    def test_park_failed(self):
        # The agent's own descriptors are 0-4, and the Landlock ruleset where the kernel has
        # Landlock; a fork in progress needs four more (the child's stdout and stderr pipes).
        # With room for three, no child can be forked, and each park is refused, not lost.
        own = 5 + (1 if landlock_available() else 0)
        a = Agent(self.addCleanup, source="def handler(e):\n    return e\n", nofile=own + 3)
        a.ready()
        for slot in ("one", "two"):
            a.command("park", slot)
            msg = a.line()
            self.assertEqual(msg["kind"], "park_failed", msg)
            self.assertEqual(msg["slot"], slot)
            self.assertIn("Too many open files", msg["message"])


class Boot(unittest.TestCase):
    """python_boot.py runs a program as __main__, compiled in a fork."""

    def run_boot(self, source, *args):
        tmp = tempfile.mkdtemp(prefix="zygo-boot-test-")
        self.addCleanup(shutil.rmtree, tmp)
        prog = os.path.join(tmp, "prog.py")
        with open(prog, "w") as f:
            f.write(textwrap.dedent(source))
        done = subprocess.run(["/usr/bin/python3", "-I", BOOT, prog, *args],
                              capture_output=True, text=True, timeout=30)
        return prog, done

    def test_runs_the_program_as_main(self):
        prog, done = self.run_boot("""
            import json, sys
            def f():
                return 1
            print(json.dumps([__name__, __file__, sys.argv, sys.modules["__main__"].__file__,
                              globals() is sys.modules["__main__"].__dict__,
                              f.__code__.co_filename, __doc__]))
            """, "a", "--b")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(json.loads(done.stdout),
                         ["__main__", prog, [prog, "a", "--b"], prog, True, prog, None])

    def test_errors_point_at_the_program(self):
        prog, done = self.run_boot("""
            import sys
            def fail():
                raise RuntimeError("boom")
            if __name__ == "__main__":
                fail()
            """)
        self.assertEqual(done.returncode, 1)
        self.assertIn(f'File "{prog}", line 4, in fail', done.stderr)
        self.assertIn("RuntimeError: boom", done.stderr)

    def test_a_syntax_error_is_reported(self):
        prog, done = self.run_boot("def (:\n")
        self.assertEqual(done.returncode, 1)
        self.assertIn("SyntaxError", done.stderr)
        self.assertIn(prog, done.stderr)

    def test_no_program(self):
        done = subprocess.run(["/usr/bin/python3", "-I", BOOT], capture_output=True, text=True,
                              timeout=30)
        self.assertEqual(done.returncode, 2)
        self.assertIn("usage", done.stderr)

    def test_the_compiler_leaves_nothing_behind(self):
        # A program of the agent's size: compiled in this process it would leave ~2 MB of
        # freed scratch memory resident; compiled in the fork, only its code comes back.
        body = "".join(f"def f{i}(a, b):\n    return [a, b, {i}, '{i}' * 3, {{'k': a}}]\n"
                       for i in range(1500))
        _, done = self.run_boot(body + textwrap.dedent("""
            with open("/proc/self/status") as f:
                print(next(l.split()[1] for l in f if l.startswith("RssAnon:")))
            """))
        self.assertEqual(done.returncode, 0, done.stderr)
        booted = int(done.stdout)
        tmp = tempfile.mkdtemp(prefix="zygo-boot-test-")
        self.addCleanup(shutil.rmtree, tmp)
        prog = os.path.join(tmp, "direct.py")
        with open(prog, "w") as f:
            f.write(body + "with open('/proc/self/status') as f:\n"
                    "    print(next(l.split()[1] for l in f if l.startswith('RssAnon:')))\n")
        direct = int(subprocess.run(["/usr/bin/python3", "-I", prog], capture_output=True,
                                    text=True, timeout=30).stdout)
        self.assertLess(booted + 1024, direct, (booted, direct))


def landlock_available():
    """Whether this kernel offers Landlock (landlock_create_ruleset's version query)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1)) > 0


if __name__ == "__main__":
    unittest.main()


def agent_module():
    """python_agent.py imported as a module (its main() runs only as __main__)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("python_agent_under_test", AGENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Codec(unittest.TestCase):
    """The agent's JSON (from _json, without the json package) and its name checks agree
    with the standard library and with the patterns the protocol gives."""

    @classmethod
    def setUpClass(cls):
        cls.a = agent_module()

    def test_dumps_matches_json(self):
        values = [None, True, 0, -7, 2 ** 70, 1.5, -0.0, 1e300, "", "é\u2028\"\\\n\t\x00",
                  [], {}, {"b": [1, {"c": None}], "a": "x"}, {1: 2, 2.5: 3, None: 4, True: 5},
                  ("t", "u"), [[[[]]]], "\U0001f600"]
        for v in values:
            with self.subTest(v=v):
                self.assertEqual(self.a.dumps(v), json.dumps(v, ensure_ascii=False,
                                                             allow_nan=False))

    def test_dumps_refuses_what_json_refuses(self):
        loop = []
        loop.append(loop)
        for v, exc in [(float("nan"), ValueError), (float("inf"), ValueError),
                       ({(1, 2): 3}, TypeError), (object(), TypeError), ({1, 2}, TypeError),
                       (b"bytes", TypeError), (loop, ValueError)]:
            with self.subTest(v=type(v).__name__):
                with self.assertRaises(exc) as got:
                    self.a.dumps(v)
                with self.assertRaises(exc) as want:
                    json.dumps(v, ensure_ascii=False, allow_nan=False)
                self.assertEqual(str(got.exception), str(want.exception))
        # A failed encoding leaves nothing behind for the next one.
        self.assertEqual(self.a.dumps([1]), "[1]")

    def test_loads_matches_json(self):
        texts = ['{"a": [1, 2.5, -3e2, true, false, null, "x\\u00e9\\ud83d\\ude00"]}',
                 ' \t\r\n{"a":{"b":{}}} \n', '"s"', '0', '[]', '-0.0', '12345678901234567890']
        for t in texts:
            with self.subTest(t=t):
                self.assertEqual(self.a.loads(t), json.loads(t))

    def test_loads_refuses(self):
        bad = ['', ' ', 'NaN', 'Infinity', '-Infinity', '[NaN]', '{"a":1,"a":2}',
               '{"a":{"b":1,"b":1}}', '{"a":1} x', '{"a":1}{}', '"\x01"', "{'a':1}",
               '[1,]', '{"a"}', '\ufeff{}', '01', '[' * 100000, '{"a":' * 100000]
        for t in bad:
            with self.subTest(t=t[:20]):
                with self.assertRaises((ValueError, RecursionError, self.a.Violation)):
                    self.a.loads(t)

    def test_names(self):
        a = self.a
        for s in ["a", "A-z_09", "x" * 64]:
            self.assertTrue(a.is_slot(s), s)
            self.assertTrue(a.is_slot(s.encode()), s)
        for s in ["", "x" * 65, "a/b", "a b", "a\n", "é", "a.b", "\x00", 7, None]:
            self.assertFalse(a.is_slot(s), s)
            if type(s) is str:
                self.assertFalse(a.is_slot(s.encode()), s)
        good = "/run/script/" + "ab" * 32
        self.assertTrue(a.is_script(good))
        for p in [good + "0", good[:-1], good.upper(), "/run/scripts" + "a" * 64,
                  "/run/script/../" + "a" * 61, None, 1, good.encode()]:
            self.assertFalse(a.is_script(p), p)


class NodeCheck(unittest.TestCase):
    """What check_node makes of a failed Node import whose last stderr line is hostile."""

    def check(self, last_line):
        with tempfile.TemporaryDirectory() as d:
            fake, last = os.path.join(d, "fake_node.sh"), os.path.join(d, "last_line")
            with open(last, "w") as f:
                f.write(last_line + "\n")
            with open(fake, "w") as f:
                f.write(f"echo 'some output' >&2\ncat {last} >&2\nexit 1\n")
            r, w = os.pipe()
            # The agent's control channel (where import_error goes) is the pipe's write end.
            prog = textwrap.dedent(f"""
                import importlib.util
                spec = importlib.util.spec_from_file_location("a", {AGENT!r})
                a = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(a)
                a.CTL, a.NODE, a.NODE_AGENT = {w}, "/bin/sh", {fake!r}
                a.check_node("/fn/x.mjs", "")
            """)
            with tempfile.TemporaryFile() as err:
                try:
                    p = subprocess.Popen([PYTHON, "-I", "-c", prog], env={},
                                         pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=err)
                finally:
                    os.close(w)
                with os.fdopen(r, "rb") as f:
                    line = f.read()  # until the process exits: it may say more than a pipe holds
                code = p.wait(timeout=60)
                err.seek(0)
                return code, json.loads(line), err.read()

    def test_hostile_last_lines(self):
        for last in ['{"message":"a","message":"b"}', '{"message": NaN}', "[" * 100000,
                     "not json", '{"message": 1}', '"just a string"']:
            with self.subTest(last=last[:30]):
                code, told, err = self.check(last)
                self.assertEqual(code, 1, err)
                self.assertEqual(told["kind"], "import_error", told)
                self.assertIsInstance(told["message"], str)

    def test_the_agents_own_line(self):
        code, told, _ = self.check('{"message": "cannot import x: boom", "traceback": "tb"}')
        self.assertEqual(code, 1)
        self.assertEqual((told["message"], told["traceback"]), ("cannot import x: boom", "tb"))

    def test_a_long_message_and_traceback_are_cut(self):
        a = agent_module()
        line = json.dumps({"message": "m" * (a.MAX_MESSAGE + 10),
                           "traceback": "t" * a.MAX_TRACEBACK + "end"})
        code, told, _ = self.check(line)
        self.assertEqual(code, 1)
        self.assertEqual(told["message"], "m" * a.MAX_MESSAGE)
        self.assertEqual(len(told["traceback"]), a.MAX_TRACEBACK)
        self.assertTrue(told["traceback"].endswith("tttend"))


NODE = "/usr/bin/node"
NODE_AGENT = os.path.join(HERE, "node_agent.mjs")


@unittest.skipUnless(os.access(NODE, os.X_OK), "no /usr/bin/node")
class NodeErrors(unittest.TestCase):
    """What the Node agent writes of an error: at most as much of the message (its start) and
    of the stack (its end) as the Python agent, in characters, a surrogate pair never split,
    a lone surrogate written as "?": text the launcher takes."""

    def check(self, throw):
        with tempfile.TemporaryDirectory() as d:
            entry = os.path.join(d, "handler.mjs")
            with open(entry, "w") as f:
                f.write(throw + "\nexport default () => 0;\n")
            r = subprocess.run([NODE, NODE_AGENT, "--check", entry, ""], capture_output=True,
                               timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr[-2000:])
            line = r.stderr.decode("utf-8").strip().splitlines()[-1]
            self.assertNotIn("\\ud", line.lower(), "a surrogate escaped")
            return json.loads(line)

    def test_a_long_message_keeps_its_start(self):
        a = agent_module()
        told = self.check('throw new Error("\\u{1F600}" + "é".repeat(70000) + "x".repeat(70000));')
        want = "cannot import "
        self.assertTrue(told["message"].startswith(want), told["message"][:100])
        self.assertEqual(len(told["message"]), a.MAX_MESSAGE)
        self.assertIn("Error: \U0001f600éé", told["message"])

    def test_a_long_stack_keeps_its_end(self):
        a = agent_module()
        told = self.check("const e = new Error('boom'); e.stack = 'top\\n' + 'f'.repeat(1 << 21) + "
                          "'\\u{1F600}' + 'last frame'; throw e;")
        self.assertEqual(len(told["traceback"]), a.MAX_TRACEBACK)
        self.assertTrue(told["traceback"].endswith("f\U0001f600last frame"))
        # Cut inside a surrogate pair: its other half is not left alone.
        told = self.check("const e = new Error('boom'); e.stack = '\\u{1F600}'.repeat(1 << 20) + 'x'; "
                          "throw e;")
        self.assertEqual(told["traceback"], "\U0001f600" * ((1 << 20) - 1) + "x")

    def test_lone_surrogates_and_unprintable_errors(self):
        told = self.check('throw new Error("a\\ud800b\\udc00c");')
        self.assertIn("Error: a?b?c", told["message"])
        told = self.check("throw { toString() { throw new Error('no'); } };")
        self.assertTrue(told["message"].endswith(": <unprintable>"), told["message"])

