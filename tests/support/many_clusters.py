"""Many clusters on test API servers (Istio's multi-primary model), as the tests of
remote clusters and of hostile remote kubeconfigs set them up.

`clusters` runs a test API server per cluster, each serving Service alpha with one
endpoint; `pilot_with_envoy` is `pilot discovery --kubeconfig LOCAL` (in namespace
PILOT_NAMESPACE, where it reads remote Secrets) with a real Envoy on it; `alpha_hosts`
and `wait_for_hosts` read Envoy's endpoints of alpha with the cluster id of each;
`ready_lines` reads `/ready`; `remote_secret` is a Secret of kubeconfigs labelled
for pilot, as `kubectl create secret generic` makes it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kubeapi import KubeAPIServer
from tests.support.ca import write_plugged_in
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap
from tests.support.kube_helpers import apply_mesh, kube_api, ready
from tests.support.mesh import cluster_name
from tests.support.pilot_process import PilotProcess, launch

PILOT_NAMESPACE = "pilot-system"
ALPHA = cluster_name("alpha")

Hosts = dict[str, str]  # endpoint IP -> the cluster id in its metadata


@dataclass
class Cluster:
    """A test API server standing for one cluster, and a kubeconfig that reaches it."""

    srv: KubeAPIServer
    kubeconfig: Path


@asynccontextmanager
async def clusters(tmp_path: Path, *names: str) -> AsyncIterator[dict[str, Cluster]]:
    """A running test API server per name; each serves Service alpha with one endpoint,
    127.0.N.1 for the Nth name (N from 1)."""
    async with AsyncExitStack() as stack:
        found: dict[str, Cluster] = {}
        for n, name in enumerate(names, start=1):
            srv, kubeconfig = await stack.enter_async_context(kube_api(tmp_path / name))
            apply_mesh(srv, {"alpha": ready(f"127.0.{n}.1")})
            found[name] = Cluster(srv, kubeconfig)
        yield found


@asynccontextmanager
async def pilot_with_envoy(
    tmp_path: Path, local: Cluster, *extra: str
) -> AsyncIterator[tuple[PilotProcess, EnvoyProcess]]:
    """`pilot discovery --kubeconfig LOCAL ...` as a subprocess, and an Envoy on it."""
    ca = write_plugged_in(tmp_path / "plugged-in-ca")
    source = ["--kubeconfig", str(local.kubeconfig)]
    pilot = await launch(
        tmp_path,
        source,
        ca.directory,
        ca.root.cert_pem.encode(),
        *extra,
        env={"POD_NAMESPACE": PILOT_NAMESPACE},
    )
    try:
        bootstrap = load_example_bootstrap("envoy-ads-delta.yaml", pilot.grpc_port, "node-1")
        workdir = tmp_path / "envoy"
        workdir.mkdir()
        async with EnvoyProcess(bootstrap, workdir, "node-1", log_level="warning") as envoy:
            yield pilot, envoy
    finally:
        await pilot.stop()


async def alpha_hosts(envoy: EnvoyProcess) -> Hosts:
    """Envoy's endpoints of alpha, each with the cluster id its metadata names."""
    assignment = (await envoy.dynamic_endpoint_configs()).get(ALPHA, {})
    hosts: Hosts = {}
    for locality in assignment.get("endpoints", []):
        for lb_endpoint in locality.get("lb_endpoints", []):
            address = lb_endpoint["endpoint"]["address"]["socket_address"]["address"]
            metadata = lb_endpoint.get("metadata", {}).get("filter_metadata", {})
            hosts[address] = metadata.get("istio", {}).get("cluster_id", "")
    return hosts


async def wait_for_hosts(envoy: EnvoyProcess, expected: Hosts, what: str) -> None:
    await envoy.wait_for(
        lambda: alpha_hosts(envoy), 15.0, what, until=lambda hosts: hosts == expected
    )


async def ready_lines(pilot: PilotProcess) -> tuple[int, list[str]]:
    status, body = await pilot.get("/ready")
    return status, str(body).splitlines()


def remote_secret(name: str, kubeconfigs: Mapping[str, str]) -> dict[str, Any]:
    """A Secret as `kubectl create secret generic` makes it, labelled for pilot."""
    data = {key: base64.b64encode(text.encode()).decode() for key, text in kubeconfigs.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": PILOT_NAMESPACE,
            "labels": {"istio/multiCluster": "true"},
        },
        "type": "Opaque",
        "data": data,
    }


async def cluster_metrics(pilot: PilotProcess) -> dict[str, float]:
    """`pilot_cluster_synced` by cluster id, and `pilot_remote_clusters` under "remote"."""
    _status, body = await pilot.get("/metrics")
    found = {
        m[1]: float(m[2])
        for m in re.finditer(r'^pilot_cluster_synced\{cluster_id="([^"]+)"\} (\S+)$', body, re.M)
    }
    remote = re.search(r"^pilot_remote_clusters (\S+)$", body, re.M)
    assert remote is not None, "no pilot_remote_clusters metric"
    found["remote"] = float(remote[1])
    return found
