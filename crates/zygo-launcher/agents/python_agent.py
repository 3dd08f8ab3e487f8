"""Zygo's Python agent: import a handler once, then serve each request in a fresh fork.

Run inside the sandbox as `/usr/bin/python3 -I /run/zygo/python_agent.py ENTRY_FILE FUNC`
with fd 3 (control channel) and fd 4 (registration); docs/agent-protocol.md is the contract.

Trusts: the launcher, and only after checking each of its lines strictly (a violation ends
the agent with status 2, so the zygote is replaced). Nothing from the handler. Its code runs
in this process (at import) and in every child, so it could subvert all of this: the agent
serves handlers, it is not a security boundary; the launcher treats all we send as hostile.

Guarantees, to a handler that does not sabotage it:
- fd 3 and fd 4 are close-on-exec, and a child closes both before it reads its request;
  nothing else of ours leaks into the handler's programs either. Processes are
  non-dumpable, so another request (same uid and pid namespace) cannot reach them
  through /proc.
- Each request runs once, in its own fork of the imported handler, in a new /work/<name>
  (0700; 32 random hex digits) that reap removes, with `random` reseeded and fd 1 and fd 2
  captured, subprocesses included (up to 1 MiB per stream; output still flowing after the
  handler returned is dropped). The agent process never sees a request, an event or a
  live directory name, so a fork inherits nothing of its neighbours'.
- A request channel carries stdout, stderr, progress and heartbeat lines, then exactly one
  terminal line (result or error), then the child exits. Lines never interleave, and each
  is one UTF-8 JSON object under 20 MiB. The control channel carries ready (or
  import_error) first and once, then heartbeat at least every second, and park_failed.
"""

import array, codecs, importlib.machinery, importlib.util, json, os, random, re
import select, shutil, signal, socket, stat, struct, sys, threading, time, traceback

WORK_ROOT = os.environ.get("ZYGO_WORK_ROOT", "/work")  # set only by the tests
CTL, REG = 3, 4
MAX_CONTROL_LINE, MAX_REQUEST_LINE = 1 << 20, 20 << 20  # launcher -> agent, -> child
MAX_LINE_OUT = 20 << 20  # child -> launcher, newline included
MAX_RELAY = 1 << 20  # bytes relayed per output stream; the rest is read and dropped
# (one byte more is relayed, so the launcher's own 1 MiB cap sees that output was cut)
MAX_PROGRESS, MAX_MESSAGE, MAX_TRACEBACK = 64 << 10, 64 << 10, 1 << 20  # characters
DRAIN_LIMIT = 1.0  # seconds to relay output still flowing after the handler returned
SLOT, WORKDIR = re.compile(r"[A-Za-z0-9_-]{1,64}"), re.compile(r"[0-9a-f]{32}")
CONTROL = {"park": {"kind", "slot"}, "reap": {"kind", "slot"}}
REQUEST = {"request": {"kind", "id", "event"}}
POOL_REQUEST = {"request": {"kind", "id", "event", "script"}}  # a runtime pool's
SCRIPT = re.compile(r"/run/script/[0-9a-f]{64}")


class Violation(Exception):
    """The launcher broke the protocol."""


def _pairs(pairs):
    if len({k for k, _ in pairs}) != len(pairs):
        raise Violation("a duplicate key")
    return dict(pairs)


def _constant(name):
    raise Violation(f"{name} is not JSON")


def strict(line, schema):
    """Parse one line: a JSON object whose kind is in `schema`, with exactly its fields."""
    try:
        obj = json.loads(line.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise Violation(f"not a JSON line: {e}") from None
    kind = obj.get("kind") if type(obj) is dict else None
    if type(kind) is not str or schema.get(kind) != set(obj):
        raise Violation(f"not a known kind with its fields: {line[:200]!r}")
    return obj


def encode(obj):
    """One line; lone surrogates, which UTF-8 cannot carry, become '?'."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n"
    return text.encode("utf-8", "replace")


LOG_FD = 2  # the agent's own stderr (the supervisor's log); a child keeps a copy of it


def complain(text):
    try:
        os.write(LOG_FD, f"python_agent[{os.getpid()}]: {text}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def describe(e):
    try:
        text = str(e)
    except Exception:
        text = "<unprintable>"
    return (f"{type(e).__name__}: {text}" if text else type(e).__name__)[:MAX_MESSAGE]


def format_tb(e):
    """The traceback, without its leading frames from this file and from importlib."""
    tb, ours = e.__traceback__, (__file__, "<frozen importlib._bootstrap>",
                                 "<frozen importlib._bootstrap_external>")
    while tb and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))[-MAX_TRACEBACK:]


def flush(*streams):
    for s in streams:
        try:
            s.flush()
        except BaseException:
            pass


def die(code):
    flush(sys.stdout, sys.stderr)
    os._exit(code)


# --- The agent --------------------------------------------------------------------------


def tell(obj):
    """One line to the launcher on the control channel."""
    data = encode(obj)
    try:
        while data:
            data = data[os.write(CTL, data):]
    except OSError:
        die(0)  # the launcher has gone


def import_handler(entry, name):
    """(function, None, None), or (None, message, traceback) saying why not."""
    try:
        loader = importlib.machinery.SourceFileLoader("handler_module", entry)
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location("handler_module", entry, loader=loader))
        sys.modules["handler_module"] = module
        loader.exec_module(module)
        func = getattr(module, name, None)
    except BaseException as e:
        return None, f"cannot import {entry}: {describe(e)}", format_tb(e)
    if callable(func):
        return func, None, None
    what = "no function" if func is None else f"a {type(func).__name__}, not a function, as"
    return None, f"{entry} has {what} {name!r}", ""


def load(entry, name):
    """The handler function; or an import_error line, and exit."""
    for d in ("/fn", os.path.dirname(os.path.abspath(entry))):
        if d not in sys.path:
            sys.path.insert(0, d)
    func, message, tb = import_handler(entry, name)
    if func is None:
        tell({"kind": "import_error", "message": message, "traceback": tb})
        die(1)
    return func


class Pool:
    """A runtime pool: no handler of its own; each request names a script that defines
    `handler(event)`, loaded by the request's own process."""


class ExecPool:
    """Warm-exec: each request runs the command with the script's path as its last argument
    and the event (JSON) on stdin; its value is {"exit_code": 0}."""

    def __init__(self, argv):
        self.argv = argv


def no_dump():
    """PR_SET_DUMPABLE 0: without CAP_SYS_PTRACE no other process may open our /proc/<pid>
    fd, cwd, mem or environ. Forks inherit it; exec resets it."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except Exception as e:
        complain(f"cannot make the agent non-dumpable: {e}")


def serve(func):
    slots = {}  # slot -> read end of the pipe on which its child named its workdir
    buf = bytearray()
    poller = select.poll()
    poller.register(CTL, select.POLLIN)
    beat = time.monotonic() + 1.0
    while True:
        reap_children()
        if time.monotonic() >= beat:
            tell({"kind": "heartbeat"})
            beat = time.monotonic() + 1.0
        if not poller.poll(max(0, int((beat - time.monotonic()) * 1000) + 1)):
            continue
        try:
            data = os.read(CTL, 65536)
        except OSError:
            data = b""
        try:
            if not data:
                if buf:
                    raise Violation("the channel closed mid-line")
                die(0)
            buf += data
            while (nl := buf.find(b"\n")) >= 0:
                line = bytes(buf[:nl])
                del buf[:nl + 1]
                if len(line) > MAX_CONTROL_LINE:
                    raise Violation("a line over 1 MiB")
                handle(strict(line, CONTROL), slots, func)
            if len(buf) > MAX_CONTROL_LINE:
                raise Violation("a line over 1 MiB")
        except Violation as e:
            complain(f"protocol violation on the control channel: {e}")
            die(2)


def handle(msg, slots, func):
    """One launcher line. Each slot's workdir name is chosen in its fresh fork, before any
    handler code runs there, and sent back on a private pipe that the agent reads only on
    reap: the agent never holds a live name, so no later fork inherits a neighbour's."""
    slot = msg["slot"]
    if type(slot) is not str or not SLOT.fullmatch(slot):
        raise Violation("a bad slot")
    if msg["kind"] == "reap":
        named = slots.pop(slot, None)
        if named is not None:
            os.set_blocking(named, False)
            try:
                name = os.read(named, 64).decode("ascii", "replace")
            except OSError:
                name = ""  # the child never got as far as naming it
            os.close(named)
            if WORKDIR.fullmatch(name):
                remove(os.path.join(WORK_ROOT, name))
        return
    if slot in slots:
        raise Violation(f"slot {slot} parked twice")
    flush(sys.stdout, sys.stderr)  # or the child would print it again
    try:
        named, tell_name = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(named)
            os.close(tell_name)
            raise
    except OSError as e:
        tell({"kind": "park_failed", "slot": slot, "message": f"cannot fork: {e}"})
        return
    if pid == 0:
        child(slot, tell_name, [named, *slots.values()], func)
    os.close(tell_name)
    slots[slot] = named


def reap_children():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
            complain(f"request process {pid} exited with status {os.WEXITSTATUS(status)}")


def remove(path):
    """rmtree, after making each directory in it ours to empty (a handler may have chmod-ed
    one to 0, and we have no CAP_DAC_OVERRIDE). Symbolic links are never followed."""
    def unlock(p):
        try:
            if stat.S_ISDIR(os.lstat(p).st_mode):
                os.chmod(p, 0o700)
        except OSError:
            pass
    unlock(path)
    for top, dirs, _ in os.walk(path):
        for d in dirs:
            unlock(os.path.join(top, d))
    shutil.rmtree(path, ignore_errors=True)


# --- A request process ------------------------------------------------------------------


def child(slot, tell_name, inherited, func):
    """Register, wait for one request, serve it, exit. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in [CTL, *inherited]:  # other slots' workdir names are not ours to read
            os.close(fd)
        workdir = os.urandom(16).hex()  # told before it exists, so reap always finds it
        os.write(tell_name, workdir.encode())
        os.close(tell_name)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reg = socket.socket(fileno=REG)
        creds = struct.pack("iII", os.getpid(), os.getuid(), os.getgid())
        reg.sendmsg([json.dumps({"kind": "register", "slot": slot}).encode()],
                    [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds),
                     (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))])
        theirs.close()
        reg.close()
        if isinstance(func, NodeSpare):
            exec_node(func, mine, workdir)
        channel = Channel(mine)
        prepared = prepare(channel, workdir)  # everything not tied to the request, now
        request = read_request(mine)
    except Violation as e:
        complain(f"protocol violation on the request channel: {e}")
        os._exit(2)
    except BaseException as e:
        complain(f"a parked child failed: {describe(e)}")
        os._exit(1)
    try:
        run(prepared, request, func)
    except BaseException as e:
        try:
            channel.send({"kind": "error", "message": f"the agent failed: {describe(e)}",
                          "traceback": format_tb(e)}, last=True)
        finally:
            os._exit(1)


def _peek_keys(buf):
    """The top-level keys of a request line (strict() validates it properly after)."""
    try:
        obj = json.loads(bytes(buf).decode("utf-8"))
    except ValueError:
        return set()
    return set(obj) if type(obj) is dict else set()


def read_request(sock):
    buf = bytearray()
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            if buf:
                raise Violation("the channel closed mid-line")
            os._exit(0)  # the launcher dropped this slot unused
        nl = chunk.find(b"\n")
        buf += chunk if nl < 0 else chunk[:nl]
        if len(buf) > MAX_REQUEST_LINE:
            raise Violation("a line over 20 MiB")
        if nl >= 0:
            if nl + 1 < len(chunk):
                raise Violation("more than one line")
            break
    request = strict(bytes(buf), POOL_REQUEST if "script" in _peek_keys(buf) else REQUEST)
    if "script" in request and (type(request["script"]) is not str
                                or not SCRIPT.fullmatch(request["script"])):
        raise Violation("a bad script path")
    if type(request["id"]) is not str:
        raise Violation("id is not a string")
    return request


class Channel:
    """The request channel: whole lines, one writer at a time, nothing after the last."""

    def __init__(self, sock):
        self.sock, self.lock, self.over, self.pid = sock, threading.Lock(), False, os.getpid()

    def send(self, obj, data=None, last=False):
        data = encode(obj) if data is None else data
        with self.lock:
            if self.over or os.getpid() != self.pid:  # done, or in a fork of the handler's
                return
            self.over = last
            try:
                self.sock.sendall(data)
            except OSError:
                os._exit(1)  # the launcher has gone


_channel = None


class Event(dict):
    """The request's event, when it is a JSON object."""

    def progress(self, text):
        """Tell the caller how the request is going."""
        _channel.send({"kind": "progress", "text": str(text)[:MAX_PROGRESS]})


def relay(fd, kind, channel, wake):
    """Send what arrives on the pipe at `fd` as `kind` lines, until EOF or, once the handler
    has returned (`wake` readable), until the pipe is empty: a daemon the handler started
    may hold the pipe open, and what it writes later is not this request's."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    left = MAX_RELAY + 1
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(wake, select.POLLIN)
    while True:
        ready = {f for f, _ in poller.poll()}
        if fd not in ready:
            break  # woken, and nothing is left to read
        data = os.read(fd, 65536)
        if not data:
            break
        text = decoder.decode(data[:left])
        left -= min(left, len(data))
        if text:
            channel.send({"kind": kind, "data": text})
    text = decoder.decode(b"", final=True)
    if text and left:
        channel.send({"kind": kind, "data": text})


def beat(channel, started, finishing):
    started.wait()
    while not finishing.wait(1.0):
        channel.send({"kind": "heartbeat"})


class Prepared:
    """A parked child's setup, done before its request exists (off the request path)."""

    def __init__(self, channel, started, finishing, wake_w, threads, ours):
        self.channel, self.started, self.finishing = channel, started, finishing
        self.wake_w, self.threads, self.ours = wake_w, threads, ours


def prepare(channel, workdir):
    """The child's own /work directory (made its working directory), `random` reseeded,
    fd 1 and fd 2 turned into pipes with their relays running, and the paths a request
    takes touched once, so the request itself copies few pages."""
    path = os.path.join(WORK_ROOT, workdir)
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700)  # whatever the umask
    os.chdir(path)
    random.seed()
    global LOG_FD
    LOG_FD = os.dup(2)  # close-on-exec: complaints go to the log, never to the handler's stderr
    started, finishing = threading.Event(), threading.Event()
    wake_r, wake_w = os.pipe()
    threads = [threading.Thread(target=beat, args=(channel, started, finishing), daemon=True)]
    for fd, kind in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        threads.append(threading.Thread(target=relay, args=(r, kind, channel, wake_r), daemon=True))
    for t in threads:
        t.start()
    ours = [open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
            for fd in (1, 2)]
    sys.stdout, sys.stderr = ours
    encode(json.loads('{"kind": "result", "value": [1, "x", {"y": null}]}'))
    import gc
    gc.freeze()  # collections during the request leave the pages shared with the agent alone
    return Prepared(channel, started, finishing, wake_w, threads, ours)


def run(p, request, func):
    global _channel
    _channel = p.channel
    p.started.set()
    event = Event(request["event"]) if type(request["event"]) is dict else request["event"]
    try:
        if isinstance(func, (Pool, ExecPool)) != ("script" in request):
            raise RuntimeError("a pool's request names a script; a function's does not")
        if isinstance(func, ExecPool):
            terminal = exec_script(func, request["script"], request["event"])
        else:
            if isinstance(func, Pool):
                func, message, tb = import_handler(request["script"], "handler")
                if func is None:
                    raise ScriptError(message, tb)
            terminal = result(func(event))
    except ScriptError as e:
        terminal = error(e.message, e.tb)
    except SystemExit as e:
        terminal = result(None) if e.code in (None, 0) else error(describe(e), format_tb(e))
    except BaseException as e:
        terminal = error(describe(e), format_tb(e))
    # What the handler wrote is in the pipes: relay it all, then the terminal line.
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    flush(sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, *p.ours)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    p.finishing.set()
    os.write(p.wake_w, b"x")
    deadline = time.monotonic() + DRAIN_LIMIT
    for t in p.threads:
        t.join(max(0.0, deadline - time.monotonic()))
    p.channel.send(None, terminal, last=True)
    os._exit(0)


class ScriptError(Exception):
    def __init__(self, message, tb):
        super().__init__(message)
        self.message, self.tb = message, tb


def exec_script(pool, script, event):
    """Warm-exec: the command, the script as its last argument, the event on stdin; its
    output goes to our fd 1 and 2 (relayed)."""
    import subprocess
    try:
        done = subprocess.run([*pool.argv, script], input=json.dumps(event).encode(),
                              stdout=1, stderr=2, close_fds=True)
    except OSError as e:
        return error(f"cannot start {pool.argv[0]}: {describe(e)}", "")
    if done.returncode == 0:
        return result({"exit_code": 0})
    how = (f"was killed by signal {-done.returncode}" if done.returncode < 0
           else f"exited with status {done.returncode}")
    return error(f"{pool.argv[0]} {how}", "")


def result(value):
    """The terminal line for a returned value."""
    try:
        text = json.dumps({"kind": "result", "value": value}, ensure_ascii=False, allow_nan=False)
        data = (text + "\n").encode("utf-8")
    except BaseException as e:
        return error(f"result is not JSON-serialisable: {e}"[:MAX_MESSAGE], "")
    if len(data) > MAX_LINE_OUT:
        return error(f"result is too large: {len(data)} bytes of JSON (the limit is 20 MiB)", "")
    return data


def error(message, tb):
    return encode({"kind": "error", "message": message, "traceback": tb})


NODE, NODE_AGENT = "/usr/bin/node", "/run/zygo/node_agent.mjs"


class NodeSpare:
    """In place of a Python handler: each child execs a Node spare that imports the
    handler and serves the one request (Node itself cannot fork)."""

    def __init__(self, entry, name):
        self.entry, self.name = entry, name


def check_node(entry, name):
    """Import the Node handler once, in a throwaway process, so that an import error is
    reported before `ready` as it is for Python."""
    import subprocess
    try:
        r = subprocess.run([NODE, NODE_AGENT, "--check", entry, name], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
        if r.returncode == 0:
            return NodeSpare(entry, name)
        lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
        try:
            why = json.loads(lines[-1])
            message, tb = str(why["message"]), str(why.get("traceback", ""))
        except (ValueError, KeyError, IndexError, TypeError):
            message, tb = f"cannot import {entry}: node exited with status {r.returncode}", "\n".join(lines[-50:])
    except (OSError, subprocess.SubprocessError) as e:
        message, tb = f"cannot start node to import {entry}: {describe(e)}", ""
    tell({"kind": "import_error", "message": message, "traceback": tb})
    die(1)


def exec_node(spare, mine, workdir):
    """The child becomes a Node spare: request channel on fd 3; fd 1 and 2 are pipes whose
    read ends are fd 4 and 5, relayed by the spare itself."""
    import fcntl
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # Move everything above the targets first, so no dup2 clobbers a source not yet moved.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (mine.fileno(), out_r, err_r, out_w, err_w)]
    for src, dst in zip(high, (3, 4, 5, 1, 2)):
        os.dup2(src, dst, inheritable=True)
    os.closerange(6, 1 << 16)
    os.execv(NODE, [NODE, NODE_AGENT, spare.entry, spare.name, workdir])


def main(argv):
    mode = "python"
    if len(argv) == 4 and argv[1] == "--node":
        argv, mode = [argv[0], argv[2], argv[3]], "node"
    elif len(argv) == 2 and argv[1] == "--pool":
        mode = "pool"
    elif len(argv) >= 3 and argv[1] == "--exec":
        mode = "exec"
    elif len(argv) != 3:
        complain("usage: python_agent.py [--node] ENTRY_FILE FUNC | --pool | --exec CMD...")
        die(2)
    try:
        for fd in (CTL, REG):
            os.set_inheritable(fd, False)
            os.set_blocking(fd, True)
    except OSError as e:
        complain(f"fd 3 and fd 4 must be the agent's channels: {e}")
        die(2)
    if mode == "node":
        func = check_node(argv[1], argv[2])
    elif mode == "pool":
        func = Pool()
    elif mode == "exec":
        func = ExecPool(argv[2:])
    else:
        func = load(argv[1], argv[2])
    import gc
    gc.freeze()  # what import made stays put: forks copy fewer pages
    no_dump()
    tell({"kind": "ready", "pid": os.getpid()})
    serve(func)


if __name__ == "__main__":
    main(sys.argv)
