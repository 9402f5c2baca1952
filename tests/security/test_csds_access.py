"""Who may read CSDS, and what: callers authenticate as xDS streams do.

Against the shared pilot (Kubernetes mode): no credentials is UNAUTHENTICATED;
a workload's token shows only the proxies of its own namespace; an account of
pilot's namespace, or one listed in PILOT_CSDS_TRUSTED_ACCOUNTS, sees every
proxy. A node matcher regex that backtracks catastrophically in a backtracking
engine is answered at once (RE2) while /ready keeps answering; patterns pilot
will not run (too long, not compiling, too many matchers) are INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc

from tests.support.peers import (
    ATTACKER,
    AUDITOR,
    OPERATOR,
    VICTIM,
    WORKLOAD,
    Account,
    Mesh,
    Route,
    attacker,
    attacks,
    gets_its_secrets,
    victim,
    wait_streams,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")


@dataclass
class Two:
    node_ids: tuple[str, str]  # the victim's, the attacker's own


@pytest_asyncio.fixture(loop_scope="package")
async def two(mesh: Mesh) -> AsyncIterator[Two]:
    """A proxy of ns-b and one of ns-a (each on a node id of its own), holding certificates."""
    good_id, bad_id = mesh.node_id(), mesh.node_id()
    good = victim(mesh, good_id, tls=True, delta=False)
    route = Route("ads-delta-default", "ads", delta=True, names=(WORKLOAD,))
    bad = attacker(mesh, bad_id, tls=True, route=route, claims=ATTACKER)
    try:
        await gets_its_secrets(good)
        await attacks(mesh, bad, route, mesh.pilot.mark())
        await wait_streams(mesh.pilot, good_id, 1)
        await wait_streams(mesh.pilot, bad_id, 1)
        yield Two((good_id, bad_id))
    finally:
        await bad.close()
        await good.close()


async def _seen(mesh: Mesh, reader: Account | None, node_ids: tuple[str, ...]) -> set[str]:
    token = mesh.tokens[reader] if reader is not None else None
    async with mesh.pilot.client(tls=True, token=token) as client:
        status = await client.client_status(node_ids)
    return {config.node.id for config in status.config}


async def test_csds_without_credentials_is_unauthenticated(mesh: Mesh, two: Two) -> None:
    for tls in (True, False):
        async with mesh.pilot.client(tls=tls, token=None) as client:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.client_status(two.node_ids)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("reader", "sees"),
    [(VICTIM, (0,)), (ATTACKER, (1,)), (OPERATOR, (0, 1)), (AUDITOR, (0, 1))],
    ids=["victim", "attacker", "pilot-namespace", "trusted-account"],
)
async def test_a_reader_sees_its_own_namespace_unless_trusted(
    mesh: Mesh, two: Two, reader: Account, sees: tuple[int, ...]
) -> None:
    seen = await _seen(mesh, reader, two.node_ids)
    assert seen == {two.node_ids[i] for i in sees}, f"{reader} read {sorted(seen)}"


async def test_a_catastrophic_regex_is_answered_at_once(mesh: Mesh, two: Two) -> None:
    request = csds_pb2.ClientStatusRequest(exclude_resource_contents=True)
    request.node_matchers.add().node_id.safe_regex.regex = "(.|.)*Z"
    async with mesh.pilot.client(tls=True, token=mesh.tokens[OPERATOR]) as client:
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(client.channel)
        # A backtracking engine takes minutes on these node ids: the deadline would expire.
        response = await stub.FetchClientStatus(request, timeout=5, metadata=client.metadata)
    assert [c.node.id for c in response.config if c.node.id in two.node_ids] == []
    status, _ = await mesh.pilot.get("/ready")
    assert status == 200, "pilot's event loop still answers"


@pytest.mark.parametrize(
    "matchers",
    [["a" * 5000], ["(unclosed"], ["x"] * 100],
    ids=["too-long", "does-not-compile", "too-many"],
)
async def test_matchers_pilot_will_not_run_are_invalid(mesh: Mesh, matchers: list[str]) -> None:
    request = csds_pb2.ClientStatusRequest()
    for pattern in matchers:
        request.node_matchers.add().node_id.safe_regex.regex = pattern
    async with mesh.pilot.client(tls=True, token=mesh.tokens[OPERATOR]) as client:
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(client.channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.FetchClientStatus(request, timeout=5, metadata=client.metadata)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details()
