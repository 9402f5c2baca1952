"""Envoy accepts a sidecar's `virtualInbound` with AuthorizationPolicies, honest and hostile.

The registry file (the file source) names the pod's services (HTTP and TCP) and Pod,
and policies using every field pilot translates, with values meant to break the
translation (regex metacharacters, `..`, percent-encoding, mixed case, NUL and
newlines, a thousand principals) and one object that is not valid. What pilot serves
that sidecar goes into a bootstrap that `envoy --mode validate` must accept; the
chains carry the RBAC filters in Istio's order, and the invalid object denies
everything in its namespace, with one warning line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2

from pilot.xds import types
from tests.integration.envoy_validation import POD_ID, POD_IP, bootstrap_of, fetch
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_pilot
from tests.support.pilot_process import http_get
from tests.support.xds_client import XdsClient, node


def policy(name: str, spec: Any, namespace: str = "shop") -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


HOSTILE_VALUES = [
    "/a/../deny",
    "/%2Fdeny",
    "/DENY",
    "//deny",
    "(a|b)*",
    "[z-a]",
    "\\Q.*\\E",
    "*.*",
]


def objects() -> list[dict[str, Any]]:
    reviews = service("reviews", "shop", [("http", 9080), ("tcp-db", 5432)])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reviews-1", "namespace": "shop", "labels": {"app": "reviews"}},
        "spec": {"serviceAccountName": "reviews"},
        "status": {"phase": "Running", "podIP": POD_IP},
    }
    every_field = {
        "selector": {"matchLabels": {"app": "reviews"}},
        "rules": [
            {
                "from": [
                    {
                        "source": {
                            "principals": ["cluster.local/ns/shop/sa/productpage", "*", "*x", "y*"],
                            "notPrincipals": HOSTILE_VALUES,
                            "namespaces": ["shop", "team-*", "*-prod", "a{99999}"],
                            "notNamespaces": HOSTILE_VALUES,
                            "serviceAccounts": ["productpage", "other/reader"],
                            "trustDomains": ["cluster.local", "*", "td-*"],
                            "ipBlocks": ["10.0.0.0/8", "fd00::/8", "192.168.1.1"],
                            "notRemoteIpBlocks": ["1.2.3.4/32"],
                        }
                    }
                ],
                "to": [
                    {
                        "operation": {
                            "hosts": ["reviews.shop.svc.cluster.local", "*.shop", "REVIEWS*"],
                            "ports": ["9080", "5432"],
                            "methods": ["GET", "POST"],
                            "paths": ["/info", "/api/*", "*.json", *HOSTILE_VALUES],
                            "notPaths": HOSTILE_VALUES,
                        }
                    }
                ],
                "when": [
                    {"key": "request.headers[x-Token]", "values": ["a", "*b"]},
                    {"key": "source.ip", "notValues": ["10.9.0.0/16"]},
                    {"key": "destination.port", "values": ["9080"]},
                    {"key": "connection.sni", "values": ["*.shop"]},
                    {"key": "source.namespace", "values": HOSTILE_VALUES},
                ],
            }
        ],
    }
    many = ["cluster.local/ns/shop/sa/" + f"client-{i}" for i in range(1024)]
    return [
        reviews,
        endpoint_slice("reviews", [Ep(POD_IP)], "shop", [("http", 8080), ("tcp-db", 5432)]),
        pod,
        policy("every-field", every_field),
        policy(
            "deny-paths",
            {"action": "DENY", "rules": [{"to": [{"operation": {"paths": HOSTILE_VALUES}}]}]},
        ),
        policy("audit", {"action": "AUDIT", "rules": [{}]}),
        policy("many", {"rules": [{"from": [{"source": {"principals": many}}]}]}),
        policy(
            "jwt",
            {"action": "DENY", "rules": [{"from": [{"source": {"notRequestPrincipals": ["*"]}}]}]},
        ),
        policy("newline", {"rules": [{"from": [{"source": {"principals": ["a\nb"]}}]}]}, "other"),
        policy("nul", {"rules": [{"to": [{"operation": {"paths": ["/a\x00"]}}]}]}, "other"),
    ]


def http_rbac(chain: Any) -> list[http_rbac_pb2.RBAC]:
    manager = hcm_pb2.HttpConnectionManager()
    chain.filters[0].typed_config.Unpack(manager)
    found = []
    for http_filter in manager.http_filters:
        if http_filter.name == "envoy.filters.http.rbac":
            config = http_rbac_pb2.RBAC()
            http_filter.typed_config.Unpack(config)
            found.append(config)
    return found


def network_rbac(chain: Any) -> list[network_rbac_pb2.RBAC]:
    found = []
    for network_filter in chain.filters:
        if network_filter.name == "envoy.filters.network.rbac":
            config = network_rbac_pb2.RBAC()
            network_filter.typed_config.Unpack(config)
            found.append(config)
    return found


def chain_named(inbound: listener_pb2.Listener, name: str) -> Any:
    return next(c for c in inbound.filter_chains if c.name == name)


async def test_envoy_validates_every_field_and_hostile_values(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with (
        running_pilot(tmp_path, objects()) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(POD_ID)))
        status, debug = await http_get(f"http://127.0.0.1:{pilot.http_port}/debug/authorizationz")
    assert status == 200
    by_name = {(p["namespace"], p["name"]): p for p in debug["policies"]}
    assert by_name["shop", "every-field"]["appliesTo"] == [POD_ID]
    assert by_name["shop", "every-field"]["scope"] == "workloads selected"
    assert (
        by_name["other", "newline"]["deniesEverything"]
        and not by_name["other", "newline"]["appliesTo"]
    )
    (sidecar,) = debug["proxies"]
    assert sidecar["proxy"] == POD_ID
    assert sidecar["policies"] == [
        "AUDIT shop/audit",
        "DENY shop/deny-paths",
        "ALLOW shop/every-field",
        "DENY shop/jwt",
        "ALLOW shop/many",
    ]
    inbound: listener_pb2.Listener = held[types.LISTENER]["virtualInbound"]
    http = http_rbac(chain_named(inbound, "inbound|8080||-mtls"))
    # Paths are normalized as istiod's default (BASE) before the filters see them.
    manager = hcm_pb2.HttpConnectionManager()
    chain_named(inbound, "inbound|8080||-mtls").filters[0].typed_config.Unpack(manager)
    assert manager.normalize_path.value and not manager.merge_slashes
    assert manager.path_with_escaped_slashes_action == manager.KEEP_UNCHANGED
    assert [r.rules.action for r in http] == [1, 2, 0]  # DENY, LOG, ALLOW
    assert "ns[shop]-policy[jwt]-rule[0]" in http[0].rules.policies  # denies: no JWT yet
    assert len(http[2].rules.policies) == 2  # every-field and many
    assert "ns[shop]-policy[deny-paths]-rule[0]" in http[0].rules.policies
    tcp = network_rbac(chain_named(inbound, "inbound|5432||-mtls"))
    assert [r.rules.action for r in tcp] == [1, 2, 0]
    # The ALLOW rule with HTTP fields matches nothing on TCP; the DENY one on paths
    # denies regardless of the path there (as Istio: never allow what cannot be checked).
    assert list(tcp[2].rules.policies) == ["ns[shop]-policy[many]-rule[0]"]
    assert "ns[shop]-policy[deny-paths]-rule[0]" in tcp[0].rules.policies
    assert not network_rbac(chain_named(inbound, "virtualInbound-blackhole"))
    passthrough = network_rbac(chain_named(inbound, "virtualInbound"))
    assert [r.rules.action for r in passthrough] == [1, 2, 0]
    path = tmp_path / "inbound.pb"
    path.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(path)
    warned = [r.getMessage() for r in caplog.records if "fails closed" in r.getMessage()]
    assert len([w for w in warned if "other/newline" in w]) == 1
    assert len([w for w in warned if "other/nul" in w]) == 1
    assert all("\n" not in w and "\x00" not in w for w in warned)
