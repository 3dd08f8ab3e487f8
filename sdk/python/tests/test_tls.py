import os
import shutil
import ssl
import subprocess
import tempfile
import unittest

import zygo_sdk as zygo

from .fake_api import FakeAPI


def make_cert(d: str) -> tuple:
    """A self-signed certificate for localhost, made with the openssl command."""
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


class TLSTest(unittest.TestCase):
    def setUp(self) -> None:
        if shutil.which("openssl") is None:
            self.fail("the openssl command is needed to make a test certificate (Debian: openssl)")
        self.dir = tempfile.mkdtemp(prefix="zygo-sdk-tls-")
        self.addCleanup(shutil.rmtree, self.dir)
        self.cert, key = make_cert(self.dir)
        self.api = FakeAPI(tls=(self.cert, key))
        self.addCleanup(self.api.close)

    def test_https_with_a_trusted_certificate(self) -> None:
        ctx = ssl.create_default_context(cafile=self.cert)
        c = zygo.connect(self.api.url, token="t", ssl_context=ctx)
        self.assertEqual(c.call("f").result, {"ok": True})
        self.assertEqual(c.call("f").result, {"ok": True})
        self.assertEqual(self.api.connections, 1)
        self.assertEqual(self.api.requests[0].headers["host"], f"localhost:{self.api.url.rsplit(':', 1)[1]}")

    def test_https_from_the_asyncio_client(self) -> None:
        import asyncio

        async def main() -> list:
            async with zygo.aio.connect(self.api.url, ssl_context=ssl.create_default_context(cafile=self.cert)) as c:
                return [(await c.call("f")).result for _ in range(2)]

        self.assertEqual(asyncio.run(main()), [{"ok": True}] * 2)
        self.assertEqual(self.api.connections, 1)

    def test_an_untrusted_certificate_is_a_transport_error(self) -> None:
        with self.assertRaises(zygo.TransportError) as cm:
            zygo.connect(self.api.url).health()
        self.assertIn("certificate", str(cm.exception).lower())


if __name__ == "__main__":
    unittest.main()
