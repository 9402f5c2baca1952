"""Istio's defaults with no traffic config, seen through real Envoys: retries that move to
another host, and LEAST_REQUEST.

The mesh of tests/integration/mesh_pods.py (pod a's app behind its sidecar, pods d
and e serving `details`, no VirtualService or DestinationRule anywhere). When e's
app is gone but e is still in the EndpointSlice (a crashed container before its
readiness probe notices), Istio's default retry policy on a's route sends each
request that met e's refused connection on to d (previous_hosts): the app gets a
200 (all but about one request in 2,000, whose 5 picks of another host all fell
on e). An app's own 503 is not retried (Istio lists no retriable status codes).
A hundred requests at once retry as many times at once as they need: the
cluster's circuit breakers are Istio's (Envoy's own allow 3 retries at once).
What a's Envoy holds says the same: the route's retry policy, the cluster's
LEAST_REQUEST and thresholds.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    APP_UID,
    PORT,
    Mesh,
    cluster_of,
    details_objects,
    module_mesh,
    pod_address,
    requests_from,
)
from tests.support.pods import Pod

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

# Requests one after another. Each first attempt meets e about half the time. Were
# retries to pick hosts at random, one request in 8 would meet e three times (about 12
# of 100 answered 503, and 1 or none with odds of 1 in 100,000). With previous_hosts a
# retry meets e again only when Envoy's 5 picks of another host all fell on e (1 in 32
# when both hosts are idle), so a 503 is about 1 in 2,000 requests: at most one is let by.
REQUESTS = 100
FAILURES_LET_BY = 1
ISTIO_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"
CONCURRENT = 100  # requests at once: far more retries in their backoff than Envoy's 3

mesh = module_mesh("default-retries")


def _url(path: str) -> str:
    return f"http://details.{APP_NAMESPACE}:{PORT}{path}"


async def _details_host(mesh: Mesh) -> dict[str, Any]:
    """The virtual host a's Envoy holds for details in route configuration PORT."""
    dump = await mesh.frontend.admin_json("/config_dump", resource="dynamic_route_configs")
    for entry in dump.get("configs", []):
        for host in entry.get("route_config", {}).get("virtual_hosts", []):
            if f"details.{APP_NAMESPACE}" in host.get("domains", []):
                return dict(host)
    pytest.fail(f"a's Envoy holds no virtual host for details: {dump}")


async def _parallel_requests_from(pod: Pod, urls: list[str]) -> list[int]:
    """GET every URL from `pod`'s app at once (curl --parallel): each status, in the
    order they ended."""
    argv = ["curl", "-sS", "--max-time", "10", "--parallel", "--parallel-immediate"]
    argv += ["--parallel-max", str(len(urls)), "-w", "%{http_code}\\n"]
    for url in urls:
        argv += ["-o", "/dev/null", url]
    _, out, _ = await pod.run(*argv, uid=APP_UID)
    return [int(code) for code in out.split()]


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
    [thresholds] = cluster.get("circuit_breakers", {}).get("thresholds", [{}])
    assert thresholds.get("max_retries") == 2**32 - 1, f"Envoy's 3 concurrent retries: {cluster}"
    host = await _details_host(mesh)
    assert host.get("include_request_attempt_count") is True, host
    [route] = host["routes"]
    policy = route["route"].get("retry_policy", {})
    assert isinstance(policy, dict), policy
    assert policy.get("retry_on") == ISTIO_RETRY_ON, f"details' route retries {policy}"
    assert policy.get("num_retries") == 2, policy
    predicates = [predicate.get("name") for predicate in policy.get("retry_host_predicate", [])]
    assert predicates == [PREVIOUS_HOSTS], policy
    assert policy.get("host_selection_retry_max_attempts") == "5", policy


async def test_an_apps_own_503_reaches_the_caller_unretried(mesh: Mesh) -> None:
    """Istio lists no retriable status codes: `retriable-status-codes` retries nothing, so a
    request the app answered (even 503) is never sent to it twice."""
    ratings = cluster_of("ratings")
    retried = await mesh.frontend.cluster_stat(ratings, "upstream_rq_retry")
    path = f"/status/503/{secrets.token_hex(4)}"
    url = f"http://ratings.{APP_NAMESPACE}:{PORT}{path}"
    assert await requests_from(mesh.pod("a"), [url]) == [503]
    await mesh.backends["c"].wait_seen(path)
    seen = [seen for seen in mesh.backends["c"].seen() if seen.path == path]
    assert len(seen) == 1, f"ratings' app got the request {len(seen)} times"
    assert await mesh.frontend.cluster_stat(ratings, "upstream_rq_retry") == retried


async def test_a_refused_connection_is_retried_on_the_other_host(mesh: Mesh) -> None:
    """e's app is gone, e still in the slice: the requests that met e reach d by a retry."""
    for obj in details_objects(["d", "e"]):
        mesh.api.apply(obj)
    expected = {(pod_address("d"), PORT), (pod_address("e"), PORT)}
    await mesh.frontend.wait_hosts(cluster_of("details"), expected, "both endpoints")
    await mesh.frontend.wait_route("details")
    await mesh.backends["e"].process.stop()  # e's port 9080 now refuses connections
    details = cluster_of("details")
    before = {
        stat: await mesh.frontend.cluster_stat(details, stat)
        for stat in ("upstream_rq_retry", "upstream_cx_connect_fail")
    }
    paths = [f"/retried-{secrets.token_hex(4)}" for _ in range(REQUESTS)]
    statuses = await requests_from(mesh.pod("a"), [_url(path) for path in paths])
    failed = REQUESTS - statuses.count(200)
    assert failed <= FAILURES_LET_BY, (
        f"with e refusing, {failed} of {REQUESTS} answered {set(statuses) - {200}}: retries"
        " went back to the host that refused them (no previous_hosts), or none were made"
    )
    for path, status in zip(paths, statuses, strict=True):
        if status == 200:
            await mesh.backends["d"].wait_seen(path)
    after = {stat: await mesh.frontend.cluster_stat(details, stat) for stat in before}
    delta = {stat: after[stat] - before[stat] for stat in before}
    assert delta["upstream_cx_connect_fail"] > 0, f"no request met e's refusal: {delta}"
    assert delta["upstream_rq_retry"] > 0, f"a's Envoy retried nothing: {delta}"
    mesh.assert_nothing_restarted()


async def test_many_retries_at_once_are_not_cut_short(mesh: Mesh) -> None:
    """Requests at once, e still refusing: Envoy's own limit of 3 concurrent retries
    would answer most of them 503 (`upstream_rq_retry_overflow`); Istio's has none.

    A few may still meet e three times: with d busy, LEAST_REQUEST prefers the idle e
    for 3 picks in 4, so 5 picks of another host all fall on e about once in 4, and a
    request fails about once in 25 (under Istio too; outlier detection, a
    DestinationRule's, is what takes e out)."""
    for obj in details_objects(["d", "e"]):
        mesh.api.apply(obj)
    expected = {(pod_address("d"), PORT), (pod_address("e"), PORT)}
    await mesh.frontend.wait_hosts(cluster_of("details"), expected, "both endpoints")
    await mesh.backends["e"].process.stop()  # (already, if the test above ran)
    details = cluster_of("details")
    overflowed = await mesh.frontend.cluster_stat(details, "upstream_rq_retry_overflow")
    urls = [_url(f"/at-once-{secrets.token_hex(4)}") for _ in range(CONCURRENT)]
    statuses = await _parallel_requests_from(mesh.pod("a"), urls)
    overflow = await mesh.frontend.cluster_stat(details, "upstream_rq_retry_overflow")
    assert overflow == overflowed, (
        f"{overflow - overflowed} retries overflowed; {statuses.count(200)} of {CONCURRENT}"
        " answered 200"
    )
    assert len(statuses) == CONCURRENT and set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= CONCURRENT * 0.8, f"{statuses.count(200)} answered 200"
    mesh.assert_nothing_restarted()
