"""Pre-encoded responses must be exactly what protobuf itself would decode."""

from __future__ import annotations

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import descriptor_pb2
from hypothesis import given
from hypothesis import strategies as st

from pilot.xds import types
from pilot.xds.resource import (
    Resource,
    encode_delta_response,
    encode_sotw_response,
    length_delimited,
)


def _assignment(name: str, ports: list[int]) -> endpoint_pb2.ClusterLoadAssignment:
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    group = assignment.endpoints.add()
    for port in ports:
        address = group.lb_endpoints.add().endpoint.address.socket_address
        address.address = "10.0.0.1"
        address.port_value = port
    return assignment


names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@given(name=names, ports=st.lists(st.integers(1, 65535), max_size=300))
def test_sotw_response_decodes_to_the_same_resources(name: str, ports: list[int]) -> None:
    message = _assignment(name, ports)
    resource = Resource.from_message(types.ENDPOINT, name, message)
    wire = encode_sotw_response(types.ENDPOINT, "7", "42", [resource, resource])
    decoded = discovery_pb2.DiscoveryResponse.FromString(wire)
    assert (decoded.version_info, decoded.nonce, decoded.type_url) == ("7", "42", types.ENDPOINT)
    assert len(decoded.resources) == 2
    assert decoded.resources[0].type_url == types.ENDPOINT
    unpacked = endpoint_pb2.ClusterLoadAssignment()
    assert decoded.resources[1].Unpack(unpacked)
    assert unpacked == message


@given(name=names, removed=st.lists(names, max_size=5))
def test_delta_response_carries_name_version_and_removals(name: str, removed: list[str]) -> None:
    message = _assignment(name, [80])
    resource = Resource.from_message(types.ENDPOINT, name, message)
    wire = encode_delta_response(types.ENDPOINT, "3", "9", [resource], removed)
    decoded = discovery_pb2.DeltaDiscoveryResponse.FromString(wire)
    assert decoded.nonce == "9"
    assert decoded.system_version_info == "3"
    assert list(decoded.removed_resources) == removed
    (item,) = decoded.resources
    assert (item.name, item.version) == (name, resource.version)
    unpacked = endpoint_pb2.ClusterLoadAssignment()
    assert item.resource.Unpack(unpacked)
    assert unpacked == message


def test_version_follows_content_only() -> None:
    first = Resource.from_message(types.ENDPOINT, "a", _assignment("a", [80]))
    same = Resource.from_message(types.ENDPOINT, "a", _assignment("a", [80]))
    other = Resource.from_message(types.ENDPOINT, "a", _assignment("a", [81]))
    assert first.version == same.version
    assert first.version != other.version


# FileOptions' string fields: java_package is field 1, objc_class_prefix field 36.
@pytest.mark.parametrize(("number", "field"), [(1, "java_package"), (36, "objc_class_prefix")])
@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16383, 16384, 2**21])
def test_a_field_is_encoded_as_protobuf_encodes_it(number: int, field: str, size: int) -> None:
    text = "x" * size
    expected = descriptor_pb2.FileOptions(**{field: text}).SerializeToString()
    assert length_delimited(number, text.encode()) == expected
