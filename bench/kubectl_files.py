"""Registry files as `kubectl get svc,endpointslices -A -o json|yaml` prints them.

Each service comes with what a real cluster adds (uid, resourceVersion, cluster
IPs, selector, status) and one EndpointSlice of `endpoints` ready Pods, so file
sizes and parse times are those of a real export (10,000 services: ~17 MB of
YAML, ~39 MB of indented JSON).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _service(index: int) -> dict[str, Any]:
    name, namespace = f"svc-{index}", f"ns-{index % 50}"
    cluster_ip = f"10.96.{index // 250}.{index % 250}"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": name},
            "name": name,
            "namespace": namespace,
            "resourceVersion": str(1000 + index),
            "uid": f"00000000-0000-4000-8000-{index:012d}",
        },
        "spec": {
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
            "selector": {"app": name},
            "sessionAffinity": "None",
            "type": "ClusterIP",
        },
        "status": {"loadBalancer": {}},
    }


def pod_ip(index: int, pod: int) -> str:
    """The address of one Pod of one service (unique across the file)."""
    number = index * 16 + pod
    return f"10.{64 + number // 65536}.{number // 256 % 256}.{number % 256}"


def _endpoint_slice(index: int, endpoints: int) -> dict[str, Any]:
    name, namespace = f"svc-{index}", f"ns-{index % 50}"
    return {
        "addressType": "IPv4",
        "apiVersion": "discovery.k8s.io/v1",
        "endpoints": [
            {
                "addresses": [pod_ip(index, pod)],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": f"node-{pod % 20}",
                "targetRef": {"kind": "Pod", "name": f"{name}-{pod}", "namespace": namespace},
                "zone": f"zone-{pod % 3}",
            }
            for pod in range(endpoints)
        ],
        "kind": "EndpointSlice",
        "metadata": {
            "labels": {
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": name,
            },
            "name": f"{name}-x7k2p",
            "namespace": namespace,
            "resourceVersion": str(500_000 + index),
        },
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def kubectl_list(services: int, endpoints: int = 3) -> dict[str, Any]:
    """One `kind: List` of every Service and its EndpointSlice."""
    items: list[dict[str, Any]] = []
    for index in range(services):
        items += [_service(index), _endpoint_slice(index, endpoints)]
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def render(document: dict[str, Any], output: str) -> str:
    """As kubectl prints it with `-o json` (4-space indent) or `-o yaml`."""
    if output == "json":
        return json.dumps(document, indent=4) + "\n"
    return str(yaml.dump(document, Dumper=_Dumper, default_flow_style=False))


def write_whole(path: Path, text: str) -> None:
    """Rewrite the file whole, as `kubectl ... > file` does, but atomically: a reader
    sees one version or the other, never half of one."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    os.replace(partial, path)
