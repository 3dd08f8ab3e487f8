"""Answers that are not what an API sends: each is a TransportError naming the problem,
never a hang, a crash of another kind, or a value made up from it."""

import unittest

import zygo_sdk as zygo

from .fake_api import FakeAPI, Partial, Reply, Stream

HOSTILE = {
    "not HTTP": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "a bad status line": b"HTTP/1.1 2xx OK\r\n\r\n",
    "a header line without a colon": b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n",
    "headers over 64 KiB": b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    "a bad Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
    "a bad chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "a body shorter than its length": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
    "a 200 that is not JSON": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
}


class HostileAnswerTest(unittest.TestCase):
    def test_each_is_a_transport_error(self) -> None:
        for name, data in HOSTILE.items():
            with self.subTest(name), FakeAPI() as api:
                api.handler = lambda req, d=data: Partial(d)
                with self.assertRaises(zygo.TransportError, msg=name):
                    zygo.connect(api.url).call("f")

    def test_each_is_a_transport_error_from_the_asyncio_client_too(self) -> None:
        import asyncio

        for name, data in HOSTILE.items():
            with self.subTest(name), FakeAPI() as api:
                api.handler = lambda req, d=data: Partial(d)

                async def main() -> None:
                    async with zygo.aio.connect(api.url) as c:
                        await c.call("f")

                with self.assertRaises(zygo.TransportError, msg=name):
                    asyncio.run(main())

    def test_a_stream_line_that_is_not_json(self) -> None:
        with FakeAPI() as api:
            api.handler = lambda req: Stream(["not an object"])
            with self.assertRaises(zygo.TransportError):
                list(zygo.connect(api.url).stream("f"))

    def test_a_workspace_that_is_not_base64(self) -> None:
        with FakeAPI() as api:
            api.handler = lambda req: Reply(body={"result": 1, "workspace": "!!not base64!!"})
            with self.assertRaises(zygo.ZygoError):
                zygo.connect(api.url).call("f", out=True)

    def test_an_answer_of_the_wrong_shape_is_an_error_not_a_guess(self) -> None:
        with FakeAPI() as api:
            api.handler = lambda req: Reply(body={"nothing": "here"})
            with self.assertRaises(zygo.ZygoError):
                zygo.connect(api.url).functions()
            api.handler = lambda req: Reply(body={"result": 1, "metrics": "nope", "stdout": 5, "started": "yes"})
            r = zygo.connect(api.url).call("f")
            self.assertEqual((r.result, r.stdout, r.started, r.metrics.wall_ms), (1, "", True, None))


if __name__ == "__main__":
    unittest.main()
