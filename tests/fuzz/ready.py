"""How long pilot's `/ready` takes to answer, sampled all the time and right after each example.

A probe is one plain HTTP/1.1 GET on a fresh connection, as a kubelet makes it,
timed from connecting to the end of the reply. `ReadyProber` probes every
`interval` seconds in the background; `window(since)` is the worst answer of the
probes that were still waiting at or after `since`, so a probe stuck behind an
event loop that pilot keeps busy counts for the example that kept it busy.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass

LIMIT = 0.100  # seconds /ready may take
PROBE_TIMEOUT = 10.0


@dataclass(frozen=True)
class Sample:
    """One probe: when it started and ended (time.monotonic) and the HTTP status (0: none)."""

    start: float
    end: float
    status: int

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.latency <= LIMIT

    def __str__(self) -> str:
        status = self.status or "no answer"
        return f"/ready answered {status} in {self.latency * 1e3:.1f} ms"


async def probe(port: int, timeout: float = PROBE_TIMEOUT) -> Sample:  # noqa: ASYNC109
    """GET /ready once on a new connection."""
    start = time.monotonic()
    status = 0
    with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
        async with asyncio.timeout(timeout):
            status = await _get_ready(port)
    return Sample(start, time.monotonic(), status)


async def _get_ready(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        status_line = await reader.readline()
        await reader.read()
        return int(status_line.split()[1])
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class ReadyProber:
    """Probes `/ready` every `interval` seconds until stopped; keeps the worst and the latest."""

    def __init__(self, port: int, interval: float = 0.01, keep: int = 2000) -> None:
        self.port = port
        self.interval = interval
        self.recent: collections.deque[Sample] = collections.deque(maxlen=keep)
        self.worst: Sample | None = None
        self.count = 0
        self._in_flight: asyncio.Task[Sample] | None = None
        self._task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        """Forget the worst answer so far (a run's measure starts here)."""
        self.worst = None
        self.count = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ready-prober")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self.probe_now()
            await asyncio.sleep(self.interval)  # the sampling period, not a wait for anything

    async def probe_now(self) -> Sample:
        """One probe, recorded like the background ones."""
        self._in_flight = asyncio.ensure_future(probe(self.port))
        sample = await asyncio.shield(self._in_flight)
        self._record(sample)
        return sample

    def _record(self, sample: Sample) -> None:
        if sample in self.recent:
            return  # the background loop and a caller awaited the same probe
        self.count += 1
        self.recent.append(sample)
        if self.worst is None or _worse(sample, self.worst):
            self.worst = sample

    async def window(self, since: float) -> Sample:
        """After an example that started at `since`: the probe in flight is awaited, one
        more is made, and the worst of those still waiting at or after `since` returned."""
        if self._in_flight is not None and not self._in_flight.done():
            self._record(await asyncio.shield(self._in_flight))
        last = await probe(self.port)
        self._record(last)
        overlapping = [s for s in self.recent if s.end >= since]
        return max(overlapping, key=_badness)


def _badness(sample: Sample) -> tuple[bool, float]:
    return (sample.status != 200, sample.latency)


def _worse(a: Sample, b: Sample) -> bool:
    return _badness(a) > _badness(b)
