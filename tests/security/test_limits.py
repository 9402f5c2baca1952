"""Every bound, hit by a caller who asks for too much, next to an honest caller who does not.

A pilot of its own with small limits (set through their environment variables, as
an operator would). Each refusal is RESOURCE_EXHAUSTED with a message naming the
variable, is counted in `pilot_limit_hits_total{limit=...}`, and is logged; what
stays within the limit is served as before.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
import pytest_asyncio

from tests.support.mesh import cluster_name
from tests.support.peers import (
    ATTACKER,
    BARRIER_SERVICES,
    OPERATOR,
    VICTIM,
    WAIT,
    WORKLOAD,
    Account,
    Mesh,
    running_mesh,
    wait_streams,
)
from tests.support.xds_client import (
    ADS_DELTA,
    ADS_SOTW,
    CLUSTER,
    ENDPOINT,
    SECRET,
    Closed,
    DeltaRequest,
    DeltaStream,
    DiscoveryRequest,
    XdsClient,
    first_reply,
    node,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

NAMES = 2_000
LIMITS = {
    "PILOT_MAX_RESOURCE_NAMES": str(NAMES),
    "PILOT_MAX_REQUEST_BYTES": str(256 * 1024),
    "PILOT_MAX_NODE_BYTES": "4096",
    "PILOT_MAX_STREAMS": "40",
    "PILOT_MAX_STREAMS_PER_CONNECTION": "5",
    "PILOT_MAX_CERTIFICATES_PER_IDENTITY": "2",
    "PILOT_MAX_CERTIFICATES": "3",
    "PILOT_TOKEN_CACHE_SIZE": "2",
}


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def small(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    folder = tmp_path_factory.mktemp("limits")
    async with running_mesh(folder, "--plaintext-secrets", env=LIMITS) as mesh:
        yield mesh


async def _hits(mesh: Mesh, limit: str) -> float:
    status, text = await mesh.pilot.get("/metrics")
    assert status == 200
    match = re.search(rf'^pilot_limit_hits_total{{limit="{limit}"}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _check_refusal(closed: Closed | object, variable: str) -> None:
    assert isinstance(closed, Closed), f"served: {closed}"
    assert closed.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (
        f"{closed.code.name}: {closed.details}"
    )
    assert variable in closed.details


async def _refused_request(mesh: Mesh, limit: str, variable: str, request: DeltaRequest) -> None:
    """A delta ADS stream sending `request` is refused for `limit`, and counted.

    The blocking client (`first_reply`) reports the server's status even when the
    refusal beats the write, which grpc.aio's client does not.
    """
    before = await _hits(mesh, limit)
    closed = await first_reply(
        mesh.pilot.target(tls=False), ADS_DELTA, [request], token=mesh.tokens[VICTIM]
    )
    _check_refusal(closed, variable)
    assert await _hits(mesh, limit) == before + 1, f"pilot_limit_hits_total{{limit={limit!r}}}"


async def _refused_stream(
    mesh: Mesh, limit: str, variable: str, open_stream: Callable[[], DeltaStream]
) -> None:
    """A stream refused on admission (before any request: nothing is written), and counted."""
    before = await _hits(mesh, limit)
    closed = await open_stream().next_event(WAIT)
    _check_refusal(closed, variable)
    assert await _hits(mesh, limit) == before + 1, f"pilot_limit_hits_total{{limit={limit!r}}}"


def _eds(node_id: str, names: list[str], metadata: dict[str, str] | None = None) -> DeltaRequest:
    return DeltaRequest(
        node=node(node_id, metadata or VICTIM.metadata),
        type_url=ENDPOINT,
        resource_names_subscribe=names,
    )


def _client(mesh: Mesh, account: Account = VICTIM) -> XdsClient:
    return mesh.pilot.client(tls=False, token=mesh.tokens[account])


async def test_too_many_names_is_refused_and_the_limit_itself_is_served(small: Mesh) -> None:
    many = [f"outbound|80||missing-{i}.default.svc.cluster.local" for i in range(NAMES)]
    async with _client(small) as client:
        honest = client.delta_ads(node(small.node_id(), VICTIM.metadata))
        await honest.subscribe(ENDPOINT, many)
        answered = await honest.next_response(WAIT)
        assert len(answered.removed_resources) == NAMES, "every name answered (none exist)"
    await _refused_request(
        small, "resource_names", "PILOT_MAX_RESOURCE_NAMES", _eds(small.node_id(), [*many, "1"])
    )


async def test_a_request_seen_before_is_still_counted_against_each_stream(small: Mesh) -> None:
    """pilot decodes a request it saw byte for byte before only once, but the name limit
    depends on what each stream holds: the same bytes that one stream may send are
    refused from a stream they would take past the limit."""
    two = ["outbound|80||again-1.default.svc.cluster.local", "outbound|80||again-2.default.svc"]
    many = [f"outbound|80||held-{i}.default.svc.cluster.local" for i in range(NAMES - 1)]
    async with _client(small) as client:
        first = client.delta_ads(node(small.node_id(), VICTIM.metadata))
        await first.subscribe(ENDPOINT, ["outbound|80||first.default.svc.cluster.local"])
        await first.next_response(WAIT)
        await first.subscribe(ENDPOINT, two)  # no node: bytes any stream may send alike
        assert len((await first.next_response(WAIT)).removed_resources) == 2
        before = await _hits(small, "resource_names")
        second = client.delta_ads(node(small.node_id(), VICTIM.metadata))
        await second.subscribe(ENDPOINT, many)
        await second.next_response(WAIT)
        await second.subscribe(ENDPOINT, two)  # the same bytes: NAMES + 1 names for it
        _check_refusal(await second.next_event(WAIT), "PILOT_MAX_RESOURCE_NAMES")
        assert await _hits(small, "resource_names") == before + 1


async def test_a_request_too_big_is_refused(small: Mesh) -> None:
    huge = [f"{i:04d}" + "x" * 1000 for i in range(300)]  # 300 KB of names, over 256 KiB
    await _refused_request(
        small, "request_bytes", "PILOT_MAX_REQUEST_BYTES", _eds(small.node_id(), huge)
    )


async def test_a_node_too_big_is_refused(small: Mesh) -> None:
    metadata = VICTIM.metadata | {"PADDING": "p" * 8192}
    request = _eds(small.node_id(), [cluster_name(BARRIER_SERVICES[0])], metadata)
    await _refused_request(small, "node_bytes", "PILOT_MAX_NODE_BYTES", request)


async def _served(stream: DeltaStream) -> None:
    await stream.subscribe(ENDPOINT, [cluster_name(BARRIER_SERVICES[0])])
    await stream.ack_until(ENDPOINT, [cluster_name(BARRIER_SERVICES[0])], WAIT)


async def test_streams_per_connection_are_bounded_but_other_connections_are_not(
    small: Mesh,
) -> None:
    async with _client(small) as crowded, _client(small) as other:
        for _ in range(5):
            await _served(crowded.delta_ads(node(small.node_id(), VICTIM.metadata)))
        await _refused_stream(
            small,
            "streams_per_connection",
            "PILOT_MAX_STREAMS_PER_CONNECTION",
            lambda: crowded.delta_ads(node(small.node_id(), VICTIM.metadata)),
        )
        await _served(other.delta_ads(node(small.node_id(), VICTIM.metadata)))


async def _no_streams(mesh: Mesh) -> None:
    """Until pilot has seen every earlier test's streams end (they count against the limit)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while await mesh.pilot.get_json("/debug/connections"):
        assert loop.time() < deadline, "streams of earlier tests still open"
        await asyncio.sleep(0.02)  # polling pilot's view, with a deadline


async def test_streams_in_all_are_bounded(small: Mesh) -> None:
    await _no_streams(small)
    clients = [_client(small) for _ in range(9)]
    try:
        streams = [
            c.delta_ads(node(small.node_id(), VICTIM.metadata))
            for c in clients[:8]
            for _ in range(5)
        ]
        await asyncio.gather(*(_served(s) for s in streams))
        await _refused_stream(
            small,
            "streams",
            "PILOT_MAX_STREAMS",
            lambda: clients[8].delta_ads(node(small.node_id(), VICTIM.metadata)),
        )
    finally:
        for client in clients:
            await client.aclose()


async def _certificate_or_none(stream: DeltaStream) -> bool:
    """Subscribe to `default`: True once a certificate arrives, False if it is removed."""
    await stream.subscribe(SECRET, [WORKLOAD])
    while True:
        response = await stream.next_response(WAIT)
        await stream.ack(response)
        if any(r.name == WORKLOAD for r in response.resources):
            return True
        if WORKLOAD in response.removed_resources:
            return False


async def test_live_keys_are_bounded_per_identity_and_in_all(small: Mesh) -> None:
    before = await _hits(small, "certificates_per_identity")
    async with _client(small, VICTIM) as victims, _client(small, ATTACKER) as attackers:
        node_ids = [small.node_id() for _ in range(3)]
        mine = [victims.delta_ads(node(node_id, VICTIM.metadata)) for node_id in node_ids]
        got = [await _certificate_or_none(s) for s in mine]
        assert got == [True, True, False], "two keys for one identity, not three"
        assert await _hits(small, "certificates_per_identity") == before + 1
        theirs = [attackers.delta_ads(node(small.node_id(), ATTACKER.metadata)) for _ in range(2)]
        got = [await _certificate_or_none(s) for s in theirs]
        assert got == [True, False], "three keys in all"
        await mine[0].close()
        await wait_streams(small.pilot, node_ids[0], 0)
        again = attackers.delta_ads(node(small.node_id(), ATTACKER.metadata))
        assert await _certificate_or_none(again), "a key let go of makes room"


async def test_one_line_for_a_flood_of_unknown_secret_names(small: Mesh) -> None:
    node_id = small.node_id()
    mark = small.pilot.mark()
    names = [f"no-such-secret-{i}" for i in range(NAMES)]
    async with _client(small) as client:
        stream = client.delta_sds(node(node_id, VICTIM.metadata))
        await stream.subscribe(SECRET, names)
        answered = await stream.next_response(WAIT)
        assert len(answered.removed_resources) == NAMES
        await small.pilot.wait_logged(
            lambda e: node_id in e["msg"] and "does not make" in e["msg"], "the summary line", mark
        )
    lines = small.pilot.logged(lambda e: node_id in e["msg"] and e["level"] == "warning", mark)
    assert len(lines) == 1, [e["msg"][:120] for e in lines]
    assert str(NAMES) in lines[0]["msg"]


async def test_token_reviews_are_remembered_briefly_and_bounded(small: Mesh) -> None:
    reviewed = len(small.srv.token_reviews)
    async with _client(small) as client:
        streams = [client.delta_ads(node(small.node_id(), VICTIM.metadata)) for _ in range(4)]
        await asyncio.gather(*(_served(s) for s in streams))
    assert len(small.srv.token_reviews) - reviewed <= 1, "one review for one token"
    before = await _hits(small, "token_cache")
    for account in (VICTIM, ATTACKER, OPERATOR):  # three tokens, room for two answers
        async with _client(small, account) as client:
            await _served(client.delta_ads(node(small.node_id(), account.metadata)))
    assert await _hits(small, "token_cache") > before, "the oldest answer was forgotten"


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def slow(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    """A pilot admitting two new streams or calls a second."""
    folder = tmp_path_factory.mktemp("rate")
    env = {"PILOT_MAX_REQUESTS_PER_SECOND": "2"}
    async with running_mesh(folder, "--plaintext-secrets", env=env) as mesh:
        yield mesh


async def test_new_streams_beyond_the_rate_are_refused(slow: Mesh) -> None:
    """Twelve streams at once against two a second (a second's wait allowed): most refused."""
    request = DiscoveryRequest(
        type_url=CLUSTER, node=node(slow.node_id(), VICTIM.metadata), resource_names=[]
    )
    outcomes = await asyncio.gather(
        *(
            first_reply(
                slow.pilot.target(tls=False), ADS_SOTW, [request], token=slow.tokens[VICTIM]
            )
            for _ in range(12)
        )
    )
    refused = [o for o in outcomes if isinstance(o, Closed)]
    served = [o for o in outcomes if not isinstance(o, Closed)]
    assert served, "the rate admits some"
    assert len(refused) >= 6, f"only {len(refused)} of 12 refused at two a second"
    for closed in refused:
        assert closed.code == grpc.StatusCode.RESOURCE_EXHAUSTED, closed
        assert "PILOT_MAX_REQUESTS_PER_SECOND" in closed.details
    assert await _hits(slow, "requests_per_second") == len(refused)
