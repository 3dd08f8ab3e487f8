"""The client against a real `zygo api`, only with ZYGO_LIVE=1 (and ZYGO_API_URL,
ZYGO_API_TOKEN). With that alone only the read-only check runs, so it may be pointed at any
API. The rest serve, call, cancel, create and delete things, and run only against an API
of the suite's own, which sdk/live.sh starts (with a function `echo`, from
sdk/live/handlers.py, and a bootstrap token with deploy rights) and says so with
ZYGO_LIVE_OWN=1."""

import asyncio
import os
import threading
import time
import unittest
import uuid

import zygo_sdk as zygo

LIVE = os.environ.get("ZYGO_LIVE") == "1"
OWN = LIVE and os.environ.get("ZYGO_LIVE_OWN") == "1"


@unittest.skipUnless(LIVE, "ZYGO_LIVE=1 runs it against a real API")
class LiveReadOnlyTest(unittest.TestCase):
    def test_health_version_functions(self) -> None:
        with zygo.connect() as c:
            self.assertIn(c.health().status, ("ok", "degraded"))
            self.assertTrue(c.version().version)
            self.assertIsInstance(c.functions(), list)


@unittest.skipUnless(OWN, "ZYGO_LIVE=1 ZYGO_LIVE_OWN=1: against an API of the suite's own (sdk/live.sh)")
class LiveTest(unittest.TestCase):
    def setUp(self) -> None:
        self.c = zygo.connect()
        self.addCleanup(self.c.close)
        self.uniq = uuid.uuid4().hex[:8]

    def test_deploy_rights_and_the_function_are_there(self) -> None:
        self.assertIsInstance(self.c.version().private_net, bool)  # deploy rights see it
        self.assertIn("echo", [f.name for f in self.c.functions()])

    def test_call_stream_batch_and_errors(self) -> None:
        r = self.c.call("echo", {"n": 1}, timeout=20)
        self.assertEqual(r.result, {"n": 1})
        self.assertIn("hello from echo", r.stdout)
        self.assertTrue(r.request_id)
        self.assertTrue(r.started)
        # Fractional milliseconds: a fast call's wall time is still more than 0.
        self.assertIsInstance(r.metrics.wall_ms, float)
        self.assertGreater(r.metrics.wall_ms, 0)
        self.assertEqual(self.c.fn("echo")([1, 2]).result, [1, 2])

        items = list(self.c.stream("echo", {"progress": True}))
        self.assertTrue(items[-1].is_result)
        self.assertEqual(items[-1].result.result, {"progress": True})
        self.assertIn(("progress", "half way"), [(e.kind, e.data) for e in items[:-1]])

        out = self.c.batch("echo", [1, 2, 3])
        self.assertEqual([x.result for x in out], [1, 2, 3])

        with self.assertRaises(zygo.HandlerError) as cm:
            self.c.call("echo", {"fail": True})
        self.assertIn("asked to fail", str(cm.exception) + cm.exception.stderr + (cm.exception.traceback or ""))
        self.assertIn("hello from echo", cm.exception.stdout)
        self.assertIsNone(cm.exception.exit_code)  # it raised; it did not exit
        # A handler whose process exited: the code it exited with.
        with self.assertRaises(zygo.HandlerError) as cm:
            self.c.call("echo", {"exit": 3})
        self.assertEqual(cm.exception.exit_code, 3)
        it = iter(self.c.stream("echo", {"fail": True}))
        with self.assertRaises(zygo.HandlerError):
            for _ in it:
                pass
        with self.assertRaises(zygo.NotFound):
            self.c.call("no-such-function-" + self.uniq)
        with self.assertRaises(zygo.AuthError):
            zygo.connect(token="zygo_" + "0" * 64).functions()
        with self.assertRaises(zygo.NotFound):
            self.c.cancel("nothing-under-" + self.uniq)

    def test_cancel_by_key(self) -> None:
        key = "live-" + self.uniq
        got = []

        def call() -> None:
            try:
                self.c.call("echo", {"sleep": 15}, key=key, timeout=30)
            except zygo.ZygoError as e:
                got.append(e)

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.assertGreaterEqual(self.c.cancel(key), 1)
                break
            except zygo.NotFound:
                time.sleep(0.05)
        t.join(30)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], zygo.Cancelled)

    def test_aio_cancel_reaches_the_server(self) -> None:
        async def main() -> None:
            async with zygo.aio.connect() as c:
                before = (await c.stats("echo")).get("cancelled", 0)
                task = asyncio.ensure_future(c.call("echo", {"sleep": 15}, timeout=30))
                await asyncio.sleep(1.0)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                for _ in range(100):
                    if (await c.stats("echo")).get("cancelled", 0) > before:
                        return
                    await asyncio.sleep(0.1)
                self.fail("the server never counted the cancel")

        asyncio.run(main())

    def test_a_burst_of_one_token_is_served_in_turn(self) -> None:
        # More calls at once than the token's share of the API's channels (a quarter):
        # the API queues the rest, and the client resends what is still Busy.
        async def main() -> list:
            async with zygo.aio.connect() as c:
                return await asyncio.gather(*(c.call("echo", {"sleep": 1, "n": i}) for i in range(8)))

        results = asyncio.run(main())
        self.assertEqual([r.result["n"] for r in results], list(range(8)))

    def test_scripts_pools_tenants_tokens(self) -> None:
        pool = "sdkpy-" + self.uniq
        tenant = "t" + self.uniq
        self.c.serve_runtime(pool, {"agent": "python", "min_warm": 1, "max_warm": 2})
        self.addCleanup(lambda: self.c.stop_runtime(pool))
        self.assertIn(pool, [p.name for p in self.c.runtimes()])
        source = f"def handler(event):\n    return {{'twice': event * 2, 'tag': '{self.uniq}'}}\n"
        s = self.c.put_script(source)
        self.assertTrue(s.sha256.startswith("sha256:"))
        self.assertTrue(self.c.script(s.sha256).held)
        self.assertTrue(self.c.put_script(source).existed)
        r = self.c.run_script(pool, s, 21)
        self.assertEqual(r.result, {"twice": 42, "tag": self.uniq})
        r = self.c.run_script(pool, source="def handler(e):\n    return -e\n", event=5)
        self.assertEqual(r.result, -5)

        t = self.c.create_tenant(tenant)
        self.addCleanup(lambda: self.c.delete_tenant(tenant))
        self.assertEqual((t.id, t.created), (tenant, True))
        self.assertFalse(self.c.create_tenant(tenant).created)
        self.assertIn(tenant, [x.id for x in self.c.tenants()])
        minted = self.c.mint_token(tenant)
        self.assertTrue(minted.secret and minted.secret.startswith("zygo_"))
        self.assertIn(minted.id, [x.id for x in self.c.tokens()])
        acme = zygo.connect(token=minted.secret)
        self.addCleanup(acme.close)
        self.assertEqual(acme.tenant(tenant).id, tenant)
        with self.assertRaises(zygo.AuthError):
            acme.tenants()
        # a digest the tenant did not register is not the tenant's
        with self.assertRaises(zygo.NotFound):
            acme.script(s.sha256)
        mine = acme.put_script(f"def handler(e):\n    return 'mine {self.uniq}'\n")
        self.assertEqual(acme.run_script(pool, mine, None).result, f"mine {self.uniq}")
        self.assertEqual(self.c.for_tenant(tenant).script(mine.sha256).sha256, mine.sha256)
        t = self.c.set_limits(tenant, mem="64M")
        self.assertEqual(t.limits.get("mem"), "64M")
        self.c.revoke_token(minted.id)
        with self.assertRaises(zygo.AuthError):
            acme.tenant(tenant)

    def test_dependency_sets(self) -> None:
        # A requirements.txt with no requirement: a real build (a venv at /venv) that
        # fetches nothing. A unique comment makes it this run's own set.
        d = self.c.put_deps("host", {"requirements.txt": f"# {self.uniq}\n"})
        self.assertTrue(d.id.startswith("deps_"), d)
        self.assertIn(d.state, ("building", "ready"))
        deadline = time.monotonic() + 120
        while self.c.deps(d.id).building and time.monotonic() < deadline:
            time.sleep(0.5)
        got = self.c.deps(d.id)
        self.assertTrue(got.ready, got)
        self.assertIn(d.id, [x.id for x in self.c.deps()])
        pool = "sdkdeps-" + self.uniq
        self.c.serve_runtime(pool, {"agent": "python"}, deps=d.id)
        r = self.c.run_script(pool, source="import sys\ndef handler(e):\n    return sys.prefix\n", event=None)
        self.assertEqual(r.result, "/venv")
        with self.assertRaises(zygo.ZygoError) as cm:
            self.c.delete_deps(d.id)
        self.assertEqual(cm.exception.status, 409)
        self.c.stop_runtime(pool)
        self.c.delete_deps(d.id)
        with self.assertRaises(zygo.NotFound):
            self.c.deps(d.id)

    def test_one_shot_run(self) -> None:
        r = self.c.run(["/bin/echo", "hi"], timeout=10)
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout, "hi\n")
        self.assertTrue(r.started)


if __name__ == "__main__":
    unittest.main()
