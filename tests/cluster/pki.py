"""The certificates and keys a control plane is set up with, made by the fixture.

One CA signs the API server's serving certificate (names 127.0.0.1, localhost and the
`kubernetes` Service's names) and the client certificates of the admin
(`system:masters`) and the controller manager; the service-account signing key pair
is separate, as in a kubeadm cluster. Private keys are written 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pilot.security.certs import write_private

VALID = datetime.timedelta(days=2)
SERVING_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Pki:
    """Paths of the files the components are started with."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    controller_cert: Path
    controller_key: Path
    sa_key: Path
    sa_pub: Path


def _name(common_name: str, organization: str = "") -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_pair(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private(key_path, _pem_key(key))
    return cert_path, key_path


def _builder(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID)
    )


def _ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("pilot-test-kubernetes-ca")
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(subject, ca_cert.subject, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _serving_sans(service_ip: str) -> list[x509.GeneralName]:
    addresses = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address(service_ip)]
    return [
        *(x509.IPAddress(a) for a in addresses),
        *(x509.DNSName(n) for n in SERVING_NAMES),
    ]


def write_pki(folder: Path, service_ip: str) -> Pki:
    """Every file under `folder`; `service_ip` is the `kubernetes` Service's ClusterIP."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca()
    ca_cert, ca_key = _write_pair(folder, "ca", ca[1], ca[0])
    server = _leaf(
        ca, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, _serving_sans(service_ip)
    )
    admin = _leaf(ca, _name("admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)
    controller = _leaf(ca, _name("system:kube-controller-manager"), ExtendedKeyUsageOID.CLIENT_AUTH)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key_path, sa_pub_path = folder / "sa.key", folder / "sa.pub"
    write_private(sa_key_path, _pem_key(sa_key))
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca_cert,
        ca_key,
        *_write_pair(folder, "apiserver", server[1], server[0]),
        *_write_pair(folder, "admin", admin[1], admin[0]),
        *_write_pair(folder, "controller-manager", controller[1], controller[0]),
        sa_key_path,
        sa_pub_path,
    )
