#!/usr/bin/env python3
"""Fair share on a shared host: how much a victim slows down next to one sandbox that
stays within its limits but tries to take what it can.

For each attacker, the victim runs alone, then with the attacker running beside it, in
--rounds pairs, and the script prints the victim's slowdown (with / alone, each the median
of --reps runs; the median of the rounds, and their range) next to the target of 1.1x.
A first line pairs the CPU victim with itself and no attacker: the machine's own noise. A
second pairs it with one busy host process and no sandbox: what the machine's CPUs cost
each other through what no scheduler divides (shared caches, memory bandwidth, a
hypervisor's vCPUs), the floor under any CPU attacker's figure. Attackers, each a `zygo
run` with ordinary limits:

  cpu      --cpu 0.5, 60 busy processes              victim: a fixed CPU loop on the host
  io       --cpu 0.1, two readers with O_DIRECT      victim: random 4 KiB O_DIRECT reads of a
           of a large host file (--mount)                    host file (p99 latency, and time)
  evict    a loop of posix_fadvise(DONTNEED) over    victim: `python3 -c "import json, email,
           the image's Python library (refused)              http.client, decimal"` on the host
  output   --cpu 0.5, two streams of /dev/zero       victim: the CPU loop
           captured with --json (the relay)

The victim runs on the host, outside any sandbox, as the host's own work would (a second
sandbox's program sees the same). Slowdowns are only comparable on one machine at one
time: run it on a quiet machine, and read the "alone" figures for the noise.

Exit status: 0 when every attacker started (whatever the figures); 1 otherwise; 2 when the
zygo binary is missing. A benchmark, not a test: nothing here is asserted.

Python 3 standard library only. Build zygo first (`cargo build --release`), or point
--zygo at a binary.
"""

import argparse
import mmap
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_ZYGO = next(
    (p for p in (os.path.join(REPO, "target", f"{platform.machine()}-unknown-linux-gnu",
                              "release", "zygo"),
                 os.path.join(REPO, "target", "release", "zygo")) if os.path.exists(p)),
    os.path.join(REPO, "target", f"{platform.machine()}-unknown-linux-gnu", "release", "zygo"))

TARGET = 1.1


def cpu_victim():
    """A fixed amount of CPU work on the host: seconds it took."""
    t = time.perf_counter()
    n = 0
    for i in range(3_000_000):
        n += i * i % 7
    return time.perf_counter() - t


def io_victim(path, reads=400):
    """Random 4 KiB O_DIRECT reads: (seconds, p99 latency in ms)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    size = os.fstat(fd).st_size // 4096
    buf = mmap.mmap(-1, 4096)
    rnd = random.Random(7)
    lat = []
    t0 = time.perf_counter()
    for _ in range(reads):
        off = rnd.randrange(size) * 4096
        t = time.perf_counter()
        os.preadv(fd, [buf], off)
        lat.append(time.perf_counter() - t)
    os.close(fd)
    lat.sort()
    return time.perf_counter() - t0, lat[int(len(lat) * 0.99) - 1] * 1000


def import_victim():
    """A host python3 start importing some of the library: seconds."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import json, email, http.client, decimal"],
                   check=True)
    return time.perf_counter() - t


ATTACKERS = {
    "cpu": (["--cpu", "0.5", "--pids", "100"],
            ["sh", "-c", "for i in $(seq 60); do (while :; do :; done) & done; wait"]),
    "io": (["--cpu", "0.1"],
           ["python3", "-c", """
import mmap, os, threading
def reader():
    fd = os.open("/data/big", os.O_RDONLY | os.O_DIRECT)
    size = os.fstat(fd).st_size
    buf = mmap.mmap(-1, 1 << 20)
    off = 0
    while True:
        n = os.preadv(fd, [buf], off)
        off = (off + n) % size if n else 0
threading.Thread(target=reader, daemon=True).start()
reader()
"""]),
    "evict": ([], ["python3", "-c", """
import os, sys
lib = os.path.dirname(os.__file__)
files = [os.path.join(d, f) for d, _, fs in os.walk(lib) for f in fs if f.endswith(".py")]
refused = 0
while True:
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            refused += 1
        os.close(fd)
"""]),
    "output": (["--cpu", "0.5", "--json"], ["sh", "-c", "cat /dev/zero & cat /dev/zero >&2"]),
}

VICTIMS = {"cpu": "cpu", "io": "io", "evict": "import", "output": "cpu"}


def start_attacker(zygo, name, data_dir, seconds):
    flags, cmd = ATTACKERS[name]
    args = [zygo, "run", "--timeout", f"{seconds}s", "--mount", f"{data_dir}:/data"] + flags
    out = subprocess.DEVNULL
    p = subprocess.Popen(args + ["--"] + cmd, stdin=subprocess.DEVNULL, stdout=out,
                         stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # let it build and get going
    return p


def measure(victim, data_file, reps):
    """Median seconds (and median p99 ms for io) of `reps` victim runs."""
    times, p99s = [], []
    for _ in range(reps):
        if victim == "cpu":
            times.append(cpu_victim())
        elif victim == "io":
            t, p = io_victim(data_file)
            times.append(t)
            p99s.append(p)
        else:
            times.append(import_victim())
    return statistics.median(times), (statistics.median(p99s) if p99s else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zygo", default=DEFAULT_ZYGO, help="zygo binary")
    ap.add_argument("--reps", type=int, default=5, help="victim runs per figure (default 5)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alone/attacked pairs per attacker; the median ratio is shown "
                         "(default 3)")
    ap.add_argument("--only", choices=sorted(ATTACKERS), action="append",
                    help="run only this attacker (repeatable)")
    ap.add_argument("--data-mb", type=int, default=512,
                    help="size of the host file the I/O attacker and victim read (MiB)")
    a = ap.parse_args()
    if not os.path.exists(a.zygo):
        print(f"no zygo binary at {a.zygo}: build it with `cargo build --release` or pass "
              f"--zygo", file=sys.stderr)
        return 2
    names = a.only or list(ATTACKERS)
    base = "/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir()
    data_dir = tempfile.mkdtemp(prefix="zygo-fairness-", dir=base)
    os.chmod(data_dir, 0o755)
    data_file = os.path.join(data_dir, "big")
    failed = False
    try:
        if "io" in names:
            chunk = os.urandom(1 << 20)
            with open(data_file, "wb") as f:
                for _ in range(a.data_mb):
                    f.write(chunk)
            os.chmod(data_file, 0o644)
        else:
            open(data_file, "wb").close()
        print(f"zygo {a.zygo}; {os.cpu_count()} CPUs; victim runs {a.reps} per figure; "
              f"target <= {TARGET}x")
        print(f"{'attacker':<8} {'victim':<7} {'alone':>10} {'attacked':>10} {'slowdown':>9}"
              f"  notes")
        # The noise floor first: the CPU victim against itself, no attacker, paired the
        # same way (this machine's speed alone can swing a figure).
        floor = []
        for _ in range(a.rounds):
            x, _ = measure("cpu", data_file, a.reps)
            y, _ = measure("cpu", data_file, a.reps)
            floor.append(y / x)
        floor.sort()
        print(f"{'(none)':<8} {'cpu':<7} {'':>10} {'':>10} {statistics.median(floor):>8.2f}x"
              f"  noise floor: rounds {floor[0]:.2f}-{floor[-1]:.2f}x")
        # What the CPUs themselves cost each other: one busy host process, no sandbox, on
        # a machine with a CPU to spare for it (the scheduler puts it beside the victim,
        # not on it). Shared caches, memory bandwidth and, on a virtual machine, the
        # hypervisor's scheduling of its vCPUs are out of any sandbox's reach: a CPU
        # attacker using a fraction f of a CPU costs the victim about 1 + f x (this - 1)
        # through them alone.
        if "cpu" in names or "output" in names:
            spin = []
            for _ in range(a.rounds):
                x, _ = measure("cpu", data_file, a.reps)
                p = subprocess.Popen(["sh", "-c", "while :; do :; done"],
                                     stdin=subprocess.DEVNULL)
                try:
                    time.sleep(0.3)
                    y, _ = measure("cpu", data_file, a.reps)
                finally:
                    p.kill()
                    p.wait()
                spin.append(y / x)
            spin.sort()
            m = statistics.median(spin)
            print(f"{'(host)':<8} {'cpu':<7} {'':>10} {'':>10} {m:>8.2f}x"
                  f"  one busy host process on the other CPU, no sandbox: rounds "
                  f"{spin[0]:.2f}-{spin[-1]:.2f}x; a 0.5-CPU attacker's share of it "
                  f"{1 + 0.5 * (m - 1):.2f}x")
        for name in names:
            victim = VICTIMS[name]
            # Alone and attacked are measured in pairs, round after round, so that what
            # the machine does meanwhile falls on both alike.
            ratios, alones, attackeds, notes = [], [], [], []
            for _ in range(a.rounds):
                alone, p99_alone = measure(victim, data_file, a.reps)
                seconds = int(max(10, alone * a.reps * 4 + 5))
                p = start_attacker(a.zygo, name, data_dir, seconds)
                if p.poll() is not None:
                    print(f"{name:<8} the attacker did not start (exit {p.returncode})")
                    failed = True
                    break
                try:
                    attacked, p99_attacked = measure(victim, data_file, a.reps)
                finally:
                    p.kill()
                    p.wait()
                ratios.append(attacked / alone)
                alones.append(alone)
                attackeds.append(attacked)
                if p99_alone is not None:
                    notes.append(f"p99 {p99_alone:.2f}->{p99_attacked:.2f} ms")
                time.sleep(1.0)
            if not ratios:
                continue
            ratios.sort()
            ratio = statistics.median(ratios)
            note = f"rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x"
            if notes:
                note += "; " + ", ".join(notes)
            flag = "" if ratio <= TARGET else "  (over target)"
            print(f"{name:<8} {victim:<7} {statistics.median(alones) * 1000:>8.1f}ms "
                  f"{statistics.median(attackeds) * 1000:>8.1f}ms {ratio:>8.2f}x  {note}{flag}")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
