"""Every method of the client, written once. A method builds an :class:`Op` (which route,
which body, how to read the answer) and hands it to ``self._send`` or ``self._stream``;
the plain client sends it and returns the value, the asyncio client (``zygo_sdk.aio``)
wraps each method as a coroutine that awaits it."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._http import path_part
from .errors import ZygoError, error_from_answer
from .types import (
    Blob,
    Deps,
    FunctionInfo,
    Health,
    Result,
    RunResult,
    Script,
    Tenant,
    Token,
    Version,
)

JSON = Any
Digest = Union[str, Script, Blob]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""The default of a :meth:`set_limits` key: leave it as it is (``None`` clears it)."""


class Op:
    """One request: the route, the body, and how the answer becomes a value."""

    __slots__ = ("method", "path", "query", "body", "ctype", "timeout", "key", "decode", "cancellable", "wait", "sent")

    def __init__(
        self,
        method: str,
        path: str,
        *,
        query: Optional[List[Tuple[str, str]]] = None,
        body: Optional[bytes] = None,
        ctype: Optional[str] = None,
        timeout: Optional[float] = None,
        key: Optional[str] = None,
        decode: Callable[[Any], Any] = lambda v: v,
        cancellable: bool = False,
        wait: Optional[float] = None,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.body = body
        self.ctype = ctype
        self.timeout = timeout  # seconds: X-Zygo-Timeout-Ms
        self.key = key  # X-Zygo-Request-Key
        self.decode = decode
        self.cancellable = cancellable  # runs something the server can cancel by key
        self.wait = wait  # how long to wait for the answer when no timeout is sent
        self.sent = False  # whether the request has been written to a connection


def _json(v: Any) -> bytes:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _digest(d: Digest) -> str:
    if isinstance(d, (Script, Blob)):
        d = d.sha256
    if not isinstance(d, str) or not d:
        raise ValueError(f"expected a digest ('sha256:…'), got {d!r}")
    return d


def _seconds(t: Union[None, float, int, str]) -> Optional[str]:
    """A duration for a body: a number of seconds becomes a string the API parses."""
    if t is None or isinstance(t, str):
        return t
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
        raise ValueError(f"a duration must be a positive number of seconds or a string like '30s', got {t!r}")
    ms = round(t * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _list(key: str, item: Callable[[Any], Any]) -> Callable[[Any], List[Any]]:
    def decode(v: Any) -> List[Any]:
        items = v.get(key) if isinstance(v, dict) else None
        if not isinstance(items, list):
            raise ZygoError(f"the answer has no {key!r} list")
        return [item(x) for x in items]

    return decode


def _batch_element(v: Any) -> Union[Result, ZygoError]:
    d = v if isinstance(v, dict) else {}
    status = d.get("status")
    if status == 200 or (status is None and "error" not in d):
        return Result.from_json(d)
    return error_from_answer(status if isinstance(status, int) else 500, d)


def _workspace_query(workspace: Optional[Digest]) -> str:
    if isinstance(workspace, dict):
        raise ValueError(
            "a warm function's workspace goes in the query string, so it takes a blob digest only "
            "(put_blob() the tar first); run_script takes an inline tar too"
        )
    return _digest(workspace)  # type: ignore[arg-type]


def _workspace_body(workspace: Union[None, Digest, Mapping[str, str], bytes]) -> Optional[Dict[str, str]]:
    if workspace is None:
        return None
    if isinstance(workspace, (bytes, bytearray)):
        import base64

        return {"inline": base64.b64encode(bytes(workspace)).decode()}
    if isinstance(workspace, Mapping):
        if set(workspace) not in ({"inline"}, {"blob"}):
            raise ValueError("workspace is {'inline': <base64 tar>} or {'blob': 'sha256:…'}")
        return dict(workspace)
    return {"blob": _digest(workspace)}


def _script_body(script: Optional[Digest], source: Optional[Union[str, bytes]]) -> Dict[str, Any]:
    if (script is None) == (source is None):
        raise ValueError("name the script by its digest, or pass source=…, exactly one of the two")
    if source is not None:
        return {"source": source.decode() if isinstance(source, bytes) else source}
    assert script is not None
    return {"script": _digest(script)}


class Surface:
    """The methods of :class:`zygo_sdk.Client`; see the module docs for each route."""

    _tenant: Optional[str]

    def _send(self, op: Op) -> Any:  # pragma: no cover - provided by the client
        raise NotImplementedError

    def _stream(self, op: Op) -> Any:  # pragma: no cover - provided by the client
        raise NotImplementedError

    def _view(self, tenant: str) -> Any:  # pragma: no cover - provided by the client
        raise NotImplementedError

    # ---- views -------------------------------------------------------------------------

    def for_tenant(self, id: str) -> Any:
        """A view of this client acting for tenant ``id`` (the ``X-Zygo-Tenant`` header),
        sharing its connection pool. Only an operator token may act for a tenant."""
        return self._view(id)

    def fn(self, name: str) -> Callable[..., Any]:
        """A callable for one function: ``client.fn("resize")(event, timeout=5)`` is
        ``client.call("resize", event, timeout=5)``."""

        def call(event: JSON = None, **kwargs: Any) -> Any:
            return self.call(name, event, **kwargs)

        call.__name__ = call.__qualname__ = f"fn({name!r})"
        return call

    # ---- host ----------------------------------------------------------------------------

    def health(self) -> Health:
        """``GET /healthz`` (no token needed): ``ok`` or ``degraded``; raises Unavailable once
        the API is stopping."""
        return self._send(Op("GET", "/healthz", decode=Health.from_json))

    def version(self) -> Version:
        """``GET /version``."""
        return self._send(Op("GET", "/version", decode=Version.from_json))

    def drain(self, grace: float = 30) -> Dict[str, Any]:
        """``POST /drain``: stop taking requests, let the running ones finish for up to
        ``grace`` seconds, answer ``{"drained": true, "in_flight": N}``, then exit."""
        return self._send(Op("POST", "/drain", body=_json({"grace": grace}), wait=grace + 30))

    # ---- functions -----------------------------------------------------------------------

    def functions(self) -> List[FunctionInfo]:
        """``GET /fn``: the functions and pools the caller can see."""
        return self._send(Op("GET", "/fn", decode=_list("functions", FunctionInfo.from_json)))

    def serve(self, name: str, layer: Mapping[str, Any], *, base_dir: Optional[str] = None) -> Dict[str, Any]:
        """``PUT /fn/{name}`` (deploy rights): serve a function from a layer, the fields of a
        ``[fn.NAME]`` table; ``base_dir`` is the folder on the server its paths are
        relative to."""
        body: Dict[str, Any] = {"layer": dict(layer)}
        if base_dir is not None:
            body["base_dir"] = base_dir
        return self._send(Op("PUT", "/fn/" + path_part(name), body=_json(body), wait=600))

    def stop(self, name: str) -> Dict[str, Any]:
        """``DELETE /fn/{name}`` (deploy rights)."""
        return self._send(Op("DELETE", "/fn/" + path_part(name), wait=120))

    def call(
        self,
        name: str,
        event: JSON = None,
        *,
        timeout: Optional[float] = None,
        key: Optional[str] = None,
        workspace: Optional[Digest] = None,
        out: bool = False,
    ) -> Result:
        """``POST /fn/{name}``: call a warm function with ``event``. ``timeout`` (seconds) is
        how long to wait; ``key`` names the request for :meth:`cancel`; ``workspace`` is a
        blob digest unpacked into the request's directory; ``out`` returns that directory
        as a tar in ``Result.workspace``."""
        query: List[Tuple[str, str]] = []
        if workspace is not None:
            query.append(("workspace", _workspace_query(workspace)))
        if out:
            query.append(("out", "1"))
        return self._send(
            Op(
                "POST",
                "/fn/" + path_part(name),
                query=query or None,
                body=_json(event),
                ctype="application/json",
                timeout=timeout,
                key=key,
                decode=Result.from_json,
                cancellable=True,
            )
        )

    def batch(
        self, name: str, events: Iterable[JSON], *, timeout: Optional[float] = None, key: Optional[str] = None
    ) -> List[Union[Result, ZygoError]]:
        """``POST /fn/{name}/batch``: one answer per event, in order, each a Result or the
        error it would have raised (returned, not raised)."""
        return self._send(
            Op(
                "POST",
                "/fn/" + path_part(name) + "/batch",
                body=_json({"events": list(events)}),
                ctype="application/json",
                timeout=timeout,
                key=key,
                decode=_list("results", _batch_element),
                cancellable=True,
            )
        )

    def stream(
        self,
        name: str,
        event: JSON = None,
        *,
        timeout: Optional[float] = None,
        key: Optional[str] = None,
        workspace: Optional[Digest] = None,
        out: bool = False,
    ) -> Any:
        """``POST /fn/{name}?stream=1``: iterate over the request's stdout, stderr and
        progress as they happen, then its result (``event.is_result``). A handler that
        failed raises when iterated past its output. Nothing is sent until iteration
        starts; abandoning the iterator closes its connection without cancelling."""
        query: List[Tuple[str, str]] = [("stream", "1")]
        if workspace is not None:
            query.append(("workspace", _workspace_query(workspace)))
        if out:
            query.append(("out", "1"))
        return self._stream(
            Op(
                "POST",
                "/fn/" + path_part(name),
                query=query,
                body=_json(event),
                ctype="application/json",
                timeout=timeout,
                key=key,
                cancellable=True,
            )
        )

    def cancel(self, key: str) -> int:
        """``DELETE /requests/{key}``: cancel every request of the caller under ``key``;
        answers how many. Nothing of the caller's under it raises NotFound."""

        def decode(v: Any) -> int:
            n = v.get("cancelled") if isinstance(v, dict) else None
            return n if isinstance(n, int) and not isinstance(n, bool) else 0

        return self._send(Op("DELETE", "/requests/" + path_part(key), decode=decode))

    def logs(self, name: str, limit: int = 100) -> List[Dict[str, Any]]:
        """``GET /fn/{name}/logs``: the last ``limit`` requests (1 to 1000)."""
        return self._send(
            Op("GET", f"/fn/{path_part(name)}/logs", query=[("limit", str(int(limit)))], decode=_list("logs", dict))
        )

    def stats(self, name: str) -> Dict[str, Any]:
        """``GET /fn/{name}/stats``: counts by outcome, p50/p99 wall time, peak memory."""
        return self._send(Op("GET", f"/fn/{path_part(name)}/stats"))

    def warm(self, name: str, n: int = 1) -> Dict[str, Any]:
        """``POST /fn/{name}/warm``: start zygotes until ``n`` are ready (at most max_warm)."""
        return self._send(Op("POST", f"/fn/{path_part(name)}/warm", body=_json({"n": n}), wait=300))

    def run(
        self,
        cmd: Sequence[str],
        *,
        image: Optional[str] = None,
        mem: Optional[Union[str, int]] = None,
        cpu: Optional[float] = None,
        pids: Optional[int] = None,
        timeout: Union[None, float, str] = None,
        scratch: Optional[Union[str, int]] = None,
        network: Optional[str] = None,
        allow: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[str] = None,
        key: Optional[str] = None,
        wait: Optional[float] = None,
    ) -> RunResult:
        """``POST /run`` (deploy rights): run ``cmd`` once in a fresh sandbox. ``timeout`` is
        the sandbox's own deadline (seconds or ``"30s"``); ``wait`` (seconds) is how long
        the API waits before answering 408, by default the deadline plus 10 s. With
        ``network="egress"``, ``allow`` lists the ``"host:port"`` destinations it may reach."""
        if isinstance(cmd, str) or not cmd:
            raise ValueError("cmd is a non-empty list of strings, e.g. ['python3', '-c', '…']")
        body: Dict[str, Any] = {"cmd": list(cmd)}
        for k, v in (
            ("image", image),
            ("mem", mem),
            ("cpu", cpu),
            ("pids", pids),
            ("timeout", _seconds(timeout)),
            ("scratch", scratch),
            ("network", network),
            ("allow", list(allow) if allow is not None else None),
            ("env", dict(env) if env is not None else None),
            ("stdin", stdin),
        ):
            if v is not None:
                body[k] = v
        if wait is None and isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            wait = float(timeout) + 10
        return self._send(
            Op(
                "POST",
                "/run",
                body=_json(body),
                ctype="application/json",
                timeout=wait,
                key=key,
                decode=RunResult.from_json,
                cancellable=True,
            )
        )

    # ---- runtime pools -------------------------------------------------------------------

    def runtimes(self) -> List[FunctionInfo]:
        """``GET /runtimes``: the pools the caller can see, with their zygote counts."""
        return self._send(Op("GET", "/runtimes", decode=_list("runtimes", FunctionInfo.from_json)))

    def serve_runtime(
        self,
        name: str,
        layer: Mapping[str, Any],
        *,
        base_dir: Optional[str] = None,
        secrets: Optional[Sequence[str]] = None,
        deps: Optional[Union[str, Deps]] = None,
    ) -> Dict[str, Any]:
        """``POST /runtimes`` (deploy rights): declare a pool from a layer (image, agent or
        cmd, limits, min_warm/max_warm). ``secrets`` names secrets each call gets from the
        calling tenant's store; ``deps`` is a dependency set's id (see :meth:`put_deps`)."""
        lay = dict(layer)
        if secrets is not None:
            if isinstance(secrets, str):
                raise ValueError("secrets is a list of names")
            lay["secrets"] = list(secrets)
        if deps is not None:
            lay["deps"] = deps.id if isinstance(deps, Deps) else deps
        body: Dict[str, Any] = {"name": name, "layer": lay}
        if base_dir is not None:
            body["base_dir"] = base_dir
        return self._send(Op("POST", "/runtimes", body=_json(body), ctype="application/json", wait=600))

    def stop_runtime(self, name: str) -> Dict[str, Any]:
        """``DELETE /runtimes/{name}`` (deploy rights)."""
        return self._send(Op("DELETE", "/runtimes/" + path_part(name), wait=120))

    def _script_call(
        self,
        runtime: str,
        script: Optional[Digest],
        event: JSON,
        source: Optional[Union[str, bytes]],
        workspace: Union[None, Digest, Mapping[str, str], bytes],
        out: bool,
        stream: bool,
    ) -> Tuple[str, Optional[List[Tuple[str, str]]], bytes]:
        body = _script_body(script, source)
        body["event"] = event
        ws = _workspace_body(workspace)
        if ws is not None:
            body["workspace"] = ws
        if out:
            body["out"] = True
        return f"/runtimes/{path_part(runtime)}/call", [("stream", "1")] if stream else None, _json(body)

    def run_script(
        self,
        runtime: str,
        script: Optional[Digest] = None,
        event: JSON = None,
        *,
        source: Optional[Union[str, bytes]] = None,
        timeout: Optional[float] = None,
        key: Optional[str] = None,
        workspace: Union[None, Digest, Mapping[str, str], bytes] = None,
        out: bool = False,
    ) -> Result:
        """``POST /runtimes/{runtime}/call``: run a registered script (its digest, or the
        Script :meth:`put_script` returned), or ``source=`` directly, with ``event``.
        ``workspace`` is ``{"inline": <base64 tar>}``, ``{"blob": digest}``, a Blob, or the
        tar's bytes; ``out`` returns the directory as ``Result.workspace``."""
        path, query, body = self._script_call(runtime, script, event, source, workspace, out, False)
        return self._send(
            Op(
                "POST",
                path,
                query=query,
                body=body,
                ctype="application/json",
                timeout=timeout,
                key=key,
                decode=Result.from_json,
                cancellable=True,
            )
        )

    def stream_script(
        self,
        runtime: str,
        script: Optional[Digest] = None,
        event: JSON = None,
        *,
        source: Optional[Union[str, bytes]] = None,
        timeout: Optional[float] = None,
        key: Optional[str] = None,
        workspace: Union[None, Digest, Mapping[str, str], bytes] = None,
        out: bool = False,
    ) -> Any:
        """:meth:`run_script` as a stream, like :meth:`stream`."""
        path, query, body = self._script_call(runtime, script, event, source, workspace, out, True)
        return self._stream(
            Op("POST", path, query=query, body=body, ctype="application/json", timeout=timeout, key=key, cancellable=True)
        )

    # ---- scripts, blobs, dependency sets -------------------------------------------------

    def put_script(self, source: Union[str, bytes]) -> Script:
        """``PUT /scripts``: register a script (the raw bytes, registered against the
        caller's tenant); idempotent. ``Script.sha256`` is its name from then on."""
        data = source.encode() if isinstance(source, str) else bytes(source)
        return self._send(
            Op("PUT", "/scripts", body=data, ctype="application/octet-stream", decode=Script.from_json)
        )

    def script(self, digest: Digest) -> Script:
        """``GET /scripts/{digest}``: whether the host holds it (for you) and its size; never
        the bytes. Not held, or not yours, raises NotFound."""
        return self._send(Op("GET", "/scripts/" + path_part(_digest(digest)), decode=Script.from_json))

    def delete_script(self, digest: Digest) -> Dict[str, Any]:
        """``DELETE /scripts/{digest}`` (deploy rights): forget it, for every tenant."""
        return self._send(Op("DELETE", "/scripts/" + path_part(_digest(digest))))

    def put_blob(self, data: bytes) -> Blob:
        """``PUT /blobs``: store a workspace tar once; idempotent. Name it by
        ``Blob.sha256`` in ``workspace=``."""
        return self._send(
            Op("PUT", "/blobs", body=bytes(data), ctype="application/octet-stream", decode=Blob.from_json)
        )

    def delete_blob(self, digest: Digest) -> Dict[str, Any]:
        """``DELETE /blobs/{digest}`` (deploy rights)."""
        return self._send(Op("DELETE", "/blobs/" + path_part(_digest(digest))))

    def put_deps(self, image: str, files: Mapping[str, Union[str, bytes]]) -> Deps:
        """``POST /deps``: send a lock file (``requirements.txt``, or ``package.json`` with
        ``package-lock.json``) to build a dependency set for ``image``. Answers at once with
        ``state == "building"``; poll :meth:`deps`."""
        fs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in files.items()}
        return self._send(
            Op("POST", "/deps", body=_json({"image": image, "files": fs}), ctype="application/json", decode=Deps.from_json)
        )

    def deps(self, id: Optional[str] = None) -> Any:
        """``GET /deps/{id}``: one dependency set (``building``, ``ready`` or ``failed`` with
        its ``log``); without ``id``, ``GET /deps``: every one the caller can see."""
        if id is None:
            return self._send(Op("GET", "/deps", decode=_list("deps", Deps.from_json)))
        return self._send(Op("GET", "/deps/" + path_part(id), decode=Deps.from_json))

    def delete_deps(self, id: str) -> Dict[str, Any]:
        """``DELETE /deps/{id}`` (deploy rights); refused (409) while a pool is built on it."""
        return self._send(Op("DELETE", "/deps/" + path_part(id)))

    # ---- tenants, limits, secrets --------------------------------------------------------

    def create_tenant(self, id: str) -> Tenant:
        """``POST /tenants`` (operator): idempotent; ``Tenant.created`` says whether it is new."""

        def decode(v: Any) -> Tenant:
            d = v if isinstance(v, dict) else {}
            created = d.get("created")
            return Tenant.from_json(d.get("tenant"), created if isinstance(created, bool) else None)

        return self._send(Op("POST", "/tenants", body=_json({"id": id}), ctype="application/json", decode=decode))

    def tenants(self) -> List[Tenant]:
        """``GET /tenants`` (operator)."""
        return self._send(Op("GET", "/tenants", decode=_list("tenants", Tenant.from_json)))

    def tenant(self, id: str) -> Tenant:
        """``GET /tenants/{id}``: the operator, or that tenant itself."""
        return self._send(Op("GET", "/tenants/" + path_part(id), decode=Tenant.from_json))

    def delete_tenant(self, id: str) -> Dict[str, Any]:
        """``DELETE /tenants/{id}`` (deploy rights): stops its functions and pools, removes the
        scripts only it referred to, revokes its tokens, and answers all three lists."""
        return self._send(Op("DELETE", "/tenants/" + path_part(id), wait=300))

    def set_limits(
        self,
        id: str,
        *,
        mem: Any = UNSET,
        cpu: Any = UNSET,
        pids: Any = UNSET,
        timeout: Any = UNSET,
        scratch: Any = UNSET,
        network: Any = UNSET,
        allow: Any = UNSET,
    ) -> Tenant:
        """``PATCH /tenants/{id}/limits`` (deploy rights): set the keys given, leave the rest;
        ``None`` clears a key. Limits only narrow what a function or pool was declared with;
        a value above every ceiling the tenant can reach raises ZygoError (422)."""
        body: Dict[str, Any] = {}
        for k, v in (
            ("mem", mem),
            ("cpu", cpu),
            ("pids", pids),
            ("timeout", timeout),
            ("scratch", scratch),
            ("network", network),
            ("allow", allow),
        ):
            if v is not UNSET:
                body[k] = _seconds(v) if k == "timeout" else v
        return self._send(
            Op("PATCH", f"/tenants/{path_part(id)}/limits", body=_json(body), ctype="application/json", decode=Tenant.from_json)
        )

    def put_secret(self, tenant: str, name: str, value: str) -> Dict[str, Any]:
        """``PUT /tenants/{tenant}/secrets/{name}`` (deploy rights): store a secret's value,
        sealed; nothing can read it back."""
        return self._send(
            Op(
                "PUT",
                f"/tenants/{path_part(tenant)}/secrets/{path_part(name)}",
                body=_json({"value": value}),
                ctype="application/json",
            )
        )

    def delete_secret(self, tenant: str, name: str) -> Dict[str, Any]:
        """``DELETE /tenants/{tenant}/secrets/{name}`` (deploy rights)."""
        return self._send(Op("DELETE", f"/tenants/{path_part(tenant)}/secrets/{path_part(name)}"))

    def secrets(self, tenant: str) -> List[str]:
        """``GET /tenants/{tenant}/secrets`` (operator): the names, never the values."""

        def decode(v: Any) -> List[str]:
            names = v.get("secrets") if isinstance(v, dict) else v
            if not isinstance(names, list):
                raise ZygoError("the answer has no 'secrets' list")
            return [n if isinstance(n, str) else str(n.get("name")) if isinstance(n, dict) else str(n) for n in names]

        return self._send(Op("GET", f"/tenants/{path_part(tenant)}/secrets", decode=decode))

    # ---- tokens --------------------------------------------------------------------------

    def mint_token(self, tenant: Optional[str] = None) -> Token:
        """``POST /tenants/{tenant}/tokens``, or ``POST /tokens`` for an operator token
        (deploy rights). ``Token.secret`` exists only in this answer."""
        path = "/tokens" if tenant is None else f"/tenants/{path_part(tenant)}/tokens"
        return self._send(Op("POST", path, decode=Token.from_json))

    def tokens(self) -> List[Token]:
        """``GET /tokens`` (deploy rights): every token's record, never a secret."""
        return self._send(Op("GET", "/tokens", decode=_list("tokens", Token.from_json)))

    def revoke_token(self, id: str) -> Dict[str, Any]:
        """``DELETE /tokens/{id}`` (deploy rights): a 401 from the next request on."""
        return self._send(Op("DELETE", "/tokens/" + path_part(id)))
