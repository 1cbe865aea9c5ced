"""The certificates of the secured local Kafka (`chatwoot-router kafka --secure`), made once per data dir.

A private CA signs one node certificate that every node of the data dir presents, as a server on its listeners
and as a client on the controller listener (mutual TLS there: `streams.kafka.secure`). Its subject is the nodes'
principal (`User:CN=chatwoot-router-kafka-node`), its SANs are 127.0.0.1 and localhost (or the host names of a
compose file's nodes: `chatwoot-router kafka-secrets`), so clients keep hostname verification on. Everything is
PEM, the form Kafka reads with `ssl.keystore.type=PEM` and `ssl.truststore.type=PEM` and Python's `ssl` reads as
it is. A restart reuses the files; a node certificate that expires within NODE_RENEW_BEFORE, or does not name the
hosts asked for, is made again from the same CA (clients keep trusting it).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NODE_COMMON_NAME = "chatwoot-router-kafka-node"
NODE_PRINCIPAL = f"User:CN={NODE_COMMON_NAME}"
"""What the nodes authenticate as on the controller listener: the node certificate's subject as Kafka's default
SSL principal builder names it (a super user)."""
CA_VALIDITY = dt.timedelta(days=3650)
NODE_VALIDITY = dt.timedelta(days=730)
NODE_RENEW_BEFORE = dt.timedelta(days=30)
LOCAL_HOSTS = ("localhost", "127.0.0.1")
"""The node certificate's SANs for the local nodes, which all listen on 127.0.0.1."""


@dataclass(frozen=True)
class TlsFiles:
    """Where one data dir's certificates are: `ca` (the CA certificate clients trust), `keystore` (the node's
    private key and certificate chain in one PEM file, for `ssl.keystore.location`)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca-key.pem"

    @property
    def keystore(self) -> Path:
        return self.directory / "node-keystore.pem"


def ensure_certificates(
    directory: Path, now: dt.datetime | None = None, *, hosts: Sequence[str] = LOCAL_HOSTS
) -> TlsFiles:
    """The CA and node certificate under `directory`, made when missing (the node's also when near expiry, or when
    its SANs are not `hosts`: host names or IP addresses, every node's, since the nodes share the certificate)."""
    sans = _sans(hosts)
    files = TlsFiles(_private_dir(directory))
    now = now or dt.datetime.now(dt.UTC)
    if not files.ca.exists() or not files.ca_key.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        _write(files.ca_key, _key_pem(key), private=True)
        _write(files.ca, _ca_certificate(key, now).public_bytes(serialization.Encoding.PEM), private=False)
        files.keystore.unlink(missing_ok=True)  # signed by a CA that is gone
    if (
        not files.keystore.exists()
        or _node_expires(files.keystore) - NODE_RENEW_BEFORE < now
        or _node_sans(files.keystore) != sans
    ):
        ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{files.ca_key} is not the EC key this tool makes: remove {directory} to start anew")
        ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        node = _node_certificate(key, ca, ca_key, now, sans)
        chain = node.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM)
        _write(files.keystore, _key_pem(key) + chain, private=True)
    return files


def _ca_certificate(key: ec.EllipticCurvePrivateKey, now: dt.datetime) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chatwoot-router local Kafka CA")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _sans(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """A SAN per host: an IP address as such (clients check an address against IP SANs only), else a DNS name."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _node_certificate(
    key: ec.EllipticCurvePrivateKey,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
    sans: list[x509.GeneralName],
) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE_COMMON_NAME)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + NODE_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(sans),
            critical=False,
        )
        # server on every listener, client on the controller listener (mutual TLS between the nodes)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _node_expires(keystore: Path) -> dt.datetime:
    try:
        return x509.load_pem_x509_certificate(keystore.read_bytes()).not_valid_after_utc
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.UTC)  # unreadable: made again


def _node_sans(keystore: Path) -> list[x509.GeneralName] | None:
    try:
        certificate = x509.load_pem_x509_certificate(keystore.read_bytes())
        return list(certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except (ValueError, x509.ExtensionNotFound):
        return None  # unreadable, or without SANs: made again


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 without a password: what Kafka's PEM keystore reads when `ssl.key.password` is unset."""
    pkcs8 = serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption())


def _private_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write a file whole (a crash leaves the old one or none), private ones readable by their owner only."""
    staging = path.with_name(path.name + ".tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    staging.replace(path)
