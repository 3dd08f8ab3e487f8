//! Help texts. Each lists only what the command really does.

pub const TOP: &str = "\
zygo — run untrusted code in sandboxes the Linux kernel enforces

Usage: zygo <command> [options]

Commands:
  run         run one program in a fresh one-shot sandbox
  up          start the supervisor if none runs; serve a sandbox.toml's functions
  serve       serve one function of a sandbox.toml
  stop        stop serving a function
  exec        call a served function (or run a script in a runtime pool)
  scripts     register scripts for runtime pools
  deps        build dependency sets (pip, npm) that pools and functions mount at /venv
  ls          served functions and their zygotes
  logs        a function's last finished requests
  stats       requests, failures, latency percentiles
  warm        keep N zygotes of a function ready
  cancel      cancel running requests by key
  token       mint, list and revoke the HTTP API's tokens
  secrets     make a store key; set, list and remove tenants' secrets
  drain       stop taking calls, finish running ones, exit the supervisor
  supervisor  the supervisor in the foreground (for systemd)
  mcp         an MCP server on stdio: run_code in fresh sandboxes, and warm functions
  api         the HTTP API for programs: functions, runs, pools, tenants, tokens
  version     what this build and this kernel support

Run `zygo <command> --help` for a command's options.

Output: human output shows every control character in text that came from a sandbox or
a caller (handler output, results, errors, tracebacks, progress) as an escape, the way
Python writes them: \\x1b for ESC, \\x07 for BEL, \\x9b for the C1 CSI, \\x7f for DEL, \\r
for a carriage return that does not end a line; newlines and tabs stay (a backslash is
shown as it is). --json keeps the exact text in its JSON strings, and answers every call,
refusals and usage errors included, with one JSON object on stdout ({\"code\", \"error\"}
when refused).
`zygo run` without --json passes the program's output through as it is.
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
  --io-bps SIZE      bytes a second read from, and written to, each of the
                     host's disks (at least 1M)            [default: 128M]
  --io-iops N        disk operations a second, reads and writes each
                                                           [default: 4000]
  --net MODE         network: none (only lo) or egress     [default: none]
  --allow HOST:PORT  with --net egress: TCP to this IPv4 address (or block, e.g.
                     10.0.0.0/8:80) or name (pypi.org:443: Zygo's resolver answers for
                     it, and the connection's TLS SNI or HTTP Host must name it) and
                     port; repeatable. Private, loopback and link-local addresses open
                     only when a rule names them. Everything else is refused at once.

Sandbox:
  --image IMG        host (the host's /usr, /bin, /lib*, part of /etc, read-only)
                     or dir:/path/to/rootfs                [default: host]
  --mount SRC:DST[:rw]  bind a host path (read-only unless :rw); repeatable.
                     In a :rw folder the program acts as the folder's owner: what it
                     makes there is the owner's on disk (root's folder, root's files),
                     and the owner's files are its own to change; rootless, it acts as
                     the user running zygo. A folder it could not write, or one on a
                     filesystem that cannot be idmapped (proc, sysfs, some FUSE and
                     network filesystems, tmpfs before Linux 6.3), or one holding a
                     set-user-id or set-group-id program, is refused before anything
                     runs; a read-only mount inside it stays read-only. No file may be
                     made set-user-id or set-group-id (EPERM), here or anywhere in the
                     sandbox
  --env K=V          set an environment variable; repeatable
  --inotify          let the program use inotify (off by default: a watch on a file
                     of the shared, read-only image would see anyone open it;
                     without it inotify_init fails with ENOSYS and programs poll)
  --stdin FILE       feed FILE to the program's stdin (default: zygo's own stdin,
                     or nothing with --json), copied through a pipe: the program
                     never gets the host's file, pipe or terminal itself; a
                     directory or a socket is refused

Output:
  --json             print one JSON object: exit_code, timed_out, oom_killed,
                     peak_rss_kb, wall_ms, cpu_ms, stdout, stderr (1 MiB each, with
                     *_truncated), started, phase, error (and code \"bad_request\" for
                     a usage error)
Without --json the program's output passes through as it is written, control
characters included, as if the program were run directly.

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

Names the cgroup backend (v1 or v2) and where Zygo's tree is, or why there is none and the
command that fixes it; the kernel's Landlock ABI; and for each protection a newer Landlock
brings, what provides it here: Landlock itself, another layer that holds the same line,
or a refusal naming the kernel it needs.
";

pub const SUPERVISOR: &str = "\
zygo supervisor — the long-lived monitor, in the foreground (systemd's ExecStart)

Usage: zygo supervisor

Under systemd (contrib/zygo.service, Type=notify) it sends READY=1 once it serves,
STOPPING=1 when it drains and STATUS= lines to $NOTIFY_SOCKET, and logs one journal entry
per event. On cgroup v2 it first moves itself into <its cgroup>/zygo-monitor, so a
Delegate=yes unit is all it needs.
Listens on $ZYGO_RUNTIME_DIR/zygo.sock (default $XDG_RUNTIME_DIR/zygo, or /run/zygo as
root), mode 0600. SIGTERM or SIGINT drains: no new calls, running ones may finish within
25s, then every sandbox is killed and every cgroup removed. Finished requests are appended
to usage.log in the state directory ($ZYGO_STATE_DIR, default /var/lib/zygo as root or
~/.local/state/zygo); when that disk is full, they are held in memory (up to 64 MiB, the
oldest dropped past it, counted) and written whole when it has room again.

Scripts sent to runtime pools are kept in scripts/ of the state directory, up to
$ZYGO_SCRIPT_STORE bytes (default 1G): past it, the scripts used least recently that no
call in flight runs are removed; a digest removed so is unknown until sent again.
Blobs (workspace tars stored with PUT /blobs) are kept in blobs/ the same way, up to
$ZYGO_BLOB_STORE bytes (default 1G), evicting the least recently used that no call in
flight was given.
";

pub const UP: &str = "\
zygo up — start the supervisor if none runs, and serve every [fn.*] of a sandbox.toml

Usage: zygo up [-f sandbox.toml] [--no-wait] [--json]

Without -f, ./sandbox.toml is served if it exists. The supervisor runs detached and logs
to supervisor.log in the state directory. Waits until each function has a ready zygote or
has failed (an import error is printed). A function whose dependency set (`requirements`)
is still building is waited for, with a line on stderr every 2 s, and served once the set
is ready (at most 20 minutes); with --no-wait, zygo up returns at once and says which are
still building (serve them again later).

The supervisor reads ZYGO_API_TOKEN and ZYGO_SECRETS_KEY only when it starts. Against one
already running, zygo up serves what the file adds, and exits 1 saying what it cannot
change: a ZYGO_API_TOKEN the supervisor was not started with (then nothing is changed), or
a function served already whose table now differs (it is left as it is; zygo stop NAME,
then zygo up again). `zygo drain` stops the supervisor, to start it again.
";

pub const SERVE: &str = "\
zygo serve — serve one function of a sandbox.toml

Usage: zygo serve NAME [-f sandbox.toml] [--secret NAME=VALUE | --secret NAME]... [--json]

--secret gives a value for one of the function's secrets (its sandbox.toml lists the
name under secrets); --secret NAME takes the value of $NAME. Each is the file
/run/secrets/NAME in every request of the function, readable by that request only, gone
when it ends. A value given here wins over one stored with `zygo secrets set` (for a
tenant's function); serving again with --secret replaces it from the next call on.
";

pub const STOP: &str = "\
zygo stop — stop serving a function; its running requests are cancelled

Usage: zygo stop NAME [--json]
";

pub const EXEC: &str = "\
zygo exec — call a served function, or run a script in a runtime pool

Usage: zygo exec NAME [EVENT|-|FILE] [--stream] [--timeout DUR] [--key K] [--json]
                 [--workspace FILE.tar] [--out FILE.tar]
       zygo exec POOL [EVENT|-|FILE] (--script FILE | --digest SHA256) [...]

EVENT is JSON text; `-` reads it from stdin; otherwise a file holding it. Default: {}.
Prints the handler's value on stdout, alone (`zygo exec f | jq` reads it), and what the
handler wrote (its stdout, then its stderr), its progress and any error on stderr.
  --stream       print the handler's output and progress as they happen
  --timeout DUR  narrow the function's timeout for this call (never widens it)
  --key K        a name for this call, for `zygo cancel K`
  --script FILE  for a runtime pool: run this script (stored by digest, as `scripts put`)
  --digest D     for a runtime pool: run the script registered under this SHA-256
  --workspace F  unpack this tar (at most 64 MiB: regular files and folders only, no
                 links, no `..`) into the request's own directory, where the handler
                 starts, before it runs
  --out F        write the request's directory, as the handler left it, to F as a tar
                 (at most 8 MiB; links, fifos and sockets are left out)
  --json         print {result, request_id, stdout, stderr, metrics} (and, on failure,
                 error, code, traceback, exit_code, oom_killed; with --out, workspace_out: {file,
                 bytes, truncated} or null); with --stream, one line per event before it.
                 A refusal is {code, error}
Human output shows control characters in the handler's text as escapes (\\x1b, \\r, ...;
see `zygo --help`); --json has the exact text.
Exit status: 0 when the handler returned, 1 otherwise; 2 for usage errors.
";

pub const SCRIPTS: &str = "\
zygo scripts — register scripts for runtime pools

Usage: zygo scripts put FILE [--json]

Stores FILE's bytes under their SHA-256 (the same bytes are one file, whoever sends them)
and prints the digest, for `zygo exec POOL --digest SHA256`. A pool is a [fn.NAME] with an
agent and no entry (a Python script defines `handler(event)`), or with cmd = [...] (the
command runs with the script's path as its last argument and the event on stdin).
";

pub const DEPS: &str = "\
zygo deps — dependency sets: packages installed once, mounted read-only at /venv

Usage: zygo deps build IMAGE FILE... [--json]
       zygo deps show ID [--json]
       zygo deps ls [--json]

build installs a set on this host and prints its id (deps_ and a SHA-256 of IMAGE and the
files' names and bytes: the same inputs are one set). IMAGE is \"host\" or
\"dir:/path/to/rootfs\"; the files are either requirements.txt (Python: a venv built at
/venv, so its console scripts work there) or package.json and package-lock.json (Node:
npm ci --ignore-scripts). The build runs in a one-shot sandbox on IMAGE whose network
reaches only the package registries; a host that cannot enforce that refuses the build.
A set that is ready is not built again; one another process is building is waited for;
one that failed is built again. A failed build exits 1 with the resolver's own log.

show prints a set's state (building, ready or failed; with its log when failed); ls
lists the sets on this host. Sets live in the state directory's deps/ folder.

Environment (the operator's):
  ZYGO_DEPS_REGISTRIES     HOST:PORT,... a build may reach
                           [default: pypi.org:443,files.pythonhosted.org:443,
                            registry.npmjs.org:443]
  ZYGO_DEPS_PIP_INDEX_URL  pip's index (a mirror; name it in ZYGO_DEPS_REGISTRIES)
  ZYGO_DEPS_NPM_REGISTRY   npm's registry (likewise)
  ZYGO_DEPS_CA_BUNDLE      a PEM file of CA certificates the build trusts as well
                           (where the network re-signs TLS)
";

pub const LS: &str = "\
zygo ls — served functions, their state and zygotes

Usage: zygo ls [--json]

If the supervisor itself is degraded (its usage log cannot be written, say, with the
records held in memory meanwhile), a warning says so on stderr.
";

pub const LOGS: &str = "\
zygo logs — the last finished requests of a function

Usage: zygo logs NAME [-n N] [-f] [--json]

Prints the last N finished requests (default 20), oldest first; with -f it then prints
each request as it finishes, until interrupted.

Human output shows control characters in the requests' output and errors as escapes
(\\x1b, \\r, ...; see `zygo --help`); --json prints one object per request, exact text.
";

pub const STATS: &str = "\
zygo stats — requests, failures by outcome, p50/p99 wall time and peak memory

Usage: zygo stats [NAME] [--json]

If the supervisor itself is degraded (its usage log cannot be written, say, with the
records held in memory meanwhile), a warning says so on stderr.
";

pub const WARM: &str = "\
zygo warm — keep at least N zygotes of a function ready (at most max_warm)

Usage: zygo warm NAME [N] [--json]
";

pub const CANCEL: &str = "\
zygo cancel — cancel every running request under a key

Usage: zygo cancel KEY [--json]
";

pub const TOKEN: &str = "\
zygo token — the HTTP API's tokens, on the host (no HTTP round trip)

Usage: zygo token mint [--tenant T] [--json]
       zygo token ls [--json]
       zygo token revoke ID [--json]

mint prints a new token's secret (zygo_ and 64 hex digits) on stdout, once: the
supervisor keeps only its SHA-256, so it can never be shown again (lose it, revoke it and
mint another). Without --tenant it is an operator token, with deploy rights; with
--tenant T (a tenant that exists) it is that tenant's, which calls functions and pools,
registers its own scripts and reads its own record. ls lists every token (id, tenant,
when minted, when revoked), never a secret. revoke ID refuses the token from its next
request on; its record stays, marked.
";

pub const SECRETS: &str = "\
zygo secrets — tenants' secrets, sealed in the supervisor's store

Usage: zygo secrets keygen
       zygo secrets set TENANT NAME [--json]
       zygo secrets ls TENANT [--json]
       zygo secrets rm TENANT NAME [--json]

keygen prints a new store key: 32 random bytes as 64 hex digits. Give it to the
supervisor before it starts, as export ZYGO_SECRETS_KEY=$(zygo secrets keygen); keep it
somewhere safe (a password manager, a KMS): Zygo never writes it to disk, and stored
secrets cannot be opened without it. A passphrase is refused, not stretched into a key.
set reads the value from the terminal with echo off (or from stdin when it is not a
terminal, up to 64 KiB, one trailing newline removed) and stores it sealed
(ChaCha20-Poly1305, bound to TENANT and NAME), replacing one of that name. A tenant's
functions get it as the file /run/secrets/NAME when their sandbox.toml lists it under
secrets and the shell did not give it (zygo serve --secret wins); a runtime pool naming
it gives each call the calling tenant's value. ls lists names, never values: no command
shows a value back. rm removes one. Names: 1 to 64 letters, digits and _, not starting
with a digit.
";

pub const DRAIN: &str = "\
zygo drain — stop taking calls; let running ones finish; then the supervisor exits

Usage: zygo drain [--grace 30s] [--json]

Answers once the drain is over, just before the supervisor exits: how many of the calls
in flight when it began finished, and how many the grace cut off (cancelled); with --json
{\"drained\": true, \"finished\": N, \"cut_off\": M}.
";

pub const MCP: &str = "\
zygo mcp — an MCP server on stdin/stdout for agent hosts (Claude Code, Codex, Cursor, ...)

Usage: zygo mcp [LIMITS] [--image IMG] [--workspace DIR] [--net MODE] [--allow HOST:PORT]... [-f sandbox.toml]

Speaks JSON-RPC 2.0, one message per line: MCP revisions 2025-06-18 (preferred; the
answer to an initialize asking for any other), 2025-03-26, 2024-11-05 and 2025-11-25
through initialize, and the stateless 2026-07-28. Tools: run_code (python, javascript or
sh in a fresh one-shot sandbox), list_functions, call_function (a runtime pool with its
script as code) and function_logs: warm functions of a supervisor already running, none
is started, found where zygo looks for one ($ZYGO_RUNTIME_DIR, else $XDG_RUNTIME_DIR/zygo;
with neither set, as under an MCP host that passes little of the environment, also
/run/user/UID/zygo). Standard output carries only the protocol; everything else goes to
stderr. A run_code's usage record goes to the supervisor's usage log, or with none
running to usage.log in the state directory (made if missing).

The flags are the ceiling the model works under; no tool argument can change them.

Limits (of every run_code sandbox):
  --mem SIZE         memory, e.g. 256M, 1.5G              [default: 256M]
  --cpu CPUS         CPU bandwidth, e.g. 0.5, 2            [default: 1]
  --pids N           processes and threads                 [default: 64]
  --timeout DUR      wall-clock deadline, e.g. 30s, 5m     [default: 30s]
  --scratch SIZE     size of /tmp                          [default: 64M]
  --io-bps SIZE      disk bytes a second, reads and writes each [default: 128M]
  --io-iops N        disk operations a second, each        [default: 4000]
  --net MODE         network: none (only lo) or egress     [default: none]
  --allow HOST:PORT  with --net egress: TCP to this IPv4 address, block or name and
                     port, repeatable; with -f, only rules its [defaults] allow has

Sandbox:
  --image IMG        host or dir:/path/to/rootfs            [default: host]
  --workspace DIR    the folder mounted writable at /work, kept after exit (made 0700 if
                     missing); default: a scratch folder removed when the server exits.
                     run_code acts there as the folder's owner (rootless, as the user
                     running zygo): what it makes is the owner's on disk (a folder zygo
                     mcp makes is its user's), and the owner's files are its own to
                     change. A folder it could not write, one holding a set-id
                     program, or a path through a symbolic link is refused at start;
                     see zygo run --help, --mount
  -f FILE            a sandbox.toml whose [defaults] (image, limits, network) is the
                     ceiling; flags may only narrow it

Install in a host:
  { \"mcpServers\": { \"zygo\": { \"command\": \"zygo\", \"args\": [\"mcp\"] } } }
  claude mcp add zygo -- zygo mcp --mem 512M --timeout 60s

Exit status: 0 when stdin closes or on SIGTERM/SIGINT (every sandbox is stopped first);
1 when the server could not start; 2 for usage errors.
";

pub const API: &str = "\
zygo api — the HTTP API in front of the running supervisor

Usage: zygo api [--listen ADDR] [--allow-deploy [--allow-private-net]] [--no-auth]
                [--usage-webhook URL] [--otlp-endpoint URL] [-f sandbox.toml]
       zygo api --openapi

Serves the routes listed by `zygo api --openapi` (OpenAPI 3.1; the same document is
spec/openapi.json) until SIGTERM or SIGINT, then stops taking requests and lets those in
flight finish for up to 25 s. It starts no supervisor: start one first with `zygo up`.
Every caller needs `Authorization: Bearer TOKEN`: the supervisor's ZYGO_API_TOKEN (the
bootstrap operator token) or a token minted with `zygo token mint [--tenant T]`.
POST /mcp is an MCP server (Streamable HTTP, JSON answers, no sessions) with the tools
of `zygo mcp`, each call made as the caller its token names, with that caller's rights.

Options:
  --listen ADDR        IP:PORT, or unix:///path (created 0600)   [default: 127.0.0.1:7700]
  --allow-deploy       the bootstrap token (ZYGO_API_TOKEN) may serve functions, create
                       pools, run one-shot sandboxes, and use the other deploy routes
                       (minted operator tokens always may; tenant tokens never)
  --allow-private-net  with --allow-deploy: deploy callers may name private and
                       link-local addresses in `allow` (without it: does nothing)
  --no-auth            a request without a token acts as the bootstrap operator; only on
                       a unix socket or a loopback address
  -f, --file FILE      read `listen` and `auth` (\"token\" or \"none\") of the file's [api]
                       table, where no flag says otherwise  [default: ./sandbox.toml, if
                       there is one]
  --usage-webhook URL  POST every call's usage record, in JSON arrays, to URL: at least
                       once (a failed batch is sent again, in order; key on request_id);
                       at most 10 000 waiting, the oldest dropped first and counted in the
                       log (every record is in the supervisor's usage.log either way)
  --otlp-endpoint URL  push the /metrics numbers plus per-tenant requests, outcomes, CPU
                       and wall time as OTLP/HTTP JSON metrics every 10 s
                       (e.g. http://127.0.0.1:4318/v1/metrics)
                       Both take http://IP:PORT/path only (no https, no host names), and
                       run in a process of their own (zygo-delivery) off the serving path
  --openapi            print the OpenAPI document and exit

Exit status: 0 after SIGTERM/SIGINT; 1 when it could not start (no supervisor, the address
in use, no channel to the supervisor left); 2 for usage errors.
";
