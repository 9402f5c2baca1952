"""PILOT_PATH_NORMALIZATION on the real `pilot discovery` command: Istio's NONE and
anything else unknown stop it at start with one line (exit 2, no traceback); the three
modes pilot offers are taken (the one line is then about the next thing, the cluster).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.support.deadline import bounded
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot_process import pilot_environment

EXIT_WITHIN = 30.0
FILE_MODE = [
    "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--grpc-tls-addr", "",
    "--webhook-addr", "",
]  # fmt: skip


async def _stderr_of_exit(folder: Path, value: str, *args: str) -> str:
    """Run `pilot discovery ARGS` with PILOT_PATH_NORMALIZATION=value; it must exit 2
    with one line on stderr, returned."""
    env = pilot_environment(folder) | {"PILOT_PATH_NORMALIZATION": value}
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(name, None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pilot", "discovery", *args, cwd=folder, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = await bounded(process.communicate(), EXIT_WITHIN)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"pilot still ran after {EXIT_WITHIN:g}s with {value!r}")
    lines = err.decode(errors="replace").splitlines()
    assert process.returncode == 2, (process.returncode, lines)
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("value", ["NONE", "none", "junk", "", "BASE,MERGE_SLASHES", "x" * 5000])
async def test_none_and_junk_stop_pilot_in_one_line(tmp_path: Path, value: str) -> None:
    mesh = tmp_path / "mesh.yaml"
    write_mesh(mesh, simple_mesh({"web": ["10.1.0.1"]}))
    line = await _stderr_of_exit(tmp_path, value, "--config", str(mesh), *FILE_MODE)
    assert (
        "PILOT_PATH_NORMALIZATION: expected BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES" in line
    )
    assert len(line) < 300
    if value.upper() == "NONE":
        assert "never matches authorization paths against unnormalized ones" in line


@pytest.mark.parametrize("value", ["BASE", "MERGE_SLASHES", "DECODE_AND_MERGE_SLASHES"])
async def test_the_modes_pilot_offers_are_taken(tmp_path: Path, value: str) -> None:
    line = await _stderr_of_exit(tmp_path, value, "--http-addr", "127.0.0.1:0")
    assert "PILOT_PATH_NORMALIZATION" not in line
    assert "no Kubernetes cluster to watch" in line
