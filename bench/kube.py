"""Talking to the test API server (`python -m tests.kubeapi`): changes in, watch events out.

`KubeApi.apply` changes objects through the server's control API
(`POST /_test/apply`). `Watch` watches one resource (EndpointSlices, Services)
the way pilot's informer does, on its own connection, and notes when each
resourceVersion arrives: the server writes an event to all its watches in the
same moment, so that is when the change reached pilot's socket too, give or
take the scheduling of two processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp

SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
SERVICES = "/api/v1/services"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # what pilot's EndpointSlice informer selects


class KubeApi:
    """An HTTP session to the test API server."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        await self.session.close()

    async def resource_version(self) -> str:
        async with self.session.get(f"{self.url}/_test/stats") as response:
            body = await response.json()
        return str(body["result"]["resourceVersion"])

    async def apply(self, obj: dict[str, Any]) -> str:
        """Create or replace obj (or a `kind: List`'s items); returns the new resourceVersion
        (of the last item)."""
        async with self.session.post(f"{self.url}/_test/apply", data=json.dumps(obj)) as response:
            body = await response.json()
            if response.status != 200:
                raise RuntimeError(f"apply failed: HTTP {response.status}: {body}")
        return str(body["result"][-1]["metadata"]["resourceVersion"])


class Watch:
    """A watch on every object of one resource path; arrival time (time.monotonic) per
    resourceVersion."""

    def __init__(self, api: KubeApi, path: str, label_selector: str | None = None) -> None:
        self._api = api
        self._path = path
        self._selector = label_selector
        self._arrivals: dict[str, float] = {}
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        resource_version = await self._api.resource_version()
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
        }
        if self._selector is not None:
            params["labelSelector"] = self._selector
        response = await self._api.session.get(f"{self._api.url}{self._path}", params=params)
        if response.status != 200:
            response.release()
            raise RuntimeError(f"watch failed: HTTP {response.status}")
        self._task = asyncio.create_task(self._read(response))

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        async with response:
            buffer = b""
            async for chunk in response.content.iter_any():
                t = time.monotonic()
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._note(line, t)

    def _note(self, line: bytes, t: float) -> None:
        if not line.strip():
            return
        event = json.loads(line)
        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
            version = str(event["object"]["metadata"]["resourceVersion"])
            self._arrivals.setdefault(version, t)
            self._arrived.set()

    async def arrival(self, resource_version: str) -> float:
        """When the event of this resourceVersion arrived (waiting for it if need be)."""
        while resource_version not in self._arrivals:
            if self._task is None or self._task.done():
                raise RuntimeError(f"the watch of {self._path} is not running")
            self._arrived.clear()
            await self._arrived.wait()
        return self._arrivals.pop(resource_version)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
