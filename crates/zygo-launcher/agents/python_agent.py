"""Zygo's Python agent: import a handler once, then serve each request in a fresh fork.

Run inside the sandbox as `/usr/bin/python3 -I /run/zygo/python_agent.py ENTRY_FILE FUNC`
with fd 3 (control channel) and fd 4 (registration); docs/agent-protocol.md is the contract.

Trusts: the launcher, and only after checking each of its lines strictly (a violation ends
the agent with status 2, so the zygote is replaced). Nothing from the handler. Its code runs
in this process (at import) and in every child, so it could subvert all of this: the agent
serves handlers, it is not a security boundary; the launcher treats all we send as hostile.

Guarantees, to a handler that does not sabotage it:
- fd 3 and fd 4 are close-on-exec, and a child closes both before it reads its request;
  nothing else of ours leaks into the handler's programs either: the agent's own stdout
  and stderr are a pipe the launcher reads (never a host file), and a child closes its copy
  before the request's code runs. Each request's process enters a Landlock domain of its
  own before its request arrives, so no other request (same uid or not) can see it in
  /proc, trace it or signal it, even after it execs.
- Each request runs once, in its own fork of the imported handler, with an IPC namespace
  and a mount namespace of its own: its System V and POSIX IPC objects, its /tmp and its
  /work (fresh tmpfs mounts the launcher places from outside) are seen by no other request
  and are gone when its last process is. It starts in a new /work/<name> (0700; 32 random
  hex digits) with umask 077, `random` reseeded, and fd 1 and fd 2 pipes whose read ends
  the launcher holds (so subprocesses' output is captured too, and no thread of ours
  relays it). The agent process never sees a request or an event, so a fork inherits
  nothing of its neighbours'.
- A request channel carries progress and heartbeat lines (one a second, from a timer),
  then exactly one terminal line (result or error), then the child exits. Everything the
  handler wrote is in the pipes before the terminal line is sent. Lines never interleave,
  and each is one UTF-8 JSON object under 20 MiB. The control channel carries ready (or
  import_error) first and once, then heartbeat at least every second, and park_failed.
"""

import _json, _signal, _socket, _thread, gc, os, select, stat, struct, sys, time
import _frozen_importlib as _bootstrap, _frozen_importlib_external as _bootstrap_external
# Every module imported here is memory each zygote holds for as long as it lives, and pages
# that every request's fork maps at its start and unmaps at its exit. So the C modules
# _json, _socket and _signal stand in for json, socket and signal (json alone brings re,
# enum, functools and collections: about 1 MB); importlib.machinery's loader classes are
# taken from the import system that is already loaded; traceback and shutil are imported
# where they are needed (an error, a cleanup).

WORK_ROOT = os.environ.get("ZYGO_WORK_ROOT", "/work")  # set only by the tests
WORK_PREFIX = WORK_ROOT + "/"
CTL, REG = 3, 4
MAX_CONTROL_LINE, MAX_REQUEST_LINE = 1 << 20, 20 << 20  # launcher -> agent, -> child
MAX_LINE_OUT = 20 << 20  # child -> launcher, newline included
MAX_PROGRESS, MAX_MESSAGE, MAX_TRACEBACK = 64 << 10, 64 << 10, 1 << 20  # characters
CONTROL = {"park": {"kind", "slot"}}
# A control line exactly as the launcher writes one (compact JSON) is read without the JSON
# machinery, which would copy pages in a process that forks after most lines. Any other
# line, valid or not, goes through strict().
PARK_HEAD, PARK_TAIL = b'{"kind":"park","slot":"', b'"}'
# Lines written often, made once here rather than each time (in a child, which would copy
# more pages).
REGISTER_HEAD, REGISTER_TAIL = b'{"kind":"register","slot":"', b'"}'
THREE_FDS = struct.Struct("3i")
HEARTBEAT = b'{"kind": "heartbeat"}\n'
REQUEST = {"request": {"kind", "id", "event"}}
POOL_REQUEST = {"request": {"kind", "id", "event", "script"}}  # a runtime pool's
SCRIPT_DIR = "/run/script/"
SLOT_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
SLOT_CHARS_B = SLOT_CHARS.encode()
HEX = "0123456789abcdef"
HEX_B = HEX.encode()
# The launcher's first line to a parked child: its own /tmp and /work are in place, and the
# name of its own directory in /work, which the launcher made (0700, ours): always
# MOUNTED_HEAD, 32 lowercase hex digits, MOUNTED_TAIL.
MOUNTED_HEAD, MOUNTED_TAIL = b'{"kind":"mounted","workdir":"', b'"}\n'
MOUNTED_LEN = len(MOUNTED_HEAD) + 32 + len(MOUNTED_TAIL)


def is_slot(s):
    """[A-Za-z0-9_-]{1,64}, as str or bytes (strip leaves whatever is not in the set)."""
    if type(s) is str:
        return 0 < len(s) <= 64 and not s.strip(SLOT_CHARS)
    return type(s) is bytes and 0 < len(s) <= 64 and not s.strip(SLOT_CHARS_B)


def is_script(path):
    """/run/script/ and a SHA-256 in lowercase hex."""
    return (type(path) is str and len(path) == len(SCRIPT_DIR) + 64
            and path.startswith(SCRIPT_DIR) and not path[len(SCRIPT_DIR):].strip(HEX))


class Violation(Exception):
    """The launcher broke the protocol."""


def _pairs(pairs):
    if len({k for k, _ in pairs}) != len(pairs):
        raise Violation("a duplicate key")
    return dict(pairs)


def _constant(name):
    raise Violation(f"{name} is not JSON")


class _ScanOptions:
    """What the C scanner reads from json.JSONDecoder: strict strings (no control
    characters), duplicate keys and NaN/Infinity refused."""

    def __init__(self):
        self.strict, self.object_hook, self.object_pairs_hook = True, None, _pairs
        self.parse_float, self.parse_int, self.parse_constant = float, int, _constant


_scan = _json.make_scanner(_ScanOptions())
JSON_SPACE = " \t\n\r"


def loads(text):
    """json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant), from the C
    scanner that json.loads itself uses. Errors are ValueErrors (or RecursionError)."""
    start = len(text) - len(text.lstrip(JSON_SPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration as e:
        raise ValueError(f"Expecting value: char {e.value}") from None
    if end != len(text) and text[end:].strip(JSON_SPACE):
        raise ValueError(f"Extra data: char {end}")
    return obj


def _not_json(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def dumps(obj):
    """json.dumps(obj, ensure_ascii=False, allow_nan=False): the C encoder json.dumps itself
    uses, with the same separators and errors (a fresh one each time, as json.dumps makes:
    its circular-reference markers must start empty)."""
    encoder = _json.make_encoder({}, _not_json, _json.encode_basestring, None, ": ", ", ",
                                 False, False, False)
    return "".join(encoder(obj, 0))


def strict(line, schema):
    """Parse one line: a JSON object whose kind is in `schema`, with exactly its fields."""
    try:
        obj = loads(line.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise Violation(f"not a JSON line: {e}") from None
    kind = obj.get("kind") if type(obj) is dict else None
    if type(kind) is not str or schema.get(kind) != set(obj):
        raise Violation(f"not a known kind with its fields: {line[:200]!r}")
    return obj


def encode(obj):
    """One line; lone surrogates, which UTF-8 cannot carry, become '?'."""
    return (dumps(obj) + "\n").encode("utf-8", "replace")


# The agent's own stderr: a pipe the launcher reads, caps and logs. A child keeps a copy of
# it until its request arrives (None from then on: nothing of it is left to the request).
LOG_FD = 2


def complain(text):
    if LOG_FD is None:
        return
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
    boot = getattr(sys.modules.get("python_boot"), "__file__", None)
    tb, ours = e.__traceback__, (__file__, boot, "<frozen importlib._bootstrap>",
                                 "<frozen importlib._bootstrap_external>")
    while tb and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    import traceback
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


def tell(obj, data=None):
    """One line to the launcher on the control channel: `obj`, or `data` already encoded."""
    data = encode(obj) if data is None else data
    try:
        while data:
            data = data[os.write(CTL, data):]
    except OSError:
        die(0)  # the launcher has gone


class ForkCompilingLoader(_bootstrap_external.SourceFileLoader):
    """Compiles in a throwaway fork (python_boot.py says why), where the agent was started
    through python_boot.py; here otherwise."""

    def source_to_code(self, data, path, *, _optimize=-1):
        boot = sys.modules.get("python_boot")
        if boot is None:
            return super().source_to_code(data, path, _optimize=_optimize)
        return boot.compile_in_fork(data, path)


def import_handler(entry, name, in_agent=False):
    """(function, None, None), or (None, message, traceback) saying why not. In the agent
    the entry module is compiled in a fork: the agent is what every request's fork copies."""
    try:
        loader = (ForkCompilingLoader if in_agent else _bootstrap_external.SourceFileLoader)(
            "handler_module", entry)
        spec = _bootstrap.ModuleSpec("handler_module", loader, origin=entry)
        spec.has_location = True
        module = type(sys)("handler_module")
        module.__spec__, module.__loader__, module.__file__ = spec, loader, entry
        sys.modules["handler_module"] = module
        loader.exec_module(module)
        func = getattr(module, name, None)
    except BaseException as e:
        return None, f"cannot import {entry}: {describe(e)}", format_tb(e)
    if callable(func):
        return func, None, None
    if func is None:
        return None, f"{entry} has no function {name!r}", ""
    return None, f"{entry} has {name!r}, but it is a {type(func).__name__}, not a function", ""


def load(entry, name):
    """The handler function; or an import_error line, and exit."""
    for d in ("/fn", os.path.dirname(os.path.abspath(entry))):
        if d not in sys.path:
            sys.path.insert(0, d)
    func, message, tb = import_handler(entry, name, in_agent=True)
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


# The C functions a child calls, made once in the agent (see no_dump): syscall(2),
# unshare(2) and capset(2); and the C long their arguments are passed as.
SYSCALL = UNSHARE = CAPSET = CLong = None


def c_functions(*names):
    """The C library's functions `names` as ctypes.CDLL(None, use_errno=True) gives them
    with restype c_long (errno saved for _ctypes.get_errno()), and c_long itself. Built from
    _ctypes, the C half of ctypes: the ctypes package (its types, its loader classes) would
    add ~200 KB to every zygote, and so to every request's fork."""
    import _ctypes

    class c_long(_ctypes._SimpleCData):  # a direct subclass: results come back as int
        _type_ = "l"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_long

    libc = _ctypes.dlopen(None)
    return [Function(_ctypes.dlsym(libc, n)) for n in names], c_long


def c_errno():
    import _ctypes
    return _ctypes.get_errno()


def no_dump():
    """PR_SET_DUMPABLE 0: without CAP_SYS_PTRACE no other process may open our /proc/<pid>
    fd, cwd, mem or environ. Forks inherit it; exec resets it. Also creates the Landlock
    ruleset each request's domain is made from."""
    global SYSCALL, UNSHARE, CAPSET, CLong, LANDLOCK_RULESET, RESTRICT_SELF
    try:
        (SYSCALL, UNSHARE, CAPSET, prctl), CLong = c_functions(
            "syscall", "unshare", "capset", "prctl")
    except Exception as e:
        LANDLOCK_RULESET = OSError(0, f"cannot call the C library: {describe(e)}")
        complain(f"cannot make the agent non-dumpable: {describe(e)}")
        return
    LANDLOCK_RULESET = landlock_ruleset()
    RESTRICT_SELF = CLong(SYS_LANDLOCK_RESTRICT_SELF)
    if prctl(CLong(4), CLong(0), CLong(0), CLong(0), CLong(0)) != 0:
        complain(f"cannot make the agent non-dumpable: {os.strerror(c_errno())}")


# A Landlock domain of the request's own (struct landlock_ruleset_attr: handled_access_fs,
# handled_access_net, scoped). Landlock lets a process reach another through ptrace or
# /proc/<pid> only when that one is in its own domain or one nested in it, so sibling
# domains are invisible to each other under /proc's hidepid=invisible whatever their uid,
# even after exec. Scoped (Landlock ABI 6): no signals to, and no abstract unix sockets of,
# processes outside the domain. The only file right handled, making block devices, is one
# nobody in a sandbox has anyway: a domain needs at least one handled right.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446
LANDLOCK_ACCESS_FS_MAKE_BLOCK = 1 << 11
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL = 1, 2
NO_LANDLOCK = (38, 95)  # ENOSYS, EOPNOTSUPP: the kernel has no Landlock (zygo version says)


# The ruleset every request's domain is made from, created once in the agent (see
# no_dump): a child only restricts itself with it. None where the kernel has no Landlock;
# an OSError if creating it failed (then no child may run).
LANDLOCK_RULESET = None
RESTRICT_SELF = None  # the system call's number as a C long (syscall(2) reads a long)


def landlock_ruleset():
    """A ruleset file descriptor, None without Landlock, or the OSError that stopped it."""
    attrs = (struct.pack("QQQ", LANDLOCK_ACCESS_FS_MAKE_BLOCK, 0,
                         LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL),
             struct.pack("QQ", LANDLOCK_ACCESS_FS_MAKE_BLOCK, 0))  # before ABI 6
    err = 0
    for a in attrs:
        fd = SYSCALL(CLong(SYS_LANDLOCK_CREATE_RULESET), a, CLong(len(a)), CLong(0))
        if fd >= 0:
            return fd
        err = c_errno()
        if err in NO_LANDLOCK:
            return None
    return OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")


# unshare(2) flags: a request's own mount namespace (the launcher mounts its /tmp and /work
# there) and IPC namespace (System V objects and POSIX message queues: whatever the request
# makes is seen by no other request and destroyed with the namespace, when its last process
# exits). The agent holds CAP_SYS_ADMIN in the sandbox's user namespace for this alone; the
# sandbox's seccomp filter lets unshare(2) through with no other flags, and Landlock forbids
# every mount, so the capability reaches little else (docs/security.md).
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
# capset(2): version 3 header for this process, and empty effective, permitted and
# inheritable sets (which also empties the ambient set).
CAP_HEADER = struct.pack("Ii", 0x20080522, 0)
NO_CAPS = bytes(24)


def private_namespaces():
    """A mount and an IPC namespace of this request's own (see CLONE_NEWNS above)."""
    if UNSHARE is None:
        raise OSError(0, "cannot call the C library's unshare")
    if UNSHARE(CLong(CLONE_NEWNS | CLONE_NEWIPC)) != 0:
        err = c_errno()
        raise OSError(err, f"unshare a mount and an IPC namespace: {os.strerror(err)}")


def drop_caps():
    """Every capability, from every set that can hold one (a uid change clears them too,
    where requests have uids of their own; rootless, this is what does)."""
    if CAPSET is None or CAPSET(CAP_HEADER, NO_CAPS) != 0:
        err = c_errno() if CAPSET is not None else 0
        raise OSError(err, f"drop the agent's capabilities: {os.strerror(err)}")


def await_mounted(sock):
    """The launcher's first line: this request's /tmp and /work are mounted, and the name of
    the directory it made for us in /work (returned). The end of the channel instead means
    the slot was dropped unused: exit."""
    got = b""
    while len(got) < MOUNTED_LEN:
        chunk = sock.recv(MOUNTED_LEN - len(got))
        if not chunk:
            if got:
                raise Violation("the channel closed mid-line")
            os._exit(0)
        got += chunk
    name = got[len(MOUNTED_HEAD):-len(MOUNTED_TAIL)]
    if (not got.startswith(MOUNTED_HEAD) or not got.endswith(MOUNTED_TAIL)
            or len(name) != 32 or name.strip(HEX_B)):
        raise Violation(f"expected the mounted line, got {got[:200]!r}")
    return name.decode()


def own_domain():
    """Enter a Landlock domain nested in the sandbox's, before any request code runs."""
    rs = LANDLOCK_RULESET
    if rs is None:
        return
    if isinstance(rs, OSError):
        raise rs
    try:
        if SYSCALL(RESTRICT_SELF, CLong(rs), CLong(0)) != 0:
            err = c_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(rs)  # the request's code has no use for it


class Slots(dict):
    """pid -> (slot, read end of the pipe on which the child named its workdir, its uid),
    and the slots of the children alive (`live`)."""

    def __init__(self):
        super().__init__()
        self.live = set()


def serve(func):
    slots = Slots()
    buf = bytearray()
    poller = select.poll()
    poller.register(CTL, select.POLLIN)
    beat = time.monotonic() + 1.0
    while True:
        if time.monotonic() >= beat:
            tell(None, HEARTBEAT)
            beat = time.monotonic() + 1.0
        ready = poller.poll(max(0, int((beat - time.monotonic()) * 1000) + 1))
        reap_children(slots)  # what exited meanwhile, before anything is forked
        if not ready:
            continue
        try:
            data = os.read(CTL, 4096)  # small: a big buffer would touch (copy) more pages
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
                slot = line[len(PARK_HEAD):-len(PARK_TAIL)]
                if line.startswith(PARK_HEAD) and line.endswith(PARK_TAIL) and is_slot(slot):
                    slot = slot.decode()
                else:
                    slot = strict(line, CONTROL)["slot"]
                    if not is_slot(slot):
                        raise Violation("a bad slot")
                handle(slot, slots, func)
            if len(buf) > MAX_CONTROL_LINE:
                raise Violation("a line over 1 MiB")
        except Violation as e:
            complain(f"protocol violation on the control channel: {e}")
            die(2)


# Per-request user ids: where the sandbox maps a range of ids for requests (Zygo runs as
# root), the agent keeps CAP_SETUID and CAP_SETGID and gives each request's process an id of
# its own from that range, which also strips them. A request then cannot see its neighbours
# in /proc (mounted hidepid) nor signal them, even after it runs other programs. The range
# lies above the image's own ids (0-65535), so no request runs as a user the image knows.
# The monitor says how many ids there are and replaces the zygote before they run out: an
# id is never given twice by one agent (if asked for more, the park fails).
REQUEST_IDS = None  # (first, count) from --per-request-uids FIRST:COUNT; None: one uid
_next_uid = [0]


CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN = 6, 7, 21


def has_caps(*caps):
    """Whether this process holds every one of these capabilities (bits of CapEff)."""
    try:
        with open("/proc/self/status") as f:
            eff = next(int(l.split()[1], 16) for l in f if l.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return all(eff & (1 << c) for c in caps)


def parse_id_range(text):
    """FIRST:COUNT, both positive decimal integers below 2^32; None if malformed."""
    first, sep, count = text.partition(":")
    if not sep or not first.isdigit() or not count.isdigit():
        return None
    first, count = int(first), int(count)
    if first < 1 or count < 1 or first + count > 1 << 32:
        return None
    return first, count


def request_uid():
    """The next request's uid; None without per-request ids. Raises OSError when every id
    of the range has been given (never reused)."""
    if REQUEST_IDS is None:
        return None
    first, count = REQUEST_IDS
    n = _next_uid[0]
    if n >= count:
        raise OSError(0, f"all {count} request ids of this zygote have been used")
    _next_uid[0] = n + 1
    return first + n


def become(uid):
    """Run as this request's own uid (and gid), with no supplementary groups. Moving every
    uid off 0 makes the kernel clear every capability the agent kept."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def handle(slot, slots, func):
    """Park a child for the slot (a valid name)."""
    if slot in slots.live:
        raise Violation(f"slot {slot} parked twice")
    flush(sys.stdout, sys.stderr)  # or the child would print it again
    made = []
    try:
        uid = request_uid()
        # The child's stdout and stderr pipes, made here so that running out of descriptors
        # is a park_failed, not a child that silently dies.
        out = os.pipe()
        made += out
        err = os.pipe()
        made += err
        pid = os.fork()
    except OSError as e:
        for fd in made:
            os.close(fd)
        tell({"kind": "park_failed", "slot": slot, "message": f"cannot fork: {e}"})
        return
    if pid == 0:
        child(slot, func, out, err, uid)
    for fd in (*out, *err):
        os.close(fd)
    slots[pid] = slot
    slots.live.add(slot)


def reap_children(slots):
    """Wait for every child that has exited. What a request left in its /tmp, its /work and
    its IPC namespace went with the namespaces when its last process exited."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        slot = slots.pop(pid, None)
        if slot is None:
            continue  # not a request's process (a helper of the handler's import)
        slots.live.discard(slot)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        if code not in (None, 0):
            complain(f"request process {pid} exited with status {code}")


# --- A request process ------------------------------------------------------------------


def child(slot, func, out, err, uid):
    """Register, wait for one request, serve it, exit. Never returns."""
    global LOG_FD
    try:
        # _signal, not signal: its wrappers convert through enum, which copies pages.
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        os.close(CTL)
        # The C-level socket type: the request channel needs nothing more, and a fork copies
        # fewer pages making it.
        mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        # fd 1 and fd 2 become pipes whose read ends go to the launcher, which relays them
        # (anything the handler starts writes there too); the launcher reads them to the
        # end of what was written before it relays our terminal line.
        LOG_FD = os.dup(2)  # close-on-exec; closed before the request's code runs
        (out_r, out_w), (err_r, err_w) = out, err
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        # Namespaces of our own while we still hold the capability for it, then none.
        private_namespaces()
        if uid is not None:
            become(uid)
        drop_caps()
        os.umask(0o077)
        # The slot was checked against SLOT: nothing in it needs escaping. Our credentials
        # (pid, uid, gid) go with it without asking: the launcher's end has SO_PASSCRED, so
        # the kernel attaches them itself. The launcher mounts our /tmp and /work into our
        # mount namespace, found through that pid, and then says so on the channel.
        REG_SOCKET.sendmsg([REGISTER_HEAD + slot.encode() + REGISTER_TAIL],
                           [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                             THREE_FDS.pack(theirs.fileno(), out_r, err_r))])
        theirs.close()
        os.close(out_r)
        os.close(err_r)
        os.close(REG_SOCKET.detach())
        own_domain()
        workdir = await_mounted(mine)
        if isinstance(func, NodeSpare):
            exec_node(func, mine, workdir)
        channel = Channel(mine)
        prepared = prepare(channel, workdir)  # everything not tied to the request, now
        pool = isinstance(func, (Pool, ExecPool))
        request = read_request(mine, prepared, POOL_REQUEST if pool else REQUEST)
        # Nothing of the agent's is left open for the request's code.
        os.close(LOG_FD)
        LOG_FD = None
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


def read_request(sock, prepared, schema):
    """The request line (a runtime pool's names a script: `schema` says which), read
    through `prepared.room` (a buffer the child touched ahead of time, so reading copies no
    pages and maps no memory on the request's path)."""
    buf = bytearray()
    room = prepared.room
    while True:
        n = sock.recv_into(room)
        chunk = room[:n]
        if not chunk:
            if buf:
                raise Violation("the channel closed mid-line")
            # The launcher dropped this slot unused (its /work goes with its namespace).
            os._exit(0)
        nl = chunk.find(b"\n")
        buf += chunk if nl < 0 else chunk[:nl]
        if len(buf) > MAX_REQUEST_LINE:
            raise Violation("a line over 20 MiB")
        if nl >= 0:
            if nl + 1 < len(chunk):
                raise Violation("more than one line")
            break
    request = strict(bytes(buf), schema)
    if "script" in request and not is_script(request["script"]):
        raise Violation("a bad script path")
    if type(request["id"]) is not str:
        raise Violation("id is not a string")
    return request


class Channel:
    """The request channel: whole lines, one writer at a time, nothing after the last."""

    def __init__(self, sock):
        self.sock, self.lock, self.over, self.pid = sock, _thread.allocate_lock(), False, os.getpid()

    def send(self, obj, data=None, last=False, blocking=True):
        data = encode(obj) if data is None else data
        if not self.lock.acquire(blocking):
            return  # a heartbeat that found a line being written: the line is one too
        try:
            if self.over or os.getpid() != self.pid:  # done, or in a fork of the handler's
                return
            self.over = last
            try:
                self.sock.sendall(data)
            except OSError:
                os._exit(1)  # the launcher has gone
        finally:
            self.lock.release()


_channel = None


class _Progress:
    """`event.progress(text)`, whatever the event's JSON type: mixed into a subclass of the
    type the event was parsed as, which behaves as that type in every other way (equality,
    isinstance, JSON). null, true and false are None, True and False, which Python gives
    no subclass and no attribute: those events come as they are."""

    __slots__ = ()

    def progress(self, text):
        """Tell the caller how the request is going."""
        _channel.send({"kind": "progress", "text": str(text)[:MAX_PROGRESS]})


class Event(_Progress, dict):
    """The request's event, when it is a JSON object."""


class EventList(_Progress, list):
    """The request's event, when it is a JSON array."""


class EventStr(_Progress, str):
    """The request's event, when it is a JSON string."""


class EventInt(_Progress, int):
    """The request's event, when it is a JSON integer."""


class EventFloat(_Progress, float):
    """The request's event, when it is a JSON number with a fraction or an exponent."""


EVENT_TYPES = {dict: Event, list: EventList, str: EventStr, int: EventInt, float: EventFloat}


def as_event(value):
    """The event as the handler gets it: with `progress`, where its type can carry one."""
    cls = EVENT_TYPES.get(type(value))
    return value if cls is None else cls(value)


class Prepared:
    """A parked child's setup, done before its request exists (off the request path)."""

    def __init__(self, channel, ours, path, room):
        self.channel, self.ours, self.path, self.room = channel, ours, path, room


def prepare(channel, workdir):
    """The child's own /work directory (made by the launcher; made its working directory
    and named in ZYGO_WORKSPACE), `random` reseeded, Python's stdout and stderr on fd 1 and
    fd 2, and the heartbeat's handler."""
    path = WORK_PREFIX + workdir
    os.chdir(path)
    os.environ["ZYGO_WORKSPACE"] = path
    # A fresh state for `random` if the handler's module already holds one (the fork copied
    # the agent's); if it imports `random` later, that seeds itself from the kernel.
    if "random" in sys.modules:
        sys.modules["random"].seed()
    ours = CHILD_STREAMS
    sys.stdout, sys.stderr = ours
    # No dry run of the request's parse and encode here: it would take the request's page
    # copies off its path (~0.06 ms less per call on an idle machine), but a busy one pays
    # for them twice (~0.1 ms more CPU per call, and that is what limits throughput).
    # The heartbeat's handler now; its timer is armed when the request starts.
    global _channel
    _channel = channel
    _signal.signal(_signal.SIGALRM, heartbeat)
    gc.freeze()  # collections during the request leave the pages shared with the agent alone
    room = bytearray(16 << 10)  # zero-filled, so its pages are this process's own now
    return Prepared(channel, ours, path, room)


def heartbeat(*_):
    """SIGALRM's handler in a request process: a heartbeat line, unless a line is being
    written (that one shows we are alive)."""
    _channel.send(None, HEARTBEAT, blocking=False)


def run(p, request, func):
    # A heartbeat every second while the handler runs, from a timer: a process that is
    # stopped, or stuck where Python cannot run, stops sending them.
    _signal.setitimer(_signal.ITIMER_REAL, 1.0, 1.0)
    event = as_event(request["event"])
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
        # sys.exit(n): the status the process would have exited with (a message: 1).
        code = e.code & 0xFF if isinstance(e.code, int) else 1
        terminal = (result(None) if e.code in (None, 0)
                    else error(describe(e), format_tb(e), exit_code=code))
    except BaseException as e:
        terminal = error(describe(e), format_tb(e))
    # What the handler wrote is in the pipes, ahead of the terminal line.
    # No heartbeat after this point matters: one already due is sent before the terminal
    # line (harmless), and none can follow it (the channel refuses lines after the last).
    _signal.setitimer(_signal.ITIMER_REAL, 0, 0)
    flush(sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, *p.ours)
    p.channel.send(None, terminal, last=True)
    # The caller has its answer. What this request left in its /tmp, /work and IPC
    # namespace goes when its last process is gone (the monitor ends them all).
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
        done = subprocess.run([*pool.argv, script], input=dumps(event).encode(),
                              stdout=1, stderr=2, close_fds=True)
    except OSError as e:
        return error(f"cannot start {pool.argv[0]}: {describe(e)}", "")
    if done.returncode == 0:
        return result({"exit_code": 0})
    how = (f"was killed by signal {-done.returncode}" if done.returncode < 0
           else f"exited with status {done.returncode}")
    code = 128 - done.returncode if done.returncode < 0 else done.returncode
    return error(f"{pool.argv[0]} {how}", "", exit_code=code)


def result(value):
    """The terminal line for a returned value."""
    try:
        data = (dumps({"kind": "result", "value": value}) + "\n").encode("utf-8")
    except BaseException as e:
        return error(f"result is not JSON-serialisable: {e}"[:MAX_MESSAGE], "")
    if len(data) > MAX_LINE_OUT:
        return error(f"result is too large: {len(data)} bytes of JSON (the limit is 20 MiB)", "")
    return data


def error(message, tb, exit_code=None):
    """The terminal line for an error; `exit_code` when the handler's process exited."""
    line = {"kind": "error", "message": message, "traceback": tb}
    if exit_code is not None:
        line["exit_code"] = exit_code
    return encode(line)


NODE, NODE_AGENT = "/usr/bin/node", "/run/zygo/node_agent.mjs"


class NodeSpare:
    """In place of a Python handler: each child execs a Node spare that imports the
    handler and serves the one request (Node itself cannot fork). With no entry (a Node
    runtime pool), the spare imports the script its request names."""

    def __init__(self, entry, name):
        self.entry, self.name = entry, name


def check_node(entry, name):
    """Import the Node handler once, in a throwaway process, so that an import error is
    reported before `ready` as it is for Python."""
    import subprocess
    try:
        r = subprocess.run([NODE, NODE_AGENT, "--check", entry, name], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120,
                           preexec_fn=drop_caps if CAPSET is not None else None)
        if r.returncode == 0:
            return NodeSpare(entry, name)
        lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
        try:
            why = loads(lines[-1])
            message = str(why["message"])[:MAX_MESSAGE]
            tb = str(why.get("traceback", ""))[-MAX_TRACEBACK:]
        except (ValueError, RecursionError, Violation, KeyError, IndexError, TypeError):
            message, tb = f"cannot import {entry}: node exited with status {r.returncode}", "\n".join(lines[-50:])
    except (OSError, subprocess.SubprocessError) as e:
        message, tb = f"cannot start node to import {entry}: {describe(e)}", ""
    tell({"kind": "import_error", "message": message, "traceback": tb})
    die(1)


def exec_node(spare, mine, workdir):
    """The child becomes a Node spare: its request channel on fd 3; fd 1 and fd 2 are
    already the pipes the launcher relays."""
    fd = mine.fileno()
    if fd == 3:
        os.set_inheritable(3, True)  # dup2 onto itself would leave it close-on-exec
    else:
        os.dup2(fd, 3, inheritable=True)
    os.closerange(4, 1 << 16)
    if spare.entry is None:
        os.execv(NODE, [NODE, NODE_AGENT, "--pool", workdir])
    os.execv(NODE, [NODE, NODE_AGENT, spare.entry, spare.name, workdir])


def main(argv):
    global REQUEST_IDS
    if len(argv) > 2 and argv[1] == "--per-request-uids":
        REQUEST_IDS = parse_id_range(argv[2])
        if REQUEST_IDS is None:
            complain(f"--per-request-uids wants FIRST:COUNT, not {argv[2]!r}")
            die(2)
        argv = [argv[0], *argv[3:]]
    mode = "python"
    if len(argv) == 4 and argv[1] == "--node":
        argv, mode = [argv[0], argv[2], argv[3]], "node"
    elif len(argv) == 2 and argv[1] == "--pool":
        mode = "pool"
    elif len(argv) == 2 and argv[1] == "--node-pool":
        mode = "node-pool"
    elif len(argv) >= 3 and argv[1] == "--exec":
        mode = "exec"
    elif len(argv) != 3:
        complain("usage: python_agent.py [--per-request-uids FIRST:COUNT] "
                 "([--node] ENTRY_FILE FUNC | --pool | --node-pool | --exec CMD...)")
        die(2)
    # Each request's namespaces need CAP_SYS_ADMIN (in the sandbox's user namespace), its
    # own uid CAP_SETUID and CAP_SETGID: without them no request could be served safely.
    need = (CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID) if REQUEST_IDS else (CAP_SYS_ADMIN,)
    if not has_caps(*need):
        complain("this agent lacks the capabilities its requests' isolation needs"
                 " (CAP_SYS_ADMIN for their namespaces; with --per-request-uids, CAP_SETUID"
                 " and CAP_SETGID)")
        die(2)
    no_dump()
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
    elif mode == "node-pool":
        if not os.access(NODE, os.X_OK):
            tell({"kind": "import_error", "message": f"this image has no {NODE}",
                  "traceback": ""})
            die(1)
        func = NodeSpare(None, "")
    elif mode == "exec":
        func = ExecPool(argv[2:])
    else:
        func = load(argv[1], argv[2])
    # Made once here rather than in every child: the registration socket (fd 4), and the
    # text streams a child's print() and tracebacks use on fd 1 and fd 2 (which are its
    # output pipes by then; nothing here ever writes to them).
    global REG_SOCKET, CHILD_STREAMS
    REG_SOCKET = _socket.socket(fileno=REG)
    CHILD_STREAMS = [open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace",
                          closefd=False) for fd in (1, 2)]
    gc.freeze()  # what import made stays put: forks copy fewer pages
    tell({"kind": "ready", "pid": os.getpid()})
    serve(func)


if __name__ == "__main__":
    main(sys.argv)
