"""The plain (blocking) client."""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import __version__
from ._http import (
    CONNECT_TIMEOUT,
    Address,
    BeforeFirstByte,
    Conn,
    Head,
    Pool,
    encode_request,
    keeps_alive,
    lines,
    parse_address,
    target,
)
from ._surface import Op, Surface
from .errors import Busy, TransportError, Unavailable, ZygoError, error_from_answer
from .types import Result, StreamEvent

DEFAULT_WAIT = 60.0  # the API's own default wait (X-Zygo-Timeout-Ms)
SLACK = 10.0  # how much longer than the API's wait the socket waits for an answer

# A request refused as Busy (429: nothing of it ran) once ``retries`` are used up is sent
# again while ``retry_busy`` is on: after the server's Retry-After (BUSY_WAIT without
# one), each wait between BUSY_WAIT_MIN and BUSY_WAIT_MAX, for as long as the next send
# comes within BUSY_FOR of the first, and within the call's own timeout when it has one.
BUSY_WAIT = 1.0
BUSY_WAIT_MIN = 0.1
BUSY_WAIT_MAX = 5.0
BUSY_FOR = 30.0


def retry_after(head: Head) -> Optional[float]:
    v = head.headers.get("retry-after")
    if v is None:
        return None
    try:
        f = float(v)
    except ValueError:
        return None
    return f if f >= 0 else None


def parse_json(raw: bytes, head: Head) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        if head.status >= 400:
            return raw.decode("utf-8", "replace")
        raise TransportError(f"the answer (HTTP {head.status}) is not JSON: {raw[:200]!r}") from None


def stream_item(line: bytes) -> Tuple[Optional[StreamEvent], Optional[Dict[str, Any]]]:
    """One NDJSON line: an output event, or the final answer (with its ``status``)."""
    try:
        v = json.loads(line)
    except ValueError:
        raise TransportError(f"a line of the stream is not JSON: {line[:200]!r}") from None
    if not isinstance(v, dict):
        raise TransportError(f"a line of the stream is not an object: {line[:200]!r}")
    kind = v.get("stream")
    if isinstance(kind, str) and "status" not in v:
        return StreamEvent(kind, v.get("data")), None
    return None, v


def final_item(v: Dict[str, Any]) -> StreamEvent:
    """The stream's last line as its result item, or the error it stands for."""
    status = v.get("status", 200)
    if status == 200:
        return StreamEvent("result", result=Result.from_json(v))
    raise error_from_answer(status if isinstance(status, int) else 500, v)


class _Shared:
    """What every view of one client shares: the address, the token and the pool."""

    def __init__(
        self,
        addr: Address,
        token: Optional[str],
        pool_size: int,
        ssl_context: Optional[ssl.SSLContext],
    ) -> None:
        self.addr = addr
        self.token = token
        self.pool = Pool(addr, pool_size, ssl_context)
        self.base_headers: List[Tuple[str, str]] = [
            ("Host", addr.host_header),
            ("User-Agent", f"zygo-sdk-python/{__version__}"),
        ]
        if token:
            self.base_headers.append(("Authorization", f"Bearer {token}"))


class _Sending:
    """What the plain and the asyncio client share about sending: the request's bytes and
    the wait before a retry."""

    _shared: _Shared
    _tenant: Optional[str]
    timeout: Optional[float]
    retries: int
    backoff: float
    retry_busy: bool
    _clock: Callable[[], float]

    def _timeout_of(self, op: Op) -> Optional[float]:
        """The timeout ``op`` is sent with (``X-Zygo-Timeout-Ms``), if any."""
        return op.timeout if op.timeout is not None else self.timeout if op.cancellable else None

    def _request_bytes(self, op: Op) -> Tuple[bytes, float]:
        headers = list(self._shared.base_headers)
        if self._tenant:
            headers.append(("X-Zygo-Tenant", self._tenant))
        wait = op.wait if op.wait is not None else DEFAULT_WAIT
        timeout = self._timeout_of(op)
        if timeout is not None:
            if timeout <= 0:
                raise ValueError("timeout must be a positive number of seconds")
            headers.append(("X-Zygo-Timeout-Ms", str(max(1, round(timeout * 1000)))))
            wait = timeout
        if op.key is not None:
            headers.append(("X-Zygo-Request-Key", op.key))
        if op.ctype and op.body is not None:
            headers.append(("Content-Type", op.ctype))
        data = encode_request(op.method, target(self._shared.addr, op.path, op.query), headers, op.body)
        return data, wait + SLACK

    def _wait_before(self, attempt: int, e: ZygoError) -> float:
        return max(e.retry_after or 0.0, self.backoff * (2**attempt))

    def _again(self, e: ZygoError, attempt: int, op: Op, began: float) -> Optional[float]:
        """How long to wait before sending ``op`` again after refusal ``e`` (its
        ``attempt``-th, counting from 0; ``began``: when it was first sent, on
        ``self._clock``), or None to raise ``e``. Only Busy and Unavailable are ever sent
        again: both mean the request never ran."""
        if not isinstance(e, (Busy, Unavailable)):
            return None
        if attempt < self.retries:
            return self._wait_before(attempt, e)
        if not isinstance(e, Busy) or not self.retry_busy:
            return None
        wait = e.retry_after if e.retry_after is not None else BUSY_WAIT
        wait = min(max(wait, BUSY_WAIT_MIN), BUSY_WAIT_MAX)
        limit = BUSY_FOR
        timeout = self._timeout_of(op)
        if timeout is not None:
            limit = min(limit, timeout)
        if self._clock() - began + wait > limit:
            return None
        return wait



class Client(_Sending, Surface):
    """A client for the Zygo HTTP API. Safe to share between threads: every request
    borrows a pooled connection for its duration. Use :func:`zygo_sdk.connect`."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        retries: int = 0,
        backoff: float = 1.0,
        retry_busy: bool = True,
        timeout: Optional[float] = None,
        tenant: Optional[str] = None,
        pool_size: int = 32,
        ssl_context: Optional[ssl.SSLContext] = None,
        _shared: Optional[_Shared] = None,
    ) -> None:
        if retries < 0 or backoff < 0:
            raise ValueError("retries and backoff must not be negative")
        if _shared is None:
            if token is None:
                token = os.environ.get("ZYGO_API_TOKEN") or None
            _shared = _Shared(parse_address(url), token, pool_size, ssl_context)
        self._shared = _shared
        self.retries = retries
        self.backoff = backoff
        self.retry_busy = bool(retry_busy)
        self.timeout = timeout
        self._tenant = tenant
        self._sleep = time.sleep
        self._clock = time.monotonic

    # -- the client itself --

    @property
    def url(self) -> str:
        return str(self._shared.addr)

    @property
    def acting_for(self) -> Optional[str]:
        """The tenant this view acts for (``X-Zygo-Tenant``), if any."""
        return self._tenant

    def __repr__(self) -> str:
        t = f", tenant={self._tenant!r}" if self._tenant else ""
        return f"<zygo_sdk.Client {self.url}{t}>"

    def close(self) -> None:
        """Close the idle pooled connections (every view shares them)."""
        self._shared.pool.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _view(self, tenant: str) -> "Client":
        if not isinstance(tenant, str) or not tenant:
            raise ValueError("for_tenant needs a tenant id")
        c = Client(
            retries=self.retries,
            backoff=self.backoff,
            retry_busy=self.retry_busy,
            timeout=self.timeout,
            tenant=tenant,
            _shared=self._shared,
        )
        c._sleep, c._clock = self._sleep, self._clock
        return c

    # -- sending --

    def _exchange(self, data: bytes, read_timeout: float) -> Tuple[Conn, Head]:
        """Send one request and read the answer's head. A reused connection that turns out
        closed before the first byte of the answer is replaced by a fresh one, once."""
        pool = self._shared.pool
        conn = pool.take()
        reused = conn is not None
        while True:
            if conn is None:
                conn = pool.open(min(CONNECT_TIMEOUT, read_timeout))
            try:
                conn.sock.settimeout(read_timeout)
                conn.send(data)
                return conn, conn.read_head()
            except socket.timeout:
                conn.close()
                raise TransportError(
                    f"no answer from {pool.addr} within {read_timeout:.0f} s; the request may have run"
                ) from None
            except (BeforeFirstByte, OSError) as e:
                conn.close()
                if reused and not conn.got:
                    conn, reused = None, False
                    continue
                where = "before" if not conn.got else "in the middle of"
                raise TransportError(f"the connection to {pool.addr} failed {where} the answer: {e}") from None
            except BaseException:
                conn.close()
                raise

    def _once(self, op: Op) -> Any:
        data, read_timeout = self._request_bytes(op)
        conn, head = self._exchange(data, read_timeout)
        try:
            raw = conn.read_body(head)
        except OSError as e:
            conn.close()
            raise TransportError(f"the connection to {self._shared.addr} failed in the middle of the answer: {e}") from None
        except BaseException:
            conn.close()
            raise
        if keeps_alive(head):
            self._shared.pool.give(conn)
        else:
            conn.close()
        body = parse_json(raw, head)
        if 200 <= head.status < 300:
            return op.decode(body)
        raise error_from_answer(head.status, body, retry_after(head), head.headers.get("x-zygo-request-id"))

    def _send(self, op: Op) -> Any:
        attempt, began = 0, self._clock()
        while True:
            try:
                return self._once(op)
            except (Busy, Unavailable) as e:
                wait = self._again(e, attempt, op, began)
                if wait is None:
                    raise
                self._sleep(wait)
                attempt += 1

    def _stream(self, op: Op) -> Iterator[StreamEvent]:
        return self._stream_gen(op)

    def _stream_gen(self, op: Op) -> Iterator[StreamEvent]:
        attempt, began = 0, self._clock()
        while True:
            data, read_timeout = self._request_bytes(op)
            conn, head = self._exchange(data, read_timeout)
            yielded = False
            try:
                if not 200 <= head.status < 300:
                    body = parse_json(conn.read_body(head), head)
                    raise error_from_answer(head.status, body, retry_after(head), head.headers.get("x-zygo-request-id"))
                for line in lines(conn.pieces(head)):
                    ev, final = stream_item(line)
                    if ev is not None:
                        yielded = True
                        yield ev
                        continue
                    assert final is not None
                    yield final_item(final)
                    return
                raise TransportError("the stream ended before its result")
            except (Busy, Unavailable) as e:
                # Sent again only when nothing of it was yielded (nothing ran).
                wait = None if yielded else self._again(e, attempt, op, began)
                if wait is None:
                    raise
                self._sleep(wait)
                attempt += 1
            except OSError as e:
                raise TransportError(f"the stream from {self._shared.addr} broke: {e}") from None
            finally:
                # A stream's connection is never pooled; abandoning the iterator closes it
                # (which does not cancel the request).
                conn.close()
