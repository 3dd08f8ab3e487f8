"""A stand-in for `zygo api` that the client tests drive: a real HTTP/1.1 server on a
loopback port or a unix socket, written on raw sockets so that a test can make it hang
up, reset, or stop in the middle of an answer exactly where the test needs it."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit


@dataclass
class Req:
    method: str
    path: str  # decoded path, no query
    raw_path: str
    query: Dict[str, str]
    headers: Dict[str, str]
    body: bytes
    conn: int  # which connection (1, 2, …) it arrived on

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=dict)  # JSON value, or bytes as they are
    headers: Dict[str, str] = field(default_factory=dict)
    close: bool = False  # say Connection: close and close
    hangup_after: bool = False  # close silently after answering (keep-alive advertised)
    chunked: bool = False


@dataclass
class Hangup:
    """Close without answering; ``reset`` sends a TCP RST instead of a FIN."""

    reset: bool = False


@dataclass
class Partial:
    """Send these bytes of an answer, then close."""

    data: bytes = b"HTTP/1.1 200 OK\r\nContent-"


@dataclass
class Stream:
    """An NDJSON answer, chunked, one line per item; ``pause`` seconds between lines;
    ``hang`` keeps the connection open after the lines instead of ending the answer."""

    items: List[Any]
    pause: float = 0.0
    hang: bool = False


Handler = Callable[[Req], Any]

RESULT = {
    "result": {"ok": True},
    "request_id": "req-1",
    "stdout": "",
    "stderr": "",
    "stdout_truncated": False,
    "stderr_truncated": False,
    "started": True,
    "metrics": {"wall_ms": 1.5, "cpu_ms": 1.0, "peak_rss_kb": 1000},
}

FN = {"name": "f", "kind": "function", "state": "ready", "error": None,
      "zygotes": {"ready": 1, "busy": 0, "frozen": 0, "starting": 0}, "in_flight": 0,
      "min_warm": 1, "max_warm": 4}
TENANT = {"id": "acme", "created_ms": 1, "limits": {}, "functions": [], "scripts": [], "tokens": 0}
DIGEST = "sha256:" + "ab" * 32


def default_answer(req: Req) -> Any:
    """A plausible answer for every route of the contract, so that any method can be
    exercised; tests override the handler where they need something else."""
    m, p = req.method, req.path
    if p == "/healthz":
        return Reply(body={"status": "ok"})
    if p == "/version":
        return Reply(body={"version": "0.1.5", "api": 1, "backend": "ns", "cgroup": "v1", "landlock_abi": 3})
    if p == "/fn" and m == "GET":
        return Reply(body={"functions": [FN]})
    if re.fullmatch(r"/fn/[^/]+", p):
        if m == "POST":
            if req.query.get("stream") == "1":
                return Stream([{"stream": "stdout", "data": "hi\n"}, dict(RESULT, status=200)])
            return Reply(body=RESULT)
        if m == "PUT":
            return Reply(body={"name": p[4:], "kind": "function", "state": "serving"})
        return Reply(body={"stopped": p[4:]})
    if p.endswith("/batch"):
        n = len((req.json() or {}).get("events", []))
        return Reply(body={"results": [dict(RESULT, status=200)] * n})
    if p.endswith("/logs"):
        return Reply(body={"logs": [{"request_id": "req-1", "outcome": "ok"}]})
    if p.endswith("/stats"):
        return Reply(body={"name": "f", "requests": 1})
    if p.endswith("/warm"):
        return Reply(body={"name": "f", "ready": 1})
    if p == "/run":
        return Reply(body={"exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False,
                           "peak_rss_kb": 10, "wall_ms": 3.0, "cpu_ms": 1.0, "stdout": "hi\n", "stderr": "",
                           "started": True, "phase": "run", "error": None, "request_id": "req-2"})
    if p == "/runtimes" and m == "GET":
        return Reply(body={"runtimes": [dict(FN, kind="pool")]})
    if p == "/runtimes" and m == "POST":
        return Reply(body={"name": (req.json() or {}).get("name"), "kind": "pool", "state": "serving"})
    if p.endswith("/call"):
        if req.query.get("stream") == "1":
            return Stream([{"stream": "progress", "data": "1 of 2"}, dict(RESULT, status=200)])
        return Reply(body=RESULT)
    if re.fullmatch(r"/runtimes/[^/]+", p):
        return Reply(body={"stopped": p.split("/")[2]})
    if p == "/scripts":
        return Reply(body={"sha256": DIGEST, "size": len(req.body), "existed": False})
    if p.startswith("/scripts/"):
        return Reply(body={"sha256": DIGEST, "size": 3, "held": True} if m == "GET" else {"deleted": DIGEST})
    if p == "/blobs":
        return Reply(body={"sha256": DIGEST, "size": len(req.body), "existed": False})
    if p.startswith("/blobs/"):
        return Reply(body={"deleted": DIGEST})
    if p == "/deps" and m == "POST":
        return Reply(status=202, body={"id": "deps_1", "state": "building", "image": "python:3.12-slim"})
    if p == "/deps":
        return Reply(body={"deps": [{"id": "deps_1", "state": "ready"}]})
    if p.startswith("/deps/"):
        return Reply(body={"id": p[6:], "state": "ready"} if m == "GET" else {"deleted": p[6:]})
    if p.startswith("/requests/"):
        return Reply(body={"cancelled": 1})
    if p == "/tenants" and m == "POST":
        return Reply(body={"tenant": dict(TENANT, id=(req.json() or {}).get("id")), "created": True})
    if p == "/tenants":
        return Reply(body={"tenants": [TENANT]})
    if re.fullmatch(r"/tenants/[^/]+", p):
        if m == "GET":
            return Reply(body=TENANT)
        return Reply(body={"id": "acme", "stopped": [], "scripts_removed": [], "tokens_revoked": 0})
    if p.endswith("/limits"):
        return Reply(body=dict(TENANT, limits=req.json()))
    if p.endswith("/secrets"):
        return Reply(body={"secrets": ["STRIPE_KEY"]})
    if "/secrets/" in p:
        return Reply(body={"tenant": "acme", "name": p.rsplit("/", 1)[1]})
    if m == "POST" and p.endswith("/tokens"):
        tenant = p.split("/")[2] if p.startswith("/tenants/") else None
        return Reply(body={"id": "tok_1", "secret": "zygo_" + "0" * 64, "tenant": tenant, "created_ms": 1})
    if p == "/tokens":
        return Reply(body={"tokens": [{"id": "tok_1", "tenant": None, "created_ms": 1, "revoked_ms": None}]})
    if p.startswith("/tokens/"):
        return Reply(body={"id": p[8:], "revoked": True})
    if p == "/drain":
        return Reply(body={"drained": True, "in_flight": 0})
    return Reply(status=404, body={"error": f"no route {m} {p}", "code": "not_found"})


class FakeAPI:
    def __init__(self, unix: bool = False, tls: Optional[Tuple[str, str]] = None) -> None:
        self.requests: List[Req] = []
        self.handler: Handler = default_answer
        self.connections = 0
        self.closed_by_client = 0  # connections the client closed (EOF seen while idle)
        self._lock = threading.Lock()
        self._stop = False
        self._socks: List[socket.socket] = []
        if unix:
            self._dir = tempfile.mkdtemp(prefix="zygo-sdk-test-")
            self.path = os.path.join(self._dir, "api.sock")
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(self.path)
            self.url = "unix://" + self.path
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("127.0.0.1", 0))
            self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self._tls = None
        if tls is not None:
            import ssl

            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(*tls)
            self.url = "https://localhost:%d" % self.sock.getsockname()[1]
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> "FakeAPI":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
        if hasattr(self, "path"):
            try:
                os.unlink(self.path)
                os.rmdir(self._dir)
            except OSError:
                pass

    def routes(self) -> List[Tuple[str, str]]:
        with self._lock:
            return [(r.method, r.path) for r in self.requests]

    def wait_for(self, pred: Callable[[], bool], timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return True
            time.sleep(0.01)
        return pred()

    def _accept(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self._tls is not None:
                try:
                    c.settimeout(5)
                    c = self._tls.wrap_socket(c, server_side=True)
                    c.settimeout(None)
                except OSError:
                    c.close()
                    continue
            with self._lock:
                self.connections += 1
                n = self.connections
                self._socks.append(c)
            threading.Thread(target=self._serve, args=(c, n), daemon=True).start()

    def _read_request(self, c: socket.socket, buf: bytearray, n: int) -> Optional[Req]:
        while b"\r\n\r\n" not in buf:
            data = c.recv(65536)
            if not data:
                return None
            buf += data
        end = buf.index(b"\r\n\r\n")
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        del buf[: end + 4]
        method, target, _ = head[0].split(" ", 2)
        headers = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        while len(buf) < length:
            data = c.recv(65536)
            if not data:
                return None
            buf += data
        body = bytes(buf[:length])
        del buf[:length]
        u = urlsplit(target)
        return Req(method, unquote(u.path), u.path, dict(parse_qsl(u.query)), headers, body, n)

    def _serve(self, c: socket.socket, n: int) -> None:
        buf = bytearray()
        try:
            while True:
                req = self._read_request(c, buf, n)
                if req is None:
                    with self._lock:
                        self.closed_by_client += 1
                    return
                with self._lock:
                    self.requests.append(req)
                action = self.handler(req)
                if isinstance(action, Hangup):
                    if action.reset:
                        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if isinstance(action, Partial):
                    c.sendall(action.data)
                    return
                if isinstance(action, Stream):
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                              b"Transfer-Encoding: chunked\r\nX-Zygo-Request-Id: req-s\r\n\r\n")
                    for item in action.items:
                        line = (json.dumps(item) + "\n").encode()
                        c.sendall(b"%x\r\n%s\r\n" % (len(line), line))
                        if action.pause:
                            time.sleep(action.pause)
                    if action.hang:
                        while c.recv(65536):
                            pass
                        with self._lock:
                            self.closed_by_client += 1
                        return
                    c.sendall(b"0\r\n\r\n")
                    continue
                body = action.body if isinstance(action.body, bytes) else json.dumps(action.body).encode()
                hdrs = {"Content-Type": "application/json", "X-Zygo-Request-Id": "req-x"}
                hdrs.update(action.headers)
                if action.close:
                    hdrs["Connection"] = "close"
                head = "HTTP/1.1 %d X\r\n" % action.status
                head += "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
                if action.chunked:
                    head += "Transfer-Encoding: chunked\r\n\r\n"
                    data = head.encode()
                    for i in range(0, len(body), 7):
                        piece = body[i : i + 7]
                        data += b"%x\r\n%s\r\n" % (len(piece), piece)
                    data += b"0\r\n\r\n"
                else:
                    data = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
                c.sendall(data)
                if action.close or action.hangup_after:
                    return
        except OSError:
            return
        finally:
            try:
                c.close()
            except OSError:
                pass
