"""`Proxy`: a delta ADS stream driven by hand over a gRPC channel, standing in for an
Envoy whose node metadata names namespace `shop`; it subscribes, and ACKs or NACKs
what it is sent, as the CSDS and observability tests need a proxy to.
"""

from __future__ import annotations

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

from tests.support.deadline import bounded

DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


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
        response: discovery_pb2.DeltaDiscoveryResponse = await bounded(self.call.read(), 10)
        return response

    async def reply(self, response: discovery_pb2.DeltaDiscoveryResponse, error: str = "") -> None:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=response.type_url, response_nonce=response.nonce
        )
        if error:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        await self.call.write(request)
