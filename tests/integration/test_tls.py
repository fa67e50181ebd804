"""Push endpoints' TLS certificates are verified: an untrusted certificate is a failed push."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import threading

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from deltabus.push.sender import send_all


def self_signed(tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def https_endpoint(tmp_path):
    cert, key = self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    async def start():
        app = web.Application()
        async def ok(_):
            return web.Response(status=204)

        app.router.add_post("/push", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        box["port"], box["runner"] = site._server.sockets[0].getsockname()[1], runner

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(10)
    yield f"https://localhost:{box['port']}/push", cert
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)


def row(url):
    return dict(sub_uid="s1", subscription="projects/p/subscriptions/s", message_id="1", delivery_attempt=1, endpoint=url,
                token=None, no_wrapper=False, write_metadata=False, timeout_seconds=10.0, data=b"x", attributes=[],
                ordering_key="", publish_time=dt.datetime.now(dt.timezone.utc))


def test_untrusted_certificate_is_a_failed_push(https_endpoint):
    url, _ = https_endpoint
    [(status, outcome, _, error)] = asyncio.run(send_all([row(url)]))
    assert (status, outcome, error) == (0, "error", "tls")


def test_trusted_certificate_is_delivered(https_endpoint):
    """The same push succeeds once the certificate is in the trust store (SSL_CERT_FILE is read
    when aiohttp builds its default context at import, hence a fresh interpreter)."""
    import os
    import subprocess
    import sys

    url, cert = https_endpoint
    script = (
        "import asyncio, datetime as dt, sys; from deltabus.push.sender import send_all\n"
        f"row = dict(sub_uid='s1', subscription='projects/p/subscriptions/s', message_id='1', delivery_attempt=1, endpoint={url!r},"
        " token=None, no_wrapper=False, write_metadata=False, timeout_seconds=10.0, data=b'x', attributes=[], ordering_key='',"
        " publish_time=dt.datetime.now(dt.timezone.utc))\n"
        "print(asyncio.run(send_all([row]))[0][:2])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "SSL_CERT_FILE": str(cert)}, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "(204, 'ack')", out.stderr
