"""A `pilot discovery` start that fails or is cut short leaves nothing behind.

`start_discovery` binds the HTTP port first and the gRPC port before the registry's
first load; whatever stops it half-way (a part that fails, a Ctrl-C while it waits for a
file that never loads), the ports it bound are free again and no task of it runs, so a
retry in the same process (or the next pilot) binds them.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from pilot.app import Core, start_discovery
from tests.support.deadline import bounded
from tests.support.envoy_process import wait_until
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot import _settings


async def _refuses(port: int) -> bool:
    """Nothing listens on loopback `port`."""
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


def _others() -> set[asyncio.Task[object]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


def _core(tmp_path: Path, **overrides: object) -> Core:
    config = tmp_path / "mesh.yaml"
    if not config.exists():
        write_mesh(config, simple_mesh({"alpha": ["127.0.1.1"]}))
    return Core(_settings(tmp_path / "ca", config=config, **overrides))


async def test_a_part_that_fails_after_the_ports_are_bound_leaves_them_free(
    tmp_path: Path,
) -> None:
    before = _others()
    missing = tmp_path / "west.kubeconfig"  # never written: read once the ports are bound
    core = _core(tmp_path, remote_kubeconfigs=(("west", missing),))
    with pytest.raises(OSError, match="--remote-kubeconfig west="):
        await bounded(start_discovery(core), 30.0)
    assert core.discovery is not None, "the failure came before the gRPC port was bound"
    assert await _refuses(core.http.port), "the HTTP port is still bound"
    assert await _refuses(core.discovery.grpc.port), "the gRPC port is still bound"
    assert _others() == before, "a task of the failed start still runs"


async def test_a_grpc_port_in_use_leaves_the_http_port_free(tmp_path: Path) -> None:
    before = _others()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        core = _core(tmp_path, grpc_addr=f"127.0.0.1:{port}")
        with pytest.raises(Exception, match=str(port)):
            await bounded(start_discovery(core), 30.0)
    assert core.discovery is None
    assert await _refuses(core.http.port), "the HTTP port is still bound"
    assert _others() == before, "a task of the failed start still runs"


async def test_a_start_cut_short_before_the_first_load_leaves_nothing(tmp_path: Path) -> None:
    before = _others()
    (tmp_path / "mesh.yaml").write_text("kind: [unclosed\n")  # never loads: start waits
    core = _core(tmp_path)
    starting = asyncio.create_task(start_discovery(core))
    await wait_until(lambda: core.discovery is not None, 30.0, "the gRPC port to be bound")
    assert core.discovery is not None
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bounded(starting, 30.0)
    assert await _refuses(core.http.port), "the HTTP port is still bound"
    assert await _refuses(core.discovery.grpc.port), "the gRPC port is still bound"
    assert _others() == before, "a task of the cut-short start still runs"
