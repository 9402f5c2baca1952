"""Every mistake a new user makes on the command line, made with the real command.

Each case runs `python -m pilot ...` as a user would, from an empty folder with a
HOME of its own (no ~/.kube/config), no KUBECONFIG and no in-cluster variables,
and checks what the user reads: exactly one line on stderr naming the flag, file
or variable and what is wrong, exit status 2, no traceback, no usage. Before,
these were an errno without the flag, 20 lines of usage, a gRPC core log line and
a GRPC_VERBOSITY hint, two lines from the Kubernetes client, a traceback, or
silence (an unknown --log-level component, a directory as --config).

A broken registry file does not stop pilot (it waits, unready, or keeps the last
good state): there the one line is the log line, checked for YAML and JSON, small
files (parsed in place) and large ones (parsed by a child process), at start and
on reload.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.background_process import terminate
from tests.support.ca import write_plugged_in
from tests.support.deadline import bounded
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot_process import (
    PilotProcess,
    discovery_command,
    pilot_environment,
    spawn,
    wait_serving,
)

EXIT_WITHIN = 30.0  # seconds a refused command may take to exit (a liveness bound)
WAIT = 15.0
# The environment variables that point pilot at a cluster: none of them is set here.
CLUSTER_VARIABLES = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
# A text log line: "2026-01-02 03:04:05,678 ERROR pilot.sources.file: ...".
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: \S")


def _environment(folder: Path, settings: dict[str, str] | None = None) -> dict[str, str]:
    env = pilot_environment(folder)
    for name in CLUSTER_VARIABLES:
        env.pop(name, None)
    return env | (settings or {})


async def _refused(folder: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run `pilot ARGS` from `folder`; it must exit 2 with exactly one line on stderr,
    which is returned."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot",
        *args,
        cwd=folder,
        env=_environment(folder, env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await bounded(process.communicate(), EXIT_WITHIN)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"pilot {' '.join(args)} still ran after {EXIT_WITHIN:g}s instead of exiting")
    lines = err.decode(errors="replace").splitlines()
    assert process.returncode == 2, f"exit {process.returncode}; stderr: {lines}"
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {lines}"
    assert "Traceback" not in lines[0] and "usage:" not in lines[0], lines[0]
    return lines[0]


def _has(line: str, *words: str) -> None:
    missing = [w for w in words if w not in line]
    assert not missing, f"{missing} not in: {line}"


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"web": ["10.1.0.1"]}))
    return config


@contextmanager
def _listening() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port: int = sock.getsockname()[1]
        yield port


FILE_MODE = [
    "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--grpc-tls-addr", "",
    "--webhook-addr", "",
]  # fmt: skip

# ------------------------------------------------------------- listen addresses

_K8S_LISTENERS = ("--http-addr", "--grpc-addr", "--grpc-tls-addr", "--webhook-addr")


@pytest.mark.parametrize("flag", ["--http-addr", "--grpc-addr", "--grpc-tls-addr", "--debug-addr"])
async def test_an_address_that_does_not_resolve_names_the_flag(tmp_path: Path, flag: str) -> None:
    # Kubernetes mode (no --config): off-loopback addresses are allowed, so the name is
    # looked up; nothing is reached, there is no cluster here. The other listeners take
    # free ports: a default port another test holds would be refused first.
    others = [a for f in _K8S_LISTENERS if f != flag for a in (f, "127.0.0.1:0")]
    line = await _refused(tmp_path, "discovery", *others, flag, "nohost:1")
    _has(line, f"{flag} nohost:1", "cannot resolve host 'nohost'")


@pytest.mark.parametrize("flag", ["--grpc-addr", "--grpc-tls-addr", "--http-addr"])
async def test_a_port_in_use_is_one_line_naming_the_flag(
    tmp_path: Path, mesh: Path, flag: str
) -> None:
    flags = dict(zip(FILE_MODE[::2], FILE_MODE[1::2], strict=True))
    with _listening() as port:
        flags[flag] = f"127.0.0.1:{port}"
        given = [part for item in flags.items() for part in item]
        line = await _refused(tmp_path, "discovery", "--config", str(mesh), *given)
    _has(line, f"{flag} 127.0.0.1:{port}", "already in use")
    assert "GRPC_VERBOSITY" not in line


async def test_two_flags_on_one_address(tmp_path: Path, mesh: Path) -> None:
    with _listening() as port:
        pass  # a port that was free a moment ago
    address = f"127.0.0.1:{port}"
    line = await _refused(
        tmp_path, "discovery", "--config", str(mesh), "--grpc-addr", address,
        "--http-addr", address, "--grpc-tls-addr", "",
    )  # fmt: skip
    _has(line, f"--http-addr {address}", "--grpc-addr already listens there")


# ------------------------------------------------------------------ durations


DURATION_FLAGS = [
    (["--drain-duration", "abc"], ["--drain-duration", "'abc' is not a duration", "30d"]),
    (["--max-connection-age", "-5m"], ["--max-connection-age", "'-5m' is negative"]),
    (["--drain-duration=-1s"], ["--drain-duration", "'-1s' is negative"]),
    (["--drain-duration", "-1"], ["--drain-duration", "'-1' is negative"]),
    (["--max-connection-age", "5x"], ["--max-connection-age", "'5x' is not a duration"]),
    (["--max-connection-age", "30d"], ["--max-connection-age", "'30d' is too long"]),
]


@pytest.mark.parametrize(
    ("args", "words"), DURATION_FLAGS, ids=[" ".join(args) for args, _ in DURATION_FLAGS]
)
async def test_a_bad_duration_flag_is_one_line(
    tmp_path: Path, mesh: Path, args: list[str], words: list[str]
) -> None:
    line = await _refused(tmp_path, "discovery", "--config", str(mesh), *FILE_MODE, *args)
    _has(line, *words, "pilot discovery --help")


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("PILOT_DEBOUNCE_AFTER", "-5m", ["PILOT_DEBOUNCE_AFTER", "'-5m' is negative"]),
        ("PILOT_XDS_SEND_TIMEOUT", "10", ["PILOT_XDS_SEND_TIMEOUT", "'10' is not a duration"]),
        ("SECRET_TTL", "100d", ["SECRET_TTL=100d is out of range", "90 days"]),
        ("SECRET_TTL", "-1h", ["SECRET_TTL", "'-1h' is negative"]),
    ],
)
async def test_a_bad_duration_variable_is_one_line(
    tmp_path: Path, mesh: Path, variable: str, value: str, words: list[str]
) -> None:
    line = await _refused(
        tmp_path, "discovery", "--config", str(mesh), *FILE_MODE, env={variable: value}
    )
    _has(line, *words)


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("PILOT_MAX_INJECTION_REVIEWS", "0", ["PILOT_MAX_INJECTION_REVIEWS", "positive integer"]),
        ("PILOT_MAX_INJECTION_REVIEWS", "1e3", ["PILOT_MAX_INJECTION_REVIEWS", "'1e3'"]),
        ("PILOT_MAX_INJECTION_BYTES", "1048576", ["PILOT_MAX_INJECTION_BYTES", "at least 6291456"]),
        ("PILOT_INJECTION_BODY_TIMEOUT", "10", ["PILOT_INJECTION_BODY_TIMEOUT", "not a duration"]),
        ("PILOT_INJECTION_BODY_TIMEOUT", "0s", ["PILOT_INJECTION_BODY_TIMEOUT", "more than 0"]),
    ],
)
async def test_a_bad_webhook_bound_is_one_line(
    tmp_path: Path, mesh: Path, variable: str, value: str, words: list[str]
) -> None:
    line = await _refused(
        tmp_path, "discovery", "--config", str(mesh), *FILE_MODE, env={variable: value}
    )
    _has(line, *words)


async def test_a_bad_proxy_image_is_one_line(tmp_path: Path, mesh: Path) -> None:
    """What the webhook would write into every Pod is checked at start, naming the flag."""
    line = await _refused(
        tmp_path, "discovery", "--config", str(mesh), *FILE_MODE,
        "--proxy-image", "pilot-proxy:1\nsh",
    )  # fmt: skip
    _has(line, "--proxy-image")


async def test_a_secret_ttl_in_days_is_accepted(tmp_path: Path) -> None:
    """SECRET_TTL=30d passes its check: the one line is about the next thing, the cluster."""
    line = await _refused(
        tmp_path, "discovery", "--http-addr", "127.0.0.1:0", env={"SECRET_TTL": "30d"}
    )
    assert "SECRET_TTL" not in line
    _has(line, "no Kubernetes cluster to watch")


# ------------------------------------------------------------------ --log-level


async def test_an_unknown_log_component_is_an_error(tmp_path: Path, mesh: Path) -> None:
    line = await _refused(
        tmp_path, "discovery", "--config", str(mesh), *FILE_MODE,
        "--log-level", "info,nosuch:debug",
    )  # fmt: skip
    _has(line, "--log-level 'nosuch:debug'", "unknown component 'nosuch'", "xds", "kubernetes")


# ------------------------------------------------------ the cluster, and files


async def test_no_kubeconfig_anywhere_says_where_pilot_looked(tmp_path: Path) -> None:
    line = await _refused(tmp_path, "discovery", "--http-addr", "127.0.0.1:0")
    home_config = tmp_path / "home" / ".kube" / "config"
    _has(line, "no Kubernetes cluster to watch", "--kubeconfig", "KUBECONFIG", str(home_config))
    _has(line, "--config PATH")
    assert "Config not found" not in line and "current-context" not in line


async def test_an_empty_kubeconfig_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "home" / ".kube").mkdir(parents=True)
    (tmp_path / "home" / ".kube" / "config").write_text("")
    line = await _refused(tmp_path, "discovery", "--http-addr", "127.0.0.1:0")
    _has(line, str(tmp_path / "home" / ".kube" / "config"), "not a kubeconfig")


@pytest.mark.parametrize("named_by", ["--kubeconfig", "KUBECONFIG"])
async def test_a_kubeconfig_that_is_not_there(tmp_path: Path, named_by: str) -> None:
    missing = str(tmp_path / "nowhere.yaml")
    flags = ["--kubeconfig", missing] if named_by == "--kubeconfig" else []
    env = {"KUBECONFIG": missing} if named_by == "KUBECONFIG" else {}
    process = ["discovery", "--http-addr", "127.0.0.1:0", *flags]
    line = await _refused(tmp_path, *process, env=env)
    _has(line, f"{named_by} {missing}: no such kubeconfig file")


async def test_a_directory_as_config(tmp_path: Path) -> None:
    line = await _refused(tmp_path, "discovery", "--config", str(tmp_path), *FILE_MODE)
    _has(line, f"--config {tmp_path}", "is a directory")


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--ca-cert-dir", "no-such-ca", ["--ca-cert-dir no-such-ca", "no such directory"]),
        ("--token-auth-file", "no-such.csv", ["--token-auth-file no-such.csv", "no such file"]),
        (
            "--remote-kubeconfig",
            "west=no-such.yaml",
            ["--remote-kubeconfig west=no-such.yaml", "no such file"],
        ),
    ],
)
async def test_a_missing_file_or_directory_flag(
    tmp_path: Path, mesh: Path, flag: str, value: str, words: list[str]
) -> None:
    line = await _refused(tmp_path, "discovery", "--config", str(mesh), *FILE_MODE, flag, value)
    _has(line, *words)


async def test_a_plugged_in_ca_missing_a_file(tmp_path: Path, mesh: Path) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    (ca.directory / "cert-chain.pem").unlink()
    line = await _refused(
        tmp_path, "discovery", "--config", str(mesh), *FILE_MODE, "--ca-cert-dir", str(ca.directory)
    )
    _has(line, f"--ca-cert-dir {ca.directory}", "cert-chain.pem")


# ------------------------------------------------------------- the registry file

PAD_LINES = 4000  # comment lines: the file passes INLINE_BYTES, so a child parses it
BROKEN_YAML = "kind: Service\nmetadata:\n  name: a\n   bad: [\n"  # line 4, column 7
BROKEN_JSON = '{"kind": "List",\n "items": [}\n'  # line 2, column 12


def _broken(kind: str, large: bool) -> tuple[str, str]:
    """A broken registry file's text, and the words its error must say."""
    if kind == "yaml":
        pad = "# a comment line to make the file large\n" * PAD_LINES if large else ""
        line = 4 + (PAD_LINES if large else 0)
        return pad + BROKEN_YAML, f"not valid YAML at line {line}, column 7"
    pad = '  "pad": "' + "x" * 40_000 + '",\n' if large else ""
    text = BROKEN_JSON.replace("{", "{\n" + pad, 1) if large else BROKEN_JSON
    line = 4 if large else 2
    return text, f"not valid JSON at line {line}, column 12: Expecting value"


async def _spawn_text_pilot(
    folder: Path, config: Path, env: dict[str, str] | None = None
) -> PilotProcess:
    ca = write_plugged_in(folder / "plugged-in-ca")
    command = discovery_command(folder, ["--config", str(config)], ca.directory)
    command += ["--log-format", "text"]
    return await spawn(folder, command, env=pilot_environment(folder, env))


def _one_line_each(pilot: PilotProcess) -> None:
    """Every stderr line is a whole log line: no continuation, no `<unicode string>`."""
    for entry in pilot.log:
        assert TEXT_LINE.match(entry["msg"]), f"not a log line of its own: {entry['msg']!r}"
        assert "<unicode string>" not in entry["msg"], entry["msg"]


# uvloop starts the child process with fork(): gRPC's fork handlers once wrote a line there.
@pytest.mark.parametrize(
    ("large", "loop"),
    [(False, "asyncio"), (True, "asyncio"), (True, "uvloop")],
    ids=["in-place", "child-process", "child-process-uvloop"],
)
@pytest.mark.parametrize("kind", ["yaml", "json"])
async def test_a_broken_registry_file_is_one_line_with_line_and_column(
    tmp_path: Path, kind: str, large: bool, loop: str
) -> None:
    config = tmp_path / f"mesh.{kind}"
    text, words = _broken(kind, large)
    config.write_text(text)
    pilot = await _spawn_text_pilot(tmp_path, config, {"PILOT_EVENT_LOOP": loop})
    try:
        expected = f"ERROR pilot.sources.file: {config}: {words}"
        (line,) = await pilot.wait_logged(lambda e: expected in e["msg"], expected, within=WAIT)
        assert line["msg"].endswith("; not ready until a good version is written"), line
        write_mesh(config, simple_mesh({"web": ["10.1.0.1"]}))
        await wait_serving(pilot)
        since = pilot.mark()
        config.write_text(text + "\n")  # broken again (a new digest): a reload refused
        kept = "; keeping the last good registry"
        await pilot.wait_logged(
            lambda e: expected in e["msg"] and e["msg"].endswith(kept), expected, since, WAIT
        )
        status, body = await pilot.get("/ready")
        assert status == 200, body
        _one_line_each(pilot)
    finally:
        await terminate(pilot.process, pilot.stderr, EXIT_WITHIN)
