"""Server reflection v1 and v1alpha, as clients of either version meet them.

One `pilot discovery --config examples/mesh.yaml` subprocess (ephemeral ports)
serves both `grpc.reflection.v1alpha.ServerReflection`, which the venv's grpcurl
(1.8.6) speaks, and `grpc.reflection.v1.ServerReflection`, which newer grpcurl,
evans and Postman ask for first. A client of either version lists the same
services (both reflection services among them) and is described the same
methods; v1 describes itself with the published v1 schema (`V1_FIELDS`, written
out here from the protocol, not read from pilot). grpcurl calls the v1 service
by name too. Bytes that are no request of the version called are
INVALID_ARGUMENT, naming that version's message.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from pilot.server import reflection_v1
from tests.support.deadline import bounded
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.served import ADS, SERVICES
from tests.support.served import REFLECTION_V1 as V1
from tests.support.served import REFLECTION_V1ALPHA as V1ALPHA

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
MESH = ROOT / "examples" / "mesh.yaml"
GRPCURL = Path(sys.executable).parent / "grpcurl"
TIMEOUT = 30.0  # a bound on a hung call, never a way to wait for something

# The published grpc.reflection.v1 messages: field name -> number.
V1_FIELDS = {
    "ServerReflectionRequest": {
        "host": 1,
        "file_by_filename": 3,
        "file_containing_symbol": 4,
        "file_containing_extension": 5,
        "all_extension_numbers_of_type": 6,
        "list_services": 7,
    },
    "ExtensionRequest": {"containing_type": 1, "extension_number": 2},
    "ServerReflectionResponse": {
        "valid_host": 1,
        "original_request": 2,
        "file_descriptor_response": 4,
        "all_extension_numbers_response": 5,
        "list_services_response": 6,
        "error_response": 7,
    },
    "FileDescriptorResponse": {"file_descriptor_proto": 1},
    "ExtensionNumberResponse": {"base_type_name": 1, "extension_number": 2},
    "ListServiceResponse": {"service": 1},
    "ServiceResponse": {"name": 1},
    "ErrorResponse": {"error_code": 1, "error_message": 2},
}
# Each version's messages, as its own clients have them.
MESSAGES: dict[str, tuple[Any, Any]] = {
    V1ALPHA: (reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse),
    V1: (reflection_v1.ServerReflectionRequest, reflection_v1.ServerReflectionResponse),
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pilot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[PilotProcess]:
    """`pilot discovery --config examples/mesh.yaml` on ephemeral ports."""
    process = await start_file_pilot_with_ca(tmp_path_factory.mktemp("reflection"), MESH)
    try:
        yield process
    finally:
        await process.stop()


# --- a Python client of either version ---------------------------------------------


async def reflect(pilot: PilotProcess, service: str, requests: Sequence[Any]) -> list[Any]:
    """ServerReflectionInfo of `service`: every request sent, then every answer read."""
    request_class, response_class = MESSAGES[service]
    async with grpc.aio.insecure_channel(pilot.target(tls=False)) as channel:
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )(timeout=TIMEOUT)
        for request in requests:
            await call.write(request)
        await call.done_writing()
        return [response async for response in call]


async def listed(pilot: PilotProcess, service: str) -> set[str]:
    request_class, _ = MESSAGES[service]
    [answer] = await reflect(pilot, service, [request_class(list_services="")])
    return {s.name for s in answer.list_services_response.service}


async def file_of(
    pilot: PilotProcess, service: str, symbol: str, declaring: str | None = None
) -> descriptor_pb2.FileDescriptorProto:
    """The file reflection `service` answers for `symbol` with, the one that declares
    `declaring` (a service or message; default `symbol` itself)."""
    request_class, _ = MESSAGES[service]
    [answer] = await reflect(pilot, service, [request_class(file_containing_symbol=symbol)])
    assert answer.WhichOneof("message_response") == "file_descriptor_response", answer
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(data)
        for data in answer.file_descriptor_response.file_descriptor_proto
    ]
    package, _, name = (declaring or symbol).rpartition(".")
    for file in files:
        declared = {s.name for s in file.service} | {m.name for m in file.message_type}
        if file.package == package and name in declared:
            return file
    raise AssertionError(f"{service}: no file declares {declaring}: {[f.name for f in files]}")


def method_of(
    file: descriptor_pb2.FileDescriptorProto, service: str, method: str
) -> descriptor_pb2.MethodDescriptorProto:
    [found] = [m for s in file.service if s.name == service for m in s.method if m.name == method]
    return found


# --- grpcurl ---------------------------------------------------------------------------


async def grpcurl(pilot: PilotProcess, *args: str, flags: Sequence[str] = ()) -> str:
    """`grpcurl -plaintext FLAGS PILOT ARGS` (the venv's); its output (it must succeed quietly)."""
    assert GRPCURL.is_file(), f"no grpcurl next to {sys.executable}: pip install -e '.[test]'"
    process = await asyncio.create_subprocess_exec(
        str(GRPCURL),
        "-plaintext",
        *flags,
        pilot.target(tls=False),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await bounded(process.communicate(), TIMEOUT)
    command = f"grpcurl {' '.join(args)}"
    assert (process.returncode, err.decode()) == (0, ""), (
        f"{command}:\n{out.decode()}{err.decode()}"
    )
    return out.decode()


# --- the tests -------------------------------------------------------------------------


@pytest.mark.parametrize("service", [V1, V1ALPHA])
async def test_either_version_lists_the_same_services(pilot: PilotProcess, service: str) -> None:
    assert await listed(pilot, service) == SERVICES


@pytest.mark.parametrize("service", [V1, V1ALPHA])
async def test_either_version_describes_a_method(pilot: PilotProcess, service: str) -> None:
    file = await file_of(pilot, service, f"{ADS}.DeltaAggregatedResources", declaring=ADS)
    delta = method_of(file, "AggregatedDiscoveryService", "DeltaAggregatedResources")
    assert delta.input_type == ".envoy.service.discovery.v3.DeltaDiscoveryRequest"
    assert delta.output_type == ".envoy.service.discovery.v3.DeltaDiscoveryResponse"
    assert delta.client_streaming and delta.server_streaming


async def test_v1_describes_itself_with_the_published_schema(pilot: PilotProcess) -> None:
    file = await file_of(pilot, V1, V1)
    assert file.package == "grpc.reflection.v1"
    assert not file.options.deprecated, "v1 is the current version; v1alpha is deprecated"
    fields = {m.name: {f.name: f.number for f in m.field} for m in file.message_type}
    assert fields == V1_FIELDS
    info = method_of(file, "ServerReflection", "ServerReflectionInfo")
    assert info.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
    assert info.output_type == ".grpc.reflection.v1.ServerReflectionResponse"
    assert info.client_streaming and info.server_streaming
    references = {f.type_name for m in file.message_type for f in m.field if f.type_name}
    assert references and all(r.startswith(".grpc.reflection.v1.") for r in references), references


async def test_one_stream_answers_each_request_in_turn(pilot: PilotProcess) -> None:
    request = reflection_v1.ServerReflectionRequest
    answers = await reflect(
        pilot,
        V1,
        [
            request(list_services=""),
            request(file_containing_symbol="no.such.Symbol"),
            request(file_by_filename="grpc/reflection/v1/reflection.proto"),
        ],
    )
    kinds = [answer.WhichOneof("message_response") for answer in answers]
    assert kinds == ["list_services_response", "error_response", "file_descriptor_response"]
    assert answers[1].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert answers[1].original_request.file_containing_symbol == "no.such.Symbol"


@pytest.mark.parametrize(
    ("service", "message"),
    [(V1, "grpc.reflection.v1.ServerReflectionRequest"),
     (V1ALPHA, "grpc.reflection.v1alpha.ServerReflectionRequest")],
)  # fmt: skip
async def test_garbage_is_invalid_argument(pilot: PilotProcess, service: str, message: str) -> None:
    async with grpc.aio.insecure_channel(pilot.target(tls=False)) as channel:
        call = channel.stream_stream(f"/{service}/ServerReflectionInfo")(timeout=TIMEOUT)
        await call.write(b"\xff\xff\xff\xff")  # no field has number 0x1fffffff... of wire type 7
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"not a valid {message}" in (refused.value.details() or "")


async def test_grpcurl_lists_and_describes_both_versions(pilot: PilotProcess) -> None:
    """grpcurl 1.8.6 reflects over v1alpha; what it sees includes v1, described as v1."""
    assert set((await grpcurl(pilot, "list")).split()) == SERVICES
    method = await grpcurl(pilot, "describe", f"{ADS}.DeltaAggregatedResources")
    assert method.startswith(f"{ADS}.DeltaAggregatedResources is a method:"), method
    assert "rpc DeltaAggregatedResources ( stream .envoy.service.discovery.v3.Delta" in method
    v1 = await grpcurl(pilot, "describe", V1)
    assert v1.startswith(f"{V1} is a service:"), v1
    assert (
        "rpc ServerReflectionInfo ( stream .grpc.reflection.v1.ServerReflectionRequest )"
        " returns ( stream .grpc.reflection.v1.ServerReflectionResponse );"
    ) in v1


async def test_grpcurl_calls_the_v1_service(pilot: PilotProcess) -> None:
    request = ("-d", '{"list_services": ""}')
    out = await grpcurl(pilot, f"{V1}/ServerReflectionInfo", flags=request)
    answer = json.loads(out)
    assert {s["name"] for s in answer["list_services_response"]["service"]} == SERVICES
