#!/usr/bin/env bash
# Install the official MCP client SDKs that tests/tests/mcp.rs drives `zygo mcp` with:
#   - PyPI `mcp` 1.x (handshake revisions 2024-11-05 .. 2025-11-25) in a venv `py1`
#   - PyPI `mcp` 2.x (adds the stateless 2026-07-28 revision) in a venv `py2`
#   - npm `@modelcontextprotocol/sdk` 1.x (handshake) and `@modelcontextprotocol/client` 2.x
#     (stateless) in `node/node_modules`
#   - npm `@modelcontextprotocol/conformance`, the official conformance suite that
#     tests/tests/api_mcp.rs runs against `zygo api`'s /mcp, in `conformance/node_modules`
# into $ZYGO_MCP_SDK_DIR (default: ${XDG_CACHE_HOME:-$HOME/.cache}/zygo-mcp-sdk).
#
# Idempotent: a stamp file records the pinned versions; a second run with the same pins
# does nothing. Needs network access to PyPI and the npm registry only.
set -euo pipefail

PY1_MCP=1.30.0
PY2_MCP=2.3.0
NODE_SDK=1.32.2
NODE_CLIENT=2.4.0
# The last release that runs on Node 20 (the machine's and CI's): 0.1.14 and later import
# fs.globSync, which Node has only from 22.
CONFORMANCE=0.1.13

dir="${ZYGO_MCP_SDK_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/zygo-mcp-sdk}"

# The conformance suite has a stamp of its own: adding or moving its pin does not reinstall
# the SDKs.
conformance() {
    local cdir="$dir/conformance" cstamp="$dir/.conformance-installed"
    if [ -f "$cstamp" ] && [ "$(cat "$cstamp")" = "$CONFORMANCE" ] \
        && [ -x "$cdir/node_modules/.bin/conformance" ]; then
        echo "tests/mcp/setup.sh: MCP conformance suite $CONFORMANCE already installed in $cdir"
        return 0
    fi
    command -v npm >/dev/null || { echo "tests/mcp/setup.sh: npm is missing" >&2; return 1; }
    rm -f "$cstamp"
    rm -rf "$cdir"
    mkdir -p "$cdir"
    cat > "$cdir/package.json" <<JSON
{
  "name": "zygo-mcp-conformance",
  "private": true,
  "dependencies": {
    "@modelcontextprotocol/conformance": "$CONFORMANCE"
  }
}
JSON
    (cd "$cdir" && npm install --silent --no-audit --no-fund --no-update-notifier)
    echo "  conformance: @modelcontextprotocol/conformance $CONFORMANCE"
    echo "$CONFORMANCE" > "$cstamp"
}
stamp="$dir/.installed"
want="py1 mcp==$PY1_MCP; py2 mcp==$PY2_MCP; node @modelcontextprotocol/sdk@$NODE_SDK @modelcontextprotocol/client@$NODE_CLIENT"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && [ -x "$dir/py1/bin/python" ] && [ -x "$dir/py2/bin/python" ] \
    && [ -d "$dir/node/node_modules/@modelcontextprotocol/sdk" ] \
    && [ -d "$dir/node/node_modules/@modelcontextprotocol/client" ]; then
    echo "tests/mcp/setup.sh: MCP client SDKs already installed in $dir"
    conformance
    exit 0
fi

python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"
missing=()
"$python" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}"
fi

mkdir -p "$dir"
rm -f "$stamp"

venv() {
    local name=$1 spec=$2
    rm -rf "$dir/$name"
    "$python" -m venv "$dir/$name"
    "$dir/$name/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
    "$dir/$name/bin/python" -c 'import importlib.metadata as m; print("  '"$name"': mcp", m.version("mcp"))'
}
echo "tests/mcp/setup.sh: installing into $dir"
venv py1 "mcp==$PY1_MCP"
venv py2 "mcp==$PY2_MCP"

mkdir -p "$dir/node"
cat > "$dir/node/package.json" <<JSON
{
  "name": "zygo-mcp-test-clients",
  "private": true,
  "type": "module",
  "dependencies": {
    "@modelcontextprotocol/sdk": "$NODE_SDK",
    "@modelcontextprotocol/client": "$NODE_CLIENT"
  }
}
JSON
(cd "$dir/node" && npm install --silent --no-audit --no-fund --no-update-notifier)
echo "  node: @modelcontextprotocol/sdk $NODE_SDK, @modelcontextprotocol/client $NODE_CLIENT"

echo "$want" > "$stamp"
conformance
echo "tests/mcp/setup.sh: done"
