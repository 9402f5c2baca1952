"""Hostile Pods, from the API server and from the registry file, against a real pilot.

Whoever writes Pods (a remote cluster's API server, the registry file) steers
which endpoints get mTLS and which identities a cluster accepts. Pods with
huge labels, hundreds of IPs, IPs that are not addresses, names that are
markup and newlines are skipped and counted (`invalid`), one bounded log line
each, and change nothing: the honest pod's endpoint keeps its sidecar, its
service accepts only its account, `/ready` keeps answering. A pod of another
cluster claiming a local pod's IP changes nothing of the local endpoint.
Churn of many pods leaves nothing behind; a pod that finishes leaves through
the informer's field selector.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pilot.registry.model import PodKey, ServiceKey
from tests.kubeapi import KubeAPIServer
from tests.support.envoy_process import wait_until
from tests.support.kube_helpers import kube_api, ready_status
from tests.support.mesh import Ep, cluster_name, endpoint_slice, pod, service
from tests.support.pilot import RunningPilot, running_kube_pilot, running_pilot
from tests.support.pod_views import sidecar_view as view_of
from tests.support.xds_client import DeltaStream, XdsClient, node

TIMEOUT = 30.0
WEB_IP = "127.0.5.1"
WEB = cluster_name("web")
SIDECAR = node(metadata={"INTERCEPTION_MODE": "NONE"})


def honest() -> list[dict[str, Any]]:
    return [
        service("web"),
        endpoint_slice("web", [Ep(WEB_IP)], name="web-1"),
        pod("web-1", WEB_IP, service_account="web", sidecar=True),
    ]


def hostile_pods() -> list[dict[str, Any]]:
    huge_labels = pod("huge", "127.0.5.2", labels={f"l{i}": "v" * 63 for i in range(5000)})
    many_ips = pod("many", "127.0.5.3")
    many_ips["status"]["podIPs"] = [{"ip": f"127.0.6.{i}"} for i in range(1, 250)]
    bad_ip = pod("bad-ip", "127.0.5.1\n<script>")
    bad_account = pod("bad-sa", WEB_IP, service_account="evil/../../sa\n", sidecar=True)
    marked_up = pod("x", WEB_IP, sidecar=True)
    marked_up["metadata"]["name"] = "<script>alert(1)</script>\nforged line"
    wrong_types = pod("types", WEB_IP)
    wrong_types["status"]["podIPs"] = {"ip": WEB_IP}
    return [huge_labels, many_ips, bad_ip, bad_account, marked_up, wrong_types]


@asynccontextmanager
async def kube_pilot(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, RunningPilot]]:
    async with kube_api(tmp_path) as (srv, kubeconfig):
        for obj in honest():
            srv.apply(obj)
        async with running_kube_pilot(kubeconfig) as pilot:
            yield srv, pilot


async def sidecar_view(stream: DeltaStream) -> tuple[list[str], bool]:
    return await view_of(stream, WEB)


def pod_faults(pilot: RunningPilot) -> int:
    counts = pilot.discovery.watching.faults.counts
    return sum(
        n for (_, kind, reason), n in counts.items() if kind == "Pod" and reason == "invalid"
    )


async def test_hostile_pods_from_the_api_server_are_skipped_and_change_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "pilot.sources.kubernetes")
    async with kube_pilot(tmp_path) as (srv, pilot), XdsClient(pilot.grpc_target) as client:
        before = await sidecar_view(client.delta_ads(SIDECAR))
        assert before == (["spiffe://cluster.local/ns/default/sa/web"], True)
        hostile = hostile_pods()
        for obj in hostile:
            srv.apply(obj)
        await wait_until(
            lambda: pod_faults(pilot),
            TIMEOUT,
            "every hostile pod counted as invalid",
            until=lambda n: n >= len(hostile) - 1,  # the huge-labels pod is a fine pod
        )
        assert await sidecar_view(client.delta_ads(SIDECAR)) == before
        assert await ready_status(pilot.http_port) == 200
        index = pilot.discovery.index
        huge = PodKey("Kubernetes", "default", "huge")
        assert index.pod(huge) is not None, "huge labels: kept, small"
        assert index.pod_count == 2
    lines = [r.getMessage() for r in caplog.records if "Pod" in r.getMessage()]
    assert lines, "the skipped pods are logged"
    for line in lines:
        assert line.isprintable() and len(line) < 2000, "one bounded line per skipped pod"


async def test_pod_churn_leaves_nothing_behind(tmp_path: Path) -> None:
    async with kube_pilot(tmp_path) as (srv, pilot):
        index = pilot.discovery.index
        for i in range(300):
            srv.apply(pod(f"churn-{i}", f"127.0.7.{1 + i % 250}", service_account=f"sa-{i}"))
        for i in range(300):
            srv.delete("Pod", "default", f"churn-{i}")
        srv.apply(pod("last", "127.0.8.1"))
        await wait_until(
            lambda: index.pod(PodKey("Kubernetes", "default", "last")),
            TIMEOUT,
            "the pod after the churn (the same watch: the churn is applied before it)",
        )
        assert index.pod_count == 2, "the web pod and the last one; the churn left nothing"
        assert index.service_accounts(ServiceKey("default", "web")) == {("default", "web")}


async def test_another_clusters_pod_cannot_claim_a_local_pods_address(tmp_path: Path) -> None:
    # The same IP, in a cluster whose id sorts first, by a name that sorts first: were
    # pods taken by address alone, this one would be the endpoint's.
    impostor = pod("a-evil", WEB_IP, service_account="evil")
    async with (
        running_pilot(tmp_path, honest(), clusters={"Attacker": [impostor]}) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        sans, marked = await sidecar_view(client.delta_ads(SIDECAR))
        assert sans == ["spiffe://cluster.local/ns/default/sa/web"] and marked


async def test_a_pod_that_finishes_leaves_its_endpoint_plaintext(tmp_path: Path) -> None:
    """Pods are asked for without the done ones (a field selector); one that finishes
    leaves the watch's view, and its endpoint is no sidecar's any more."""
    async with kube_pilot(tmp_path) as (srv, pilot), XdsClient(pilot.grpc_target) as client:
        assert (await sidecar_view(client.delta_ads(SIDECAR)))[1]
        queries = [r.query.get("fieldSelector", "") for r in srv.requests_for("Pod")]
        assert queries and all("status.phase!=Succeeded" in q for q in queries), queries
        srv.apply(pod("web-1", WEB_IP, service_account="web", sidecar=True, phase="Succeeded"))
        await wait_until(
            lambda: sidecar_view(client.delta_ads(SIDECAR)),
            TIMEOUT,
            "web's endpoint without its finished pod",
            until=lambda view: not view[1],
        )
        assert pilot.discovery.index.pod_count == 0
