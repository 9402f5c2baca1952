"""CSDS and `pilot proxy-status`: what each proxy holds, as an operator asks for it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from envoy.admin.v3 import config_dump_shared_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

from pilot.xds import types
from tests.harness.envoy_process import wait_until
from tests.support.mesh import cluster_name, simple_mesh
from tests.support.pilot import RunningPilot, running_pilot

CSDS = "/envoy.service.status.v3.ClientStatusDiscoveryService"
DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
MESH = {"alpha": ["127.0.0.1"], "beta": ["127.0.0.2"]}


def _node(node_id: str) -> base_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update({"NAMESPACE": "shop", "SERVICE_ACCOUNT": node_id})
    return base_pb2.Node(id=node_id, metadata=metadata)


class Proxy:
    """A delta ADS stream standing in for an Envoy."""

    def __init__(self, channel: grpc.aio.Channel, node_id: str) -> None:
        self.call = channel.stream_stream(
            DELTA_ADS,
            request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString,
        )()
        self.node = _node(node_id)

    async def subscribe(
        self, type_url: str, names: list[str]
    ) -> discovery_pb2.DeltaDiscoveryResponse:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, resource_names_subscribe=names
        )
        if self.node is not None:
            request.node.CopyFrom(self.node)
            self.node = None
        await self.call.write(request)
        response: discovery_pb2.DeltaDiscoveryResponse = await asyncio.wait_for(
            self.call.read(), 10
        )
        return response

    async def reply(self, response: discovery_pb2.DeltaDiscoveryResponse, error: str = "") -> None:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=response.type_url, response_nonce=response.nonce
        )
        if error:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        await self.call.write(request)


async def _fetch(
    channel: grpc.aio.Channel, request: csds_pb2.ClientStatusRequest
) -> csds_pb2.ClientStatusResponse:
    call = channel.unary_unary(
        f"{CSDS}/FetchClientStatus",
        request_serializer=csds_pb2.ClientStatusRequest.SerializeToString,
        response_deserializer=csds_pb2.ClientStatusResponse.FromString,
    )
    response: csds_pb2.ClientStatusResponse = await call(request, timeout=10)
    return response


def _statuses(config: csds_pb2.ClientConfig) -> dict[tuple[str, str], int]:
    return {(c.type_url, c.name): c.config_status for c in config.generic_xds_configs}


@asynccontextmanager
async def _pilot_and_channel(
    tmp_path: Path,
) -> AsyncIterator[tuple[RunningPilot, grpc.aio.Channel]]:
    async with (
        running_pilot(tmp_path, simple_mesh(MESH)) as pilot,
        grpc.aio.insecure_channel(pilot.grpc_target) as channel,
    ):
        yield pilot, channel


async def test_statuses_follow_ack_nack_and_unanswered(tmp_path: Path) -> None:
    alpha, beta, missing = cluster_name("alpha"), cluster_name("beta"), "outbound|1||missing"
    async with _pilot_and_channel(tmp_path) as (_pilot, channel):
        proxy = Proxy(channel, "p1")
        await proxy.reply(await proxy.subscribe(types.CLUSTER, ["*"]))
        await proxy.reply(await proxy.subscribe(types.ENDPOINT, [alpha]))
        rejected = await proxy.subscribe(types.ENDPOINT, [beta, missing])
        await proxy.reply(rejected, error="bad endpoints")
        unanswered = await proxy.subscribe(types.SECRET, ["ROOTCA"])
        expected = {
            (types.CLUSTER, alpha): csds_pb2.SYNCED,
            (types.CLUSTER, beta): csds_pb2.SYNCED,
            (types.ENDPOINT, alpha): csds_pb2.SYNCED,
            (types.ENDPOINT, beta): csds_pb2.ERROR,
            (types.ENDPOINT, missing): csds_pb2.NOT_SENT,
            (types.SECRET, "ROOTCA"): csds_pb2.STALE,
        }

        async def current() -> dict[tuple[str, str], int]:
            (config,) = (await _fetch(channel, csds_pb2.ClientStatusRequest())).config
            return _statuses(config)

        await wait_until(current, 10, "statuses after ACK, NACK, no answer", until=expected.__eq__)
        await proxy.reply(unanswered)
        await wait_until(
            current,
            10,
            "ROOTCA SYNCED once ACKed",
            until=lambda statuses: statuses[(types.SECRET, "ROOTCA")] == csds_pb2.SYNCED,
        )
        (config,) = (await _fetch(channel, csds_pb2.ClientStatusRequest())).config
        errors = {
            c.name: (c.error_state.details, c.client_status)
            for c in config.generic_xds_configs
            if c.error_state.details
        }
        assert errors == {beta: ("bad endpoints", config_dump_shared_pb2.NACKED)}
        assert config.node.id == "p1"


async def test_node_matchers_contents_and_redacted_secrets(tmp_path: Path) -> None:
    async with _pilot_and_channel(tmp_path) as (_pilot, channel):
        first, second = Proxy(channel, "sidecar-a"), Proxy(channel, "gateway-b")
        await first.subscribe(types.ENDPOINT, [cluster_name("alpha")])
        await second.subscribe(types.ENDPOINT, [cluster_name("beta")])
        secret = await first.subscribe(types.SECRET, ["default"])
        await first.reply(secret)
        request = csds_pb2.ClientStatusRequest()
        request.node_matchers.add().node_id.prefix = "sidecar-"
        (config,) = (await _fetch(channel, request)).config
        assert config.node.id == "sidecar-a"
        dumped = {c.name: c for c in config.generic_xds_configs}
        held = secret_pb2.Secret()
        assert dumped["default"].xds_config.Unpack(held)
        assert held.tls_certificate.certificate_chain.inline_bytes.startswith(
            b"-----BEGIN CERTIFICATE"
        )
        assert held.tls_certificate.private_key.inline_string == "[redacted]"
        assert b"PRIVATE KEY" not in config.SerializeToString()
        lean = await _fetch(channel, csds_pb2.ClientStatusRequest(exclude_resource_contents=True))
        assert len(lean.config) == 2
        assert not any(
            c.HasField("xds_config") for cfg in lean.config for c in cfg.generic_xds_configs
        )


async def test_stream_client_status_answers_each_request(tmp_path: Path) -> None:
    async with _pilot_and_channel(tmp_path) as (_pilot, channel):
        await Proxy(channel, "p1").subscribe(types.ENDPOINT, [cluster_name("alpha")])
        call = channel.stream_stream(
            f"{CSDS}/StreamClientStatus",
            request_serializer=csds_pb2.ClientStatusRequest.SerializeToString,
            response_deserializer=csds_pb2.ClientStatusResponse.FromString,
        )()
        for _ in range(2):
            await call.write(csds_pb2.ClientStatusRequest())
            response = await asyncio.wait_for(call.read(), 10)
            assert [c.node.id for c in response.config] == ["p1"]
        await call.done_writing()


async def test_proxy_status_command_prints_one_row_per_proxy(tmp_path: Path) -> None:
    async with _pilot_and_channel(tmp_path) as (pilot, channel):
        proxy = Proxy(channel, "sidecar-1")
        clusters = await proxy.subscribe(types.CLUSTER, ["*"])
        await proxy.reply(clusters, error="nope")
        endpoints = [cluster_name("alpha"), cluster_name("beta")]
        await proxy.reply(await proxy.subscribe(types.ENDPOINT, endpoints))

        async def eds_synced() -> bool:
            (config,) = (await _fetch(channel, csds_pb2.ClientStatusRequest())).config
            eds = [s for (t, _), s in _statuses(config).items() if t == types.ENDPOINT]
            return eds == [csds_pb2.SYNCED] * 2

        await wait_until(eds_synced, 10, "pilot to have taken the EDS ACK")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pilot",
            "proxy-status",
            "--addr",
            pilot.grpc_target,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0
        header, row = out.decode().strip().splitlines()
        assert header.split() == ["NAME", "IDENTITY", "CDS", "EDS", "SDS"]
        identity = "spiffe://cluster.local/ns/shop/sa/sidecar-1"  # its metadata (--xds-auth none)
        assert row.split()[:2] == ["sidecar-1", identity]
        assert "ERROR (2/2)" in row and "SYNCED (2)" in row and row.endswith("-")
