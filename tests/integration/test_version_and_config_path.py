"""`pilot --version`, and a `--config` path that is not there, with the real `pilot` command.

- `pilot --version` (and `pilot discovery --version`, `pilot agent --version`) prints
  `pilot X.Y.Z`, the installed package's version, and exits 0. (It was an error.)
- `pilot discovery --config PATH` where PATH does not exist at start exits 2 with one
  line on stderr naming the path. (pilot ran on, unready, for good: a typo in the
  path looked like a slow start.)
- A registry file removed while pilot runs keeps the last good registry: /ready stays
  200 and Envoy keeps its clusters; writing it back applies it.

Each command is the `pilot` console script of the active environment, run as the
README prints it, from an empty folder with a HOME of its own.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from pathlib import Path

import pytest

from tests.support.deadline import bounded
from tests.support.mesh import cluster_name, simple_mesh, write_mesh
from tests.support.pilot_process import pilot_environment, start_file_pilot_with_ca
from tests.support.xds_client import XdsClient, sotw_names

EXIT_WITHIN = 30.0  # seconds a command that refuses to start may take (a liveness bound)
WAIT = 15.0
PILOT = Path(sys.executable).parent / "pilot"  # the console script, as a user runs it


async def _run(folder: Path, *args: str) -> tuple[int, str, str]:
    """`pilot ARGS` from `folder`: its exit status, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        str(PILOT),
        *args,
        cwd=folder,
        env=pilot_environment(folder),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await bounded(process.communicate(), EXIT_WITHIN)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"pilot {' '.join(args)} still ran after {EXIT_WITHIN:g}s instead of exiting")
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(
    "command", [[], ["discovery"], ["agent"]], ids=["pilot", "discovery", "agent"]
)
async def test_version_prints_the_package_version(tmp_path: Path, command: list[str]) -> None:
    code, out, err = await _run(tmp_path, *command, "--version")
    assert (code, err) == (0, ""), f"exit {code}, stderr {err!r}"
    assert out == f"pilot {importlib.metadata.version('pilot')}\n"


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
async def test_a_config_path_that_does_not_exist_exits_2_naming_it(
    tmp_path: Path, relative: bool
) -> None:
    path = "mesh.yaml" if relative else str(tmp_path / "nowhere" / "mesh.yaml")
    code, out, err = await _run(tmp_path, "discovery", "--config", path)
    lines = err.splitlines()
    assert code == 2, f"exit {code}; stderr {lines}"
    assert lines == [f"pilot: error: --config {path}: no such file"], lines
    assert out == ""


async def test_a_file_removed_later_keeps_the_last_good_registry(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"web": ["10.1.0.1"]}))
    pilot = await start_file_pilot_with_ca(tmp_path, config)
    try:
        mark = pilot.mark()
        config.unlink()
        await pilot.wait_logged(
            lambda e: (
                f"{config}: cannot read" in e["msg"]
                and e["msg"].endswith("keeping the last good registry")
            ),
            "that the removed file cannot be read",
            mark,
            WAIT,
        )
        assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
        async with XdsClient(pilot.target(tls=False)) as client:
            assert sotw_names(await client.fetch_clusters()) == [cluster_name("web")]
        mark = pilot.mark()
        write_mesh(config, simple_mesh({"web": ["10.1.0.1"], "cart": ["10.1.0.2"]}))
        await pilot.wait_logged(
            lambda e: e["msg"].startswith(f"loaded {config}: 2 services"),
            "the file back",
            mark,
            WAIT,
        )
    finally:
        await pilot.stop()
