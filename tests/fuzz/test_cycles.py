"""Streams that connect, subscribe and go away leave neither streams nor tasks behind."""

from __future__ import annotations

from dataclasses import dataclass

from tests.fuzz.cycles import CycleStats, baseline_tasks, run_cycles, tasks_back
from tests.fuzz.fuzzer import Fuzzer

CYCLES = 40


@dataclass
class Soak:
    tasks_before: int
    tasks_after: int
    streams_after: int
    cycles: CycleStats


async def _soak(fuzzer: Fuzzer) -> Soak:
    target = fuzzer.target
    await target.settle()
    before = await baseline_tasks(target)
    stats = await run_cycles(target, CYCLES, parallel=4)
    streams = await target.settle()
    return Soak(before, await tasks_back(target, before), streams, stats)


def test_cycles_leave_nothing_behind(file_fuzzer: Fuzzer) -> None:
    soak = file_fuzzer.target.loop.run(_soak(file_fuzzer), timeout=120)
    assert soak.tasks_before > 0, "pilot does not export pilot_asyncio_tasks"
    assert soak.cycles.done == CYCLES, soak.cycles.errors
    assert soak.streams_after == 1, f"{soak.streams_after} streams left, not just the resident"
    assert soak.tasks_after <= soak.tasks_before, (
        f"pilot has {soak.tasks_after} asyncio tasks after {CYCLES} cycles,"
        f" {soak.tasks_before} before"
    )
