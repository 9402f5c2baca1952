"""Fixtures for tests that run real Envoy processes against a real pilot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap
from tests.support.pilot import RunningPilot

StartEnvoy = Callable[[RunningPilot, str, str], AbstractAsyncContextManager[EnvoyProcess]]


@pytest.fixture
def start_envoy(tmp_path: Path) -> StartEnvoy:
    """`async with start_envoy(pilot, "envoy-ads-delta.yaml", "node-1") as envoy:`."""

    @asynccontextmanager
    async def start(pilot: RunningPilot, example: str, node_id: str) -> AsyncIterator[EnvoyProcess]:
        bootstrap = load_example_bootstrap(example, pilot.grpc_port, node_id)
        workdir = tmp_path / node_id
        workdir.mkdir()
        async with EnvoyProcess(bootstrap, workdir, node_id, log_level="warning") as envoy:
            yield envoy

    return start
