"""One deterministic reproducer per defect the fuzzer found, each now a regression test.

Each test states the property pilot must have, on the smallest input that once broke
it: garbage on every method, a stream refused while responses are pending, absurd
certificate lifetimes, hostile CSDS regexes, floods of names, client strings that
would size log lines, a request for a certificate without an identity. A defect found
later is added here first under `known.KNOWN[key].xfail()` (see `known.py`).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from envoy.type.matcher.v3 import node_pb2, regex_pb2, string_pb2

from pilot._gen.istio.v1.auth import ca_pb2
from tests.fuzz import methods
from tests.fuzz.calls import Call, XdsStep
from tests.fuzz.csr import build_csr
from tests.fuzz.fuzzer import Fuzzer, Observation
from tests.fuzz.known import SECRET_WARNING
from tests.fuzz.properties import LOGGED, LONG_LOG, SLOW_READY, STATUS
from tests.fuzz.strategies import struct
from tests.fuzz.target import RESIDENT_METADATA, Target
from tests.support.xds_client import CLUSTER, ENDPOINT, SECRET

GARBAGE = b"\xff\xff\xff"  # a truncated varint: no protobuf message parses from it
WRITE_TIMEOUT = 3.0


def _kinds(observation: Observation, *kinds: str) -> list[str]:
    return [str(v) for v in observation.violations if v.kind in kinds]


def _csds_regex(pattern: str) -> Call:
    matcher = string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=pattern))
    request = csds_pb2.ClientStatusRequest(node_matchers=[node_pb2.NodeMatcher(node_id=matcher)])
    return Call(methods.CSDS_FETCH, (request,))


def test_undecodable_requests_are_refused_cleanly(file_fuzzer: Fuzzer) -> None:
    """Every method, three bytes that are no protobuf message: INVALID_ARGUMENT (or any
    status but UNKNOWN), and nothing logged at ERROR."""
    broken = {}
    for method in methods.ALL:
        observation = file_fuzzer.observe(Call(method, (GARBAGE,)))
        if found := _kinds(observation, STATUS, LOGGED):
            broken[str(method)] = found[0]
    assert not broken, "\n".join(f"{m}: {v}" for m, v in broken.items())


def test_stream_refused_while_responses_are_pending_gets_its_status(
    file_fuzzer: Fuzzer,
) -> None:
    """Delta EDS: three subscriptions of 1 MB of names each, within the limits (pilot
    answers each in removed_resources, 1 MB responses the client does not read yet).
    Once pilot has written the first, the others are stuck behind flow control; then
    ask for a Secret, which the EDS service refuses. The client must get
    INVALID_ARGUMENT, not a stream left hanging."""
    target = file_fuzzer.target
    mark = target.pilot.mark()
    done = threading.Event()

    def big(batch: int) -> bytes:
        names = [f"{batch}-{i:04d}" + "x" * 1020 for i in range(1000)]
        request = discovery_pb2.DeltaDiscoveryRequest(
            node=base_pb2.Node(id="fuzz-writer"),
            type_url=ENDPOINT,
            resource_names_subscribe=names,
        )
        return bytes(request.SerializeToString())

    def requests() -> Iterator[bytes]:
        for batch in range(3):
            yield big(batch)
        # A write is in flight once the first response went out (the client reads none).
        written = target.loop.run(_eds_responses_written(target, 1), WRITE_TIMEOUT)
        assert written, "pilot wrote no EDS response"
        yield discovery_pb2.DeltaDiscoveryRequest(type_url=SECRET).SerializeToString()
        done.wait(WRITE_TIMEOUT)

    rpc = target.channel.stream_stream(methods.EDS_DELTA.path)
    responses = rpc(requests(), timeout=WRITE_TIMEOUT)
    refused = target.loop.run(
        target.pilot.until_logged(lambda e: "not served on the eds" in e["msg"], mark, 10)
    )
    assert refused, "pilot did not refuse the Secret request on the EDS service"
    code = grpc.StatusCode.OK
    try:
        for _ in responses:  # only now does the client read
            pass
    except grpc.RpcError as error:
        code = error.code()  # type: ignore[attr-defined]
    finally:
        done.set()
    errors = [e["msg"] for e in target.pilot.log[mark:] if e["level"] == "error"]
    assert code is grpc.StatusCode.INVALID_ARGUMENT, f"the stream ended {code.name}; {errors}"
    assert not errors, errors


async def _eds_responses_written(target: Target, at_least: int) -> bool:
    """Until pilot_xds_pushes{type="eds"} (responses written) reaches `at_least`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITE_TIMEOUT
    while loop.time() < deadline:
        text = await target._get("/metrics")
        match = re.search(r'^pilot_xds_pushes\{type="eds"\} (\S+)$', text, re.MULTILINE)
        if match and float(match[1]) >= at_least:
            return True
        await asyncio.sleep(0.01)  # polling pilot's counter, with a deadline
    return False


def test_absurd_validity_duration_is_refused_cleanly(kube_fuzzer: Fuzzer) -> None:
    """CreateCertificate, a good CSR, validity_duration 2^63-1 s: INVALID_ARGUMENT."""
    csr = build_csr("ec-p256", None, [], "none")
    request = ca_pb2.IstioCertificateRequest(csr=csr, validity_duration=2**63 - 1)
    observation = kube_fuzzer.observe(Call(methods.CA_CREATE, (request,)))
    assert observation.outcome.code is grpc.StatusCode.INVALID_ARGUMENT, observation.report()
    assert not observation.violations, observation.report()


def test_invalid_csds_regex_is_refused_cleanly(file_fuzzer: Fuzzer) -> None:
    """FetchClientStatus with node_id safe_regex "(" while a proxy is connected:
    INVALID_ARGUMENT (or no match), nothing logged at ERROR."""
    observation = file_fuzzer.observe(_csds_regex("("))
    assert not _kinds(observation, STATUS, LOGGED), observation.report()


def test_backtracking_csds_regex_does_not_stall_pilot(file_fuzzer: Fuzzer) -> None:
    """FetchClientStatus with a backtracking regex against the resident's node id
    (`fuzz-resident~aaa...a~x`): /ready keeps answering."""
    observation = file_fuzzer.observe(_csds_regex("fuzz-resident~(a|a)*~y"))
    assert not _kinds(observation, SLOW_READY), observation.report()


def test_many_names_do_not_stall_pilot(file_fuzzer: Fuzzer) -> None:
    """One delta EDS request subscribing to 200,000 names: refused, or served without
    leaving /ready unanswered."""
    names = [f"n{i}" for i in range(200_000)]
    request = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT, resource_names_subscribe=names)
    observation = file_fuzzer.observe(Call(methods.EDS_DELTA, (XdsStep(request),)))
    assert not _kinds(observation, SLOW_READY), observation.report()


def test_node_id_does_not_size_log_lines(file_fuzzer: Fuzzer) -> None:
    """A stream whose node id is 100,000 characters: no log line longer than 16 KiB."""
    request = discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id="n" * 100_000), type_url=CLUSTER)
    observation = file_fuzzer.observe(Call(methods.ADS_SOTW, (XdsStep(request),)))
    assert not _kinds(observation, LONG_LOG), observation.report()


def test_unknown_secret_names_do_not_stall_pilot(file_fuzzer: Fuzzer) -> None:
    """One delta SDS request subscribing to 10,000 secret names pilot does not serve
    (half the names that stall pilot anyway; EDS takes them in a few milliseconds):
    /ready keeps answering."""
    request = discovery_pb2.DeltaDiscoveryRequest(
        node=base_pb2.Node(id="fuzz-secrets", metadata=struct(RESIDENT_METADATA)),
        type_url=SECRET,
        resource_names_subscribe=[f"n{i}" for i in range(10_000)],
    )
    observation = file_fuzzer.observe(Call(methods.SDS_DELTA, (XdsStep(request),)))
    warned = sum(1 for e in observation.entries if SECRET_WARNING in e["msg"])
    assert not _kinds(observation, SLOW_READY), f"{warned} secret warnings; {observation.report()}"
    assert warned <= 1, f"{warned} warnings for one request: one summary line at most"


def test_secret_request_without_identity_logs_no_error(file_fuzzer: Fuzzer) -> None:
    """--xds-auth none, SotW SDS, a node without NAMESPACE/SERVICE_ACCOUNT asking for
    `default`: refused or ignored, but nothing logged at ERROR."""
    request = discovery_pb2.DiscoveryRequest(
        node=base_pb2.Node(id="sidecar~10.1.1.9~anonymous.default~default.svc.cluster.local"),
        type_url=SECRET,
        resource_names=["default"],
    )
    observation = file_fuzzer.observe(Call(methods.SDS_SOTW, (XdsStep(request),)))
    assert not _kinds(observation, LOGGED), observation.report()
