"""The watch's line splitter: events cut anywhere by the stream, and a line that never ends."""

from __future__ import annotations

import tracemalloc

import pytest

from pilot.kube.informer import LineSplitter, Malformed

EVENTS = [b'{"type": "ADDED", "n": %d}' % i for i in range(5)]
STREAM = b"\n".join(EVENTS) + b"\n\n  \n"  # blank lines between events are left out


@pytest.mark.parametrize("size", [1, 2, 7, 25, len(STREAM)])
def test_events_come_out_whole_however_the_stream_is_cut(size: int) -> None:
    splitter = LineSplitter(limit=1024)
    lines = [
        line
        for start in range(0, len(STREAM), size)
        for line in splitter.feed(STREAM[start : start + size])
    ]
    assert lines == EVENTS
    assert splitter.rest() is None


def test_an_event_with_no_newline_at_the_end_is_the_rest() -> None:
    splitter = LineSplitter(limit=1024)
    assert splitter.feed(b"one\ntw") == [b"one"]
    assert splitter.feed(b"o") == []
    assert splitter.rest() == b"two"


def test_a_line_of_exactly_the_limit_passes_and_one_byte_more_is_refused() -> None:
    assert LineSplitter(limit=10).feed(b"x" * 5 + b"y" * 5 + b"\n") == [b"xxxxxyyyyy"]
    splitter = LineSplitter(limit=10)
    splitter.feed(b"x" * 6)
    with pytest.raises(Malformed, match="over 10 bytes"):
        splitter.feed(b"y" * 5 + b"\n")


def test_a_line_that_never_ends_is_refused_as_soon_as_it_passes_the_limit() -> None:
    splitter = LineSplitter(limit=100)
    for _ in range(10):
        splitter.feed(b"x" * 10)  # 100 bytes held: still within the limit
    with pytest.raises(Malformed, match="PILOT_MAX_WATCH_EVENT_BYTES") as refused:
        splitter.feed(b"x")
    assert refused.value.reason == "too_large"


@pytest.mark.parametrize("size", [1, 1000, 300_000])
def test_a_long_line_costs_its_bytes_however_small_its_chunks(size: int) -> None:
    """A server dripping a line a byte at a time must not cost an object per byte."""
    held = 600_000
    splitter = LineSplitter(limit=1 << 20)
    data = b"x" * size
    tracemalloc.start()
    try:
        for _ in range(held // size):
            splitter.feed(data)
        memory, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert memory < 2 * held, f"{memory:,} bytes held for a line of {held:,}"
    assert splitter.feed(b"\n") == [b"x" * (held // size * size)]
