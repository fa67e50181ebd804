"""The push pool's per-run certificate and when the link uses it (pool_tls.py), no sockets:
TLS handshakes here run through in-memory BIOs."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import ssl

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from deltabus.errors import InvalidArgument
from deltabus.push.pool_tls import CLOCK_SKEW, CertPin, PoolCertificate, PoolTls, link_uses_tls, make_certificate, pin_of
from deltabus.push.worker import control_ssl

NOW = dt.datetime(2026, 11, 23, 18, 0, 0, 123456, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(
    "master, host, tls",
    [
        ("local[2]", "127.0.0.1", False),
        ("local", "127.0.0.1", False),
        ("local[*]", "::1", False),
        ("spark://127.0.0.1:7077", "127.0.0.1", True),  # the one-machine standalone cluster: other processes
        ("local-cluster[2,1,1024]", "127.0.0.1", True),  # executors in processes of their own
        ("local[2]", "10.1.2.3", True),
        ("local[2]", "0.0.0.0", True),  # every interface
        ("local[2]", "localhost", True),  # a name: what it resolves to is not checked here
        ("yarn", "10.1.2.3", True),
        ("k8s://https://k:443", "driver-svc.ns.svc", True),
    ],
)
def test_plain_http_only_for_a_local_master_on_loopback(master: str, host: str, tls: bool) -> None:
    assert link_uses_tls(master, host) is tls


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, server_hostname: str | None) -> bytes:
    """Run a TLS handshake through memory BIOs; the server certificate the client saw (DER)."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False, server_hostname=server_hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, obj in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    assert all(done.values()), done
    der = client.getpeercert(binary_form=True)
    assert der is not None and client.version() == "TLSv1.3"
    return der


def pinned_client() -> ssl.SSLContext:
    """What aiohttp does for a Fingerprint: no chain check; the pin is compared afterwards."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def test_a_certificate_is_made_for_the_address_the_workers_dial() -> None:
    tls = make_certificate("10.1.2.3", NOW)
    cert = x509.load_pem_x509_certificate(tls.certificate.pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert cert.not_valid_before_utc == (NOW - CLOCK_SKEW).replace(microsecond=0)
    assert cert.not_valid_after_utc == (NOW + dt.timedelta(days=1)).replace(microsecond=0)
    assert cert.not_valid_after_utc == tls.certificate.not_after
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    der = cert.public_bytes(serialization.Encoding.DER)
    assert tls.certificate.pin == CertPin(hashlib.sha256(der).digest()) == pin_of(der)
    named = x509.load_pem_x509_certificate(make_certificate("driver-0.example.internal", NOW).certificate.pem)
    assert named.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    ) == ["driver-0.example.internal"]


def test_each_run_gets_its_own_key_and_the_public_half_holds_no_key() -> None:
    a, b = make_certificate("10.1.2.3", NOW), make_certificate("10.1.2.3", NOW)
    assert a.certificate.pin != b.certificate.pin
    assert x509.load_pem_x509_certificate(a.certificate.pem).public_key() != x509.load_pem_x509_certificate(
        b.certificate.pem
    ).public_key()
    assert set(PoolCertificate.__slots__) == {"host", "pem", "pin", "not_before", "not_after"}
    assert set(PoolTls._fields) == {"certificate", "context"}
    assert b"PRIVATE KEY" not in a.certificate.pem and "PRIVATE" not in repr(a)


def test_the_server_context_serves_that_certificate_and_a_pin_tells_it_from_another() -> None:
    # Standard tools check the validity window against the real clock: made now, not at NOW.
    now = dt.datetime.now(dt.timezone.utc)
    tls, other = make_certificate("10.1.2.3", now), make_certificate("10.1.2.3", now)
    seen = handshake(tls.context, pinned_client(), None)
    assert pin_of(seen) == tls.certificate.pin != other.certificate.pin
    # Standard tools can check it too: trusting only that certificate, by the SAN.
    trusting = ssl.create_default_context(cadata=tls.certificate.pem.decode())
    trusting.verify_flags |= ssl.VERIFY_X509_STRICT  # as Python 3.13's default context does
    assert pin_of(handshake(tls.context, trusting, "10.1.2.3")) == tls.certificate.pin
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls.context, trusting, "10.9.9.9")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(other.context, trusting, "10.1.2.3")


@pytest.mark.parametrize(
    "host, now, valid_for, field",
    [
        ("", NOW, dt.timedelta(days=1), "host"),
        (" 10.1.2.3", NOW, dt.timedelta(days=1), "host"),
        ("10.1.2.3", NOW.replace(tzinfo=None), dt.timedelta(days=1), "now"),
        ("10.1.2.3", NOW, dt.timedelta(0), "valid_for"),
    ],
)
def test_bad_input_names_the_field(host: str, now: dt.datetime, valid_for: dt.timedelta, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        make_certificate(host, now, valid_for)
    assert err.value.field == field


def test_a_worker_pins_an_https_pool_and_only_an_https_pool() -> None:
    pin = make_certificate("10.1.2.3", NOW).certificate.pin
    fingerprint = control_ssl("https://10.1.2.3:4000", pin)
    assert isinstance(fingerprint, aiohttp.Fingerprint) and fingerprint.fingerprint == pin.sha256
    assert control_ssl("http://127.0.0.1:4000", None) is None
    for url, given, field in [
        ("https://10.1.2.3:4000", None, "pin"),  # TLS without a pin would trust anyone
        ("http://10.1.2.3:4000", pin, "pin"),  # aiohttp ignores a pin on plain HTTP: refuse the pairing
        ("https://10.1.2.3:4000", CertPin(b"short"), "pin"),
        ("ftp://10.1.2.3:4000", None, "url"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            control_ssl(url, given)
        assert err.value.field == field, url


def test_the_pool_asks_for_sparks_rpc_encryption_only_when_both_settings_are_on():
    from deltabus.push.pool import encrypted_rpc

    assert encrypted_rpc("true", "true") and encrypted_rpc(" TRUE", "True ")
    assert not encrypted_rpc("true", "false") and not encrypted_rpc("false", "true") and not encrypted_rpc("", "")
