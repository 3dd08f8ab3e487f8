import unittest
from typing import Optional

import zygo_sdk as zygo

from .fake_api import RESULT, FakeAPI, Reply


class ErrorMappingTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = FakeAPI()
        self.addCleanup(self.api.close)
        # What each answer raises, as it comes (Busy is not sent again here).
        self.c = zygo.connect(self.api.url, retry_busy=False)

    def answer(self, status: int, body: object, headers: dict = {}) -> zygo.ZygoError:
        self.api.handler = lambda req: Reply(status=status, body=body, headers=dict(headers))
        with self.assertRaises(zygo.ZygoError) as cm:
            self.c.call("f")
        return cm.exception

    def test_every_status_has_its_class(self) -> None:
        cases = [
            (400, "bad_request", zygo.BadRequest),
            (400, "bad_spec", zygo.BadRequest),
            (400, "missing_secret", zygo.BadRequest),
            (401, "unauthorized", zygo.AuthError),
            (403, "forbidden", zygo.AuthError),
            (404, "not_found", zygo.NotFound),
            (408, "api_timeout", zygo.Timeout),
            (429, "busy", zygo.Busy),
            (499, "cancelled", zygo.Cancelled),
            (500, "handler", zygo.HandlerError),
            (503, "unavailable", zygo.Unavailable),
            (504, "timeout", zygo.Timeout),
            (504, "stuck", zygo.Stuck),
        ]
        for status, code, cls in cases:
            e = self.answer(status, {"error": f"it was {code}", "code": code})
            self.assertIs(type(e), cls, (status, code))
            self.assertIsInstance(e, zygo.ZygoError)
            self.assertEqual((e.status, e.code, e.message), (status, code, f"it was {code}"))

    def test_409_413_422_and_internal_stay_plain(self) -> None:
        for status, code in ((409, "conflict"), (413, "too_large"), (422, "above_ceiling"), (500, "internal")):
            e = self.answer(status, {"error": "mem is above every ceiling", "code": code})
            self.assertIs(type(e), zygo.ZygoError, code)

    def test_handler_error_carries_what_the_handler_did(self) -> None:
        e = self.answer(
            500,
            {"error": "ValueError: no", "code": "handler", "request_id": "req-9", "stdout": "out",
             "stderr": "err", "traceback": "Traceback…", "exit_code": 3, "oom_killed": False,
             "metrics": {"wall_ms": 1}},
        )
        self.assertIsInstance(e, zygo.HandlerError)
        self.assertEqual((e.stdout, e.stderr, e.exit_code, e.request_id, e.traceback), ("out", "err", 3, "req-9", "Traceback…"))
        self.assertTrue(e.started)

    def test_busy_carries_retry_after(self) -> None:
        e = self.answer(429, {"error": "busy", "code": "busy"}, {"Retry-After": "2"})
        self.assertEqual(e.retry_after, 2.0)

    def test_a_body_that_is_not_json_still_names_the_status(self) -> None:
        e = self.answer(502, b"<html>bad gateway</html>")
        self.assertIs(type(e), zygo.ZygoError)
        self.assertIn("502", str(e))

    def test_request_id_comes_from_the_header_when_the_body_has_none(self) -> None:
        e = self.answer(404, {"error": "no such function", "code": "not_found"})
        self.assertEqual(e.request_id, "req-x")

    def test_health_stopping_raises_unavailable(self) -> None:
        self.api.handler = lambda req: Reply(status=503, body={"status": "stopping"})
        with self.assertRaises(zygo.Unavailable) as cm:
            self.c.health()
        self.assertIn("stopping", str(cm.exception))
        self.api.handler = lambda req: Reply(body={"status": "degraded", "reason": "pool below min_warm"})
        h = self.c.health()
        self.assertEqual((h.status, h.reason, h.ok), ("degraded", "pool below min_warm", False))

    def test_batch_returns_errors_instead_of_raising(self) -> None:
        self.api.handler = lambda req: Reply(body={"results": [
            dict(RESULT, status=200),
            {"status": 429, "error": "busy", "code": "busy"},
            {"status": 500, "error": "boom", "code": "handler", "stderr": "trace"},
        ]})
        out = self.c.batch("f", [1, 2, 3])
        self.assertIsInstance(out[0], zygo.Result)
        self.assertIsInstance(out[1], zygo.Busy)
        self.assertIsInstance(out[2], zygo.HandlerError)
        self.assertEqual(out[2].stderr, "trace")
        self.assertEqual(self.api.requests[-1].json(), {"events": [1, 2, 3]})


class RetryTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = FakeAPI()
        self.addCleanup(self.api.close)
        self.slept: list = []
        # The client's clock: it moves only when the client sleeps (or a test says the
        # server took its time), so the limits are exact.
        self.now = 0.0

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def client(self, **kw: object) -> zygo.Client:
        c = zygo.connect(self.api.url, **kw)  # type: ignore[arg-type]
        c._sleep = self.sleep
        c._clock = lambda: self.now
        return c

    def refuse(self, n: int, status: int = 429, retry_after: Optional[str] = "0", took: float = 0.0) -> None:
        """The first ``n`` requests are refused, each after ``took`` seconds."""
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            if state["n"] <= n:
                self.now += took
                code = "busy" if status == 429 else "unavailable" if status == 503 else "handler"
                headers = {"Retry-After": retry_after} if retry_after is not None else {}
                return Reply(status=status, body={"error": code, "code": code}, headers=headers)
            return Reply(body=RESULT)

        self.api.handler = handler

    def test_unavailable_is_not_resent_by_default(self) -> None:
        self.refuse(1, status=503)
        with self.assertRaises(zygo.Unavailable):
            self.client().call("f")
        self.assertEqual(len(self.api.requests), 1)
        self.assertEqual(self.slept, [])

    def test_busy_is_resent_by_default_after_its_retry_after(self) -> None:
        self.refuse(2, retry_after="2")
        r = self.client().call("f")
        self.assertEqual(r.result, {"ok": True})
        self.assertEqual(len(self.api.requests), 3)
        self.assertEqual(self.slept, [2.0, 2.0])

    def test_a_busy_wait_is_a_second_without_retry_after_and_at_most_five(self) -> None:
        self.refuse(1, retry_after=None)
        self.client().call("f")
        self.refuse(1, retry_after="60")
        self.client().call("f")
        self.refuse(1, retry_after="0")
        self.client().call("f")
        self.assertEqual(self.slept, [1.0, 5.0, 0.1])

    def test_retry_busy_false_raises_busy_as_it_comes(self) -> None:
        self.refuse(1, retry_after="1")
        with self.assertRaises(zygo.Busy) as cm:
            self.client(retry_busy=False).call("f")
        self.assertEqual(cm.exception.retry_after, 1.0)
        self.assertEqual(len(self.api.requests), 1)
        self.assertEqual(self.slept, [])

    def test_busy_is_resent_for_at_most_30_s(self) -> None:
        self.refuse(100, retry_after="2")
        with self.assertRaises(zygo.Busy):
            self.client().call("f")
        # Sent at 0, 2, …, 30 s: the next would go out past 30 s after the first.
        self.assertEqual(self.slept, [2.0] * 15)
        self.assertEqual(len(self.api.requests), 16)

    def test_busy_is_never_resent_past_the_calls_timeout(self) -> None:
        self.refuse(100, retry_after="2")
        with self.assertRaises(zygo.Busy):
            self.client().call("f", timeout=5)
        self.assertEqual(self.slept, [2.0, 2.0])
        self.slept.clear()
        self.api.requests.clear()
        self.refuse(100, retry_after="2")
        with self.assertRaises(zygo.Busy):
            self.client(timeout=3).call("f")
        self.assertEqual(self.slept, [2.0])

    def test_a_busy_that_came_after_the_whole_wait_is_not_resent(self) -> None:
        # The API held the request in its queue for 30 s before it said busy.
        self.refuse(1, retry_after="1", took=30.0)
        with self.assertRaises(zygo.Busy):
            self.client().call("f")
        self.assertEqual(len(self.api.requests), 1)
        self.assertEqual(self.slept, [])

    def test_retries_come_first_then_busy_is_resent(self) -> None:
        self.refuse(3, retry_after="0")
        self.client(retries=1, backoff=0.5).call("f")
        self.assertEqual(self.slept, [0.5, 0.1, 0.1])

    def test_busy_is_resent_with_backoff_doubling(self) -> None:
        self.refuse(3)
        r = self.client(retries=3, backoff=0.5).call("f")
        self.assertEqual(r.result, {"ok": True})
        self.assertEqual(len(self.api.requests), 4)
        self.assertEqual(self.slept, [0.5, 1.0, 2.0])

    def test_retry_after_wins_when_longer(self) -> None:
        self.refuse(2, status=503, retry_after="3")
        self.client(retries=2, backoff=1.0).call("f")
        self.assertEqual(self.slept, [3.0, 3.0])
        self.slept.clear()
        self.api.requests.clear()
        self.refuse(2, status=503, retry_after="3")
        self.client(retries=2, backoff=2.0).call("f")
        self.assertEqual(self.slept, [3.0, 4.0])

    def test_the_last_refusal_is_what_the_caller_sees(self) -> None:
        self.refuse(10, retry_after="1")
        with self.assertRaises(zygo.Busy) as cm:
            self.client(retries=2, backoff=0.1, retry_busy=False).call("f")
        self.assertEqual(cm.exception.retry_after, 1.0)
        self.assertEqual(len(self.api.requests), 3)

    def test_other_errors_are_never_resent(self) -> None:
        for status, cls in ((500, zygo.HandlerError), (504, zygo.Timeout), (404, zygo.NotFound)):
            self.api.requests.clear()
            code = {500: "handler", 504: "timeout", 404: "not_found"}[status]
            self.api.handler = lambda req, s=status, c=code: Reply(status=s, body={"error": c, "code": c})
            with self.assertRaises(cls):
                self.client(retries=3).call("f")
            self.assertEqual(len(self.api.requests), 1)
        self.assertEqual(self.slept, [])

    def test_for_tenant_views_keep_the_retry_settings(self) -> None:
        self.refuse(1)
        c = self.client(retries=1, backoff=0.25)
        c.for_tenant("acme").call("f")
        self.assertEqual(self.slept, [0.25])
        self.refuse(1)
        with self.assertRaises(zygo.Busy):
            self.client(retry_busy=False).for_tenant("acme").call("f")


if __name__ == "__main__":
    unittest.main()
