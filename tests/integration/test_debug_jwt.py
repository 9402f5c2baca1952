"""What an operator sees of RequestAuthentications: /debug/authorizationz lists each with
its scope, issuers, JWKS URIs and the sidecars it applies to (a targetRef one: none), and
`pilot proxy-config listeners` names them on the chains that verify JWTs (`JWT ns/name`),
beside the AuthorizationPolicies, and on no TCP chain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.envoy_validation import POD_ID, POD_IP, fetch
from tests.support.cli import run_pilot
from tests.support.jwt_tokens import ISSUER, SigningKey
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_pilot
from tests.support.pilot_process import http_get
from tests.support.xds_client import XdsClient, node

JWKS_URI = "https://keys.example.com/jwks.json"


def _security(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


def objects() -> list[dict[str, Any]]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reviews-1", "namespace": "shop", "labels": {"app": "reviews"}},
        "spec": {"serviceAccountName": "reviews"},
        "status": {"phase": "Running", "podIP": POD_IP},
    }
    selector = {"matchLabels": {"app": "reviews"}}
    return [
        service("reviews", "shop", [("http", 8080), ("tcp-db", 5432)]),
        endpoint_slice("reviews", [Ep(POD_IP)], "shop", [("http", 8080), ("tcp-db", 5432)]),
        pod,
        _security(
            "RequestAuthentication",
            "jwt",
            {"selector": selector, "jwtRules": [{"issuer": ISSUER, "jwksUri": JWKS_URI}]},
        ),
        _security(
            "RequestAuthentication",
            "gateway",
            {
                "targetRefs": [{"kind": "Gateway", "name": "ingress"}],
                "jwtRules": [{"issuer": "gw", "jwks": SigningKey().jwks()}],
            },
        ),
        _security(
            "AuthorizationPolicy",
            "alice",
            {"rules": [{"from": [{"source": {"requestPrincipals": [f"{ISSUER}/alice"]}}]}]},
        ),
    ]


async def test_debug_and_proxy_config_name_the_request_authentications(tmp_path: Path) -> None:
    async with (
        running_pilot(tmp_path, objects()) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        await fetch(client.delta_ads(node(POD_ID)))
        status, debug = await http_get(f"http://127.0.0.1:{pilot.http_port}/debug/authorizationz")
        output = await run_pilot(
            "proxy-config", "listeners", POD_ID, "--addr", pilot.grpc_target, "-o", "json"
        )
    assert status == 200
    by_name = {ra["name"]: ra for ra in debug["requestAuthentications"]}
    assert by_name["jwt"]["appliesTo"] == [POD_ID]
    assert by_name["jwt"]["issuers"] == [ISSUER]
    assert by_name["jwt"]["jwksUris"] == [JWKS_URI]
    assert by_name["jwt"]["scope"] == "workloads selected"
    assert by_name["gateway"]["appliesTo"] == []
    assert by_name["gateway"]["appliesToNoSidecar"] == "targetRef(s)"
    (sidecar,) = debug["proxies"]
    assert sidecar["requestAuthentications"] == ["shop/jwt"]
    authz = {r["match"]: r["authz"] for r in output.records() if r["port"] == 15006}
    http = [a for m, a in authz.items() if "8080" in str(m)]
    tcp = [a for m, a in authz.items() if "5432" in str(m)]
    assert http and all(a == "JWT shop/jwt; ALLOW shop/alice" for a in http), authz
    assert tcp and all(a == "ALLOW shop/alice" for a in tcp), authz
