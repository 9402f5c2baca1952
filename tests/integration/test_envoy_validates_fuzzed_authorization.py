"""Fuzzed AuthorizationPolicies (hypothesis): whatever pilot's parser accepts, Envoy accepts.

Each example is a handful of policies made of every field, with values drawn from
what breaks translations (regex metacharacters, `*` in odd places, `{`, `%`, `..`,
unicode, empty strings, CIDRs of both families); those pilot refuses are left out
(they deny everything, which translates to nothing but `any`). The rest go onto an
inbound listener with an HTTP, a gRPC and a TCP port, and `envoy --mode validate`
must accept the bootstrap holding it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.builders.inbound import (
    InboundProtocol,
    InboundShape,
    inbound_cluster,
    inbound_passthrough_cluster,
    virtual_inbound,
)
from pilot.builders.outbound import fixed_clusters
from pilot.registry.authorization_policy import (
    AppliedPolicies,
    AuthorizationPolicy,
    ConfigError,
    parse_authorization_policy,
    refused_policy,
)
from pilot.registry.peer_authentication import MtlsMode
from pilot.xds import types
from tests.integration.envoy_validation import bootstrap_of
from tests.support.envoy_process import validate_bootstrap

_TRICKY = [
    "*", "**", "*a*", "a*b", "", "/", "/a/../b", "%2F", "%00", "{*}", "{**}", "(a|b)",
    "[z-a]", "a{99999}", "\\", "\\Q", "$^", "é", "日本", "cluster.local/ns/x/sa/y",
    "10.0.0.0/8", "fd00::/8", "GET", ".", "a..b", "ns-*", "*-ns",
]  # fmt: skip
_value = st.one_of(st.sampled_from(_TRICKY), st.text(max_size=12))
_values = st.lists(_value, max_size=4)
_cidrs = st.lists(st.sampled_from(["10.0.0.0/8", "1.2.3.4", "fd00::/8", "::1", "bad"]), max_size=3)
_ports = st.lists(st.sampled_from(["0", "80", "9080", "65535", "http"]), max_size=3)
_source = st.fixed_dictionaries(
    {},
    optional={
        "principals": _values,
        "notPrincipals": _values,
        "requestPrincipals": _values,
        "notRequestPrincipals": _values,
        "namespaces": _values,
        "notNamespaces": _values,
        "serviceAccounts": _values,
        "notServiceAccounts": _values,
        "trustDomains": _values,
        "notTrustDomains": _values,
        "ipBlocks": _cidrs,
        "notIpBlocks": _cidrs,
        "remoteIpBlocks": _cidrs,
        "notRemoteIpBlocks": _cidrs,
    },
)
_operation = st.fixed_dictionaries(
    {},
    optional={
        "hosts": _values,
        "notHosts": _values,
        "ports": _ports,
        "notPorts": _ports,
        "methods": _values,
        "notMethods": _values,
        "paths": _values,
        "notPaths": _values,
    },
)
_keys = st.sampled_from(
    [
        "source.ip", "remote.ip", "source.namespace", "source.principal",
        "source.serviceAccount", "destination.ip", "destination.port", "connection.sni",
        "request.headers[x-a]", "request.headers[]", "request.auth.claims[iss]",
        "experimental.envoy.filters.a[b]", "unknown",
    ]
)  # fmt: skip
_condition = st.fixed_dictionaries(
    {"key": _keys}, optional={"values": _values, "notValues": _values}
)
_rule = st.fixed_dictionaries(
    {},
    optional={
        "from": st.lists(st.fixed_dictionaries({"source": _source}), max_size=2),
        "to": st.lists(st.fixed_dictionaries({"operation": _operation}), max_size=2),
        "when": st.lists(_condition, max_size=3),
    },
)
_spec = st.fixed_dictionaries(
    {"action": st.sampled_from(["ALLOW", "DENY", "AUDIT", "CUSTOM"])},
    optional={
        "rules": st.lists(_rule, max_size=3),
        "selector": st.just({"matchLabels": {"app": "reviews"}}),
    },
)


def _parsed(i: int, spec: dict[str, Any]) -> AuthorizationPolicy:
    obj = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": f"p{i}", "namespace": "shop"},
        "spec": spec,
    }
    if spec.get("action") == "CUSTOM":
        spec["provider"] = {"name": "ext"}
    try:
        return parse_authorization_policy(obj)
    except ConfigError as error:
        stand_in = refused_policy(obj, error)
        assert stand_in is not None
        return stand_in


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=st.lists(_spec, min_size=1, max_size=6))
def test_envoy_validates_fuzzed_authorization_policies(
    tmp_path_factory: Any, specs: list[dict[str, Any]]
) -> None:
    applied = AppliedPolicies(tuple(_parsed(i, spec) for i, spec in enumerate(specs)))
    ports = (
        (5432, InboundProtocol.TCP),
        (7070, InboundProtocol.HTTP2),
        (9080, InboundProtocol.HTTP),
    )
    shape = InboundShape(ports, MtlsMode.PERMISSIVE, authz=applied)
    listener = virtual_inbound(shape)
    clusters = [inbound_passthrough_cluster(), *(inbound_cluster(*p) for p in ports)]
    clusters += fixed_clusters()
    held: dict[str, dict[str, Any]] = {
        types.CLUSTER: {c.name: c for c in clusters},
        types.LISTENER: {listener.name: listener},
        types.ROUTE: {},
    }
    path: Path = tmp_path_factory.mktemp("fuzz") / "inbound.pb"
    path.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(path)
