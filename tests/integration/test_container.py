"""The containerized pilot: the Dockerfile as committed, built and run as a cluster runs it.

A Docker engine of the test's own (`tests/support/docker_engine.py`: Debian's dockerd,
no bridge, no iptables rules, the host's network) builds the image with the legacy
builder (a plain `docker build`, no BuildKit), on a base made locally by debootstrap
under the Dockerfile's `FROM` name when it is not there. The container runs read-only,
with a tmpfs for its state, every capability dropped, no-new-privileges and uid 1337,
and `--http-addr` other than the default. Then, as a user would see it:

* `/ready` answers 200, gRPC health says SERVING and reflection lists the xDS
  services on the plaintext port, and the TLS port completes a handshake;
* a real Envoy on the host (the one-machine sidecar bootstrap) converges on the
  containerized pilot's clusters and hosts, and carries a request by service name
  (`reviews`) to a real backend where the example mesh puts its endpoint;
* the image's own HEALTHCHECK reports healthy (it reads the non-default `--http-addr`);
* `docker stop` drains and exits 0;
* a one-line change in pilot/ rebuilds without downloading a dependency;
* nothing of the build (wheels, pip caches) is left in the image.

The engine leaves no network interface and no firewall rule behind (checked). Without
docker.io, debootstrap or root the tests skip saying so; under CI they fail instead.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from pilot.builders.naming import outbound_cluster_name
from pilot.sources.file_format import parse_registry
from tests.integration.http_backend import Backend
from tests.support.docker_engine import (
    NOT_CONTEXT,
    DockerEngine,
    engine_for_tests,
)
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until

pytestmark = pytest.mark.envoy

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 900.0
# examples/mesh.yaml puts reviews' endpoint on 127.0.0.1:19080; in no-capture mode Envoy's
# listener for its port 9080 binds 127.0.0.1:9080 (README, "A request through Envoy").
REVIEWS_BACKEND_PORT = 19080
REVIEWS_LISTENER = "http://127.0.0.1:9080/"
GRPCURL = Path(sys.executable).parent / "grpcurl"
PILOT_UID = "1337"


@dataclass(frozen=True)
class Built:
    tag: str
    context: Path
    log: str


@dataclass(frozen=True)
class Ports:
    grpc: int
    tls: int
    http: int


@pytest.fixture(scope="module")
def engine() -> Iterator[DockerEngine]:
    with engine_for_tests(REPO / "Dockerfile") as running:
        yield running


def _build(engine: DockerEngine, context: Path) -> Built:
    tag = f"pilot-test:{uuid.uuid4().hex[:12]}"
    # The host's network: the engine has no bridge, and pip in the build stage needs the
    # package index.
    result = engine.run(
        "build", "--network", "host", "-t", tag, str(context), timeout=BUILD_TIMEOUT
    )
    return Built(tag, context, result.stdout + result.stderr)


@pytest.fixture(scope="module")
def built(engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    context = tmp_path_factory.mktemp("context") / "pilot"
    shutil.copytree(REPO, context, ignore=NOT_CONTEXT)
    image = _build(engine, context)
    yield image
    engine.run("rmi", "--force", image.tag, check=False)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _ready_status(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def _grpcurl(port: int, *args: str) -> str:
    result = subprocess.run(
        [str(GRPCURL), "-plaintext", f"127.0.0.1:{port}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, f"grpcurl {' '.join(args)}: {result.stderr}"
    return result.stdout


def _tls_certificate(port: int) -> bytes:
    """The certificate the TLS port serves (unverified: its root lives in the container)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        served = tls.getpeercert(binary_form=True)
    assert served, "the TLS port served no certificate"
    return served


def _example_clusters() -> set[str]:
    state = parse_registry((REPO / "examples" / "mesh.yaml").read_text(), "mesh.yaml")
    return {
        outbound_cluster_name(service.key, port, "cluster.local")
        for service in state.services
        for port in service.ports
    }


def _inspect(engine: DockerEngine, container: str) -> dict[str, object]:
    found = json.loads(engine.run("inspect", container).stdout)
    state: dict[str, object] = found[0]["State"]
    return state


def _wait(condition: object, what: str, timeout: float, engine: DockerEngine, name: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            logs = engine.run("logs", name, check=False)
            pytest.fail(f"{what} within {timeout:g}s; container log:\n{logs.stdout}{logs.stderr}")
        time.sleep(0.2)


async def test_the_image_runs_as_a_cluster_runs_it(
    engine: DockerEngine, built: Built, tmp_path: Path
) -> None:
    ports = Ports(*_free_ports(3))
    name = f"pilot-test-{uuid.uuid4().hex[:8]}"
    engine.run(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        f"/var/lib/pilot:uid={PILOT_UID},gid={PILOT_UID},mode=0700",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--user",
        f"{PILOT_UID}:{PILOT_UID}",
        # Only the probe's timing changes: its command is the image's HEALTHCHECK.
        "--health-interval",
        "1s",
        built.tag,
        "--config",
        "/etc/pilot/mesh.yaml",
        "--grpc-addr",
        f"127.0.0.1:{ports.grpc}",
        "--grpc-tls-addr",
        f"127.0.0.1:{ports.tls}",
        "--http-addr",
        f"127.0.0.1:{ports.http}",
        "--webhook-addr",
        "",
    )
    try:
        _wait(
            lambda: _ready_status(ports.http) == 200, "/ready did not answer 200", 60, engine, name
        )
        assert '"status": "SERVING"' in _grpcurl(ports.grpc, "grpc.health.v1.Health/Check")
        services = _grpcurl(ports.grpc, "list").split()
        assert "envoy.service.discovery.v3.AggregatedDiscoveryService" in services
        await asyncio.to_thread(_tls_certificate, ports.tls)

        expected = _example_clusters()
        bootstrap = load_example_bootstrap("envoy-sidecar-local.yaml", ports.grpc, "node-1")
        async with (
            Backend("127.0.0.1", REVIEWS_BACKEND_PORT) as backend,
            EnvoyProcess(bootstrap, tmp_path, "node-1", log_level="warning") as envoy,
        ):
            await wait_until(
                envoy.cluster_names,
                timeout=30,
                what="Envoy to hold the containerized pilot's clusters",
                until=lambda names: expected <= names,
            )
            frontend = outbound_cluster_name_of(expected, "frontend")
            await wait_until(
                lambda: envoy.healthy_hosts(frontend),
                timeout=30,
                what="frontend's hosts",
                until=bool,
            )
            status = await wait_until(
                _through_envoy, timeout=30, what="a request through Envoy", until=(200).__eq__
            )
            assert status == 200 and backend.seen, "the backend saw no request"

        _wait(
            lambda: _health(engine, name) == "healthy",
            "the image's HEALTHCHECK did not report healthy",
            60,
            engine,
            name,
        )
        state = _inspect(engine, name)
        assert state["Running"], state
    finally:
        stopped = engine.run("stop", "--time", "30", name, check=False)
        state = _inspect(engine, name)
        logs = engine.run("logs", name, check=False)
        engine.run("rm", "--force", name, check=False)
    assert stopped.returncode == 0, stopped.stderr
    assert state["ExitCode"] == 0, f"pilot exited {state['ExitCode']}:\n{logs.stderr}"
    assert "stopping on SIGTERM" in logs.stdout + logs.stderr
    assert "Traceback" not in logs.stdout + logs.stderr


async def _through_envoy() -> int:
    """GET reviews through Envoy's no-capture listener (127.0.0.1:9080), by its name."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(REVIEWS_LISTENER, headers={"Host": "reviews.default:9080"}) as reply,
    ):
        return reply.status


def outbound_cluster_name_of(names: set[str], service: str) -> str:
    return next(n for n in sorted(names) if f"||{service}." in n)


def _health(engine: DockerEngine, name: str) -> str:
    health = _inspect(engine, name).get("Health") or {}
    assert isinstance(health, dict)
    return str(health.get("Status", ""))


def test_the_image_holds_no_build_leftovers(engine: DockerEngine, built: Built) -> None:
    script = (
        "import pathlib, sys; "
        "found = [str(p) for top in ('/opt', '/tmp', '/root', '/var/lib/pilot', '/wheels') "
        "for p in pathlib.Path(top).rglob('*') if p.suffix == '.whl' or p.name == '.cache'] "
        "+ (['/wheels'] if pathlib.Path('/wheels').exists() else []); "
        "print(found); sys.exit(1 if found else 0)"
    )
    result = engine.run(
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "python",
        built.tag,
        "-c",
        script,
        check=False,
    )
    assert result.returncode == 0, f"left in the image: {result.stdout}{result.stderr}"
    assert "useradd: warning" not in built.log, built.log


def test_a_change_in_pilot_rebuilds_without_downloading(engine: DockerEngine, built: Built) -> None:
    init = built.context / "pilot" / "__init__.py"
    init.write_text(init.read_text() + "# one more line\n")
    again = _build(engine, built.context)
    try:
        steps = again.log.split("Step ")
        dependency_step = next(s for s in steps if "--requirement" in s)
        assert "Using cache" in dependency_step, dependency_step
        for word in ("Collecting", "Downloading"):
            assert word not in again.log, f"the rebuild downloaded:\n{again.log}"
        assert "Successfully built" in again.log
    finally:
        engine.run("rmi", "--force", again.tag, check=False)
