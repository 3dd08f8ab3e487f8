#!/usr/bin/env python3
"""Whose event loop: another tenant's small request, alone and while one tenant sends large
bodies.

Starts a supervisor of its own (in a temporary state and runtime directory) with two host
functions and `zygo api` in front of it, and makes two tenants. The victim tenant sends
`GET /fn/echo/stats` (answered by the supervisor's event loop alone, no sandbox) one after
the other over one kept-alive connection:

  alone     for --seconds, a request every --gap seconds, nobody else calling
  loaded    the same while the attacker tenant keeps --senders (8) calls in flight,
            each a POST /fn/sink of a --mib (6.5) MB JSON event (an array of small objects:
            many tokens, the costly kind to check), each sender starting its next call as
            soon as its last one is answered

and prints the median and p99 of each, and the ratio of the medians. Between two stats
requests the victim sends `GET /no-such-route`, which the front answers 404 without the
supervisor: its figures are what the machine's load alone costs a request (the front
parsing the large bodies, the attackers' own processes), the floor under the stats figure.
Last, how busy each of the supervisor's threads was during the loaded phase (CPU time from
/proc; "loop" is the event loop): the loop's share is the time every caller's requests
could have waited behind the large bodies, whatever the machine's noise. `sink` returns a
small answer and runs at `cpu = "0.25"`, so what the large calls cost the host is mostly
what the front and the supervisor spend on their bodies, not the handler's own work.

The attackers run in processes of their own (no shared interpreter lock with the victim's
clock). The figures are only comparable on one machine at one time: run the before and
after binaries one after the other (--zygo), on a quiet machine.

A benchmark, not a test: nothing here is asserted. Exit status 0 when both phases ran, 1
when a request failed, 2 when the zygo binary is missing. Needs root (the supervisor's
cgroups). Python 3 standard library only; build zygo first (`cargo build --release`), or
point --zygo at a binary.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_ZYGO = os.path.join(REPO, "target", f"{platform.machine()}-unknown-linux-gnu",
                            "release", "zygo")
BOOT = "bench-big-bodies-bootstrap-token"

HANDLERS = '''
def echo(event):
    return event


def sink(event):
    return len(event) if isinstance(event, list) else 0
'''

TOML = '''[defaults]
timeout = "60s"
mem = "512M"
idle_timeout = "600s"

[fn.echo]
agent = "python"
entry = "fn/handlers.py:echo"

[fn.pool]
agent = "python"

[fn.sink]
agent = "python"
entry = "fn/handlers.py:sink"
{sink_cpu}max_warm = 4
min_warm = 2
'''


def big_event(mib: float) -> bytes:
    """A JSON array of small objects, about `mib` MB of text."""
    want = int(mib * 1_000_000)
    item = '{"id":%d,"name":"item-%d","tags":["a","b"],"v":1.5}'
    parts, size, i = [], 2, 0
    while size < want:
        s = item % (i, i)
        parts.append(s)
        size += len(s) + 1
        i += 1
    return ("[" + ",".join(parts) + "]").encode()


def connect(addr: str) -> http.client.HTTPConnection:
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    c.connect()
    return c


def request(c, method, path, token, body=None):
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    return r.status, r.read()


def sender(addr, token, path, body, stop, answered, failed):
    """One attacker: a large call after another until told to stop."""
    c = connect(addr)
    want = 400 if path == "/fn/pool" else 200
    while not stop.is_set():
        try:
            status, data = request(c, "POST", path, token, body)
        except (OSError, http.client.HTTPException):
            c.close()
            c = connect(addr)
            continue
        if status == want:
            with answered.get_lock():
                answered.value += 1
        else:
            with failed.get_lock():
                failed.value += 1


def victim(addr, token, seconds, gap):
    """Requests one after the other, `gap` seconds apart, for `seconds`, alternating
    `GET /fn/echo/stats` (the supervisor's loop answers it) and `GET /no-such-route` (the
    front answers 404 alone): each one's time in ms, for each."""
    c = connect(addr)
    times = {"stats": [], "front": []}
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        for kind, path, want in (("stats", "/fn/echo/stats", 200), ("front", "/no-such-route", 404)):
            t = time.perf_counter()
            try:
                status, data = request(c, "GET", path, token)
            except (OSError, http.client.HTTPException):
                # The front closed the kept-alive connection: a new one, and no sample.
                c.close()
                c = connect(addr)
                continue
            times[kind].append((time.perf_counter() - t) * 1000)
            if status != want:
                raise SystemExit(f"GET {path}: HTTP {status}: {data[:300]!r}")
            time.sleep(gap)
    return times


def supervisor_pid(zygo, state):
    """The pid of the supervisor started with this state directory."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if args[1:2] == [b"supervisor"] and f"ZYGO_STATE_DIR={state}".encode() in env:
            return int(pid)
    return None


def thread_cpu(pid):
    """Seconds of CPU each thread of `pid` has used, by thread name (the loop is the
    process's own name)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = "loop" if tid == str(pid) else stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def row(name, xs):
    s = sorted(xs)
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
    return f"  {name:<8} median {statistics.median(xs):9.2f} ms   p99 {p99:9.2f} ms   ({len(xs)} requests)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zygo", default=DEFAULT_ZYGO, help="the zygo binary (default: the release build)")
    ap.add_argument("--seconds", type=float, default=15, help="length of each phase (default 15)")
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between the victim's requests (default 0.02)")
    ap.add_argument("--senders", type=int, default=8, help="attacker calls in flight (default 8)")
    ap.add_argument("--target", choices=("sink", "pool"), default="sink",
                    help="where the large calls go: sink (a function that answers) or pool (a "
                         "runtime pool called without a script: checked, then refused)")
    ap.add_argument("--sink-cpu", default=None, help="cpu limit of the attacker's function (default: none)")
    ap.add_argument("--mib", type=float, default=6.5, help="MB per attacker event (default 6.5)")
    args = ap.parse_args()
    if not os.path.exists(args.zygo):
        print(f"no zygo binary at {args.zygo}: cargo build --release, or --zygo PATH", file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="zygo-bench-bodies-")
    os.chmod(tmp, 0o755)
    env = dict(os.environ, ZYGO_STATE_DIR=os.path.join(tmp, "state"),
               ZYGO_RUNTIME_DIR=os.path.join(tmp, "run"), ZYGO_API_TOKEN=BOOT)
    os.makedirs(os.path.join(tmp, "fn"))
    with open(os.path.join(tmp, "fn", "handlers.py"), "w") as f:
        f.write(HANDLERS)
    os.chmod(os.path.join(tmp, "fn", "handlers.py"), 0o644)
    os.chmod(os.path.join(tmp, "fn"), 0o755)
    toml = os.path.join(tmp, "sandbox.toml")
    with open(toml, "w") as f:
        f.write(TOML.replace("{sink_cpu}", f'cpu = "{args.sink_cpu}"\n' if args.sink_cpu else ""))
    api = None

    def zygo(*a):
        r = subprocess.run([args.zygo, *a], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"zygo {' '.join(a)}: {r.stderr}{r.stdout}")
        return r.stdout

    try:
        zygo("up", "-f", toml)
        api = subprocess.Popen([args.zygo, "api", "--listen", "127.0.0.1:0"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        addr = None
        for line in api.stderr:
            if "listening on http://" in line:
                addr = line.split("listening on http://")[1].split()[0]
                break
        if addr is None:
            raise SystemExit("zygo api did not start")
        threading.Thread(target=lambda: [None for _ in api.stderr], daemon=True).start()
        tokens = {}
        for t in ("victim", "attacker"):
            c = connect(addr)
            status, data = request(c, "POST", "/tenants", BOOT, json.dumps({"id": t}))
            if status != 200:
                raise SystemExit(f"POST /tenants: HTTP {status}: {data!r}")
            tokens[t] = json.loads(zygo("token", "mint", "--tenant", t, "--json").splitlines()[-1])["secret"]

        body = big_event(args.mib)
        victim(addr, tokens["victim"], 1, args.gap)
        alone = victim(addr, tokens["victim"], args.seconds, args.gap)

        stop = multiprocessing.Event()
        answered = multiprocessing.Value("i", 0)
        failed = multiprocessing.Value("i", 0)
        procs = [multiprocessing.Process(target=sender,
                                         args=(addr, tokens["attacker"], f"/fn/{args.target}", body, stop, answered, failed))
                 for _ in range(args.senders)]
        for p in procs:
            p.start()
        # Until the large calls are flowing.
        while answered.value + failed.value < args.senders:
            time.sleep(0.05)
        sup = supervisor_pid(args.zygo, env["ZYGO_STATE_DIR"])
        cpu_before = thread_cpu(sup) if sup else {}
        began = (answered.value, time.perf_counter())
        loaded = victim(addr, tokens["victim"], args.seconds, args.gap)
        done = (answered.value, time.perf_counter())
        cpu_after = thread_cpu(sup) if sup else {}
        stop.set()
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.terminate()

        rate = (done[0] - began[0]) / (done[1] - began[1])
        print(f"zygo {args.zygo}; another tenant's GET /fn/echo/stats, alone and beside "
              f"{args.senders} calls in flight of {len(body) / 1e6:.1f} MB events from one tenant to /fn/{args.target}")
        print(row("alone", alone["stats"]))
        print(row("loaded", loaded["stats"]))
        print("the front's own 404 (no supervisor; what the machine's load alone costs):")
        print(row("alone", alone["front"]))
        print(row("loaded", loaded["front"]))
        ratio = statistics.median(loaded["stats"]) / statistics.median(alone["stats"])
        busy = {k: (v - cpu_before.get(k, 0)) / (done[1] - began[1]) * 100
                for k, v in cpu_after.items() if v - cpu_before.get(k, 0) > 0}
        print("the supervisor's threads busy while loaded: " +
              (", ".join(f"{k} {v:.0f}%" for k, v in sorted(busy.items())) or "(not found)"))
        print(f"stats median loaded / alone: {ratio:.1f}x; "
              f"the large calls answered as expected meanwhile: {rate:.1f}/s ({failed.value} otherwise)")
        return 0
    finally:
        if api is not None:
            api.terminate()
            api.wait()
        subprocess.run([args.zygo, "drain"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
