"""Builders for Kubernetes-shaped registry objects, as `kubectl get -o yaml` prints them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Ep:
    """One endpoint of a slice; conditions left None are omitted (meaning ready/serving)."""

    ip: str
    ready: bool | None = True
    serving: bool | None = None
    terminating: bool | None = None
    zone: str = ""
    node: str = ""  # nodeName
    pod: str = ""  # targetRef: this Pod of the slice's namespace, as Kubernetes writes it


def service(
    name: str, namespace: str = "default", ports: Sequence[tuple[str, int]] = (("http", 80),)
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports]
        },
    }


def node(name: str, region: str = "", zone: str = "") -> dict[str, Any]:
    """A Node with the topology labels given (absent when empty)."""
    labels = {"kubernetes.io/hostname": name}
    if region:
        labels["topology.kubernetes.io/region"] = region
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod(
    name: str,
    ip: str | None,
    namespace: str = "default",
    *,
    service_account: str = "default",
    sidecar: bool = False,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod as the API server shows it; `sidecar`: labelled security.istio.io/tlsMode: istio."""
    all_labels = {"app": name.rsplit("-", 1)[0], **(labels or {})}
    if sidecar:
        all_labels["security.istio.io/tlsMode"] = "istio"
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": all_labels},
        "spec": {
            "serviceAccountName": service_account,
            "containers": [{"name": "app", "ports": [{"containerPort": 8080, "name": "http"}]}],
        },
        "status": status,
    }


def endpoint_slice(
    svc: str,
    endpoints: Iterable[Ep],
    namespace: str = "default",
    ports: Sequence[tuple[str, int]] = (("http", 8080),),
    name: str | None = None,
) -> dict[str, Any]:
    eps = []
    for ep in endpoints:
        conditions = {
            k: v
            for k, v in (
                ("ready", ep.ready),
                ("serving", ep.serving),
                ("terminating", ep.terminating),
            )
            if v is not None
        }
        item: dict[str, Any] = {"addresses": [ep.ip], "conditions": conditions}
        if ep.zone:
            item["zone"] = ep.zone
        if ep.node:
            item["nodeName"] = ep.node
        if ep.pod:
            item["targetRef"] = {"kind": "Pod", "namespace": namespace, "name": ep.pod}
        eps.append(item)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{svc}-slice",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": svc},
        },
        "addressType": "IPv4",
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
        "endpoints": eps,
    }


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def istio_object(kind: str, name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A `networking.istio.io/v1` object (VirtualService, DestinationRule, ...) as written."""
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def as_list(objects: Iterable[dict[str, Any]]) -> str:
    """A `kind: List` document, like kubectl prints."""
    document = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    return yaml.dump(document, Dumper=_DUMPER)


def write_mesh(
    path: Path,
    objects: Iterable[dict[str, Any]],
    clusters: Mapping[str, Iterable[dict[str, Any]]] | None = None,
) -> None:
    """Replace the registry file atomically, as an editor or a config tool would.

    `objects` are the local cluster's; `clusters` adds a document per other cluster
    (`cluster: ID`)."""
    documents = [as_list(objects)]
    for cluster, theirs in (clusters or {}).items():
        document = {"apiVersion": "v1", "kind": "List", "cluster": cluster, "items": list(theirs)}
        documents.append(yaml.dump(document, Dumper=_DUMPER))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("---\n".join(documents))
    tmp.replace(path)


def cluster_name(
    svc: str, port: int = 80, namespace: str = "default", domain: str = "cluster.local"
) -> str:
    """Istio's name for a Service port's cluster; `domain` is pilot's --cluster-domain."""
    return f"outbound|{port}||{svc}.{namespace}.svc.{domain}"


def simple_mesh(
    services: dict[str, list[str]], port: int = 80, target: int = 8080
) -> list[dict[str, Any]]:
    """One port per service; each service's endpoints are the given ready IPs."""
    objects: list[dict[str, Any]] = []
    for name, ips in services.items():
        objects.append(service(name, ports=(("http", port),)))
        objects.append(endpoint_slice(name, [Ep(ip) for ip in ips], ports=(("http", target),)))
    return objects
