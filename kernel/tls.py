"""TLS material for the bot <-> runner channel: loading it, and making a throwaway CA for local use."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kernel.clock import WALL


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate and key; with `client_ca`, clients must present a certificate signed by it (mTLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None


def pem_problem(path: Path) -> str | None:
    """Why a TLS file cannot be used (unreadable, not PEM), None when it can: said in one line before gRPC
    would fail deep inside, or serve nothing."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    return None if b"-----BEGIN " in text else f"{path} is not a PEM file"


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """With a client CA, clients must present a certificate it signed (mTLS)."""
    key, cert = tls.key.read_bytes(), tls.cert.read_bytes()
    if tls.client_ca is None:
        return grpc.ssl_server_credentials([(key, cert)])
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=tls.client_ca.read_bytes(), require_client_auth=True
    )


@dataclass(frozen=True)
class DevCerts:
    ca: Path
    runner_cert: Path
    runner_key: Path
    bot_cert: Path
    bot_key: Path


def write_dev_certs(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")) -> DevCerts:
    """A CA, a runner server certificate for `hosts`, and a bot client certificate, for local use only."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "k3repro dev CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = DevCerts(
        ca=directory / "ca.pem",
        runner_cert=directory / "runner.pem",
        runner_key=directory / "runner-key.pem",
        bot_cert=directory / "bot.pem",
        bot_key=directory / "bot-key.pem",
    )
    _write(paths.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    _leaf(
        paths.runner_cert,
        paths.runner_key,
        "k3repro-runner",
        ca_cert,
        ca_key,
        ExtendedKeyUsageOID.SERVER_AUTH,
        sans,
    )
    _leaf(paths.bot_cert, paths.bot_key, "k3repro-bot", ca_cert, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return paths


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = WALL.utc()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
    )


def _leaf(
    cert_path: Path,
    key_path: Path,
    common_name: str,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), ca_cert.subject, key.public_key()
    ).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    _write(
        key_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        private=True,
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)
