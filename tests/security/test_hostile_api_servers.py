"""API servers are hostile input too: a real `pilot discovery` subprocess on the test API
server (tests/kubeapi), which streams what a hostile one would on pilot's open watches.

* A watch line that never ends (64 MB without a newline): pilot's memory stays bounded
  (`PILOT_MAX_WATCH_EVENT_BYTES`), the watch is dropped with a log line and a metric,
  the informer lists again and later Services still arrive.
* Garbage events (not JSON, a JSON list, an object that is a string, an object without
  a name, an unknown type, an EndpointSlice whose fields break the parser): each is
  skipped, counted by reason and logged, and the informers keep working: a Service
  applied afterwards is served; `/ready` says the cluster is synced.
* A task killed by an input nobody checked for (a ConfigMap `istio-ca-root-cert` whose
  labels are a list makes the root publisher raise): logged with the task's name and
  the traceback, counted, shown under `/ready`, started again; once the ConfigMap is
  sane the root is published into it.
* A remote cluster's copy of a local Service, with other ports and a port name of the
  local one with another number, changes none of the local Service's ports: the
  clusters served are the local ones only.
* A remote cluster's Pod at a local Pod's address (another service account) changes
  neither the local endpoint's sidecar nor the identities its cluster accepts.
* An API server that stops answering Lease calls: pilot still stops on SIGTERM (its
  release of the Lease gives up after a deadline and says so); a holder whose renewals
  hang stops acting as holder, and holds the Lease again once they are answered.
* An API server that drops the connection while pilot reads the CA root it shares
  with its replicas: pilot says so, asks again, and starts; it does not exit.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from pilot.kube import api_client
from pilot.kube.api_client import BoundedApiClient
from pilot.security.authn import AuthError
from pilot.security.lease import RELEASE_WITHIN, LeaseElector
from pilot.security.token_review import KubernetesTokenReviewer
from tests.kubeapi import KubeAPIServer
from tests.support.ca import write_plugged_in
from tests.support.envoy_process import wait_until
from tests.support.kube_helpers import apply_mesh, kube_api, ready
from tests.support.mesh import cluster_name, endpoint_slice, pod, service
from tests.support.pilot_process import (
    Entry,
    PilotProcess,
    discovery_command,
    pilot_environment,
    start_command,
    start_pilot,
)
from tests.support.pod_views import sidecar_view
from tests.support.xds_client import clusters, node

LOCAL = "Kubernetes"  # pilot's default --cluster-id
STREAMED = 64 * 1024 * 1024
WITHIN = 20.0


@asynccontextmanager
async def pilot_on(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[KubeAPIServer, PilotProcess]]:
    """A test API server serving Service alpha, and `pilot discovery` on it."""
    async with AsyncExitStack() as stack:
        srv, kubeconfig = await stack.enter_async_context(kube_api(tmp_path / "local"))
        apply_mesh(srv, {"alpha": ready("127.0.1.1")})
        ca = write_plugged_in(tmp_path / "plugged-in-ca")
        pilot = await start_pilot(
            tmp_path, kubeconfig, ca.directory, ca.root.cert_pem.encode(), *extra, env=env
        )
        stack.push_async_callback(pilot.stop)
        await srv.wait_for_watches(1, timeout=WITHIN, kind="Service")
        await srv.wait_for_watches(1, timeout=WITHIN, kind="EndpointSlice")
        yield srv, pilot


async def served_clusters(pilot: PilotProcess) -> set[str]:
    """The clusters pilot's plaintext port answers FetchClusters with (what Envoys get)."""
    async with pilot.client(tls=False, token=None) as client:
        return set(clusters(await client.fetch_clusters()))


async def wait_served(pilot: PilotProcess, name: str, what: str) -> None:
    await wait_until(
        lambda: served_clusters(pilot), WITHIN, what, until=lambda found: name in found
    )


def memory(pid: int) -> tuple[int, int]:
    """The process's resident memory now and at its peak so far (VmRSS, VmHWM), bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = [re.search(rf"^{field}:\s+(\d+) kB$", status, re.M) for field in ("VmRSS", "VmHWM")]
    assert found[0] is not None and found[1] is not None
    return int(found[0][1]) * 1024, int(found[1][1]) * 1024


async def metric_values(pilot: PilotProcess, name: str) -> dict[str, float]:
    """Each sample of metric `name` by its labels' text."""
    _status, body = await pilot.get("/metrics")
    pattern = rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$"
    return {m[1]: float(m[2]) for m in re.finditer(pattern, str(body), re.M)}


async def ready_lines(pilot: PilotProcess) -> tuple[int, list[str]]:
    status, body = await pilot.get("/ready")
    return status, str(body).splitlines()


def warned(text: str) -> Callable[[Entry], bool]:
    return lambda e: e["level"].upper() == "WARNING" and text in e["msg"]


# On uvloop, a line grown in one buffer once peaked at twice its bound.
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_a_watch_line_that_never_ends_is_dropped_and_memory_stays_bounded(
    tmp_path: Path, loop: str
) -> None:
    async with pilot_on(tmp_path, env={"PILOT_EVENT_LOOP": loop}) as (srv, pilot):
        lists_before = len(srv.requests_for("Service", watch=False))
        rss_before, peak_before = memory(pilot.pid)
        since = pilot.mark()
        assert srv.stream_raw(b"x" * (1 << 20), times=STREAMED >> 20, kind="Service") == 1
        dropped = await pilot.until_logged(
            warned("over 8388608 bytes (PILOT_MAX_WATCH_EVENT_BYTES)"), since, WITHIN
        )
        rss_after, peak_after = memory(pilot.pid)
        # The peak too: a bookmark line ending the 64 MB one would free it again.
        growth = max(rss_after - rss_before, peak_after - peak_before)
        assert growth < STREAMED / 4, f"RSS grew {growth / 2**20:.0f} MB with what was streamed"
        assert dropped, f"no line said the watch was dropped; {pilot.tail()}"
        assert srv.raw_written < STREAMED, "pilot read on after the bound"

        await srv.wait_until(
            lambda: len(srv.requests_for("Service", watch=False)) > lists_before, WITHIN
        )
        srv.apply(service("beta"))
        await wait_served(pilot, cluster_name("beta"), "the Service applied after the attack")
        rejected = await metric_values(pilot, "pilot_k8s_rejected_total")
        assert rejected[f'cluster_id="{LOCAL}",kind="Service",reason="too_large"'] >= 1
        status, lines = await ready_lines(pilot)
        assert (status, lines[1]) == (200, f"cluster {LOCAL}: synced")


GARBAGE = (  # a JSON list first: it killed the informer, silently (issue 17)
    b"[1, 2, 3]\n",
    b"this is not JSON\n",
    b'{"type": "ADDED", "object": "a string"}\n',
    b'{"type": "ADDED", "object": {"kind": "Service", "metadata": {}}}\n',
    b'{"type": "SURPRISE", "object": {"metadata": {"name": "x"}}}\n',
    b'{"type": "ADDED", "object": {"kind": "Secret", "metadata": {"name": "x"}}}\n',
)
# Parses as an event, breaks the EndpointSlice parser (an addressType that is a list).
BROKEN_SLICE = (
    b'{"type": "ADDED", "object": {"kind": "EndpointSlice", "addressType": [],'
    b' "metadata": {"name": "alpha-bad", "namespace": "default",'
    b' "labels": {"kubernetes.io/service-name": "alpha"}}}}\n'
)


async def test_garbage_events_are_skipped_counted_and_later_services_arrive(
    tmp_path: Path,
) -> None:
    async with pilot_on(tmp_path) as (srv, pilot):
        since = pilot.mark()
        assert srv.stream_raw(b"".join(GARBAGE), kind="Service") == 1
        assert srv.stream_raw(BROKEN_SLICE, kind="EndpointSlice") == 1
        srv.apply(service("beta"))
        srv.apply(endpoint_slice("beta", ready("127.0.2.1")))
        await wait_served(pilot, cluster_name("beta"), "the Service applied after the garbage")
        await pilot.wait_logged(warned("Service: the API server sent"), "the garbage", since)
        await pilot.wait_logged(warned("an invalid EndpointSlice"), "the broken slice", since)
        assert not pilot.logged(lambda e: e["level"].upper() == "ERROR", since)

        rejected = await metric_values(pilot, "pilot_k8s_rejected_total")
        service_reasons = {
            reason: rejected.get(f'cluster_id="{LOCAL}",kind="Service",reason="{reason}"', 0)
            for reason in ("not_json", "not_object", "bad_object", "no_name", "bad_type")
        }
        assert service_reasons == {
            "not_json": 1,
            "not_object": 1,
            "bad_object": 1,
            "no_name": 1,
            "bad_type": 1,
        }
        assert rejected[f'cluster_id="{LOCAL}",kind="Service",reason="wrong_kind"'] == 1
        assert rejected[f'cluster_id="{LOCAL}",kind="EndpointSlice",reason="invalid"'] == 1
        status, lines = await ready_lines(pilot)
        assert status == 200
        assert lines[1:] == [f"cluster {LOCAL}: synced"], "no task failed, no watch is down"
        synced = await metric_values(pilot, "pilot_cluster_synced")
        assert synced == {f'cluster_id="{LOCAL}"': 1.0}


def _root_configmap(labels: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "istio-ca-root-cert", "namespace": "default", "labels": labels},
        "data": {"root-cert.pem": "not pilot's root"},
    }


def _failed(task: str) -> Callable[[Entry], bool]:
    def matches(entry: Entry) -> bool:
        return entry["level"].upper() == "ERROR" and f"task {task} failed" in entry["msg"]

    return matches


async def test_a_task_killed_by_unexpected_input_is_logged_shown_and_restarted(
    tmp_path: Path,
) -> None:
    async with pilot_on(tmp_path) as (srv, pilot):
        since = pilot.mark()
        srv.apply(_root_configmap(["not", "a", "map"]))
        (first, *_) = await pilot.wait_logged(
            _failed("ca-root-publisher"), "that the root publisher failed", since, WITHIN
        )
        assert "Traceback" in first["error"]
        await wait_until(
            lambda: len(pilot.logged(_failed("ca-root-publisher"), since)),
            WITHIN,
            "the root publisher to be started again (and to fail again)",
            until=lambda failures: failures >= 2,
        )
        status, lines = await ready_lines(pilot)
        assert status == 200, "pilot keeps serving what it has"
        shown = [line for line in lines if line.startswith("task ca-root-publisher: ")]
        assert len(shown) == 1 and "TypeError" in shown[0], lines
        failures = await metric_values(pilot, "pilot_task_failures_total")
        assert failures['task="ca-root-publisher"'] >= 2

        srv.apply(_root_configmap({"team": "a"}))  # sane again: the next start publishes
        await srv.wait_until(lambda: "BEGIN CERTIFICATE" in _root_data(srv), timeout=2 * WITHIN)


def _root_data(srv: KubeAPIServer) -> str:
    configmap = srv.get("ConfigMap", "default", "istio-ca-root-cert") or {}
    return str((configmap.get("data") or {}).get("root-cert.pem", ""))


async def test_a_remote_cluster_never_changes_a_local_services_ports(tmp_path: Path) -> None:
    async with kube_api(tmp_path / "west") as (west, west_kubeconfig):
        # alpha in west: http on another number, and a port the local alpha does not have.
        west.apply(service("alpha", ports=(("http", 81), ("admin", 9999))))
        west.apply(endpoint_slice("alpha", ready("127.0.9.1")))
        west.apply(service("west-only", ports=(("http", 82),)))
        async with pilot_on(tmp_path, "--remote-kubeconfig", f"west={west_kubeconfig}") as (
            _srv,
            pilot,
        ):
            await wait_served(pilot, cluster_name("west-only", 82), "west's own Service")
            status, lines = await ready_lines(pilot)
            assert status == 200 and "cluster west: synced" in lines, lines
            served = await served_clusters(pilot)
            assert served == {cluster_name("alpha", 80), cluster_name("west-only", 82)}


async def test_a_remote_clusters_pod_cannot_claim_a_local_pods_address(tmp_path: Path) -> None:
    """A Pod of west at the address of a local Pod (another account, no sidecar) changes
    nothing of the local endpoint: it keeps its sidecar, the cluster its one identity."""
    # An id and a name that sort before the local ones: were the pod taken by address
    # alone, the remote one would be the endpoint's.
    async with kube_api(tmp_path / "west") as (west, west_kubeconfig):
        west.apply(pod("a-evil", "127.0.1.1", service_account="evil"))
        extra = ("--remote-kubeconfig", f"Attacker={west_kubeconfig}", "--xds-auth", "none")
        async with pilot_on(tmp_path, *extra, "--plaintext-secrets") as (srv, pilot):
            srv.apply(pod("alpha-1", "127.0.1.1", service_account="alpha", sidecar=True))
            alpha = cluster_name("alpha")
            mtls_node = node(metadata={"INTERCEPTION_MODE": "NONE"})
            async with pilot.client(tls=False, token=None) as client:
                await wait_until(
                    lambda: sidecar_view(client.delta_ads(mtls_node), alpha),
                    WITHIN,
                    "alpha's endpoint marked for mTLS",
                    until=lambda view: view[1],
                )
                await wait_until(
                    lambda: ready_lines(pilot),
                    WITHIN,
                    "the remote cluster synced, its pod listed",
                    until=lambda answer: "cluster Attacker: synced" in answer[1],
                )
                view = await sidecar_view(client.delta_ads(mtls_node), alpha)
            assert view == (["spiffe://cluster.local/ns/default/sa/alpha"], True)


async def test_a_connection_dropped_while_pilot_reads_its_root_is_asked_again(
    tmp_path: Path,
) -> None:
    # aiohttp's ServerDisconnectedError is no OSError: it once escaped the root's retry
    # loop, and pilot exited at start because its API server restarted.
    async with kube_api(tmp_path / "local") as (srv, kubeconfig):
        apply_mesh(srv, {"alpha": ready("127.0.1.1")})
        srv.drop("/secrets/pilot-ca-secret", times=2)
        command = discovery_command(tmp_path, ["--kubeconfig", str(kubeconfig)], None)
        pilot = await start_command(tmp_path, command, env=pilot_environment(tmp_path))
        try:
            dropped = pilot.logged(lambda e: "cannot read the CA root" in e["msg"])
            # aiohttp itself sends a request again once, on a reused connection: one line or two.
            assert dropped and all("Server disconnected" in e["msg"] for e in dropped), dropped
            assert srv.get("Secret", "default", "pilot-ca-secret") is not None, "root made"
            await wait_served(pilot, cluster_name("alpha"), "alpha, served by a pilot that started")
        finally:
            await pilot.stop()


def lease_holder(srv: KubeAPIServer) -> str:
    """Who the Lease pilot-ca names as its holder ("" for nobody)."""
    lease = srv.get("Lease", "default", "pilot-ca") or {}
    return str(lease.get("spec", {}).get("holderIdentity") or "")


async def test_pilot_stops_on_sigterm_while_the_api_server_hangs_its_lease(
    tmp_path: Path,
) -> None:
    async with pilot_on(tmp_path) as (srv, pilot):
        await wait_until(lambda: lease_holder(srv), WITHIN, "pilot holding the Lease")
        srv.hang("/leases/")  # accepted, never answered: the release on the way out
        await pilot.stop()  # fails if pilot ignores SIGTERM (it waited for ever)
        (line,) = pilot.logged(lambda e: "could not release lease" in e["msg"])
        assert f"did not answer within {RELEASE_WITHIN:g}s" in line["msg"], line["msg"]
        assert lease_holder(srv), "never released: the Lease is left to expire"


async def test_a_lease_holder_whose_renewals_hang_stops_holding_it() -> None:
    async with KubeAPIServer() as srv:
        lease_client = BoundedApiClient(client.Configuration(host=srv.url))
        elector = LeaseElector(
            lease_client, "default", "pilot-ca", lease_duration=3.0, renew_every=0.2
        )
        changes: list[bool] = []
        elector.on_change(changes.append)
        task = asyncio.create_task(elector.run())
        try:
            await wait_until(lambda: elector.is_leader, WITHIN, "the Lease held")
            srv.hang("/leases/")
            # Within its renew deadline (2 s here), not the client's 30 s, nor never.
            await wait_until(lambda: not elector.is_leader, 10.0, "the hung holder stepping down")
            srv.hang(None)
            await wait_until(lambda: elector.is_leader, WITHIN, "the Lease held again")
            assert changes == [True, False, True]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await lease_client.close()


async def test_a_request_that_names_no_timeout_still_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    # kubernetes_asyncio waits for ever by default; pilot's client gives such a request
    # REQUEST_TIMEOUT (30 s; shortened here): a hung TokenReview is a refusal that says
    # why (the stream's UNAUTHENTICATED, retried), not a wait for ever.
    monkeypatch.setattr(api_client, "REQUEST_TIMEOUT", 0.5)
    async with KubeAPIServer() as srv:
        srv.hang("/tokenreviews")
        bounded_client = BoundedApiClient(client.Configuration(host=srv.url))
        try:
            review = asyncio.create_task(
                KubernetesTokenReviewer(bounded_client).review("token", ["istio-ca"])
            )
            done, _ = await asyncio.wait([review], timeout=WITHIN)
            assert done, "the review waited for ever"
            refusal = review.exception()
            assert isinstance(refusal, AuthError), refusal
            assert str(refusal) == "token review failed: the Kubernetes API did not answer"
        finally:
            await bounded_client.close()
