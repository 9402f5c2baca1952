"""Run a real pilot `Discovery` in the test's event loop, on ephemeral loopback ports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pilot.app import Discovery
from pilot.push.debounce import DebounceSettings
from pilot.settings import Settings
from tests.support.mesh import write_mesh

FAST_DEBOUNCE = DebounceSettings(after=0.02, max_delay=1.0, eds_debounce=True)


@dataclass
class RunningPilot:
    """A started pilot and the file that feeds it."""

    discovery: Discovery
    config: Path

    @property
    def grpc_port(self) -> int:
        return self.discovery.grpc.port

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_port(self) -> int:
        return self.discovery.http.port

    def write(self, objects: Iterable[dict[str, Any]]) -> None:
        """Replace the registry file; pilot notices and pushes."""
        write_mesh(self.config, objects)


@asynccontextmanager
async def running_pilot(
    tmp_path: Path,
    objects: Iterable[dict[str, Any]],
    debounce: DebounceSettings = FAST_DEBOUNCE,
) -> AsyncIterator[RunningPilot]:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, objects)
    settings = Settings(
        grpc_addr="127.0.0.1:0",
        http_addr="127.0.0.1:0",
        config=config,
        debounce=debounce,
        file_poll_interval=0.02,
        shutdown_grace=0.5,
    )
    discovery = Discovery(settings)
    await discovery.start()
    try:
        yield RunningPilot(discovery, config)
    finally:
        await discovery.stop()
