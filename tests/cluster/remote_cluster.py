"""A second real control plane set up as a remote cluster, the way Istio's
`istioctl create-remote-secret` sets one up, and the Secret that joins it to pilot.

On the remote: pilot's namespace, a ServiceAccount `pilot-reader` bound to a ClusterRole
granting exactly what pilot asks a remote cluster for (list and watch Services,
EndpointSlices, legacy Endpoints, Pods and Nodes: see
pilot/sources/kubernetes/cluster_source.py), and a Secret of type
`kubernetes.io/service-account-token` that the remote's token controller fills with the
account's token and the cluster's CA. `remote_kubeconfig` turns those into the
kubeconfig a remote Secret holds (the server's URL, the CA inline, the token inline);
`remote_secret` is that Secret, labelled `istio/multiCluster: "true"`, for pilot's
namespace on the primary.

`workload` puts one Service and its Pods in a cluster: the test kubelet runs the Pods on
a Node with the topology labels given, and that cluster's own EndpointSlice controller
publishes them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import yaml

from tests.cluster.client import Kube, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.in_cluster import PILOT_NAMESPACE
from tests.cluster.kubelet import ensure_node, run_pod
from tests.support.envoy_process import wait_until

Obj = dict[str, Any]
READER = "pilot-reader"
READER_TOKEN_SECRET = "pilot-reader-token"
MULTICLUSTER_LABEL = "istio/multiCluster"
WAIT = 30.0
REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"

# What pilot asks a remote cluster for; nothing more, so every test proves it is enough.
READER_RULES = [
    {"apiGroups": [""], "resources": ["services", "endpoints", "pods", "nodes"],
     "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["list", "watch"]},
]  # fmt: skip


def reader_objects() -> list[Obj]:
    """pilot's namespace on the remote, the reader ServiceAccount, its ClusterRole and
    ClusterRoleBinding."""
    meta = {"name": READER}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PILOT_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {**meta, "namespace": PILOT_NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": meta, "rules": READER_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": READER},
         "subjects": [{"kind": "ServiceAccount", "name": READER,
                       "namespace": PILOT_NAMESPACE}]},
    ]  # fmt: skip


def token_secret() -> Obj:
    """A Secret the token controller fills with `pilot-reader`'s token (Istio's remote
    secret is made from one such)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": READER_TOKEN_SECRET,
            "namespace": PILOT_NAMESPACE,
            "annotations": {"kubernetes.io/service-account.name": READER},
        },
    }


def set_up_reader(plane: ControlPlane) -> str:
    """The reader on `plane`, and a kubeconfig (text) that reaches `plane` as it."""
    plane.apply(reader_objects())
    plane.apply([token_secret()])  # after its ServiceAccount: else the controller drops it
    where = ["-n", PILOT_NAMESPACE, f"secret/{READER_TOKEN_SECRET}"]
    plane.kubectl("wait", "--for=jsonpath={.data.token}", "--timeout=30s", *where)
    data = json.loads(plane.kubectl("get", "-o", "json", *where))["data"]
    token = base64.b64decode(data["token"]).decode()
    return remote_kubeconfig(plane, token, data["ca.crt"])


def remote_kubeconfig(plane: ControlPlane, token: str, ca_data: str = "") -> str:
    """A kubeconfig for `plane` with everything inline (as pilot accepts from a Secret):
    its URL, its CA (`ca_data`, base64; else the plane's own) and a bearer token."""
    ca = ca_data or base64.b64encode(plane.pki.ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "remote", "cluster": {"server": plane.url, "certificate-authority-data": ca}}
        ],
        "users": [{"name": READER, "user": {"token": token}}],
        "contexts": [{"name": "remote", "context": {"cluster": "remote", "user": READER}}],
        "current-context": "remote",
    }
    return yaml.safe_dump(config)


def remote_secret(name: str, kubeconfigs: Mapping[str, str]) -> Obj:
    """A Secret as `kubectl create secret generic --from-file=ID=...` makes it, labelled
    for pilot: each key a cluster id, its value that cluster's kubeconfig."""
    data = {key: base64.b64encode(text.encode()).decode() for key, text in kubeconfigs.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": PILOT_NAMESPACE,
            "labels": {MULTICLUSTER_LABEL: "true"},
        },
        "data": data,
    }


def service(name: str, namespace: str, port: int = 80) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}],
        },
    }


def pod(name: str, namespace: str, app: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
        "spec": {
            "containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 8080}]}]
        },
    }


async def ensure_namespace(kube: Kube, namespace: str) -> None:
    """`namespace`, with its default ServiceAccount (a Pod cannot be created before the
    serviceaccount controller has made it)."""
    status, _ = await kube.request("GET", path_of("Namespace", name=namespace))
    if status == 404:
        await kube.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )

    async def default_account() -> int:
        status, _ = await kube.request("GET", path_of("ServiceAccount", namespace, "default"))
        return status

    await wait_until(
        default_account, WAIT, f"{namespace}'s default ServiceAccount",
        until=lambda status: status == 200,
    )  # fmt: skip


async def workload(
    kube: Kube,
    namespace: str,
    app: str,
    pods: Mapping[str, str],
    node: str,
    *,
    topology: tuple[str, str] = ("", ""),
) -> None:
    """Service `app` in `namespace` and a Pod per (name, IP) of `pods`, run on `node` (a
    Node labelled with `topology`'s region and zone, where given)."""
    region, zone = topology
    labels = {key: value for key, value in ((REGION, region), (ZONE, zone)) if value}
    await ensure_node(kube, node, labels)
    await ensure_namespace(kube, namespace)
    await kube.apply(service(app, namespace))
    for name, ip in pods.items():
        await run_pod(kube, pod(name, namespace, app), ip, node)
