"""A large registry file is parsed by a child process and comes back whole.

`parse_off_loop` on files above `INLINE_BYTES` starts the real worker
(`python -m pilot.sources.parse_worker`): what it answers must equal what parsing
in place gives, and a broken large file must be refused with the object named,
exactly as in place.
"""

from __future__ import annotations

import re

import pytest

from bench.kubectl_files import kubectl_list, render
from pilot.sources.file_format import RegistryFileError, parse_registry
from pilot.sources.parse_worker import CHUNK, INLINE_BYTES, parse_off_loop
from tests.support.mesh import pod

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("output", ["json", "yaml"])
async def test_a_large_file_parsed_by_the_worker_equals_parsing_in_place(output: str) -> None:
    services = CHUNK + 7  # more than one chunk of each kind
    text = render(kubectl_list(services), output)
    assert len(text) > INLINE_BYTES
    by_worker = await parse_off_loop(text.encode(), f"mesh.{output}", "west")
    assert by_worker == parse_registry(text, f"mesh.{output}", "west")
    assert len(by_worker.services) == services and len(by_worker.endpoint_sets) == services
    assert {s.cluster for s in by_worker.services} == {"west"}, "the local cluster id, passed on"


async def test_a_broken_large_file_is_refused_naming_the_object() -> None:
    document = kubectl_list(100)
    del document["items"][121]["metadata"]["labels"]["kubernetes.io/service-name"]
    text = render(document, "json")
    assert len(text) > INLINE_BYTES
    message = "mesh.json: document 1 item 121: EndpointSlice ns-10/svc-60-x7k2p"
    with pytest.raises(RegistryFileError, match=re.escape(message)):
        await parse_off_loop(text.encode(), "mesh.json", "Kubernetes")


async def test_a_large_file_that_is_not_yaml_is_refused() -> None:
    text = "kind: [" + "x" * INLINE_BYTES
    with pytest.raises(RegistryFileError, match=re.escape("mesh.yaml: not valid YAML")):
        await parse_off_loop(text.encode(), "mesh.yaml", "Kubernetes")


async def test_pods_of_a_large_file_come_back_from_the_worker() -> None:
    document = kubectl_list(50)
    document["items"] += [
        pod(f"web-{i}", f"10.2.{i // 250}.{1 + i % 250}", service_account="web", sidecar=True)
        for i in range(CHUNK + 3)  # more than one chunk of pods
    ]
    text = render(document, "json")
    assert len(text) > INLINE_BYTES
    by_worker = await parse_off_loop(text.encode(), "mesh.json", "west")
    assert by_worker == parse_registry(text, "mesh.json", "west")
    assert len(by_worker.pods) == CHUNK + 3 and all(p.istio_mtls for p in by_worker.pods)
