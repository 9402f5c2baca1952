"""Lifecycle and files, tried as a new user would: signals before the first load, and
saves that leave the registry file empty.

- A pilot whose registry file is empty or broken at start never serves; SIGTERM and
  Ctrl-C (SIGINT) must stop it all the same: exit 0, one line saying why. (They were
  ignored: only SIGKILL stopped it.)
- A zero-byte or whitespace-only file is what a truncating save leaves behind: it is
  never applied (every cluster stays on every Envoy, /ready stays 200), pilot warns
  naming the file and counts it in `pilot_registry_file_rejected_total{reason="empty"}`.
  An explicit empty `kind: List` is applied: the clusters go. (An emptiness that
  lasted two polls was applied as 0 services.) At start, an empty file leaves pilot
  unready until a real registry is written.

Each pilot is a real `pilot discovery --config FILE --xds-auth none` subprocess.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.background_process import terminate
from tests.support.ca import write_plugged_in
from tests.support.envoy_process import wait_until
from tests.support.mesh import cluster_name, simple_mesh, write_mesh
from tests.support.pilot_process import (
    Entry,
    PilotProcess,
    discovery_command,
    pilot_environment,
    spawn,
    start_file_pilot_with_ca,
    wait_serving,
)
from tests.support.xds_client import XdsClient, sotw_names

EXIT_WITHIN = 10.0  # seconds a signalled pilot may take to exit (its drain is 0 s)
WAIT = 10.0
MESH = simple_mesh({"cart": ["10.1.0.1"], "web": ["10.1.0.2"]})
CLUSTERS = sorted(cluster_name(name) for name in ("cart", "web"))
EMPTY_LISTS = ('{"kind": "List", "items": []}\n', "apiVersion: v1\nkind: List\nitems: []\n")


async def _spawn_file_pilot(folder: Path, config: Path) -> PilotProcess:
    """`pilot discovery --config` on `config`, not waiting for it to serve."""
    ca = write_plugged_in(folder / "plugged-in-ca")
    source = ["--config", str(config), "--xds-auth", "none"]
    command = discovery_command(folder, source, ca.directory)
    return await spawn(folder, command, env=pilot_environment(folder))


def _rejected(config: Path, words: str) -> Callable[[Entry], bool]:
    def matches(entry: Entry) -> bool:
        return str(config) in entry["msg"] and words in entry["msg"]

    return matches


def _loaded(config: Path, services: int) -> Callable[[Entry], bool]:
    def matches(entry: Entry) -> bool:
        return entry["msg"].startswith(f"loaded {config}: {services} services")

    return matches


async def _clusters(pilot: PilotProcess) -> list[str]:
    async with XdsClient(pilot.target(tls=False)) as client:
        return sorted(sotw_names(await client.fetch_clusters()))


async def _exit_code(pilot: PilotProcess) -> int | None:
    """The exit status once pilot exits, None if it is still running after EXIT_WITHIN."""
    try:
        async with asyncio.timeout(EXIT_WITHIN):
            code = await pilot.process.wait()
            await pilot.stderr.finished()
    except TimeoutError:
        return None
    return code


BROKEN = "kind: Service\nmetadata: {name: [unclosed\n"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("state", ["empty", "broken"])
async def test_a_signal_stops_pilot_before_the_first_load(
    tmp_path: Path, signum: signal.Signals, state: str
) -> None:
    config = tmp_path / "mesh.yaml"
    config.write_text(BROKEN if state == "broken" else "")
    pilot = await _spawn_file_pilot(tmp_path, config)
    try:
        words = "is empty" if state == "empty" else "not valid YAML"
        await pilot.wait_logged(_rejected(config, words), f"that {config} is {state}")
        pilot.process.send_signal(signum)
        code = await _exit_code(pilot)
        assert code is not None, f"pilot ignored {signum.name} for {EXIT_WITHIN:g}s"
        assert code == 0, f"pilot exited {code} on {signum.name}; {pilot.tail()}"
        why = [e for e in pilot.log if e["msg"].startswith(f"stopping on {signum.name}")]
        assert [e["msg"] for e in why] == [
            f"stopping on {signum.name} before the registry's first load"
        ]
    finally:
        await terminate(pilot.process, pilot.stderr, EXIT_WITHIN)


async def _metric(pilot: PilotProcess, sample: str) -> float | None:
    status, body = await pilot.get("/metrics")
    assert status == 200
    for line in body.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return None


async def test_an_emptied_file_is_never_applied_an_empty_list_is(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, MESH)
    pilot = await start_file_pilot_with_ca(tmp_path, config)
    try:
        assert await _clusters(pilot) == CLUSTERS
        empty_sample = 'pilot_registry_file_rejected_total{reason="empty"}'
        applied, rejected = _loaded(config, 0), _rejected(config, "is empty")
        for count, content in enumerate(("", " \n\t\n"), start=1):
            mark = pilot.mark()
            config.write_text(content)  # in place, as a truncating save does
            found = await pilot.until_logged(lambda e: applied(e) or rejected(e), mark, WAIT)
            assert found and not pilot.logged(applied, mark), f"{content!r} was applied"
            assert found[0]["level"] == "warning", found[0]
            assert await _clusters(pilot) == CLUSTERS, "every cluster stays"
            assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
            assert await _metric(pilot, empty_sample) == count
            mark = pilot.mark()
            write_mesh(config, MESH)  # the save completes
            await pilot.wait_logged(_loaded(config, 2), "the whole file loaded again", mark)

        for content in EMPTY_LISTS:
            mark = pilot.mark()
            config.write_text(content)
            await pilot.wait_logged(_loaded(config, 0), "the empty List applied", mark)
            # The push that removes them is debounced: wait for it.
            await wait_until(
                lambda: _clusters(pilot), WAIT, "the empty registry served", until=lambda c: c == []
            )
            mark = pilot.mark()
            write_mesh(config, MESH)
            await pilot.wait_logged(_loaded(config, 2), "the whole file loaded again", mark)
    finally:
        await pilot.stop()


async def test_pilot_started_on_an_empty_file_waits_for_a_real_registry(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    config.write_bytes(b"")
    pilot = await _spawn_file_pilot(tmp_path, config)
    try:
        rejected = _rejected(config, "is empty")
        serving = await pilot.until_logged(
            lambda e: rejected(e) or "serving xDS" in e["msg"],
            0,
            WAIT,
        )
        assert serving, f"pilot said nothing of {config}; {pilot.tail()}"
        assert "serving xDS" not in serving[0]["msg"], "pilot served an empty file's registry"
        write_mesh(config, MESH)
        await wait_serving(pilot)
        assert await _clusters(pilot) == CLUSTERS
        assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
    finally:
        await pilot.stop()
