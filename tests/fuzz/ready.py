"""How long pilot's `/ready` takes to answer, sampled all the time, from a process of its own.

A probe is one plain HTTP/1.1 GET on a fresh connection, as a kubelet makes it,
timed from connecting to the end of the reply. The probes run in a child process
(`python -m tests.fuzz.ready PORT INTERVAL`), every INTERVAL seconds and at once when
asked (a line on its stdin), and report `start end status` lines (CLOCK_MONOTONIC,
the same clock in every process): the fuzzer's own work cannot delay a probe.

`ReadyProber.window(since)` asks for one more probe and returns the worst of the
probes still waiting at or after `since`, so a probe stuck behind an event loop that
pilot keeps busy counts for the example that kept it busy.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Liveness, not latency: a shared, loaded machine may take a while to answer, but /ready
# must answer. The latency target (100 ms) is bench.fuzz's figure (bench/fuzz_tally.py).
LIVENESS_BOUND = 2.0  # seconds /ready may take before pilot counts as stalled
PROBE_TIMEOUT = 10.0
ROOT = Path(__file__).resolve().parents[2]


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
        return self.status == 200 and self.latency <= LIVENESS_BOUND

    def __str__(self) -> str:
        status = self.status or "no answer"
        return f"/ready answered {status} in {self.latency * 1e3:.1f} ms"


# -- the child process --------------------------------------------------------------------


def probe(port: int, timeout: float = PROBE_TIMEOUT) -> Sample:
    """GET /ready once on a new connection (blocking)."""
    start = time.monotonic()
    status = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        status = _get_ready(port, timeout)
    return Sample(start, time.monotonic(), status)


def _get_ready(port: int, timeout: float) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


def serve(port: int, interval: float) -> None:
    """Probe every `interval` seconds, or at once for each line on stdin; report each."""
    while True:
        asked, _, _ = select.select([sys.stdin], [], [], interval)
        if asked and not sys.stdin.readline():
            return  # stdin closed: the parent is done
        sample = probe(port)
        sys.stdout.write(f"{sample.start:.6f} {sample.end:.6f} {sample.status}\n")
        sys.stdout.flush()


# -- the parent ----------------------------------------------------------------------------


class ReadyProber:
    """The probing child, and the samples it reported: the recent ones and the worst."""

    def __init__(self, port: int, interval: float = 0.01, keep: int = 2000) -> None:
        self.port = port
        self.interval = interval
        self.recent: collections.deque[Sample] = collections.deque(maxlen=keep)
        self.worst: Sample | None = None
        self.count = 0
        self._arrived = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.fuzz.ready",
            str(self.port),
            str(self.interval),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read(), name="ready-prober")

    async def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT + 5):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            await self._reader

    def reset(self) -> None:
        """Forget the worst answer so far (a run's measure starts here)."""
        self.worst = None
        self.count = 0

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        while line := await self._process.stdout.readline():
            start, end, status = line.split()
            self._record(Sample(float(start), float(end), int(status)))

    def _record(self, sample: Sample) -> None:
        self.count += 1
        self.recent.append(sample)
        if self.worst is None or _badness(sample) > _badness(self.worst):
            self.worst = sample
        self._arrived.set()

    def latencies_since(self, since: float) -> list[float]:
        """The latencies of the probes that started at or after `since` (time.monotonic);
        a probe /ready did not answer counts as PROBE_TIMEOUT."""
        return [s.latency if s.status else PROBE_TIMEOUT for s in self.recent if s.start >= since]

    async def window(self, since: float) -> Sample | None:
        """After an example that started at `since`: one more probe is asked for, and the
        worst of the probes that ended at or after `since` returned (None: no probe)."""
        asked = time.monotonic()
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(b"\n")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PROBE_TIMEOUT + 5):
                while not self.recent or self.recent[-1].start < asked:
                    self._arrived.clear()
                    await self._arrived.wait()
        overlapping = [s for s in self.recent if s.end >= since]
        return max(overlapping, key=_badness, default=None)


def _badness(sample: Sample) -> tuple[bool, float]:
    return (sample.status != 200, sample.latency)


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]))
