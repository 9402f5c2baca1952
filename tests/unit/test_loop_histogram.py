"""A scrape of pilot's loop-counted histograms reads as prometheus_client's own would.

`LoopHistogram` replaced prometheus_client's `Histogram` for the three observations
every written response makes. Dashboards and alerts read the exposition: the same
observations must give the same lines, boundary values and values above every bucket
included, labelled and not, before and after the first observation.
"""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pilot.debug.loop_histogram import LoopHistogram

SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BYTES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)


def _without_created(exposition: bytes) -> list[str]:
    """The lines a scrape shows, less the `_created` timestamps (when each series began)."""
    return [line for line in exposition.decode().splitlines() if "_created" not in line]


def _observations(bounds: tuple[float, ...]) -> list[float]:
    rng = random.Random(7)
    values = [float(b) for b in bounds]  # exactly on each bound: counted in its bucket
    values += [b * 1.5 for b in bounds] + [bounds[-1] * 10, 0.0]
    values += [rng.uniform(0, bounds[-1] * 2) for _ in range(200)]
    return values


def test_a_labelled_histogram_scrapes_as_prometheus_client_does() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("size_bytes", "Sizes.", ["type"], buckets=BYTES, registry=theirs)
    mine = LoopHistogram("size_bytes", "Sizes.", BYTES, "type")
    ours.register(mine)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    for label in ("eds", "cds", "sds"):
        for value in _observations(BYTES):
            reference.labels(label).observe(value)
            mine.series(label).observe(value)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))


def test_an_unlabelled_histogram_shows_its_zeros_then_its_counts() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("wait_seconds", "Waits.", buckets=SECONDS, registry=theirs)
    mine = LoopHistogram("wait_seconds", "Waits.", SECONDS)
    ours.register(mine)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    for value in _observations(SECONDS):
        reference.observe(value)
        mine.observe(value)
    scraped = _without_created(generate_latest(ours))
    assert scraped == _without_created(generate_latest(theirs))
    assert 'wait_seconds_bucket{le="+Inf"} 226.0' in scraped


def test_each_series_says_when_it_began() -> None:
    registry = CollectorRegistry()
    mine = LoopHistogram("push_seconds", "Pushes.", SECONDS, "type")
    registry.register(mine)
    mine.series("eds").observe(0.2)
    created = [
        line for line in generate_latest(registry).decode().splitlines() if "_created" in line
    ]
    assert created[0] == "# HELP push_seconds_created Pushes."
    assert created[1] == "# TYPE push_seconds_created gauge"
    assert created[2].startswith('push_seconds_created{type="eds"} ')
