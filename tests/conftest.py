"""The suite's tiers: the wings that start real processes are `slow`.

The wings that start Envoys, pilot as a command, pods, containers or a
Kubernetes control plane are marked `slow`; `pytest -m "not slow"` runs the rest
(unit, protocol) as a quick loop, in well under two minutes.

In parallel (pytest-xdist, `--dist loadfile`, pyproject's default) each test
module stays on one worker, so its module-scoped fixtures (a mesh of pods, a
pilot, an engine) are made once; each worker of the cluster tier starts its own
control plane. What the machine has only once (the Quick start's fixed ports) is
taken in turn: tests.support.machine_lock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SLOW_WINGS = frozenset({"integration", "security", "fuzz", "cluster", "harness"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        wing = item.path.resolve().relative_to(TESTS).parts[0]
        if wing in SLOW_WINGS or item.get_closest_marker("envoy"):
            item.add_marker(pytest.mark.slow)
