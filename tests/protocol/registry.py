"""The registry file as the protocol tests edit it, and a way to know pilot has read it.

The registry starts with three services, each with one port (80 -> 8080):
`a` (two endpoints), `b` and `c` (one each). Tests edit a `Registry` and
`await registry.write()`, which returns once pilot has *read* the new file, so
that a test can tell "pilot saw it and sent nothing" from "pilot has not looked
yet" without sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pilot.sources.file import FileSource
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.pilot import RunningPilot
from tests.support.xds_client import DEFAULT_TIMEOUT

A, B, C, D = (cluster_name(s) for s in "abcd")
GHOST = cluster_name("ghost")

BASE: dict[str, list[str]] = {
    "a": ["10.0.1.1", "10.0.1.2"],
    "b": ["10.0.2.1"],
    "c": ["10.0.3.1"],
}

# A kind pilot does not read: adding one changes the file but not the registry.
CONFIG_MAP: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "unrelated", "namespace": "default"},
    "data": {"key": "value"},
}


def mesh(
    endpoints: Mapping[str, Sequence[str] | None],
    grpc: Collection[str] = (),
    unready: Mapping[str, Sequence[str]] | None = None,
    udp: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Services with one TCP port each (80, named http) and their ready endpoints (port 8080).

    `endpoints[name]` None: the service has no EndpointSlice at all. `grpc`: services
    whose port has appProtocol grpc. `unready`: extra not-ready endpoints per service.
    `udp`: services with a second, UDP, port (pilot makes no cluster of it).
    """
    objects: list[dict[str, Any]] = []
    for name, ips in sorted(endpoints.items()):
        svc = service(name)
        ports = svc["spec"]["ports"]
        if name in grpc:
            ports[0]["appProtocol"] = "grpc"
        if name in udp:
            ports.append({"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"})
        objects.append(svc)
        if ips is not None:
            eps = [Ep(ip) for ip in ips]
            eps += [Ep(ip, ready=False) for ip in (unready or {}).get(name, [])]
            objects.append(endpoint_slice(name, eps))
    return objects


class FileReads:
    """Counts pilot's reads of its registry file.

    Wraps the file source's `load`, which its poller calls each time the file
    changes on disk. A read that starts after a write has seen that write.
    """

    def __init__(self, pilot: RunningPilot) -> None:
        source = pilot.discovery.source
        assert isinstance(source, FileSource), "these tests feed pilot from a file"
        original = source.load
        self.count = 0
        self._read = asyncio.Event()

        async def counted_load() -> Any:
            result = await original()
            self.count += 1
            self._read.set()
            return result

        source.load = counted_load  # type: ignore[method-assign]

    async def after(
        self,
        count: int,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
    ) -> None:
        """Wait until pilot has read the file more than `count` times."""
        try:
            async with asyncio.timeout(timeout):
                while self.count <= count:
                    self._read.clear()
                    await self._read.wait()
        except TimeoutError:
            message = f"pilot did not read its registry file within {timeout}s"
            raise AssertionError(message) from None


@dataclass
class Registry:
    """The registry file: service name -> ready endpoint IPs (None: no EndpointSlice),
    and the other knobs of `mesh`, plus some that change nothing pilot reads."""

    pilot: RunningPilot
    reads: FileReads
    endpoints: dict[str, list[str] | None] = field(default_factory=lambda: {**BASE})
    grpc: set[str] = field(default_factory=set)
    unready: dict[str, list[str]] = field(default_factory=dict)
    udp: set[str] = field(default_factory=set)
    ignored: list[dict[str, Any]] = field(default_factory=list)  # objects pilot skips
    reverse: bool = False  # write the objects in reverse order
    _fresh: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def renumber(self, service: str) -> None:
        """Give a service one endpoint at an address no endpoint has had in this test."""
        n = next(self._fresh)
        self.endpoints[service] = [f"10.200.{n // 250}.{n % 250 + 1}"]

    def objects(self) -> list[dict[str, Any]]:
        objects = mesh(self.endpoints, self.grpc, self.unready, self.udp) + self.ignored
        return objects[::-1] if self.reverse else objects

    def ips(self, cluster: str) -> set[str] | None:
        """The endpoint IPs pilot should serve for a cluster name; None if it does not exist."""
        for name, ips in self.endpoints.items():
            if cluster_name(name) == cluster:
                return set(ips or ())
        return None

    async def write(self) -> None:
        """Rewrite the file and wait until pilot has read it."""
        before = self.reads.count
        self.pilot.write(self.objects())
        await self.reads.after(before)
