"""Fixtures for the protocol tests: a real pilot fed by a registry file, and an xDS client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.protocol.registry import BASE, FileReads, Registry, mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.xds_client import XdsClient


@pytest.fixture
async def pilot(tmp_path: Path) -> AsyncIterator[RunningPilot]:
    # No drain on stop: these tests are about streams while they live.
    async with running_pilot(tmp_path, mesh(BASE), drain_duration=0.0) as running:
        yield running


@pytest.fixture
def registry(pilot: RunningPilot) -> Registry:
    return Registry(pilot, FileReads(pilot))


@pytest.fixture
async def xds(pilot: RunningPilot) -> AsyncIterator[XdsClient]:
    client = XdsClient(pilot.grpc_target)
    try:
        yield client
    finally:
        await client.aclose()
