"""What every `pilot` command's parser shares: the parser class, durations as flags,
`--version`, the log and key-type flags."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
from collections.abc import Sequence
from typing import NoReturn

from pilot.durations import parse_duration
from pilot.logs import SCOPES
from pilot.security.certs import KeyType


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: what is wrong, and where the flags are
    listed (the usage of `pilot discovery` alone is twenty lines that hide the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# gRPC keeps durations in 32-bit milliseconds: a longer one overflows it.
MAX_FLAG_DURATION = "24d"


def duration(text: str) -> float:
    """A duration flag's value: 0 or more, at most MAX_FLAG_DURATION."""
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if seconds > parse_duration(MAX_FLAG_DURATION):
        raise argparse.ArgumentTypeError(f"{text!r} is too long (at most {MAX_FLAG_DURATION})")
    return seconds


_DURATION_FLAGS = ("--drain-duration", "--max-connection-age")
_NEGATIVE = re.compile(r"-[\d.]")


def negative_durations_joined(argv: Sequence[str]) -> list[str]:
    """`--drain-duration -5m` as `--drain-duration=-5m`: argparse takes `-5m` for a flag and
    says "expected one argument", where the duration's own check says what is wrong."""
    joined = list(argv)
    for index in range(len(joined) - 1, 0, -1):  # backwards: a join shifts what follows
        flag, value = joined[index - 1], joined[index]
        if flag in _DURATION_FLAGS and _NEGATIVE.match(value):
            joined[index - 1 : index + 1] = [f"{flag}={value}"]
    return joined


def version() -> str:
    """pilot's version, as its installed package's metadata says."""
    try:
        return importlib.metadata.version("pilot")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout never installed
        return "unknown"


def version_flag(parser: argparse.ArgumentParser) -> None:
    """`--version`: `pilot X.Y.Z` on stdout, exit status 0 (the flag Envoy and kubectl have)."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"pilot {version()}",
        help="print pilot's version and exit",
    )


def log_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="info",
        help="default level, then per component: e.g. info,xds:debug,kubernetes:warning"
        f" (components: {', '.join(SCOPES)})",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (default) or json: one object per line",
    )


def key_type_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--key-type`: the workload keys pilot discovery and pilot agent make."""
    parser.add_argument(
        "--key-type",
        choices=[k.value for k in KeyType],
        default=KeyType.EC.value,
        help="workload keys: ec (ECDSA P-256, default) or rsa (RSA 2048)",
    )
