"""The `pilot` command run as a user runs it: a subprocess, what it printed, its exit status.

`run_pilot("proxy-status", "--addr", ...)` runs `python -m pilot ...` and returns
an `Output`, which reads back what `-o json`, `-o yaml` or `-o table` printed;
`assert_formats_agree` checks that the three formats print the same rows.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from tests.support.deadline import bounded

TIMEOUT = 30.0  # a bound on a hung command, never a way to wait for something


@dataclass(frozen=True)
class Output:
    """What one `pilot ...` command printed, and how it exited."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"`pilot {' '.join(self.argv)}` exited {self.returncode}\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )

    def records(self) -> list[dict[str, Any]]:
        """The list of objects -o json or -o yaml printed (the command must have succeeded)."""
        assert self.returncode == 0 and not self.stderr, str(self)
        output = self.argv[self.argv.index("-o") + 1]
        parsed = json.loads(self.stdout) if output == "json" else yaml.safe_load(self.stdout)
        assert isinstance(parsed, list), str(self)
        return parsed

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The headers and rows -o table printed (columns are two or more spaces apart)."""
        assert self.returncode == 0 and not self.stderr, str(self)
        header, *rows = self.stdout.rstrip("\n").splitlines()
        return split_row(header), [split_row(row) for row in rows]


def split_row(line: str) -> list[str]:
    return re.split(r" {2,}", line.strip())


async def run_pilot(*argv: str) -> Output:
    """`pilot ARGV...` (as `python -m pilot`), to its end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot",
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await bounded(process.communicate(), TIMEOUT)
    assert process.returncode is not None
    return Output(tuple(argv), process.returncode, out.decode(), err.decode())


def shown(value: Any) -> str:
    """A JSON value as -o table prints it: `-` when empty, booleans in lower case."""
    if value is None or value == "":
        return "-"
    return str(value).lower() if isinstance(value, bool) else str(value)


def assert_formats_agree(outputs: dict[str, Output], headers: list[str]) -> list[dict[str, Any]]:
    """-o json and -o yaml print the same records, -o table the same rows; the records."""
    records = outputs["json"].records()
    assert outputs["yaml"].records() == records, str(outputs["yaml"])
    printed_headers, rows = outputs["table"].table()
    assert printed_headers == headers, str(outputs["table"])
    keys = [header.lower().replace(" ", "_") for header in headers]
    assert all(list(record) == keys for record in records), records
    assert rows == [[shown(record[key]) for key in keys] for record in records], (
        f"{outputs['table']}\n--- json\n{outputs['json'].stdout}"
    )
    return records
