#!/usr/bin/env bash
# The SDKs' live suites against a real Zygo of their own (scripts/with-api: a supervisor
# serving `echo` from sdk/live/handlers.py, and `zygo api` with --allow-deploy), each with
# ZYGO_LIVE=1. Exits non-zero when a suite failed.
#
#   sdk/live.sh [python|node|elixir]...      (default: all three)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ "${1:-}" != "--inside" ]; then
    exec scripts/with-api "$0" --inside "$@"
fi
shift
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(python node elixir)

# The API is this run's own: the suites may serve, create and delete things on it.
export ZYGO_LIVE=1 ZYGO_LIVE_OWN=1
rc=0
for s in "${suites[@]}"; do
    echo "== live: sdk/$s against $ZYGO_API_URL"
    case $s in
        python) (cd sdk/python && /usr/bin/python3 -m unittest -v tests.live_test) || rc=1 ;;
        node) (cd sdk/node && node --test live/) || rc=1 ;;
        elixir) (cd sdk/elixir && MIX_ENV=test mix test --only live --only live_own) || rc=1 ;;
        *) echo "sdk/live.sh: unknown suite $s" >&2; rc=2 ;;
    esac
done
exit $rc
