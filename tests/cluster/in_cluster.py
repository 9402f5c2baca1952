"""`pilot discovery` started as its Deployment in deploy/ would start it, on the real API server.

From the Deployment the API server holds: the container's args and its environment
(fieldRefs resolved against a Pod of the Deployment that tests.cluster.kubelet ran),
the Dockerfile's XDG_STATE_HOME on a folder of the test's (the `state` emptyDir), and
what the kubelet mounts: the ServiceAccount's token (a TokenRequest bound to that Pod,
as the kubelet asks for it), the cluster's CA and the namespace, at the in-cluster path
/var/run/secrets/kubernetes.io/serviceaccount, in a mount namespace of pilot's own
(`unshare`), with KUBERNETES_SERVICE_HOST and _PORT set. Two changes, because this is
one machine: the listen addresses (the webhook's too) become 127.0.0.1:0, and the drain 0s.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from pilot.security.certs import write_private
from tests.cluster.client import Kube, path_of
from tests.cluster.control_plane import ControlPlane, free_port, kubeconfig
from tests.cluster.kubelet import run_pod
from tests.support.envoy_process import wait_until
from tests.support.pilot_process import PilotProcess, pilot_environment, spawn

Obj = dict[str, Any]
POD_TIMEOUT = 30.0
PILOT_NAMESPACE = "pilot-system"  # deploy/'s
PILOT_ACCOUNT = "pilot"
_ADDRESS_FLAG = re.compile(r"^(--(?:grpc|grpc-tls|http|debug|webhook)-addr)=.*$")
# The kubelet's mount, made in pilot's own mount namespace: a tmpfs on /run (so nothing
# of the machine's /run changes) holding a link to the test's folder.
_MOUNT = (
    "mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -p /run/secrets/kubernetes.io"
    ' && ln -s "$0" /run/secrets/kubernetes.io/serviceaccount && exec "$@"'
)


def container_args(deployment: Obj, http_port: int) -> list[str]:
    """The discovery container's args, with addresses on loopback (the HTTP port given, so
    that `/ready` can be asked while pilot syncs, as the kubelet's probes do) and no drain."""
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "discovery"]  # fmt: skip

    def loopback(match: re.Match[str]) -> str:
        port = http_port if match[1] == "--http-addr" else 0
        return f"{match[1]}=127.0.0.1:{port}"

    args = [_ADDRESS_FLAG.sub(loopback, arg) for arg in container["args"]]
    return [("--drain-duration=0s" if a.startswith("--drain-duration=") else a) for a in args]


def container_env(deployment: Obj, pod: Obj) -> dict[str, str]:
    """The container's env, each fieldRef read off `pod` as the kubelet does."""
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "discovery"]  # fmt: skip
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        path = item["valueFrom"]["fieldRef"]["fieldPath"]
        value: Any = pod
        for part in path.split("."):
            value = value[part]
        env[item["name"]] = str(value)
    return env


async def deployment_pod(kube: Kube, namespace: str, name: str, ip: str) -> Obj:
    """A Pod of the Deployment's ReplicaSet, run by the test kubelet at `ip`."""
    path = path_of("Pod", namespace) + f"?labelSelector=app.kubernetes.io/name={name}"

    async def pods() -> list[Obj]:
        items: list[Obj] = (await kube.get(path))["items"]
        return items

    # The ReplicaSet controller creates them shortly after the apply.
    created = await wait_until(pods, POD_TIMEOUT, f"the Deployment {name}'s Pods")
    return await run_pod(kube, created[0], ip)


def _project(folder: Path, token: str, ca: bytes, namespace: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_private(folder / "token", token.encode())
    (folder / "ca.crt").write_bytes(ca)
    (folder / "namespace").write_text(namespace)
    return folder


async def write_service_account(kube: Kube, plane: ControlPlane, pod: Obj, folder: Path) -> Path:
    """The files the kubelet projects into the pod, under `folder`."""
    namespace = pod["metadata"]["namespace"]
    account = pod["spec"]["serviceAccountName"]
    # The kubelet asks for the API server's own audience, an hour and seven seconds.
    token = await kube.token(namespace, account, [], seconds=3607, pod=pod)
    return _project(folder, token, plane.pki.ca_cert.read_bytes(), namespace)


async def start_in_cluster(
    kube: Kube, plane: ControlPlane, deployment: Obj, pod: Obj, folder: Path
) -> PilotProcess:
    """pilot as the Deployment's container in `pod`, without waiting for it to serve (its
    `http_port` known at once)."""
    sa_dir = await write_service_account(kube, plane, pod, folder / "serviceaccount")
    state = folder / "state"
    state.mkdir(exist_ok=True)
    env = pilot_environment(folder, container_env(deployment, pod)) | {
        "XDG_STATE_HOME": str(state),
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(plane.port),
    }
    command = [
        "unshare", "--mount", "--propagation", "private", "--", "sh", "-euc", _MOUNT,
        str(sa_dir), sys.executable, "-m", "pilot", "discovery",
        *container_args(deployment, http_port := free_port()),
    ]  # fmt: skip
    pilot = await spawn(folder, command, env=env)
    pilot.http_port = http_port
    return pilot


async def pilot_kubeconfig(kube: Kube, plane: ControlPlane, path: Path) -> Path:
    """A kubeconfig at `path` as pilot's ServiceAccount (pilot-system/pilot, deploy/'s
    RBAC): a TokenRequest token for an hour, for `pilot discovery --kubeconfig`."""
    token = await kube.token(PILOT_NAMESPACE, PILOT_ACCOUNT, [], seconds=3600)
    config = kubeconfig(plane.url, plane.pki.ca_cert, None, None, token=token)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, yaml.safe_dump(config).encode())
    return path
