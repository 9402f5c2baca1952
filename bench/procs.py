"""Child processes of the bench, and what Linux's /proc and CPU clocks say about them.

Every child runs from the repository root (so `python -m tests.kubeapi`
finds its package), gets SIGTERM if the bench dies (PR_SET_PDEATHSIG), and is
stopped with SIGTERM, then SIGKILL, when its `Child.stop` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the bench process goes away."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """A running child process whose stderr goes to a log file."""

    name: str
    process: asyncio.subprocess.Process
    log: Path
    _log_file: IO[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; always reaps and closes the log."""
        try:
            if self.running:
                if self.process.stdin is not None:
                    self.process.stdin.close()
                with contextlib.suppress(ProcessLookupError):
                    self.process.terminate()
                try:
                    async with asyncio.timeout(grace):
                        await self.process.wait()
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        self.process.kill()
                    await self.process.wait()
        finally:
            self._log_file.close()

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    stdin: bool = False,
    stdout: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
) -> Child:
    """Start `argv` (from the repository root by default); stdin/stdout are pipes when asked."""
    log_file = log.open("wb")
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout else log_file,
            stderr=log_file,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent,
            limit=1 << 24,
        )
    except BaseException:
        log_file.close()
        raise
    return Child(name, process, log, log_file)


async def read_line_starting(child: Child, prefix: str) -> str:
    """The first stdout line of `child` that starts with prefix (the rest of it)."""
    assert child.process.stdout is not None
    while True:
        line = await child.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{child.name} exited before printing {prefix!r}")
        text = line.decode().strip()
        if text.startswith(prefix):
            return text[len(prefix) :].strip()


async def log_match(child: Child, pattern: re.Pattern[str]) -> re.Match[str]:
    """The first match of `pattern` in `child`'s log, once the child has written it.

    The child writes its log file itself, so the file is polled (the caller bounds
    the wait); RuntimeError if the child exits without writing it.
    """
    while True:
        running = child.running  # read first: a line written just before exiting is still seen
        match = pattern.search(child.log.read_text(errors="replace"))
        if match is not None:
            return match
        if not running:
            raise RuntimeError(f"{child.name} exited before logging {pattern.pattern!r}")
        await asyncio.sleep(0.01)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a whole process (all its threads, live or exited).

    The same quantity as utime + stime in /proc/PID/stat, read through the
    process's CPU-time clock for nanosecond rather than clock-tick resolution.
    """
    clock = ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    try:
        return time.clock_gettime(clock)
    except OSError:
        return _stat_cpu_seconds(pid)


def _stat_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size (VmRSS in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def wait_idle(
    pids: Sequence[int], window: float = 0.02, busy: float = 0.1, limit: float = 10.0
) -> None:
    """Wait until no process in pids used more than `busy` of a CPU over `window` seconds.

    Gives up quietly after `limit` seconds (a busy machine must not stall the bench).
    """
    start = time.monotonic()
    before, since = [cpu_seconds(pid) for pid in pids], start
    while since - start < limit:
        await asyncio.sleep(window)
        after, now = [cpu_seconds(pid) for pid in pids], time.monotonic()
        if all(b - a < busy * (now - since) for a, b in zip(before, after, strict=True)):
            return
        before, since = after, now


def machine_busy_seconds() -> float:
    """CPU time every process used since boot (all CPUs; idle and iowait excluded)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU time of this process and of every child it has reaped (theirs included)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
