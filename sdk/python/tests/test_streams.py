import base64
import time
import unittest

import zygo_sdk as zygo

from .fake_api import RESULT, FakeAPI, Reply, Stream, default_answer


class StreamTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = FakeAPI()
        self.addCleanup(self.api.close)
        self.c = zygo.connect(self.api.url)

    def test_output_then_the_result(self) -> None:
        self.api.handler = lambda req: Stream([
            {"stream": "stdout", "data": "loading\n"},
            {"stream": "progress", "data": "1 of 2"},
            {"stream": "stderr", "data": "warn\n"},
            dict(RESULT, status=200, stdout="loading\n"),
        ])
        items = list(self.c.stream("render", {"pages": 2}, key="k1"))
        self.assertEqual([(e.kind, e.data) for e in items[:3]],
                         [("stdout", "loading\n"), ("progress", "1 of 2"), ("stderr", "warn\n")])
        self.assertTrue(items[3].is_result)
        self.assertEqual(items[3].result.result, {"ok": True})
        self.assertEqual(items[3].result.stdout, "loading\n")
        req = self.api.requests[-1]
        self.assertEqual((req.path, req.query), ("/fn/render", {"stream": "1"}))
        self.assertEqual(req.headers["x-zygo-request-key"], "k1")

    def test_a_stream_cut_for_reading_slowly_says_so_in_its_result(self) -> None:
        self.api.handler = lambda req: Stream([
            {"stream": "stdout", "data": "x"},
            dict(RESULT, status=200, stdout="xyz", stream_truncated=True),
        ])
        items = list(self.c.stream("spew"))
        self.assertIs(items[-1].result.stream_truncated, True)
        self.assertEqual(items[-1].result.stdout, "xyz")
        self.api.handler = lambda req: Stream([dict(RESULT, status=200)])
        self.assertIs(list(self.c.stream("f"))[-1].result.stream_truncated, False)

    def test_nothing_is_sent_until_iterated(self) -> None:
        it = self.c.stream("render")
        time.sleep(0.05)
        self.assertEqual(self.api.requests, [])
        next(iter(it))
        self.assertEqual(len(self.api.requests), 1)

    def test_a_failed_handler_delivers_its_output_then_raises(self) -> None:
        self.api.handler = lambda req: Stream([
            {"stream": "stdout", "data": "partial\n"},
            {"status": 500, "error": "ZeroDivisionError", "code": "handler", "stdout": "partial\n", "exit_code": 1},
        ])
        it = iter(self.c.stream("render"))
        ev = next(it)
        self.assertEqual((ev.kind, ev.data), ("stdout", "partial\n"))
        with self.assertRaises(zygo.HandlerError) as cm:
            next(it)
        self.assertEqual(cm.exception.stdout, "partial\n")

    def test_a_refusal_before_anything_ran_raises_at_once(self) -> None:
        self.api.handler = lambda req: Reply(status=404, body={"error": "no function render", "code": "not_found"})
        with self.assertRaises(zygo.NotFound):
            list(self.c.stream("render"))
        self.api.handler = lambda req: Stream([{"status": 429, "error": "busy", "code": "busy"}])
        with self.assertRaises(zygo.Busy):
            list(zygo.connect(self.api.url, retry_busy=False).stream("render"))
        self.assertEqual(len(self.api.requests), 2)

    def test_a_busy_stream_is_resent_when_nothing_was_yielded(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            if state["n"] == 1:
                return Stream([{"status": 429, "error": "busy", "code": "busy"}])
            return Stream([{"stream": "stdout", "data": "x"}, dict(RESULT, status=200)])

        self.api.handler = handler
        c = zygo.connect(self.api.url, retries=1, backoff=0)
        items = list(c.stream("render"))
        self.assertEqual([e.kind for e in items], ["stdout", "result"])
        self.assertEqual(len(self.api.requests), 2)

    def test_a_busy_stream_is_resent_by_default_after_its_retry_after(self) -> None:
        state = {"n": 0}

        def handler(req):  # type: ignore[no-untyped-def]
            state["n"] += 1
            if state["n"] == 1:
                return Reply(status=429, body={"error": "busy", "code": "busy"}, headers={"Retry-After": "2"})
            if state["n"] == 2:
                return Stream([{"status": 429, "error": "busy", "code": "busy", "retry_after": 3}])
            return Stream([{"stream": "stdout", "data": "x"}, dict(RESULT, status=200)])

        self.api.handler = handler
        slept: list = []
        self.c._sleep = slept.append
        items = list(self.c.stream("render"))
        self.assertEqual([e.kind for e in items], ["stdout", "result"])
        self.assertEqual(slept, [2.0, 3.0])
        self.assertEqual(len(self.api.requests), 3)

    def test_a_busy_after_output_is_not_resent(self) -> None:
        self.api.handler = lambda req: Stream([
            {"stream": "stdout", "data": "x"},
            {"status": 429, "error": "busy", "code": "busy"},
        ])
        with self.assertRaises(zygo.Busy):
            list(self.c.stream("render"))
        self.assertEqual(len(self.api.requests), 1)

    def test_a_stream_that_ends_without_its_result_is_a_transport_error(self) -> None:
        self.api.handler = lambda req: Stream([{"stream": "stdout", "data": "x"}])
        with self.assertRaises(zygo.TransportError):
            list(self.c.stream("render"))

    def test_abandoning_closes_the_connection_and_does_not_cancel(self) -> None:
        self.api.handler = lambda req: (
            Stream([{"stream": "stdout", "data": "1"}, {"stream": "stdout", "data": "2"}], hang=True)
            if req.method == "POST" else default_answer(req)
        )
        it = iter(self.c.stream("render", key="job"))
        self.assertEqual(next(it).data, "1")
        it.close()  # what leaving a for loop early and dropping the iterator does
        self.assertTrue(self.api.wait_for(lambda: self.api.closed_by_client == 1))
        self.assertEqual([r.method for r in self.api.requests], ["POST"])
        # the stream's connection was never pooled: the next call opens its own
        self.c.functions()
        self.assertEqual(self.api.connections, 2)

    def test_stream_script(self) -> None:
        items = list(self.c.stream_script("py312", "sha256:" + "ab" * 32, {"n": 1}))
        self.assertEqual([e.kind for e in items], ["progress", "result"])
        req = self.api.requests[-1]
        self.assertEqual((req.path, req.query), ("/runtimes/py312/call", {"stream": "1"}))
        self.assertEqual(req.json(), {"script": "sha256:" + "ab" * 32, "event": {"n": 1}})


class WorkspaceTest(unittest.TestCase):
    def setUp(self) -> None:
        self.api = FakeAPI()
        self.addCleanup(self.api.close)
        self.c = zygo.connect(self.api.url)
        self.tar = b"pretend this is a tar\x00\xff"

    def test_call_takes_a_blob_in_the_query_and_returns_the_tar_decoded(self) -> None:
        self.api.handler = lambda req: Reply(body=dict(RESULT, workspace=base64.b64encode(self.tar).decode()))
        blob = zygo.Blob(sha256="sha256:" + "cd" * 32)
        r = self.c.call("convert", {"to": "png"}, workspace=blob, out=True)
        self.assertEqual(r.workspace, self.tar)
        req = self.api.requests[-1]
        self.assertEqual(req.query, {"workspace": "sha256:" + "cd" * 32, "out": "1"})
        self.assertIn("workspace=sha256:" + "cd" * 32, req.raw_path + "?workspace=sha256:" + "cd" * 32)
        with self.assertRaises(ValueError):
            self.c.call("convert", workspace={"inline": "AAAA"})  # type: ignore[arg-type]

    def test_run_script_takes_inline_or_blob_in_the_body(self) -> None:
        self.c.run_script("convert", "sha256:" + "ab" * 32, {"to": "png"},
                          workspace={"inline": base64.b64encode(self.tar).decode()}, out=True)
        body = self.api.requests[-1].json()
        self.assertEqual(body["workspace"], {"inline": base64.b64encode(self.tar).decode()})
        self.assertIs(body["out"], True)
        self.c.run_script("convert", "sha256:" + "ab" * 32, workspace={"blob": "sha256:" + "cd" * 32})
        self.assertEqual(self.api.requests[-1].json()["workspace"], {"blob": "sha256:" + "cd" * 32})
        self.assertNotIn("out", self.api.requests[-1].json())
        self.c.run_script("convert", source="print(1)", workspace=self.tar)
        body = self.api.requests[-1].json()
        self.assertEqual(body["source"], "print(1)")
        self.assertEqual(base64.b64decode(body["workspace"]["inline"]), self.tar)
        with self.assertRaises(ValueError):
            self.c.run_script("convert")

    def test_put_blob_and_put_script_send_raw_bytes(self) -> None:
        b = self.c.put_blob(self.tar)
        self.assertEqual(self.api.requests[-1].body, self.tar)
        self.assertEqual(self.api.requests[-1].headers["content-type"], "application/octet-stream")
        self.assertTrue(b.sha256.startswith("sha256:"))
        s = self.c.put_script("def handler(e):\n    return e\n")
        self.assertEqual(self.api.requests[-1].body, b"def handler(e):\n    return e\n")
        self.assertEqual(s.size, len(b"def handler(e):\n    return e\n"))

    def test_started_defaults_to_true_when_absent(self) -> None:
        body = {k: v for k, v in RESULT.items() if k != "started"}
        self.api.handler = lambda req: Reply(body=body)
        self.assertIs(self.c.call("f").started, True)
        self.api.handler = lambda req: Reply(body={"exit_code": 0, "stdout": ""})
        r = self.c.run(["true"])
        self.assertIs(r.started, True)
        self.assertTrue(r.ok)
        self.api.handler = lambda req: Reply(body={"exit_code": None, "started": False, "phase": "start", "error": "no image"})
        r = self.c.run(["true"])
        self.assertIs(r.started, False)
        self.assertFalse(r.ok)
        self.assertEqual(r.phase, "start")


if __name__ == "__main__":
    unittest.main()
