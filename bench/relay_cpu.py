#!/usr/bin/env python3
"""What relaying a sandbox's output costs the host outside the sandbox's CPU quota.

Runs `zygo run --cpu 0.5 -- sh -c 'cat /dev/zero & cat /dev/zero >&2'` (a program that
writes as fast as its quota lets it, on both streams) with zygo's stdout and stderr going
to each destination in turn: /dev/null, a pipe this script drains, a regular file, and a
pseudo-terminal this script drains. For --seconds (default 4) after a short start it
samples the CPU time of the `zygo run` process and of its launcher (the processes that
relay; the sandbox's own processes are in its cgroup and held to its quota) and prints
it as a share of one CPU beside the sandbox's quota. The lower, the better: the issue's
target is the quota plus a small constant.

Only this script's own processes are measured (by pid), so other zygo processes on the
machine do not count; their load still slows everything, so compare the rows of one run.
Figures only: the exit status is 0 when everything ran. Build first (cargo build), or
pass --zygo PATH.
"""

import argparse
import os
import pty
import subprocess
import sys
import tempfile
import threading
import time

CLK = os.sysconf("SC_CLK_TCK")
PROGRAM = "cat /dev/zero & cat /dev/zero >&2"


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def relays(zygo_pid):
    """The zygo process and its launcher (the child whose argv says so)."""
    out = [zygo_pid]
    for c in children(zygo_pid):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                if b"__launcher" in f.read():
                    out.append(c)
        except OSError:
            pass
    return out


def drain(fd):
    def run():
        while True:
            try:
                if not os.read(fd, 1 << 20):
                    return
            except OSError:
                return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def measure(zygo, dest, seconds, cpu):
    argv = [zygo, "run", "--cpu", str(cpu), "--timeout", f"{int(seconds) + 3}s", "--",
            "sh", "-c", PROGRAM]
    tmp = None
    if dest == "devnull":
        null = open(os.devnull, "wb")
        p = subprocess.Popen(argv, stdout=null, stderr=null)
    elif dest == "pipe":
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        drain(p.stdout.fileno())
    elif dest == "file":
        tmp = tempfile.NamedTemporaryFile(prefix="zygo-relay-bench-")
        p = subprocess.Popen(argv, stdout=tmp, stderr=tmp)
    else:  # pty
        master, slave = pty.openpty()
        p = subprocess.Popen(argv, stdout=slave, stderr=slave)
        os.close(slave)
        drain(master)
    time.sleep(1.5)
    pids = relays(p.pid)
    before = {q: cpu_ticks(q) for q in pids}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {q: cpu_ticks(q) for q in pids}
    wall = time.monotonic() - t0
    used = sum((after[q] or 0) - (before[q] or 0) for q in pids if before[q] is not None)
    p.kill()
    p.wait()
    if tmp is not None:
        tmp.close()
    return used / CLK / wall, len(pids)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--zygo", default=os.path.join(
        here, "..", "target", "x86_64-unknown-linux-gnu", "debug", "zygo"))
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--cpu", type=float, default=0.5)
    a = ap.parse_args()
    print(f"zygo run --cpu {a.cpu} -- sh -c '{PROGRAM}'; CPU of zygo and its launcher, "
          f"over {a.seconds:g} s")
    for dest in ["devnull", "pipe", "file", "pty"]:
        share, n = measure(a.zygo, dest, a.seconds, a.cpu)
        print(f"  {dest:8} {share:5.2f} of a CPU ({n} process(es); the sandbox's quota: "
              f"{a.cpu:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
