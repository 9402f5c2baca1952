"""JWTs made by hand for the tests: an RSA signing key, its JWKS, and tokens (RS256 as
base64url header.payload.signature), honest and hostile (another key, `alg: none`, an
HS256 token whose HMAC key is the RSA public key, a `kid` naming another key).

Nothing here is a library's JWT code: the point is that every byte Envoy checks is
the test's own doing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

ISSUER = "https://issuer.example.com/realms/test"  # a URL with slashes of its own
AUDIENCE = "reviews"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _json(value: Any) -> str:
    return b64url(json.dumps(value, separators=(",", ":")).encode())


@dataclass
class SigningKey:
    """An RSA key pair that signs tokens; `jwks` publishes its public half."""

    kid: str = "test-key"
    private: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def jwk(self) -> dict[str, str]:
        numbers = self.private.public_key().public_numbers()
        return {
            "kty": "RSA",
            "alg": "RS256",
            "use": "sig",
            "kid": self.kid,
            "n": b64url(numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")),
            "e": b64url(numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")),
        }

    def jwks(self) -> str:
        return json.dumps({"keys": [self.jwk()]})

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
        head = {"alg": "RS256", "typ": "JWT", "kid": self.kid, **(header or {})}
        signing_input = f"{_json(head)}.{_json(claims)}"
        signature = self.private.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{b64url(signature)}"


def claims(
    sub: str = "alice",
    issuer: str = ISSUER,
    audience: str | list[str] = AUDIENCE,
    lifetime: int = 3600,
    **extra: Any,
) -> dict[str, Any]:
    """A token's claims, valid from now for `lifetime` seconds (negative: expired)."""
    now = int(time.time())
    base = {"iss": issuer, "sub": sub, "aud": audience, "iat": now - 10, "exp": now + lifetime}
    return base | extra


def unsigned(payload: dict[str, Any]) -> str:
    """`alg: none`: no signature at all."""
    return f"{_json({'alg': 'none', 'typ': 'JWT'})}.{_json(payload)}."


def hs256_with_public_key(key: SigningKey, payload: dict[str, Any]) -> str:
    """The algorithm-confusion forgery: HS256 with the RSA public key (PEM) as the secret."""
    signing_input = f"{_json({'alg': 'HS256', 'typ': 'JWT', 'kid': key.kid})}.{_json(payload)}"
    mac = hmac.new(key.public_pem(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(mac)}"
