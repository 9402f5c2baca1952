"""The client side of a bench phase: `bench.clients` processes and their reports.

N streams are split evenly over P processes; process 0 also captures the
bytes the floor replays. Each process's stdout is read by a task that routes
its JSON reports; a process that reports an error or exits early fails every
wait at once rather than letting it time out.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.procs import PYTHON, Child, spawn

T = TypeVar("T")
Report = dict[str, Any]
Expected = Collection[tuple[str, str]]  # (type URL, resource name) of each resource a change sends


@dataclass(frozen=True)
class FleetSpec:
    """How many streams, in how many processes, over how many channels each."""

    streams: int
    processes: int = 1
    channels: int = 8
    retries: int = 0  # per stream, with Envoy's backoff
    nodes: Path | None = None  # sidecars: their nodes, one JSON line per stream (bench.clients)
    secrets: bool = False  # sidecars: each also an SDS stream for `default` and `ROOTCA`

    def shares(self) -> list[int]:
        """Streams per process, as even as possible."""
        base, extra = divmod(self.streams, self.processes)
        return [base + (1 if i < extra else 0) for i in range(self.processes) if base or i < extra]


@dataclass(frozen=True)
class SecretsHeld:
    """The sidecars' SDS streams over a sync (times from `time.monotonic()`)."""

    first_request: float
    last_received: float
    streams: int  # holding both secrets

    @property
    def seconds(self) -> float:
        return self.last_received - self.first_request


@dataclass
class _Member:
    child: Child
    synced: asyncio.Future[float]
    updates: asyncio.Queue[Report] = field(default_factory=asyncio.Queue)
    retried: int = 0  # streams that failed and were opened again before the sync
    retries: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # kind -> count
    sync_bytes: dict[str, int] = field(default_factory=dict)  # type URL -> bytes, all its streams
    sync_responses: dict[str, int] = field(default_factory=dict)  # type URL -> responses
    held: dict[str, int] = field(default_factory=dict)  # type URL -> subscribed and held
    secrets: dict[str, float] | None = None  # first SDS request, last certificate in, held


class Fleet:
    """Running client processes against one xDS server."""

    def __init__(self) -> None:
        self.members: list[_Member] = []
        self._readers: list[asyncio.Task[None]] = []
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        return [m.child.pid for m in self.members]

    async def start(
        self, target: str, spec: FleetSpec, workdir: Path, tag: str, capture: Path | None
    ) -> None:
        first = 0
        for i, share in enumerate(spec.shares()):
            argv = [PYTHON, "-m", "bench.clients", "--target", target, "--streams", str(share)]
            argv += ["--channels", str(spec.channels), "--first-id", str(first)]
            argv += ["--retries", str(spec.retries)]
            if spec.nodes is not None:
                argv += ["--nodes", str(spec.nodes)]
            if spec.secrets:
                argv.append("--secrets")
            if i == 0 and capture is not None:
                argv += ["--capture", str(capture)]
            log = workdir / f"clients-{tag}-{i}.log"
            child = await spawn(f"clients {tag} #{i}", argv, log, stdin=True, stdout=True)
            member = _Member(child, asyncio.get_running_loop().create_future())
            self.members.append(member)
            self._readers.append(asyncio.create_task(self._read(member)))
            first += share

    async def _read(self, member: _Member) -> None:
        stdout = member.child.process.stdout
        assert stdout is not None
        while line := await stdout.readline():
            report: Report = json.loads(line)
            if report["event"] == "synced":
                member.retried, member.retries = report["retried"], report["retries"]
                member.failures = report["failures"]
                member.sync_bytes = report["bytes"]
                member.sync_responses = report["sync_responses"]
                member.held = report["held"]
                member.secrets = report.get("secrets")
                member.synced.set_result(float(report["t"]))
            elif report["event"] == "update":
                member.updates.put_nowait(report)
            elif report["event"] == "error":
                self._fail(f"{member.child.name}: {report['message']}")
        if not self._stopping:
            self._fail(f"{member.child.name} exited early\n{member.child.log_tail()}")

    def _fail(self, message: str) -> None:
        if not self._failure.done():
            self._failure.set_exception(RuntimeError(message))

    async def _guard(self, awaitable: Awaitable[T]) -> T:
        """Await, but fail as soon as a client fails."""
        task = asyncio.ensure_future(awaitable)
        either: list[asyncio.Future[Any]] = [task, self._failure]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            self._failure.result()  # raises the failure
            raise AssertionError("unreachable")
        finally:
            if not task.done():
                task.cancel()
                task.add_done_callback(_consume)

    async def wait_synced(self) -> float:
        """When the last process had all its streams synced."""
        times = await self._guard(asyncio.gather(*(m.synced for m in self.members)))
        return max(times)

    def retried(self) -> tuple[int, int, dict[str, int]]:
        """Streams opened again before the sync, retries in all, and why they failed."""
        failures: dict[str, int] = {}
        for member in self.members:
            for kind, count in member.failures.items():
                failures[kind] = failures.get(kind, 0) + count
        retried = sum(m.retried for m in self.members)
        return retried, sum(m.retries for m in self.members), failures

    def sync_traffic(self) -> tuple[Counter[str], Counter[str]]:
        """Bytes and responses per type URL all streams received until synced."""
        sent: Counter[str] = Counter()
        responses: Counter[str] = Counter()
        for member in self.members:
            sent.update(member.sync_bytes)
            responses.update(member.sync_responses)
        return sent, responses

    def held(self) -> Counter[str]:
        """Per type URL, the assignments (and routes) all streams subscribed to and held
        when synced: what the server's mesh gave them to follow."""
        held: Counter[str] = Counter()
        for member in self.members:
            held.update(member.held)
        return held

    def secrets(self) -> SecretsHeld | None:
        """With SDS streams: over every process, the first SDS request, the last stream's
        receipt of its certificate, and how many streams hold both secrets."""
        reports = [m.secrets for m in self.members if m.secrets is not None]
        if not reports:
            return None
        return SecretsHeld(
            min(r["first"] for r in reports),
            max(r["last"] for r in reports),
            int(sum(r["held"] for r in reports)),
        )

    async def updates_for(self, expected: Expected) -> list[list[Report]]:
        """Per process, its reports that all its streams got a new version of each expected
        resource, in the order they came; a report of anything else fails the wait."""
        waits = (_updates(m, set(expected)) for m in self.members)
        return await self._guard(asyncio.gather(*waits))

    async def stop(self) -> None:
        self._stopping = True
        await asyncio.gather(*(m.child.stop() for m in self.members))
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        if self._failure.done():
            self._failure.exception()  # retrieved: no "never retrieved" warning


async def _updates(member: _Member, expected: set[tuple[str, str]]) -> list[Report]:
    reports = []
    while expected:
        report = await member.updates.get()
        key = (report["type"], report["name"])
        if key not in expected:
            raise RuntimeError(f"expected updates of {sorted(expected)}, got one of {key}")
        expected.discard(key)
        reports.append(report)
    return reports


def _consume(task: asyncio.Future[Any]) -> None:
    """Mark a cancelled wait's outcome as seen (no "exception never retrieved" noise)."""
    if not task.cancelled():
        task.exception()
