"""The suite's tiers, and which tests share a worker when it runs in parallel.

Tiers: the wings that start real processes (Envoys, pilot as a command, pods,
containers, a Kubernetes control plane) are `slow`; `pytest -m "not slow"` runs
the rest (unit, protocol) as a quick loop, in well under two minutes.

In parallel (pytest-xdist's `--dist loadgroup`, pyproject's default), each test
module stays on one worker, so its module-scoped fixtures (a mesh of pods, a
pilot, an engine) are made once; modules that hold one of the machine's single
things share a group, so they never run at once: the Quick start's fixed ports
(15000, 15010, 15012, 15014), and the Kubernetes control plane that the cluster
tier starts once per worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SLOW_WINGS = frozenset({"integration", "security", "fuzz", "cluster", "harness"})
# Groups of modules that must not run at the same time (each on one worker, in turn).
SHARED = {
    "integration/test_readme_commands.py": "quick-start-ports",
    "security/test_local_surfaces.py": "quick-start-ports",
}
WING_GROUPS = {"cluster": "kubernetes-control-plane"}


def group_of(relative: str) -> str:
    """The xdist group of a test module, by its path under tests/."""
    wing = relative.split("/", 1)[0]
    return SHARED.get(relative) or WING_GROUPS.get(wing) or relative


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        relative = item.path.resolve().relative_to(TESTS).as_posix()
        item.add_marker(pytest.mark.xdist_group(group_of(relative)))
        if relative.split("/", 1)[0] in SLOW_WINGS or item.get_closest_marker("envoy"):
            item.add_marker(pytest.mark.slow)
