"""The Envoy `pilot agent proxy` (or `--binary-path`) starts: bootstrap on disk, one child.

Like Istio's pilot-agent: the binary is `--binary-path`, else `envoy` found on
PATH (`find_envoy`; neither is a one-line error before anything starts). The
bootstrap (`pilot.agent.bootstrap`) is written to `--config-path`/envoy-rev.json
(0644: it holds no secret; the token stays in its own file), through a fresh
temporary file made with O_EXCL and renamed into place, so a link planted in a
shared directory (an emptyDir is 0777) is never followed. Then Envoy runs as a
child of the agent, as the agent's user, and dies with it (PR_SET_PDEATHSIG).
Envoy must not run as root when traffic is captured: the capture rules let only
uid 1337's traffic out uncaptured, so root's own upstream connections would loop
back into Envoy; the agent refuses to start it then. If Envoy exits on its own,
the agent says so and stops too (exit status 1): a sidecar without its proxy is
not a sidecar.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("pilot.agent")

BOOTSTRAP_FILE = "envoy-rev.json"
DEFAULT_CONFIG_PATH = Path("./etc/istio/proxy")
SIDECAR_CONFIG_PATH = Path("/etc/istio/proxy")  # `pilot agent proxy`: Istio's istio-envoy volume
ENVOY_ON_PATH = "envoy"
STOP_GRACE = 10.0
_PR_SET_PDEATHSIG = 1


class EnvoyStartError(OSError):
    """Envoy cannot be started as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class EnvoySettings:
    """`--binary-path`, `--config-path`, `--proxy-log-level`, `--concurrency`."""

    binary: Path
    config_path: Path = DEFAULT_CONFIG_PATH
    log_level: str = "warning"
    concurrency: int = 2


def find_envoy(binary: Path | None, search_path: str | None = None) -> Path:
    """`binary` when given, else `envoy` on PATH (`search_path`); EnvoyStartError if none."""
    if binary is not None:
        return binary
    found = shutil.which(ENVOY_ON_PATH, path=search_path)
    if found is None:
        raise EnvoyStartError(
            f"no `{ENVOY_ON_PATH}` on PATH: install Envoy there or name it with --binary-path"
        )
    return Path(found)


def write_bootstrap(config_path: Path, bootstrap: dict[str, Any]) -> Path:
    """envoy-rev.json under `config_path` (made 0755 if missing); its path."""
    path = config_path / BOOTSTRAP_FILE
    try:
        config_path.mkdir(parents=True, exist_ok=True, mode=0o755)
        descriptor, name = tempfile.mkstemp(prefix=".envoy-rev.", dir=config_path)
        try:
            with os.fdopen(descriptor, "w") as file:
                os.fchmod(file.fileno(), 0o644)  # no secret in it; Envoy reads it
                file.write(json.dumps(bootstrap, indent=2))
            os.replace(name, path)  # Envoy never reads half a file
        except BaseException:
            os.unlink(name)
            raise
    except OSError as error:
        raise EnvoyStartError(
            f"--config-path {config_path}: cannot write {BOOTSTRAP_FILE}: {error.strerror or error}"
        ) from error
    return path


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the agent goes, however it goes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class EnvoyChild:
    """One Envoy process, started after SDS serves and stopped before SDS goes."""

    def __init__(self, settings: EnvoySettings, on_exit: Callable[[int], None]) -> None:
        self.settings = settings
        self._on_exit = on_exit
        self.process: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    @staticmethod
    def check_user(interception_mode: str) -> None:
        """Refuse root when traffic is captured (see the module docstring)."""
        if os.geteuid() == 0 and interception_mode != "NONE":
            raise EnvoyStartError(
                "pilot agent runs as root, and Envoy would too: the capture"
                " rules exempt only the proxy's uid (1337), so Envoy's own connections would"
                " be captured back into it; run the agent as uid 1337 (or set"
                " ISTIO_META_INTERCEPTION_MODE=NONE where no traffic is captured)"
            )

    def command(self, bootstrap: Path) -> list[str]:
        return [
            str(self.settings.binary),
            "-c", str(bootstrap),
            "--disable-hot-restart",
            "--concurrency", str(self.settings.concurrency),
            "--log-level", self.settings.log_level,
            "--drain-time-s", "5",
        ]  # fmt: skip

    async def start(self, bootstrap: Path) -> None:
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.command(bootstrap),
                stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            raise EnvoyStartError(
                f"--binary-path {self.settings.binary}: cannot start Envoy: "
                f"{error.strerror or error}"
            ) from error
        log.info(
            "started Envoy (pid %d, uid %d) with %s", self.process.pid, os.geteuid(), bootstrap
        )
        self._watch = asyncio.create_task(self._wait(self.process), name="envoy")

    async def _wait(self, process: asyncio.subprocess.Process) -> None:
        status = await process.wait()
        if not self._stopping:
            log.error("Envoy (pid %d) exited with status %d: stopping", process.pid, status)
            self._on_exit(status)

    async def stop(self) -> None:
        """SIGTERM, SIGKILL after STOP_GRACE seconds."""
        self._stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            async with asyncio.timeout(STOP_GRACE):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._watch is not None:
            await self._watch
