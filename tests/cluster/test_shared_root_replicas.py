"""Two pilot replicas on one real cluster: one Lease holder, one CA Secret, one root.

Both run `pilot discovery --kubeconfig` as pilot's ServiceAccount with
POD_NAMESPACE=pilot-system and no plugged-in CA, started together on a cluster with
neither the Lease `pilot-ca` nor the Secret `pilot-ca-secret` (as at a first install):

* exactly one replica holds the Lease (its holderIdentity is that replica's), and it
  alone creates the Secret; the other waits for it and uses it;
* each replica's CA signs a workload's CSR (with a token TokenRequest bound to the
  workload's Pod) under the root in the Secret, over a TLS port whose certificate
  chains to that root too;
* the holder alone keeps the root ConfigMap: the namespace's `istio-ca-root-cert` is
  written once (the API server's own history of it says so);
* the holder stops (SIGTERM) and releases the Lease; the other replica takes it, still
  signs under the same root from the same Secret (not created again), and now keeps
  the root ConfigMap: deleted, it is written back, once;
* the last replica stops: the Lease is released (no holder).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.client import Kube, admin
from tests.cluster.control_plane import ControlPlane
from tests.cluster.discovery import (
    LEASE,
    forget_shared_root,
    lease_holder,
    shared_root,
    shared_secret,
    start_discovery,
)
from tests.cluster.in_cluster import PILOT_NAMESPACE
from tests.cluster.root_configmaps import CONFIGMAP, RootWrites, wait_published
from tests.cluster.workload_tokens import Workload, run_workload
from tests.support.ca import assert_issued_chain, load_chain
from tests.support.mint_client import mint
from tests.support.pilot_process import PilotProcess

HOLDS = f" now holds lease {PILOT_NAMESPACE}/{LEASE}"
CREATED = "CA: created the shared root in Secret"
USING = "CA: using the shared root in Secret"
TAKEOVER = 20.0  # the survivor asks for the Lease every 5 s
SAME_OBJECT = ("uid", "resourceVersion")


@dataclass
class Replica:
    """One `pilot discovery` process and its POD_NAME (its Lease identity's prefix)."""

    name: str
    pilot: PilotProcess

    def said(self, text: str, since: int = 0) -> list[str]:
        return [e["msg"] for e in self.pilot.logged(lambda e: text in e["msg"], since)]

    def lease_identity(self, since: int = 0) -> str:
        """The identity it said it took the Lease under (after `since`), or ''."""
        lines = self.said(HOLDS, since)
        return lines[-1].removesuffix(HOLDS) if lines else ""


@dataclass
class Scene:
    kube: Kube
    workload: Workload
    writes: RootWrites
    folder: Path

    async def signs_under_the_secret(self, replica: Replica) -> None:
        """The replica's CA signs the workload's CSR, its chain leading to the root in the
        Secret (the TLS handshake trusts only that root, so its port's certificate too)."""
        root = load_chain(replica.pilot.root_pem)
        assert root == load_chain(await shared_root(self.kube)), "the Secret's root"
        out = self.folder / f"signed-{len(list(self.folder.glob('signed-*')))}"
        out.mkdir()
        token = await self.workload.token(self.kube)
        uri = await mint(replica.pilot.target(tls=True), replica.pilot.root_pem, token, out)
        assert uri == self.workload.spiffe
        assert_issued_chain(load_chain((out / "cert.pem").read_bytes()), root[-1])

    async def secret(self) -> dict[str, object]:
        secret = await shared_secret(self.kube)
        assert secret is not None, "Secret pilot-ca-secret is gone"
        return secret


@asynccontextmanager
async def replicas(
    kube: Kube, plane: ControlPlane, folder: Path
) -> AsyncIterator[tuple[Replica, Replica]]:
    """Two replicas started together; whichever still runs is stopped on exit."""
    names = ("pilot-a", "pilot-b")
    started = await asyncio.gather(
        *(start_discovery(kube, plane, folder / name, pod_name=name) for name in names),
        return_exceptions=True,
    )
    running = [p for p in started if isinstance(p, PilotProcess)]
    try:
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        a, b = (Replica(name, p) for name, p in zip(names, running, strict=True))
        yield a, b
    finally:
        for pilot in running:
            if pilot.alive:
                await pilot.stop()


async def test_one_holder_one_secret_one_root_and_the_other_takes_over(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with admin(deployed) as kube:
        await forget_shared_root(kube)
        try:
            workload = await run_workload(kube, namespace, "web", "10.244.37.10")
            async with RootWrites(kube) as writes, replicas(kube, deployed, tmp_path) as pair:
                scene = Scene(kube, workload, writes, tmp_path)
                holder, other = await _one_holder_one_secret(scene, pair, namespace)
                await _the_other_takes_over(scene, holder, other, namespace)
                await other.pilot.stop()
                assert await lease_holder(kube) == "", "the last replica released the Lease"
        finally:
            await forget_shared_root(kube)


async def _one_holder_one_secret(
    scene: Scene, pair: tuple[Replica, Replica], namespace: str
) -> tuple[Replica, Replica]:
    """Checks the pair as started; (the holder, the other)."""
    holders = [r for r in pair if r.lease_identity()]
    assert len(holders) == 1, f"{[r.name for r in holders]} say they hold the Lease"
    (holder,) = holders
    (other,) = [r for r in pair if r is not holder]
    assert holder.lease_identity().startswith(f"{holder.name}-")
    assert await lease_holder(scene.kube) == holder.lease_identity()
    assert [r.name for r in pair if r.said(CREATED)] == [holder.name], "created by the holder"
    assert other.said(USING), "the other replica uses the Secret the holder created"

    for replica in pair:
        await scene.signs_under_the_secret(replica)
    await wait_published(scene.kube, [namespace], holder.pilot.root_pem)
    assert await scene.writes.seen(namespace, 1) == ["ADDED"], "the root ConfigMap written once"
    return holder, other


async def _the_other_takes_over(
    scene: Scene, holder: Replica, other: Replica, namespace: str
) -> None:
    before = (await scene.secret())["metadata"]
    mark = other.pilot.mark()
    await holder.pilot.stop()
    await other.pilot.wait_logged(
        lambda e: HOLDS in e["msg"], "that it took the Lease over", mark, TAKEOVER
    )
    assert other.lease_identity(mark).startswith(f"{other.name}-")
    assert await lease_holder(scene.kube) == other.lease_identity(mark)

    await scene.signs_under_the_secret(other)
    after = (await scene.secret())["metadata"]
    assert isinstance(before, dict) and isinstance(after, dict)
    assert {k: after[k] for k in SAME_OBJECT} == {k: before[k] for k in SAME_OBJECT}, (
        "the Secret is the object the first holder created, unchanged"
    )

    await scene.kube.delete(
        {"kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "namespace": namespace}}
    )
    await wait_published(scene.kube, [namespace], other.pilot.root_pem)
    assert await scene.writes.seen(namespace, 3) == ["ADDED", "DELETED", "ADDED"]
