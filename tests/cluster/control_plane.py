"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager.

Started from the binaries tools/kube/build makes (cached per machine; the build runs
here when they are missing), with the API server's normal security: RBAC and Node
authorization, client certificates from a CA of the fixture's own, service-account
tokens signed by a key of its own (TokenReview and TokenRequest work), the default
admission plugins (MutatingAdmissionWebhook and ValidatingAdmissionWebhook among them)
plus NodeRestriction. The controller manager runs the controllers a mesh depends on
(unless `controllers=False`: a caller that writes their objects itself).
No scheduler and no kubelet: tests.cluster.kubelet stands in for them.

The API server's traffic into the cluster (webhooks) goes through
tests.cluster.cluster_network's proxy (`network`), where a test routes a Service's
address to a local process.

etcd compacts only when a test asks (`compact`). A watch from an older resourceVersion
is still answered, from the API server's watch cache, which keeps its own history;
only once the API server has restarted (`restart_apiserver`), its cache starting at
etcd's current revision, does such a watch get 410 Gone ("too old resource version").
Every process dies with the test process (pdeathsig) and is stopped by `stop`; their
logs are in the folder (a restarted one's appended), and `tail` shows them on failure.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.cluster_network import ClusterNetwork
from tests.cluster.pki import Pki, write_pki

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tools" / "kube" / "build"
SERVICE_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_RANGE
ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLERS = (
    "endpointslice",
    "endpoints-controller",  # v1 Endpoints, for `--endpoints-api endpoints`
    "endpointslicemirroring",
    "serviceaccount",
    "serviceaccount-token",
    "namespace",
    "garbagecollector",
    "replicaset",
    "deployment",
    "job",  # injected Jobs end with their app (tests/cluster/test_injected_pods.py)
    "root-ca-cert-publisher",  # kube-root-ca.crt: every Pod's kube-api-access volume reads it
)
START_TIMEOUT = 90.0  # the API server's first start bootstraps its roles and priorities
STOP_TIMEOUT = 15.0


class ControlPlaneError(RuntimeError):
    """A component did not start; the message carries its log's last lines."""


@functools.cache
def build_binaries() -> Path:
    """The folder holding kube-apiserver, kube-controller-manager, kubectl and etcd."""
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(
            f"tools/kube/build failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    """A loopback port free now (the component binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _setpriv() -> list[str]:
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


@dataclass
class Component:
    """One running binary and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"{self.name}'s last log lines:\n  " + "\n  ".join(text)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class ControlPlane:
    """The running control plane, its files, and an admin's ways in."""

    folder: Path
    binaries: Path
    pki: Pki
    etcd_port: int = 0
    port: int = 0  # the API server's secure port on 127.0.0.1
    components: list[Component] = field(default_factory=list)
    # False: etcd and the API server alone, for a caller that writes every object the
    # controllers would (EndpointSlices, ServiceAccounts) itself.
    controllers: bool = True
    # Where the API server's `cluster` egress goes: a test routes Service addresses here.
    network: ClusterNetwork = field(init=False)

    def __post_init__(self) -> None:
        self.network = ClusterNetwork(self.folder / "egress.sock")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.folder / "admin.kubeconfig"

    @property
    def crds(self) -> Path:
        """Istio's CustomResourceDefinitions (from the istio.io/api module)."""
        return self.binaries / "istio-crds.yaml"

    def tail(self) -> str:
        return "\n".join(component.tail() for component in self.components)

    # -- start and stop --------------------------------------------------------

    def start(self) -> None:
        try:
            self.network.start()
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig(self.admin_kubeconfig, self.pki.admin_cert, self.pki.admin_key)
            self._wait_ready()
            if self.controllers:
                self._start_controller_manager()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()
        self.network.stop()

    def _spawn(self, name: str, argv: Sequence[str]) -> Component:
        log = self.folder / f"{name}.log"
        with log.open("ab") as out:  # a restarted component's log goes on after its last
            process = subprocess.Popen(
                [*_setpriv(), str(self.binaries / name), *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
            )
        component = Component(name, process, log)
        self.components.append(component)
        return component

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [
            "--name", "test",
            "--data-dir", str(self.folder / "etcd"),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}",
            "--log-level", "warn",
            "--unsafe-no-fsync",  # a test cluster: its data dies with it
        ])  # fmt: skip

    def restart_apiserver(self) -> None:
        """Kill the API server, as a crash would, and start it again on its port and its
        etcd: its watch cache starts anew, from etcd's current revision. Call it from the
        thread that started the plane (its parent-death signal is that thread's); then
        `wait_ready`, which blocks (off the event loop, say)."""
        (old,) = [c for c in self.components if c.name == "kube-apiserver"]
        old.process.kill()
        old.process.wait()
        place = self.components.index(old)
        self.components.remove(old)
        self._start_apiserver(self.port)
        # Back in its place: `stop` stops the controller manager before the API server.
        self.components.insert(place, self.components.pop())

    def wait_ready(self) -> None:
        """Until the API server answers /readyz (it fails if a component exited)."""
        self._wait_ready()

    def _start_apiserver(self, port: int = 0) -> None:
        self.port = port or free_port()
        pki = self.pki
        self._spawn("kube-apiserver", [
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.port),
            "--tls-cert-file", str(pki.serving_cert),
            "--tls-private-key-file", str(pki.serving_key),
            "--client-ca-file", str(pki.ca_cert),
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            "--service-account-issuer", ISSUER,
            "--service-account-key-file", str(pki.sa_pub),
            "--service-account-signing-key-file", str(pki.sa_key),
            "--service-cluster-ip-range", SERVICE_RANGE,
            # Loopback is no endpoint address a Service may have: no reconciling of the
            # `kubernetes` Service's endpoints to 127.0.0.1.
            "--endpoint-reconciler-type", "none",
            "--etcd-compaction-interval", "0",  # only `compact` compacts
            "--cert-dir", str(self.folder / "apiserver-certs"),
            "--egress-selector-config-file",
            str(self.network.egress_config(self.folder / "egress-selector.yaml")),
            "--profiling=false",
        ])  # fmt: skip

    def _start_controller_manager(self) -> None:
        kubeconfig = self.folder / "controller-manager.kubeconfig"
        self._write_kubeconfig(kubeconfig, self.pki.controller_cert, self.pki.controller_key)
        self._spawn("kube-controller-manager", [
            "--kubeconfig", str(kubeconfig),
            "--controllers", ",".join(CONTROLLERS),
            "--service-account-private-key-file", str(self.pki.sa_key),
            "--root-ca-file", str(self.pki.ca_cert),
            "--use-service-account-credentials",
            "--leader-elect=false",
            "--secure-port", "0",
            "--concurrent-service-endpoint-syncs", "10",
        ])  # fmt: skip

    def _write_kubeconfig(self, path: Path, cert: Path, key: Path) -> None:
        path.write_text(yaml.safe_dump(kubeconfig(self.url, self.pki.ca_cert, cert, key)))
        path.chmod(0o600)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            for component in self.components:
                if component.process.poll() is not None:
                    raise ControlPlaneError(f"{component.name} exited: {component.tail()}")
            with contextlib.suppress(OSError):
                if self.get("/readyz")[0] == 200:
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"not ready in {START_TIMEOUT:g}s: {self.tail()}")
            time.sleep(0.2)  # polling a process that says nothing until it is ready

    # -- an admin's requests (blocking: for set-up and fixtures) -----------------

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get(self, path: str) -> tuple[int, str]:
        """GET `path` as the admin: the status and the body."""
        request = urllib.request.Request(self.url + path)
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.ssl_context()) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """The built kubectl as the admin; its output (fails the caller on an error)."""
        done = subprocess.run(
            [str(self.binaries / "kubectl"), "--kubeconfig", str(self.admin_kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def apply(self, objects: Sequence[dict[str, Any]]) -> None:
        """`kubectl apply --server-side` of the objects, as the admin."""
        documents = yaml.safe_dump_all(list(objects))
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=documents)

    def compact(self) -> int:
        """Compact etcd at its current revision (etcd's own history of older ones goes; the
        watch cache's stays until the API server restarts). The revision."""
        revision = int(self._etcd("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result: dict[str, Any] = json.load(answer)
            return result


def kubeconfig(
    url: str, ca: Path, cert: Path | None, key: Path | None, token: str = ""
) -> dict[str, Any]:
    """A kubeconfig for `url`, trusting `ca`, as a client certificate or a bearer token."""
    user: dict[str, str] = (
        {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    )
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": url, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }


@contextlib.contextmanager
def running_control_plane(folder: Path, *, controllers: bool = True) -> Iterator[ControlPlane]:
    """A started control plane under `folder`, stopped on exit (`controllers`: with the
    controller manager)."""
    binaries = build_binaries()
    pki = write_pki(folder / "pki", KUBERNETES_SERVICE_IP)
    plane = ControlPlane(folder, binaries, pki, controllers=controllers)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
