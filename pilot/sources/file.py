"""The file registry: Kubernetes-shaped YAML, reloaded when the file changes.

Reads Service, EndpointSlice and Endpoints documents, multi-document or
`kind: List` (what `kubectl get svc,endpointslices -A -o yaml` prints). Each
good version of the file replaces the registry's state (only the difference is
pushed); a broken version is reported with the file and what is wrong, and
the last good state keeps being served.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pilot.registry.kubernetes_objects import (
    SUPPORTED_KINDS,
    ObjectError,
    object_label,
    parse_endpoint_slice,
    parse_endpoints,
    parse_service,
)
from pilot.registry.model import EndpointSet, Service
from pilot.registry.updater import RegistryUpdater

log = logging.getLogger("pilot.sources.file")

# libyaml parses a large registry an order of magnitude faster than pure Python.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class RegistryFileError(ValueError):
    """The registry file cannot be used; the message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class RegistryState:
    """Everything one version of the file says."""

    services: tuple[Service, ...]
    endpoint_sets: tuple[EndpointSet, ...]


def _documents(text: str, origin: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    try:
        loaded = list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as error:
        raise RegistryFileError(f"{origin}: not valid YAML: {error}") from error
    for number, document in enumerate(loaded, start=1):
        if document is None:
            continue
        if not isinstance(document, Mapping):
            raise RegistryFileError(f"{origin}: document {number} is not a mapping")
        if document.get("kind") == "List" or str(document.get("kind", "")).endswith("List"):
            items = document.get("items") or []
            if not isinstance(items, list):
                raise RegistryFileError(f"{origin}: document {number}: items must be a list")
            for index, item in enumerate(items):
                yield f"{origin}: document {number} item {index}", item
        else:
            yield f"{origin}: document {number}", document


def _kind_of(where: str, obj: Any) -> str:
    if not isinstance(obj, Mapping):
        raise RegistryFileError(f"{where}: not a mapping")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise RegistryFileError(f"{where}: has no kind (is it a Kubernetes object?)")
    return kind


def parse_registry(text: str, origin: str) -> RegistryState:
    """Parse a whole file; raises RegistryFileError naming the first bad object."""
    services: list[Service] = []
    endpoint_sets: list[EndpointSet] = []
    for where, obj in _documents(text, origin):
        kind = _kind_of(where, obj)
        if kind not in SUPPORTED_KINDS:
            log.debug("%s: skipping %s", where, object_label(obj))
            continue
        try:
            if kind == "Service":
                services.append(parse_service(obj))
            elif kind == "EndpointSlice":
                parsed = parse_endpoint_slice(obj)
                if parsed is not None:
                    endpoint_sets.append(parsed)
            else:
                endpoint_sets.append(parse_endpoints(obj))
        except ObjectError as error:
            raise RegistryFileError(f"{where}: {error}") from error
    return RegistryState(tuple(services), tuple(endpoint_sets))


class FileRegistry:
    """Applies each good version of a registry file to the registry."""

    def __init__(
        self,
        path: Path,
        updater: RegistryUpdater,
        poll_interval: float = 0.5,
    ) -> None:
        self.path = path
        self._updater = updater
        self._poll_interval = poll_interval
        self._stat: tuple[int, int, int] | None = None
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._digest = b""
        self._empty_seen = False
        self.last_error: str | None = None

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def start(self) -> None:
        """Read the file once and keep polling it."""
        self._changed_on_disk()
        self.load()
        self._task = asyncio.create_task(self._poll(), name="file-registry")

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def load(self) -> None:
        """Read the file now and apply it if it is new and good."""
        try:
            data = self.path.read_bytes()
        except OSError as error:
            self._reject(f"{self.path}: cannot read: {error.strerror or error}")
            return
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:
            return  # already applied, or already reported as broken
        if not data.strip() and not self._empty_seen:
            # Editors truncate before writing: only an emptiness that lasts is real.
            self._empty_seen = True
            return
        self._empty_seen = False
        self._digest = digest
        try:
            state = parse_registry(data.decode("utf-8", errors="replace"), str(self.path))
        except RegistryFileError as error:
            self._reject(str(error))
            return
        self.last_error = None
        self._updater.replace_all(state.services, state.endpoint_sets)
        log.info(
            "loaded %s: %d services, %d endpoint sets",
            self.path,
            len(state.services),
            len(state.endpoint_sets),
        )
        self._synced.set()

    def _reject(self, message: str) -> None:
        if message != self.last_error:
            log.error("%s; keeping the last good registry", message)
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
            if self._changed_on_disk() or self._empty_seen:
                self.load()
