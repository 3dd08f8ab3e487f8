"""A plugin host on the Zygo HTTP API alone: no sandbox.toml, no file on the Zygo machine,
no shelling out to zygo.

Each customer is a tenant with its own token, limits and secrets. One runtime pool is
declared for all of them; a customer's plugin is installed by its digest and runs in that
pool with the customer's own limits, files in and out, streamed when it is long, and
stopped on request. Offboarding removes the customer with everything only it had.
"""

from __future__ import annotations

import base64
import io
import os
import sys
import tarfile
import uuid
from typing import Any, Dict, Iterator, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))

import zygo_sdk as zygo  # noqa: E402

RUNTIME = "plugins"


def make_tar(files: Dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def read_tar(data: bytes) -> Dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


class PluginHost:
    def __init__(self, url: Optional[str] = None, operator_token: Optional[str] = None) -> None:
        # The operator's client: tenants, limits, secrets, tokens and the pool.
        self.op = zygo.connect(url, operator_token, retries=3, backoff=0.2)
        self.url = url
        self.customers: Dict[str, zygo.Client] = {}  # customer -> a client with its own token
        self.tokens: Dict[str, str] = {}  # customer -> token id, for revoking

    def declare_runtime(self, mem: str = "256M", timeout: str = "30s", secrets: Optional[list] = None) -> None:
        layer = {"agent": "python", "mem": mem, "timeout": timeout, "min_warm": 1, "max_warm": 4}
        self.op.serve_runtime(RUNTIME, layer, secrets=secrets)

    def onboard(self, customer: str, *, mem: Optional[str] = None, secrets: Optional[Dict[str, str]] = None) -> None:
        self.op.create_tenant(customer)
        if mem is not None:
            self.op.set_limits(customer, mem=mem)
        for name, value in (secrets or {}).items():
            self.op.put_secret(customer, name, value)
        minted = self.op.mint_token(customer)
        assert minted.secret is not None
        self.customers[customer] = zygo.connect(self.url, minted.secret, retries=3, backoff=0.2)
        self.tokens[customer] = minted.id

    def install(self, customer: str, source: str) -> str:
        """Registers a plugin against the customer; its digest is how it is run."""
        return self.customers[customer].put_script(source).sha256

    def run(self, customer: str, digest: str, event: Any = None, files: Optional[Dict[str, bytes]] = None,
            want_files: bool = False, key: Optional[str] = None, timeout: float = 60) -> Dict[str, Any]:
        ws = {"inline": base64.b64encode(make_tar(files)).decode()} if files else None
        res = self.customers[customer].run_script(RUNTIME, digest, event, workspace=ws, out=want_files,
                                                  key=key, timeout=timeout)
        out: Dict[str, Any] = {"result": res.result, "stdout": res.stdout, "wall_ms": res.metrics.wall_ms}
        if want_files and res.workspace is not None:
            out["files"] = read_tar(res.workspace)
        return out

    def stream(self, customer: str, digest: str, event: Any = None, key: Optional[str] = None) -> Iterator[zygo.StreamEvent]:
        return self.customers[customer].stream_script(RUNTIME, digest, event, key=key or "run-" + uuid.uuid4().hex)

    def stop(self, customer: str, key: str) -> int:
        return self.customers[customer].cancel(key)

    def offboard(self, customer: str) -> Dict[str, Any]:
        gone = self.op.delete_tenant(customer)
        self.customers.pop(customer).close()
        self.tokens.pop(customer, None)
        return gone

    def close(self) -> None:
        for c in self.customers.values():
            c.close()
        try:
            self.op.stop_runtime(RUNTIME)
        except zygo.NotFound:
            pass
        self.op.close()
