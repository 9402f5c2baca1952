"""Smoke test of `python -m bench.locality_variants`: a tiny run prints every row, each a
finite figure, and with no rule a new locality encodes nothing while a rule asking for
locality load balancing encodes one assignment per service."""

from __future__ import annotations

import math

import pytest

from bench import locality_variants


def test_a_tiny_run_prints_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert locality_variants.main(["--services", "20", "--localities", "3", "--repeat", "1"]) == 0
    rows = dict(line.rsplit(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    assert len(rows) == 4 * len(locality_variants.POLICIES)
    assert all(math.isfinite(float(figure)) for figure in rows.values())
    assert float(rows["no rule: a new locality: assignments encoded"]) == 0
    assert float(rows["outlierDetection: a new locality: assignments encoded"]) == 20
    assert float(rows["no rule: one endpoint change, 3 localities: assignments encoded"]) == 1
    assert float(rows["distribute: one endpoint change, 3 localities: assignments encoded"]) == 4
