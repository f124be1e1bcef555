"""Test certificates issued at test time (never committed): a CA, a server, two clients."""

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
class Pair:
    """A PEM certificate and its PEM key, as files and bytes."""

    cert_file: Path
    key_file: Path

    @property
    def cert(self) -> bytes:
        return self.cert_file.read_bytes()

    @property
    def key(self) -> bytes:
        return self.key_file.read_bytes()


@dataclass(frozen=True)
class Certificates:
    """``ca`` signed ``server`` (for 127.0.0.1 and localhost) and ``client``; ``rogue`` is another CA's client."""

    ca: Pair
    server: Pair
    client: Pair
    rogue: Pair


def issue_certificates(directory: Path) -> Certificates:
    """Write every certificate and key into ``directory``."""
    ca_key, ca_cert = _authority("openengine test CA")
    rogue_key, rogue_cert = _authority("rogue CA")
    server = _leaf("127.0.0.1", ca_key, ca_cert, server=True)
    client = _leaf("client", ca_key, ca_cert, server=False)
    rogue = _leaf("rogue client", rogue_key, rogue_cert, server=False)
    return Certificates(
        ca=_write(directory, "ca", ca_key, ca_cert),
        server=_write(directory, "server", *server),
        client=_write(directory, "client", *client),
        rogue=_write(directory, "rogue", *rogue),
    )


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _authority(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(name, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    name: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, *, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(name, ca_cert.subject, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
        critical=False,
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(name))]),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(directory: Path, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Pair:
    key_file = directory / f"{stem}.key"
    cert_file = directory / f"{stem}.pem"
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Pair(cert_file, key_file)


__all__ = ["Certificates", "Pair", "issue_certificates"]
