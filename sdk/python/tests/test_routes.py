"""Every route of the API but GET /metrics and POST /mcp has a method: the test reads the route list
(spec/openapi.json when the repository has it, else sdk/routes.json), calls the method
this table names for each route against the stand-in API, and checks that the request it
sent is that route."""

import re
import sys
import unittest
from typing import Any, Callable, Dict, Tuple

import zygo_sdk as zygo

from .fake_api import FakeAPI
from .routes import api_routes

D = "sha256:" + "ab" * 32

METHODS: Dict[Tuple[str, str], Tuple[str, Callable[[zygo.Client], Any]]] = {
    ("GET", "/healthz"): ("health", lambda c: c.health()),
    ("GET", "/version"): ("version", lambda c: c.version()),
    ("GET", "/fn"): ("functions", lambda c: c.functions()),
    ("PUT", "/fn/{name}"): ("serve", lambda c: c.serve("f", {"agent": "python", "entry": "h.py:handler"}, base_dir="/srv")),
    ("DELETE", "/fn/{name}"): ("stop", lambda c: c.stop("f")),
    ("POST", "/fn/{name}"): ("call", lambda c: c.call("f", {"a": 1})),
    ("POST", "/fn/{name}/batch"): ("batch", lambda c: c.batch("f", [1, 2])),
    ("GET", "/fn/{name}/logs"): ("logs", lambda c: c.logs("f", limit=5)),
    ("GET", "/fn/{name}/stats"): ("stats", lambda c: c.stats("f")),
    ("POST", "/fn/{name}/warm"): ("warm", lambda c: c.warm("f", 2)),
    ("POST", "/run"): ("run", lambda c: c.run(["echo", "hi"], mem="64M", timeout=5)),
    ("GET", "/runtimes"): ("runtimes", lambda c: c.runtimes()),
    ("POST", "/runtimes"): ("serve_runtime", lambda c: c.serve_runtime("py312", {"image": "host", "agent": "python"}, secrets=["K"])),
    ("DELETE", "/runtimes/{name}"): ("stop_runtime", lambda c: c.stop_runtime("py312")),
    ("POST", "/runtimes/{name}/call"): ("run_script", lambda c: c.run_script("py312", D, {"n": 1})),
    ("PUT", "/scripts"): ("put_script", lambda c: c.put_script("print(1)")),
    ("GET", "/scripts/{digest}"): ("script", lambda c: c.script(D)),
    ("DELETE", "/scripts/{digest}"): ("delete_script", lambda c: c.delete_script(D)),
    ("PUT", "/blobs"): ("put_blob", lambda c: c.put_blob(b"tar")),
    ("DELETE", "/blobs/{digest}"): ("delete_blob", lambda c: c.delete_blob(D)),
    ("POST", "/deps"): ("put_deps", lambda c: c.put_deps("python:3.12-slim", {"requirements.txt": "requests==2.32.3\n"})),
    ("GET", "/deps"): ("deps", lambda c: c.deps()),
    ("GET", "/deps/{id}"): ("deps", lambda c: c.deps("deps_1")),
    ("DELETE", "/deps/{id}"): ("delete_deps", lambda c: c.delete_deps("deps_1")),
    ("DELETE", "/requests/{key}"): ("cancel", lambda c: c.cancel("job-1")),
    ("POST", "/tenants"): ("create_tenant", lambda c: c.create_tenant("acme")),
    ("GET", "/tenants"): ("tenants", lambda c: c.tenants()),
    ("GET", "/tenants/{id}"): ("tenant", lambda c: c.tenant("acme")),
    ("DELETE", "/tenants/{id}"): ("delete_tenant", lambda c: c.delete_tenant("acme")),
    ("PATCH", "/tenants/{id}/limits"): ("set_limits", lambda c: c.set_limits("acme", mem="256M", cpu=0.5, timeout=30)),
    ("GET", "/tenants/{id}/secrets"): ("secrets", lambda c: c.secrets("acme")),
    ("PUT", "/tenants/{id}/secrets/{name}"): ("put_secret", lambda c: c.put_secret("acme", "K", "v")),
    ("DELETE", "/tenants/{id}/secrets/{name}"): ("delete_secret", lambda c: c.delete_secret("acme", "K")),
    ("POST", "/tokens"): ("mint_token", lambda c: c.mint_token()),
    ("POST", "/tenants/{id}/tokens"): ("mint_token", lambda c: c.mint_token("acme")),
    ("GET", "/tokens"): ("tokens", lambda c: c.tokens()),
    ("DELETE", "/tokens/{id}"): ("revoke_token", lambda c: c.revoke_token("tok_1")),
    ("POST", "/drain"): ("drain", lambda c: c.drain(grace=5)),
}


def template_re(t: str) -> "re.Pattern[str]":
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(t)) + "$")


class RoutesTest(unittest.TestCase):
    def test_every_route_but_metrics_and_mcp_has_a_method(self) -> None:
        source, routes = api_routes()
        sys.stderr.write(f"\n  routes read from {source}\n")
        self.assertGreater(len(routes), 20)
        missing = [f"{m} {p}" for m, p in routes if (m, p) not in METHODS]
        self.assertEqual(missing, [], "routes with no method in the Python client")
        with FakeAPI() as api:
            c = zygo.connect(api.url, token="t")
            for (m, p) in routes:
                name, invoke = METHODS[(m, p)]
                self.assertTrue(callable(getattr(zygo.Client, name, None)), name)
                self.assertTrue(callable(getattr(zygo.aio.AsyncClient, name, None)), name)
                before = len(api.requests)
                invoke(c)
                sent = api.requests[before:]
                self.assertEqual(len(sent), 1, f"{name} sent {len(sent)} requests")
                self.assertEqual(sent[0].method, m, name)
                self.assertRegex(sent[0].path, template_re(p), name)

    def test_set_limits_sends_only_what_was_given(self) -> None:
        with FakeAPI() as api:
            c = zygo.connect(api.url)
            c.set_limits("acme", mem="256M", pids=None, timeout=1.5)
            self.assertEqual(api.requests[-1].json(), {"mem": "256M", "pids": None, "timeout": "1500ms"})


if __name__ == "__main__":
    unittest.main()
