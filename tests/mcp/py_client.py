"""Drive `zygo mcp` with the official MCP Python SDK (PyPI `mcp`), as an agent host does.

Run by tests/tests/mcp.rs with the interpreter of a venv made by tests/mcp/setup.sh:
`py1` holds mcp 1.x (the handshake revisions), `py2` mcp 2.x (adds the stateless
2026-07-28 revision).

    python py_client.py --zygo PATH SCENARIO [--revision REV] [-- ZYGO_MCP_ARGS...]

Scenarios:
    basics     list tools; run Python, JavaScript and sh; stdin; a traceback; /work persists
               across calls; /zygo is read-only; bad arguments; an unknown tool; no supervisor
    limits     a timeout and an out-of-memory kill, reported in words (start zygo mcp with
               small limits)
    cancel     cancel a running run_code; its sandbox is gone within seconds
    functions  list, call and read the logs of a warm function (a supervisor must run)
    stateless  (mcp 2.x) the 2026-07-28 revision: no handshake, server/discover

zygo mcp gets this process's ZYGO_* variables. On success one JSON line of observations is
printed and the exit code is 0; the first failed check prints FAILED: ... and exits 1.
"""

import argparse
import asyncio
import importlib.metadata
import json
import os
import sys
import time

MCP_VERSION = importlib.metadata.version("mcp")
MAJOR = int(MCP_VERSION.split(".")[0])

from mcp import StdioServerParameters  # noqa: E402

if MAJOR < 2:
    import mcp.types as types  # noqa: E402
    from mcp import ClientSession  # noqa: E402
    from mcp.client.stdio import stdio_client  # noqa: E402
    from mcp.shared.exceptions import McpError as RpcError  # noqa: E402
else:
    from mcp import Client  # noqa: E402
    from mcp.shared.exceptions import MCPError as RpcError  # noqa: E402

TOOLS = ["run_code", "list_functions", "call_function", "function_logs"]
NO_SUPERVISOR = "no supervisor is running; start one with `zygo up`"


def check(cond, what, got=None):
    if not cond:
        print(f"FAILED: {what}: {got!r}", file=sys.stderr)
        sys.exit(1)


def dump(model):
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def structured(result):
    """The structured result; under revisions without structuredContent, the JSON text."""
    d = dump(result)
    if "structuredContent" in d:
        text = json.loads(d["content"][0]["text"])
        check(text == d["structuredContent"], "the text block holds the structured result", d)
        return d["structuredContent"]
    return json.loads(d["content"][0]["text"])


def is_error(result):
    return bool(dump(result).get("isError"))


def server_params(zygo, args):
    env = {k: v for k, v in os.environ.items() if k.startswith("ZYGO_") or k in ("PATH", "HOME")}
    return StdioServerParameters(command=zygo, args=["mcp", *args], env=env)


class Session:
    """The same calls over mcp 1.x's ClientSession and mcp 2.x's Client."""

    def __init__(self, inner, revision):
        self.inner = inner
        self.revision = revision

    async def list_tools(self):
        return await self.inner.list_tools()

    async def call(self, name, arguments):
        return await self.inner.call_tool(name, arguments)

    async def run(self, language, code, stdin=None):
        args = {"language": language, "code": code}
        if stdin is not None:
            args["stdin"] = stdin
        r = await self.call("run_code", args)
        return r, structured(r)


async def open_session(zygo, zargs, revision, body):
    params = server_params(zygo, zargs)
    if MAJOR < 2:
        if revision:
            # mcp 1.x asks for its newest revision; ask for another, as an older client would.
            types.LATEST_PROTOCOL_VERSION = revision
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                return await body(Session(s, init.protocolVersion))
    mode = "auto" if revision in (None, "2026-07-28") else "legacy"
    async with Client(params, mode=mode) as c:
        return await body(Session(c, c.session.protocol_version))


def proc_with(argv):
    """Host pids whose command line is exactly `argv`."""
    want = ("\0".join(argv) + "\0").encode()
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read() == want:
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def wait_for(pred, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    check(False, what, f"not within {seconds}s")


async def basics(s, want_revision):
    obs = {"revision": s.revision, "sdk": MCP_VERSION}
    if want_revision:
        check(s.revision == want_revision, "negotiated the revision asked for", s.revision)
    tools = dump(await s.list_tools())["tools"]
    names = [t["name"] for t in tools]
    check(names == TOOLS, "the four tools", names)
    structured_revision = s.revision >= "2025-06-18"
    for t in tools:
        check("inputSchema" in t, "inputSchema", t)
        check(("outputSchema" in t) == structured_revision, "outputSchema where the revision has it", t)
    obs["tools"] = names

    r, v = await s.run("python", "import sys\nprint('py', sys.version_info[0])\nopen('note.txt', 'w').write('kept')\n")
    check(not is_error(r) and v["exit_code"] == 0 and v["stdout"] == "py 3\n", "python runs", v)
    r, v = await s.run("javascript", "console.log('js', 6 * 7)")
    check(not is_error(r) and v["stdout"] == "js 42\n", "javascript runs", v)
    r, v = await s.run("sh", "echo sh $(cat note.txt) in $(pwd)")
    check(not is_error(r) and v["stdout"] == "sh kept in /work\n", "sh runs and /work persists", v)
    r, v = await s.run("python", "import sys\nprint(sys.stdin.read().upper())", stdin="abc")
    check(v["stdout"] == "ABC\n", "stdin is fed", v)
    r, v = await s.run("python", "def f():\n    return 1 / 0\nf()\n")
    check(is_error(r) and v["exit_code"] == 1, "a traceback is a tool error", v)
    check("ZeroDivisionError" in v["stderr"] and '"/zygo/main.py", line 2' in v["stderr"],
          "the traceback names the real file", v["stderr"])
    r, v = await s.run("sh", "echo changed > /zygo/main.sh")
    check(is_error(r) and v["exit_code"] != 0, "the code's folder is read-only", v)
    r, v = await s.run("sh", "exit 3")
    check(is_error(r) and v["exit_code"] == 3 and v["error"] is None, "an exit code is passed on", v)

    # A field that would widen the sandbox is refused, as a protocol error before 2025-11-25
    # and as a tool error (the model can correct itself) from then on.
    try:
        r = await s.call("run_code", {"language": "sh", "code": "true", "mem": "64G"})
        check(s.revision >= "2025-11-25" and is_error(r), "a widening argument is refused", dump(r))
        check("fixed by whoever started the server" in structured(r)["error"], "says why", dump(r))
        obs["widening"] = "tool error"
    except RpcError as e:
        check(s.revision < "2025-11-25", "a protocol error only before 2025-11-25", str(e))
        obs["widening"] = "protocol error"
    try:
        await s.call("no_such_tool", {})
        check(False, "an unknown tool is a protocol error", "it answered")
    except RpcError as e:
        obs["unknown_tool"] = str(e)

    r = await s.call("list_functions", {})
    v = structured(r)
    # In words, naming the socket it looked for.
    check(is_error(r) and v["error"].startswith(NO_SUPERVISOR) and "zygo.sock" in v["error"],
          "no supervisor, in words", v)
    obs["ok"] = True
    return obs


async def limits(s, _rev):
    t0 = time.monotonic()
    r, v = await s.run("python", "b = bytearray(512 << 20)\nprint(len(b))\n")
    check(is_error(r) and v["oom_killed"] and v["exit_code"] == 137, "an OOM kill", v)
    check(v["error"] == "ran out of memory (limit 64M)", "the OOM in words", v["error"])
    r, v = await s.run("sh", "echo before; sleep 30; echo after")
    check(is_error(r) and v["timed_out"] and v["stdout"] == "before\n", "a timeout", v)
    check(v["error"] == "exceeded its 2s time limit", "the timeout in words", v["error"])
    took = time.monotonic() - t0
    check(took < 15, "the timeout is enforced on time", took)
    return {"ok": True, "oom": "ran out of memory (limit 64M)", "timeout": v["error"], "seconds": round(took, 2)}


async def cancel(s, _rev):
    marker = ["sleep", f"41.{os.getpid()}"]
    code = f"echo started > started; {' '.join(marker)}; echo done > done"
    loop = asyncio.get_running_loop()
    if MAJOR < 2:
        # mcp 1.x does not cancel on its own: send notifications/cancelled for the request id
        # it is about to use, as a host does when the user presses stop.
        rid = s.inner._request_id
        task = loop.create_task(s.call("run_code", {"language": "sh", "code": code}))
        await asyncio.to_thread(wait_for, lambda: proc_with(marker), 20, "the sandbox started")
        t0 = time.monotonic()
        await s.inner.send_notification(types.ClientNotification(types.CancelledNotification(
            method="notifications/cancelled",
            params=types.CancelledNotificationParams(requestId=rid, reason="test cancel"))))
        await asyncio.to_thread(wait_for, lambda: not proc_with(marker), 10, "the cancelled sandbox is gone")
        gone = time.monotonic() - t0
        task.cancel()
        try:
            await task
            check(False, "a cancelled request gets no answer", "it answered")
        except asyncio.CancelledError:
            pass
    else:
        # mcp 2.x sends notifications/cancelled itself when a call is abandoned.
        task = loop.create_task(s.call("run_code", {"language": "sh", "code": code}))
        await asyncio.to_thread(wait_for, lambda: proc_with(marker), 20, "the sandbox started")
        t0 = time.monotonic()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await asyncio.to_thread(wait_for, lambda: not proc_with(marker), 10, "the cancelled sandbox is gone")
        gone = time.monotonic() - t0
    r, v = await s.run("sh", "ls")
    check(v["stdout"].split() == ["started"], "the cancelled program stopped before its end", v)
    return {"ok": True, "gone_after_s": round(gone, 2)}


async def functions(s, _rev):
    r = await s.call("list_functions", {})
    v = structured(r)
    check(not is_error(r), "list_functions works", v)
    hello = [f for f in v["functions"] if f["name"] == "hello"]
    check(hello and hello[0]["state"] == "serving", "hello is served", v)
    r = await s.call("call_function", {"name": "hello", "event": {"name": "ada"}})
    v = structured(r)
    check(not is_error(r) and v["outcome"] == "ok", "call_function works", v)
    check(v["result"] == {"greeting": "hello ada"}, "the handler's value", v)
    check("saw" in v["stdout"], "the handler's stdout", v)
    r = await s.call("call_function", {"name": "hello", "event": {"fail": True}})
    v = structured(r)
    check(is_error(r) and "asked to fail" in (v["error"] or ""), "a raised error, in words", v)
    check("hello.py" in (v["traceback"] or ""), "with its traceback", v)
    r = await s.call("function_logs", {"name": "hello", "limit": 1000})
    v = structured(r)
    check(not is_error(r) and 2 <= len(v["entries"]) <= 200, "function_logs, limit clamped", v)
    entries = len(v["entries"])
    r = await s.call("call_function", {"name": "nope", "event": {}})
    v = structured(r)
    check(is_error(r) and v["outcome"] == "refused", "an unknown function is a tool error", v)
    check("nope" in v["error"], "it names the function", v)
    return {"ok": True, "result": {"greeting": "hello ada"}, "entries": entries}


async def stateless(s, _rev):
    check(MAJOR >= 2, "the stateless revision needs mcp 2.x", MCP_VERSION)
    check(s.revision == "2026-07-28", "the stateless revision was chosen", s.revision)
    d = dump(s.inner.session.discover_result)
    check("2026-07-28" in d["supportedVersions"], "server/discover lists it", d)
    check("warm function" in d.get("instructions", ""), "the instructions", d)
    names = [t["name"] for t in dump(await s.list_tools())["tools"]]
    check(names == TOOLS, "the four tools", names)
    r, v = await s.run("python", "open('n', 'w').write('7')\nprint(6 * 7)")
    check(not is_error(r) and v["stdout"] == "42\n", "python runs", v)
    r, v = await s.run("sh", "cat n")
    check(v["stdout"] == "7", "/work persists", v)
    obs = {"ok": True, "revision": s.revision, "sdk": MCP_VERSION}
    if os.environ.get("ZYGO_TEST_FUNCTIONS"):
        r = await s.call("call_function", {"name": "hello", "event": {"name": "bo"}})
        v = structured(r)
        check(not is_error(r) and v["result"] == {"greeting": "hello bo"}, "a warm function", v)
        obs["function"] = v["result"]
    return obs


SCENARIOS = {"basics": basics, "limits": limits, "cancel": cancel, "functions": functions,
             "stateless": stateless}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zygo", required=True)
    ap.add_argument("--revision")
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("zygo_args", nargs="*")
    a = ap.parse_args()
    body = SCENARIOS[a.scenario]

    async def run():
        async def inner(s):
            return await body(s, a.revision)
        return await asyncio.wait_for(open_session(a.zygo, a.zygo_args, a.revision, inner), 90)

    obs = asyncio.run(run())
    print(json.dumps(obs))


if __name__ == "__main__":
    main()
