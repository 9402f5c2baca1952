"""Two injected Deployments run for real, and talk mTLS through both sidecars.

On the real API server with deploy/ applied as is (its MutatingWebhookConfiguration
among it), pilot runs as its own ServiceAccount and the test's namespace is labelled
`istio-injection=enabled`. The test writes two plain Deployments (client and server,
the server the test backend that echoes the X-Forwarded-Client-Cert header it got)
and a Service: not one line of sidecar configuration. The ReplicaSet controller
creates their Pods, the API server sends them to pilot's webhook, which injects them,
and the test kubelet runs what the API server holds: istio-init as root in the pod's
network namespace, istio-proxy (`pilot agent ... proxy sidecar`) as uid 1337 with its
volumes bound at their paths, then the app.

* `http://server.NS/` from the client's app reaches the server through both Envoys
  with mTLS: the server's app sees the client's SPIFFE id in XFCC.
* With STRICT PeerAuthentication on the namespace it still does; plaintext from the
  node to the server's port, let in before (PERMISSIVE), is refused; and the server's
  probes, rewritten to the agent's 15020, keep passing (the Pod stays Ready).
* A Job's Pod ends once its app exits: its native sidecar is stopped, the Pod is
  Succeeded, the Job complete.
* In classic mode with holdApplicationUntilProxyStarts, istio-proxy is the first
  container and its postStart hook (`pilot agent wait`) holds the app until Envoy is
  ready: the app's first act, asking Envoy's readiness, gets 200.
* Claimed identity: a Pod of the client's account whose (already injected, then
  edited) sidecar says SERVICE_ACCOUNT=server is refused by pilot, naming the claim
  and the proof (its projected token is the client's); its Envoy never gets ready, its
  app never starts, and it holds no certificate of the server's.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from tests.cluster.client import path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.injected_mesh import (
    BACKEND,
    Mesh,
    app_deployment,
    app_service,
    envoy_admin,
    fetch,
    fetched,
    injected_mesh,
)
from tests.cluster.pod_lifecycle import PodRun
from tests.cluster.probes import Prober
from tests.cluster.workload_tokens import service_account
from tests.support.envoy_process import wait_until
from tests.support.pods import client_socket_in

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(300)]
SERVER_PORT = 8080
SERVICE_PORT = 80
IDLE = ["python", "-c", "import signal; signal.pause()"]
ENVOY_CERTS = [
    "python",
    "-c",
    "import urllib.request as u; print(u.urlopen('http://127.0.0.1:15000/certs').read().decode())",
]


@pytest.fixture
async def mesh(deployed: ControlPlane, namespace: str, tmp_path: Path) -> AsyncIterator[Mesh]:
    async with injected_mesh(deployed, tmp_path, [namespace]) as running:
        for account in ("client", "server"):
            await running.kube.create(service_account(namespace, account))
        yield running


async def _client_and_server(mesh: Mesh, namespace: str) -> tuple[PodRun, PodRun]:
    server = app_deployment(namespace, "server", [*BACKEND, "--port", str(SERVER_PORT)],
                            SERVER_PORT)  # fmt: skip
    await mesh.kube.create(server)
    await mesh.kube.create(app_service(namespace, "server", SERVICE_PORT, SERVER_PORT))
    await mesh.kube.create(app_deployment(namespace, "client", IDLE))
    (client,) = await mesh.kubelet.wait_running(namespace, "app=client")
    (server_run,) = await mesh.kubelet.wait_running(namespace, "app=server")
    return client, server_run


def _spiffe_uri(xfcc: str) -> str:
    """The URI field of an x-forwarded-client-cert header (one element)."""
    for part in xfcc.split(";"):
        key, _, value = part.partition("=")
        if key == "URI":
            return urllib.parse.unquote(value.strip('"'))
    return ""


async def _fetch_from(mesh: Mesh, client: PodRun, url: str) -> dict[str, object]:
    return fetched(await mesh.exec_in(client, "client", fetch(url)))


async def _plaintext_refused(mesh: Mesh, server: PodRun) -> bool:
    """A plain HTTP request from the node to the server's app port gets no answer."""
    sock = client_socket_in(mesh.kubelet.node.network.bridge_namespace)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (server.address, SERVER_PORT))
        reader, writer = await asyncio.open_connection(sock=sock)
    except OSError:
        sock.close()
        return True
    writer.write(b"GET / HTTP/1.1\r\nHost: server\r\nConnection: close\r\n\r\n")
    try:
        async with asyncio.timeout(10):
            answer = await reader.read()
    except (OSError, TimeoutError):
        answer = b""
    finally:
        writer.close()
    return b"hello from the shop backend" not in answer


async def _passes_again(prober: Prober) -> None:
    before = prober.passed

    def more() -> bool:
        return prober.passed > before

    await wait_until(more, 30, f"{prober.kind} probe to pass again")


async def test_two_injected_deployments_talk_mtls_through_both_sidecars(
    mesh: Mesh, namespace: str
) -> None:
    client, server = await _client_and_server(mesh, namespace)
    for run in (client, server):
        init = [c["name"] for c in run.pod["spec"]["initContainers"]]
        assert init == ["istio-init", "istio-proxy"], f"{run.name} was injected: {init}"

    cluster = f"outbound|{SERVICE_PORT}||server.{namespace}.svc.cluster.local"
    await mesh.wait_endpoints(client, cluster, 1)
    url = f"http://server.{namespace}:{SERVICE_PORT}/hello"
    answer = await _fetch_from(mesh, client, url)
    assert answer["status"] == 200
    assert answer["body"] == "hello from the shop backend /hello"
    client_id = f"spiffe://cluster.local/ns/{namespace}/sa/client"
    assert _spiffe_uri(str(answer["xfcc"])) == client_id, answer["xfcc"]

    strict = {"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
              "metadata": {"name": "default", "namespace": namespace},
              "spec": {"mtls": {"mode": "STRICT"}}}  # fmt: skip
    assert not await _plaintext_refused(mesh, server), "PERMISSIVE: plaintext is let in"
    failures = {p.kind: p.failed for p in server.probers["server"]}
    await mesh.kube.create(strict)
    await wait_until(lambda: _plaintext_refused(mesh, server), 30, "plaintext refused")
    answer = await _fetch_from(mesh, client, url)
    assert (answer["status"], _spiffe_uri(str(answer["xfcc"]))) == (200, client_id)

    for prober in server.probers["server"]:
        await _passes_again(prober)
        assert prober.probe["httpGet"]["port"] == 15020, prober.probe
        assert prober.failed == failures[prober.kind], f"failed under STRICT: {prober.reason}"
    status = await mesh.kube.get(path_of("Pod", namespace, server.name))
    ready = {c["type"]: c["status"] for c in status["status"]["conditions"]}
    assert ready["Ready"] == "True"


async def test_a_jobs_pod_ends_with_its_app(mesh: Mesh, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "once", "namespace": namespace},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "once"}},
                 "spec": {"restartPolicy": "Never", "serviceAccountName": "client",
                          "containers": [{"name": "once", "image": "python",
                                          "command": ["python", "-c", "print('done')"]}]}}},
    }  # fmt: skip
    await mesh.kube.create(job)
    runs = await wait_until(lambda: mesh.kubelet.pods(namespace, "app=once"), 60, "the Job's Pod")
    await mesh.kubelet.wait_phase(runs[0], "Succeeded")
    assert runs[0].output("once") == ["done"]
    assert [c["name"] for c in runs[0].pod["spec"]["initContainers"]][-1] == "istio-proxy"

    async def complete() -> bool:
        answer = await mesh.kube.get(path_of("Job", namespace, "once"))
        conditions = answer.get("status", {}).get("conditions", [])
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    await wait_until(complete, 60, "the Job complete")


async def test_the_classic_sidecar_holds_the_app_until_envoy_is_ready(
    mesh: Mesh, namespace: str
) -> None:
    ask = ("import urllib.request, signal\n"
           "print(urllib.request.urlopen('http://127.0.0.1:15021/healthz/ready').status,"
           " flush=True)\nsignal.pause()\n")  # fmt: skip
    annotations = {
        "sidecar.istio.io/nativeSidecar": "false",
        "proxy.istio.io/config": '{"holdApplicationUntilProxyStarts": true}',
    }
    held = app_deployment(namespace, "held", ["python", "-c", ask])
    held["spec"]["template"]["metadata"]["annotations"] = annotations
    held["spec"]["template"]["spec"]["serviceAccountName"] = "client"
    await mesh.kube.create(held)
    (run,) = await mesh.kubelet.wait_running(namespace, "app=held")
    proxy, app = run.pod["spec"]["containers"]
    assert (proxy["name"], app["name"]) == ("istio-proxy", "held")
    hook = proxy["lifecycle"]["postStart"]["exec"]["command"]
    assert hook == ["pilot", "agent", "wait"], hook
    await wait_until(lambda: run.output("held"), 30, "the app's first line")
    assert run.output("held")[0] == "200", run.tail()


async def test_a_sidecar_that_claims_another_account_gets_no_certificate(
    mesh: Mesh, namespace: str
) -> None:
    app = {"name": "claims", "image": "python", "command": IDLE}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "claims", "namespace": namespace, "labels": {"app": "claims"}},
           "spec": {"serviceAccountName": "client", "containers": [app]}}  # fmt: skip
    # kube-inject's output, edited: the sidecar says it is the server; the Pod (and so
    # its projected token) is the client's. Already injected: the webhook leaves it.
    injected = inject(pod, InjectSettings(), namespace=namespace)
    (proxy,) = [c for c in injected["spec"]["initContainers"] if c["name"] == "istio-proxy"]
    proxy["env"] = [e for e in proxy["env"] if e["name"] != "SERVICE_ACCOUNT"]
    proxy["env"].append({"name": "SERVICE_ACCOUNT", "value": "server"})
    await mesh.kube.create(injected)
    runs = await wait_until(lambda: mesh.kubelet.pods(namespace, "app=claims"), 30, "the Pod")
    run = runs[0]
    claim = f"claims {namespace}/server but the credentials are {namespace}/client"

    def refusals() -> list[str]:
        return [e["msg"] for e in mesh.pilot.logged(lambda e: claim in e["msg"])]

    # Twice: the first stream refused, and Envoy's retry too.
    await wait_until(refusals, 60, "pilot to refuse the claim twice", context=run.tail,
                     until=lambda found: len(found) >= 2)  # fmt: skip
    assert not run.states["istio-proxy"].started, "Envoy never got ready"
    assert "claims" not in run.processes, "the app never started"
    certs = await mesh.exec_in(run, "istio-proxy", envoy_admin("/certs"))
    assert f"/ns/{namespace}/sa/server" not in certs, certs
