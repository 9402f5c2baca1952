"""istiod (tools/istiod/build) on a test control plane, and what it and pilot send a sidecar.

`running_istiod` runs it as bench/istiod.py does (its namespace made if need be, every
listener on 127.0.0.1, Istio's defaults) and yields its plaintext xDS address once
/ready; it fails the test where there is no Go to build it. `side_by_side` sets up
one Pod behind its Service with some Istio objects, and istiod and pilot both serving
its sidecar. `resources_of` asks a server (istiod or pilot) over delta ADS for the
resources of one type a sidecar gets.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench import istiod
from pilot.xds import types
from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane, free_port
from tests.cluster.workloads import (
    Kubelet,
    address,
    deployment,
    ensure_account,
    service,
    watching_pilot,
)
from tests.support.envoy_process import wait_until
from tests.support.xds_client import XdsClient, delta_resources, node

TIMEOUT = 60.0
BUILD_SECONDS = 900  # a first build of istiod on 2 shared cores (a cache hit: at once)


def _go() -> dict[str, str] | None:
    path = f"{os.environ.get('PATH', '')}:{istiod.GO_ARCHIVE_BIN}"
    return {**os.environ, "PATH": path} if shutil.which("go", path=path) else None


def _built() -> Path:
    env = _go()
    if env is None:
        # The suite needs Go (the Kubernetes binaries too): a missing one fails, never skips.
        pytest.fail("no `go` on PATH: istiod is built from the istio.io/istio module")
    done = subprocess.run(
        [str(istiod.BUILD)],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_SECONDS,
        check=True,
    )
    return Path(done.stdout.splitlines()[-1])


@asynccontextmanager
async def running_istiod(plane: ControlPlane, kube: Kube, folder: Path) -> AsyncIterator[str]:
    """istiod on the plane (its namespace made if need be), as bench/istiod.py runs it;
    its plaintext xDS address once /ready."""
    binaries = await asyncio.to_thread(_built)
    if (await kube.request("GET", path_of("Namespace", name=istiod.NAMESPACE)))[0] == 404:
        await kube.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": istiod.NAMESPACE}}
        )
    mesh = folder / "istiod-mesh.yaml"
    mesh.write_text(istiod.MESH_CONFIG)
    grpc, http = free_port(), free_port()
    argv = [
        str(binaries / "pilot-discovery"),
        "discovery",
        "--kubeconfig",
        str(plane.admin_kubeconfig),
        "--meshConfig",
        str(mesh),
        "--networksConfig",
        str(folder / "no-networks.yaml"),
        "--grpcAddr",
        f"127.0.0.1:{grpc}",
        "--secureGRPCAddr",
        f"127.0.0.1:{free_port()}",
        "--monitoringAddr",
        f"127.0.0.1:{free_port()}",
        "--httpAddr",
        f"127.0.0.1:{http}",
        "--httpsAddr",
        f"127.0.0.1:{free_port()}",
        "--ctrlz_port",
        str(free_port()),
    ]
    env = {
        **os.environ,
        "POD_NAMESPACE": istiod.NAMESPACE,
        "POD_NAME": "istiod-rules",
        "VALIDATION_WEBHOOK_CONFIG_NAME": "",
        "INJECTION_WEBHOOK_CONFIG_NAME": "",
    }
    with (folder / "istiod.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=folder, stdout=log, stderr=log
        )
        try:
            await wait_until(lambda: _ready(http), TIMEOUT, "istiod's /ready", until=bool)
            yield f"127.0.0.1:{grpc}"
        finally:
            process.terminate()
            await process.wait()


async def _ready(port: int) -> bool:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/ready") as answer,
        ):
            return answer.status == 200
    except aiohttp.ClientError:
        return False


async def clusters_of(target: str, node_id: str, names: set[str]) -> dict[str, Any]:
    """The clusters `names` as the server at `target` sends them to `node_id`."""
    return await resources_of(target, node_id, types.CLUSTER, ["*"], names)


async def resources_of(
    target: str, node_id: str, type_url: str, subscribe: Sequence[str], names: set[str]
) -> dict[str, Any]:
    """The resources `names` of `type_url` as the server at `target` sends them to
    `node_id`, subscribed to `subscribe`."""
    found: dict[str, Any] = {}
    async with XdsClient(target) as client:
        stream = client.delta_ads(node(node_id))
        await stream.subscribe(type_url, list(subscribe))
        while not names <= found.keys():
            response = await stream.next_response(TIMEOUT)
            await stream.ack(response)
            found |= {n: r.message for n, r in delta_resources(response).items() if n in names}
    return found


@dataclass(frozen=True)
class SideBySide:
    """A sidecar's node id, and the xDS address of each server ("pilot", "istiod")."""

    node_id: str
    servers: dict[str, str]


@asynccontextmanager
async def side_by_side(
    plane: ControlPlane,
    namespace: str,
    folder: Path,
    name: str,
    objects: Sequence[tuple[str, dict[str, Any]]] = (),
) -> AsyncIterator[SideBySide]:
    """One Pod of Deployment `name` behind Service `name`, the networking.istio.io
    objects `objects` ((kind, spec), each named `name`), and istiod and pilot both
    serving that Pod's sidecar."""
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(plane))
        await ensure_account(kube, namespace)
        await kube.create(deployment(name, namespace, 1))
        await kube.create(service(name, namespace))
        (pod,) = await Kubelet(kube, namespace).run_replicas(name, 1)
        for kind, spec in objects:
            await kube.create(
                {
                    "apiVersion": "networking.istio.io/v1",
                    "kind": kind,
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": spec,
                }
            )
        istiod_at = await stack.enter_async_context(running_istiod(plane, kube, folder))
        pilot = await stack.enter_async_context(watching_pilot(kube, plane, folder, (namespace,)))
        pod_name = pod["metadata"]["name"]
        node_id = f"sidecar~{address(pod)}~{pod_name}.{namespace}~{namespace}.svc.cluster.local"
        yield SideBySide(node_id, {"pilot": pilot.grpc_target, "istiod": istiod_at})
