"""`pilot_asyncio_tasks`: the number of asyncio tasks, read when /metrics is scraped."""

from __future__ import annotations

import asyncio
import re

from pilot.debug.metrics import Metrics, Sources, running_tasks
from pilot.stats import XdsStats


def _tasks(exposition: bytes) -> float:
    match = re.search(rb"^pilot_asyncio_tasks (\S+)$", exposition, re.MULTILINE)
    assert match is not None, "pilot_asyncio_tasks is not exported"
    return float(match[1])


async def test_gauge_counts_the_loops_tasks() -> None:
    metrics = Metrics(Sources(stats=XdsStats()))
    before = _tasks(metrics.exposition())
    assert before == len(asyncio.all_tasks())
    parked = [asyncio.create_task(asyncio.Event().wait()) for _ in range(3)]
    try:
        assert _tasks(metrics.exposition()) == before + 3
    finally:
        for task in parked:
            task.cancel()
        await asyncio.gather(*parked, return_exceptions=True)
    assert _tasks(metrics.exposition()) == before


def test_gauge_is_zero_outside_an_event_loop() -> None:
    assert running_tasks() == 0
    assert _tasks(Metrics(Sources(stats=XdsStats())).exposition()) == 0
