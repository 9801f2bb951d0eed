"""Certificates made at test time (pyca/cryptography): a CA, server and client certs, a rogue CA.

In full: a CA, a server certificate for 127.0.0.1 / localhost, a client
certificate, and a second CA that signed nothing the server trusts. P-256 keys,
valid for one day.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    """PEM files under one directory."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    def read(self, name: str) -> bytes:
        path: Path = getattr(self, name)
        return path.read_bytes()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    usage: x509.ObjectIdentifier | None = None,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_pki(directory: Path) -> Pki:
    """Write a CA, server and client certificates (and a stranger's) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, stranger_ca_key = _key(), _key()
    ca = _cert("lethe test CA", ca_key, "lethe test CA", ca_key, ca=True)
    server_key, client_key, stranger_key = _key(), _key(), _key()
    server = _cert(
        "localhost",
        server_key,
        "lethe test CA",
        ca_key,
        ca=False,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        server=True,
    )
    client = _cert(
        "lethe test client",
        client_key,
        "lethe test CA",
        ca_key,
        ca=False,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    stranger = _cert(
        "stranger",
        stranger_key,
        "another CA",
        stranger_ca_key,
        ca=False,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    return Pki(
        ca=_write(directory / "ca.pem", _pem(ca)),
        server_cert=_write(directory / "server.pem", _pem(server)),
        server_key=_write(directory / "server.key", _pem_key(server_key)),
        client_cert=_write(directory / "client.pem", _pem(client)),
        client_key=_write(directory / "client.key", _pem_key(client_key)),
        stranger_cert=_write(directory / "stranger.pem", _pem(stranger)),
        stranger_key=_write(directory / "stranger.key", _pem_key(stranger_key)),
    )
