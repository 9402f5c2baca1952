"""pilot's certificate authority: the trust root and the signing of workload CSRs.

The signing key comes from `--ca-cert-dir` in Istio's plugged-in CA layout
(`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem`), or else from
a self-signed root made at first start and kept in `--ca-state-dir`, so that a
restart keeps the same trust root. Whichever it is, pilot starts only if the key
is the certificate's, every certificate up to the root is a CA certificate
valid now, and the chain leads to the root; and only if no one else can read
the key (`--ca-state-dir` and its key only by their owner, `ca-key.pem` also by
pilot's own group). Anything else is a `CaSetupError` naming the file and the
problem. What pilot writes there is 0700/0600 whatever the umask.

`sign` checks the CSR's signature and key, and puts the identity it is *told*
into the certificate, never what the CSR asks for. A certificate never outlives
the CA's own (its lifetime is cut short, logged once), and an expired CA signs
nothing (`CaExpired`). It is synchronous and CPU-bound: callers run it off the
event loop. Each leaf is assembled around the bytes all of this CA's leaves
share (`leaf_der.LeafTemplate`) and signed with cryptography.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from pilot.security import leaf_der
from pilot.security.certs import (
    KeyType,
    PrivateKey,
    cert_pem,
    generate_key,
    key_matches,
    key_pem,
    load_certificates,
    public_key_der,
    self_signed_root,
    utcnow,
    verify_chain,
    write_private,
)
from pilot.security.identity import Identity, check_trust_domain

log = logging.getLogger("pilot.security.ca")

DEFAULT_TTL = datetime.timedelta(hours=24)
MAX_TTL = datetime.timedelta(days=90)
MAX_CSR_BYTES = 16 * 1024
BACKDATE = datetime.timedelta(minutes=2)
PLUGGED_IN_FILES = ("ca-cert.pem", "ca-key.pem", "root-cert.pem", "cert-chain.pem")


class CsrError(ValueError):
    """The CSR or the requested lifetime cannot be signed; the message says why."""


class CaExpired(Exception):
    """The CA's certificate (or one above it) is not valid now: it signs nothing."""


class CaSetupError(RuntimeError):
    """The CA cannot start: a setting or its key material is unusable; the message says why."""


@dataclass(frozen=True, slots=True)
class Leaf:
    """A certificate this CA issued: its DER and PEM, and the fields its holder reads,
    known as it was made rather than parsed back."""

    der: bytes
    pem: str
    serial: int
    not_after: datetime.datetime  # whole seconds, as the certificate holds it


@dataclass(frozen=True, slots=True)
class CaSettings:
    """`--ca-cert-dir`, `--ca-state-dir`, `--trust-domain`, and lifetimes."""

    cert_dir: Path | None = None
    state_dir: Path | None = None
    trust_domain: str = "cluster.local"
    default_ttl: datetime.timedelta = DEFAULT_TTL
    max_ttl: datetime.timedelta = MAX_TTL

    def __post_init__(self) -> None:
        try:
            check_trust_domain(self.trust_domain)
        except ValueError as error:
            raise CaSetupError(f"--trust-domain: {error}") from error
        if not datetime.timedelta(0) < self.default_ttl <= self.max_ttl:
            raise CaSetupError(
                f"the default certificate lifetime ({self.default_ttl}) must be positive"
                f" and at most the maximum ({self.max_ttl})"
            )


def default_state_dir() -> Path:
    """Where a self-signed root is kept by default (XDG state directory).

    Raises CaSetupError where there is neither XDG_STATE_HOME nor a home directory
    (a container as a kubelet starts it: no HOME, a uid without a passwd entry).
    """
    base = os.environ.get("XDG_STATE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".local" / "state")
        except RuntimeError:
            raise CaSetupError(
                "no home directory (HOME unset, no passwd entry) for the self-signed root:"
                " set --ca-state-dir or XDG_STATE_HOME"
            ) from None
    return Path(base) / "pilot" / "ca"


@dataclass(frozen=True, slots=True)
class _Source:
    """How messages name the CA's key, certificates and the way to replace them."""

    key: str
    cert: str
    root: str
    chain: str
    replace: str

    @classmethod
    def plugged_in(cls, directory: Path) -> _Source:
        return cls(
            key=str(directory / "ca-key.pem"),
            cert=str(directory / "ca-cert.pem"),
            root=str(directory / "root-cert.pem"),
            chain=str(directory / "cert-chain.pem"),
            replace=f"put valid CA files in {directory}",
        )

    @classmethod
    def self_signed(cls, key: str, cert: str, replace: str) -> _Source:
        return cls(key=key, cert=cert, root=cert, chain=cert, replace=replace)


class CertificateAuthority:
    """Signs workload certificates with one signing key under one trust root."""

    def __init__(
        self,
        signing_key: PrivateKey,
        signing_cert: x509.Certificate,
        chain: list[x509.Certificate],
        root: x509.Certificate,
        settings: CaSettings,
    ) -> None:
        self._key = signing_key
        self._cert = signing_cert
        self._chain_pem = [cert_pem(c) for c in chain]
        self.root = root
        self.root_pem = cert_pem(root)
        self.settings = settings
        above = [signing_cert, *chain, root]
        # A leaf is valid only while every certificate above it is.
        self.not_before = max(c.not_valid_before_utc for c in above)
        self.not_after = min(c.not_valid_after_utc for c in above)
        authority = _extension(_authority_key_id(signing_cert, signing_key), critical=False)
        algorithm, self._signature = _signer(signing_key)
        self._template = leaf_der.LeafTemplate(signing_cert, algorithm, _LEAF_FIXED, authority)
        self._told_of_cap = False

    @classmethod
    def load(cls, settings: CaSettings) -> CertificateAuthority:
        """From the plugged-in layout if given, else the persisted (or a new) self-signed root."""
        if settings.cert_dir is not None:
            return cls._plugged_in(settings.cert_dir, settings)
        return cls._self_signed(settings.state_dir or default_state_dir(), settings)

    @classmethod
    def from_pem(
        cls, key: bytes, certificate: bytes, settings: CaSettings, where: str = "the CA secret"
    ) -> CertificateAuthority:
        """A self-signed root given as PEM (e.g. from the shared Secret, named by `where`)."""
        source = _Source.self_signed(
            key=f"{where} ca-key.pem",
            cert=f"{where} ca-cert.pem",
            replace=f"delete {where} and pilot makes a new root (workloads must then trust it)",
        )
        root = _parse_certificates(certificate, source.cert)[0]
        signing_key = _parse_key(key, source.key)
        _check_material(source, signing_key, root, [root], root)
        return cls(signing_key, root, [root], root, settings)

    @classmethod
    def _plugged_in(cls, directory: Path, settings: CaSettings) -> CertificateAuthority:
        if not directory.is_dir():
            raise CaSetupError(
                f"--ca-cert-dir {directory}: no such directory (it holds the plugged-in CA's"
                f" {', '.join(PLUGGED_IN_FILES)})"
            )
        missing = [name for name in PLUGGED_IN_FILES if not (directory / name).is_file()]
        if missing:
            raise CaSetupError(f"--ca-cert-dir {directory} lacks {', '.join(missing)}")
        source = _Source.plugged_in(directory)
        _check_private_file(directory / "ca-key.pem", group_may_read=True)
        signing_cert = _read_certificates(directory / "ca-cert.pem")[0]
        key = _parse_key((directory / "ca-key.pem").read_bytes(), source.key)
        root = _read_certificates(directory / "root-cert.pem")[0]
        chain = _read_certificates(directory / "cert-chain.pem")
        if chain and chain[0] != signing_cert:
            chain.insert(0, signing_cert)
        if not chain or chain[-1] != root:
            chain.append(root)
        _check_material(source, key, signing_cert, chain, root)
        log.info("CA: using the plugged-in signing certificate from %s", directory)
        return cls(key, signing_cert, chain, root, settings)

    @classmethod
    def _self_signed(cls, state_dir: Path, settings: CaSettings) -> CertificateAuthority:
        cert_path, key_path = state_dir / "root-cert.pem", state_dir / "root-key.pem"
        _private_directory(state_dir)
        if cert_path.is_file() and key_path.is_file():
            _check_private_file(key_path, group_may_read=False)
            source = _Source.self_signed(
                key=str(key_path),
                cert=str(cert_path),
                replace=f"move {state_dir} aside and pilot makes a new root"
                " (workloads must then trust it)",
            )
            root = _read_certificates(cert_path)[0]
            key = _parse_key(key_path.read_bytes(), source.key)
            _check_material(source, key, root, [root], root)
            log.info("CA: using the self-signed root kept in %s", state_dir)
        else:
            key, root = self_signed_root(settings.trust_domain)
            write_private(key_path, key_pem(key))
            write_private(cert_path, cert_pem(root).encode())
            log.info(
                "CA: made a new self-signed root for %s in %s", settings.trust_domain, state_dir
            )
        return cls(key, root, [root], root, settings)

    def lifetime(self, requested_seconds: int) -> datetime.timedelta:
        """The certificate lifetime for a request: default when 0, refused above the maximum."""
        maximum = int(self.settings.max_ttl.total_seconds())
        if requested_seconds < 0:
            raise CsrError(
                f"validity_duration {requested_seconds}s is negative"
                " (0 asks for the default lifetime)"
            )
        if requested_seconds == 0:
            return self.settings.default_ttl
        # Compared as integers first: a huge request never reaches timedelta (OverflowError).
        if requested_seconds > maximum:
            raise CsrError(f"validity_duration {requested_seconds}s exceeds the maximum {maximum}s")
        return datetime.timedelta(seconds=requested_seconds)

    @property
    def signing_cert(self) -> x509.Certificate:
        """The certificate that issues leaves (the root, or a plugged-in intermediate)."""
        return self._cert

    def sign(self, csr_pem: bytes, identity: Identity, ttl: datetime.timedelta) -> list[str]:
        """Sign a CSR for `identity`; returns the chain, leaf first and root last.

        Raises CsrError for a CSR it will not sign, CaExpired when the CA is not valid now.
        """
        csr = _checked_csr(csr_pem)
        leaf = self.issue_workload(public_key_der(csr.public_key()), identity, ttl)
        return self.chain_pem(leaf)

    def issue_workload(self, spki: bytes, identity: Identity, ttl: datetime.timedelta) -> Leaf:
        """The leaf naming `identity` for a key already checked (or made here), given as
        its DER SubjectPublicKeyInfo.

        `sign` calls it once a CSR has proved possession of the key; pilot's own
        minting calls it directly with a key it made in the same thread, which
        no one else has held, so there is nothing a CSR would prove.
        """
        return self._leaf(spki, leaf_der.uri_names(identity.uri), ttl)

    def chain_pem(self, leaf: Leaf) -> list[str]:
        """The PEM chain of a leaf this CA issued: leaf first, root last."""
        return [leaf.pem, *self._chain_pem]

    def issue_server(
        self, dns_names: list[str], ttl: datetime.timedelta
    ) -> tuple[bytes, list[str]]:
        """A key and chain for pilot's own TLS port, naming its DNS names (and loopback)."""
        key = generate_key(KeyType.EC)
        san: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        san.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        names = x509.SubjectAlternativeName(san).public_bytes()
        leaf = self._leaf(public_key_der(key.public_key()), names, ttl)
        return key_pem(key), self.chain_pem(leaf)

    def _validity(self, ttl: datetime.timedelta) -> tuple[datetime.datetime, datetime.datetime]:
        """(NotBefore, NotAfter) of a leaf issued now: within the CA's own validity."""
        now = utcnow()
        if now < self.not_before:
            raise CaExpired(
                f"the CA's certificate is not valid until {self.not_before.isoformat()}:"
                " it cannot sign yet"
            )
        if now >= self.not_after:
            raise CaExpired(
                f"the CA's certificate expired at {self.not_after.isoformat()}:"
                " it signs nothing until it is replaced"
            )
        remaining = self.not_after - now
        if ttl > remaining:
            if not self._told_of_cap:
                self._told_of_cap = True
                log.warning(
                    "CA: its certificate chain expires at %s; certificates asked to last"
                    " longer end then (logged once)",
                    self.not_after.isoformat(),
                )
            ttl = remaining
        return max(now - BACKDATE, self.not_before), now + ttl

    def _leaf(self, spki: bytes, san: bytes, ttl: datetime.timedelta) -> Leaf:
        """A leaf for the key `spki`, with `san` as its SubjectAltName value.

        Assembled from the CA's template and signed here, not through cryptography's
        builder, which cost as much again as the signature (`leaf_der`).
        """
        not_before, not_after = self._validity(ttl)
        serial = x509.random_serial_number()
        template = self._template
        tbs = template.tbs(serial, (not_before, not_after), spki, san)
        der = template.certificate(tbs, self._signature(tbs))
        return Leaf(der, leaf_der.pem("CERTIFICATE", der), serial, not_after.replace(microsecond=0))


def _signer(key: PrivateKey) -> tuple[bytes, Callable[[bytes], bytes]]:
    """The AlgorithmIdentifier of the signatures `key` makes (SHA-256, as cryptography
    encodes it), and how it signs a TBSCertificate: chosen once, with the key."""
    if isinstance(key, rsa.RSAPrivateKey):
        rsa_key = key
        return _RSA_SHA256, lambda tbs: rsa_key.sign(tbs, _PKCS1, _SHA256)
    ec_key = key
    return _ECDSA_SHA256, lambda tbs: ec_key.sign(tbs, _ECDSA)


def _authority_key_id(issuer: x509.Certificate, key: PrivateKey) -> x509.AuthorityKeyIdentifier:
    """What leaves name their issuer by: its own SubjectKeyIdentifier if it has one
    (whichever way it was computed), else the hash of its key."""
    try:
        ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


# ------------------------------------------------------------------ loading and checking


def _private_directory(directory: Path) -> None:
    """`--ca-state-dir`: made 0700 if missing, refused if others can get in."""
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
        directory.chmod(0o700)  # whatever the umask
        return
    if not directory.is_dir():
        raise CaSetupError(f"--ca-state-dir {directory} is not a directory")
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o077:
        raise CaSetupError(
            f"--ca-state-dir {directory} is open to {_who(mode)} (mode {mode:04o}):"
            f" it holds the CA's private key; chmod 700 {directory}"
        )


def _check_private_file(path: Path, *, group_may_read: bool) -> None:
    """A key file: nobody but its owner may read it.

    `group_may_read`: read by the file's group is allowed when that group is pilot's
    own (Kubernetes gives a Secret volume's files to the pod's fsGroup, mode 0440).
    """
    status = path.stat()
    mode = stat.S_IMODE(status.st_mode) & 0o777
    allowed = 0o740 if group_may_read and status.st_gid == os.getegid() else 0o700
    if mode & ~allowed:
        advice = f"chmod 600 {path}"
        if group_may_read:
            advice += " (or 640 if its group is pilot's own)"
        raise CaSetupError(
            f"{path} is a private key open to {_who(mode & ~allowed)} (mode {mode:04o}); {advice}"
        )


def _who(bits: int) -> str:
    parties = [name for mask, name in ((0o070, "its group"), (0o007, "others")) if bits & mask]
    return " and ".join(parties)


def _read_certificates(path: Path) -> list[x509.Certificate]:
    return _parse_certificates(path.read_bytes(), str(path))


def _parse_certificates(pem: bytes, where: str) -> list[x509.Certificate]:
    try:
        certificates = load_certificates(pem)
    except ValueError as error:
        raise CaSetupError(f"{where} holds no PEM certificate: {error}") from error
    return certificates


def _parse_key(pem: bytes, where: str) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as error:  # TypeError: encrypted, and no password
        raise CaSetupError(f"{where} holds no usable PEM private key: {error}") from error
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CaSetupError(f"{where}: unsupported key type {type(key).__name__}")
    return key


def _check_material(
    source: _Source,
    key: PrivateKey,
    signing_cert: x509.Certificate,
    chain: list[x509.Certificate],
    root: x509.Certificate,
) -> None:
    """The key is the certificate's; every certificate is a CA, valid now; the chain leads
    to the root. `chain` runs from `signing_cert` to `root`."""
    if not key_matches(key, signing_cert):
        raise CaSetupError(f"{source.key} is not the key of {source.cert}")
    now = utcnow()
    for position, certificate in enumerate(chain):
        if position == 0:
            name = source.cert
        elif position == len(chain) - 1:
            name = source.root
        else:
            name = f"{source.chain} certificate {position + 1}"
        _check_ca_certificate(certificate, name, below=position)
        if now < certificate.not_valid_before_utc:
            raise CaSetupError(
                f"{name} is not valid until {certificate.not_valid_before_utc.isoformat()}"
                " (is the clock right?)"
            )
        if now > certificate.not_valid_after_utc:
            raise CaSetupError(
                f"{name} expired at {certificate.not_valid_after_utc.isoformat()}:"
                f" pilot does not sign with an expired CA; {source.replace}"
            )
    try:
        verify_chain(chain, [root])
    except ValueError as error:
        raise CaSetupError(f"{source.cert} does not chain to {source.root}: {error}") from error


def _check_ca_certificate(certificate: x509.Certificate, name: str, below: int) -> None:
    """A CA certificate that may sign certificates, with `below` CA certificates under it."""
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CaSetupError(f"{name} is not a CA certificate (BasicConstraints CA:TRUE)")
    try:
        usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None  # no KeyUsage: any use (RFC 5280), as TLS libraries read it
    if usage is not None and not usage.key_cert_sign:
        raise CaSetupError(f"{name} may not sign certificates (its KeyUsage lacks keyCertSign)")
    if constraints.path_length is not None and constraints.path_length < below:
        raise CaSetupError(
            f"{name} allows {constraints.path_length} CA certificates below it"
            f" (BasicConstraints pathlen) but the chain has {below}"
        )


def _checked_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    if len(csr_pem) > MAX_CSR_BYTES:
        raise CsrError(f"CSR is {len(csr_pem)} bytes, more than {MAX_CSR_BYTES}")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as error:
        raise CsrError(f"CSR is not a PEM certificate request: {error}") from error
    if not csr.is_signature_valid:
        raise CsrError("CSR signature does not verify")
    key = csr.public_key()
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        raise CsrError(f"RSA key of {key.key_size} bits is too small (2048 at least)")
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise CsrError(f"unsupported key type {type(key).__name__}")
    return csr


def _leaf_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=True,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


# The same in every leaf (and immutable): made once, not per certificate.
_LEAF_CONSTRAINTS = x509.BasicConstraints(ca=False, path_length=None)
_LEAF_KEY_USAGE = _leaf_key_usage()
_LEAF_EXTENDED_KEY_USAGE = x509.ExtendedKeyUsage(
    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
)


def _extension(value: x509.ExtensionType, *, critical: bool) -> x509.Extension[x509.ExtensionType]:
    return x509.Extension(value.oid, critical, value)


# The signatures pilot's CA makes, and their AlgorithmIdentifiers as cryptography encodes
# them (RSA's with NULL parameters).
_SHA256 = hashes.SHA256()
_PKCS1 = padding.PKCS1v15()
_ECDSA = ec.ECDSA(_SHA256)
_ECDSA_SHA256 = leaf_der.tlv(leaf_der.SEQUENCE, leaf_der.object_identifier("1.2.840.10045.4.3.2"))
_RSA_SHA256 = leaf_der.tlv(
    leaf_der.SEQUENCE, leaf_der.object_identifier("1.2.840.113549.1.1.11") + b"\x05\x00"
)

_LEAF_FIXED = (
    _extension(_LEAF_CONSTRAINTS, critical=True),
    _extension(_LEAF_KEY_USAGE, critical=True),
    _extension(_LEAF_EXTENDED_KEY_USAGE, critical=False),
)
