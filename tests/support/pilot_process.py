"""`pilot discovery` as users run it: a subprocess on a registry, read from outside.

`start_pilot` runs `python -m pilot discovery --kubeconfig ...` against a test API server
(which also answers TokenReviews); `start_file_pilot` runs it on a registry file
(`--config`, `--xds-auth none`). Both use a plugged-in CA written by the test (so that
the test knows the root), ephemeral loopback ports and JSON logs on stderr.
`start_command` runs any `pilot discovery` command line as given (say, the README's,
with its addresses changed to `127.0.0.1:0`); `spawn` runs one without waiting for it
to serve (a pilot whose registry file is broken never does), and `wait_serving` waits.
Whatever the command, pilot binds the ports it is given, 0 included, and the ports it
bound are read back from its "serving" log line (text or JSON), and the `--debug-addr`
port, when given, from its "debug endpoints on" line (the injection webhook's from its
"sidecar injection webhook on" line); every line it logs is kept:
`wait_logged` waits for one with a deadline. The HTTP port's JSON (`/debug/...`) is
read with `get_json`; `http_get` GETs any URL, from a chosen local address if need be.
`stop` sends SIGTERM and fails if pilot does not exit 0 in time. The process, its log
and the stop policy are tests/support/background_process's.

Nothing is written outside the test's folder: HOME and the CA state live there too.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.background_process import BackgroundProcess, LineLog
from tests.support.ca import write_plugged_in
from tests.support.xds_client import XdsClient, tls_credentials

# One log line: time, level, scope, msg (or raw text), error (a traceback), size (of the
# whole line), format ("json" for a line that is one JSON object, else "text").
Entry = dict[str, str]
KEPT = 64 * 1024  # characters of msg and error kept; pilot's lines may be as long as a request
_READ_LIMIT = 1 << 26

STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
SERVING = re.compile(r"\(port (\d+), TLS port (\d+)\), HTTP on (.+):(\d+)")
DEBUG_SERVING = re.compile(r"^debug endpoints on (.+):(\d+)$")
WEBHOOK_SERVING = re.compile(r"^sidecar injection webhook on (.+):(\d+) ")
# Settings pilot reads from the environment: the test's pilot gets none from the shell.
_INHERITED_PREFIXES = ("PILOT_", "CA_", "SECRET_", "KUBECONFIG", "POD_", "SERVICE_ACCOUNT")


def _entry(line: str) -> Entry:
    try:
        parsed = json.loads(line)
    except ValueError:
        parsed = None
    line_format = "json" if isinstance(parsed, dict) else "text"
    if not isinstance(parsed, dict):
        parsed = {"msg": line}
    fields = ("time", "level", "scope", "msg", "error")
    entry = {k: str(parsed.get(k, ""))[:KEPT] for k in fields}
    entry["size"] = str(len(line))
    entry["format"] = line_format
    return entry


@dataclass
class PilotProcess(BackgroundProcess[Entry]):
    """A running `pilot discovery` subprocess, its ports, and every line it logged."""

    root_pem: bytes = field(default=b"", repr=False)  # the CA root, when the test wrote it
    grpc_port: int = 0
    tls_port: int = 0
    http_port: int = 0
    debug_port: int = 0  # with --debug-addr
    webhook_port: int = 0  # the injection webhook's (--webhook-addr), 0: none

    @property
    def stderr(self) -> LineLog[Entry]:
        """Its log: pilot logs to stderr."""
        return self.output

    @property
    def log(self) -> list[Entry]:
        return self.output.lines

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.output.ended

    # -- ports ---------------------------------------------------------------

    def target(self, tls: bool) -> str:
        """Where to dial: pilot's TLS certificate names `localhost`, not 127.0.0.1."""
        return f"localhost:{self.tls_port}" if tls else f"127.0.0.1:{self.grpc_port}"

    def client(self, tls: bool, token: str | None) -> XdsClient:
        """An xDS client on the plaintext or the TLS port, trusting pilot's root."""
        credentials = tls_credentials(self.root_pem) if tls else None
        return XdsClient(self.target(tls), credentials=credentials, token=token)

    async def get_json(self, path: str) -> Any:
        """GET a JSON document from the HTTP port (debug endpoints answer loopback)."""
        status, body = await self.get(path)
        assert status == 200, f"GET {path}: HTTP {status}: {body}"
        return body

    async def get(self, path: str, port: int | None = None) -> tuple[int, Any]:
        """GET from 127.0.0.1 on the HTTP port (or `port`): the status and the body."""
        return await http_get(f"http://127.0.0.1:{port or self.http_port}{path}")

    # -- logs ----------------------------------------------------------------

    def mark(self) -> int:
        """A position in the log: `logged(..., since=mark)` looks only after it."""
        return len(self.log)

    def logged(self, predicate: Callable[[Entry], bool], since: int = 0) -> list[Entry]:
        return [entry for entry in self.log[since:] if predicate(entry)]

    async def until_logged(
        self, predicate: Callable[[Entry], bool], since: int, within: float
    ) -> list[Entry]:
        """The matching lines logged after `since`, once there is one; [] after `within`."""
        return await self.until(lambda: self.logged(predicate, since), within) or []

    async def wait_logged(
        self,
        predicate: Callable[[Entry], bool],
        what: str,
        since: int = 0,
        within: float = 10.0,
    ) -> list[Entry]:
        """The matching lines logged after `since`, once there is one (or fail)."""
        failure = f"pilot did not log {what}"
        return await self.wait_for(lambda: self.logged(predicate, since), failure, within)

    def shown(self, line: Entry) -> str:
        return f"{line['level']} {line['scope']}: {line['msg']}".strip()

    async def stop(self) -> None:
        """SIGTERM; pilot must drain and exit 0."""
        if not await self.terminate(STOP_TIMEOUT):
            pytest.fail(f"pilot ignored SIGTERM for {STOP_TIMEOUT:g}s; {self.tail()}")
        code = self.process.returncode
        assert code == 0, f"pilot exited {code} on SIGTERM; {self.tail()}"


async def http_get(url: str, source: str | None = None) -> tuple[int, Any]:
    """GET `url`, from the local address `source` if given (else the system's choice):
    the status and the body (JSON when it is JSON)."""
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(local_addr=(source, 0) if source else None)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        session.get(url) as reply,
    ):
        text = await reply.text()
        try:
            return reply.status, json.loads(text)
        except ValueError:
            return reply.status, text


def pilot_environment(folder: Path, settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without pilot's own knobs, then `settings` (the test's).

    HOME is `folder`/home, so that nothing pilot keeps by default (its CA state) lands
    outside the test's folder.
    """
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    env["HOME"] = str(home)
    return env | dict(settings or {})


async def start_pilot(
    folder: Path,
    kubeconfig: Path,
    ca_cert_dir: Path,
    root_pem: bytes,
    *extra: str,
    env: Mapping[str, str] | None = None,
) -> PilotProcess:
    """`pilot discovery` on the cluster `kubeconfig` names, serving once it logs so."""
    source = ["--kubeconfig", str(kubeconfig)]
    return await launch(folder, source, ca_cert_dir, root_pem, *extra, env=env)


async def start_file_pilot(
    folder: Path,
    config: Path,
    ca_cert_dir: Path,
    root_pem: bytes,
    *extra: str,
    env: Mapping[str, str] | None = None,
) -> PilotProcess:
    """`pilot discovery --config FILE --xds-auth none`, serving once it logs so."""
    source = ["--config", str(config), "--xds-auth", "none"]
    return await launch(folder, source, ca_cert_dir, root_pem, *extra, env=env)


async def start_file_pilot_with_ca(
    folder: Path, config: Path, *extra: str, env: Mapping[str, str] | None = None
) -> PilotProcess:
    """`start_file_pilot` with a plugged-in CA of its own, written under `folder`."""
    ca = write_plugged_in(folder / "plugged-in-ca")
    return await start_file_pilot(
        folder, config, ca.directory, ca.root.cert_pem.encode(), *extra, env=env
    )


async def launch(
    folder: Path,
    source: list[str],
    ca_cert_dir: Path,
    root_pem: bytes,
    *extra: str,
    env: Mapping[str, str] | None = None,
) -> PilotProcess:
    """`pilot discovery` with the registry flags `source`, serving once it logs so."""
    command = discovery_command(folder, source, ca_cert_dir, *extra)
    return await start_command(
        folder, command, env=pilot_environment(folder, env), root_pem=root_pem
    )


def discovery_command(
    folder: Path, source: list[str], ca_cert_dir: Path | None, *extra: str
) -> list[str]:
    """The `pilot discovery` command line `launch` runs: ephemeral loopback ports, JSON
    logs, no drain, the CA from `ca_cert_dir` (None: the root the replicas share, in
    a Secret) and its state under `folder`."""
    ca = ["--ca-cert-dir", str(ca_cert_dir)] if ca_cert_dir is not None else []
    return [
        sys.executable,
        "-m",
        "pilot",
        "discovery",
        *source,
        "--grpc-addr",
        "127.0.0.1:0",
        "--grpc-tls-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--webhook-addr",
        "127.0.0.1:0",
        *ca,
        "--ca-state-dir",
        str(folder / "ca-state"),
        "--drain-duration",
        "0s",
        "--log-format",
        "json",
        *extra,
    ]


async def spawn(
    cwd: Path,
    command: list[str],
    *,
    env: Mapping[str, str],
    root_pem: bytes = b"",
) -> PilotProcess:
    """Run a `pilot discovery` command line from `cwd`, without waiting for anything: for
    a pilot that is not meant to serve (yet). Its ports are unknown (0)."""
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        limit=_READ_LIMIT,
    )
    return PilotProcess(process, LineLog(process.stderr, _entry, "pilot-stderr"), root_pem)


async def start_command(
    cwd: Path,
    command: list[str],
    *,
    env: Mapping[str, str],
    root_pem: bytes = b"",
) -> PilotProcess:
    """Run a `pilot discovery` command line from `cwd`; once it logs that it serves, its ports.

    `env` is the whole environment (`pilot_environment` makes one). Fails, and stops
    pilot, if it does not say it serves within STARTUP_TIMEOUT.
    """
    pilot = await spawn(cwd, command, env=env, root_pem=root_pem)
    try:
        await wait_serving(pilot)
    except BaseException:
        await pilot.terminate(STOP_TIMEOUT)
        raise
    return pilot


async def wait_serving(pilot: PilotProcess, within: float = STARTUP_TIMEOUT) -> None:
    """Wait for pilot's "serving" line (or fail), and read its ports from its log."""
    (serving,) = await pilot.wait_logged(
        lambda e: SERVING.search(e["msg"]) is not None, "that it is serving", within=within
    )
    match = SERVING.search(serving["msg"])
    assert match is not None
    pilot.grpc_port, pilot.tls_port, pilot.http_port = (int(match[i]) for i in (1, 2, 4))
    # The debug listener starts with the HTTP port, before pilot says it is serving.
    debug = [found for e in pilot.log if (found := DEBUG_SERVING.search(e["msg"]))]
    pilot.debug_port = int(debug[-1][2]) if debug else 0
    webhook = [found for e in pilot.log if (found := WEBHOOK_SERVING.search(e["msg"]))]
    pilot.webhook_port = int(webhook[-1][2]) if webhook else 0
