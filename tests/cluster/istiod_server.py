"""istiod (tools/istiod/build) on a test control plane, and what it and pilot send a sidecar.

`running_istiod` runs it as bench/istiod.py does (its namespace made if need be, every
listener on 127.0.0.1, Istio's defaults) and yields its plaintext xDS address once
/ready; it fails the test where there is no Go to build it. `side_by_side` sets up
one Pod behind its Service (and one Pod in each client namespace) with some Istio
objects, and istiod and pilot both serving their sidecars. `resources_of` asks a server
(istiod or pilot) over delta ADS for the resources of one type a sidecar gets.

pilot there checks tokens (`--xds-auth kubernetes`, as deployed), so a sidecar proves
its namespace as a real one does: over pilot's TLS port with a service-account token
bound to its Pod (`SideBySide.sidecars`); a stream on the plaintext port
(`SideBySide.node_id`) proves nothing and reads what every sidecar reads. istiod is
asked in plaintext, where it takes the node's word for its namespace.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.config.core.v3 import base_pb2

from bench import istiod
from pilot.security.xds_auth import XdsAuth
from pilot.xds import types
from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane, free_port
from tests.cluster.workload_tokens import Workload
from tests.cluster.workloads import (
    SERVICE_PORT,
    Kubelet,
    Obj,
    deployment,
    ensure_account,
    pod,
    service,
    sidecar_id,
    watching_pilot,
)
from tests.support.envoy_process import wait_until
from tests.support.mesh import istio_object
from tests.support.pilot import RunningPilot
from tests.support.xds_client import XdsClient, delta_resources, node, tls_credentials

TIMEOUT = 60.0
CLIENT = "sleep"  # the Pod run in each client namespace (Istio's sample client)
REDIRECT = {"INTERCEPTION_MODE": "REDIRECT"}  # a sidecar whose traffic is captured
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
        before = await _root_config_maps(kube)
        try:
            await wait_until(lambda: _ready(http), TIMEOUT, "istiod's /ready", until=bool)
            yield f"127.0.0.1:{grpc}"
        finally:
            process.terminate()
            await process.wait()
            await _remove_root_config_maps(kube, before)


ROOT_CONFIG_MAP = "istio-ca-root-cert"


async def _root_config_maps(kube: Kube) -> set[str]:
    """The namespaces holding a root ConfigMap (istiod's, pilot's or a test's)."""
    found = await kube.get(f"/api/v1/configmaps?fieldSelector=metadata.name={ROOT_CONFIG_MAP}")
    return {item["metadata"]["namespace"] for item in found.get("items", [])}


async def _remove_root_config_maps(kube: Kube, before: set[str]) -> None:
    """Remove the root ConfigMaps made while istiod ran where there were none: istiod
    publishes its root to every namespace, kube-system's too, where pilot never does and a
    later test looks for none."""
    for namespace in sorted(await _root_config_maps(kube) - before):
        meta = {"name": ROOT_CONFIG_MAP, "namespace": namespace}
        await kube.delete({"kind": "ConfigMap", "metadata": meta})


async def _ready(port: int) -> bool:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/ready") as answer,
        ):
            return answer.status == 200
    except aiohttp.ClientError:
        return False


@dataclass(frozen=True)
class Dial:
    """How a stream reaches a server: its xDS address, in plaintext, or over TLS
    (`credentials`) with a bearer token."""

    target: str
    credentials: grpc.ChannelCredentials | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    def client(self) -> XdsClient:
        return XdsClient(self.target, credentials=self.credentials, token=self.token)


async def clusters_of(
    target: str | Dial, node_id: str, names: set[str], metadata: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The clusters `names` as the server at `target` sends them to `node_id`."""
    return await resources_of(target, node_id, types.CLUSTER, ["*"], names, metadata=metadata)


async def resources_of(
    target: str | Dial,
    node_id: str,
    type_url: str,
    subscribe: Sequence[str],
    names: set[str],
    *,
    metadata: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The resources `names` of `type_url` as the server at `target` sends them to
    `node_id` (with node `metadata`), subscribed to `subscribe`."""
    sent = node(node_id, metadata)
    return await _read(
        target, sent, type_url, subscribe, keep=names.__contains__, enough=names.issubset
    )


async def _read(
    target: str | Dial,
    sent: base_pb2.Node,
    type_url: str,
    subscribe: Sequence[str],
    *,
    keep: Callable[[str], bool],
    enough: Callable[[Collection[str]], bool],
) -> dict[str, Any]:
    """The resources of `type_url` whose names `keep` takes, read over delta ADS as node
    `sent` until the names read are `enough`."""
    dial = target if isinstance(target, Dial) else Dial(target)
    found: dict[str, Any] = {}
    async with dial.client() as client:
        stream = client.delta_ads(sent)
        await stream.subscribe(type_url, list(subscribe))
        while not enough(found.keys()):
            response = await stream.next_response(TIMEOUT)
            await stream.ack(response)
            found |= {n: r.message for n, r in delta_resources(response).items() if keep(n)}
    return found


@dataclass(frozen=True)
class Sidecar:
    """A Pod's sidecar: its node as Istio's agent writes it (the id; metadata NAMESPACE,
    SERVICE_ACCOUNT, INTERCEPTION_MODE) and how it dials each server."""

    node_id: str
    metadata: dict[str, str]
    dials: dict[str, Dial]  # by server: "pilot", "istiod"

    async def clusters_of(self, server: str, host: str) -> dict[str, Any]:
        """Every cluster of `host` (by name) that `server` sends this sidecar, read until
        the service's own cluster on SERVICE_PORT is among them."""
        own = f"outbound|{SERVICE_PORT}||{host}"
        sent = node(self.node_id, self.metadata)

        def of_host(name: str) -> bool:
            return name.startswith("outbound|") and name.endswith(f"|{host}")

        def has_own(names: Collection[str]) -> bool:
            return own in names

        return await _read(
            self.dials[server], sent, types.CLUSTER, ["*"], keep=of_host, enough=has_own
        )


@dataclass(frozen=True)
class SideBySide:
    """The xDS address of each server ("pilot", "istiod"), and the sidecars they serve:
    `node_id`, the service's Pod's, reading what every sidecar reads; `sidecars`, by
    namespace, the service's Pod's and each client Pod's, proving who they are."""

    node_id: str
    servers: dict[str, str]
    sidecars: dict[str, Sidecar]


IstioObject = tuple[str, Obj] | Obj  # (kind, spec), or a whole object


def _whole(shape: IstioObject, namespace: str, name: str) -> Obj:
    """`shape` as it is, or (kind, spec) named `name` in `namespace`."""
    if isinstance(shape, dict):
        return shape
    kind, spec = shape
    return istio_object(kind, name, namespace, spec)


async def _run_client(kube: Kube, namespace: str, block: int) -> Obj:
    """Pod CLIENT in `namespace`, running at the first address of `block`."""
    await ensure_account(kube, namespace)
    return await Kubelet(kube, namespace, block).run(pod(CLIENT, namespace, CLIENT))


async def _sidecar(kube: Kube, pilot: RunningPilot, istiod_at: str, running: Obj) -> Sidecar:
    """`running`'s sidecar: to pilot over TLS with a token bound to it, to istiod in
    plaintext."""
    workload = Workload(running, running["spec"]["serviceAccountName"])
    security = pilot.discovery.security
    assert security is not None, "pilot runs its CA"
    credentials = tls_credentials(security.ca.root_pem.encode())
    tls = f"localhost:{pilot.discovery.grpc.tls_port}"  # the name pilot's certificate has
    dials = {
        "pilot": Dial(tls, credentials, await workload.token(kube)),
        "istiod": Dial(istiod_at),
    }
    claims = {"NAMESPACE": workload.namespace, "SERVICE_ACCOUNT": workload.account}
    return Sidecar(sidecar_id(running), claims | REDIRECT, dials)


@asynccontextmanager
async def side_by_side(
    plane: ControlPlane,
    namespace: str,
    folder: Path,
    name: str,
    objects: Sequence[IstioObject] = (),
    *,
    clients: Sequence[str] = (),
) -> AsyncIterator[SideBySide]:
    """One Pod of Deployment `name` behind Service `name`, Pod CLIENT in each namespace of
    `clients`, the networking.istio.io `objects` ((kind, spec) named `name` in
    `namespace`, or whole objects), and istiod and pilot both serving those Pods'
    sidecars."""
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(plane))
        await ensure_account(kube, namespace)
        await kube.create(deployment(name, namespace, 1))
        await kube.create(service(name, namespace))
        pods = await Kubelet(kube, namespace).run_replicas(name, 1)
        for block, client in enumerate(clients, start=1):
            pods.append(await _run_client(kube, client, block))
        for shape in objects:
            await kube.create(_whole(shape, namespace, name))
        istiod_at = await stack.enter_async_context(running_istiod(plane, kube, folder))
        pilot = await stack.enter_async_context(
            watching_pilot(
                kube, plane, folder, (namespace, *clients),
                xds_auth=XdsAuth.KUBERNETES, plaintext_secrets=False,
                grpc_tls_addr="127.0.0.1:0",
            )
        )  # fmt: skip
        sidecars = {
            p["metadata"]["namespace"]: await _sidecar(kube, pilot, istiod_at, p) for p in pods
        }
        servers = {"pilot": pilot.grpc_target, "istiod": istiod_at}
        yield SideBySide(sidecar_id(pods[0]), servers, sidecars)
