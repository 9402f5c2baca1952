"""tools/istioctl/build refuses to build an istioctl of another Istio than istiod's.

Its go.mod must pin the istio.io/istio snapshot tools/istiod/go.mod pins; when they
differ it says how to fix it, exits 2 and builds nothing (no Go build is started, so
this needs no Go: a stand-in `go` that fails is on PATH).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _copy_tools(root: Path) -> Path:
    for tool in ("istioctl", "istiod"):
        (root / tool).mkdir(parents=True)
        for name in ("go.mod", "go.sum"):
            shutil.copy(REPO / "tools" / tool / name, root / tool / name)
    shutil.copy(REPO / "tools" / "istioctl" / "build", root / "istioctl" / "build")
    return root / "istioctl" / "build"


def _run(build: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text("#!/bin/sh\necho 'go must not run' >&2\nexit 99\n")
    go.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PILOT_ISTIOCTL_CACHE": str(folder / "cache"),
        "HOME": os.environ.get("HOME", str(folder)),
    }
    return subprocess.run(
        [str(build)], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_the_two_pins_are_the_same_in_the_repository() -> None:
    def pin(tool: str) -> str:
        text = (REPO / "tools" / tool / "go.mod").read_text()
        [line] = [line for line in text.splitlines() if "istio.io/istio " in line]
        return line.split()[1]

    assert pin("istioctl") == pin("istiod")


def test_a_different_pin_is_refused_before_any_build(tmp_path: Path) -> None:
    build = _copy_tools(tmp_path / "tools")
    istiod = tmp_path / "tools" / "istiod" / "go.mod"
    text = istiod.read_text()
    [line] = [line for line in text.splitlines() if "istio.io/istio " in line]
    istiod.write_text(text.replace(line, "\tistio.io/istio v0.0.0-20990101000000-000000000000"))
    result = _run(build, tmp_path)
    assert result.returncode == 2
    assert "go must not run" not in result.stderr
    assert result.stderr.startswith("tools/istioctl/build: go.mod pins istio.io/istio "), result
    assert "go get istio.io/istio/istioctl/cmd/istioctl@v0.0.0-20990101000000" in result.stderr
    assert not (tmp_path / "cache").exists()
