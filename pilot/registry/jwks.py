"""A RequestAuthentication's keys: an inline JWKS checked as Envoy would take it, and a
`jwksUri` checked for where it lets Envoy connect.

Inline `jwks` is JSON Web Key Set text (RFC 7517): an object whose `keys` is a
non-empty list of keys Envoy's jwt_verify_lib can use: `kty` RSA (`n`, `e`), EC
(`crv` P-256, P-384 or P-521; `x`, `y` a point on the curve), oct (`k`), OKP
(`crv` Ed25519, `x`), with an `alg`, where given, of the key's family. Each key
is built with `cryptography`, so a key Envoy would refuse (not on its curve,
not base64url) is refused here, with the object, never sent.

`jwksUri` is where the sidecar's Envoy itself fetches the keys: `http` or `https`
only (nothing that reads a local file or runs anything), no userinfo (nothing
to log or send), a host that is a DNS name or an IP literal, and a port that is
none of the sidecar's own nor istiod's (`FORBIDDEN_PORTS`): a fetch there would
talk to Envoy's admin API, the agent, or pilot itself.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from cryptography.hazmat.primitives.asymmetric import ec, rsa

MAX_JWKS_CHARS = 65_536  # an inline JWKS (Istio's own JWKS fetches are bounded likewise)
MAX_KEYS = 64
MAX_URI_CHARS = 2048
# The sidecar's own ports (admin, outbound, inbound, agent, health, metrics) and istiod's
# (xDS plaintext and TLS, monitoring, webhook): a jwksUri there is refused.
FORBIDDEN_PORTS = frozenset({15000, 15001, 15004, 15006, 15020, 15021, 15090})
FORBIDDEN_PORTS |= frozenset({15010, 15012, 15014, 15017})
_CURVES: dict[str, ec.EllipticCurve] = {
    "P-256": ec.SECP256R1(),
    "P-384": ec.SECP384R1(),
    "P-521": ec.SECP521R1(),
}
_ALG_PREFIX = {"RSA": ("RS", "PS"), "EC": ("ES",), "oct": ("HS",), "OKP": ("EdDSA",)}
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


class JwksError(ValueError):
    """A JWKS or a jwksUri Envoy must not get; the message says why (one line)."""


def _b64(key: Mapping[str, Any], name: str, where: str) -> bytes:
    value = key.get(name)
    if not isinstance(value, str) or not value or not _BASE64URL.fullmatch(value):
        raise JwksError(f"{where}.{name} must be base64url")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise JwksError(f"{where}.{name} must be base64url") from None


def _rsa(key: Mapping[str, Any], where: str) -> None:
    n = int.from_bytes(_b64(key, "n", where), "big")
    e = int.from_bytes(_b64(key, "e", where), "big")
    if n.bit_length() < 512 or n.bit_length() > 16384:
        raise JwksError(f"{where}.n is a {n.bit_length()}-bit modulus (512..16384)")
    try:
        rsa.RSAPublicNumbers(e, n).public_key()
    except ValueError as error:
        raise JwksError(f"{where} is not an RSA public key ({error})") from None


def _ec(key: Mapping[str, Any], where: str) -> None:
    crv = key.get("crv")
    curve = _CURVES.get(crv) if isinstance(crv, str) else None
    if curve is None:
        raise JwksError(f"{where}.crv must be one of {', '.join(_CURVES)}")
    x = int.from_bytes(_b64(key, "x", where), "big")
    y = int.from_bytes(_b64(key, "y", where), "big")
    try:
        ec.EllipticCurvePublicNumbers(x, y, curve).public_key()
    except ValueError:
        raise JwksError(f"{where} is not a point on {crv}") from None


def _okp(key: Mapping[str, Any], where: str) -> None:
    if key.get("crv") != "Ed25519":
        raise JwksError(f"{where}.crv must be Ed25519")
    if len(_b64(key, "x", where)) != 32:
        raise JwksError(f"{where}.x must be 32 bytes")


def _oct(key: Mapping[str, Any], where: str) -> None:
    _b64(key, "k", where)


_BY_KTY = {"RSA": _rsa, "EC": _ec, "oct": _oct, "OKP": _okp}


def _key(key: Any, where: str) -> None:
    if not isinstance(key, Mapping):
        raise JwksError(f"{where} must be an object")
    kty = key.get("kty")
    check = _BY_KTY.get(kty) if isinstance(kty, str) else None
    if check is None or not isinstance(kty, str):
        raise JwksError(f"{where}.kty must be one of {', '.join(_BY_KTY)}")
    alg = key.get("alg")
    if alg is not None and (not isinstance(alg, str) or not alg.startswith(_ALG_PREFIX[kty])):
        raise JwksError(f"{where}.alg is not an algorithm of a {kty} key")
    kid = key.get("kid")
    if kid is not None and (not isinstance(kid, str) or len(kid) > 256):
        raise JwksError(f"{where}.kid must be a string of at most 256 characters")
    check(key, where)


def check_jwks(text: str) -> None:
    """Raise JwksError unless `text` is a JWKS Envoy takes, every key of it usable."""
    if len(text) > MAX_JWKS_CHARS:
        raise JwksError(f"is {len(text)} characters long (at most {MAX_JWKS_CHARS})")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        raise JwksError("is not JSON") from None
    keys = document.get("keys") if isinstance(document, Mapping) else None
    if not isinstance(keys, list) or not keys:
        raise JwksError("must be an object with a non-empty list of keys")
    if len(keys) > MAX_KEYS:
        raise JwksError(f"has {len(keys)} keys (at most {MAX_KEYS})")
    for i, key in enumerate(keys):
        _key(key, f"keys[{i}]")


@dataclass(frozen=True, slots=True, order=True)
class JwksUri:
    """A checked `jwksUri`: where the sidecar's Envoy fetches keys from."""

    uri: str
    host: str  # a DNS name or an IP literal (no brackets)
    port: int
    tls: bool

    @property
    def cluster(self) -> str:
        """The name of the cluster pilot adds for it (one per scheme, host and port)."""
        return f"jwks|{'https' if self.tls else 'http'}|{self.host}|{self.port}"

    @property
    def is_ip(self) -> bool:
        return _is_ip(self.host)


def _port(parts: SplitResult) -> int:
    try:
        port = parts.port
    except ValueError:
        raise JwksError("has a port that is not 1..65535") from None
    if port == 0:
        raise JwksError("has a port that is not 1..65535")
    if port is None:
        return 443 if parts.scheme == "https" else 80
    return port


def parse_jwks_uri(text: str) -> JwksUri:
    """The URI Envoy may fetch keys from; raises JwksError for any it must not."""
    if len(text) > MAX_URI_CHARS or not text.isprintable() or not text.isascii():
        raise JwksError("must be printable ASCII of at most 2048 characters")
    if any(c.isspace() for c in text):
        raise JwksError("has white space")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise JwksError("must be an http or https URL")
    if "@" in parts.netloc:
        raise JwksError("must carry no userinfo")
    host = parts.hostname or ""
    port = _port(parts)
    if not host:
        raise JwksError("names no host")
    if not (_is_ip(host) or _DNS_NAME.fullmatch(host)):
        raise JwksError("has a host that is neither a DNS name nor an IP address")
    if port in FORBIDDEN_PORTS:
        raise JwksError(f"names port {port}, one of the sidecar's or istiod's own")
    return JwksUri(text, host.rstrip("."), port, parts.scheme == "https")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
