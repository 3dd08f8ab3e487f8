"""One exception class per kind of failure, all under :class:`ZygoError`.

Every error carries the same fields, filled where the answer had them: ``status`` (the
HTTP status, ``None`` for a transport failure), ``code`` (the API's machine-readable code),
``request_id``, ``retry_after`` (seconds, from ``Retry-After``), and for a request that
ran: ``stdout``, ``stderr``, ``exit_code``, ``traceback``, ``oom_killed``, ``started``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = [
    "ZygoError",
    "AuthError",
    "NotFound",
    "Busy",
    "Unavailable",
    "HandlerError",
    "Timeout",
    "Cancelled",
    "Stuck",
    "TransportError",
    "BadRequest",
    "error_from_answer",
]


class ZygoError(Exception):
    """Any failure the client reports. A 409, 413, 422 or 500 ``internal`` is this class
    itself; every other kind has a subclass."""

    kind = "error"

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
        stdout: str = "",
        stderr: str = "",
        exit_code: Optional[int] = None,
        traceback: Optional[str] = None,
        oom_killed: bool = False,
        started: Optional[bool] = None,
        body: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id
        self.retry_after = retry_after
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code
        self.traceback = traceback
        self.oom_killed = oom_killed
        self.started = started
        self.body = body if body is not None else {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status}, code={self.code!r})"


class BadRequest(ZygoError):
    """400: the request was malformed, a spec was refused, or a secret the call needs is
    missing. Sending it again unchanged gets the same answer."""

    kind = "bad_request"


class AuthError(ZygoError):
    """401 or 403: no token, an unknown or revoked one, or a token without the rights the
    route needs (the message says which)."""

    kind = "auth"


class NotFound(ZygoError):
    """404: no such function, pool, script, request or tenant, or one that is not yours."""

    kind = "not_found"


class Busy(ZygoError):
    """429: refused before anything ran, so sending it again is safe. ``retry_after`` says
    when. The clients send it again themselves unless ``retry_busy=False``: raised, it
    was refused for 30 s, or until the call's timeout."""

    kind = "busy"


class Unavailable(ZygoError):
    """503: the host cannot do this yet (starting, draining, a dependency set still
    building). Nothing ran."""

    kind = "unavailable"


class HandlerError(ZygoError):
    """500 ``handler``: the handler raised or exited non-zero. ``stdout``, ``stderr``,
    ``exit_code``, ``traceback`` and ``request_id`` say what it did."""

    kind = "handler"


class Timeout(ZygoError):
    """504 ``timeout`` (the deadline killed the request) or 408 ``api_timeout`` (the API's
    own wait on a one-shot run ran out)."""

    kind = "timeout"


class Cancelled(ZygoError):
    """499: somebody cancelled the request by its key."""

    kind = "cancelled"


class Stuck(ZygoError):
    """504 ``stuck``: the sandbox stopped answering (no heartbeat for a minute) and was
    killed."""

    kind = "stuck"


class TransportError(ZygoError):
    """The connection failed: could not connect, or broke after the first byte of the
    answer. Never retried, because the request may have run."""

    kind = "transport"


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def error_from_answer(
    status: int, body: Any, retry_after: Optional[float] = None, request_id: Optional[str] = None
) -> ZygoError:
    """The error an HTTP answer with a non-2xx ``status`` stands for."""
    b: Dict[str, Any] = body if isinstance(body, dict) else {}
    code = b.get("code") if isinstance(b.get("code"), str) else None
    message = b.get("error")
    if not isinstance(message, str) or not message:
        if status == 503 and b.get("status") == "stopping":
            message = "the API is stopping (draining); nothing new is taken"
        elif isinstance(body, str) and body.strip():
            message = f"HTTP {status}: {body.strip()[:500]}"
        else:
            message = f"HTTP {status}"
    cls: type = ZygoError
    if status == 400:
        cls = BadRequest
    elif status in (401, 403):
        cls = AuthError
    elif status == 404:
        cls = NotFound
    elif status == 408:
        cls = Timeout
    elif status == 429:
        cls = Busy
    elif status == 499:
        cls = Cancelled
    elif status == 500 and code == "handler":
        cls = HandlerError
    elif status == 503:
        cls = Unavailable
    elif status == 504:
        cls = Stuck if code == "stuck" else Timeout
    if retry_after is None:
        retry_after = _num(b.get("retry_after"))
    rid = b.get("request_id") if isinstance(b.get("request_id"), str) else request_id
    exit_code = b.get("exit_code")
    started = b.get("started")
    return cls(
        message,
        status=status,
        code=code,
        request_id=rid,
        retry_after=retry_after,
        stdout=b.get("stdout") if isinstance(b.get("stdout"), str) else "",
        stderr=b.get("stderr") if isinstance(b.get("stderr"), str) else "",
        exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
        traceback=b.get("traceback") if isinstance(b.get("traceback"), str) else None,
        oom_killed=b.get("oom_killed") is True,
        started=True if started is None and cls in (HandlerError, Timeout, Cancelled, Stuck) else started if isinstance(started, bool) else None,
        body=b,
    )
