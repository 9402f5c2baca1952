"""Write docs/cli.md's reference part from pilot's own parser (run after changing a flag).

    python tools/cli_reference.py            # rewrite docs/cli.md between its markers
    python tools/cli_reference.py --check    # exit 1 when docs/cli.md is stale

Every command's `--help`, exactly as `pilot ... --help` prints it at 100 columns, so
the reference can never name a flag the parser lacks or miss one it has. The text
around the markers (the environment, how mistakes are reported) is written by hand.
tests/unit/test_cli_reference.py fails when the committed reference is stale.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from pilot.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cli.md"
BEGIN = "<!-- begin: written by tools/cli_reference.py from the parser; do not edit -->"
END = "<!-- end: written by tools/cli_reference.py -->"
COLUMNS = "100"  # argparse wraps at the terminal's width: fixed, so the output is too


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (aliases left out)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            named: dict[int, str] = {}
            for name, child in action.choices.items():
                named.setdefault(id(child), name)  # the command's own name, not an alias
            return {name: action.choices[name] for name in named.values()}
    return {}


def _walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """(command line, its help) for the parser and every subcommand below it."""
    yield " ".join(words), parser.format_help()
    for name, child in _subcommands(parser).items():
        yield from _walk(child, (*words, name))


def reference() -> str:
    """The generated part of docs/cli.md, markers included."""
    os.environ["COLUMNS"] = COLUMNS  # read when argparse formats, the next by build_parser()
    os.environ["XDG_STATE_HOME"] = "~/.local/state"  # the CA's default, not this machine's
    parts = [BEGIN, ""]
    for command, text in _walk(build_parser(), ("pilot",)):
        parts += [f"### `{command}`", "", "```", text.rstrip(), "```", ""]
    parts.append(END)
    return "\n".join(parts)


def _spliced(document: str, generated: str) -> str:
    start, end = document.index(BEGIN), document.index(END) + len(END)
    return document[:start] + generated + document[end:]


def main(argv: list[str]) -> int:
    document = DOC.read_text(encoding="utf-8")
    fresh = _spliced(document, reference())
    if "--check" in argv:
        if fresh != document:
            print("docs/cli.md is stale: run python tools/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
