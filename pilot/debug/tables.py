"""What `pilot proxy-status` and `pilot proxy-config` print: one table, three formats.

A `Table` is named columns and one record per row. `-o table` (the default)
prints the headers and aligned cells, `-` where a cell is empty; `-o json` and
`-o yaml` print the records as a list of objects whose keys are the columns'
keys (the headers in snake_case), with numbers and booleans as such.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

FORMATS = ("table", "json", "yaml")

Cell = str | int | bool | None
Record = Mapping[str, Cell]


@dataclass(frozen=True)
class Column:
    """A header as printed in a table, and the key of the same value in JSON and YAML."""

    header: str

    @property
    def key(self) -> str:
        return self.header.lower().replace(" ", "_")


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    records: Sequence[Record]

    @classmethod
    def of(cls, headers: Sequence[str], records: Sequence[Record]) -> Table:
        return cls(tuple(Column(header) for header in headers), records)

    def listed(self) -> list[dict[str, Cell]]:
        """The records with exactly the columns' keys, in the columns' order."""
        return [{c.key: record.get(c.key) for c in self.columns} for record in self.records]


def _shown(cell: Cell) -> str:
    if cell is None or cell == "":
        return "-"
    if isinstance(cell, bool):
        return str(cell).lower()
    return str(cell)


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
        return json.dumps(table.listed(), indent=2)
    if output == "yaml":
        text: str = yaml.safe_dump(table.listed(), sort_keys=False, default_flow_style=False)
        return text.rstrip("\n")
    if output != "table":
        raise ValueError(f"unknown output format {output!r} (one of {', '.join(FORMATS)})")
    headers = [column.header for column in table.columns]
    cells = [[_shown(value) for value in record.values()] for record in table.listed()]
    return aligned([headers, *cells])
