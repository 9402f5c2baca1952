"""The test client itself: secrets are described without their private keys.

No pilot here: responses are built by hand, with a real key and certificate, and
every way the client shows a response (describe, Held, SecretSummary, Arrived,
failure messages and the frame that raised them) is checked for the key's text.
"""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import any_pb2

from tests.support.xds_client import (
    CLUSTER,
    SECRET,
    Arrived,
    DeltaResponse,
    DiscoveryResponse,
    Secret,
    _check_delta,
    _check_sotw,
    delta_resources,
    describe,
    fingerprint,
    node,
    secret_summaries,
)

URI = "spiffe://cluster.local/ns/shop/sa/cart"


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(key: ec.EllipticCurvePrivateKey, uri: str | None = None) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "test")]))
        .public_key(key.public_key())
        .serial_number(4242)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=1))
    )
    if uri is not None:
        names = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)])
        builder = builder.add_extension(names, critical=True)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _workload(key: ec.EllipticCurvePrivateKey, chain: bytes) -> Secret:
    secret = Secret(name="default")
    secret.tls_certificate.certificate_chain.inline_bytes = chain
    secret.tls_certificate.private_key.inline_bytes = _key_pem(key)
    return secret


def _packed(secret: Secret) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(secret)
    return packed


def _key_body(key: ec.EllipticCurvePrivateKey) -> list[str]:
    """Lines of the key's PEM body: none may appear anywhere the client shows a secret."""
    return [line for line in _key_pem(key).decode().splitlines() if "-----" not in line]


def _shows_key(text: str, key: ec.EllipticCurvePrivateKey) -> bool:
    return any(line in text or line[:16] in text for line in _key_body(key))


def test_node_carries_string_metadata_and_keeps_its_default() -> None:
    plain = node()
    assert not plain.metadata.fields
    given = node("sidecar~1~a.b~b.svc", {"NAMESPACE": "b", "SERVICE_ACCOUNT": "a"})
    assert given.id == "sidecar~1~a.b~b.svc"
    assert {k: v.string_value for k, v in given.metadata.fields.items()} == {
        "NAMESPACE": "b",
        "SERVICE_ACCOUNT": "a",
    }


def test_a_secret_is_summarized_without_its_key() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    other = ec.generate_private_key(ec.SECP256R1())
    chain = _certificate(key, URI)
    root = Secret(name="ROOTCA")
    root.validation_context.trusted_ca.inline_bytes = chain
    response = DiscoveryResponse(
        type_url=SECRET,
        version_info="1",
        nonce="1",
        resources=[_packed(_workload(key, chain)), _packed(root)],
    )
    workload, trusted = secret_summaries(response)
    assert (workload.name, workload.kind, workload.uris, workload.serial) == (
        "default",
        "tls_certificate",
        (URI,),
        4242,
    )
    assert workload.has_key and workload.key_matches_leaf
    assert trusted.trusted_ca_sha256 == (fingerprint(chain),)
    mismatched = secret_summaries(
        DiscoveryResponse(type_url=SECRET, nonce="2", resources=[_packed(_workload(other, chain))])
    )
    assert mismatched[0].has_key and not mismatched[0].key_matches_leaf
    for shown in (repr(workload), repr(trusted), describe(response)):
        assert not _shows_key(shown, key), "a secret's description shows its private key"


def test_a_delta_secret_is_held_without_showing_its_key() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    response = DeltaResponse(type_url=SECRET, nonce="1")
    resource = response.resources.add(name="default", version="v1")
    resource.resource.CopyFrom(_packed(_workload(key, _certificate(key, URI))))
    held = delta_resources(response)
    assert repr(held) == "{'default': Held(version='v1', message=<Secret 'default'>)}"
    assert not _shows_key(describe(response), key)


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
def test_a_bad_response_fails_without_showing_the_key(delta: bool) -> None:
    """The failure message, and the arguments of the frame that raised it (which pytest
    prints), name the problem, never the secret."""
    key = ec.generate_private_key(ec.SECP256R1())
    secret = _workload(key, _certificate(key, URI))
    if delta:
        response: DiscoveryResponse | DeltaResponse = DeltaResponse(type_url=SECRET, nonce="1")
        for _ in range(2):
            response.resources.add(name="default", resource=_packed(secret))
    else:
        response = DiscoveryResponse(type_url=SECRET, nonce="1", resources=[_packed(secret)] * 2)
    with pytest.raises(AssertionError) as failure:
        _check_delta(response) if isinstance(response, DeltaResponse) else _check_sotw(response)
    assert str(failure.value) == "same name twice in one response: ['default']"
    last = failure.traceback[-1]
    arguments = repr(last.frame.getargs(var=True))
    assert not _shows_key(arguments, key), f"the failing frame {last.name} holds the secret"


def test_what_arrived_is_named_without_showing_the_key() -> None:
    """`ack_until` hands back an `Arrived`: it names what came and never shows a secret."""
    key = ec.generate_private_key(ec.SECP256R1())
    workload = _packed(_workload(key, _certificate(key, URI)))
    arrived = Arrived(SECRET)
    for response in (
        DiscoveryResponse(type_url=SECRET, nonce="1", resources=[workload]),
        DeltaResponse(type_url=SECRET, nonce="2", removed_resources=["ROOTCA"]),
        DiscoveryResponse(type_url=CLUSTER, nonce="3"),
    ):
        arrived.record(response)
    counts = (arrived.names, arrived.times, arrived.removed, arrived.responses)
    assert counts == (["default"], {"default": 1}, ["ROOTCA"], 3)
    assert repr(arrived) == "Arrived(Secret ['default'], removed=['ROOTCA'], in 3 responses)"
    with pytest.raises(AssertionError) as failure:
        arrived["ROOTCA"]
    assert str(failure.value) == f"{arrived!r} has no 'ROOTCA'"
    last = failure.traceback[-1]
    assert not _shows_key(repr(last.frame.getargs(var=True)), key)
