"""deploy/example-app on the real API server: a plain app that comes up injected.

pilot runs as its own ServiceAccount with deploy/ applied (its injector's
MutatingWebhookConfiguration among it); the example's namespace, applied from its own
file, asks for injection (`istio-injection: enabled`); then `kubectl apply -k
deploy/example-app/` as the READMEs print it. The ReplicaSet controller creates the echo Pods,
pilot's webhook injects them, the test kubelet runs what the API server holds (the
http-echo image's entrypoint stood in for by tests/cluster/http_echo.py).

* `kubectl -n example get pods` shows each echo Pod READY 2/2 and Running (the app
  and its native sidecar), as the READMEs say;
* a request from one echo Pod's app to `http://echo.example/` answers "hello from
  echo" through both sidecars: the calling Envoy made a TLS handshake to the echo
  cluster, and each sidecar holds the certificate of example/echo from pilot's CA,
  which the agent got with the Pod's projected token;
* the app's readiness probe was rewritten to the agent's status port and passes.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.cluster.control_plane import REPO, ControlPlane
from tests.cluster.injected_mesh import Mesh, envoy_admin, fetch, fetched, injected_mesh
from tests.cluster.pod_lifecycle import PodRun

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(300)]

EXAMPLE = REPO / "deploy" / "example-app"
NAMESPACE = "example"
LABEL = "app.kubernetes.io/name=echo"
IDENTITY = "spiffe://cluster.local/ns/example/sa/echo"
ECHO_CLUSTER = "outbound|80||echo.example.svc.cluster.local"
# As README.md and deploy/README.md print them.
APPLY = "kubectl apply -k deploy/example-app/"
GET_PODS = "kubectl -n example get pods"


async def _handshakes(mesh: Mesh, run: PodRun) -> int:
    stats = await mesh.exec_in(run, "istio-proxy", envoy_admin("/stats?filter=ssl.handshake"))
    prefix = f"cluster.{ECHO_CLUSTER}.ssl.handshake: "
    counts = [
        int(line.removeprefix(prefix)) for line in stats.splitlines() if line.startswith(prefix)
    ]
    return sum(counts)


async def _identities(mesh: Mesh, run: PodRun) -> set[str]:
    certs = json.loads(await mesh.exec_in(run, "istio-proxy", envoy_admin("/certs")))
    chains = [c for entry in certs.get("certificates", []) for c in entry.get("cert_chain", [])]
    return {
        san["uri"] for cert in chains for san in cert.get("subject_alt_names", []) if "uri" in san
    }


def _as_printed(plane: ControlPlane, command: str) -> str:
    """A README command run with the built kubectl (its paths from the checkout)."""
    words = shlex.split(command)
    assert words[0] == "kubectl"
    return plane.kubectl(*[str(REPO / w) if w.startswith("deploy/") else w for w in words[1:]])


def _ready_and_status(plane: ControlPlane) -> list[list[str]]:
    listing = _as_printed(plane, GET_PODS).splitlines()
    assert listing[0].split()[:3] == ["NAME", "READY", "STATUS"], listing
    return [line.split()[1:3] for line in listing[1:]]


async def test_the_example_app_comes_up_injected_and_serves_through_its_sidecar(
    deployed: ControlPlane, tmp_path: Path
) -> None:
    deployed.kubectl("apply", "-f", str(EXAMPLE / "namespace.yaml"))
    try:
        async with injected_mesh(deployed, tmp_path, [NAMESPACE], label=False) as mesh:
            _as_printed(deployed, APPLY)
            runs = await mesh.kubelet.wait_running(NAMESPACE, LABEL, 2)
            for run in runs:
                spec = run.pod["spec"]
                assert [c["name"] for c in spec["initContainers"]] == ["istio-init", "istio-proxy"]
                assert [c["name"] for c in spec["containers"]] == ["echo"]
            assert _ready_and_status(deployed) == [["2/2", "Running"]] * 2

            await mesh.wait_endpoints(runs[0], ECHO_CLUSTER, 2)
            answer = fetched(await mesh.exec_in(runs[0], "echo", fetch("http://echo.example/")))
            assert (answer["status"], answer["body"]) == (200, "hello from echo\n")
            assert await _handshakes(mesh, runs[0]) >= 1, "the request went out over mTLS"
            for run in runs:
                assert IDENTITY in await _identities(mesh, run)
                (readiness,) = [p for p in run.probers["echo"] if p.kind == "readiness"]
                assert readiness.probe["httpGet"]["port"] == 15020
                assert readiness.passed >= 1, readiness.reason
    finally:
        deployed.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
