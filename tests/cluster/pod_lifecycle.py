"""One Pod's life on the test kubelet's node, from its binding to its deletion.

`PodRun.run` does what a kubelet does for a Pod bound to it, in a kubelet's order:
1. the pod's network namespace at the next address on the node's bridge; status
   Pending with podIP and hostIP (the downward API's status.podIP then has a value);
2. its volumes (tests.cluster.pod_volumes) and its /etc/hosts (tests.cluster.node);
3. its init containers in order: a plain one runs to completion (a non-zero exit
   leaves the pod Pending, Init:Error, its output in the error: this kubelet does not
   retry); one with `restartPolicy: Always` is a native sidecar: started, and the next
   container waits until its startupProbe has passed (if it has one);
4. its containers in order, each one's postStart hook run to its end before the next
   starts (what Istio's holdApplicationUntilProxyStarts relies on);
5. then it keeps them: probes on their schedule (tests.cluster.probes), readiness into
   the container statuses and the pod's Ready condition (the sidecars' included, as
   Kubernetes counts them), a container that fails liveness or exits restarted as the
   pod's restartPolicy says (native sidecars always), after a back-off that doubles.
   Once every container of a pod that does not restart has ended, its sidecars get
   SIGTERM (in reverse order) and the pod is Succeeded (all exited 0) or Failed.
`stop` is a deletion: SIGTERM to the containers, then to the sidecars in reverse order,
SIGKILL after the grace period (capped at STOP_GRACE), the namespace gone.

Every container process this pod ran stays in `processes` (name -> each run), so a test
reads what it printed; `probers` holds each container's current probes and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.client import Kube, path_of
from tests.cluster.container_process import (
    ContainerError,
    ContainerProcess,
    Launch,
    user_of,
)
from tests.cluster.node import Node, entrypoint
from tests.cluster.pod_env import EnvError, config_map_names, container_env, expand
from tests.cluster.pod_volumes import VolumeError, make_volumes, mounts_of
from tests.cluster.probes import Prober, run_probe
from tests.support.pods import Pod, add_pod, remove_pod

Obj = dict[str, Any]
NODE_NAME = "node-1"
STOP_GRACE = 10.0  # seconds: terminationGracePeriodSeconds, capped for tests
INIT_TIMEOUT = 120.0
HOOK_TIMEOUT = 120.0
MAX_BACKOFF = 8.0
_FAILURES = (ContainerError, EnvError, VolumeError, ValueError, KeyError)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _any_changed(probers: list[Prober]) -> None:
    """Until one of `probers` changes its verdict."""
    waiters = [asyncio.create_task(p.changed.wait()) for p in probers]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    for prober in probers:
        prober.changed.clear()


def _backoff(restarts: int) -> float:
    """Seconds before a container's restart: doubling from 0.5, at most MAX_BACKOFF (a
    kubelet's 10 s to 5 min, compressed for tests)."""
    return float(min(0.5 * 2 ** (restarts - 1), MAX_BACKOFF))


def is_sidecar(container: Obj) -> bool:
    return container.get("restartPolicy") == "Always"


@dataclass
class ContainerState:
    """What the kubelet reports for one container."""

    container: Obj
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    restarts: int = 0
    started: bool = False
    ready: bool = False

    def status(self) -> Obj:
        name = self.container["name"]
        return {"name": name, "image": self.container.get("image", ""), "imageID": "",
                "containerID": f"test-kubelet://{name}", "ready": self.ready,
                "started": self.started, "restartCount": self.restarts,
                "state": self.state}  # fmt: skip


@dataclass
class PodRun:
    """One Pod, run on the node."""

    kube: Kube
    node: Node
    pod: Obj
    folder: Path
    slot: str  # the pod's name on the node's network
    netpod: Pod | None = None
    launches: dict[str, Launch] = field(default_factory=dict)
    states: dict[str, ContainerState] = field(default_factory=dict)
    processes: dict[str, list[ContainerProcess]] = field(default_factory=dict)
    probers: dict[str, list[Prober]] = field(default_factory=dict)
    phase: str = "Pending"
    error: str = ""
    initialized: bool = False
    stopping: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _probing: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    # -- what a test reads ----------------------------------------------------------

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def address(self) -> str:
        assert self.netpod is not None, f"pod {self.name} has no address yet"
        return self.netpod.address

    def output(self, container: str) -> list[str]:
        """Every line `container` printed, over all its runs."""
        return [line for run in self.processes.get(container, []) for line in run.lines]

    def tail(self, count: int = 12) -> str:
        parts = [f"pod {self.name}: {self.phase} {self.error}".rstrip()]
        for name, runs in self.processes.items():
            lines = self.output(name)[-count:]
            parts.append(f"  {name} ({len(runs)} run(s)):\n    " + "\n    ".join(lines))
        return "\n".join(parts)

    # -- status ---------------------------------------------------------------------

    def _spec(self, key: str) -> list[Obj]:
        containers: list[Obj] = self.pod["spec"].get(key, [])
        return containers

    def _conditions(self) -> list[Obj]:
        everything = [*self._spec("containers"), *filter(is_sidecar, self._spec("initContainers"))]
        ready = bool(everything) and all(self.states[c["name"]].ready for c in everything)
        ready = ready and self.phase == "Running"
        flags = (("PodScheduled", True), ("Initialized", self.initialized),
                 ("ContainersReady", ready), ("Ready", ready))  # fmt: skip
        return [{"type": kind, "status": str(flag), "lastTransitionTime": now()}
                for kind, flag in flags]  # fmt: skip

    async def write_status(self) -> None:
        """The pod's status as this kubelet sees it now, to the API server."""
        async with self._write_lock:
            status: Obj = {"phase": self.phase, "hostIP": self.node.address,
                           "hostIPs": [{"ip": self.node.address}],
                           "startTime": self.pod.get("status", {}).get("startTime") or now(),
                           "conditions": self._conditions(),
                           "initContainerStatuses": [self.states[c["name"]].status()
                                                     for c in self._spec("initContainers")],
                           "containerStatuses": [self.states[c["name"]].status()
                                                 for c in self._spec("containers")]}  # fmt: skip
            if self.netpod is not None:
                status |= {"podIP": self.address, "podIPs": [{"ip": self.address}]}
            if self.error:
                status |= {"message": self.error[:1000], "reason": "TestKubelet"}
            meta = self.pod["metadata"]
            path = path_of("Pod", meta["namespace"], meta["name"]) + "/status"
            status_code, answer = await self.kube.request(
                "PATCH", path, {"status": status}, "application/merge-patch+json"
            )
            if status_code < 300:
                self.pod = answer
        self.changed.set()

    # -- the pod's life -------------------------------------------------------------

    async def run(self) -> None:
        """Start the pod and keep it (the task the kubelet runs per pod)."""
        for container in [*self._spec("initContainers"), *self._spec("containers")]:
            self.states[container["name"]] = ContainerState(container)
        try:
            self.netpod = add_pod(self.node.network, self.slot, [self.node.service_range])
            await self.write_status()
            await self._prepare()
            for container in self._spec("initContainers"):
                if not await self._init(container):
                    return
            self.initialized, self.phase = True, "Running"
            for container in self._spec("containers"):
                await self._start(container)
            await self.write_status()
            await self._await_completion()
        except _FAILURES as error:
            self.error = f"{type(error).__name__}: {error}"
            await self.write_status()

    async def _prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        volumes = await make_volumes(self.kube, self.pod, self.folder)
        hosts = await self.node.hosts_file(self.kube, self.pod, self.folder)
        every = [*self._spec("initContainers"), *self._spec("containers")]
        names = set().union(*(config_map_names(c) for c in every))
        namespace = self.pod["metadata"]["namespace"]
        config_maps = {n: await self.kube.get(path_of("ConfigMap", namespace, n)) for n in names}
        assert self.netpod is not None
        for container in every:
            env = container_env(container, self.pod, config_maps, {"PATH": self.node.path})
            mounts = mounts_of(container, volumes)
            self.node.mount_points.ensure(mount.path for mount in mounts)
            self.launches[container["name"]] = Launch(
                container, self.netpod.namespace, mounts, hosts, user_of(container, self.pod),
                env, self.node.pilot_script, container.get("workingDir") or "/",
            )  # fmt: skip

    def _command(self, container: Obj) -> list[str]:
        """command (else the image's entrypoint) and args, $(VAR)s expanded."""
        env = self.launches[container["name"]].env
        command = container.get("command") or entrypoint(container.get("image", ""))
        return [expand(word, env) for word in [*command, *container.get("args", [])]]

    async def _init(self, container: Obj) -> bool:
        """One init container: a sidecar started, or a plain one run to its end (False:
        it failed, the pod stays Pending)."""
        if is_sidecar(container):
            await self._start(container)
            return True
        state = self.states[container["name"]]
        process = await self._spawn(container)
        try:
            async with asyncio.timeout(INIT_TIMEOUT):
                code = await process.process.wait()
                await process.output.finished()
        except TimeoutError:
            code = await process.stop()
        reason = "Completed" if code == 0 else "Error"
        state.state = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": now()}}
        if code != 0:
            self.error = f"init container {container['name']} exited {code}: " + " | ".join(
                process.lines[-5:]
            )
        await self.write_status()
        return code == 0

    async def _spawn(self, container: Obj) -> ContainerProcess:
        process = await self.launches[container["name"]].start(self._command(container))
        self.processes.setdefault(container["name"], []).append(process)
        state = self.states[container["name"]]
        state.state = {"running": {"startedAt": now()}}
        return process

    async def _start(self, container: Obj) -> None:
        """Start a long-running container: its hook, its probes; wait for its startup
        probe when the next container must (a native sidecar)."""
        name = container["name"]
        process = await self._spawn(container)
        hook = container.get("lifecycle", {}).get("postStart", {}).get("exec")
        if hook is not None:
            code, output = await self.launches[name].run(list(hook["command"]), HOOK_TIMEOUT)
            if code != 0:
                self.error = f"postStart of {name} exited {code}: {output.strip()[-300:]}"
                await process.stop()
        startup = self._probers_for(container)
        self._tasks.append(asyncio.create_task(self._keep(container, process)))
        if startup is not None and is_sidecar(container):
            await self._until_started(startup, process)
        await self.write_status()

    async def _until_started(self, startup: Prober, process: ContainerProcess) -> None:
        while not (startup.succeeded or startup.failed_out or process.ended):
            startup.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # also notice the process ending
                    await startup.changed.wait()

    def _probers_for(self, container: Obj) -> Prober | None:
        """The container's probers, started (the startup one first, the others once it
        passes); the startup prober, if any."""
        name = container["name"]
        state = self.states[name]
        launch = self.launches[name]

        def checker(probe: Obj) -> Callable[[], Awaitable[tuple[bool, str]]]:
            return lambda: run_probe(probe, container, self.address,
                                     self.node.network.bridge_namespace, launch.run)  # fmt: skip

        probers = [Prober(kind, container[f"{kind}Probe"], checker(container[f"{kind}Probe"]))
                   for kind in ("startup", "liveness", "readiness")
                   if f"{kind}Probe" in container]  # fmt: skip
        self.probers[name] = probers
        startup = next((p for p in probers if p.kind == "startup"), None)
        state.started = startup is None
        state.ready = state.started and not any(p.kind == "readiness" for p in probers)
        if name in self._probing:  # the probes of the container's previous run
            self._probing[name].cancel()
        self._probing[name] = asyncio.create_task(self._probe(container, probers, startup))
        return startup

    async def _probe(self, container: Obj, probers: list[Prober], startup: Prober | None) -> None:
        state = self.states[container["name"]]
        if startup is not None:
            await startup.run(until_success=True)
            state.started = startup.succeeded
            await self.write_status()
            if not startup.succeeded:
                return
        others = [p for p in probers if p.kind != "startup"]
        tasks = [asyncio.create_task(p.run()) for p in others]
        try:
            while True:
                ready = next((p for p in others if p.kind == "readiness"), None)
                readiness = True if ready is None else ready.succeeded
                if readiness != state.ready:
                    state.ready = readiness
                    await self.write_status()
                if not others or any(p.kind == "liveness" and p.failed_out for p in others):
                    return  # nothing more to watch, or _keep restarts it
                await _any_changed(others)
        finally:
            for task in tasks:
                task.cancel()

    async def _keep(self, container: Obj, process: ContainerProcess) -> None:
        """Wait for the container to end (or fail liveness), restart it as the policy says."""
        name = container["name"]
        state = self.states[name]
        while True:
            code = await self._ended_or_dead(name, process)
            state.ready = False
            reason = "Completed" if code == 0 else "Error"
            state.state = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": now()}}
            if self.stopping:
                return
            policy = self.pod["spec"].get("restartPolicy", "Always")
            policy = "Always" if is_sidecar(container) else policy
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                await self.write_status()
                self.changed.set()
                return
            state.restarts += 1
            await asyncio.sleep(_backoff(state.restarts))  # the kubelet's crash back-off
            if self.stopping:
                return
            process = await self._spawn(container)
            self._probers_for(container)
            await self.write_status()

    async def _ended_or_dead(self, name: str, process: ContainerProcess) -> int:
        """The container's exit status, once it exits or has failed liveness (then killed)."""
        while process.process.returncode is None:
            if any(p.kind == "liveness" and p.failed_out for p in self.probers.get(name, [])):
                return await process.stop()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await process.process.wait()
        return process.process.returncode

    async def _await_completion(self) -> None:
        """For a pod whose containers do not restart: once they have all ended, its
        sidecars stop and the pod ends (Succeeded or Failed)."""
        if self.pod["spec"].get("restartPolicy", "Always") == "Always":
            return
        apps = [c["name"] for c in self._spec("containers")]
        while not all("terminated" in self.states[a].state for a in apps) or self._restarting():
            self.changed.clear()
            await self.changed.wait()
        codes = [self.states[a].state["terminated"]["exitCode"] for a in apps]
        await self._stop_sidecars()
        self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        await self.write_status()

    def _restarting(self) -> bool:
        return self.pod["spec"].get("restartPolicy") == "OnFailure" and any(
            self.states[c["name"]].state.get("terminated", {}).get("exitCode") not in (0, None)
            for c in self._spec("containers")
        )

    async def _stop_sidecars(self) -> None:
        self.stopping = True
        for container in reversed([c for c in self._spec("initContainers") if is_sidecar(c)]):
            for process in self.processes.get(container["name"], []):
                await process.stop(STOP_GRACE)
            self.states[container["name"]].ready = False

    async def stop(self) -> None:
        """A deletion: the containers stopped (SIGTERM, then SIGKILL after the grace
        period), the sidecars after them, the pod's namespace gone."""
        self.stopping = True
        grace = min(float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)), STOP_GRACE)
        apps = [p for c in self._spec("containers") for p in self.processes.get(c["name"], [])]
        await asyncio.gather(*(process.stop(grace) for process in apps))
        await self._stop_sidecars()
        for task in [*self._tasks, *self._probing.values()]:
            task.cancel()
        for process in [p for runs in self.processes.values() for p in runs]:
            await process.stop(1.0)
        if self.netpod is not None and self.slot in self.node.network.pods:
            remove_pod(self.node.network, self.slot)
