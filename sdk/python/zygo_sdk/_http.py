"""HTTP/1.1 over TCP, TLS or a unix socket, written out by hand so that the client knows
exactly whether any byte of an answer arrived: that decides whether a request on a reused
connection may be sent again (nothing came back, so it never ran) or must be reported as a
TransportError (something came back, so it may have run)."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote

from .errors import TransportError

DEFAULT_URL = "http://127.0.0.1:7700"
# The API hangs up on a connection that has waited 30 s for its next request; a pooled
# connection idle for longer than this is dropped rather than reused.
MAX_IDLE = 20.0
CONNECT_TIMEOUT = 10.0
MAX_HEAD = 64 * 1024
MAX_BODY = 1 << 30
MAX_LINE = 64 * 1024 * 1024


@dataclass(frozen=True)
class Address:
    """Where the API is: ``kind`` is ``unix`` (``path``) or ``tcp`` (``host``, ``port``,
    ``tls``)."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""
    tls: bool = False
    prefix: str = ""

    @property
    def host_header(self) -> str:
        if self.kind == "unix":
            return "localhost"
        h = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls else 80
        return h if self.port == default else f"{h}:{self.port}"

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix://{self.path}"
        return f"{'https' if self.tls else 'http'}://{self.host_header}{self.prefix}"


def _host_port(s: str, default_port: int, url: str) -> Tuple[str, int]:
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError(f"bad address {url!r}: unclosed '[' in the host")
        host, rest = s[1:end], s[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad address {url!r}")
        port_s = rest[1:] if rest else ""
    elif s.count(":") == 1:
        host, port_s = s.split(":")
    elif ":" in s:
        raise ValueError(f"bad address {url!r}: an IPv6 host goes in brackets, [::1]:7700")
    else:
        host, port_s = s, ""
    if not host:
        raise ValueError(f"bad address {url!r}: no host")
    if port_s:
        if not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise ValueError(f"bad address {url!r}: the port must be a number from 1 to 65535")
        return host, int(port_s)
    return host, default_port


def parse_address(url: Optional[str]) -> Address:
    """The API's address from ``url``, else ``ZYGO_API_URL``, else ``http://127.0.0.1:7700``.
    Accepted: ``unix:///path``, ``http://host[:port]``, ``https://host[:port]``, and a bare
    ``host:port``."""
    if not url:
        url = os.environ.get("ZYGO_API_URL") or DEFAULT_URL
    url = url.strip()
    if url.startswith("unix://"):
        path = url[len("unix://") :]
        if not path.startswith("/"):
            raise ValueError(f"bad address {url!r}: a unix socket is unix:///absolute/path")
        return Address("unix", path=path)
    for scheme, tls, port in (("http://", False, 80), ("https://", True, 443)):
        if url.startswith(scheme):
            rest = url[len(scheme) :]
            hostport, slash, prefix = rest.partition("/")
            prefix = ("/" + prefix).rstrip("/") if slash else ""
            host, p = _host_port(hostport, port, url)
            return Address("tcp", host=host, port=p, tls=tls, prefix=prefix)
    if "://" in url:
        raise ValueError(f"bad address {url!r}: use unix://, http://, https:// or host:port")
    host, p = _host_port(url, 0, url)
    if not p:
        raise ValueError(f"bad address {url!r}: a bare address needs a port, host:port")
    return Address("tcp", host=host, port=p)


def path_part(s: str) -> str:
    """One path segment, escaped."""
    if not isinstance(s, str) or not s:
        raise ValueError(f"expected a non-empty name, got {s!r}")
    return quote(s, safe="")


def target(addr: Address, path: str, query: Optional[List[Tuple[str, str]]]) -> str:
    t = addr.prefix + path
    if query:
        t += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe=':')}" for k, v in query)
    return t


def encode_request(method: str, tgt: str, headers: List[Tuple[str, str]], body: Optional[bytes]) -> bytes:
    lines = [f"{method} {tgt} HTTP/1.1"]
    for k, v in headers:
        if "\r" in v or "\n" in v:
            raise ValueError(f"header {k} must not contain a line break")
        lines.append(f"{k}: {v}")
    if body is not None or method in ("POST", "PUT", "PATCH", "DELETE"):
        lines.append(f"Content-Length: {len(body) if body else 0}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


class BeforeFirstByte(Exception):
    """The connection ended (or was reset) before any byte of the answer arrived."""


class Head:
    __slots__ = ("status", "headers")

    def __init__(self, status: int, headers: Dict[str, str]) -> None:
        self.status = status
        self.headers = headers


def parse_head(raw: bytes) -> Head:
    try:
        text = raw.decode("latin-1")
        lines = text.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ValueError(lines[0][:100])
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            k, sep, v = line.partition(":")
            if not sep:
                raise ValueError(line[:100])
            k = k.strip().lower()
            v = v.strip()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        return Head(int(parts[1]), headers)
    except ValueError as e:
        raise TransportError(f"the answer is not HTTP: {e}") from None


def framing(head: Head) -> Tuple[str, int]:
    """How the body is delimited: (``chunked``|``length``|``close``, length)."""
    te = head.headers.get("transfer-encoding", "").lower()
    if "chunked" in te:
        return "chunked", 0
    cl = head.headers.get("content-length")
    if cl is not None:
        if not cl.isdigit() or int(cl) > MAX_BODY:
            raise TransportError(f"bad Content-Length {cl[:40]!r}")
        return "length", int(cl)
    if head.status in (204, 304) or 100 <= head.status < 200:
        return "length", 0
    return "close", 0


def keeps_alive(head: Head) -> bool:
    return "close" not in head.headers.get("connection", "").lower()


class Conn:
    """One connection: a socket and what has been read from it but not yet used."""

    __slots__ = ("sock", "buf", "got", "idle_since", "addr")

    def __init__(self, sock: socket.socket, addr: Address) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.got = False
        self.idle_since = 0.0
        self.addr = addr

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _more(self) -> bool:
        data = self.sock.recv(262144)
        if not data:
            return False
        self.got = True
        self.buf += data
        return True

    def send(self, data: bytes) -> None:
        self.got = False
        self.sock.sendall(data)

    def read_head(self) -> Head:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end > MAX_HEAD:
                raise TransportError("the answer's headers are larger than 64 KiB")
            if end >= 0:
                raw = bytes(self.buf[:end])
                del self.buf[: end + 4]
                head = parse_head(raw)
                if 100 <= head.status < 200:
                    continue  # an interim answer; the real one follows
                return head
            if len(self.buf) > MAX_HEAD:
                raise TransportError("the answer's headers are larger than 64 KiB")
            try:
                more = self._more()
            except (ConnectionResetError, BrokenPipeError) as e:
                if not self.got:
                    raise BeforeFirstByte(str(e)) from None
                raise
            if not more:
                if not self.got:
                    raise BeforeFirstByte("the connection was closed")
                raise TransportError("the connection closed in the middle of the answer's headers")

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._more():
                raise TransportError("the connection closed in the middle of the answer")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _line(self, cap: int) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                out = bytes(self.buf[: i + 1])
                del self.buf[: i + 1]
                return out
            if len(self.buf) > cap:
                raise TransportError("a line of the answer is too long")
            if not self._more():
                raise TransportError("the connection closed in the middle of the answer")

    def pieces(self, head: Head) -> Iterator[bytes]:
        """The body, piece by piece, as it arrives."""
        how, n = framing(head)
        if how == "length":
            while n > 0:
                if not self.buf and not self._more():
                    raise TransportError("the connection closed in the middle of the answer")
                take = min(n, len(self.buf))
                piece = bytes(self.buf[:take])
                del self.buf[:take]
                n -= take
                yield piece
        elif how == "chunked":
            total = 0
            while True:
                line = self._line(4096).strip()
                size_s = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_s, 16)
                except ValueError:
                    raise TransportError(f"bad chunk size {size_s[:20]!r}") from None
                if size == 0:
                    while self._line(MAX_HEAD).strip():
                        pass  # trailers
                    return
                total += size
                if total > MAX_BODY:
                    raise TransportError("the answer is larger than 1 GiB")
                yield self._exact(size)
                self._exact(2)
        else:
            if self.buf:
                yield bytes(self.buf)
                self.buf.clear()
            total = 0
            while self._more():
                total += len(self.buf)
                if total > MAX_BODY:
                    raise TransportError("the answer is larger than 1 GiB")
                yield bytes(self.buf)
                self.buf.clear()

    def read_body(self, head: Head) -> bytes:
        how, n = framing(head)
        if how == "length":
            return self._exact(n) if n else b""
        return b"".join(self.pieces(head))


def lines(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Newline-delimited lines out of body pieces."""
    buf = b""
    for p in pieces:
        buf += p
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            line, buf = buf[:i], buf[i + 1 :]
            if line.strip():
                yield line
        if len(buf) > MAX_LINE:
            raise TransportError("a line of the stream is longer than 64 MiB")
    if buf.strip():
        yield buf


def open_socket(addr: Address, timeout: float, ssl_context: Optional[ssl.SSLContext]) -> socket.socket:
    """A new connection to the API, or TransportError naming where and why."""
    try:
        if addr.kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(timeout)
                s.connect(addr.path)
            except BaseException:
                s.close()
                raise
            return s
        s = socket.create_connection((addr.host, addr.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if addr.tls:
            ctx = ssl_context or ssl.create_default_context()
            try:
                s = ctx.wrap_socket(s, server_hostname=addr.host)
            except BaseException:
                s.close()
                raise
        return s
    except (OSError, ssl.SSLError) as e:
        raise TransportError(f"cannot connect to the Zygo API at {addr}: {e}") from None


class Pool:
    """Idle connections, shared by every view of one client and safe across threads. The
    most recently used connection is handed out first; one idle for more than 20 s is
    closed instead."""

    def __init__(self, addr: Address, size: int, ssl_context: Optional[ssl.SSLContext]) -> None:
        self.addr = addr
        self.size = size
        self.ssl_context = ssl_context
        self.clock: Callable[[], float] = time.monotonic
        self._idle: List[Conn] = []
        self._lock = threading.Lock()

    def take(self) -> Optional[Conn]:
        stale: List[Conn] = []
        found: Optional[Conn] = None
        now = self.clock()
        with self._lock:
            while self._idle:
                c = self._idle.pop()
                if now - c.idle_since > MAX_IDLE:
                    stale.append(c)
                    continue
                found = c
                break
        for c in stale:
            c.close()
        return found

    def give(self, c: Conn) -> None:
        if c.buf:
            c.close()  # bytes nobody asked for: the connection is out of step
            return
        c.idle_since = self.clock()
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(c)
                return
        c.close()

    def open(self, timeout: float = CONNECT_TIMEOUT) -> Conn:
        return Conn(open_socket(self.addr, timeout, self.ssl_context), self.addr)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)
