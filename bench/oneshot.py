#!/usr/bin/env python3
"""One-shot sandbox start-up cost: zygo against bubblewrap and the bare command.

Measures, in one run and on the same machine, the wall time from spawn to exit of:

  - bare      /bin/true                      and  /usr/bin/python3 -c pass
  - zygo      zygo run -- /bin/true          and  zygo run -- python3 -c pass
  - bwrap     bwrap <equivalent boundary> -- /bin/true   and  ... -- python3 -c pass
  - unshare   unshare -Urnmpf --mount-proc /bin/true   (a reference point; --no-unshare)

Each sample is time.perf_counter() around subprocess.run(...) with stdin, stdout and
stderr on /dev/null (no timeout= argument: that makes Popen.wait poll with growing sleeps
and quantizes the samples; a SIGALRM watchdog kills a run after 60 s instead). Every variant gets 5 warm-up runs (not counted), then the variants
are run in rounds, one sample each per round, in a new random order every round (seeded,
--seed): they all share the machine's noise, and each follows every other about as often,
so the work a sandbox leaves to the kernel after it exits (its network namespace is torn
down asynchronously, for one) falls on every variant alike. Defaults: 300 samples per variant
(about half a minute in all), enough to tell a 2% difference from the noise of a shared machine;
--reps N sets another count.

The bwrap boundary: new user, mount, pid, net, ipc, uts and cgroup namespaces
(--unshare-all), read-only /usr and /etc, the host's top-level /bin, /lib, /lib64, /sbin
(...) recreated as the symlinks they are on this host (or bound read-only if they are
directories), a new /proc, a minimal /dev, tmpfs /tmp and /work, cwd /work, every
capability dropped, a new session, killed with its parent. zygo additionally sets up
cgroup limits, Landlock, seccomp and /proc masks, which bwrap here does not.

bare, bwrap and unshare run with the same small environment zygo gives its programs
(PATH, HOME, LANG, TMPDIR), so python starts the same way everywhere.

Next to each zygo/bwrap ratio of medians the script prints a 95% interval, from resampling
each variant's runs 2000 times: a ratio whose interval spans 1.0 is level at this many
runs, not ahead or behind.

Exit status: 0 when every variant ran and exited 0 every time; 1 when some variant failed
(non-zero exit or a 60 s hang); 2 when bwrap or the zygo binary is missing. Timings never
affect the exit status.

zygo runs from a copy in a temporary directory, as it would be installed: the file the
linker has just written execs measurably slower than a copy of it (see installed_copy).

Python 3 standard library only. Building zygo is not this script's job:
run `cargo build --release` in the repository first.
"""

import argparse
import gc
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where `cargo build --release` puts zygo (.cargo/config.toml names the target).
DEFAULT_ZYGO = next(
    (p for p in (os.path.join(REPO, "target", f"{platform.machine()}-unknown-linux-gnu",
                              "release", "zygo"),
                 os.path.join(REPO, "target", "release", "zygo")) if os.path.exists(p)),
    os.path.join(REPO, "target", f"{platform.machine()}-unknown-linux-gnu", "release", "zygo"))
WARMUP = 5
RUN_TIMEOUT_S = 60.0

# The environment zygo gives its programs; the other variants get the same.
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/work",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}

TRUE = ["/bin/true"]
PY_BARE = ["/usr/bin/python3", "-c", "pass"]
PY = ["python3", "-c", "pass"]

# Host top-level entries bwrap mirrors: a symlink stays a symlink, a directory is bound.
TOP_ENTRIES = ["bin", "lib", "lib64", "sbin", "lib32", "libx32"]


def bwrap_prefix(bwrap):
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr"]
    for name in TOP_ENTRIES:
        p = "/" + name
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    args += ["--ro-bind", "/etc", "/etc",
             "--proc", "/proc", "--dev", "/dev",
             "--tmpfs", "/tmp", "--tmpfs", "/work", "--chdir", "/work",
             "--cap-drop", "ALL", "--"]
    return args


class Variant:
    def __init__(self, name, group, kind, argv, env, reps):
        self.name = name
        self.group = group  # "true" or "python"
        self.kind = kind    # "bare", "zygo", "bwrap", "unshare"
        self.argv = argv
        self.env = env
        self.reps = reps
        self.samples = []
        self.failures = 0
        self.first_error = None
        self.disabled = False


class _Hung(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Hung()


def run_once(v, capture):
    """One spawn-to-exit; returns (seconds, returncode, stderr text or None).

    No `timeout=` is passed to subprocess.run: with a timeout, Popen.wait polls with
    exponentially growing sleeps (0.5, 1, 2, 4 ... ms), which would round every sample up
    to the next poll (~7.5, 15.5, 31.5 ms ...). A SIGALRM watchdog, armed outside the
    timed region, keeps the wait a plain blocking waitpid; if it fires, subprocess.run
    kills the child and re-raises.
    """
    err = subprocess.PIPE if capture else subprocess.DEVNULL
    signal.setitimer(signal.ITIMER_REAL, RUN_TIMEOUT_S)
    try:
        t0 = time.perf_counter()
        p = subprocess.run(v.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=err, env=v.env)
        dt = time.perf_counter() - t0
    except _Hung:
        return RUN_TIMEOUT_S, None, f"did not exit within {RUN_TIMEOUT_S:g}s (killed)"
    except OSError as e:
        return 0.0, None, f"could not start: {e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    text = None
    if capture and p.stderr:
        text = p.stderr.decode(errors="replace").strip()
    return dt, p.returncode, text


def note_failure(v, rc, text):
    v.failures += 1
    if v.first_error is None:
        why = f"exit status {rc}" if rc is not None else "no exit status"
        v.first_error = why + (f": {text}" if text else "")


def pct(xs, q):
    """Linear-interpolation percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def read_first(path, prefix):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def tool_version(argv):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        out = (p.stdout or p.stderr).decode(errors="replace").strip().splitlines()
        return out[0] if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def ratio_interval(a, b, seed, rounds=2000):
    """The 2.5th and 97.5th percentiles of median(a)/median(b) over `rounds` resamplings
    (with replacement) of each list: how far the ratio could move with another draw of the
    same runs. None if either list has fewer than 10 samples."""
    if not a or not b or len(a) < 10 or len(b) < 10:
        return None
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(rounds))
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def cgroup_kind():
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "v2"
    if os.path.isdir("/sys/fs/cgroup/memory"):
        return "v1"
    return "?"


def main():
    with tempfile.TemporaryDirectory(prefix="zygo-bench-") as tmp:
        return measure(tmp)


def installed_copy(zygo, tmp):
    """A copy of `zygo` in `tmp`, run in its place, as it would be installed; `zygo` itself
    (with a note) where a copy cannot be run (a noexec temporary directory: set TMPDIR).

    The file the linker has just written execs measurably slower than the same bytes
    copied, or read back after the page cache has dropped it: ~3-6% per
    `zygo run -- /bin/true` here, most likely because the cache holds the linker's file in
    smaller pieces. bwrap, installed by the package manager, is measured as installed too.
    """
    dst = os.path.join(tmp, "zygo")
    try:
        shutil.copyfile(zygo, dst)
        os.chmod(dst, 0o755)
        subprocess.run([dst, "version"], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=10, check=True)
        return dst
    except (OSError, subprocess.SubprocessError) as e:
        print(f"note: cannot run a copy of zygo from {tmp} ({e}); measuring {zygo} itself",
              file=sys.stderr)
        return zygo


def measure(tmp):
    ap = argparse.ArgumentParser(
        description="Time one-shot sandbox start-up: bare vs zygo run vs bwrap "
                    "(interleaved, a random order per round).")
    ap.add_argument("--reps", type=int, default=None,
                    help="samples per variant (default: 300)")
    ap.add_argument("--zygo", default=DEFAULT_ZYGO,
                    help="zygo binary (default: the release build in the repository's target/)")
    ap.add_argument("--no-unshare", action="store_true",
                    help="skip the `unshare -Urnmpf --mount-proc /bin/true` reference")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed of the per-round order of the variants (default: 1)")
    ap.add_argument("--raw", metavar="FILE",
                    help="also write every sample (variant,ms) as CSV to FILE")
    args = ap.parse_args()
    if args.reps is not None and args.reps < 1:
        ap.error("--reps must be at least 1")

    signal.signal(signal.SIGALRM, _on_alarm)
    bwrap = shutil.which("bwrap")
    if not bwrap:
        print("bwrap (bubblewrap) is not installed; install it with:\n"
              "    apt-get update && apt-get install -y bubblewrap", file=sys.stderr)
        return 2
    zygo = os.path.abspath(args.zygo)
    if not (os.path.isfile(zygo) and os.access(zygo, os.X_OK)):
        print(f"zygo binary not found at {zygo}; this script does not build it. Build it with:\n"
              f"    cd {shlex.quote(REPO)} && cargo build --release\n"
              f"or point --zygo at a binary.", file=sys.stderr)
        return 2
    built = zygo
    zygo = installed_copy(built, tmp)

    reps_true = args.reps if args.reps is not None else 300
    reps_py = args.reps if args.reps is not None else 300
    bw = bwrap_prefix(bwrap)
    env = dict(SANDBOX_ENV)

    variants = [
        Variant("bare    /bin/true", "true", "bare", TRUE, env, reps_true),
        Variant("zygo    /bin/true", "true", "zygo", [zygo, "run", "--"] + TRUE, None, reps_true),
        Variant("bwrap   /bin/true", "true", "bwrap", bw + TRUE, env, reps_true),
        Variant("bare    python3 -c pass", "python", "bare", PY_BARE, env, reps_py),
        Variant("zygo    python3 -c pass", "python", "zygo", [zygo, "run", "--"] + PY, None, reps_py),
        Variant("bwrap   python3 -c pass", "python", "bwrap", bw + PY, env, reps_py),
    ]
    unshare = shutil.which("unshare")
    if not args.no_unshare:
        if unshare:
            variants.append(Variant("unshare /bin/true", "true", "unshare",
                                    [unshare, "-Urnmpf", "--mount-proc"] + TRUE, env, reps_true))
        else:
            print("note: `unshare` not found; skipping the unshare reference", file=sys.stderr)

    # Machine and reproduction line first, so a partial run still says where it ran.
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count()
    uname = platform.uname()
    print("== zygo one-shot start-up benchmark ==")
    print(f"machine : nproc={ncpu} (online {os.cpu_count()}), kernel {uname.release} "
          f"{uname.machine}, cpu {read_first('/proc/cpuinfo', 'model name')}, "
          f"cgroup {cgroup_kind()}, euid {os.geteuid()}")
    how = f"run as a copy in {tmp}" if zygo != built else "run where it was built"
    print(f"tools   : {tool_version([zygo, 'version'])} ({built}, {how}); "
          f"{tool_version([bwrap, '--version'])}; python {platform.python_version()}")
    print(f"reproduce: cd {shlex.quote(REPO)} && {shlex.join([sys.executable] + sys.argv)}")
    print(f"method  : perf_counter around subprocess.run, stdio on /dev/null, "
          f"{WARMUP} warm-ups each, interleaved in a random order per round (seed {args.seed}), "
          f"{reps_true} reps (/bin/true) / {reps_py} reps (python)")
    print("commands:")
    for v in variants:
        print(f"  {v.name:<24} {shlex.join(v.argv)}")
    sys.stdout.flush()

    # Warm-up, capturing stderr so that a failing variant says why.
    for v in variants:
        for _ in range(WARMUP):
            _, rc, text = run_once(v, capture=True)
            if rc != 0:
                note_failure(v, rc, text)
                v.disabled = True
                break
    for v in variants:
        if v.disabled:
            print(f"FAILED in warm-up, not measured: {v.name}: {v.first_error}", file=sys.stderr)

    # Measurement: rounds, each in a new random order.
    active = [v for v in variants if not v.disabled]
    rounds = max((v.reps for v in active), default=0)
    rng = random.Random(args.seed)
    t_start = time.perf_counter()
    gc.disable()
    try:
        for r in range(rounds):
            order = active[:]
            rng.shuffle(order)
            for v in order:
                if len(v.samples) + v.failures >= v.reps:
                    continue
                dt, rc, text = run_once(v, capture=False)
                if rc == 0:
                    v.samples.append(dt)
                else:
                    note_failure(v, rc, text)
    finally:
        gc.enable()
    elapsed = time.perf_counter() - t_start

    # Results.
    print()
    print(f"results (ms, {elapsed:.1f}s of measurement):")
    hdr = f"  {'variant':<24} {'n':>4} {'median':>8} {'p90':>8} {'min':>8} {'mean':>8}"
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    med = {}
    for v in variants:
        if not v.samples:
            print(f"  {v.name:<24} {'-':>4} {'failed':>8}")
            continue
        ms = [s * 1000.0 for s in v.samples]
        m = statistics.median(ms)
        med[(v.group, v.kind)] = m
        fail = f"  ({v.failures} failed)" if v.failures else ""
        print(f"  {v.name:<24} {len(ms):>4} {m:>8.2f} {pct(ms, 90):>8.2f} "
              f"{min(ms):>8.2f} {statistics.fmean(ms):>8.2f}{fail}")

    print()
    print("comparison (medians; 95% interval of zygo/bwrap from resampling the runs):")
    print(f"  {'command':<16} {'zygo/bwrap':>10} {'95% interval':>13} {'zygo-bare ms':>13} "
          f"{'bwrap-bare ms':>14} {'zygo-bwrap ms':>14}")
    samples = {(v.group, v.kind): v.samples for v in variants if v.samples}
    for group, label in (("true", "/bin/true"), ("python", "python3 -c pass")):
        b = med.get((group, "bare"))
        z = med.get((group, "zygo"))
        w = med.get((group, "bwrap"))

        ratio = f"{z / w:.2f}x" if z is not None and w else "-"
        lo_hi = ratio_interval(samples.get((group, "zygo")), samples.get((group, "bwrap")),
                               args.seed)
        ci = f"{lo_hi[0]:.3f}-{lo_hi[1]:.3f}" if lo_hi else "-"
        zb = f"{z - b:+.2f}" if z is not None and b is not None else "-"
        wb = f"{w - b:+.2f}" if w is not None and b is not None else "-"
        zw = f"{z - w:+.2f}" if z is not None and w is not None else "-"
        print(f"  {label:<16} {ratio:>10} {ci:>13} {zb:>13} {wb:>14} {zw:>14}")
    u = med.get(("true", "unshare"))
    if u is not None and ("true", "zygo") in med:
        print(f"  reference: unshare -Urnmpf /bin/true median {u:.2f} ms; "
              f"zygo/unshare {med[('true', 'zygo')] / u:.2f}x")

    if args.raw:
        with open(args.raw, "w") as f:
            f.write("variant,ms\n")
            for v in variants:
                for s in v.samples:
                    f.write(f"{v.name.split()[0]} {v.group},{s * 1000.0:.4f}\n")
        print(f"\nraw samples written to {args.raw}")

    failed = [v for v in variants if v.failures]
    if failed:
        print(file=sys.stderr)
        for v in failed:
            print(f"FAILED: {v.name}: {v.failures} run(s) failed; first: {v.first_error}",
                  file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
