#!/usr/bin/env bash
# The SDKs' live suites against a real Zygo: a supervisor of their own (`zygo up` with
# private runtime and state directories and one function, `echo`, from live/handlers.py)
# and `zygo api` on a unix socket with --allow-deploy, under a bootstrap token made here.
# Each suite runs with ZYGO_LIVE=1, ZYGO_API_URL and ZYGO_API_TOKEN set; both processes are
# stopped at the end whatever happened. Exits non-zero when a suite failed.
#
#   sdk/live.sh [python|node|elixir]...      (default: all three)
#
# The zygo binary is $ZYGO_BIN, else the one `cargo build` put in target/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

zygo=${ZYGO_BIN:-}
if [ -z "$zygo" ]; then
    for t in target/*/debug/zygo target/debug/zygo target/*/release/zygo target/release/zygo; do
        if [ -x "$t" ]; then zygo=$PWD/$t; break; fi
    done
fi
if [ -z "$zygo" ] || [ ! -x "$zygo" ]; then
    echo "sdk/live.sh: no zygo binary: run cargo build, or set ZYGO_BIN" >&2
    exit 2
fi

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(python node elixir)

dir=$(mktemp -d /tmp/zygo-sdk-live.XXXXXX)
chmod 755 "$dir"
mkdir -m 700 "$dir/rt" "$dir/st"
mkdir -m 755 "$dir/fn"
install -m 644 sdk/live/handlers.py "$dir/fn/handlers.py"
cat >"$dir/sandbox.toml" <<TOML
[defaults]
mem = "128M"
timeout = "20s"
idle_timeout = "60s"

[fn.echo]
agent = "python"
entry = "fn/handlers.py:handler"
TOML

export ZYGO_RUNTIME_DIR=$dir/rt ZYGO_STATE_DIR=$dir/st
ZYGO_API_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export ZYGO_API_TOKEN
api_pid=

stop() {
    if [ -n "$api_pid" ]; then
        kill -TERM "$api_pid" 2>/dev/null
        wait "$api_pid" 2>/dev/null
    fi
    "$zygo" drain --grace 5s >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT

if ! "$zygo" up -f "$dir/sandbox.toml" >"$dir/up.log" 2>&1; then
    echo "sdk/live.sh: zygo up failed:" >&2
    cat "$dir/up.log" >&2
    exit 1
fi
"$zygo" api --listen "unix://$dir/api.sock" --allow-deploy 2>"$dir/api.log" &
api_pid=$!
for _ in $(seq 100); do
    [ -S "$dir/api.sock" ] && break
    sleep 0.1
done
if [ ! -S "$dir/api.sock" ]; then
    echo "sdk/live.sh: zygo api did not start:" >&2
    cat "$dir/api.log" >&2
    exit 1
fi

export ZYGO_LIVE=1 ZYGO_API_URL=unix://$dir/api.sock
rc=0
for s in "${suites[@]}"; do
    echo "== live: sdk/$s against $ZYGO_API_URL"
    case $s in
        python) (cd sdk/python && /usr/bin/python3 -m unittest -v tests.live_test) || rc=1 ;;
        node) (cd sdk/node && node --test live/) || rc=1 ;;
        elixir) (cd sdk/elixir && MIX_ENV=test mix test --only live) || rc=1 ;;
        *) echo "sdk/live.sh: unknown suite $s" >&2; rc=2 ;;
    esac
done
exit $rc
