"""RequestAuthentication read strictly: the honest object as Istio's API has it, and every
hostile value (control characters, huge lists, JWKS Envoy would refuse, jwksUris that
point at a local file, carry credentials or name the sidecar's own ports) refused in one
line naming the object and the field; and which objects apply to which workload."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pilot.registry.istio_config import ConfigError
from pilot.registry.jwks import FORBIDDEN_PORTS
from pilot.registry.request_authentication import (
    DEFAULT_TIMEOUT,
    RequestAuthentications,
    parse_request_authentication,
)
from pilot.sources.file_format import parse_registry
from tests.support.jwt_tokens import ISSUER, SigningKey

KEY = SigningKey()


def obj(spec: dict[str, Any], name: str = "jwt", namespace: str = "shop") -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def rule(**fields: Any) -> dict[str, Any]:
    return {"issuer": ISSUER, "jwks": KEY.jwks(), **fields}


def refused(spec: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_request_authentication(obj(spec))
    message = str(caught.value)
    assert "RequestAuthentication shop/jwt" in message and "\n" not in message
    return message


def test_every_field_of_istios_api_is_read() -> None:
    ra = parse_request_authentication(
        obj(
            {
                "selector": {"matchLabels": {"app": "reviews"}},
                "jwtRules": [
                    rule(
                        audiences=["reviews", "ratings"],
                        fromHeaders=[{"name": "X-Jwt", "prefix": "Bearer "}],
                        fromParams=["token"],
                        fromCookies=["session"],
                        outputPayloadToHeader="x-jwt-payload",
                        outputClaimToHeaders=[{"header": "x-sub", "claim": "sub"}],
                        forwardOriginalToken=True,
                        timeout="2.5s",
                        spaceDelimitedClaims=["roles"],
                    ),
                    {"issuer": "other", "jwksUri": "https://keys.example.com:8443/jwks.json"},
                ],
            }
        )
    )
    first, second = ra.rules
    assert ra.selector == (("app", "reviews"),)
    assert first.audiences == ("reviews", "ratings")
    assert first.from_headers == (("x-jwt", "Bearer "),)  # header names compare lower-case
    assert (first.from_params, first.from_cookies) == (("token",), ("session",))
    assert first.output_payload_to_header == "x-jwt-payload"
    assert first.output_claim_to_headers == (("x-sub", "sub"),)
    assert first.forward_original_token and first.timeout == 2.5
    assert first.space_delimited_claims == ("roles",)
    assert second.jwks_uri is not None and second.jwks_uri.host == "keys.example.com"
    assert (second.jwks_uri.port, second.jwks_uri.tls) == (8443, True)
    assert not second.forward_original_token and second.timeout == DEFAULT_TIMEOUT


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"jwtRules": [{"jwks": KEY.jwks()}]}, "issuer"),
        ({"jwtRules": [rule(issuer="a\0b")]}, "control characters"),
        ({"jwtRules": [rule(issuer="https://a\nforged line")]}, "control characters"),
        ({"jwtRules": [rule(issuer="x" * 5000)]}, "at most"),
        ({"jwtRules": [rule(audiences=["a"] * 5000)]}, "at most"),
        ({"jwtRules": [rule()] * 65}, "at most 64"),
        ({"jwtRules": [rule(fromParams=[""])]}, "empty"),
        ({"jwtRules": [rule(unknown=1)]}, "unknown field"),
        ({"jwtRules": [{"issuer": "x"}]}, "neither jwksUri nor jwks"),
        ({"jwtRules": [rule(jwksUri="https://a.example.com/k")]}, "both"),
        ({"jwtRules": [rule(fromHeaders=[{"name": "bad header"}])]}, "header name"),
        ({"jwtRules": [rule(fromHeaders=[{"name": ":path"}])]}, "header name"),
        ({"jwtRules": [rule(outputPayloadToHeader="x-forwarded-client-cert")]}, "trusts"),
        ({"jwtRules": [rule(outputPayloadToHeader="X-Envoy-Original-Path")]}, "trusts"),
        ({"jwtRules": [rule(outputClaimToHeaders=[{"header": "host", "claim": "a"}])]}, "trusts"),
        ({"jwtRules": [rule(outputClaimToHeaders=[{"header": "x-a", "claim": ""}])]}, "empty"),
        ({"jwtRules": [rule(timeout="0s")]}, "at least"),
        ({"jwtRules": [rule(timeout="99999h")]}, "longer"),
        ({"jwtRules": [rule(forwardOriginalToken="yes")]}, "true or false"),
        ({"targetRefs": [{"kind": "Gateway", "name": "g", "extra": 1}]}, "unknown field"),
    ],
)
def test_hostile_fields_are_refused_in_one_line(spec: dict[str, Any], said: str) -> None:
    assert said in refused(spec)


def _jwks(**key: Any) -> str:
    return json.dumps({"keys": [key]})


@pytest.mark.parametrize(
    ("jwks", "said"),
    [
        ("not json", "not JSON"),
        ("[" * 60_000, "not JSON"),  # deeper than the JSON parser recurses
        ("x" * 70_000, "at most"),
        (json.dumps({"keys": []}), "non-empty"),
        (json.dumps({"keys": [KEY.jwk()] * 65}), "at most 64"),
        (_jwks(kty="DSA"), "kty"),
        (_jwks(kty="RSA", n="!!", e="AQAB"), "base64url"),
        (_jwks(kty="RSA", n="AQAB", e="AQAB"), "modulus"),
        (_jwks(**{**KEY.jwk(), "alg": "HS256"}), "alg"),  # an RSA key offered for HMAC
        (_jwks(kty="EC", crv="P-256", x="AQAB", y="AQAB"), "not a point"),
        (_jwks(kty="EC", crv="secp256k1", x="AQAB", y="AQAB"), "crv"),
        (_jwks(kty="OKP", crv="Ed25519", x="AQAB"), "32 bytes"),
        (_jwks(**{**KEY.jwk(), "kid": "k" * 300}), "kid"),
    ],
)
def test_a_jwks_envoy_would_refuse_never_reaches_it(jwks: str, said: str) -> None:
    message = refused({"jwtRules": [{"issuer": ISSUER, "jwks": jwks}]})
    assert said in message and "spec.jwtRules[0].jwks" in message


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("file:///etc/passwd", "http or https"),
        ("ftp://keys.example.com/jwks", "http or https"),
        ("gopher://127.0.0.1:70/", "http or https"),
        ("https://user:secret@keys.example.com/jwks", "userinfo"),
        ("https://keys.example.com:0/jwks", "1..65535"),
        ("https://keys.example.com:99999/jwks", "1..65535"),
        ("https:///jwks", "no host"),
        ("https://bad_host!/jwks", "neither"),
        ("https://keys.example.com/a b", "white space"),
        *((f"http://127.0.0.1:{port}/", "own") for port in sorted(FORBIDDEN_PORTS)),
    ],
)
def test_a_jwks_uri_pointing_anywhere_but_a_web_server_is_refused(uri: str, said: str) -> None:
    assert said in refused({"jwtRules": [{"issuer": ISSUER, "jwksUri": uri}]})


def test_jwks_uri_gives_one_cluster_per_scheme_host_and_port() -> None:
    ra = parse_request_authentication(
        obj(
            {
                "jwtRules": [
                    {"issuer": "a", "jwksUri": "http://10.0.0.9:8080/a"},
                    {"issuer": "b", "jwksUri": "http://10.0.0.9:8080/b"},
                    {"issuer": "c", "jwksUri": "https://keys.example.com/c"},
                    {"issuer": "d", "jwksUri": "https://[fd00::1]/d"},
                ]
            }
        )
    )
    uris = {r.jwks_uri.cluster for r in ra.rules if r.jwks_uri is not None}
    assert uris == {
        "jwks|http|10.0.0.9|8080",
        "jwks|https|keys.example.com|443",
        "jwks|https|fd00::1|443",
    }


def _store(*objects: dict[str, Any]) -> RequestAuthentications:
    store = RequestAuthentications()
    for o in objects:
        store.upsert(parse_request_authentication(o))
    return store


def test_scopes_are_authorization_policys() -> None:
    store = _store(
        obj({"jwtRules": [rule(issuer="mesh")]}, "mesh", "istio-system"),
        obj(
            {"selector": {"matchLabels": {"app": "reviews"}}, "jwtRules": [rule(issuer="all")]},
            "mesh-selected",
            "istio-system",
        ),
        obj({"jwtRules": [rule(issuer="ns")]}, "ns"),
        obj(
            {"selector": {"matchLabels": {"app": "reviews"}}, "jwtRules": [rule(issuer="sel")]},
            "sel",
        ),
        obj({"jwtRules": [rule(issuer="gw")], "targetRefs": [{"kind": "Gateway", "name": "g"}]}),
        obj({"jwtRules": [rule(issuer="elsewhere")]}, "other", "other"),
    )
    reviews = store.applied("shop", [{"app": "reviews"}])
    assert reviews.issuers == ("all", "mesh", "ns", "sel")
    assert store.applied("shop", [{"app": "ratings"}]).issuers == ("mesh", "ns")
    # Its Pod not known (or not one): selectors give no issuer there (no principal).
    assert store.applied("shop", []).issuers == ("mesh", "ns")
    assert store.applied("other", [{"app": "reviews"}]).issuers == ("all", "elsewhere", "mesh")


def test_a_change_names_the_namespace_to_reconsider() -> None:
    store = RequestAuthentications()
    first = parse_request_authentication(obj({"jwtRules": [rule()]}))
    assert store.upsert(first) == {"shop"}
    assert store.upsert(first) == frozenset()
    assert store.delete(first.key) == {"shop"}
    assert store.delete(first.key) == frozenset()


def test_a_file_keeps_the_last_good_version_of_a_refused_one() -> None:
    good = obj({"jwtRules": [rule(issuer="good")]})
    state = parse_registry(json.dumps({"kind": "List", "items": [good]}), "f")
    assert [ra.rules[0].issuer for ra in state.request_authentications] == ["good"]
    store = RequestAuthentications()
    store.replace_all(state.request_authentications, state.jwt_refused)
    bad = obj({"jwtRules": [{"issuer": "bad\0"}]})
    state = parse_registry(json.dumps({"kind": "List", "items": [bad]}), "f")
    assert not state.request_authentications
    assert any("control characters" in line for line in state.config_errors)
    assert store.replace_all(state.request_authentications, state.jwt_refused) == frozenset()
    assert [ra.rules[0].issuer for ra in store.objects()] == ["good"]
    assert not state.unsupported, "RequestAuthentication is no longer only counted"
