"""The root where workloads find it, on the real API server: `istio-ca-root-cert`.

`pilot discovery --kubeconfig` as pilot's ServiceAccount (deploy/'s RBAC: Namespaces
listed and watched, that ConfigMap listed and watched by name, created and updated),
with a plugged-in CA written here so that the test knows the root. What a user sees
with kubectl: the ConfigMap appears in every namespace but Kubernetes' own, holding
exactly pilot's root under `root-cert.pem` and Istio's label; it appears in a namespace
created after pilot started; deleted, it comes back; with its data edited, it gets its
data back and keeps what else the editor added; a new root (a restart with another CA)
replaces the old one; with `--namespaces`, only those namespaces get it. The API
server's history of each ConfigMap (a watch, `RootWrites`) shows one write per change
and none of what was right.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from tests.cluster.client import Kube, admin
from tests.cluster.control_plane import ControlPlane
from tests.cluster.discovery import forget_shared_root, start_discovery
from tests.cluster.root_configmaps import (
    CONFIGMAP,
    KEY,
    RootWrites,
    published,
    wait_published,
)
from tests.support.ca import PluggedIn, write_plugged_in
from tests.support.pilot_process import PilotProcess

KUBERNETES_OWN = ("kube-system", "kube-public", "kube-node-lease")


@contextmanager
def namespaces(plane: ControlPlane, count: int) -> Iterator[list[str]]:
    """`count` new namespaces, deleted after the block."""
    names = [f"t-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    try:
        for name in names:
            plane.kubectl("create", "namespace", name)
        yield names
    finally:
        plane.kubectl("delete", "namespace", *names, "--wait=false", "--ignore-not-found")


@asynccontextmanager
async def discovery(
    kube: Kube, plane: ControlPlane, folder: Path, ca: PluggedIn, *flags: str
) -> AsyncIterator[PilotProcess]:
    """pilot with the plugged-in `ca`, the Lease free for it to take at once."""
    await forget_shared_root(kube)  # no holder left over from another test
    pilot = await start_discovery(kube, plane, folder, *flags, ca=ca)
    try:
        yield pilot
    finally:
        await pilot.stop()


def _configmap(namespace: str) -> dict[str, object]:
    return {"kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "namespace": namespace}}


async def test_every_namespace_gets_exactly_pilots_root_and_keeps_it(
    deployed: ControlPlane, tmp_path: Path
) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    root = ca.root.cert_pem.encode()
    with namespaces(deployed, 2) as (shop, web):
        async with (
            admin(deployed) as kube,
            RootWrites(kube) as writes,
            discovery(kube, deployed, tmp_path / "pilot", ca),
        ):
            await wait_published(kube, ["default", shop, web], root)
            for system in KUBERNETES_OWN:
                assert await published(kube, system) is None, f"{system} is left alone"
            shop_map = await published(kube, shop)
            assert shop_map is not None
            assert shop_map["metadata"]["labels"] == {"istio.io/config": "true"}

            await kube.delete(_configmap(shop))
            await wait_published(kube, [shop], root)

            edited = await published(kube, web)
            assert edited is not None
            edited["data"] = {KEY: "not a root", "extra": "x"}
            edited["metadata"]["annotations"] = {"someone": "was here"}
            await kube.replace(edited)
            await wait_published(kube, [web], root)
            kept = await published(kube, web)
            assert kept is not None and kept["metadata"]["annotations"] == {"someone": "was here"}

            with namespaces(deployed, 1) as (late,):
                await wait_published(kube, [late], root)
                assert await writes.seen(late, 1) == ["ADDED"]

            # One write per change, the test's or pilot's; none where all was right.
            assert await writes.seen(shop, 3) == ["ADDED", "DELETED", "ADDED"]
            assert await writes.seen(web, 3) == ["ADDED", "MODIFIED", "MODIFIED"]


async def test_with_namespaces_only_those(deployed: ControlPlane, tmp_path: Path) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    root = ca.root.cert_pem.encode()
    with namespaces(deployed, 3) as (shop, web, other):
        async with (
            admin(deployed) as kube,
            RootWrites(kube) as writes,
            discovery(kube, deployed, tmp_path / "pilot", ca, "--namespaces", f"{shop},{web}"),
        ):
            await wait_published(kube, [shop, web], root)
            await kube.delete(_configmap(web))
            with namespaces(deployed, 1) as (late,):
                await wait_published(kube, [web], root)
                for outside in (other, late):
                    assert await published(kube, outside) is None, f"{outside} is not watched"
                    assert writes.of(outside) == []


async def test_a_new_root_replaces_the_old_one(deployed: ControlPlane, tmp_path: Path) -> None:
    first, second = write_plugged_in(tmp_path / "ca-1"), write_plugged_in(tmp_path / "ca-2")
    with namespaces(deployed, 1) as (shop,):
        async with admin(deployed) as kube, RootWrites(kube) as writes:
            async with discovery(kube, deployed, tmp_path / "first", first):
                await wait_published(kube, [shop], first.root.cert_pem.encode())
            async with discovery(kube, deployed, tmp_path / "second", second):
                await wait_published(kube, [shop], second.root.cert_pem.encode())
            assert await writes.seen(shop, 2) == ["ADDED", "MODIFIED"]
