"""A client for the Zygo HTTP API, standard library only.

    import zygo_sdk as zygo
    client = zygo.connect()                     # ZYGO_API_URL, ZYGO_API_TOKEN
    res = client.call("resize", {"url": "…"}, timeout=5)
    print(res.result, res.stdout, res.metrics.wall_ms)

``zygo_sdk.aio`` is the same surface as coroutines.
"""

from __future__ import annotations

__version__ = "0.1.5"

import ssl as _ssl
from typing import Optional

from ._surface import UNSET
from .client import Client
from .errors import (
    AuthError,
    BadRequest,
    Busy,
    Cancelled,
    HandlerError,
    NotFound,
    Stuck,
    Timeout,
    TransportError,
    Unavailable,
    ZygoError,
)
from .types import (
    Blob,
    Deps,
    FunctionInfo,
    Health,
    Metrics,
    Result,
    RunResult,
    Script,
    StreamEvent,
    Tenant,
    Token,
    Version,
)


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
    ssl_context: Optional[_ssl.SSLContext] = None,
) -> Client:
    """A client for the API at ``url`` (else ``ZYGO_API_URL``, else
    ``http://127.0.0.1:7700``; ``unix:///path``, ``http://``, ``https://`` or ``host:port``)
    with ``token`` (else ``ZYGO_API_TOKEN``). ``retries`` resends a request refused as Busy
    or Unavailable, waiting the longer of the server's Retry-After and ``backoff`` seconds
    doubled per attempt. Past those, ``retry_busy`` (on by default) resends a request
    refused as Busy after the server's Retry-After (1 s without one; each wait at most
    5 s) for up to 30 s after it was first sent, and never past its timeout: Busy means
    nothing of it ran. ``retry_busy=False`` raises Busy as it comes. ``timeout`` is the
    default wait of a call, in seconds. Nothing is connected until the first request."""
    return Client(
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


from . import aio  # noqa: E402  (zygo_sdk.aio is reachable after `import zygo_sdk`)

__all__ = [
    "connect",
    "Client",
    "aio",
    "UNSET",
    "ZygoError",
    "AuthError",
    "BadRequest",
    "Busy",
    "Cancelled",
    "HandlerError",
    "NotFound",
    "Stuck",
    "Timeout",
    "TransportError",
    "Unavailable",
    "Blob",
    "Deps",
    "FunctionInfo",
    "Health",
    "Metrics",
    "Result",
    "RunResult",
    "Script",
    "StreamEvent",
    "Tenant",
    "Token",
    "Version",
]
