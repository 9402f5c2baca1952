"""`PILOT_EVENT_LOOP`: pilot serves and pushes on uvloop as on asyncio's loop (the
default), and its serving line says which; a loop pilot does not know is a one-line error
at start."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.support.deadline import bounded
from tests.support.mesh import cluster_name, simple_mesh, write_mesh
from tests.support.pilot_process import start_file_pilot_with_ca
from tests.support.xds_client import CLUSTER, XdsClient, node


@pytest.mark.parametrize(
    ("setting", "loop"),
    [(None, "asyncio"), ("uvloop", "uvloop"), ("asyncio", "asyncio")],
    ids=["default", "uvloop", "asyncio"],
)
async def test_pilot_serves_and_pushes_on_the_loop_it_names(
    tmp_path: Path, setting: str | None, loop: str
) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"a": ["127.0.0.1"]}))
    env = {} if setting is None else {"PILOT_EVENT_LOOP": setting}
    pilot = await start_file_pilot_with_ca(tmp_path, config, env=env)
    try:
        (serving,) = [e["msg"] for e in pilot.log if "serving xDS on" in e["msg"]]
        assert serving.endswith(f"(event loop: {loop})"), serving
        async with XdsClient(pilot.target(tls=False)) as client:
            stream = client.delta_ads(node(f"{loop}-proxy"))
            await stream.subscribe(CLUSTER, ["*"])
            await stream.ack_until(CLUSTER, [cluster_name("a")])
            write_mesh(config, simple_mesh({"a": ["127.0.0.1"], "b": ["127.0.0.2"]}))
            await stream.ack_until(CLUSTER, [cluster_name("b")])  # delta: only what changed
    finally:
        await pilot.stop()
    assert not [e for e in pilot.log if e["level"] == "error"]


async def test_an_unknown_event_loop_is_a_one_line_error(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"a": ["127.0.0.1"]}))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot",
        "discovery",
        "--config",
        str(config),
        env={**os.environ, "PILOT_EVENT_LOOP": "trio"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await bounded(process.communicate(), 30)
    assert process.returncode == 2
    assert "PILOT_EVENT_LOOP=trio: choose one of asyncio, uvloop" in err.decode()
    assert "Traceback" not in err.decode()
