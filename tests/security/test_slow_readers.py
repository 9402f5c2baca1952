"""A client that stops reading holds nothing of pilot's, and still learns why its stream ended.

A real `pilot discovery --config` with `PILOT_XDS_SEND_TIMEOUT=1s`. The client reads
nothing while pilot answers it with 1 MB (a delta EDS subscription to 1,000 long
names that do not exist, each answered in `removed_resources`), with BDP probing
off so that gRPC's 64 KiB window leaves that response stuck in flight. pilot must
end the stream (the send timeout, or a protocol error the client sends meanwhile),
let go of it at once, log nothing at ERROR, and, once the client reads again, send
the stuck response and then the status that says why.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.xds_client import ENDPOINT, node

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESH = Path(__file__).resolve().parents[2] / "examples" / "mesh.yaml"
WAIT = 10.0
NO_WINDOW_GROWTH = [("grpc.http2.bdp_probe", 0)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pilot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[PilotProcess]:
    folder = tmp_path_factory.mktemp("slow-readers")
    config = folder / "mesh.yaml"
    shutil.copy(MESH, config)
    process = await start_file_pilot_with_ca(folder, config, env={"PILOT_XDS_SEND_TIMEOUT": "1s"})
    try:
        yield process
    finally:
        await process.stop()


def _megabyte_of_names(node_id: str) -> discovery_pb2.DeltaDiscoveryRequest:
    return discovery_pb2.DeltaDiscoveryRequest(
        node=node(node_id),
        type_url=ENDPOINT,
        resource_names_subscribe=[f"missing-{i:04d}-" + "x" * 1000 for i in range(1000)],
    )


@dataclass(frozen=True)
class Ending:
    """How the stream is made to end while its response is stuck."""

    name: str
    second_request: discovery_pb2.DeltaDiscoveryRequest | None
    logged: str  # what pilot logs when it ends the stream
    code: grpc.StatusCode
    details: str


ENDINGS = [
    Ending(
        "send-timeout",
        None,
        "not reading its responses",
        grpc.StatusCode.UNAVAILABLE,
        "PILOT_XDS_SEND_TIMEOUT",
    ),
    Ending(
        "protocol-error",
        discovery_pb2.DeltaDiscoveryRequest(),  # no type_url on ADS
        "type_url is empty",
        grpc.StatusCode.INVALID_ARGUMENT,
        "type_url is empty",
    ),
]


@pytest.mark.parametrize("ending", ENDINGS, ids=[e.name for e in ENDINGS])
async def test_a_stream_ended_while_its_response_is_stuck_gets_its_status(
    pilot: PilotProcess, ending: Ending
) -> None:
    node_id = f"slow-reader-{ending.name}"
    mark = pilot.mark()
    async with grpc.aio.insecure_channel(
        pilot.target(tls=False), options=NO_WINDOW_GROWTH
    ) as channel:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        call = stub.DeltaAggregatedResources(timeout=3 * WAIT)
        await call.write(_megabyte_of_names(node_id))
        if ending.second_request is not None:
            await call.write(ending.second_request)
        await pilot.wait_logged(
            lambda e: ending.logged in e["msg"] and node_id in e["msg"],
            f"that pilot ended {node_id}'s stream",
            mark,
            WAIT,
        )
        rows = await pilot.get_json("/debug/connections")
        assert not [r for r in rows if r["proxy"] == node_id], "pilot still holds the stream"

        answers = 0
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _answer in call:  # the client reads at last
                answers += 1
    assert ended.value.code() == ending.code, ended.value.details()
    assert ending.details in (ended.value.details() or "")
    assert answers == 1, "the stuck response was lost"
    errors = [e["msg"] for e in pilot.log[mark:] if e["level"] == "error"]
    assert not errors, errors
