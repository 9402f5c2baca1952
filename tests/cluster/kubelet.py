"""What a kubelet (and the scheduler) would write, so the real controllers do the rest.

`run_pod` binds a Pod to a Node (created once, Ready, with zone labels when asked) and
writes its status: phase Running, podIP, Ready. The EndpointSlice controller then puts
it behind the Services that select it, as on a real node. `set_ready` flips its
readiness; `remove_pod` deletes it at once (no kubelet is there to finish a graceful
deletion). Where a test needs the pod to run, it runs a network-namespace pod
(tests/support/pods.py) at the same address; tests.cluster.local_kubelet runs the
Pods the API server holds, their containers and all, for real.
"""

from __future__ import annotations

import datetime
from typing import Any

from tests.cluster.client import Kube, KubeError, path_of

Obj = dict[str, Any]
NODE = "node-1"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(ready: bool) -> list[Obj]:
    now = _now()
    flag = "True" if ready else "False"
    kinds = (("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", flag),
             ("Ready", flag))  # fmt: skip
    return [{"type": t, "status": s, "lastTransitionTime": now} for t, s in kinds]


async def ensure_node(kube: Kube, name: str = NODE, labels: dict[str, str] | None = None) -> None:
    """A Node object, Ready, created the first time it is asked for."""
    status, _ = await kube.request("GET", path_of("Node", name=name))
    if status == 200:
        return
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
    await kube.create(node)
    ready = {"type": "Ready", "status": "True", "lastHeartbeatTime": _now(),
             "lastTransitionTime": _now(), "reason": "KubeletReady"}  # fmt: skip
    await kube.merge_patch(
        path_of("Node", name=name) + "/status", {"status": {"conditions": [ready]}}
    )


async def run_pod(kube: Kube, pod: Obj, ip: str, node: str = NODE) -> Obj:
    """Create `pod` (unless it exists), bind it to `node`, mark it Running and Ready at `ip`."""
    meta = pod["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    await ensure_node(kube, node)
    status, _ = await kube.request("GET", path_of("Pod", namespace, name))
    if status == 404:
        await kube.create(pod)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    status, answer = await kube.request(
        "POST", path_of("Pod", namespace, name) + "/binding", binding
    )
    if status >= 300 and status != 409:  # 409: bound already
        raise KubeError(f"binding {namespace}/{name}: {status} {answer.get('message')}")
    return await _write_status(kube, namespace, name, ip, ready=True)


async def set_ready(kube: Kube, pod: Obj, ready: bool) -> Obj:
    meta = pod["metadata"]
    return await _write_status(kube, meta["namespace"], meta["name"], pod["status"]["podIP"], ready)


async def _write_status(kube: Kube, namespace: str, name: str, ip: str, ready: bool) -> Obj:
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "127.0.0.1",
        "startTime": _now(),
        "conditions": _conditions(ready),
    }
    return await kube.merge_patch(path_of("Pod", namespace, name) + "/status", {"status": status})


async def remove_pod(kube: Kube, pod: Obj) -> None:
    """Delete at once (grace period 0), as `kubectl delete --force --grace-period=0`."""
    meta = pod["metadata"]
    path = path_of("Pod", meta["namespace"], meta["name"]) + "?gracePeriodSeconds=0"
    status, answer = await kube.request("DELETE", path)
    if status >= 300 and status != 404:
        raise KubeError(f"DELETE pod {meta['name']}: {status} {answer.get('message')}")
