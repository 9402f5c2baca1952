"""A registry file as `kubectl get svc,endpointslices -A -o json` prints it, at a size
parsed off the event loop: `pilot discovery --config` serves it, applies an edit, and
keeps the last good version when the file breaks."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from bench.kubectl_files import kubectl_list, render, write_whole
from pilot.sources.parse_worker import INLINE_BYTES
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.xds_client import XdsClient, sotw_names

LOADED = re.compile(r"^loaded .*: (\d+) services")


async def _clusters(pilot: PilotProcess) -> set[str]:
    async with XdsClient(pilot.target(tls=False)) as client:
        return set(sotw_names(await client.fetch_clusters()))


async def _until_served(pilot: PilotProcess, cluster: str, within: float = 30) -> None:
    """Until pilot's clusters include `cluster` (a reload is pushed after the debounce)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while cluster not in await _clusters(pilot):
        assert loop.time() < deadline, f"pilot did not serve {cluster} within {within:g}s"
        await asyncio.sleep(0.05)  # polling what pilot serves, with a deadline


async def _loaded(pilot: PilotProcess, services: int, mark: int) -> None:
    await pilot.wait_logged(
        lambda e: (m := LOADED.match(e["msg"])) is not None and int(m[1]) == services,
        f"that it loaded {services} services",
        mark,
        30,
    )


async def test_a_large_json_registry_is_served_edited_and_kept_when_broken(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mesh.json"
    text = render(kubectl_list(300), "json")
    assert len(text) > INLINE_BYTES, "the file must be large enough for the worker"
    write_whole(path, text)
    pilot = await start_file_pilot_with_ca(tmp_path, path)
    try:
        first = await _clusters(pilot)
        assert "outbound|80||svc-299.ns-49.svc.cluster.local" in first
        assert len([c for c in first if c.startswith("outbound|80||svc-")]) == 300

        mark = pilot.mark()
        write_whole(path, render(kubectl_list(301), "json"))
        await _loaded(pilot, 301, mark)
        await _until_served(pilot, "outbound|80||svc-300.ns-0.svc.cluster.local")

        mark = pilot.mark()
        write_whole(path, text.replace('"kind": "Service"', '"kind": ', 1))
        await pilot.wait_logged(
            lambda e: "keeping the last good registry" in e["msg"] and "mesh.json" in e["msg"],
            "that it refused the broken file",
            mark,
            30,
        )
        assert "outbound|80||svc-300.ns-0.svc.cluster.local" in await _clusters(pilot)
    finally:
        await pilot.stop()


@pytest.mark.parametrize("output", ["yaml"])
async def test_a_large_yaml_registry_is_served(tmp_path: Path, output: str) -> None:
    path = tmp_path / f"mesh.{output}"
    write_whole(path, render(kubectl_list(200), output))
    pilot = await start_file_pilot_with_ca(tmp_path, path)
    try:
        assert "outbound|80||svc-199.ns-49.svc.cluster.local" in await _clusters(pilot)
    finally:
        await pilot.stop()
