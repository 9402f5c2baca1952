"""Smoke test of `python -m bench.traffic_rules`: a tiny run prints every row, each a
finite figure, and the objects it times are ones pilot accepts (a refused one would
time an error path)."""

from __future__ import annotations

import math

import pytest

from bench import traffic_rules
from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.virtual_service import parse_virtual_service


def test_a_tiny_run_prints_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert traffic_rules.main(["--services", "20", "--repeat", "1"]) == 0
    rows = [line.rsplit(maxsplit=1) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 7
    for label, figure in rows:
        assert math.isfinite(float(figure)), label
        if "per service" not in label:  # a difference of two timings: any sign on 20
            assert float(figure) > 0, label


def test_the_timed_objects_are_accepted() -> None:
    parse_destination_rule(traffic_rules.destination_rule("svc0"), "cluster.local")
    parse_virtual_service(traffic_rules.virtual_service("svc0"), "cluster.local")
    for costly in traffic_rules.costliest():
        parse_virtual_service(costly, "cluster.local")
