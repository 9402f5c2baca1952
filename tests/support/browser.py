"""A real headless Chromium opening a page, and what a person would see on it.

`open_page(url)` runs Debian's `chromium` with `--dump-dom` (the DOM after the
page loaded, serialized) in a new profile directory, and parses that DOM into
a `SeenPage`: its tables by id (rows of cell texts, as displayed), its links,
its visible text, and which elements it holds (a `<script>` that slipped
through escaping shows up there). Without Chromium the test fails and says
how to install it: CI (.ci/run) installs it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest

from tests.support.background_process import LineLog, terminate

CHROMIUM = "chromium"
OPEN_TIMEOUT = 20.0
DOM_END = b"</html>"
# No sandbox (CI runs as root), no GPU, and nothing that phones home while a test runs.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_binary() -> str:
    found = shutil.which(CHROMIUM)
    if found is None:
        pytest.fail(
            "chromium is not installed; these tests open pages in a real browser: "
            "apt-get install -y --no-install-recommends chromium (.ci/run does it)"
        )
    return found


@dataclass
class SeenPage:
    """What the browser rendered: tables by id, links, text, and the elements it holds."""

    tables: dict[str, list[list[str]]] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)  # (href, text)
    elements: Counter[str] = field(default_factory=Counter)
    text: str = ""

    def table(self, table_id: str) -> list[dict[str, str]]:
        """The rows of table `table_id` under its header row, as {header: cell text}."""
        assert table_id in self.tables, f"no table {table_id!r} on the page: {self.text[:2000]}"
        header, *rows = self.tables[table_id]
        return [dict(zip(header, row, strict=False)) for row in rows]

    def pairs(self, table_id: str) -> dict[str, str]:
        """A two-column table (a header cell, then a value) as {header: value}."""
        return {row[0]: row[1] for row in self.tables[table_id] if len(row) == 2}


class _DomReader(HTMLParser):
    """Collects tables, links and text; skips what a browser does not display."""

    _HIDDEN = frozenset({"head", "title", "style", "script"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = SeenPage()
        self._hidden = 0
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None
        self._link: tuple[str, list[str]] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.page.elements[tag] += 1
        attributes = dict(attrs)
        if tag in self._HIDDEN:
            self._hidden += 1
        elif tag == "table":
            self._table = self.page.tables.setdefault(attributes.get("id") or "", [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self._link = (attributes.get("href") or "", [])

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN:
            self._hidden -= 1
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._table:
            self._table[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "a" and self._link is not None:
            href, text = self._link
            self.page.links.append((href, "".join(text)))
            self._link = None

    def handle_data(self, data: str) -> None:
        if self._hidden:
            return
        self._text.append(data)
        for sink in (self._cell, self._link[1] if self._link else None):
            if sink is not None:
                sink.append(data)

    def close(self) -> None:
        super().close()
        self.page.text = " ".join("".join(self._text).split())


def read_dom(dom: str) -> SeenPage:
    reader = _DomReader()
    reader.feed(dom)
    reader.close()
    return reader.page


async def open_page(url: str, within: float = OPEN_TIMEOUT) -> SeenPage:
    """Open `url` in a fresh headless Chromium; what it rendered (or fail, with its log)."""
    binary = chromium_binary()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        log = LineLog(process.stderr, str, "chromium-stderr")
        dumped = bytearray()
        try:
            async with asyncio.timeout(within):
                await _read_dump(process, dumped)
        except TimeoutError:
            pytest.fail(
                f"chromium did not render {url} within {within:g}s (a JavaScript dialog, such"
                f" as alert(), holds --dump-dom: did a script run?); it printed"
                f" {bytes(dumped[-200:])!r}; {await _answer_without_browser(url)};"
                f" its log: {_without_dbus(log.lines)[-5:]}"
            )
        finally:
            await terminate(process, log, 5.0)
    assert _whole(dumped), f"chromium exited {process.returncode} mid-DOM {dumped!r}: {log.lines}"
    return read_dom(dumped.decode())


async def _read_dump(process: asyncio.subprocess.Process, dumped: bytearray) -> None:
    """Read the dumped DOM into `dumped` until it is whole.

    The DOM is whole at its closing `</html>`: headless Chromium now and then
    hangs on its way out after printing it, and how it exits is not what a
    person sees, so the page is not held hostage to it.
    """
    assert process.stdout is not None
    while not _whole(dumped):
        chunk = await process.stdout.read(65536)
        if not chunk:
            return  # it exited, or closed its output, before the DOM was whole
        dumped += chunk


def _without_dbus(lines: list[str]) -> list[str]:
    """The log without its D-Bus complaints: every run makes them (there is no bus here)."""
    return [line for line in lines if "dbus/" not in line]


def _whole(dumped: bytearray) -> bool:
    return dumped.rstrip().endswith(DOM_END)


async def _answer_without_browser(url: str) -> str:
    """Whether `url` answers a plain HTTP GET: tells a stuck browser from a stuck server."""

    def fetch() -> str:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return f"a plain GET of it answers {response.status}"
        except (OSError, ValueError) as error:
            return f"a plain GET of it fails too: {error!r}"

    return await asyncio.to_thread(fetch)
