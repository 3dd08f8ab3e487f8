import os
import socket
import threading
import time
import unittest
from unittest import mock

import zygo_sdk as zygo
from zygo_sdk._http import parse_address

from .fake_api import RESULT, FakeAPI, Hangup, Partial, Reply


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class AddressTest(unittest.TestCase):
    def test_every_form(self) -> None:
        a = parse_address("unix:///run/zygo/api.sock")
        self.assertEqual((a.kind, a.path), ("unix", "/run/zygo/api.sock"))
        a = parse_address("http://127.0.0.1:7700")
        self.assertEqual((a.kind, a.host, a.port, a.tls), ("tcp", "127.0.0.1", 7700, False))
        a = parse_address("https://zygo.internal:8443")
        self.assertEqual((a.host, a.port, a.tls), ("zygo.internal", 8443, True))
        a = parse_address("https://zygo.internal")
        self.assertEqual(a.port, 443)
        a = parse_address("box:9000")
        self.assertEqual((a.host, a.port, a.tls), ("box", 9000, False))
        a = parse_address("http://[::1]:7700/prefix/")
        self.assertEqual((a.host, a.port, a.prefix), ("::1", 7700, "/prefix"))

    def test_argument_then_environment_then_default(self) -> None:
        with mock.patch.dict(os.environ, {"ZYGO_API_URL": "unix:///tmp/x.sock"}):
            self.assertEqual(zygo.connect().url, "unix:///tmp/x.sock")
            self.assertEqual(zygo.connect("box:1").url, "http://box:1")
        env = {k: v for k, v in os.environ.items() if k != "ZYGO_API_URL"}
        with mock.patch.dict(os.environ, env, clear=True):
            self.assertEqual(zygo.connect().url, "http://127.0.0.1:7700")

    def test_bad_addresses_say_what_is_wrong(self) -> None:
        for bad in ("unix://relative.sock", "ftp://x:1", "box", "box:0", "box:99999", "http://"):
            with self.assertRaises(ValueError, msg=bad):
                parse_address(bad)


class TransportTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = FakeAPI()
        self.addCleanup(self.api.close)

    def test_headers_token_tenant_key_timeout(self) -> None:
        c = zygo.connect(self.api.url, token="zygo_abc")
        r = c.for_tenant("acme").call("resize", {"a": 1}, timeout=2.5, key="job-1")
        self.assertEqual(r.result, {"ok": True})
        self.assertEqual(r.metrics.wall_ms, 1.5)
        req = self.api.requests[-1]
        self.assertEqual((req.method, req.path), ("POST", "/fn/resize"))
        self.assertEqual(req.headers["authorization"], "Bearer zygo_abc")
        self.assertEqual(req.headers["x-zygo-tenant"], "acme")
        self.assertEqual(req.headers["x-zygo-request-key"], "job-1")
        self.assertEqual(req.headers["x-zygo-timeout-ms"], "2500")
        self.assertEqual(req.json(), {"a": 1})
        c.call("resize")
        req = self.api.requests[-1]
        self.assertNotIn("x-zygo-tenant", req.headers)
        self.assertEqual(req.body, b"null")

    def test_token_from_environment(self) -> None:
        with mock.patch.dict(os.environ, {"ZYGO_API_TOKEN": "zygo_env"}):
            zygo.connect(self.api.url).functions()
            self.assertEqual(self.api.requests[-1].headers["authorization"], "Bearer zygo_env")
            zygo.connect(self.api.url, token="zygo_arg").functions()
            self.assertEqual(self.api.requests[-1].headers["authorization"], "Bearer zygo_arg")

    def test_unix_socket(self) -> None:
        with FakeAPI(unix=True) as api:
            c = zygo.connect(api.url, token="t")
            self.assertEqual(c.call("f").result, {"ok": True})
            self.assertEqual(c.call("f").result, {"ok": True})
            self.assertEqual(api.connections, 1)
            self.assertEqual(api.requests[0].headers["host"], "localhost")

    def test_chunked_answers_are_read(self) -> None:
        self.api.handler = lambda req: Reply(body=RESULT, chunked=True)
        c = zygo.connect(self.api.url)
        self.assertEqual(c.call("f").result, {"ok": True})
        self.assertEqual(c.call("f").result, {"ok": True})
        self.assertEqual(self.api.connections, 1)

    def test_connections_are_reused(self) -> None:
        c = zygo.connect(self.api.url)
        for _ in range(5):
            c.call("f")
        c.for_tenant("acme").functions()
        self.assertEqual(self.api.connections, 1)

    def test_connection_close_is_honoured(self) -> None:
        self.api.handler = lambda req: Reply(body=RESULT, close=True)
        c = zygo.connect(self.api.url)
        c.call("f")
        c.call("f")
        self.assertEqual(self.api.connections, 2)
        self.assertEqual(len(self.api.requests), 2)

    def test_pool_is_safe_across_threads(self) -> None:
        c = zygo.connect(self.api.url)
        errors = []

        def work() -> None:
            try:
                for i in range(25):
                    self.assertEqual(c.call("f", i).result, {"ok": True})
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(self.api.requests), 200)
        self.assertLessEqual(self.api.connections, 8)
        # every request arrived whole and in order per connection
        self.assertEqual(sorted(r.json() for r in self.api.requests), sorted(list(range(25)) * 8))

    def test_a_connection_idle_for_more_than_20_s_is_dropped(self) -> None:
        c = zygo.connect(self.api.url)
        clock = Clock()
        c._shared.pool.clock = clock
        c.call("f")
        clock.now += 19.5
        c.call("f")
        self.assertEqual(self.api.connections, 1)
        clock.now += 20.5
        c.call("f")
        self.assertEqual(self.api.connections, 2)
        # the stale one was closed, not left open
        self.assertTrue(self.api.wait_for(lambda: self.api.closed_by_client >= 1))
        self.assertEqual([r.conn for r in self.api.requests], [1, 1, 2])

    def _hang_up_after_first(self, second: object) -> None:
        answered = []

        def handler(req):  # type: ignore[no-untyped-def]
            if req.conn == 1 and not answered:
                answered.append(req)
                return Reply(body=RESULT, hangup_after=True)
            return second(req) if callable(second) else second

        self.api.handler = handler

    def test_a_reused_connection_closed_before_the_answer_is_retried_once(self) -> None:
        self._hang_up_after_first(Reply(body=RESULT))
        c = zygo.connect(self.api.url)
        c.call("f", 1)
        time.sleep(0.05)  # the server's FIN arrives
        self.assertEqual(c.call("f", 2).result, {"ok": True})
        self.assertEqual(self.api.connections, 2)
        # the request reached the server once: on the fresh connection
        self.assertEqual([(r.conn, r.json()) for r in self.api.requests], [(1, 1), (2, 2)])

    def test_a_reused_connection_reset_before_the_answer_is_retried_once(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            if state["n"] == 2:
                return Hangup(reset=True)  # reads the request, answers with a RST
            return Reply(body=RESULT)

        self.api.handler = handler
        c = zygo.connect(self.api.url)
        c.call("f", 1)
        self.assertEqual(c.call("f", 2).result, {"ok": True})
        self.assertEqual([(r.conn, r.json()) for r in self.api.requests], [(1, 1), (1, 2), (2, 2)])

    def test_a_fresh_connection_that_fails_is_a_transport_error(self) -> None:
        self.api.handler = lambda req: Hangup()
        c = zygo.connect(self.api.url)
        with self.assertRaises(zygo.TransportError):
            c.call("f")
        self.assertEqual(len(self.api.requests), 1)

    def test_a_retried_request_whose_fresh_connection_fails_is_not_sent_again(self) -> None:
        self._hang_up_after_first(Hangup())
        c = zygo.connect(self.api.url)
        c.call("f", 1)
        time.sleep(0.05)
        with self.assertRaises(zygo.TransportError):
            c.call("f", 2)
        self.assertEqual([(r.conn, r.json()) for r in self.api.requests], [(1, 1), (2, 2)])

    def test_a_failure_after_the_first_byte_is_never_retried(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            return Partial() if state["n"] == 2 else Reply(body=RESULT)

        self.api.handler = handler
        c = zygo.connect(self.api.url)
        c.call("f", 1)
        with self.assertRaises(zygo.TransportError) as cm:
            c.call("f", 2)
        self.assertIn("middle", str(cm.exception))
        self.assertEqual([(r.conn, r.json()) for r in self.api.requests], [(1, 1), (1, 2)])

    def test_nothing_listening_is_a_transport_error(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with self.assertRaises(zygo.TransportError) as cm:
            zygo.connect(f"127.0.0.1:{port}").health()
        self.assertIn(f"127.0.0.1:{port}", str(cm.exception))

    def test_no_answer_in_time_is_a_transport_error(self) -> None:
        def slow(req):  # type: ignore[no-untyped-def]
            time.sleep(1.5)
            return Reply(body=RESULT)

        self.api.handler = slow
        c = zygo.connect(self.api.url)
        with mock.patch("zygo_sdk.client.SLACK", 0.0):
            with self.assertRaises(zygo.TransportError):
                c.call("f", timeout=0.3)
        self.assertEqual(len(self.api.requests), 1)


if __name__ == "__main__":
    unittest.main()
