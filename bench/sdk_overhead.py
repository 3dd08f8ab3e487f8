#!/usr/bin/env python3
"""What the Python client adds to a warm call, against a raw keep-alive http.client call
to the same function on the same API, side by side in one run.

    ZYGO_API_TOKEN=… bench/sdk_overhead.py --url http://127.0.0.1:7700 --function echo
    bench/sdk_overhead.py --stand-in          # no Zygo needed: a canned keep-alive server

Both paths send the same request (POST /fn/NAME, the same headers and JSON body) over one
kept-alive connection and parse the JSON answer; the client also builds its Result and
checks the status. Each path gets --warmup calls first (not counted); then the two are run
in rounds, one call each per round in a random order (seeded), so both share the machine's
noise. Prints the median, mean and p90 of each, the difference of the medians and the
median of the per-round differences. The target is at most 0.2 ms added per call.

--stand-in answers from a separate process with a fixed body, so the figure is the
client's own cost with no sandbox behind it; against a real API the same difference holds
with the function's time on both sides.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "sdk", "python"))

import zygo_sdk as zygo  # noqa: E402
from zygo_sdk._http import parse_address  # noqa: E402

STAND_IN = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BODY = json.dumps({"result": {"ok": True}, "request_id": "req-1", "stdout": "", "stderr": "",
                   "stdout_truncated": False, "stderr_truncated": False, "started": True,
                   "metrics": {"wall_ms": 0.4, "cpu_ms": 0.3, "peak_rss_kb": 9000}}).encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *a):
        pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
'''


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def raw_connection(url: str) -> http.client.HTTPConnection:
    a = parse_address(url)
    if a.kind == "unix":
        return UnixHTTPConnection(a.path)
    if a.tls:
        return http.client.HTTPSConnection(a.host, a.port)
    c = http.client.HTTPConnection(a.host, a.port)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="the API (default: ZYGO_API_URL, else http://127.0.0.1:7700)")
    ap.add_argument("--token", default=None, help="bearer token (default: ZYGO_API_TOKEN)")
    ap.add_argument("--function", default="echo", help="a warm function to call (default: echo)")
    ap.add_argument("--event", default='{"n": 1}', help="the event, JSON")
    ap.add_argument("-n", "--reps", type=int, default=2000, help="calls per path (default 2000)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stand-in", action="store_true", help="answer from a canned local server instead of Zygo")
    args = ap.parse_args()

    server = None
    if args.stand_in:
        server = subprocess.Popen([sys.executable, "-c", STAND_IN], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        args.url = f"http://127.0.0.1:{server.stdout.readline().strip()}"
    url = args.url or os.environ.get("ZYGO_API_URL") or "http://127.0.0.1:7700"
    token = args.token if args.token is not None else os.environ.get("ZYGO_API_TOKEN")
    event = json.loads(args.event)

    try:
        client = zygo.connect(url, token)
        raw = raw_connection(url)
        a = parse_address(url)
        body = json.dumps(event, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Host": a.host_header}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        path = a.prefix + "/fn/" + args.function

        def raw_call() -> None:
            raw.request("POST", path, body=body, headers=headers)
            r = raw.getresponse()
            data = r.read()
            if r.status != 200:
                raise SystemExit(f"raw call: HTTP {r.status}: {data[:300]!r}")
            json.loads(data)

        def sdk_call() -> None:
            client.call(args.function, event)

        for _ in range(args.warmup):
            raw_call()
            sdk_call()

        rng = random.Random(args.seed)
        samples: dict = {"raw": [], "sdk": []}
        fns = {"raw": raw_call, "sdk": sdk_call}
        clock = time.perf_counter
        for _ in range(args.reps):
            order = ["raw", "sdk"]
            rng.shuffle(order)
            for k in order:
                t = clock()
                fns[k]()
                samples[k].append((clock() - t) * 1000)

        def row(name: str, xs: list) -> str:
            xs_sorted = sorted(xs)
            p90 = xs_sorted[int(len(xs_sorted) * 0.9)]
            return f"{name:<34} median {statistics.median(xs):7.3f} ms   mean {statistics.fmean(xs):7.3f} ms   p90 {p90:7.3f} ms"

        print(f"API {url}{' (stand-in)' if args.stand_in else ''}, function {args.function!r}, {args.reps} calls per path, Python {sys.version.split()[0]}")
        print(row("raw http.client (keep-alive)", samples["raw"]))
        print(row("zygo_sdk client.call", samples["sdk"]))
        added = statistics.median(samples["sdk"]) - statistics.median(samples["raw"])
        paired = statistics.median(s - r for s, r in zip(samples["sdk"], samples["raw"]))
        print(f"added by the client: {added:+.3f} ms (difference of medians), {paired:+.3f} ms (median of per-round differences); target <= 0.200 ms")
        return 0
    finally:
        if server is not None:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    sys.exit(main())
