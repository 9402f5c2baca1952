"""Smoke test of `python -m bench.eds_push`: a tiny run end to end prints a sane table."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = ("latency p50 (ms)", "latency p99 (ms)", "CPU per change (ms)", "memory per client (KiB)")


def _row(output: str, label: str) -> list[float]:
    for line in output.splitlines():
        if line.startswith(label):
            return [float(cell) for cell in line[len(label) :].split()]
    raise AssertionError(f"no {label!r} row in:\n{output}")


def test_bench_prints_finite_positive_table() -> None:
    command = [sys.executable, "-m", "bench.eds_push", "--services", "20", "--clients", "5"]
    command += ["--changes", "5", "--timeout", "60"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "S=20 services" in done.stdout and "N=5 delta ADS clients" in done.stdout
    assert "K=5 endpoint changes" in done.stdout
    for label in ROWS:
        pilot, floor, ratio = _row(done.stdout, label)
        for value in (pilot, floor, ratio):
            assert math.isfinite(value) and value > 0, f"{label}: {pilot} {floor} {ratio}"
