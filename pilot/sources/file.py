"""The file source: Kubernetes objects in a file, reloaded when the file changes.

What the file may say is `file_format`'s; parsing a large one happens off the
event loop (`parse_worker`). Each good version of the file replaces the
registry's state (only the difference is pushed); a broken version is reported
with the file and what is wrong, counted (`rejected`, by reason: `unreadable`,
`empty`, `invalid`), and the last good state keeps being served. An empty file
(zero bytes, whitespace, no document) is a broken version too: it is what a
truncating save leaves mid-write, and applying it would withdraw every cluster
from every Envoy. An empty registry is written as an empty `kind: List`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from pilot.registry.model import DEFAULT_CLUSTER_ID
from pilot.registry.updater import RegistryUpdater
from pilot.runtime.supervisor import SupervisedTask, Supervisor
from pilot.sources.file_format import (
    EmptyRegistryFile,
    RegistryFileError,
    RegistryState,
    is_blank,
    parse_registry,
)
from pilot.sources.parse_worker import parse_off_loop

__all__ = ["FileSource", "RegistryFileError", "RegistryState", "parse_registry"]

log = logging.getLogger("pilot.sources.file")

UNREADABLE, EMPTY, INVALID = "unreadable", "empty", "invalid"  # why a version was rejected
_NOT_READY = "not ready until a good version is written"  # at start: no last good state


class FileSource:
    """Applies each good version of a registry file to the registry."""

    def __init__(
        self,
        path: Path,
        updater: RegistryUpdater,
        poll_interval: float = 0.5,
        cluster: str = DEFAULT_CLUSTER_ID,
        *,
        cluster_domain: str = "cluster.local",
        supervisor: Supervisor | None = None,
        rejected: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        self.cluster = cluster  # the local cluster: documents naming none belong to it
        self.cluster_domain = cluster_domain  # short hosts of Istio objects resolve in it
        self._clusters: set[str] = set()  # the clusters the last good version held
        self._updater = updater
        self._poll_interval = poll_interval
        self._stat: tuple[int, int, int] | None = None
        self._synced = asyncio.Event()
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._task: SupervisedTask | None = None
        self._digest = b""
        self._count_rejected = rejected or (lambda _reason: None)  # a metric, by reason
        self.last_error: str | None = None

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def start(self) -> None:
        """Read the file once and keep polling it."""
        self._changed_on_disk()
        await self.load()
        self._task = self._supervisor.start("file-registry", self._poll)

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def stop(self) -> None:
        if self._task is not None:
            await self._supervisor.stop_task(self._task)

    async def load(self) -> None:
        """Read the file now and apply it if it is new and good."""
        started = time.monotonic()
        try:
            data, digest = await asyncio.to_thread(_read, self.path)
        except OSError as error:
            self._reject(f"{self.path}: cannot read: {error.strerror or error}", UNREADABLE)
            return
        if digest == self._digest:
            return  # already applied, or already reported as broken
        self._digest = digest
        try:
            if is_blank(data):
                raise EmptyRegistryFile(str(self.path))
            state = await parse_off_loop(data, str(self.path), self.cluster, self.cluster_domain)
        except EmptyRegistryFile as error:
            self._reject(str(error), EMPTY)
            return
        except RegistryFileError as error:
            self._reject(str(error), INVALID)
            return
        self.last_error = None
        self._apply(state)
        log.info(
            "loaded %s: %d services, %d endpoint sets in %.2f s",
            self.path,
            len(state.services),
            len(state.endpoint_sets),
            time.monotonic() - started,
        )
        self._synced.set()

    def _apply(self, state: RegistryState) -> None:
        """Each cluster the file holds, or held, is now what the file says of it: the
        file owns those clusters, and nothing of clusters watched elsewhere."""
        clusters = {s.cluster for s in state.services} | {
            s.key.cluster for s in state.endpoint_sets
        }
        clusters |= {pod.key.cluster for pod in state.pods}
        for cluster in sorted(clusters | self._clusters):
            self._updater.replace_cluster(
                cluster,
                [s for s in state.services if s.cluster == cluster],
                [s for s in state.endpoint_sets if s.key.cluster == cluster],
            )
            self._updater.replace_pods(cluster, [p for p in state.pods if p.key.cluster == cluster])
        self._clusters = clusters
        self._updater.replace_peer_authentications(state.peer_authentications)
        self._updater.replace_authorization_policies(state.authorization_policies)
        for message in state.config_errors:  # one line each; the rest of the file applies
            log.warning("%s; its last good version (if any) keeps serving", message)
        self._updater.replace_traffic(state.traffic, state.unsupported, state.refused)
        self._updater.replace_request_authentications(
            state.request_authentications, state.jwt_refused
        )

    def _reject(self, message: str, reason: str) -> None:
        """Report a version that is not applied (an empty one as a warning: it is a write
        not finished yet, most often); the last good state stays."""
        self._count_rejected(reason)
        if message != self.last_error:
            level = logging.WARNING if reason == EMPTY else logging.ERROR
            kept = "keeping the last good registry" if self.synced else _NOT_READY
            log.log(level, "%s; %s", message, kept)
        self.last_error = message

    def _changed_on_disk(self) -> bool:
        try:
            info = os.stat(self.path)
        except OSError:
            current = None
        else:
            current = (info.st_mtime_ns, info.st_size, info.st_ino)
        if current == self._stat:
            return False
        self._stat = current
        return True

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            if self._changed_on_disk():
                await self.load()


def _read(path: Path) -> tuple[bytes, bytes]:
    """The file's bytes and their digest (in a thread: both release the GIL)."""
    data = path.read_bytes()
    return data, hashlib.sha256(data).digest()
