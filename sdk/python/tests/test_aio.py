import asyncio
import inspect
import threading
import time
import unittest

import zygo_sdk as zygo
import zygo_sdk.aio
from zygo_sdk.aio import AsyncClient

from .fake_api import RESULT, FakeAPI, Hangup, Partial, Reply, Stream, default_answer


def public(cls: type) -> dict:
    return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


class SurfaceTest(unittest.TestCase):
    def test_the_two_surfaces_are_equal(self) -> None:
        sync, aio = public(zygo.Client), public(AsyncClient)
        self.assertEqual(sorted(sync), sorted(aio))
        for name in sync:
            self.assertEqual(inspect.signature(sync[name]), inspect.signature(aio[name]), name)
        def params(f):  # type: ignore[no-untyped-def]
            return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

        self.assertEqual(params(zygo.connect), params(zygo.aio.connect))

    def test_every_method_that_talks_to_the_api_is_a_coroutine(self) -> None:
        aio = public(AsyncClient)
        not_coroutines = {"fn", "for_tenant", "stream", "stream_script"}
        for name, m in aio.items():
            self.assertEqual(inspect.iscoroutinefunction(m), name not in not_coroutines, name)
        self.assertFalse(inspect.iscoroutinefunction(zygo.Client.call))

    def test_reachable_both_ways(self) -> None:
        import zygo_sdk.aio as direct

        self.assertIs(zygo.aio, direct)


class AsyncTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = FakeAPI()
        self.addCleanup(self.api.close)

    def run_async(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run(asyncio.wait_for(coro, 30))

    def test_gather_many_calls_over_a_shared_pool(self) -> None:
        async def main():  # type: ignore[no-untyped-def]
            async with zygo.aio.connect(self.api.url, token="t") as c:
                rs = await asyncio.gather(*(c.call("resize", i) for i in range(20)))
                acme = await c.for_tenant("acme").tenant("acme")
                return rs, acme

        rs, acme = self.run_async(main())
        self.assertEqual([r.result for r in rs], [{"ok": True}] * 20)
        self.assertEqual(acme.id, "acme")
        self.assertLessEqual(self.api.connections, 20)
        self.assertEqual(sorted(r.json() for r in self.api.requests if r.method == "POST"), list(range(20)))

    def test_connections_are_reused_and_retried_once_before_the_first_byte(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            return Reply(body=RESULT, hangup_after=state["n"] == 2)

        self.api.handler = handler

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            await c.call("f", 1)
            await c.call("f", 2)  # the server hangs up after this answer
            await asyncio.sleep(0.05)
            return await c.call("f", 3)

        self.assertEqual(self.run_async(main()).result, {"ok": True})
        self.assertEqual([(r.conn, r.json()) for r in self.api.requests], [(1, 1), (1, 2), (2, 3)])

    def test_after_the_first_byte_or_on_a_fresh_connection_it_is_a_transport_error(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            return {1: Reply(body=RESULT), 2: Partial()}.get(state["n"], Hangup())

        self.api.handler = handler

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            await c.call("f", 1)
            with self.assertRaises(zygo.TransportError):
                await c.call("f", 2)
            with self.assertRaises(zygo.TransportError):
                await c.call("f", 3)

        self.run_async(main())
        self.assertEqual([(r.conn, r.json()) for r in self.api.requests], [(1, 1), (1, 2), (2, 3)])

    def test_the_20_s_rule(self) -> None:
        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            now = [0.0]
            c._shared.pool.clock = lambda: now[0]
            await c.call("f")
            now[0] += 21
            await c.call("f")

        self.run_async(main())
        self.assertEqual(self.api.connections, 2)

    def test_retries_and_errors(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            if state["n"] == 1:
                return Reply(status=503, body={"error": "starting", "code": "unavailable"}, headers={"Retry-After": "0"})
            if state["n"] == 2:
                return Reply(body=RESULT)
            return Reply(status=500, body={"error": "boom", "code": "handler", "stderr": "tb"})

        self.api.handler = handler

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url, retries=2, backoff=0.01)
            self.assertEqual((await c.call("f")).result, {"ok": True})
            with self.assertRaises(zygo.HandlerError) as cm:
                await c.call("f")
            self.assertEqual(cm.exception.stderr, "tb")

        self.run_async(main())
        self.assertEqual(len(self.api.requests), 3)

    def test_busy_is_resent_by_default_and_retry_busy_false_raises_it(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            if state["n"] in (1, 3):
                return Reply(status=429, body={"error": "busy", "code": "busy"}, headers={"Retry-After": "2"})
            return Reply(body=RESULT)

        self.api.handler = handler
        slept: list = []

        async def sleep(s: float) -> None:
            slept.append(s)

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            c._sleep = sleep
            self.assertEqual((await c.call("f")).result, {"ok": True})
            off = zygo.aio.connect(self.api.url, retry_busy=False)
            with self.assertRaises(zygo.Busy) as cm:
                await off.for_tenant("acme").call("f")
            self.assertEqual(cm.exception.retry_after, 2.0)

        self.run_async(main())
        self.assertEqual(slept, [2.0])
        self.assertEqual(len(self.api.requests), 3)

    def test_busy_is_resent_for_at_most_30_s(self) -> None:
        self.api.handler = lambda req: Reply(status=429, body={"error": "busy", "code": "busy"}, headers={"Retry-After": "5"})
        now = [0.0]

        async def sleep(s: float) -> None:
            now[0] += s

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            c._sleep, c._clock = sleep, lambda: now[0]
            with self.assertRaises(zygo.Busy):
                await c.call("f")
            # A stream too, before anything was yielded.
            with self.assertRaises(zygo.Busy):
                async for _ in c.stream("f"):
                    pass

        self.run_async(main())
        # Each sent at 0, 5, …, 30 s.
        self.assertEqual(len(self.api.requests), 14)
        self.assertEqual(now[0], 60.0)

    def test_cancelling_the_task_cancels_on_the_server_first(self) -> None:
        release = threading.Event()

        def handler(req):  # type: ignore[no-untyped-def]
            if req.method == "POST":
                release.wait(10)
                return Reply(status=499, body={"error": "cancelled", "code": "cancelled"})
            if req.method == "DELETE":
                release.set()
                return Reply(body={"cancelled": 1})
            return default_answer(req)

        self.api.handler = handler

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            task = asyncio.ensure_future(c.call("render", {"pages": 400}))
            self.assertTrue(await asyncio.to_thread(self.api.wait_for, lambda: len(self.api.requests) == 1))
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            # by the time CancelledError reached us, the server had the cancel
            return [(r.method, r.path) for r in self.api.requests]

        seen = self.run_async(main())
        post = self.api.requests[0]
        key = post.headers["x-zygo-request-key"]
        self.assertTrue(key)
        self.assertEqual(seen, [("POST", "/fn/render"), ("DELETE", "/requests/" + key)])

    def test_a_given_key_is_the_one_cancelled(self) -> None:
        release = threading.Event()

        def handler(req):  # type: ignore[no-untyped-def]
            if req.method == "POST":
                release.wait(10)
                return Reply(status=499, body={"error": "cancelled", "code": "cancelled"})
            release.set()
            return Reply(body={"cancelled": 1})

        self.api.handler = handler

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            task = asyncio.ensure_future(c.run_script("py312", "sha256:" + "ab" * 32, key="job-4711"))
            await asyncio.to_thread(self.api.wait_for, lambda: len(self.api.requests) == 1)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task

        self.run_async(main())
        self.assertEqual(self.api.routes()[-1], ("DELETE", "/requests/job-4711"))

    def test_streams(self) -> None:
        self.api.handler = lambda req: Stream([
            {"stream": "stdout", "data": "a"},
            {"stream": "progress", "data": "1 of 2"},
            {"status": 500, "error": "boom", "code": "handler", "stdout": "a"},
        ])

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            got = []
            with self.assertRaises(zygo.HandlerError):
                async for ev in c.stream("render"):
                    got.append((ev.kind, ev.data))
            return got

        self.assertEqual(self.run_async(main()), [("stdout", "a"), ("progress", "1 of 2")])

    def test_abandoning_a_stream_closes_its_connection_without_cancelling(self) -> None:
        self.api.handler = lambda req: Stream([{"stream": "stdout", "data": "1"}], hang=True)

        async def main():  # type: ignore[no-untyped-def]
            c = zygo.aio.connect(self.api.url)
            async with c.stream("render") as s:
                async for ev in s:
                    self.assertEqual(ev.data, "1")
                    break

        self.run_async(main())
        self.assertTrue(self.api.wait_for(lambda: self.api.closed_by_client == 1))
        self.assertEqual(self.api.routes(), [("POST", "/fn/render")])

    def test_unix_socket(self) -> None:
        with FakeAPI(unix=True) as api:

            async def main():  # type: ignore[no-untyped-def]
                c = zygo.aio.connect(api.url)
                return [(await c.call("f")).result for _ in range(3)]

            self.assertEqual(self.run_async(main()), [{"ok": True}] * 3)
            self.assertEqual(api.connections, 1)


if __name__ == "__main__":
    unittest.main()
