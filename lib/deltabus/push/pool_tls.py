"""TLS for the push pool's link: a certificate made for each run, pinned by the workers.

The driver's pool server hands the executors assignments (payloads, OIDC tokens) and takes
their outcomes back. Off loopback that link is TLS; plain HTTP stays only for a local
master whose server listens on a loopback address (``link_uses_tls``), where nothing leaves
the machine's loopback interface and executors are threads of the driver's JVM.

The certificate:

* is made in the driver for one run (``make_certificate``): a fresh P-256 key (generated in
  about a millisecond, against tens for RSA-2048), a self-signed certificate whose
  subjectAltName is the address the workers dial (an IP address or a DNS name), valid from
  a little before ``now`` for ``valid_for``;
* keeps its key in the driver process only: the key goes straight into the server's
  ``ssl.SSLContext`` and no Python object keeps it. ``SSLContext.load_cert_chain`` reads
  files only, so the key passes through an anonymous in-memory file (``memfd_create``,
  Linux) or, elsewhere, a private temporary file removed at once; either way it is written
  encrypted under a random password that exists only in this process's memory;
* travels to the workers as a ``CertPin`` (its SHA-256), inside the pool's partition
  function like the run key. The certificate is public; the pin is what matters.

Why a fingerprint pin and not a trust store with that one certificate (``cadata=``) plus a
host name check: the TLS handshake proves that the server holds the private key of the
certificate it presents, and the pin accepts exactly one certificate, whose key never left
the driver. A name or date check adds nothing to that, only ways to fail: an executor
whose clock runs behind the driver's (``notBefore`` in its future), a run longer than the
validity (a push job runs for weeks), a driver host the executors reach under another name
than ``spark.driver.host``. aiohttp compares the pin right after the handshake, before it
writes the request, so a worker talking to anyone else sends neither the run key nor an
outcome. The validity window is set (X.509 needs one) and kept short, but workers do not
read it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import os
import secrets
import ssl
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, NamedTuple

from ..errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

# cryptography is imported where a certificate is made, not at module import: the push
# workers import this module for CertPin alone, and x509 costs them ~0.3 s of CPU (measured
# with -X importtime on this busy machine; a tenth of the worker's own import).

VALID_FOR = dt.timedelta(days=1)
CLOCK_SKEW = dt.timedelta(minutes=5)  # notBefore this much before `now`, for tools that do check dates
SUBJECT = "deltabus push pool"


def is_local_master(master: str) -> bool:
    """``local`` or ``local[...]``: executors are threads of the driver's JVM. ``local-cluster[...]``
    is not: its executors are processes of their own, like a standalone cluster's."""
    return master == "local" or master.startswith("local[")


def is_loopback(host: str) -> bool:
    """An IP literal on the loopback interface (127.0.0.0/8, ::1). A name such as ``localhost``
    is not: what it resolves to is the resolver's business, not this check's."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def link_uses_tls(master: str, host: str) -> bool:
    """Whether the pool server listening on `host` for a job on `master` speaks TLS.

    Plain HTTP only for a local master on a loopback address; everything else is TLS,
    including a ``spark://127.0.0.1:…`` master: its executors are other processes (other
    JVMs' Python workers), and the issue keeps plain HTTP for the local master alone."""
    return not (is_local_master(master) and is_loopback(host))


class CertPin(NamedTuple):
    """What a worker pins: the SHA-256 of the pool certificate's DER encoding (32 bytes)."""

    sha256: bytes

    def hex(self) -> str:
        """Colon-separated upper-case hex, as ``openssl x509 -fingerprint -sha256`` prints it."""
        return self.sha256.hex(":").upper()


@dataclass(frozen=True, slots=True)
class PoolCertificate:
    """The public half of a run's certificate: safe to log, ship and compare."""

    host: str
    pem: bytes
    pin: CertPin
    not_before: dt.datetime
    not_after: dt.datetime

    def __post_init__(self) -> None:
        if len(self.pin.sha256) != 32:
            raise InvalidArgument("pin.sha256", f"must be 32 bytes (a SHA-256), got {len(self.pin.sha256)}")
        if self.not_after <= self.not_before:
            raise InvalidArgument("not_after", "must be after not_before")


class PoolTls(NamedTuple):
    """The driver's side: the certificate and the server context that holds its key."""

    certificate: PoolCertificate
    context: ssl.SSLContext


def pin_of(der: bytes) -> CertPin:
    """The pin of a certificate given in DER (what ``getpeercert(binary_form=True)`` returns)."""
    return CertPin(hashlib.sha256(der).digest())


def _subject_alt_name(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return x509.DNSName(host.encode("idna").decode("ascii"))
    except UnicodeError as exc:
        raise InvalidArgument("host", f"must be an IP address or a DNS name, got {host!r}") from exc


def make_certificate(host: str, now: dt.datetime, valid_for: dt.timedelta = VALID_FOR) -> PoolTls:
    """A new key and self-signed certificate for a pool server the workers reach at `host`.

    `now` must be timezone-aware (the caller's clock). Raises InvalidArgument naming the
    field for an empty or malformed host, a naive `now` or a non-positive `valid_for`."""
    if not host or host != host.strip():
        raise InvalidArgument("host", f"must be the address the workers dial, got {host!r}")
    if now.tzinfo is None:
        raise InvalidArgument("now", "must be timezone-aware")
    if valid_for <= dt.timedelta(0):
        raise InvalidArgument("valid_for", f"must be positive, got {valid_for}")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    san = _subject_alt_name(host)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SUBJECT)])
    not_before = (now - CLOCK_SKEW).replace(microsecond=0)
    not_after = (now + valid_for).replace(microsecond=0)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    certificate = PoolCertificate(
        host=host, pem=pem, pin=pin_of(cert.public_bytes(serialization.Encoding.DER)),
        not_before=not_before, not_after=not_after,
    )
    return PoolTls(certificate, _server_context(pem, key))


def _server_context(cert_pem: bytes, key: ec.EllipticCurvePrivateKey) -> ssl.SSLContext:
    """A TLS 1.3 server context holding `key`. Both ends are this library on one Python
    install, so nothing older needs to be spoken."""
    from cryptography.hazmat.primitives import serialization

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    password = secrets.token_bytes(32)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password),
    )
    with _transient_file(cert_pem + key_pem) as path:
        context.load_cert_chain(path, password=password)
    return context


@contextlib.contextmanager
def _transient_file(data: bytes) -> Iterator[str]:
    """A path to `data` for as long as the block runs: an anonymous memory file where the OS
    has them (nothing reaches a disk), else a 0600 file in a private directory, removed after."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("deltabus-pool-tls", os.MFD_CLOEXEC)
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="deltabus-pool-tls-") as directory:  # pragma: no cover - not Linux
        path = os.path.join(directory, "chain.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
