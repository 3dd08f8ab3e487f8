#!/usr/bin/env bash
# Install the official MCP client SDKs that tests/tests/mcp.rs drives `zygo mcp` with:
#   - PyPI `mcp` 1.x (handshake revisions 2024-11-05 .. 2025-11-25) in a venv `py1`
#   - PyPI `mcp` 2.x (adds the stateless 2026-07-28 revision) in a venv `py2`
#   - npm `@modelcontextprotocol/sdk` 1.x (handshake) and `@modelcontextprotocol/client` 2.x
#     (stateless) in `node/node_modules`
# into $ZYGO_MCP_SDK_DIR (default: ${XDG_CACHE_HOME:-$HOME/.cache}/zygo-mcp-sdk).
#
# Idempotent: a stamp file records the pinned versions; a second run with the same pins
# does nothing. Needs network access to PyPI and the npm registry only.
set -euo pipefail

PY1_MCP=1.30.0
PY2_MCP=2.3.0
NODE_SDK=1.32.2
NODE_CLIENT=2.4.0

dir="${ZYGO_MCP_SDK_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/zygo-mcp-sdk}"
stamp="$dir/.installed"
want="py1 mcp==$PY1_MCP; py2 mcp==$PY2_MCP; node @modelcontextprotocol/sdk@$NODE_SDK @modelcontextprotocol/client@$NODE_CLIENT"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && [ -x "$dir/py1/bin/python" ] && [ -x "$dir/py2/bin/python" ] \
    && [ -d "$dir/node/node_modules/@modelcontextprotocol/sdk" ] \
    && [ -d "$dir/node/node_modules/@modelcontextprotocol/client" ]; then
    echo "tests/mcp/setup.sh: MCP client SDKs already installed in $dir"
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
echo "tests/mcp/setup.sh: done"
