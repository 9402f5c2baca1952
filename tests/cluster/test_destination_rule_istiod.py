"""pilot's clusters for a DestinationRule are istiod's, field for field.

The same API server, the same Service, Pod and DestinationRule (through the CRD):
istiod (tools/istiod/build: Go and the Go module proxy; skipped without Go) and
pilot each serve one sidecar of the namespace, and every field a rule writes in a
cluster (load balancer, ring hash, circuit breakers, connect timeout, upstream HTTP
options, outlier detection, panic threshold) is the same in both, for the service's
cluster, a subset's with its own policy, and a port-level override.

One difference is Istio's default, not the rule's: istiod (PILOT_AUTO_SEND_UNHEALTHY_
ENDPOINTS, on by default) sends unready endpoints and so turns the panic threshold
off (0) on every cluster whose rule gives no outlierDetection; pilot leaves unready
endpoints out and keeps Envoy's default there. The panic threshold is compared where
the rule's outlierDetection sets it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from envoy.config.cluster.v3 import cluster_pb2

from bench import istiod
from pilot.xds import types
from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane, free_port
from tests.cluster.workloads import (
    SERVICE_PORT,
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
# What a DestinationRule writes in a cluster.
FIELDS = (
    "lb_policy",
    "ring_hash_lb_config",
    "circuit_breakers",
    "connect_timeout",
    "typed_extension_protocol_options",
    "outlier_detection",
    "common_lb_config",
)
POLICY = {
    "loadBalancer": {"simple": "LEAST_REQUEST"},
    "connectionPool": {
        "tcp": {"maxConnections": 1, "connectTimeout": "30ms"},
        "http": {
            "http1MaxPendingRequests": 1,
            "http2MaxRequests": 10,
            "maxRequestsPerConnection": 1,
            "maxRetries": 3,
            "idleTimeout": "1m",
        },
    },
    "outlierDetection": {
        "consecutive5xxErrors": 1,
        "consecutiveGatewayErrors": 2,
        "interval": "1s",
        "baseEjectionTime": "3m",
        "maxEjectionPercent": 100,
        "minHealthPercent": 20,
    },
}
SUBSETS = [
    {"name": "v1", "labels": {"app": "reviews"}},
    {
        "name": "hashed",
        "labels": {"app": "reviews"},
        "trafficPolicy": {
            "loadBalancer": {"consistentHash": {"httpHeaderName": "end-user"}},
            "outlierDetection": {"consecutive5xxErrors": 0},
        },
    },
    {
        "name": "port",
        "labels": {"app": "reviews"},
        "trafficPolicy": {
            "portLevelSettings": [
                {
                    "port": {"number": SERVICE_PORT},
                    "loadBalancer": {"simple": "RANDOM"},
                    "connectionPool": {"http": {"maxRetries": 7}},
                }
            ]
        },
    },
]


def _go() -> dict[str, str] | None:
    path = f"{os.environ.get('PATH', '')}:{istiod.GO_ARCHIVE_BIN}"
    return {**os.environ, "PATH": path} if shutil.which("go", path=path) else None


def _built() -> Path:
    env = _go()
    if env is None:
        pytest.skip("no Go: istiod cannot be built here")
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
    found: dict[str, Any] = {}
    async with XdsClient(target) as client:
        stream = client.delta_ads(node(node_id))
        await stream.subscribe(types.CLUSTER, ["*"])
        while not names <= found.keys():
            response = await stream.next_response(TIMEOUT)
            await stream.ack(response)
            found |= {n: r.message for n, r in delta_resources(response).items() if n in names}
    return found


def written(cluster: cluster_pb2.Cluster) -> dict[str, str]:
    fields = FIELDS if cluster.HasField("outlier_detection") else FIELDS[:-1]
    return {field: str(getattr(cluster, field)) for field in fields}


async def test_pilots_clusters_for_a_rule_are_istiods(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    host = f"reviews.{namespace}.svc.cluster.local"
    names = {f"outbound|{SERVICE_PORT}|{s}|{host}" for s in ("", "v1", "hashed", "port")}
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(deployed))
        await ensure_account(kube, namespace)
        await kube.create(deployment("reviews", namespace, 1))
        await kube.create(service("reviews", namespace))
        (pod,) = await Kubelet(kube, namespace).run_replicas("reviews", 1)
        await kube.create(
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "DestinationRule",
                "metadata": {"name": "reviews", "namespace": namespace},
                "spec": {"host": "reviews", "trafficPolicy": POLICY, "subsets": SUBSETS},
            }
        )
        theirs_at = await stack.enter_async_context(running_istiod(deployed, kube, tmp_path))
        pilot = await stack.enter_async_context(
            watching_pilot(kube, deployed, tmp_path, (namespace,))
        )
        name = pod["metadata"]["name"]
        node_id = f"sidecar~{address(pod)}~{name}.{namespace}~{namespace}.svc.cluster.local"
        ours = await clusters_of(pilot.grpc_target, node_id, names)
        theirs = await clusters_of(theirs_at, node_id, names)
    for cluster in sorted(names):
        assert written(ours[cluster]) == written(theirs[cluster]), cluster
    assert not ours[f"outbound|{SERVICE_PORT}|port|{host}"].HasField("outlier_detection")
