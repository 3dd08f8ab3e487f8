"""What the client returns. Every answer type keeps the JSON it came from in ``raw``, so a
field a newer API adds is reachable before this package names it."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = [
    "Metrics",
    "Result",
    "StreamEvent",
    "RunResult",
    "Script",
    "Blob",
    "Deps",
    "FunctionInfo",
    "Tenant",
    "Token",
    "Health",
    "Version",
]


def _s(d: Dict[str, Any], k: str, default: str = "") -> str:
    v = d.get(k)
    return v if isinstance(v, str) else default


def _os(d: Dict[str, Any], k: str) -> Optional[str]:
    v = d.get(k)
    return v if isinstance(v, str) else None


def _f(d: Dict[str, Any], k: str) -> Optional[float]:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _i(d: Dict[str, Any], k: str) -> Optional[int]:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


def _b(d: Dict[str, Any], k: str, default: bool = False) -> bool:
    v = d.get(k)
    return v if isinstance(v, bool) else default


def _d(v: Any) -> Dict[str, Any]:
    return v if isinstance(v, dict) else {}


def decode_workspace(d: Dict[str, Any]) -> Optional[bytes]:
    """The tar an ``out=True`` answer carries, decoded from its base64."""
    v = d.get("workspace")
    if isinstance(v, dict):
        v = v.get("inline")
    if not isinstance(v, str):
        return None
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        from .errors import ZygoError

        raise ZygoError("the answer's workspace is not valid base64") from None


@dataclass
class Metrics:
    wall_ms: Optional[float] = None
    cpu_ms: Optional[float] = None
    peak_rss_kb: Optional[int] = None

    @classmethod
    def from_json(cls, v: Any) -> "Metrics":
        d = _d(v)
        return cls(wall_ms=_f(d, "wall_ms"), cpu_ms=_f(d, "cpu_ms"), peak_rss_kb=_i(d, "peak_rss_kb"))


@dataclass
class Result:
    """A call's answer: what the handler returned, what it printed, and its timings.
    ``workspace`` is the returned tar (already decoded) when the call asked for ``out``."""

    result: Any = None
    request_id: Optional[str] = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    started: bool = True
    metrics: Metrics = field(default_factory=Metrics)
    workspace: Optional[bytes] = None
    #: A stream's result only: the stream was read too slowly, so output events were
    #: dropped from some point on (``stdout`` and ``stderr`` here are still whole up to
    #: their caps).
    stream_truncated: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, v: Any) -> "Result":
        d = _d(v)
        return cls(
            result=d.get("result"),
            request_id=_os(d, "request_id"),
            stdout=_s(d, "stdout"),
            stderr=_s(d, "stderr"),
            stdout_truncated=_b(d, "stdout_truncated"),
            stderr_truncated=_b(d, "stderr_truncated"),
            # An API one release behind does not send it, and only answered once the
            # program had run.
            started=_b(d, "started", True),
            metrics=Metrics.from_json(d.get("metrics")),
            workspace=decode_workspace(d),
            stream_truncated=_b(d, "stream_truncated"),
            raw=d,
        )


@dataclass
class StreamEvent:
    """One item of a stream: ``kind`` is ``"stdout"``, ``"stderr"`` or ``"progress"`` with
    ``data``, or ``"result"`` with ``result``, the last item."""

    kind: str
    data: Any = None
    result: Optional[Result] = None

    @property
    def is_result(self) -> bool:
        return self.kind == "result"


@dataclass
class RunResult:
    """A one-shot run's answer. ``ok`` is true only when the program ran and exited 0;
    ``started`` false (with ``phase`` and ``error``) means Zygo could not build the
    sandbox, which is not the program's failure."""

    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    peak_rss_kb: Optional[int] = None
    wall_ms: Optional[float] = None
    cpu_ms: Optional[float] = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    started: bool = True
    phase: Optional[str] = None
    error: Optional[str] = None
    request_id: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.started and self.exit_code == 0 and not self.timed_out and not self.oom_killed

    @classmethod
    def from_json(cls, v: Any) -> "RunResult":
        d = _d(v)
        return cls(
            exit_code=_i(d, "exit_code"),
            signal=_i(d, "signal"),
            timed_out=_b(d, "timed_out"),
            oom_killed=_b(d, "oom_killed"),
            peak_rss_kb=_i(d, "peak_rss_kb"),
            wall_ms=_f(d, "wall_ms"),
            cpu_ms=_f(d, "cpu_ms"),
            stdout=_s(d, "stdout"),
            stderr=_s(d, "stderr"),
            stdout_truncated=_b(d, "stdout_truncated"),
            stderr_truncated=_b(d, "stderr_truncated"),
            started=_b(d, "started", True),
            phase=_os(d, "phase"),
            error=_os(d, "error"),
            request_id=_os(d, "request_id"),
            raw=d,
        )


@dataclass
class Script:
    """A script in the host's store, named by the SHA-256 of its bytes."""

    sha256: str = ""
    size: Optional[int] = None
    existed: bool = False
    held: bool = True
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, v: Any) -> "Script":
        d = _d(v)
        return cls(sha256=_s(d, "sha256"), size=_i(d, "size"), existed=_b(d, "existed"), held=_b(d, "held", True), raw=d)


@dataclass
class Blob:
    """A stored workspace tar, named by its SHA-256."""

    sha256: str = ""
    size: Optional[int] = None
    existed: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, v: Any) -> "Blob":
        d = _d(v)
        return cls(sha256=_s(d, "sha256"), size=_i(d, "size"), existed=_b(d, "existed"), raw=d)


@dataclass
class Deps:
    """A dependency set: ``state`` is ``building``, ``ready`` or ``failed``; ``log`` has
    the resolver's own words when it failed."""

    id: str = ""
    state: str = ""
    image: Optional[str] = None
    log: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def building(self) -> bool:
        return self.state == "building"

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @classmethod
    def from_json(cls, v: Any) -> "Deps":
        d = _d(v)
        return cls(id=_s(d, "id"), state=_s(d, "state"), image=_os(d, "image"), log=_os(d, "log"), raw=d)


@dataclass
class FunctionInfo:
    """A function or runtime pool the caller can see."""

    name: str = ""
    kind: str = "function"
    state: str = ""
    error: Optional[str] = None
    zygotes: Dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    min_warm: Optional[int] = None
    max_warm: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, v: Any) -> "FunctionInfo":
        d = _d(v)
        z = {k: n for k, n in _d(d.get("zygotes")).items() if isinstance(n, int) and not isinstance(n, bool)}
        return cls(
            name=_s(d, "name"),
            kind=_s(d, "kind", "function"),
            state=_s(d, "state"),
            error=_os(d, "error"),
            zygotes=z,
            in_flight=_i(d, "in_flight") or 0,
            min_warm=_i(d, "min_warm"),
            max_warm=_i(d, "max_warm"),
            raw=d,
        )


@dataclass
class Tenant:
    """One customer's record: its limits, functions, scripts and how many tokens it has."""

    id: str = ""
    created_ms: Optional[int] = None
    limits: Dict[str, Any] = field(default_factory=dict)
    functions: List[str] = field(default_factory=list)
    scripts: List[str] = field(default_factory=list)
    tokens: int = 0
    created: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, v: Any, created: Optional[bool] = None) -> "Tenant":
        d = _d(v)
        fns = d.get("functions")
        scripts = d.get("scripts")
        return cls(
            id=_s(d, "id"),
            created_ms=_i(d, "created_ms"),
            limits=_d(d.get("limits")),
            functions=[f for f in fns if isinstance(f, str)] if isinstance(fns, list) else [],
            scripts=[s for s in scripts if isinstance(s, str)] if isinstance(scripts, list) else [],
            tokens=_i(d, "tokens") or 0,
            created=created,
            raw=d,
        )


@dataclass
class Token:
    """A token's record. ``secret`` is set only in the answer that minted it, the one
    time it exists."""

    id: str = ""
    tenant: Optional[str] = None
    created_ms: Optional[int] = None
    revoked_ms: Optional[int] = None
    secret: Optional[str] = field(default=None, repr=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, v: Any) -> "Token":
        d = _d(v)
        return cls(
            id=_s(d, "id"),
            tenant=_os(d, "tenant"),
            created_ms=_i(d, "created_ms"),
            revoked_ms=_i(d, "revoked_ms"),
            secret=_os(d, "secret"),
            raw=d,
        )


@dataclass
class Health:
    """``status`` is ``ok`` or ``degraded`` (with ``reason``); ``stopping`` is raised as
    :class:`~zygo_sdk.Unavailable` instead."""

    status: str = ""
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_json(cls, v: Any) -> "Health":
        d = _d(v)
        return cls(status=_s(d, "status"), reason=_os(d, "reason"))


@dataclass
class Version:
    version: str = ""
    api: Optional[int] = None
    backend: Optional[str] = None
    cgroup: Optional[str] = None
    landlock_abi: Optional[int] = None
    private_net: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, v: Any) -> "Version":
        d = _d(v)
        pn = d.get("private_net")
        return cls(
            version=_s(d, "version"),
            api=_i(d, "api"),
            backend=_os(d, "backend"),
            cgroup=_os(d, "cgroup"),
            landlock_abi=_i(d, "landlock_abi"),
            private_net=pn if isinstance(pn, bool) else None,
            raw=d,
        )
