"""pilot, its injector and the test kubelet on the real API server: a mesh whose Pods run.

`injected_mesh(plane, folder, namespaces)` labels each namespace
`istio-injection=enabled` (deploy/ must be applied: its MutatingWebhookConfiguration
sends the Pods there to pilot's webhook), starts pilot as the cluster's injector
(tests.cluster.injector: its own ServiceAccount, the root the replicas share, its
Service's ClusterIP:443 routed to its webhook port, the caBundles written), waits for
its ConfigMap istio-ca-root-cert in each namespace, and runs the test kubelet on those
namespaces, with `pilot.pilot-system.svc:15012` on the node relayed to pilot's TLS
port: the injected sidecars' discovery and CA address, as the injector writes it.

The test writes plain Deployments and Services (`app_deployment`, `app_service`):
not one line of sidecar configuration. `exec_in` runs a command in a pod's container,
as `kubectl exec` does; `fetch` is a Python one-liner for the client's app container
that prints an HTTP answer's status, body and the headers the test backend echoes;
`envoy_admin` one that prints a path of a sidecar's Envoy admin API, and
`wait_endpoints` waits until a sidecar's Envoy holds a cluster's healthy endpoints.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.client import Kube, admin
from tests.cluster.control_plane import REPO, ControlPlane
from tests.cluster.discovery import forget_shared_root
from tests.cluster.injector import running_injector
from tests.cluster.local_kubelet import TestKubelet, running_kubelet
from tests.cluster.node import PILOT_HOST
from tests.cluster.pod_lifecycle import PodRun
from tests.cluster.root_configmaps import wait_published
from tests.support.envoy_process import wait_until
from tests.support.pilot_process import PilotProcess

Obj = dict[str, Any]
PILOT_TLS_PORT = 15012
PILOT_NAMES = (PILOT_HOST, "pilot.pilot-system", f"{PILOT_HOST}.cluster.local")
INJECTION_LABEL = "istio-injection=enabled"
BACKEND = ["python", "-m", "tests.integration.http_backend", "--host", "0.0.0.0"]


@dataclass
class Mesh:
    """The running parts a test of injected pods uses."""

    plane: ControlPlane
    kube: Kube
    pilot: PilotProcess
    kubelet: TestKubelet

    async def exec_in(self, run: PodRun, container: str, command: Sequence[str]) -> str:
        """`command` in `container` of `run` (kubectl exec): its output; fails unless 0."""
        code, output = await run.launches[container].run(list(command), 30)
        assert code == 0, f"{list(command)[:3]} in {run.name}/{container} exited {code}:\n{output}"
        return output

    async def wait_endpoints(self, run: PodRun, cluster: str, count: int) -> None:
        """Until `run`'s Envoy holds `count` healthy endpoints of `cluster` (a Pod is
        Ready before the others' Envoys have its endpoint: a client would retry)."""

        async def healthy() -> int:
            text = await self.exec_in(run, "istio-proxy", envoy_admin("/clusters"))
            return sum(
                line.startswith(f"{cluster}::") and line.endswith("::health_flags::healthy")
                for line in text.splitlines()
            )

        await wait_until(healthy, 30, f"{count} healthy endpoint(s) of {cluster} in"
                         f" {run.name}'s Envoy", until=lambda found: found >= count)  # fmt: skip


def envoy_admin(path: str) -> list[str]:
    """A command, for an istio-proxy container, printing Envoy's admin API at `path`."""
    script = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:15000{path}').read().decode())\n"
    )
    return ["python", "-c", script]


def app_deployment(
    namespace: str, name: str, command: Sequence[str], port: int | None = None, **extra: Any
) -> Obj:
    """A Deployment of one replica running `command` from this checkout (workingDir), as
    ServiceAccount `name`; with `port`, HTTP probes on it."""
    container: Obj = {"name": name, "image": "python", "command": list(command),
                      "workingDir": str(REPO)}  # fmt: skip
    if port is not None:
        container["ports"] = [{"name": "http", "containerPort": port}]
        container["readinessProbe"] = {"httpGet": {"path": "/ready", "port": port}}
        container["livenessProbe"] = {"tcpSocket": {"port": port}}
    labels = {"app": name}
    pod_spec = {"serviceAccountName": name, "containers": [container], **extra}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }  # fmt: skip


def app_service(namespace: str, name: str, port: int, target: int) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"app": name},
                 "ports": [{"name": "http", "port": port, "targetPort": target}]},
    }  # fmt: skip


def fetch(url: str) -> list[str]:
    """A command printing `url`'s answer as JSON: status, body, x-seen-xfcc."""
    script = (
        "import json, urllib.request\n"
        f"answer = urllib.request.urlopen({url!r}, timeout=10)\n"
        "print(json.dumps({'status': answer.status, 'body': answer.read().decode(),"
        " 'xfcc': answer.headers.get('x-seen-xfcc', '')}))\n"
    )
    return ["python", "-c", script]


def fetched(output: str) -> Obj:
    answer: Obj = json.loads(output.strip().splitlines()[-1])
    return answer


@asynccontextmanager
async def injected_mesh(
    plane: ControlPlane, folder: Path, namespaces: Sequence[str], *flags: str, label: bool = True
) -> AsyncIterator[Mesh]:
    """pilot (with `flags`) injecting and serving `namespaces`, their Pods run for real;
    `label`: the test labels the namespaces for injection (else they are already)."""
    for namespace in namespaces if label else ():
        plane.kubectl("label", "namespace", namespace, INJECTION_LABEL, "--overwrite")
    async with admin(plane) as kube:
        await forget_shared_root(kube)
        try:
            async with running_injector(plane, folder / "pilot", *flags) as pilot:
                await wait_published(kube, list(namespaces), pilot.root_pem)
                async with running_kubelet(kube, folder / "kubelet", namespaces) as kubelet:
                    await kubelet.node.relay(PILOT_NAMES, PILOT_TLS_PORT, pilot.tls_port)
                    yield Mesh(plane, kube, pilot, kubelet)
        finally:
            await forget_shared_root(kube)
