"""istio.io's traffic-management tasks, followed on pilot with real Envoys and real backends.

The pods of tests/integration/bookinfo_pods.py: productpage's app (curl) behind its
sidecar calls reviews, whose pods v1, v2 and v3 answer with their version; v2, behind
a sidecar of its own, calls ratings first. Each test writes the registry file with
the task's YAML as istio.io gives it (the reviews and ratings DestinationRules of
samples/bookinfo/networking/destination-rule-all.yaml, then the task's VirtualServices
or DestinationRule, kept as files in traffic_tasks/), waits for the Envoys to hold it,
and sends real requests. Where a task's object is for a service this mesh does not
have (httpbin), or for ratings where only bookinfo's web page would show its effect
(the fault-injection abort), its YAML is applied to reviews, changed in its host
only. After each, neither Envoy has rejected anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pilot.builders.virtual_routes import FAULT_FILTER
from tests.integration.agent_process import PILOT
from tests.integration.bookinfo_pods import (
    BOOKINFO_SUBSETS,
    PORT,
    RATINGS_HOST,
    REVIEWS_HOST,
    TOKEN,
    Answer,
    Bookinfo,
    istio_yaml,
    module_bookinfo,
    subset_cluster,
)
from tests.integration.http_backend import Called, parse_called
from tests.support.envoy_process import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

bookinfo = module_bookinfo("traffic-tasks")
TASKS = Path(__file__).parent / "traffic_tasks"


def _task(name: str) -> str:
    """The YAML of a task's object, as istio.io gives it (tests/integration/traffic_tasks)."""
    return (TASKS / f"{name}.yaml").read_text()


ALL_V1 = _task("virtual-service-all-v1")
JASON_V2 = _task("virtual-service-reviews-test-v2")
FIFTY_V3 = _task("virtual-service-reviews-50-v3")
EIGHTY_TWENTY = _task("virtual-service-reviews-80-20")
ABORT_FOR_JASON = _task("virtual-service-reviews-test-abort")
REVIEWS_V2 = _task("virtual-service-reviews-v2")
RATINGS_DELAY = _task("virtual-service-ratings-delay")
TIMEOUT_V2 = _task("virtual-service-reviews-timeout")
RETRIES_V1 = _task("virtual-service-reviews-retries")
CIRCUIT_BREAKER = _task("destination-rule-reviews-circuit-breaker")
MISSING_SUBSET = _task("virtual-service-reviews-missing-subset")


def _subsets_plus(text: str) -> list[dict[str, Any]]:
    return istio_yaml(BOOKINFO_SUBSETS) + istio_yaml(text)


def _clusters_of(routes: list[dict[str, Any]]) -> list[str]:
    names = []
    for route in routes:
        action = route.get("route", {})
        names += [action["cluster"]] if "cluster" in action else []
        names += [c["name"] for c in action.get("weighted_clusters", {}).get("clusters", [])]
    return names


async def _applied(bookinfo: Bookinfo, text: str, clusters: list[str]) -> list[dict[str, Any]]:
    """Write bookinfo, reviews' subsets and `text`; wait for productpage to route to
    `clusters` (in its routes' order) with every subset cluster's pod held."""
    bookinfo.apply(*_subsets_plus(text))
    routes = await bookinfo.wait_routes(
        f"to {clusters}", lambda routes: _clusters_of(routes) == clusters
    )
    await bookinfo.wait_subsets()
    return routes


async def _assert_nothing_rejected(bookinfo: Bookinfo) -> None:
    rejected = await bookinfo.rejected()
    assert rejected and not any(rejected.values()), f"an Envoy rejected {rejected}"


async def test_request_routing_all_to_v1_then_jason_to_v2(bookinfo: Bookinfo) -> None:
    await _applied(bookinfo, ALL_V1, [subset_cluster("v1")])
    assert await bookinfo.versions(30) == {"reviews-v1": 30}
    await _applied(bookinfo, JASON_V2, [subset_cluster("v2"), subset_cluster("v1")])
    assert await bookinfo.versions(20, ["end-user: jason"]) == {"reviews-v2": 20}
    assert await bookinfo.versions(20, ["end-user: someone-else"]) == {"reviews-v1": 20}
    assert await bookinfo.versions(20) == {"reviews-v1": 20}
    await _assert_nothing_rejected(bookinfo)


REQUESTS = 600
TOLERANCE = 0.06  # 50/50 over 600: 3 standard deviations are 6 points


@pytest.mark.parametrize(
    ("text", "shares"),
    [(FIFTY_V3, {"reviews-v1": 0.5, "reviews-v3": 0.5}),
     (EIGHTY_TWENTY, {"reviews-v1": 0.8, "reviews-v2": 0.2})],
    ids=["50-50", "80-20"],
)  # fmt: skip
async def test_traffic_shifting_splits_as_weighted(
    bookinfo: Bookinfo, text: str, shares: dict[str, float]
) -> None:
    versions = sorted(shares)
    await _applied(bookinfo, text, [subset_cluster(v.removeprefix("reviews-")) for v in versions])
    counts = await bookinfo.versions(REQUESTS)
    assert set(counts) == set(shares), f"answers {counts}"
    for version, share in shares.items():
        seen = counts[version] / REQUESTS
        assert abs(seen - share) <= TOLERANCE, f"{version}: {seen:.3f} of {counts}, not {share}"
    await _assert_nothing_rejected(bookinfo)


async def test_fault_injection_aborts_jasons_requests_with_500(bookinfo: Bookinfo) -> None:
    await _applied(bookinfo, ABORT_FOR_JASON, [subset_cluster("v1"), subset_cluster("v1")])
    assert await bookinfo.versions(20, ["end-user: jason"]) == {"500": 20}
    assert await bookinfo.versions(20) == {"reviews-v1": 20}
    aborts = await bookinfo.productpage.stats(r"\.fault\.aborts_injected$")
    assert sum(aborts.values()) >= 20, aborts
    await _assert_nothing_rejected(bookinfo)


DELAY = 2.0  # seconds: ratings' injected delay (virtual-service-ratings-delay)
TIMEOUT = 0.5  # seconds: reviews' request timeout (virtual-service-reviews-timeout)
TIMED_OUT_WITHIN = 1.5  # seconds: well under DELAY, so the timeout, not ratings, ended it
LATE = 0.05  # seconds a timer may seem early by, as curl measures it


def _route_timeout(routes: list[dict[str, Any]]) -> float | None:
    """The first route's timeout in seconds (0: none), None when there is no route."""
    timeout = routes[0].get("route", {}).get("timeout", "0s") if routes else None
    return None if timeout is None else float(timeout.removesuffix("s"))


def _delayed_to_ratings_v1(routes: list[dict[str, Any]]) -> bool:
    """Ratings' routes are the task's: to subset v1, each request delayed 2 s first."""
    faults = [r.get("typed_per_filter_config", {}).get(FAULT_FILTER, {}) for r in routes]
    delays = [f.get("delay", {}).get("fixed_delay") for f in faults]
    return _clusters_of(routes) == [subset_cluster("v1", RATINGS_HOST)] and delays == ["2s"]


async def _timeouts_task_applied(bookinfo: Bookinfo, reviews: str, seconds: float) -> None:
    """Write bookinfo's rules, `reviews` (a VirtualService to v2) and ratings' delay; wait
    until productpage routes reviews to v2 with a timeout of `seconds` (0: none) and
    reviews-v2 routes ratings to v1 after the delay, every subset's pod held."""
    bookinfo.apply(*_subsets_plus(reviews), *istio_yaml(RATINGS_DELAY))
    await bookinfo.wait_routes(
        f"to v2, timeout {seconds} s",
        lambda r: _clusters_of(r) == [subset_cluster("v2")] and _route_timeout(r) == seconds,
    )
    what = "to v1 after a 2 s delay"
    await bookinfo.wait_routes(what, _delayed_to_ratings_v1, bookinfo.reviews_v2, RATINGS_HOST)
    await bookinfo.wait_subsets()
    await bookinfo.wait_ratings_v1()


async def _delays_injected(bookinfo: Bookinfo) -> int:
    """How many requests reviews-v2's Envoy has delayed (its fault filters' count)."""
    return sum((await bookinfo.reviews_v2.stats(r"\.fault\.delays_injected$")).values())


async def _v2_calls(bookinfo: Bookinfo, count: int) -> list[Called]:
    """Once reviews-v2's backend has said so, its calls to ratings (at least `count`)."""

    def calls() -> list[Called]:
        lines = bookinfo.backends["v2"].lines
        return [called for line in lines if (called := parse_called(line)) is not None]

    return await wait_until(
        calls, 10.0, f"{count} calls from reviews-v2",
        until=lambda c: len(c) >= count, context=bookinfo.backends["v2"].tail,
    )  # fmt: skip


async def _productpage_timeouts(bookinfo: Bookinfo) -> int:
    """How many of productpage's requests to reviews' v2 its Envoy timed out."""
    return await bookinfo.productpage.cluster_stat(subset_cluster("v2"), "upstream_rq_timeout")


async def _two_seconds_through_ratings(bookinfo: Bookinfo) -> list[Answer]:
    """Two requests of productpage's, each answered by v2 after its call to ratings."""
    delays, before = await _delays_injected(bookinfo), len(await _v2_calls(bookinfo, 0))
    answers = await bookinfo.requests(2)
    assert [(a.status, a.body) for a in answers] == [(200, "reviews-v2")] * 2, answers
    calls = (await _v2_calls(bookinfo, before + 2))[before:]
    assert [(c.status, c.body) for c in calls] == [(200, "ratings-v1")] * 2, calls
    assert all(c.seconds >= DELAY - LATE for c in calls), calls
    assert await _delays_injected(bookinfo) - delays == 2
    return answers


async def test_request_timeouts_a_half_second_on_reviews_cuts_ratings_delay_to_504(
    bookinfo: Bookinfo,
) -> None:
    """istio.io's request-timeouts task as written: reviews to v2, which calls ratings;
    ratings delayed 2 s; then reviews' timeout of half a second."""
    await _timeouts_task_applied(bookinfo, REVIEWS_V2, 0)
    slow = await _two_seconds_through_ratings(bookinfo)
    assert all(a.seconds >= DELAY - LATE for a in slow), slow

    await _timeouts_task_applied(bookinfo, TIMEOUT_V2, TIMEOUT)
    timeouts, delays = await _productpage_timeouts(bookinfo), await _delays_injected(bookinfo)
    answers = await bookinfo.requests(3)
    assert [(a.status, a.body) for a in answers] == [(504, "upstream request timeout")] * 3
    assert all(TIMEOUT - LATE <= a.seconds < TIMED_OUT_WITHIN for a in answers), answers
    assert await _productpage_timeouts(bookinfo) - timeouts == 3
    # Each request still reached v2, whose call to ratings its Envoy delayed.
    assert await _delays_injected(bookinfo) - delays == 3
    await _assert_nothing_rejected(bookinfo)


async def test_retries_turn_a_backends_first_503_into_a_200(bookinfo: Bookinfo) -> None:
    await _applied(bookinfo, RETRIES_V1, [subset_cluster("v1")])
    await bookinfo.restart_backend("v1", "--fail-first", "1")
    try:
        [answer] = await bookinfo.requests(1)
        assert (answer.status, answer.body) == (200, "reviews-v1")
        await bookinfo.backends["v1"].wait_line('"path": "/reviews/0"', within=5.0)
        seen = [line for line in bookinfo.backends["v1"].lines if line.startswith("seen ")]
        assert len(seen) == 2, f"v1 saw {seen}: the first 503, then the retry"
        retries = await bookinfo.productpage.cluster_stat(subset_cluster("v1"), "upstream_rq_retry")
        assert retries >= 1
    finally:
        await bookinfo.restart_backend("v1")
    await _assert_nothing_rejected(bookinfo)


async def _circuit_breaker_held(bookinfo: Bookinfo, cluster: str) -> None:
    """Until productpage's Envoy holds `cluster` with the rule's pool and outlier detection
    (and every subset cluster with its pod)."""

    async def held() -> dict[str, Any]:
        return dict((await bookinfo.productpage.clusters()).get(cluster, {}))

    await wait_until(
        held, 20.0, f"{cluster} with the circuit breaker",
        until=lambda c: "circuit_breakers" in c and "outlier_detection" in c,
    )  # fmt: skip
    await bookinfo.wait_subsets()


async def test_circuit_breaking_overflows_concurrent_requests_with_503(bookinfo: Bookinfo) -> None:
    bookinfo.apply(*istio_yaml(CIRCUIT_BREAKER), *istio_yaml(ALL_V1))
    await bookinfo.wait_routes("all to v1", lambda r: _clusters_of(r) == [subset_cluster("v1")])
    await _circuit_breaker_held(bookinfo, subset_cluster("v1"))
    await bookinfo.restart_backend("v1", "--delay", "0.3")
    try:
        before = await bookinfo.productpage.cluster_stat(
            subset_cluster("v1"), "upstream_rq_pending_overflow"
        )
        statuses = await bookinfo.concurrent_statuses(20, parallel=10)
        assert statuses[200] > 0 and statuses[503] > 0, f"statuses {statuses}"
        assert set(statuses) == {200, 503}, statuses
        overflow = await bookinfo.productpage.cluster_stat(
            subset_cluster("v1"), "upstream_rq_pending_overflow"
        )
        assert overflow - before == statuses[503]
    finally:
        await bookinfo.restart_backend("v1")
    await _assert_nothing_rejected(bookinfo)


async def test_outlier_detection_ejects_a_failing_v3(bookinfo: Bookinfo) -> None:
    """No VirtualService: reviews' own cluster over v1, v2, v3; v3 answers 500."""
    await bookinfo.restart_backend("v3", "--status", "500")
    try:
        bookinfo.apply(*istio_yaml(CIRCUIT_BREAKER))
        await bookinfo.wait_routes(
            "the default route", lambda r: [x.get("name") for x in r] == ["default"]
        )
        main = f"outbound|{PORT}||{REVIEWS_HOST}"
        await _circuit_breaker_held(bookinfo, main)

        async def ejected() -> int:
            await bookinfo.requests(3)
            return await bookinfo.productpage.cluster_stat(
                main, "outlier_detection.ejections_enforced_total"
            )

        await wait_until(ejected, 20.0, "v3 ejected", until=lambda n: n >= 1)

        counts = await bookinfo.versions(60)
        # Without the ejection v3 would answer a third. A request or two may still meet it
        # while Envoy's workers take the new host set (the count moves first).
        assert counts["500"] <= 2, f"after v3's ejection: {counts}"
        assert counts["reviews-v1"] + counts["reviews-v2"] + counts["500"] == 60, counts
        active = await bookinfo.productpage.cluster_stat(main, "outlier_detection.ejections_active")
        assert active == 1
    finally:
        await bookinfo.restart_backend("v3")
    await _assert_nothing_rejected(bookinfo)


async def _proxy_config_routes(bookinfo: Bookinfo) -> tuple[int, str, str]:
    """`pilot proxy-config routes` of productpage, as JSON, with productpage's token."""
    token = bookinfo.folder / "productpage-token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    return await bookinfo.network["istiod"].run(
        str(PILOT), "proxy-config", "routes", bookinfo.productpage_node_id(),
        "--addr", f"127.0.0.1:{bookinfo.pilot.grpc_port}", "--token-file", str(token),
        "-o", "json",
    )  # fmt: skip


async def test_proxy_config_routes_shows_the_match_weights_timeout_and_retries(
    bookinfo: Bookinfo,
) -> None:
    """`pilot proxy-config routes` on productpage, run beside pilot as an operator would."""
    await _applied(bookinfo, JASON_V2, [subset_cluster("v2"), subset_cluster("v1")])
    status, out, err = await _proxy_config_routes(bookinfo)
    assert status == 0, err
    rows = [
        (r["match"], r["destination"], r["retries"], r["timeout"])
        for r in json.loads(out)
        if r["vhost_name"] == f"{REVIEWS_HOST}:{PORT}"
    ]
    istio = "2 on connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    assert rows == [
        (
            "/* [end-user=jason]",
            f"Cluster: {subset_cluster('v2')}",
            f"{istio}; another host",
            "none",
        ),
        ("/*", f"Cluster: {subset_cluster('v1')}", f"{istio}; another host", "none"),
    ]
    await _applied(bookinfo, EIGHTY_TWENTY, [subset_cluster("v1"), subset_cluster("v2")])
    _, out, _ = await _proxy_config_routes(bookinfo)
    [shift] = [
        r["destination"] for r in json.loads(out) if r["vhost_name"].startswith(REVIEWS_HOST)
    ]
    assert shift == f"Clusters: {subset_cluster('v1')}=80,{subset_cluster('v2')}=20"


async def test_a_subset_no_rule_defines_answers_503_and_envoy_rejects_nothing(
    bookinfo: Bookinfo,
) -> None:
    """As with istiod: the route names the missing cluster, Envoy answers 503 for it, and
    the rest of the route configuration serves."""
    await _applied(bookinfo, MISSING_SUBSET, [subset_cluster("v9"), subset_cluster("v1")])
    assert await bookinfo.versions(10, ["end-user: jason"]) == {"503": 10}
    assert await bookinfo.versions(10) == {"reviews-v1": 10}
    await _assert_nothing_rejected(bookinfo)
