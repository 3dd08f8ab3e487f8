#!/usr/bin/env python3
"""Egress cost: start-up of an egress sandbox over a `none` one, and download throughput
through the egress filter against the same download on the host.

Never sends a packet anywhere but a network namespace this script creates: a veth pair
into `zygo-bench-eg-<pid>`, 10.214.0.1 (here) and 10.214.0.2 (the test host), removed at
the end whatever happens. Needs root (to make the namespace) and python3.

  - start-up: `zygo run -- /bin/true` against `zygo run --net egress --allow
    10.214.0.2:8080 -- /bin/true`, in alternating order, --reps each (default 200); prints
    both medians and their difference (target: at most 40 ms more).
  - throughput: a Python client downloads --mb MB (default 50) from the test host, on the
    host and inside an egress sandbox; the client times itself from connect to the last
    byte; --rounds rounds (default 5), medians; prints the ratio sandbox/host (target: at
    least 0.8). Twice: over the veth at full speed (gigabytes a second: the machine's
    CPUs are the limit, and the relay's extra hop and its start show in full), then with
    the test host's end of the link shaped to --rate (default 1gbit, `tc tbf`), as a fast
    uplink would be.
  - --mem M runs the egress sandbox with `--mem M` (default: zygo's own, 256M): the egress
    filter gives a sandbox's connections socket buffers from a quarter of its memory
    limit, so a small sandbox's download gets a smaller window (docs/egress.md).

Figures only: the exit status is 0 when everything ran, 1 otherwise, whatever the times.
Build first: cargo build --release (or pass --zygo PATH).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "10.214.0.2"
PORT = 8080

SERVER = r"""
import socket, sys, threading
size = int(sys.argv[1])
chunk = b"x" * (1 << 20)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], 8080)); s.listen(64)
print("ready", flush=True)
def serve(c):
    try:
        c.recv(16)
        left = size
        while left > 0:
            n = min(left, len(chunk))
            c.sendall(chunk[:n])
            left -= n
    except OSError:
        pass
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

CLIENT = r"""
import socket, sys, time
t = time.perf_counter()
s = socket.create_connection((sys.argv[1], 8080))
s.sendall(b"go")
got = 0
buf = bytearray(1 << 20)
while True:
    n = s.recv_into(buf)
    if not n:
        break
    got += n
print(got, time.perf_counter() - t)
"""


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zygo", default=os.path.join(
        ROOT, "target/x86_64-unknown-linux-gnu/release/zygo"))
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--mem", default="",
                    help="the egress sandbox's --mem (default: zygo's own)")
    ap.add_argument("--rate", default="1gbit",
                    help="the shaped link's rate for the second throughput figure (tc "
                         "tbf syntax; empty: none)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/egress.py needs root (it creates a network namespace)", file=sys.stderr)
        return 1
    if not os.path.isfile(a.zygo):
        print(f"no zygo at {a.zygo}: cargo build --release", file=sys.stderr)
        return 1
    ns = f"zygo-bench-eg-{os.getpid()}"
    near, far = f"zbe{os.getpid() % 100000}a", f"zbe{os.getpid() % 100000}b"
    server = None
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", near, "type", "veth", "peer", "name", far, "netns", ns)
        sh("ip", "addr", "add", "10.214.0.1/30", "dev", near)
        sh("ip", "link", "set", near, "up")
        sh("ip", "-n", ns, "addr", "add", f"{HOST}/30", "dev", far)
        sh("ip", "-n", ns, "link", "set", far, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, "python3", "-c", SERVER, str(a.mb << 20), HOST],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert server.stdout.readline().strip() == b"ready"
        rule = f"{HOST}:{PORT}"
        mem = ["--mem", a.mem] if a.mem else []
        egress = [a.zygo, "run", *mem, "--net", "egress", "--allow", rule, "--"]
        none = [a.zygo, "run", "--"]

        # Start-up.
        times = {"none": [], "egress": []}
        for i in range(a.reps + 5):
            order = [("none", none), ("egress", egress)]
            if i % 2:
                order.reverse()
            for name, cmd in order:
                t = time.perf_counter()
                r = subprocess.run(cmd + ["/bin/true"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                dt = time.perf_counter() - t
                if r.returncode != 0:
                    print(f"{name}: exit {r.returncode}", file=sys.stderr)
                    return 1
                if i >= 5:
                    times[name].append(dt * 1000)
        mn, me = statistics.median(times["none"]), statistics.median(times["egress"])
        print(f"start-up (median of {a.reps}): none {mn:.2f} ms, egress {me:.2f} ms, "
              f"egress costs {me - mn:+.2f} ms (target <= 40 ms)")

        # Throughput: at the veth's full speed, where this machine's CPUs are the limit
        # and the relay's extra hop shows; then with the test host's side of the link
        # shaped to --rate (a fast uplink), where the network is.
        def throughput(label):
            host, sandbox = [], []
            for _ in range(a.rounds):
                r = subprocess.run(["python3", "-c", CLIENT, HOST], capture_output=True,
                                   check=True)
                got, secs = r.stdout.split()
                assert int(got) == a.mb << 20, r.stdout
                host.append(a.mb / float(secs))
                r = subprocess.run(egress + ["python3", "-c", CLIENT, HOST],
                                   capture_output=True)
                if r.returncode != 0:
                    print(f"egress download failed: {r.stderr.decode()}", file=sys.stderr)
                    return False
                got, secs = r.stdout.split()
                assert int(got) == a.mb << 20, r.stdout
                sandbox.append(a.mb / float(secs))
            h, s = statistics.median(host), statistics.median(sandbox)
            print(f"download of {a.mb} MB, {label} (median of {a.rounds}): host {h:.0f} "
                  f"MB/s, egress {s:.0f} MB/s, ratio {s / h:.2f} (target >= 0.8)")
            return True

        if not throughput("veth at full speed"):
            return 1
        if a.rate:
            shaped = sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", far, "root",
                        "tbf", "rate", a.rate, "burst", "1mb", "latency", "50ms",
                        check=False)
            if shaped.returncode != 0:
                print(f"no shaped run: tc: {shaped.stderr.decode().strip()}")
            elif not throughput(f"link shaped to {a.rate}"):
                return 1
        return 0
    finally:
        if server is not None:
            server.kill()
            server.wait()
        sh("ip", "link", "del", near, check=False)
        sh("ip", "netns", "del", ns, check=False)


if __name__ == "__main__":
    sys.exit(main())
