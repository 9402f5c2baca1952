"""Smoke test of `python -m bench.sidecar --istiod`: a tiny run end to end puts istiod's
figures beside pilot's and the floor's.

It needs istiod (tools/istiod/build: Go and the Go module proxy; a first build takes
4.5 to 12 minutes, .ci/run makes it before the tests) and the Kubernetes binaries
(tools/kube/build); skipped without Go.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import istiod
from tests.cluster.control_plane import build_binaries

ROOT = Path(__file__).resolve().parents[2]
BUILD_SECONDS = 900  # a first build of istiod on 2 shared cores (a cache hit: at once)
RUN_SECONDS = 170  # a real API server's first start bootstraps its roles: tens of seconds
COLUMNS = ["pilot", "istiod", "floor", "istiod/pilot"]
# Rows whose istiod figure is positive (RSS deltas may be anything).
POSITIVE = (
    "initial sync (s)",
    "CPU over the sync (s)",
    "CDS per sidecar (KiB)",
    "EDS per sidecar (KiB)",
    "LDS per sidecar (KiB)",
    "RDS per sidecar (KiB)",
    "bytes per sidecar (KiB)",
    "RSS with all synced (MiB)",
    "per service added: CPU (ms)",
    "per endpoint changed: CPU (ms)",
    "  latency p50 (ms)",
    "  latency p99 (ms)",
)


def _table(output: str) -> dict[str, list[list[float]]]:
    """The pilot / istiod / floor table: per row label, its figures (a label may repeat:
    latency rows of both series)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == COLUMNS)
    rows: dict[str, list[list[float]]] = {}
    for line in lines[start + 1 :]:
        label, cells = line[:34].rstrip(), line[34:].split()
        if len(cells) != 4:
            break
        rows.setdefault(label, []).append([float(cell) for cell in cells])
    return rows


def _build_istiod() -> None:
    path = os.environ.get("PATH", "")
    env = {**os.environ, "PATH": f"{path}:{istiod.GO_ARCHIVE_BIN}"}
    subprocess.run(
        [str(istiod.BUILD)], cwd=ROOT, env=env, capture_output=True, timeout=BUILD_SECONDS,
        check=True,
    )  # fmt: skip


@pytest.mark.timeout(BUILD_SECONDS + RUN_SECONDS + 60)
def test_bench_sidecar_istiod_prints_istiod_beside_pilot() -> None:
    # Built first, on their own clocks: a first build takes minutes.
    _build_istiod()
    build_binaries()
    command = [sys.executable, "-m", "bench.sidecar", "--services", "6", "--clients", "4"]
    command += ["--additions", "2", "--changes", "2", "--timeout", "60", "--istiod"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_SECONDS, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    rows = _table(out)
    for label in POSITIVE:
        assert label in rows, f"no {label!r} row in:\n{out}"
        for cells in rows[label]:
            # Every column a figure; istiod's measured (the floor's sync CPU may round to 0).
            assert all(math.isfinite(v) for v in cells) and cells[1] > 0, f"{label}: {cells}"
    (rss,) = rows["RSS per sidecar (KiB)"]
    assert all(math.isfinite(v) for v in rss[:3]), rss
    assert len(rows["  latency p50 (ms)"]) == 2, out  # a service added, an endpoint changed
    # istiod got every sidecar each service added (four types) and each endpoint changed.
    sent = "istiod: responses per sidecar per service added: CDS 1.00, EDS 1.00, LDS 1.00,"
    assert sent + " RDS 1.00; per endpoint changed: EDS 1.00" in out, out
    assert "istiod's sync: " in out and "/ready during it p99" in out, out
