"""Whatever AuthorizationPolicy paths pilot accepts, Envoy accepts: hostile paths, long
ones, thousands of them, templates, regex metacharacters, widened and exact, under every
PILOT_PATH_NORMALIZATION, on a real `envoy --mode validate`.

A control first: a regex over Envoy's default RE2 program size (100) is refused by the
same Envoy, so the acceptance below means the widened regexes were cut to fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.builders.inbound import (
    InboundProtocol,
    InboundShape,
    inbound_cluster,
    inbound_passthrough_cluster,
    virtual_inbound,
)
from pilot.builders.listeners import typed
from pilot.builders.outbound import fixed_clusters
from pilot.builders.path_matchers import program_size, widened_regexes
from pilot.builders.path_normalization import PathNormalization
from pilot.builders.rbac import rbac_rules
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
from tests.support.envoy_process import EnvoyError, validate_bootstrap

PORTS = ((9080, InboundProtocol.HTTP), (7070, InboundProtocol.HTTP2))
HOSTILE = [
    "/a/../deny", "/DENY", "//deny", "/%2Fdeny", "/%5C", "\\deny", "/deny#frag", "/deny?x=1",
    "/.*+?()[]^$|\\", "(?i)", "\\Q.*\\E", "[[:alpha:]]", "a+(1|2)", "/%00", "/é/日本/\u212a",
    "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk", "/" + "/".join("s" * 9 for _ in range(90)),
    "/" + "x" * 1000, "/users/{*}/secret", "/files/{**}", "/{**}/a", "/" + "a" * 300 + "/{*}",
    "*", "*.php", "/admin/*", "*/x*", "/;jsessionid=1", "",
]  # fmt: skip


def _parsed(i: int, spec: dict[str, Any]) -> AuthorizationPolicy:
    obj = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": f"p{i}", "namespace": "shop"},
        "spec": spec,
    }
    try:
        return parse_authorization_policy(obj)
    except ConfigError as error:
        stand_in = refused_policy(obj, error)
        assert stand_in is not None
        return stand_in


def _validate(
    folder: Path, policies: tuple[AuthorizationPolicy, ...], mode: PathNormalization
) -> None:
    shape = InboundShape(PORTS, MtlsMode.PERMISSIVE, authz=AppliedPolicies(policies))
    listener = virtual_inbound(shape, mode)
    clusters = [inbound_passthrough_cluster(), *(inbound_cluster(*p) for p in PORTS)]
    held: dict[str, dict[str, Any]] = {
        types.CLUSTER: {c.name: c for c in [*clusters, *fixed_clusters()]},
        types.LISTENER: {listener.name: listener},
        types.ROUTE: {},
    }
    path = folder / "inbound.pb"
    path.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(path)


def _spec(action: str, field: str, paths: list[str]) -> dict[str, Any]:
    return {"action": action, "rules": [{"to": [{"operation": {field: paths}}]}]}


def test_envoy_refuses_a_regex_over_its_program_size(tmp_path: Path) -> None:
    """The control: without cutting, the widened form of a long path is refused."""
    value = "/" + "/".join(f"seg{i}" for i in range(40))
    assert len(widened_regexes(value)) > 1
    policy = _parsed(0, _spec("DENY", "paths", [value]))
    (rules,) = rbac_rules(AppliedPolicies((policy,)), tcp=False)
    whole = "(?i)" + value.replace("/", "(?:[/\\\\]|%2f|%5c)+")
    assert program_size(whole) > 100
    permission = rules.policies["ns[shop]-policy[p0]-rule[0]"].permissions[0]
    permission.url_path.path.safe_regex.regex = whole  # what an uncut translation sends
    with pytest.raises(EnvoyError, match=r"too large|program size"):
        _validate_rules(tmp_path, rules)


def _validate_rules(folder: Path, rules: Any) -> None:
    listener = virtual_inbound(InboundShape(PORTS, MtlsMode.PERMISSIVE))
    config = http_rbac_pb2.RBAC()
    config.rules.CopyFrom(rules)
    for chain in listener.filter_chains:
        for network_filter in chain.filters:
            if network_filter.name != "envoy.filters.network.http_connection_manager":
                continue
            manager = hcm_pb2.HttpConnectionManager()
            network_filter.typed_config.Unpack(manager)
            manager.http_filters.insert(
                0, hcm_pb2.HttpFilter(name="envoy.filters.http.rbac", typed_config=typed(config))
            )
            network_filter.typed_config.Pack(manager)
    held: dict[str, dict[str, Any]] = {
        types.CLUSTER: {c.name: c for c in [inbound_passthrough_cluster(),
                                            *(inbound_cluster(*p) for p in PORTS),
                                            *fixed_clusters()]},
        types.LISTENER: {listener.name: listener},
        types.ROUTE: {},
    }  # fmt: skip
    path = folder / "control.pb"
    path.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(path)


@pytest.mark.parametrize("mode", list(PathNormalization))
def test_hostile_paths_in_every_direction_are_accepted(
    tmp_path: Path, mode: PathNormalization
) -> None:
    policies = tuple(
        _parsed(i, _spec(action, field, HOSTILE))
        for i, (action, field) in enumerate(
            [(a, f) for a in ("ALLOW", "DENY", "AUDIT") for f in ("paths", "notPaths")]
        )
    )
    assert not any(p.deny_all for p in policies), [p.fail_closed for p in policies]
    _validate(tmp_path, policies, mode)


def test_thousands_of_paths_are_accepted(tmp_path: Path) -> None:
    paths = [f"/api/v{i}/Users/{{*}}/items/{i}" for i in range(1024)]
    policies = (
        _parsed(0, _spec("DENY", "paths", paths)),
        _parsed(1, _spec("ALLOW", "paths", paths)),
    )
    assert not any(p.deny_all for p in policies)
    _validate(tmp_path, policies, PathNormalization.BASE)


_PIECES = [*"/\\%2FfC5c.*+?()[]{}^$|kKsS#;é\u212a", "{*}", "{**}", "admin", "..", "%2f"]
_paths = st.lists(st.lists(st.sampled_from(_PIECES), max_size=60).map("".join), max_size=6)
_specs = st.lists(
    st.builds(
        _spec,
        st.sampled_from(["ALLOW", "DENY", "AUDIT"]),
        st.sampled_from(["paths", "notPaths"]),
        _paths,
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=_specs, mode=st.sampled_from(list(PathNormalization)))
def test_envoy_validates_fuzzed_paths(
    tmp_path_factory: pytest.TempPathFactory, specs: list[dict[str, Any]], mode: PathNormalization
) -> None:
    policies = tuple(_parsed(i, spec) for i, spec in enumerate(specs))
    _validate(tmp_path_factory.mktemp("paths"), policies, mode)
