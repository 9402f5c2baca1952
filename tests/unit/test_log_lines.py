"""`logs.info`: the lines logged once per proxy, written without a LogRecord when it can.

What a reader of pilot's log must not notice: the line is the one `logger.info`
writes, cut and escaped alike, in the order logged; and every set-up other than
pilot's own handler alone (a capture, a filter, a level, the JSON format, no
running loop) gets logging's record as before. A bad format raises into no
caller.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pilot import logs
from pilot.logs import MAX_MESSAGE, TEXT_FORMAT, BatchingHandler, JsonFormatter, TextFormatter
from pilot.xds.proxy import ProxyKey

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
PROXY = ProxyKey("sidecar~198.18.0.7~cart-1.shop~shop.svc.cluster.local\x1b[2J", None)
LINES = [
    ("proxy %s connected (%s, %s)", (PROXY, "delta ADS", "ipv4:198.18.0.7:4000")),
    ("minted certificate for proxy %s, serial %x, expires %s", (PROXY, 0xBEEF, "2027-01-01")),
    ("100%% sure, no arguments", ()),
    ("x" * (MAX_MESSAGE + 10), ()),
]


TextLog = Callable[[], tuple[logging.Logger, io.StringIO]]


@pytest.fixture
def text_log(request: pytest.FixtureRequest) -> Iterator[TextLog]:
    """Makes a logger of its own whose only handler is pilot's, in pilot's text format.

    Made in the test itself: pytest hands its capture to every logger that does not
    propagate and exists when the test starts.
    """
    made: list[tuple[logging.Logger, BatchingHandler]] = []

    def make() -> tuple[logging.Logger, io.StringIO]:
        stream = io.StringIO()
        handler = BatchingHandler(stream)
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
        logger = logging.getLogger(f"pilot.test-lines.{request.node.name}")
        logger.propagate, logger.level = False, logging.INFO
        logger.addHandler(handler)
        made.append((logger, handler))
        return logger, stream

    yield make
    for logger, handler in made:
        logger.removeHandler(handler)
        logger.filters.clear()
        handler.close()


def _unstamped(stream: io.StringIO) -> list[str]:
    written = stream.getvalue().splitlines()
    assert all(STAMP.match(line) for line in written), written
    return [STAMP.sub("", line) for line in written]


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_a_line_reads_as_logging_writes_it_in_the_order_logged(
    text_log: TextLog,
) -> None:
    logger, stream = text_log()
    records = 0
    make_record = logging.getLogRecordFactory()

    def counted(*args: Any, **kwargs: Any) -> logging.LogRecord:
        nonlocal records
        records += 1
        return make_record(*args, **kwargs)

    logging.setLogRecordFactory(counted)
    try:
        for message, args in LINES:
            logs.info(logger, message, *args)
            logger.info(message, *args)
    finally:
        logging.setLogRecordFactory(make_record)
    assert records == len(LINES), "logs.info made a record where pilot's handler was alone"
    assert stream.getvalue() == "", "written before the interval's write"
    logger.handlers[0].flush()  # the interval's write
    written = _unstamped(stream)
    assert written[0::2] == written[1::2], "a line differs from logging's own"
    assert "\\x1b[2J" in written[0] and "\x1b" not in stream.getvalue(), "client text unescaped"
    assert written[-1].endswith("x...(+10 chars)")


async def test_a_warning_after_it_comes_after_it(
    text_log: TextLog,
) -> None:
    logger, stream = text_log()
    logs.info(logger, "proxy %s connected", PROXY)
    logger.warning("proxy %s rejected a version", PROXY)
    assert [line.split(" ", 1)[0] for line in _unstamped(stream)] == [
        "INFO",
        "WARNING",
    ]


async def test_a_capture_beside_pilots_handler_gets_the_record(
    text_log: TextLog,
) -> None:
    logger, stream = text_log()
    kept = _Kept()
    logger.addHandler(kept)
    try:
        logs.info(logger, "proxy %s connected", "a~b")
    finally:
        logger.removeHandler(kept)
    assert [r.getMessage() for r in kept.records] == ["proxy a~b connected"]
    logger.handlers[0].flush()  # the interval's write
    assert _unstamped(stream) == [f"INFO {logger.name}: proxy a~b connected"]


async def test_filters_and_levels_are_honoured(
    text_log: TextLog,
) -> None:
    logger, stream = text_log()
    logger.addFilter(lambda record: "secret" not in record.getMessage())
    logs.info(logger, "a %s line", "secret")
    logs.info(logger, "a %s line", "plain")
    logger.filters.clear()
    handler = logger.handlers[0]
    handler.setLevel(logging.WARNING)
    logs.info(logger, "below the handler's level")
    handler.setLevel(logging.NOTSET)
    logger.setLevel(logging.WARNING)
    logs.info(logger, "below the logger's level")
    logger.setLevel(logging.INFO)
    logger.handlers[0].flush()  # the interval's write
    assert _unstamped(stream) == [f"INFO {logger.name}: a plain line"]


async def test_the_json_format_gets_its_record(
    text_log: TextLog,
) -> None:
    logger, stream = text_log()
    logger.handlers[0].setFormatter(JsonFormatter())
    logs.info(logger, "proxy %s connected", "a~b")
    logger.handlers[0].flush()  # the interval's write
    entry = json.loads(stream.getvalue())
    assert (entry["level"], entry["scope"], entry["msg"]) == (
        "info",
        logger.name,
        "proxy a~b connected",
    )


def test_without_a_loop_the_line_is_written_at_once(
    text_log: TextLog,
) -> None:
    logger, stream = text_log()
    logs.info(logger, "before the loop runs")
    assert _unstamped(stream) == [f"INFO {logger.name}: before the loop runs"]


async def test_a_bad_format_raises_into_no_caller(
    text_log: TextLog, capsys: pytest.CaptureFixture[str]
) -> None:
    logger, stream = text_log()
    logs.info(logger, "serial %x", "not a number")
    logger.handlers[0].flush()  # the interval's write
    assert stream.getvalue() == ""
    assert "Logging error" in capsys.readouterr().err, "logging's own report of a bad call"
