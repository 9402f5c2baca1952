"""Istio's defaults with no traffic config, seen through real Envoys: retries that move to
another host, and LEAST_REQUEST.

The mesh of tests/integration/mesh_pods.py (pod a's app behind its sidecar, pods d
and e serving `details`, no VirtualService or DestinationRule anywhere). When e's
app is gone but e is still in the EndpointSlice (a crashed container before its
readiness probe notices), Istio's default retry policy on a's route sends each
request that met e's refused connection on to d (previous_hosts): the app gets a
200 every time, and every retry Envoy makes succeeds. What a's Envoy holds says
the same: the route's retry policy and the cluster's LEAST_REQUEST.
"""

from __future__ import annotations

import secrets

import pytest

from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    PORT,
    Mesh,
    cluster_of,
    details_objects,
    module_mesh,
    pod_address,
    requests_from,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

# Enough that, were retries to pick hosts at random, some request would fail or some
# retry would meet e again: each first attempt meets e about half the time.
REQUESTS = 60
ISTIO_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"

mesh = module_mesh("default-retries")


def _url(path: str) -> str:
    return f"http://details.{APP_NAMESPACE}:{PORT}{path}"


async def _details_route(mesh: Mesh) -> dict[str, object]:
    """The route a's Envoy holds for details in route configuration PORT."""
    dump = await mesh.frontend.admin_json("/config_dump", resource="dynamic_route_configs")
    for entry in dump.get("configs", []):
        for host in entry.get("route_config", {}).get("virtual_hosts", []):
            if f"details.{APP_NAMESPACE}" in host.get("domains", []):
                [route] = host["routes"]
                return dict(route["route"])
    pytest.fail(f"a's Envoy holds no virtual host for details: {dump}")


async def test_with_no_config_a_sidecar_holds_istios_retries_and_least_request(
    mesh: Mesh,
) -> None:
    for obj in details_objects(["d", "e"]):
        mesh.api.apply(obj)
    expected = {(pod_address("d"), PORT), (pod_address("e"), PORT)}
    await mesh.frontend.wait_hosts(cluster_of("details"), expected, "both endpoints")
    await mesh.frontend.wait_route("details")
    cluster = (await mesh.frontend.clusters())[cluster_of("details")]
    assert cluster.get("lb_policy") == "LEAST_REQUEST", f"details' cluster: {cluster}"
    policy = (await _details_route(mesh)).get("retry_policy", {})
    assert isinstance(policy, dict), policy
    assert policy.get("retry_on") == ISTIO_RETRY_ON, f"details' route retries {policy}"
    assert policy.get("num_retries") == 2, policy
    predicates = [predicate.get("name") for predicate in policy.get("retry_host_predicate", [])]
    assert predicates == [PREVIOUS_HOSTS], policy
    assert policy.get("host_selection_retry_max_attempts") == "5", policy


async def test_a_refused_connection_is_retried_on_the_other_host(mesh: Mesh) -> None:
    """e's app is gone, e still in the slice: every request reaches d, by one retry at most."""
    for obj in details_objects(["d", "e"]):
        mesh.api.apply(obj)
    expected = {(pod_address("d"), PORT), (pod_address("e"), PORT)}
    await mesh.frontend.wait_hosts(cluster_of("details"), expected, "both endpoints")
    await mesh.frontend.wait_route("details")
    await mesh.backends["e"].process.stop()  # e's port 9080 now refuses connections
    details = cluster_of("details")
    before = {
        stat: await mesh.frontend.cluster_stat(details, stat)
        for stat in ("upstream_rq_retry", "upstream_rq_retry_success", "upstream_cx_connect_fail")
    }
    paths = [f"/retried-{secrets.token_hex(4)}" for _ in range(REQUESTS)]
    statuses = await requests_from(mesh.pod("a"), [_url(path) for path in paths])
    assert statuses == [200] * REQUESTS, f"with e refusing, details answered {statuses}"
    for path in paths:
        await mesh.backends["d"].wait_seen(path)
    after = {stat: await mesh.frontend.cluster_stat(details, stat) for stat in before}
    delta = {stat: after[stat] - before[stat] for stat in before}
    assert delta["upstream_cx_connect_fail"] > 0, f"no request met e's refusal: {delta}"
    assert delta["upstream_rq_retry"] > 0, f"a's Envoy retried nothing: {delta}"
    assert delta["upstream_rq_retry_success"] == delta["upstream_rq_retry"], (
        f"a retry went back to the host that refused it (no previous_hosts): {delta}"
    )
    mesh.assert_nothing_restarted()
