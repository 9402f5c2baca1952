"""What `pilot proxy-status` and `pilot proxy-config` print: one table, three formats.

A `Table` is named columns and one record per row. `-o table` (the default)
prints the headers and aligned cells, `-` where a cell is empty; `-o json` and
`-o yaml` print the records as a list of objects whose keys are the columns'
keys (the headers in snake_case), with numbers and booleans as such.

Cells hold what proxies and registries chose (node ids, listener and service
names), so none reaches a terminal raw: `-o table` escapes control characters
(an escape sequence, a newline that would forge a row) and cuts a cell at
`CELL_CHARS` characters (or its column's own bound), saying how many more
there were; `-o json` and `-o yaml` escape every control character as their
formats do, and keep the whole value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from pilot.logs import clipped

FORMATS = ("table", "json", "yaml")

Cell = str | int | bool | None
Record = Mapping[str, Cell]

# Wider than any name Istio makes (a node id is at most ~700 characters of DNS names)
# would be a table nobody reads; -o json has the whole value.
CELL_CHARS = 1000


@dataclass(frozen=True)
class Column:
    """A header as printed in a table, and the key of the same value in JSON and YAML;
    `chars`: where `-o table` cuts its cells."""

    header: str
    chars: int = CELL_CHARS

    @property
    def key(self) -> str:
        return self.header.lower().replace(" ", "_")


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    records: Sequence[Record]

    @classmethod
    def of(
        cls,
        headers: Sequence[str],
        records: Sequence[Record],
        chars: Mapping[str, int] | None = None,
    ) -> Table:
        """Columns of these headers (cut at `chars[header]` characters, or CELL_CHARS)."""
        bounds = chars or {}
        columns = tuple(Column(header, bounds.get(header, CELL_CHARS)) for header in headers)
        return cls(columns, records)

    def listed(self) -> list[dict[str, Cell]]:
        """The records with exactly the columns' keys, in the columns' order."""
        return [{c.key: record.get(c.key) for c in self.columns} for record in self.records]


def _shown(cell: Cell, chars: int = CELL_CHARS) -> str:
    if cell is None or cell == "":
        return "-"
    if isinstance(cell, bool):
        return str(cell).lower()
    return clipped(str(cell), chars)


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells as text, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def formatted(table: Table, output: str) -> str:
    """The table as `output` (one of FORMATS) says, without a final newline."""
    if output == "json":
        return json.dumps(table.listed(), indent=2, ensure_ascii=True)
    if output == "yaml":
        text: str = yaml.safe_dump(table.listed(), sort_keys=False, default_flow_style=False)
        return text.rstrip("\n")
    if output != "table":
        raise ValueError(f"unknown output format {output!r} (one of {', '.join(FORMATS)})")
    headers = [column.header for column in table.columns]
    cells = [
        [
            _shown(value, column.chars)
            for value, column in zip(record.values(), table.columns, strict=True)
        ]
        for record in table.listed()
    ]
    return aligned([headers, *cells])
