#!/usr/bin/env bash
# Install schemathesis (PyPI), which tests/tests/api_schemathesis.rs runs against
# spec/openapi.json and a live `zygo api`, into a venv at
# $ZYGO_SCHEMATHESIS_DIR (default: ${XDG_CACHE_HOME:-$HOME/.cache}/zygo-schemathesis).
#
# Idempotent: a stamp file records the pinned version; a second run with the same pin
# does nothing. Needs network access to PyPI only (and Debian's python3-venv).
set -euo pipefail

SCHEMATHESIS=4.32.5

dir="${ZYGO_SCHEMATHESIS_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/zygo-schemathesis}"
stamp="$dir/.installed"
want="schemathesis==$SCHEMATHESIS"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/bin/schemathesis" ]; then
    echo "tests/schemathesis/setup.sh: $want already installed in $dir"
    exit 0
fi

python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3-venv
fi

echo "tests/schemathesis/setup.sh: installing $want into $dir"
rm -rf "$dir"
"$python" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$want"
"$dir/bin/schemathesis" --version
echo "$want" > "$stamp"
