//! Help texts. Each lists only what the command really does.

pub const TOP: &str = "\
zygo — run untrusted code in sandboxes the Linux kernel enforces

Usage: zygo <command> [options]

Commands:
  run       run one program in a fresh one-shot sandbox
  version   what this build and this kernel support

Run `zygo <command> --help` for a command's options.
";

pub const RUN: &str = "\
zygo run — run one program in a fresh one-shot sandbox

Usage: zygo run [OPTIONS] -- CMD [ARG...]

The program runs in its own user, mount, pid, network, ipc, uts and cgroup namespaces,
on a read-only root built from the image, with no capabilities, no_new_privs, Landlock
and a seccomp allowlist. /tmp and /work are writable and capped at --scratch.

Limits:
  --mem SIZE         memory, e.g. 256M, 1.5G              [default: 256M]
  --cpu CPUS         CPU bandwidth, e.g. 0.5, 2            [default: 1]
  --pids N           processes and threads                 [default: 64]
  --timeout DUR      wall-clock deadline, e.g. 30s, 5m     [default: 30s]
  --scratch SIZE     size of /tmp and of /work             [default: 64M]
  --net none         network: none (only lo)               [default: none]

Sandbox:
  --image IMG        host (the host's /usr, /bin, /lib*, part of /etc, read-only)
                     or dir:/path/to/rootfs                [default: host]
  --mount SRC:DST[:rw]  bind a host path (read-only unless :rw); repeatable
  --env K=V          set an environment variable; repeatable
  --stdin FILE       feed FILE to the program's stdin (default: zygo's own stdin,
                     or nothing with --json)

Output:
  --json             print one JSON object: exit_code, timed_out, oom_killed,
                     peak_rss_kb, wall_ms, cpu_ms, stdout, stderr (1 MiB each, with
                     *_truncated), started, phase, error

Exit status: the program's own; 128+N when killed by signal N (137 for a kill, with the
reason on stderr); 1 when the sandbox could not be built or started; 2 for usage errors.

Environment:
  ZYGO_CGROUP        cgroup path (the same in every hierarchy) to build under, for users
                     given a delegated subtree; default: the cgroup zygo runs in
  ZYGO_SUBID         BASE:COUNT host id range for sandboxes when zygo runs as root
  ZYGO_LOG           log level: error, warn, info, debug
";

pub const VERSION: &str = "\
zygo version — what this build and this kernel support

Usage: zygo version [--json]
";
