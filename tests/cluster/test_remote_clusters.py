"""Remote clusters as two real API servers joined by `istio/multiCluster` Secrets.

The session's control plane is the primary: pilot runs on it as deploy/'s ServiceAccount
(`pilot_kubeconfig`), with POD_NAMESPACE pilot-system. A second control plane of this
module's own is the remote, set up as `istioctl create-remote-secret` sets one up
(tests.cluster.remote_cluster): a reader ServiceAccount with only what pilot asks a
remote for, and its token from the remote's token controller. A Secret in pilot-system
holding a kubeconfig for it joins it to pilot. Each cluster's own EndpointSlice
controller publishes the Pods the test kubelet runs; a real Envoy reads what pilot serves.

* A Service in both clusters is one Envoy cluster with the endpoints of both, each
  naming its cluster (`istio` / `cluster_id`) and placed at its Node's region and zone;
  with a DestinationRule asking for locality failover (outlier detection, Istio's
  rule), a proxy in the primary's zone gets the remote's endpoints one priority down. A change
  in the remote reaches Envoy; deleting the Secret takes the remote's endpoints away and
  leaves the local ones.
* Without topology labels an endpoint's region is its cluster id (Istio's fallback).
* A Secret added while pilot runs adds the cluster; the same kubeconfig under another
  key renames it.
* A kubeconfig whose token the remote refuses (401: a token another cluster signed;
  403: an account without RBAC) is one warning naming the cluster however often pilot
  retries, the local cluster is served as before, and once the remote grants the
  account its rights the cluster's endpoints arrive without the Secret changing. No
  log line holds a token.
* Keys that are no remote cluster (the local id, a value that is no kubeconfig) are one
  warning each and ignored; the good key beside them is watched.
* `--config FILE --remote-kubeconfig ID=PATH`: a registry file plus a real remote.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pilot.security.certs import write_private
from tests.cluster.client import Kube, admin
from tests.cluster.control_plane import ControlPlane, running_control_plane
from tests.cluster.in_cluster import PILOT_NAMESPACE, pilot_kubeconfig
from tests.cluster.kubelet import run_pod
from tests.cluster.remote_cluster import (
    READER,
    pod,
    remote_kubeconfig,
    remote_secret,
    set_up_reader,
    workload,
)
from tests.support import mesh
from tests.support.ca import write_plugged_in
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.support.many_clusters import cluster_metrics
from tests.support.mesh import cluster_name, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca, start_pilot

pytestmark = pytest.mark.envoy

LOCAL = "Kubernetes"  # pilot's default --cluster-id, as Istio's
WITHIN = 20.0  # generous: the machine is shared
# A refused informer's next retry may be as far as the backoff's cap (30 s) away.
RETRY_WITHIN = 45.0
EU = ("eu-west1", "eu-west1-a")  # the primary's zoned Node
US = ("us-east1", "us-east1-b")  # the remote's zoned Node
SECRET = "istio-remote-secret"


class Host(NamedTuple):
    """One endpoint as Envoy holds it: the cluster id in its metadata, its locality and
    its priority for this Envoy."""

    cluster: str
    region: str
    zone: str
    priority: int = 0


Hosts = dict[str, Host]  # address -> Host


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def remote_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A second control plane: its own etcd, API server, controllers, ports and PKI."""
    with running_control_plane(tmp_path_factory.mktemp("remote")) as plane:
        yield plane


@pytest.fixture(scope="module")
def west_kubeconfig(remote_plane: ControlPlane) -> str:
    """A kubeconfig for the remote as its reader, as a remote secret holds it."""
    return set_up_reader(remote_plane)


@pytest.fixture
def shared_namespace(namespace: str, remote_plane: ControlPlane) -> Iterator[str]:
    """The test's namespace, in the remote too (deleted after the test)."""
    yield namespace
    remote_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# ------------------------------------------------------------------ helpers


async def start_on_primary(plane: ControlPlane, folder: Path) -> PilotProcess:
    """`pilot discovery --kubeconfig` on the primary as deploy/'s ServiceAccount."""
    async with admin(plane) as kube:
        kubeconfig = await pilot_kubeconfig(kube, plane, folder / "pilot.kubeconfig")
    ca = write_plugged_in(folder / "plugged-in-ca")
    return await start_pilot(
        folder, kubeconfig, ca.directory, ca.root.cert_pem.encode(),
        env={"POD_NAMESPACE": PILOT_NAMESPACE},
    )  # fmt: skip


@asynccontextmanager
async def envoy_on(
    pilot: PilotProcess, folder: Path, locality: Mapping[str, str] | None = None
) -> AsyncIterator[EnvoyProcess]:
    """An Envoy on `pilot` (declaring `locality`, if given); pilot stopped on the way out."""
    try:
        bootstrap = load_example_bootstrap("envoy-ads-delta.yaml", pilot.grpc_port, "node-1")
        if locality is not None:
            bootstrap["node"]["locality"] = dict(locality)
        workdir = folder / "envoy"
        workdir.mkdir()
        async with EnvoyProcess(bootstrap, workdir, "node-1", log_level="warning") as envoy:
            yield envoy
    finally:
        await pilot.stop()


@asynccontextmanager
async def pilot_and_envoy(
    plane: ControlPlane, folder: Path, locality: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[PilotProcess, EnvoyProcess]]:
    """pilot on the primary (`start_on_primary`) and an Envoy on it."""
    pilot = await start_on_primary(plane, folder)
    async with envoy_on(pilot, folder, locality) as envoy:
        yield pilot, envoy


@asynccontextmanager
async def failing_over(plane: ControlPlane, namespace: str) -> AsyncIterator[None]:
    """A DestinationRule for alpha with outlier detection (which turns Istio's locality
    failover on), on the primary (the config cluster), deleted on the way out."""
    rule = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "alpha", "namespace": namespace},
        "spec": {
            "host": "alpha",
            "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 5}},
        },
    }
    async with admin(plane) as kube:
        await kube.create(rule)
        try:
            yield
        finally:
            await kube.delete(rule)


@asynccontextmanager
async def joined(plane: ControlPlane, kubeconfigs: Mapping[str, str]) -> AsyncIterator[Kube]:
    """The remote Secret holding `kubeconfigs` (cluster id -> kubeconfig) in pilot's
    namespace on the primary, deleted on the way out; an admin session there."""
    secret = remote_secret(SECRET, kubeconfigs)
    async with admin(plane) as kube:
        await kube.apply(secret)
        try:
            yield kube
        finally:
            await kube.delete(secret)


async def hosts_of(envoy: EnvoyProcess, cluster: str) -> Hosts:
    """Envoy's endpoints of `cluster` (an Envoy cluster name) by address."""
    assignment = (await envoy.dynamic_endpoint_configs()).get(cluster, {})
    hosts: Hosts = {}
    for group in assignment.get("endpoints", []):
        locality = group.get("locality", {})
        for lb_endpoint in group.get("lb_endpoints", []):
            address = lb_endpoint["endpoint"]["address"]["socket_address"]["address"]
            metadata = lb_endpoint.get("metadata", {}).get("filter_metadata", {})
            hosts[address] = Host(
                metadata.get("istio", {}).get("cluster_id", ""),
                locality.get("region", ""),
                locality.get("zone", ""),
                group.get("priority", 0),
            )
    return hosts


async def wait_hosts(envoy: EnvoyProcess, cluster: str, expected: Hosts, what: str) -> None:
    await envoy.wait_for(
        lambda: hosts_of(envoy, cluster), WITHIN, what, until=lambda hosts: hosts == expected
    )


async def ready_lines(pilot: PilotProcess) -> tuple[int, list[str]]:
    status, body = await pilot.get("/ready")
    return status, str(body).splitlines()


def alpha(namespace: str) -> str:
    return cluster_name("alpha", 80, namespace)


# ------------------------------------------------------------------ tests


async def alpha_in_both(deployed: ControlPlane, remote_plane: ControlPlane, ns: str) -> None:
    """Service alpha with one Pod in each cluster: 10.36.1.1 here, 10.36.2.1 in west."""
    async with admin(deployed) as local, admin(remote_plane) as remote:
        await workload(local, ns, "alpha", {"alpha-0": "10.36.1.1"}, "rk-plain")
        await workload(remote, ns, "alpha", {"alpha-0": "10.36.2.1"}, "rk-plain")


async def test_a_service_in_both_clusters_has_both_clusters_endpoints(
    deployed: ControlPlane,
    remote_plane: ControlPlane,
    west_kubeconfig: str,
    shared_namespace: str,
    tmp_path: Path,
) -> None:
    ns = shared_namespace
    async with admin(deployed) as local, admin(remote_plane) as remote:
        await workload(local, ns, "alpha", {"alpha-0": "10.36.1.1"}, "rk-eu", topology=EU)
        await workload(remote, ns, "alpha", {"alpha-0": "10.36.2.1"}, "rk-us", topology=US)
        async with (
            failing_over(deployed, ns),
            joined(deployed, {"west": west_kubeconfig}) as primary,
            pilot_and_envoy(deployed, tmp_path, {"region": EU[0], "zone": EU[1]}) as (
                pilot, envoy,
            ),
        ):  # fmt: skip
            both = {"10.36.1.1": Host(LOCAL, *EU, 0), "10.36.2.1": Host("west", *US, 1)}
            await wait_hosts(envoy, alpha(ns), both, "alpha's endpoints from both clusters")

            # A Pod more in the remote: its EndpointSlice controller publishes it.
            await run_pod(remote, pod("alpha-1", ns, "alpha"), "10.36.2.2", "rk-us")
            more = both | {"10.36.2.2": Host("west", *US, 1)}
            await wait_hosts(envoy, alpha(ns), more, "the remote's new endpoint")
            assert await ready_lines(pilot) == (
                200, ["ready", f"cluster {LOCAL}: synced", "cluster west: synced"]
            )  # fmt: skip
            assert await cluster_metrics(pilot) == {LOCAL: 1.0, "west": 1.0, "remote": 1.0}

            await primary.delete(remote_secret(SECRET, {}))
            local_only = {"10.36.1.1": Host(LOCAL, *EU, 0)}
            await wait_hosts(envoy, alpha(ns), local_only, "the remote's endpoints gone")
            assert await ready_lines(pilot) == (200, ["ready", f"cluster {LOCAL}: synced"])
            assert await cluster_metrics(pilot) == {LOCAL: 1.0, "remote": 0.0}


async def test_without_topology_labels_an_endpoints_region_is_its_cluster_id(
    deployed: ControlPlane,
    remote_plane: ControlPlane,
    west_kubeconfig: str,
    shared_namespace: str,
    tmp_path: Path,
) -> None:
    """Nodes without topology labels: each endpoint's region is its cluster's id, so an
    Envoy declaring the local cluster's id as its region fails over to the remote (where
    a DestinationRule asks for failover)."""
    ns = shared_namespace
    await alpha_in_both(deployed, remote_plane, ns)
    async with (
        failing_over(deployed, ns),
        joined(deployed, {"west": west_kubeconfig}),
        pilot_and_envoy(deployed, tmp_path, {"region": LOCAL}) as (_pilot, envoy),
    ):
        expected = {
            "10.36.1.1": Host(LOCAL, LOCAL, "", 0),
            "10.36.2.1": Host("west", "west", "", 1),
        }
        await wait_hosts(envoy, alpha(ns), expected, "local first, the remote to fail over to")


async def test_a_secret_added_later_joins_and_a_new_key_renames_the_cluster(
    deployed: ControlPlane,
    remote_plane: ControlPlane,
    west_kubeconfig: str,
    shared_namespace: str,
    tmp_path: Path,
) -> None:
    ns = shared_namespace
    await alpha_in_both(deployed, remote_plane, ns)
    async with pilot_and_envoy(deployed, tmp_path) as (pilot, envoy):
        local_only = {"10.36.1.1": Host(LOCAL, LOCAL, "")}
        await wait_hosts(envoy, alpha(ns), local_only, "the local cluster alone")

        async with joined(deployed, {"west": west_kubeconfig}) as primary:
            joined_west = local_only | {"10.36.2.1": Host("west", "west", "")}
            await wait_hosts(envoy, alpha(ns), joined_west, "west, added by the Secret")

            # The same remote under another id: its endpoints carry the new id.
            await primary.apply(remote_secret(SECRET, {"east": west_kubeconfig}))
            renamed = local_only | {"10.36.2.1": Host("east", "east", "")}
            await wait_hosts(envoy, alpha(ns), renamed, "the remote renamed east")
            assert await ready_lines(pilot) == (
                200, ["ready", f"cluster {LOCAL}: synced", "cluster east: synced"]
            )  # fmt: skip
        await wait_hosts(envoy, alpha(ns), local_only, "the Secret deleted")


def _refusal_lines(pilot: PilotProcess, cluster: str, level: str = "") -> list[str]:
    """pilot's lines about `cluster`'s API server refusing it (at `level`, if given)."""
    return [
        e["msg"]
        for e in pilot.log
        if f"cluster {cluster}" in e["msg"]
        and re.search(r"HTTP 40[13]", e["msg"])
        and (not level or e["level"] == level)
    ]


def _refused_tokens(primary: ControlPlane, remote: ControlPlane, namespace: str) -> dict[str, str]:
    """Cluster id -> a token the remote refuses: `stranger`'s the primary signed (401, as
    if the Secret were made from the wrong context), `powerless`'s is of the remote's own
    account `nobody`, that no role binds (403)."""
    stranger = primary.kubectl("create", "token", "default", "-n", namespace).strip()
    remote.kubectl("create", "serviceaccount", "nobody", "-n", PILOT_NAMESPACE)
    nobody = remote.kubectl("create", "token", "nobody", "-n", PILOT_NAMESPACE).strip()
    return {"stranger": stranger, "powerless": nobody}


def _assert_one_warning_each(pilot: PilotProcess) -> None:
    """One warning per refused cluster, with the server's answer (a 403's names the user)."""
    for cluster, code in (("stranger", "HTTP 401"), ("powerless", "HTTP 403")):
        warned = _refusal_lines(pilot, cluster, "warning")
        assert len(warned) == 1, (cluster, warned)
        assert code in warned[0], warned[0]
    assert "system:serviceaccount:pilot-system:nobody" in warned[0], warned[0]


async def _grant_reader(remote: Kube, account: str) -> dict[str, Any]:
    """Bind the reader's ClusterRole to `account` in pilot-system; the binding."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{READER}-{account}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": PILOT_NAMESPACE}],
    }
    await remote.apply(binding)
    return binding


async def test_a_token_the_remote_refuses_is_one_warning_and_the_local_cluster_is_served(
    deployed: ControlPlane,
    remote_plane: ControlPlane,
    west_kubeconfig: str,
    shared_namespace: str,
    tmp_path: Path,
) -> None:
    ns = shared_namespace
    await alpha_in_both(deployed, remote_plane, ns)
    async with admin(deployed) as local, admin(remote_plane) as remote:
        tokens = _refused_tokens(deployed, remote_plane, ns)
        kubeconfigs = {key: remote_kubeconfig(remote_plane, t) for key, t in tokens.items()}
        binding: dict[str, Any] = {}
        try:
            async with (
                joined(deployed, kubeconfigs),
                pilot_and_envoy(deployed, tmp_path) as (pilot, envoy),
            ):
                local_only = {"10.36.1.1": Host(LOCAL, LOCAL, "")}
                await wait_hosts(envoy, alpha(ns), local_only, "the local cluster")
                # Every informer of each refused cluster has been refused twice at least.
                await wait_until(
                    lambda: {c: len(_refusal_lines(pilot, c)) for c in kubeconfigs},
                    WITHIN, "pilot to retry the refused clusters",
                    until=lambda seen: min(seen.values()) >= 8, context=pilot.tail,
                )  # fmt: skip
                _assert_one_warning_each(pilot)
                status, lines = await ready_lines(pilot)
                assert (status, lines[:2]) == (200, ["ready", f"cluster {LOCAL}: synced"])
                assert [line.split(":")[0] for line in lines[2:]] == [
                    "cluster powerless", "cluster stranger"
                ]  # fmt: skip

                # The local cluster's changes are served as before.
                await run_pod(local, pod("alpha-1", ns, "alpha"), "10.36.1.2", "rk-plain")
                more = local_only | {"10.36.1.2": Host(LOCAL, LOCAL, "")}
                await wait_hosts(envoy, alpha(ns), more, "the local change")

                # The remote grants the account its rights: pilot's retries get through.
                binding = await _grant_reader(remote, "nobody")
                granted = more | {"10.36.2.1": Host("powerless", "powerless", "")}
                await envoy.wait_for(
                    lambda: hosts_of(envoy, alpha(ns)), RETRY_WITHIN, "the cluster once granted",
                    until=lambda hosts: hosts == granted,
                )  # fmt: skip
            # Stopped: its whole log. No refusal line carries a token it was refused with.
            leaks = [e for e in pilot.log for t in tokens.values() if t in e["msg"] + e["error"]]
            assert leaks == []
        finally:
            if binding:
                await remote.delete(binding)


async def test_keys_that_are_no_remote_cluster_are_warned_about_and_ignored(
    deployed: ControlPlane,
    remote_plane: ControlPlane,
    west_kubeconfig: str,
    shared_namespace: str,
    tmp_path: Path,
) -> None:
    ns = shared_namespace
    await alpha_in_both(deployed, remote_plane, ns)
    async with pilot_and_envoy(deployed, tmp_path) as (pilot, envoy):
        kubeconfigs = {
            LOCAL: west_kubeconfig,  # the local cluster's id
            "broken": "clusters: 5\n",  # not a kubeconfig
            "west": west_kubeconfig,
        }
        async with joined(deployed, kubeconfigs):
            both = {"10.36.1.1": Host(LOCAL, LOCAL, ""), "10.36.2.1": Host("west", "west", "")}
            await wait_hosts(envoy, alpha(ns), both, "west, the one good key")
            for key in (LOCAL, "broken"):
                origin = f"Secret {PILOT_NAMESPACE}/{SECRET} key {key}"
                warned = pilot.logged(
                    lambda e, o=origin: e["level"] == "warning" and e["msg"].startswith(o)
                )
                assert len(warned) == 1, (key, pilot.tail())
            status, lines = await ready_lines(pilot)
            assert (status, [line.split(":")[0] for line in lines]) == (
                200, ["ready", f"cluster {LOCAL}", "cluster west"]
            )  # fmt: skip


async def test_a_registry_file_with_a_remote_cluster(
    remote_plane: ControlPlane, west_kubeconfig: str, shared_namespace: str, tmp_path: Path
) -> None:
    """`--config FILE --remote-kubeconfig west=PATH`: the file is the local cluster, the
    remote's Service merges with the file's, and a reload of the file leaves it alone."""
    ns = shared_namespace
    async with admin(remote_plane) as remote:
        await workload(remote, ns, "alpha", {"alpha-0": "10.36.2.1"}, "rk-plain")
    config = tmp_path / "mesh.yaml"
    write_mesh(config, file_alpha(ns, "10.36.9.1"))
    kubeconfig = tmp_path / "west.kubeconfig"
    write_private(kubeconfig, west_kubeconfig.encode())
    pilot = await start_file_pilot_with_ca(
        tmp_path, config, "--remote-kubeconfig", f"west={kubeconfig}"
    )
    async with envoy_on(pilot, tmp_path) as envoy:
        west = {"10.36.2.1": Host("west", "west", "")}
        expected = west | {"10.36.9.1": Host(LOCAL, LOCAL, "")}
        await wait_hosts(envoy, alpha(ns), expected, "the file's endpoint and the remote's")
        write_mesh(config, file_alpha(ns, "10.36.9.2"))
        expected = west | {"10.36.9.2": Host(LOCAL, LOCAL, "")}
        await wait_hosts(envoy, alpha(ns), expected, "the file reloaded, the remote's kept")
        assert await ready_lines(pilot) == (
            200, ["ready", f"cluster {LOCAL}: synced", "cluster west: synced"]
        )  # fmt: skip


def file_alpha(namespace: str, ip: str) -> list[dict[str, Any]]:
    """Service alpha in `namespace` with one ready endpoint at `ip`, for a registry file."""
    return [
        mesh.service("alpha", namespace),
        mesh.endpoint_slice("alpha", [mesh.Ep(ip)], namespace),
    ]
