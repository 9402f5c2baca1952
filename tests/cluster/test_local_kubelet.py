"""The test kubelet runs a Pod the API server holds, for real, as a kubelet would.

A plain Pod (no sidecar) on the real API server: an init container writes into an
emptyDir as uid 1000 before the app starts; the app (Python's http.server) serves it on
the pod's address as uid 1000 with the pod's fsGroup, every capability dropped; its
readiness probe passes from the node, so the Pod is Ready and the real EndpointSlice
controller puts it behind its Service. Inside the container: the env the downward API
gives ($(VAR) expanded, fieldRef, resourceFieldRef, configMapKeyRef), no HOME; the
projected token is a TokenRequest token for the audience asked, bound to the Pod,
0640 and of the fsGroup; the labels file; /etc/hosts names the Service. A graceful
`kubectl delete` stops the app with SIGTERM and removes the Pod, and its network
namespace goes.

A Pod with restartPolicy Never and a native sidecar: the app starts only once the
sidecar's startupProbe passes, and when the app exits the sidecar is stopped and the
Pod is Succeeded.

Hostile specs: a hostPath volume, a secretKeyRef or an image with no command and no
entrypoint known here is refused (the Pod says why in its status and nothing runs);
a mountPath or an argument that is shell code is only a path, an argument.

A container that exits is restarted (restartPolicy Always), and so is one whose
liveness probe fails: the kubelet stops it with SIGTERM.
"""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.local_kubelet import TestKubelet, running_kubelet
from tests.support.envoy_process import wait_until
from tests.support.pods import namespaces

Obj = dict[str, Any]
FS_GROUP = 2000
APP_UID = 1000
AUDIENCE = "test-audience"
IDLE_COMMAND = ["python", "-c", "import signal; signal.pause()"]

_INSPECT = """
import json, os, socket, stat
token = open("/var/run/secrets/tokens/token").read()
info = os.stat("/var/run/secrets/tokens/token")
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "env": {k: v for k, v in os.environ.items() if k != "PATH"},
    "token_payload": token.split(".")[1], "token_mode": stat.S_IMODE(info.st_mode),
    "token_gid": info.st_gid, "labels": open("/etc/podinfo/labels").read(),
    "service": socket.gethostbyname("plain"),
    "service_long": socket.gethostbyname("plain.%s.svc.cluster.local" % os.environ["NS"]),
    "tmp_writable": os.access("/tmp", os.W_OK),
    "data_writable": os.access("/data", os.W_OK),
}))
"""


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Kube]:
    async with admin(control_plane) as session:
        yield session


@pytest.fixture
async def kubelet(kube: Kube, namespace: str, tmp_path: Path) -> AsyncIterator[TestKubelet]:
    async with running_kubelet(kube, tmp_path, [namespace]) as running:
        yield running


def _plain_pod(namespace: str) -> Obj:
    data = {"name": "data", "mountPath": "/data"}
    web_env = [
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "GREETING", "value": "hello $(POD_IP) $$(POD_IP) $(UNKNOWN)"},
        {"name": "MEMORY_MI", "valueFrom": {"resourceFieldRef": {
            "resource": "limits.memory", "divisor": "1Mi"}}},
        {"name": "FROM_MAP", "valueFrom": {"configMapKeyRef": {"name": "settings",
                                                               "key": "colour"}}},
    ]  # fmt: skip
    context = {"runAsUser": APP_UID, "runAsGroup": APP_UID, "allowPrivilegeEscalation": False,
               "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}  # fmt: skip
    write = "import os, pathlib; pathlib.Path('/data/index.html').write_text(os.environ['WHO'])"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain-0", "namespace": namespace, "labels": {"app": "plain"}},
        "spec": {
            "securityContext": {"fsGroup": FS_GROUP},
            "initContainers": [{
                "name": "write", "image": "python", "command": ["python", "-c", write],
                "env": [{"name": "WHO", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.name"}}}],
                "securityContext": context, "volumeMounts": [data],
            }],
            "containers": [{
                "name": "web", "image": "python",
                "command": ["python", "-m", "http.server", "8080", "--bind", "0.0.0.0",
                            "--directory", "/data"],
                "env": web_env, "securityContext": context,
                "resources": {"limits": {"memory": "64Mi"}},
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/index.html", "port": "http"},
                                   "periodSeconds": 1},
                "volumeMounts": [
                    data, {"name": "token", "mountPath": "/var/run/secrets/tokens",
                           "readOnly": True},
                    {"name": "podinfo", "mountPath": "/etc/podinfo"},
                ],
            }],
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "token", "projected": {"sources": [{"serviceAccountToken": {
                    "audience": AUDIENCE, "expirationSeconds": 3600, "path": "token"}}]}},
                {"name": "podinfo", "downwardAPI": {"items": [{
                    "path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            ],
        },
    }  # fmt: skip


def _service(namespace: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "plain", "namespace": namespace},
            "spec": {"selector": {"app": "plain"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}  # fmt: skip


def _exists(path: Path) -> bool:
    return path.exists()


def _claims(payload: str) -> Obj:
    decoded: Obj = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


async def _ready_endpoints(kube: Kube, namespace: str) -> list[str]:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
    slices = (await kube.get(path + "?labelSelector=kubernetes.io/service-name=plain"))["items"]
    return [address for each in slices for endpoint in each.get("endpoints") or []
            if endpoint.get("conditions", {}).get("ready")
            for address in endpoint["addresses"]]  # fmt: skip


async def test_a_plain_pod_runs_as_its_spec_says_and_stops_on_deletion(
    kube: Kube, kubelet: TestKubelet, namespace: str
) -> None:
    settings = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "settings", "namespace": namespace},
                "data": {"colour": "green"}}  # fmt: skip
    await kube.create(settings)
    service = await kube.create(_service(namespace))
    await kube.create(_plain_pod(namespace))
    (run,) = await kubelet.wait_running(namespace, "app=plain")
    assert run.output("write") == [], "the init container wrote its file, silently"
    assert await wait_until(
        lambda: _ready_endpoints(kube, namespace), 30, "the Service's ready endpoint",
        until=lambda found: found == [run.address],
    )  # fmt: skip

    code, printed = await run.launches["web"].run(["python", "-c", _INSPECT], 30)
    assert code == 0, printed
    seen = json.loads(printed.splitlines()[-1])
    assert (seen["uid"], seen["gid"], seen["groups"]) == (APP_UID, APP_UID, [FS_GROUP])
    env = seen["env"]
    assert env["GREETING"] == f"hello {run.address} $(POD_IP) $(UNKNOWN)"
    assert (env["MEMORY_MI"], env["FROM_MAP"], env["NS"]) == ("64", "green", namespace)
    assert "HOME" not in env, "no HOME unless the spec sets one"
    claims = _claims(seen["token_payload"])
    assert claims["aud"] == [AUDIENCE]
    assert claims["kubernetes.io"]["pod"]["name"] == "plain-0", "bound to the Pod"
    assert (seen["token_mode"], seen["token_gid"]) == (0o640, FS_GROUP)
    assert seen["labels"] == 'app="plain"\n'
    assert seen["service"] == seen["service_long"] == service["spec"]["clusterIP"]
    assert (seen["tmp_writable"], seen["data_writable"]) == (False, True), "a read-only root"
    probes = {p.kind: p for p in run.probers["web"]}
    assert probes["readiness"].passed >= 1, probes["readiness"].reason

    netns = run.netpod.namespace if run.netpod else ""
    pod_path = path_of("Pod", namespace, "plain-0")
    await kube.request("DELETE", pod_path)  # graceful, as `kubectl delete pod` does
    await wait_until(lambda: kube.request("GET", pod_path), 30, "the Pod gone",
                     until=lambda answer: answer[0] == 404)  # fmt: skip
    (process,) = run.processes["web"]
    assert process.process.returncode == -signal.SIGTERM, "stopped by SIGTERM, not killed"
    assert netns not in namespaces()


async def test_a_job_pod_ends_once_its_app_has_and_its_sidecar_is_stopped(
    kube: Kube, kubelet: TestKubelet, namespace: str
) -> None:
    sidecar = {
        "name": "helper", "image": "python", "restartPolicy": "Always",
        "command": ["python", "-m", "http.server", "9000", "--bind", "127.0.0.1"],
        "startupProbe": {"exec": {"command": ["python", "-c",
            "import socket; socket.create_connection(('127.0.0.1', 9000))"]},
            "periodSeconds": 1, "failureThreshold": 30},
    }  # fmt: skip
    fetch = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9000/').status)"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "job", "namespace": namespace, "labels": {"app": "job"}},
           "spec": {"restartPolicy": "Never", "initContainers": [sidecar],
                    "containers": [{"name": "app", "image": "python",
                                    "command": ["python", "-c", fetch]}]}}  # fmt: skip
    await kube.create(pod)
    run = await wait_until(lambda: kubelet.pods(namespace, "app=job"), 30, "the job's pod")
    await kubelet.wait_phase(run[0], "Succeeded")
    assert run[0].output("app") == ["200"], "the app ran once the sidecar served"
    (helper,) = run[0].processes["helper"]
    assert helper.process.returncode == -signal.SIGTERM
    # The kubelet's own phase moves before its status write reaches the API server.
    await wait_until(
        lambda: kube.get(path_of("Pod", namespace, "job")), 30, "the API server's Succeeded",
        until=lambda pod: pod["status"].get("phase") == "Succeeded",
    )  # fmt: skip


SECRET_ENV = [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
PRINT_RAN = ["python", "-c", "print('ran')"]


@pytest.mark.parametrize(
    "case",
    [
        ({"name": "host", "hostPath": {"path": "/etc"}}, {"command": PRINT_RAN}, "hostPath"),
        ({"name": "host", "emptyDir": {}}, {"command": PRINT_RAN, "env": SECRET_ENV},
         "secretKeyRef"),
        ({"name": "host", "emptyDir": {}}, {"image": "registry.example/unknown:1"},
         "no entrypoint known"),
    ],
    ids=["hostPath", "secretKeyRef", "unknown-image"],
)  # fmt: skip
async def test_what_this_kubelet_does_not_give_is_refused_in_the_pod_status(
    kube: Kube, kubelet: TestKubelet, namespace: str, case: tuple[Obj, Obj, str]
) -> None:
    volume, fields, refused = case
    mounts = [{"name": "host", "mountPath": "/mnt/host"}]
    container = {"name": "app", "image": "python", "volumeMounts": mounts, **fields}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "refused", "namespace": namespace, "labels": {"app": "r"}},
           "spec": {"containers": [container], "volumes": [volume]}}  # fmt: skip
    await kube.create(pod)

    async def message() -> str:
        answer = await kube.get(path_of("Pod", namespace, "refused"))
        return str(answer.get("status", {}).get("message", ""))

    assert refused in await wait_until(message, 30, "the pod's refusal", until=bool)
    (run,) = kubelet.pods(namespace, "app=r")
    assert run.processes == {}, "nothing ran"


async def test_a_mount_path_or_argument_that_is_shell_code_is_only_text(
    kube: Kube, kubelet: TestKubelet, namespace: str, tmp_path: Path
) -> None:
    marker = Path("/tmp/pilot-kubelet-pwned")
    path = f"/run/pilot-kubelet-'$(touch {marker})'"
    show = f"import os, sys; print(os.listdir({path!r}), sys.argv[1:])"
    container = {"name": "app", "image": "python",
                 "command": ["python", "-c", show], "args": [f"$(touch {marker})"],
                 "volumeMounts": [{"name": "v", "mountPath": path}]}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "odd", "namespace": namespace, "labels": {"app": "odd"}},
           "spec": {"restartPolicy": "Never", "containers": [container],
                    "volumes": [{"name": "v", "emptyDir": {}}]}}  # fmt: skip
    await kube.create(pod)
    run = await wait_until(lambda: kubelet.pods(namespace, "app=odd"), 30, "the pod")
    await kubelet.wait_phase(run[0], "Succeeded")
    assert run[0].output("app") == [f"[] ['$(touch {marker})']"], "a literal path and argument"
    assert not _exists(marker), "the mount path ran as shell code"


async def test_a_container_that_exits_or_fails_liveness_is_restarted(
    kube: Kube, kubelet: TestKubelet, namespace: str
) -> None:
    once = ("import pathlib, signal\n"
            "marker = pathlib.Path('/data/ran')\n"
            "first = not marker.exists()\n"
            "marker.write_text('ran')\n"
            "print('first' if first else 'again', flush=True)\n"
            "raise SystemExit(1) if first else signal.pause()\n")  # fmt: skip
    failing = {"exec": {"command": ["python", "-c", "raise SystemExit(3)"]},
               "initialDelaySeconds": 1, "periodSeconds": 1, "failureThreshold": 1}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "restarts", "namespace": namespace, "labels": {"app": "re"}},
           "spec": {"containers": [
               {"name": "exits", "image": "python", "command": ["python", "-c", once],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
               {"name": "unhealthy", "image": "python", "command": IDLE_COMMAND,
                "livenessProbe": failing}],
               "volumes": [{"name": "data", "emptyDir": {}}]}}  # fmt: skip
    await kube.create(pod)
    runs = await wait_until(lambda: kubelet.pods(namespace, "app=re"), 30, "the pod")

    async def restarts() -> dict[str, int]:
        answer = await kube.get(path_of("Pod", namespace, "restarts"))
        statuses = answer.get("status", {}).get("containerStatuses", [])
        return {s["name"]: s["restartCount"] for s in statuses}

    def both(found: dict[str, int]) -> bool:
        return all(found.get(name, 0) >= 1 for name in ("exits", "unhealthy"))

    counted = await wait_until(restarts, 60, "both containers restarted",
                               until=both, context=kubelet.describe)  # fmt: skip
    assert runs[0].output("exits")[:2] == ["first", "again"]
    assert counted["exits"] == 1, "exited once, then stays up"
    first = runs[0].processes["unhealthy"][0].process
    assert first.returncode == -signal.SIGTERM, "stopped by the kubelet: it never exits itself"
