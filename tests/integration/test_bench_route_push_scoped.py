"""Smoke test of `python -m bench.route_push`'s namespace-scoped series: a tiny run (10
sidecars of their namespace, 5 of namespace front) prints a row for a change to the
VirtualService front exports to itself alone, sent as one RDS response to each of front's
sidecars (5 of 15: 0.33 per sidecar) and nothing else, with finite positive latencies,
and one for an endpoint change under front's own DestinationRule, one EDS response to
each of front's sidecars (its subset's assignment, from their namespace's flavor)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCOPED = "weight, exported to one namespace (5 sidecars)"
SCOPED_ENDPOINTS = "endpoint, under that namespace's own DestinationRule (5 sidecars)"


def test_a_namespace_scoped_change_reaches_that_namespaces_sidecars_alone() -> None:
    command = [sys.executable, "-m", "bench.route_push", "--services", "20", "--sidecars", "10"]
    command += ["--front", "5", "--changes", "3", "--processes", "1"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| ")
    }
    assert rows[SCOPED][3] == "rds 0.33", done.stdout
    assert rows[SCOPED_ENDPOINTS][3] == "eds 0.33", done.stdout
    assert rows["weight (VirtualService)"][3] == "rds 1.00", done.stdout
    for timed in [*rows[SCOPED][:2], *rows[SCOPED_ENDPOINTS][:2]]:
        p50, p99 = (float(v.removesuffix(" ms").replace(",", "")) for v in timed.split(" / "))
        assert 0 < p50 <= p99, done.stdout
