"""pilot's stderr handler: lines logged on the loop go out together, once an interval ends.

What a reader of pilot's log must still see: every line, in the order logged,
a warning at once (and everything logged before it), lines from other threads
at once, and nothing left behind at exit; and on each text line the time
logging's own format would write.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pilot.logs import (
    FLUSH_INTERVAL,
    MAX_MESSAGE,
    MAX_WAITING,
    TEXT_FORMAT,
    BatchingHandler,
    TextFormatter,
)
from tests.support.envoy_process import wait_until

DEADLINE = 5 + 10 * FLUSH_INTERVAL


@contextmanager
def _logger_on(stream: io.StringIO) -> Iterator[logging.Logger]:
    """A logger of its own whose only handler is pilot's, writing to `stream`."""
    handler = BatchingHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger(f"pilot.test-turns.{type(stream).__name__}")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        handler.close()


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    with _logger_on(stream) as logger:
        yield logger, stream


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


async def written(stream: io.StringIO, count: int) -> list[str]:
    """The stream's lines once it holds `count` of them (the interval's write came)."""
    return await wait_until(
        lambda: lines(stream), DEADLINE, f"{count} lines", until=lambda got: len(got) >= count
    )


class CountedWrites(io.StringIO):
    """A stream that counts the writes it was given (one a batch); a broken one raises
    as a closed pipe would."""

    def __init__(self, *, broken: bool = False) -> None:
        super().__init__()
        self.writes, self.broken = 0, broken

    def write(self, text: str) -> int:
        self.writes += 1
        if self.broken:
            raise BrokenPipeError("stderr's reader is gone")
        return super().write(text)

    def flush(self) -> None:
        if self.broken:
            raise BrokenPipeError("stderr's reader is gone")


async def test_lines_on_the_loop_are_written_together_once_the_interval_ends() -> None:
    stream = CountedWrites()
    with _logger_on(stream) as logger:
        for i in range(3):
            logger.info("proxy %d connected", i)
        await asyncio.sleep(0)
        assert lines(stream) == [], "written at the next turn of the loop: a write a turn"
        assert await written(stream, 3) == [f"INFO proxy {i} connected" for i in range(3)]
        assert stream.writes == 1, "the lines of one interval went out in several writes"


async def test_a_warning_is_written_at_once_after_what_waits(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    logger.info("first")
    logger.warning("proxy rejected a version")
    assert lines(stream) == ["INFO first", "WARNING proxy rejected a version"]
    logger.info("after")  # written at the interval's end, and nothing written twice
    assert await written(stream, 3) == [
        "INFO first",
        "WARNING proxy rejected a version",
        "INFO after",
    ]


async def test_lines_from_another_thread_are_written_at_once(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    logger.info("on the loop")
    thread = threading.Thread(target=logger.info, args=("from a minting thread",))
    thread.start()
    thread.join()
    assert lines(stream) == ["INFO on the loop", "INFO from a minting thread"]


def test_without_a_loop_lines_are_written_at_once(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    logger.info("before the loop runs")
    assert lines(stream) == ["INFO before the loop runs"]


def test_what_waits_when_the_loop_stops_is_written_at_shutdown(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged

    async def log_and_stop() -> None:
        logger.info("the last line before the loop stopped")

    asyncio.run(log_and_stop())  # the loop closes before the interval's write
    for handler in logger.handlers:
        handler.flush()  # what logging.shutdown does at exit
    assert lines(stream) == ["INFO the last line before the loop stopped"]


async def test_a_flood_in_one_turn_waits_only_so_many_lines(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    for i in range(MAX_WAITING * 3):
        logger.info("line %d", i)
    assert len(lines(stream)) >= MAX_WAITING * 2, "a whole flood waited in memory"
    total = MAX_WAITING * 3
    assert await written(stream, total) == [f"INFO line {i}" for i in range(total)]


async def test_a_broken_stderr_raises_into_no_caller() -> None:
    stream = CountedWrites(broken=True)
    with _logger_on(stream) as logger:
        logger.info("a line nobody can read")
        logger.warning("a warning nobody can read")
        logger.info("a line for the interval's write")
        # That write fails inside the loop's callback, and the loop goes on.
        await wait_until(lambda: stream.writes, DEADLINE, "the write", until=lambda n: n >= 2)
        for handler in logger.handlers:
            handler.flush()


@pytest.mark.parametrize(
    "created",
    [
        [1_790_000_000.001, 1_790_000_000.999, 1_790_000_001.0, 1_790_000_000.5],
        [1_790_003_599.75, 1_790_003_600.25, 1_790_003_600.0],  # across an hour and back
    ],
)
def test_text_lines_carry_the_time_logging_itself_would_write(created: list[float]) -> None:
    """pilot's text format formats the date and time of day once a second: each line still
    reads as logging's own `asctime` would, whatever second it was logged in."""
    ours, standard = TextFormatter(TEXT_FORMAT), logging.Formatter(TEXT_FORMAT)
    for when in created:
        record = logging.makeLogRecord({"name": "pilot.xds", "msg": "m", "levelname": "INFO"})
        record.created, record.msecs = when, (when - int(when)) * 1000
        assert ours.format(record) == standard.format(record)


def test_text_lines_read_as_logging_itself_would_write_them() -> None:
    """The text format is written out rather than `%`-formatted from the record: the
    lines must not change, arguments, levels, tracebacks and cut messages included."""
    ours, standard = TextFormatter(TEXT_FORMAT), logging.Formatter(TEXT_FORMAT)
    try:
        raise ValueError("a failure")
    except ValueError:
        failure = sys.exc_info()
    records = [
        {"name": "pilot.xds", "msg": "proxy %s connected (%s)", "args": ("a~b", "delta ADS")},
        {"name": "pilot", "msg": "100%% sure", "args": (), "levelname": "WARNING"},
        {"name": "pilot.security.sds", "msg": "cannot mint", "exc_info": failure},
        {"name": "pilot.push", "msg": "with a stack", "stack_info": "Stack (most recent)"},
    ]
    for fields in records:
        record = logging.makeLogRecord({"levelname": "INFO", **fields})
        assert ours.format(record) == standard.format(logging.makeLogRecord(record.__dict__))
    long = logging.makeLogRecord({"name": "pilot", "msg": "x" * (MAX_MESSAGE + 10)})
    assert ours.format(long).endswith("x...(+10 chars)")
