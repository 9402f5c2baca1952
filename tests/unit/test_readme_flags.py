"""README.md's flag tables against the parser: every flag `pilot --help` knows is in
the table of its command with the parser's default, and no table names a flag the
parser lacks. The tables are written by hand (their meanings say more than a help
line); this test is what keeps them true when a flag is added or changed.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pilot.cli import _parser

README = Path(__file__).resolve().parents[2] / "README.md"
# "Flags of `pilot discovery`:" or "Flags of `pilot proxy-status` and `pilot proxy-config`:"
TABLE_INTRO = re.compile(r"^Flags of (`pilot [a-z-]+`(?: and `pilot [a-z-]+`)*):$")
COMMAND = re.compile(r"`pilot ([a-z-]+)`")
TICKED = re.compile(r"`([^`]*)`")

Row = tuple[str, str]  # (default cell, meaning cell)


def _tables() -> dict[tuple[str, ...], dict[str, Row]]:
    """Each table's commands, and its rows by flag (`-o`, `--output` rows under both)."""
    tables: dict[tuple[str, ...], dict[str, Row]] = {}
    current: dict[str, Row] | None = None
    for line in README.read_text(encoding="utf-8").splitlines():
        intro = TABLE_INTRO.match(line)
        if intro:
            current = tables.setdefault(tuple(COMMAND.findall(intro.group(1))), {})
        elif current is not None and line.startswith("| `-"):
            flags, default, meaning = (cell.strip() for cell in line.strip("|").split("|")[:3])
            for flag in TICKED.findall(flags):
                current[flag] = (default, meaning)
        elif current is not None and line and not line.startswith("|"):
            current = None
    return tables


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser (`proxy-config`: its `clusters` kind; the kinds share flags)."""
    commands = next(
        a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    parsers = dict(commands)
    kinds = next(
        a for a in commands["proxy-config"]._actions if isinstance(a, argparse._SubParsersAction)
    )
    parsers["proxy-config"] = kinds.choices["clusters"]
    return parsers


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        option: action
        for action in parser._actions
        if action.option_strings and "--help" not in action.option_strings
        for option in action.option_strings
    }


def _expected_default(action: argparse.Action) -> str | None:
    """What the default cell must start with: `off` for a switch, the value in backticks
    for a flag with one; None where the parser leaves it to pilot (None or '')."""
    if isinstance(action, argparse._StoreTrueAction) or action.nargs == 0:
        return "off"
    if action.default in (None, "", argparse.SUPPRESS):
        return None
    return f"`{action.default}`"


def test_every_command_has_a_table() -> None:
    tabled = {command for commands in _tables() for command in commands}
    assert tabled == set(_commands())


@pytest.mark.parametrize("commands", list(_tables()), ids=" and ".join)
def test_a_table_names_each_flag_of_its_commands_with_its_default(
    commands: tuple[str, ...],
) -> None:
    rows = _tables()[commands]
    parsed: dict[str, argparse.Action] = {}
    for command in commands:
        flags = _flags(_commands()[command])
        missing = sorted(set(flags) - set(rows))
        assert not missing, f"flags of pilot {command} missing from README.md: {missing}"
        parsed.update(flags)
    unknown = sorted(set(rows) - set(parsed))
    assert not unknown, f"README.md's table of {commands} names flags the parser lacks: {unknown}"
    for flag, (default, meaning) in rows.items():
        expected = _expected_default(parsed[flag])
        if expected is not None:
            assert default.startswith(expected), f"{flag}: README says {default}, not {expected}"
        assert meaning, f"{flag} has no meaning in README.md"


def test_every_flag_has_a_help_sentence() -> None:
    for command, parser in _commands().items():
        for flag, action in _flags(parser).items():
            words = (action.help or "").replace("(default %(default)s)", "").split()
            assert len(words) >= 3, f"pilot {command} {flag}: no help sentence in --help"
