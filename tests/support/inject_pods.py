"""Pods and workloads as users write them, for the injector's tests (unit and integration)."""

from __future__ import annotations

import copy
from typing import Any


def app_pod(
    name: str = "web-1",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A pod of one container `web` serving 8080 (named `http`), with the given extras."""
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "web", **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    container = {
        "name": "web",
        "image": "registry.example/web:1",
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container], **spec},
    }


def probed_pod() -> dict[str, Any]:
    """A pod whose container has an httpGet readiness probe on a named port, a tcpSocket
    liveness probe and a gRPC startup probe."""
    pod = app_pod()
    container = pod["spec"]["containers"][0]
    container["readinessProbe"] = {
        "httpGet": {"path": "/ready", "port": "http", "scheme": "HTTPS",
                    "httpHeaders": [{"name": "X-Probe", "value": "1"}]},
        "periodSeconds": 7,
        "timeoutSeconds": 4,
    }  # fmt: skip
    container["livenessProbe"] = {"tcpSocket": {"port": 8080}, "failureThreshold": 5}
    container["startupProbe"] = {"grpc": {"port": 9090, "service": "health"}}
    return pod


def customized_pod(name: str = "custom-1") -> dict[str, Any]:
    """Istio's "customizing injection" example: the pod's own istio-proxy (image auto,
    more CPU, a mount of its own volume, a preStop), and the annotations users set for
    the proxy's image, log levels and concurrency."""
    pod = app_pod(
        name,
        annotations={
            "sidecar.istio.io/proxyImage": "registry.example/pilot-proxy:debug",
            "sidecar.istio.io/logLevel": "debug",
            "sidecar.istio.io/agentLogLevel": "default:warn,sds:debug",
            "proxy.istio.io/config": "concurrency: 4",
        },
        volumes=[{"name": "certs", "secret": {"secretName": "istio-certs"}}],
    )
    pod["spec"]["containers"].append({
        "name": "istio-proxy",
        "image": "auto",
        "resources": {"requests": {"cpu": "500m"}},
        "env": [{"name": "POD_NAME", "value": "fixed"}],
        "volumeMounts": [{"mountPath": "/etc/certs", "name": "certs"}],
        "readinessProbe": {"exec": {"command": ["true"]}},
        "securityContext": {"runAsUser": 1500},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}},
    })  # fmt: skip
    return pod


def workload(kind: str, name: str = "web", namespace: str | None = "shop") -> dict[str, Any]:
    """A workload of `kind` whose pod template is `app_pod`'s (CronJob: in its job template)."""
    template = copy.deepcopy(app_pod())
    del template["apiVersion"], template["kind"], template["metadata"]["name"]
    api_version = {"Job": "batch/v1", "CronJob": "batch/v1"}.get(kind, "apps/v1")
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if kind == "CronJob":
        template["spec"]["restartPolicy"] = "OnFailure"
        spec: dict[str, Any] = {
            "schedule": "*/5 * * * *",
            "jobTemplate": {"spec": {"template": template}},
        }
    elif kind == "Job":
        template["spec"]["restartPolicy"] = "Never"
        spec = {"template": template}
    else:
        spec = {"selector": {"matchLabels": {"app": "web"}}, "template": template}
        if kind == "StatefulSet":
            spec["serviceName"] = name
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}
