"""Runs the plugin host against a real Zygo (ZYGO_API_URL, and ZYGO_API_TOKEN with deploy
rights; `make verify-plugin-host` starts one) and checks what the layer exists for:

  1. a customer cannot run another customer's plugin by naming its digest;
  2. a customer is held to its own memory limit, not the runtime's.

It also goes through the rest of a plugin host's life: a long plugin streamed, a run
stopped by its key, files in and out, offboarding. Prints one line per check; exits 1 when
one fails.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

from plugin_host import PluginHost, zygo

PLUGIN = '''
import time

def handler(event):
    event = event or {}
    if event.get("hog_mb"):
        block = bytearray(event["hog_mb"] * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        return {"held_mb": event["hog_mb"]}
    if event.get("steps"):
        for n in range(event["steps"]):
            event.progress(f"{n + 1} of {event['steps']}")
            time.sleep(0.05)
        return {"steps": event["steps"]}
    if event.get("sleep"):
        time.sleep(event["sleep"])
    if event.get("files"):
        text = open("in.txt").read()
        open("out.txt", "w").write(text.upper())
        return {"read": len(text)}
    return {"owner": OWNER}
'''

failures = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(name)


def main() -> int:
    u = uuid.uuid4().hex[:6]
    alice, bob = f"alice{u}", f"bob{u}"
    host = PluginHost()
    host.declare_runtime(mem="256M")
    try:
        host.onboard(alice, mem="64M")
        host.onboard(bob)
        a = host.install(alice, f"OWNER = {alice!r}\n" + PLUGIN)
        b = host.install(bob, f"OWNER = {bob!r}\n" + PLUGIN)
        check("each customer runs its own plugin",
              host.run(alice, a)["result"] == {"owner": alice} and host.run(bob, b)["result"] == {"owner": bob})

        # 1. Bob names Alice's digest: the same answer as a digest nobody registered.
        try:
            host.run(bob, a)
            check("a customer cannot run another's plugin by its digest", False, "bob ran alice's plugin")
        except zygo.NotFound as e:
            check("a customer cannot run another's plugin by its digest", True, f"NotFound: {e}")

        # 2. 150 MB: inside the runtime's 256M, beyond Alice's own 64M.
        r = host.run(bob, b, {"hog_mb": 150})
        check("the runtime's limit lets 150 MB through (bob, no limit of his own)", r["result"] == {"held_mb": 150})
        try:
            host.run(alice, a, {"hog_mb": 150})
            check("a customer is held to its own memory limit", False, "alice held 150 MB under 64M")
        except zygo.HandlerError as e:
            # killed at Alice's 64M, not at the runtime's 256M: its peak says which
            peak = (e.body.get("metrics") or {}).get("peak_rss_kb")
            held = e.oom_killed and isinstance(peak, int) and peak <= 64 * 1024
            check("a customer is held to its own memory limit", held, f"oom_killed={e.oom_killed}, peak {peak} kB: {e}")

        # A long one, streamed.
        items = list(host.stream(alice, a, {"steps": 5}))
        progress = [ev.data for ev in items if ev.kind == "progress"]
        check("a long plugin streams its progress", progress == [f"{n} of 5" for n in range(1, 6)]
              and items[-1].is_result, f"{progress}")

        # Stopped by its key.
        key = f"stop-{u}"
        got = []
        t = threading.Thread(target=lambda: got.append(_run_catching(host, alice, a, key)))
        t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                host.stop(alice, key)
                break
            except zygo.NotFound:
                time.sleep(0.05)
        t.join(60)
        check("a run is stopped by its key", bool(got) and isinstance(got[0], zygo.Cancelled), repr(got))

        # Files in and out.
        try:
            out = host.run(alice, a, {"files": True}, files={"in.txt": b"hello files"}, want_files=True)
            check("files in and out", out.get("files", {}).get("out.txt") == b"HELLO FILES", repr(out.get("files")))
        except zygo.BadRequest as e:
            if "not in this version" in str(e):
                print(f"skip files in and out: {e}")
            else:
                check("files in and out", False, str(e))
    finally:
        for c in (alice, bob):
            if c in host.customers:
                gone = host.offboard(c)
                print(f"offboarded {c}: {gone}")
        host.close()
    print("verify-plugin-host:", "FAILED " + ", ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


def _run_catching(host: PluginHost, customer: str, digest: str, key: str) -> object:
    try:
        return host.run(customer, digest, {"sleep": 20}, key=key)
    except zygo.ZygoError as e:
        return e


if __name__ == "__main__":
    sys.exit(main())
