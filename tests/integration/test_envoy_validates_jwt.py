"""RequestAuthentications and the AuthorizationPolicies on their principals: whatever pilot's
parser accepts, `envoy --mode validate` accepts.

An honest one of every field (inline JWKS, an http and an https jwksUri, every place a
token can be, claims to headers) and fuzzed ones (hypothesis: issuers, audiences,
claims and principal patterns with regex metacharacters, `*` in odd places, `/`,
unicode and empty strings; those pilot refuses are left out) go onto an inbound
listener with an HTTP, a gRPC and a TCP port, with its JWKS clusters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from pilot.builders.inbound import (
    InboundProtocol,
    InboundShape,
    inbound_cluster,
    inbound_passthrough_cluster,
    jwks_clusters,
    virtual_inbound,
)
from pilot.builders.outbound import fixed_clusters
from pilot.registry.authorization_policy import (
    AppliedPolicies,
    AuthorizationPolicy,
    parse_authorization_policy,
)
from pilot.registry.istio_config import ConfigError
from pilot.registry.peer_authentication import MtlsMode
from pilot.registry.request_authentication import (
    AppliedAuthentications,
    RequestAuthentication,
    parse_request_authentication,
)
from pilot.xds import types
from tests.integration.envoy_validation import bootstrap_of
from tests.support.envoy_process import validate_bootstrap
from tests.support.jwt_tokens import ISSUER, SigningKey

PORTS = ((5432, InboundProtocol.TCP), (7070, InboundProtocol.GRPC), (9080, InboundProtocol.HTTP))
KEY = SigningKey()


def _validate(
    tmp: Path, authentications: list[RequestAuthentication], policies: list[AuthorizationPolicy]
) -> None:
    jwt = AppliedAuthentications(tuple(authentications))
    shape = InboundShape(
        PORTS, MtlsMode.PERMISSIVE, authz=AppliedPolicies(tuple(policies)), jwt=jwt
    )
    listener = virtual_inbound(shape)
    clusters = [inbound_passthrough_cluster(), *(inbound_cluster(*p) for p in PORTS)]
    clusters += [*jwks_clusters(jwt), *fixed_clusters()]
    held: dict[str, dict[str, Any]] = {
        types.CLUSTER: {c.name: c for c in clusters},
        types.LISTENER: {listener.name: listener},
        types.ROUTE: {},
    }
    path = tmp / "inbound.pb"
    path.write_bytes(bootstrap_of(held).SerializeToString())
    output = validate_bootstrap(path)
    assert "Deprecated field" not in output, output  # what a later Envoy would refuse


def _obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


def test_envoy_takes_every_field(tmp_path: Path) -> None:
    ra = parse_request_authentication(
        _obj(
            "RequestAuthentication",
            "all",
            {
                "jwtRules": [
                    {
                        "issuer": ISSUER,
                        "jwks": KEY.jwks(),
                        "audiences": ["reviews"],
                        "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}],
                        "fromParams": ["token"],
                        "fromCookies": ["session"],
                        "outputPayloadToHeader": "x-jwt-payload",
                        "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}],
                        "forwardOriginalToken": True,
                        "spaceDelimitedClaims": ["roles"],
                    },
                    {
                        "issuer": "https",
                        "jwksUri": "https://keys.example.com/jwks",
                        "timeout": "2s",
                    },
                    {"issuer": "http", "jwksUri": "http://10.0.0.9:8080/jwks"},
                    {"issuer": "v6", "jwksUri": "https://[fd00::9]:8443/jwks"},
                ]
            },
        )
    )
    rule = {
        "from": [{"source": {"requestPrincipals": [f"{ISSUER}/alice", "*", "http/*"]}}],
        "when": [
            {"key": "request.auth.claims[groups]", "values": ["admin"]},
            {"key": "request.auth.claims[realm][role]", "notValues": ["guest*"]},
            {"key": "request.auth.audiences", "values": ["reviews"]},
            {"key": "request.auth.presenter", "values": ["*"]},
            {"key": "request.auth.principal", "notValues": ["https/*"]},
        ],
    }
    allow = parse_authorization_policy(_obj("AuthorizationPolicy", "allow", {"rules": [rule]}))
    deny_spec = {
        "action": "DENY",
        "rules": [{"from": [{"source": {"notRequestPrincipals": ["*"]}}]}],
    }
    deny = parse_authorization_policy(_obj("AuthorizationPolicy", "deny", deny_spec))
    _validate(tmp_path, [ra], [allow, deny])


_TRICKY = [
    "*", "**", "*a*", "a*b", "", "/", "a/b", "https://x/y/z", "(a|b)", "[z-a]", "\\",
    "$^", "é", "日本", ".", "%00", "{x}", "a{99999}",
]  # fmt: skip
_value = st.one_of(st.sampled_from(_TRICKY), st.text(max_size=12))
_values = st.lists(_value, max_size=3)
_header = st.sampled_from(["x-a", "X-B", "authorization", "bad header", "", "x-envoy-a"])
_key_source = st.sampled_from(
    [
        {"jwks": KEY.jwks()},
        {"jwksUri": "http://10.1.2.3/k"},
        {"jwksUri": "https://k.example.com/k"},
        {"jwksUri": "ftp://x"},
    ]
)
_fields = st.fixed_dictionaries(
    {"issuer": _value},
    optional={
        "audiences": _values,
        "fromHeaders": st.lists(
            st.fixed_dictionaries({"name": _header}, optional={"prefix": _value}), max_size=2
        ),
        "fromParams": _values,
        "fromCookies": _values,
        "outputPayloadToHeader": _header,
        "outputClaimToHeaders": st.lists(
            st.fixed_dictionaries({"header": _header, "claim": _value}), max_size=2
        ),
        "forwardOriginalToken": st.booleans(),
        "spaceDelimitedClaims": _values,
    },
)
_jwt_rule = st.builds(lambda fields, keys: fields | keys, _fields, _key_source)
_keys = st.sampled_from(
    [
        "request.auth.principal", "request.auth.audiences", "request.auth.presenter",
        "request.auth.claims[a]", "request.auth.claims[a][b]", "request.auth.claims[]",
        "request.auth.claims[a", "request.auth.other",
    ]
)  # fmt: skip
_rule = st.fixed_dictionaries(
    {},
    optional={
        "from": st.lists(
            st.fixed_dictionaries(
                {"source": st.fixed_dictionaries(
                    {}, optional={"requestPrincipals": _values, "notRequestPrincipals": _values}
                )}
            ),
            max_size=2,
        ),
        "when": st.lists(
            st.fixed_dictionaries(
                {"key": _keys}, optional={"values": _values, "notValues": _values}
            ),
            max_size=3,
        ),
    },
)  # fmt: skip


def _parsed_ra(i: int, rules: list[dict[str, Any]]) -> RequestAuthentication | None:
    try:
        return parse_request_authentication(
            _obj("RequestAuthentication", f"r{i}", {"jwtRules": rules})
        )
    except ConfigError:
        return None


def _parsed_policy(i: int, action: str, rules: list[dict[str, Any]]) -> AuthorizationPolicy | None:
    try:
        spec = {"action": action, "rules": rules}
        return parse_authorization_policy(_obj("AuthorizationPolicy", f"p{i}", spec))
    except ConfigError:
        return None


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    authentications=st.lists(st.lists(_jwt_rule, min_size=1, max_size=3), min_size=1, max_size=3),
    policies=st.lists(
        st.tuples(st.sampled_from(["ALLOW", "DENY", "AUDIT"]), st.lists(_rule, max_size=3)),
        max_size=3,
    ),
)
def test_envoy_validates_fuzzed_request_authentications(
    tmp_path_factory: Any,
    authentications: list[list[dict[str, Any]]],
    policies: list[tuple[str, list[dict[str, Any]]]],
) -> None:
    parsed = [ra for i, rules in enumerate(authentications) if (ra := _parsed_ra(i, rules))]
    note(f"{len(parsed)} of {len(authentications)} RequestAuthentications taken")
    made = [p for i, (a, r) in enumerate(policies) if (p := _parsed_policy(i, a, r))]
    _validate(tmp_path_factory.mktemp("fuzz"), parsed, made)
