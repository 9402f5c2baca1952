"""The test kubelet: Pods the API server holds, run for real on this machine.

`running_kubelet(kube, folder, namespaces)` starts a node (tests.cluster.node) and
watches the Pods of `namespaces` (list, then watch from that resourceVersion; relist
on an ERROR event). It is the scheduler too: a Pod with no nodeName is bound to its
node (`node-1`), since the control plane has none. Each Pod bound to it is run by a
`PodRun` (tests.cluster.pod_lifecycle) until it is deleted: a deletion with a grace
period (what controllers and `kubectl delete` do) stops its containers with SIGTERM
and then removes the object (DELETE with gracePeriodSeconds=0 and the Pod's uid as
precondition), as a kubelet finishes a graceful deletion. Pods that ended (Succeeded
or Failed) are left as they are. On the way out every pod is stopped and the node
removed.

A test finds its pods with `pods(namespace, label)` and waits for them with
`wait_running` (all containers ready) or `wait_phase`; failures name each pod's
state and its containers' last lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster.client import Kube, KubeError, path_of
from tests.cluster.kubelet import ensure_node
from tests.cluster.node import Node, running_node
from tests.cluster.pod_lifecycle import NODE_NAME, PodRun
from tests.support.envoy_process import wait_until

Obj = dict[str, Any]
log = logging.getLogger(__name__)
RELIST_DELAY = 0.5  # seconds before a failed watch lists again
START_TIMEOUT = 60.0  # seconds for a pod to come up: Envoy's first config included


@dataclass
class TestKubelet:
    """Runs the Pods of its namespaces on its node."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    kube: Kube
    node: Node
    folder: Path
    runs: dict[str, PodRun] = field(default_factory=dict)  # by the Pod's uid
    watch_errors: list[str] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _slots: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- what a test asks -------------------------------------------------------------

    def pods(self, namespace: str, label: str = "") -> list[PodRun]:
        """The pods run here in `namespace` (with label `key=value`, if given)."""
        key, _, value = label.partition("=")
        return [
            run for run in self.runs.values()
            if run.pod["metadata"]["namespace"] == namespace
            and (not key or run.pod["metadata"].get("labels", {}).get(key) == value)
        ]  # fmt: skip

    def describe(self) -> str:
        said = [*self.watch_errors[-3:], *(run.tail() for run in self.runs.values())]
        return "\n".join(said) or "no pods run here"

    async def wait_running(self, namespace: str, label: str, count: int = 1) -> list[PodRun]:
        """`count` pods of `label`, Running with every container ready."""

        def ready() -> list[PodRun]:
            found = [run for run in self.pods(namespace, label) if not run.stopping]
            return [run for run in found if _ready(run.pod)]

        return await wait_until(
            ready, START_TIMEOUT, f"{count} ready pod(s) {label} in {namespace}",
            until=lambda found: len(found) >= count, context=self.describe,
        )  # fmt: skip

    async def wait_phase(self, run: PodRun, phase: str) -> PodRun:
        await wait_until(lambda: run.phase, START_TIMEOUT, f"pod {run.name} {phase}",
                         until=lambda seen: seen == phase, context=self.describe)  # fmt: skip
        return run

    # -- the watch --------------------------------------------------------------------

    async def watch(self, namespace: str) -> None:
        """The namespace's Pods, listed and watched; an error is kept (`describe` shows
        it) and the watch starts again, as a kubelet's does."""
        while True:
            try:
                await self._watch_once(namespace)
            except (aiohttp.ClientError, KubeError, ValueError, KeyError) as error:
                self.watch_errors.append(f"watch of {namespace}: {type(error).__name__}: {error}")
                await asyncio.sleep(RELIST_DELAY)

    async def _watch_once(self, namespace: str) -> None:
        path = path_of("Pod", namespace)
        while True:
            listing = await self.kube.get(path)
            for pod in listing["items"]:
                await self._handle("ADDED", pod)
            version = listing["metadata"]["resourceVersion"]
            url = f"{self.kube.plane.url}{path}?watch=1&resourceVersion={version}"
            forever = aiohttp.ClientTimeout(total=None, sock_read=None)
            async with self.kube.session.get(url, timeout=forever) as answer:
                async for line in answer.content:
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    await self._handle(event["type"], event["object"])

    async def _handle(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        uid, node = meta["uid"], pod["spec"].get("nodeName")
        if node not in (None, NODE_NAME):
            return
        run = self.runs.get(uid)
        if kind == "DELETED":
            if run is not None and not run.stopping:
                self._spawn(self._remove(run, delete=False))
            return
        if "deletionTimestamp" in meta:
            if run is None or not run.stopping:
                self._spawn(self._remove(run, delete=True, pod=pod))
            return
        if run is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            await self._start(pod)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        if not pod["spec"].get("nodeName"):
            await ensure_node(self.kube, NODE_NAME)
            target = {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME}
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
                       "target": target}  # fmt: skip
            pod_path = path_of("Pod", meta["namespace"], meta["name"])
            status, _ = await self.kube.request("POST", pod_path + "/binding", binding)
            if status >= 300:
                return  # bound elsewhere meanwhile, or gone
            pod = await self.kube.get(pod_path)
        slot = f"k{next(self._slots)}"
        run = PodRun(self.kube, self.node, pod, self.folder / slot, slot)
        self.runs[meta["uid"]] = run
        self._spawn(self._run(run))

    async def _run(self, run: PodRun) -> None:
        try:
            await run.run()
        except Exception as error:  # a kubelet bug: shown by the test's wait, not lost
            run.error = f"the test kubelet failed: {type(error).__name__}: {error}"
            log.exception("pod %s", run.name)

    async def _remove(self, run: PodRun | None, delete: bool, pod: Obj | None = None) -> None:
        if run is not None:
            await run.stop()
        if delete and pod is not None:
            meta = pod["metadata"]
            path = path_of("Pod", meta["namespace"], meta["name"]) + "?gracePeriodSeconds=0"
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                    "preconditions": {"uid": meta["uid"]}}  # fmt: skip
            status, answer = await self.kube.request("DELETE", path, body)
            if status >= 300 and status not in (404, 409):
                raise KubeError(f"DELETE pod {meta['name']}: {status} {answer.get('message')}")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for run in self.runs.values():
            with contextlib.suppress(Exception):
                await run.stop()


def _ready(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@asynccontextmanager
async def running_kubelet(
    kube: Kube, folder: Path, namespaces: Sequence[str]
) -> AsyncIterator[TestKubelet]:
    """The test kubelet on a node of its own, running the Pods of `namespaces`."""
    async with running_node() as node:
        kubelet = TestKubelet(kube, node, folder)
        watches = [asyncio.create_task(kubelet.watch(ns)) for ns in namespaces]
        try:
            yield kubelet
        finally:
            for watch in watches:
                watch.cancel()
            await kubelet.close()
