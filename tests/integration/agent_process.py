"""`pilot agent` as users run it: the README's command, as a subprocess, in a folder of its own.

`readme_command` reads the first command of docs/agent.md, the README's agent page
(environment assignments, then `pilot agent` and its flags). `start_agent` runs
exactly that with the installed `pilot` script, changing only what a test must:
the identity (POD_NAMESPACE, SERVICE_ACCOUNT), the value of `--discovery-address`
(a test pilot's ephemeral port) and whatever environment it adds. Its working
directory is a fresh short folder (a socket path must fit in 108 bytes), so that
the command's relative paths (the token, the CA root, the socket) land there;
`AgentFolder` writes the token and root where the command and the agent's
defaults say they are. The agent runs under umask 000, so that the modes it
sets are its own doing.

The agent's stderr (text logs) is kept line by line: `wait_logged` waits for a
line with a deadline, `count` counts them (e.g. one per certificate minted).
`stop` sends SIGTERM and fails unless the agent exits 0; `run_to_exit` runs one
that is expected to stop by itself (a start-up error) and returns its status
and stderr. The process, its log and the stop policy are
tests/support/background_process's.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pilot.agent.sds_agent import DEFAULT_ROOT_CERT, DEFAULT_SOCKET
from tests.support.background_process import BackgroundProcess, LineLog

REPO = Path(__file__).resolve().parents[2]
PILOT = Path(sys.executable).parent / "pilot"  # the console script `pip install` made
STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
SERVING = "pilot agent serving SDS on"
MINTED = "minted certificate for proxy"
CA_ERROR = "cannot get a certificate for proxy"
# Settings the agent reads from the environment: the test's agent gets none from the shell.
_INHERITED_PREFIXES = ("PILOT_", "CA_", "SECRET_", "KUBECONFIG", "POD_", "SERVICE_ACCOUNT")


@dataclass(frozen=True)
class ReadmeCommand:
    """The README's `pilot agent` command: its environment and its arguments after `pilot`."""

    env: dict[str, str]
    args: list[str]

    def flag(self, name: str) -> str | None:
        return self.args[self.args.index(name) + 1] if name in self.args else None

    def with_flag(self, name: str, value: str) -> list[str]:
        """The arguments with `name`'s value replaced (it must be there)."""
        assert name in self.args, f"the README's command has no {name}"
        args = list(self.args)
        args[args.index(name) + 1] = value
        return args


def readme_command() -> ReadmeCommand:
    """The first `sh` block of docs/agent.md (the README's agent page), parsed like a shell."""
    section = (REPO / "docs" / "agent.md").read_text()
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match, "docs/agent.md shows no command"
    words = shlex.split(match[1].replace("\\\n", " "))
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[:2] == ["pilot", "agent"], f"not a `pilot agent` command: {words}"
    return ReadmeCommand(env, words[1:])


@dataclass
class AgentFolder:
    """The agent's working directory, where its relative paths land."""

    path: Path

    def write(self, relative: str | Path, content: str) -> Path:
        """Write a file at a path as the command names it (e.g. `./var/run/...`)."""
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return target

    def write_token(self, command: ReadmeCommand, token: str) -> None:
        self.write(command.env["CA_TOKEN_FILE"], token)

    def write_root(self, root_pem: str) -> None:
        self.write(DEFAULT_ROOT_CERT, root_pem)

    @property
    def socket(self) -> Path:
        return self.path / DEFAULT_SOCKET


@asynccontextmanager
async def agent_folder() -> AsyncIterator[AgentFolder]:
    """A fresh, short, private folder under the system's temporary directory."""
    path = Path(tempfile.mkdtemp(prefix="agent-"))
    try:
        yield AgentFolder(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class AgentProcess(BackgroundProcess[str]):
    """A running `pilot agent` and every line it logged (to stderr)."""

    folder: AgentFolder

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    async def wait_logged(
        self, predicate: Callable[[list[str]], bool], what: str, within: float = 10.0
    ) -> None:
        """Wait until `predicate(lines)` holds (or fail, saying what was awaited)."""
        await self.wait_for(
            lambda: predicate(self.lines), f"pilot agent did not log {what}", within
        )

    async def wait_count(self, text: str, count: int, within: float = 10.0) -> None:
        await self.wait_logged(
            lambda lines: sum(text in line for line in lines) >= count,
            f"{count} x {text!r}",
            within,
        )

    async def count_once_logged(self, text: str, within: float = 10.0) -> int:
        """How many lines hold `text`, once one does.

        An info line logged on the agent's loop reaches its stderr up to the log
        handler's interval (`pilot.logs.FLUSH_INTERVAL`) after what it reports.
        """
        await self.wait_count(text, 1, within)
        return self.count(text)

    async def stop(self) -> None:
        """SIGTERM; the agent must exit 0 and take its socket with it."""
        if not await self.terminate(STOP_TIMEOUT):
            pytest.fail(f"pilot agent ignored SIGTERM for {STOP_TIMEOUT:g}s; {self.tail()}")
        assert self.process.returncode == 0, f"pilot agent exited {self.process.returncode}"
        assert not self.folder.socket.exists(), "the agent left its socket behind"


def _environment(command: ReadmeCommand, overrides: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    return env | command.env | dict(overrides)


async def _spawn(
    folder: AgentFolder, address: str, env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    command = readme_command()
    return await asyncio.create_subprocess_exec(
        str(PILOT),
        *command.with_flag("--discovery-address", address),
        cwd=folder.path,
        env=_environment(command, env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        umask=0,
    )


async def start_agent(
    folder: AgentFolder, address: str, env: Mapping[str, str] | None = None
) -> AgentProcess:
    """The README's command in `folder`, dialing `address`; returns once it serves SDS."""
    process = await _spawn(folder, address, env or {})
    agent = AgentProcess(process, LineLog(process.stderr, str, "agent-stderr"), folder)
    try:
        await agent.wait_logged(
            lambda lines: any(SERVING in line for line in lines),
            "that it serves SDS",
            STARTUP_TIMEOUT,
        )
    except BaseException:
        await agent.terminate(STOP_TIMEOUT)
        raise
    return agent


@asynccontextmanager
async def running_agent(
    folder: AgentFolder, address: str, env: Mapping[str, str] | None = None
) -> AsyncIterator[AgentProcess]:
    agent = await start_agent(folder, address, env)
    try:
        yield agent
    finally:
        await agent.stop()


async def run_to_exit(
    folder: AgentFolder, address: str, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """Run the README's command that is expected to stop by itself: (status, stderr)."""
    process = await _spawn(folder, address, env or {})
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            _, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail("pilot agent kept running where it should have refused to start")
    assert process.returncode is not None
    return process.returncode, stderr.decode(errors="replace")
