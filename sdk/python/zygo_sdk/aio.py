"""The asyncio client: every method of :class:`zygo_sdk.Client`, with the same names and
parameters, as a coroutine (``stream`` and ``stream_script`` return an async iterator).

    async with zygo_sdk.aio.connect() as client:
        res = await client.call("resize", event)

Cancelling the task that awaits a call cancels the request on the server: every call that
runs something carries a request key (one is made when none is given), and the cancel
(``DELETE /requests/{key}``) is sent before ``CancelledError`` propagates.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import ssl
import time
import uuid
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from ._http import (
    CONNECT_TIMEOUT,
    MAX_BODY,
    MAX_HEAD,
    Address,
    BeforeFirstByte,
    Head,
    Pool,
    framing,
    keeps_alive,
    parse_address,
    parse_head,
    path_part,
)
from ._surface import Op, Surface
from .client import DEFAULT_WAIT, SLACK, _Sending, _Shared, final_item, parse_json, retry_after, stream_item
from .errors import Busy, NotFound, TransportError, Unavailable, ZygoError, error_from_answer
from .types import StreamEvent

__all__ = ["connect", "AsyncClient"]

LIMIT = 64 * 1024 * 1024  # the longest line a stream may carry


class _AConn:
    __slots__ = ("reader", "writer", "idle_since", "got", "buf")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.got = False
        self.buf = b""

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):
            pass

    async def head(self) -> Head:
        while True:
            self.got = False
            try:
                first = await self.reader.read(1)
            except (ConnectionResetError, BrokenPipeError) as e:
                raise BeforeFirstByte(str(e)) from None
            if not first:
                raise BeforeFirstByte("the connection was closed")
            self.got = True
            try:
                rest = await self.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                raise TransportError("the connection closed in the middle of the answer's headers") from None
            except asyncio.LimitOverrunError:
                raise TransportError("the answer's headers are larger than 64 KiB") from None
            if len(rest) > MAX_HEAD:
                raise TransportError("the answer's headers are larger than 64 KiB")
            h = parse_head(first + rest[:-4])
            if not 100 <= h.status < 200:
                return h

    async def _exact(self, n: int) -> bytes:
        try:
            return await self.reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise TransportError("the connection closed in the middle of the answer") from None

    async def _line(self) -> bytes:
        try:
            return await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            raise TransportError("the connection closed in the middle of the answer") from None
        except asyncio.LimitOverrunError:
            raise TransportError("a line of the answer is too long") from None

    async def piece(self, state: Dict[str, Any]) -> Optional[bytes]:
        """The next piece of the body, or None at its end. ``state`` holds the framing."""
        how = state["how"]
        if how == "length":
            n = state["left"]
            if n <= 0:
                return None
            data = await self.reader.read(min(n, 262144))
            if not data:
                raise TransportError("the connection closed in the middle of the answer")
            state["left"] = n - len(data)
            return data
        if how == "chunked":
            if state.get("done"):
                return None
            line = (await self._line()).strip()
            size_s = line.split(b";", 1)[0].strip()
            try:
                size = int(size_s, 16)
            except ValueError:
                raise TransportError(f"bad chunk size {size_s[:20]!r}") from None
            if size == 0:
                while (await self._line()).strip():
                    pass
                state["done"] = True
                return None
            state["total"] = state.get("total", 0) + size
            if state["total"] > MAX_BODY:
                raise TransportError("the answer is larger than 1 GiB")
            data = await self._exact(size)
            await self._exact(2)
            return data
        data = await self.reader.read(262144)
        if not data:
            return None
        state["total"] = state.get("total", 0) + len(data)
        if state["total"] > MAX_BODY:
            raise TransportError("the answer is larger than 1 GiB")
        return data

    async def body(self, h: Head) -> bytes:
        how, n = framing(h)
        if how == "length":
            return await self._exact(n) if n else b""
        state: Dict[str, Any] = {"how": how, "left": n}
        parts: List[bytes] = []
        while True:
            p = await self.piece(state)
            if p is None:
                return b"".join(parts)
            parts.append(p)


async def _open(addr: Address, ssl_context: Optional[ssl.SSLContext], timeout: float) -> _AConn:
    try:
        if addr.kind == "unix":
            coro = asyncio.open_unix_connection(addr.path, limit=LIMIT)
        else:
            ctx = (ssl_context or ssl.create_default_context()) if addr.tls else None
            coro = asyncio.open_connection(
                addr.host, addr.port, ssl=ctx, server_hostname=addr.host if ctx else None, limit=LIMIT
            )
        reader, writer = await asyncio.wait_for(coro, timeout)
    except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
        raise TransportError(f"cannot connect to the Zygo API at {addr}: {e or 'timed out'}") from None
    return _AConn(reader, writer)


class AsyncStream:
    """An async iterator over a streamed request: output items, then the result. Nothing
    is sent until it is first awaited. ``aclose()`` (or leaving ``async with``) closes its
    connection without cancelling the request; cancelling the task that awaits it cancels
    the request on the server."""

    def __init__(self, client: "AsyncClient", op: Op) -> None:
        self._client = client
        self._op = op
        self._conn: Optional[_AConn] = None
        self._state: Optional[Dict[str, Any]] = None
        self._lines: List[bytes] = []
        self._rest = b""
        self._finished = False
        self._yielded = False
        self._attempt = 0
        self._began: Optional[float] = None

    def __aiter__(self) -> "AsyncStream":
        return self

    def __await__(self) -> Any:
        async def me() -> "AsyncStream":
            return self

        return me().__await__()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._finished = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __del__(self) -> None:
        if self._conn is not None:
            self._conn.close()

    async def _start(self) -> None:
        c = self._client
        began = self._began = self._began if self._began is not None else c._clock()
        while True:
            conn, h = await c._exchange(self._op)
            if 200 <= h.status < 300:
                self._conn = conn
                how, n = framing(h)
                self._state = {"how": how, "left": n}
                return
            try:
                body = parse_json(await conn.body(h), h)
            finally:
                conn.close()
            e = error_from_answer(h.status, body, retry_after(h), h.headers.get("x-zygo-request-id"))
            wait = c._again(e, self._attempt, self._op, began)
            if wait is None:
                raise e
            await c._sleep(wait)
            self._attempt += 1

    async def _next_line(self) -> Optional[bytes]:
        assert self._conn is not None and self._state is not None
        while not self._lines:
            p = await self._conn.piece(self._state)
            if p is None:
                if self._rest.strip():
                    line, self._rest = self._rest, b""
                    return line
                return None
            buf = self._rest + p
            parts = buf.split(b"\n")
            self._rest = parts.pop()
            if len(self._rest) > LIMIT:
                raise TransportError("a line of the stream is longer than 64 MiB")
            self._lines.extend(x for x in parts if x.strip())
        return self._lines.pop(0)

    async def __anext__(self) -> StreamEvent:
        if self._finished:
            raise StopAsyncIteration
        try:
            return await self._next()
        except asyncio.CancelledError:
            await self.aclose()
            await self._client._cancel_on_server(self._op)
            raise
        except StopAsyncIteration:
            raise
        except BaseException:
            await self.aclose()
            raise

    async def _next(self) -> StreamEvent:
        while True:
            if self._conn is None:
                await self._start()
            try:
                line = await self._next_line()
            except OSError as e:
                raise TransportError(f"the stream broke: {e}") from None
            if line is None:
                raise TransportError("the stream ended before its result")
            ev, final = stream_item(line)
            if ev is not None:
                self._yielded = True
                return ev
            assert final is not None
            await self.aclose()
            try:
                return final_item(final)
            except (Busy, Unavailable) as e:
                # Sent again only when nothing of it was yielded (nothing ran).
                c = self._client
                began = self._began if self._began is not None else c._clock()
                wait = None if self._yielded else c._again(e, self._attempt, self._op, began)
                if wait is None:
                    raise
                await c._sleep(wait)
                self._attempt += 1
                self._finished = False
                self._lines, self._rest = [], b""


class AsyncClient(_Sending, Surface):
    """The asyncio twin of :class:`zygo_sdk.Client`; see :func:`connect`."""

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
        self._ssl = ssl_context
        self.retries = retries
        self.backoff = backoff
        self.retry_busy = bool(retry_busy)
        self.timeout = timeout
        self._tenant = tenant
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._clock: Callable[[], float] = time.monotonic

    @property
    def url(self) -> str:
        return str(self._shared.addr)

    @property
    def acting_for(self) -> Optional[str]:
        """The tenant this view acts for (``X-Zygo-Tenant``), if any."""
        return self._tenant

    def __repr__(self) -> str:
        t = f", tenant={self._tenant!r}" if self._tenant else ""
        return f"<zygo_sdk.aio.AsyncClient {self.url}{t}>"

    async def close(self) -> None:
        """Close the idle pooled connections (every view shares them)."""
        self._shared.pool.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _view(self, tenant: str) -> "AsyncClient":
        if not isinstance(tenant, str) or not tenant:
            raise ValueError("for_tenant needs a tenant id")
        c = AsyncClient(
            retries=self.retries,
            backoff=self.backoff,
            retry_busy=self.retry_busy,
            timeout=self.timeout,
            tenant=tenant,
            _shared=self._shared,
        )
        c._sleep, c._clock = self._sleep, self._clock
        return c

    async def _exchange(self, op: Op) -> Tuple[_AConn, Head]:
        if op.cancellable and op.key is None:
            op.key = "aio-" + uuid.uuid4().hex
        data, read_timeout = self._request_bytes(op)
        pool: Pool = self._shared.pool
        conn: Optional[_AConn] = pool.take()  # type: ignore[assignment]
        reused = conn is not None
        while True:
            if conn is None:
                conn = await _open(self._shared.addr, self._shared.pool.ssl_context, min(CONNECT_TIMEOUT, read_timeout))
            try:
                conn.got = False
                conn.writer.write(data)
                op.sent = True
                await conn.writer.drain()
                return conn, await asyncio.wait_for(conn.head(), read_timeout)
            except asyncio.TimeoutError:
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

    async def _once(self, op: Op) -> Any:
        conn, h = await self._exchange(op)
        try:
            raw = await conn.body(h)
        except OSError as e:
            conn.close()
            raise TransportError(f"the connection to {self._shared.addr} failed in the middle of the answer: {e}") from None
        except BaseException:
            conn.close()
            raise
        if keeps_alive(h):
            self._shared.pool.give(conn)  # type: ignore[arg-type]
        else:
            conn.close()
        body = parse_json(raw, h)
        if 200 <= h.status < 300:
            return op.decode(body)
        raise error_from_answer(h.status, body, retry_after(h), h.headers.get("x-zygo-request-id"))

    async def _send(self, op: Op) -> Any:
        attempt, began = 0, self._clock()
        while True:
            try:
                return await self._once(op)
            except (Busy, Unavailable) as e:
                wait = self._again(e, attempt, op, began)
                if wait is None:
                    raise
                await self._sleep(wait)
                attempt += 1
            except asyncio.CancelledError:
                await self._cancel_on_server(op)
                raise

    async def _cancel_on_server(self, op: Op) -> None:
        """Cancel ``op`` by its key, shielded from the cancellation that caused it. A
        cancel can overtake the request it names on the way to the supervisor, so a
        NotFound is tried again, briefly."""
        if not op.cancellable or op.key is None or not op.sent:
            return
        key = op.key

        async def cancel() -> None:
            for pause in (0.02, 0.05, 0.1, 0.2):
                try:
                    await self._once(Op("DELETE", "/requests/" + path_part(key), wait=5))
                    return
                except NotFound:
                    await asyncio.sleep(pause)
                except ZygoError:
                    return

        try:
            await asyncio.shield(asyncio.wait_for(cancel(), 10))
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass

    def _stream(self, op: Op) -> AsyncStream:
        return AsyncStream(self, op)


def _as_coroutine(fn: Any) -> Any:
    @functools.wraps(fn)
    async def method(self: AsyncClient, *args: Any, **kwargs: Any) -> Any:
        return await fn(self, *args, **kwargs)

    return method


# Every method of the surface that talks to the API becomes a coroutine function; the
# streams stay async iterators, and fn/for_tenant are views that send nothing.
_NOT_COROUTINES = {"stream", "stream_script", "fn", "for_tenant"}
for _name, _fn in list(vars(Surface).items()):
    if _name.startswith("_") or _name in _NOT_COROUTINES or not inspect.isfunction(_fn):
        continue
    setattr(AsyncClient, _name, _as_coroutine(_fn))


def connect(
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
) -> AsyncClient:
    """The asyncio client; the same arguments as :func:`zygo_sdk.connect`."""
    return AsyncClient(
        url,
        token,
        retries=retries,
        backoff=backoff,
        retry_busy=retry_busy,
        timeout=timeout,
        tenant=tenant,
        pool_size=pool_size,
        ssl_context=ssl_context,
    )


_ = DEFAULT_WAIT, SLACK
