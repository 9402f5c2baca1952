"""The root where agents find it: ConfigMap `istio-ca-root-cert` in every watched namespace.

A real `pilot discovery` (a subprocess, tests/security/pilot_process) runs against the
test API server with a plugged-in CA written here, so the test knows pilot's root. What
a user would see with kubectl is checked: the ConfigMap appears in every namespace (but
Kubernetes' own) holding exactly pilot's root under `root-cert.pem` and nothing else,
comes back after it is deleted, gets its data back after an edit (keeping what else the
editor added), appears in a namespace created later, follows a new root after a
restart; with `--namespaces`, only there. Two replicas write each ConfigMap once: only
the holder of the Lease `pilot-ca` writes, and after it leaves the other takes over.
pilot asks for exactly what deploy/rbac.yaml grants it: ConfigMaps listed and watched
by name only, Namespaces as metadata only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from tests.integration.ca_support import PluggedIn, write_plugged_in
from tests.kubeapi import KubeAPIServer, RequestRecord, write_kubeconfig
from tests.security.pilot_process import PilotProcess, start_pilot

CONFIGMAP = "istio-ca-root-cert"
KEY = "root-cert.pem"
SYSTEM = ("kube-node-lease", "kube-public", "kube-system")  # the test API server has them
WAIT = 15.0
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"


def _namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _published(srv: KubeAPIServer) -> dict[str, dict[str, Any]]:
    """Every istio-ca-root-cert, by namespace."""
    return {
        cm["metadata"]["namespace"]: cm
        for cm in srv.objects("ConfigMap")
        if cm["metadata"]["name"] == CONFIGMAP
    }


def _holds(configmap: dict[str, Any] | None, root: x509.Certificate) -> bool:
    """Exactly one data key, `root-cert.pem`, holding exactly the root; nothing else."""
    if configmap is None or configmap.get("binaryData"):
        return False
    data = configmap.get("data") or {}
    if set(data) != {KEY}:
        return False
    try:
        return x509.load_pem_x509_certificates(data[KEY].encode()) == [root]
    except ValueError:
        return False


def _everywhere(srv: KubeAPIServer, namespaces: Iterable[str], root: x509.Certificate) -> bool:
    published = _published(srv)
    return all(_holds(published.get(namespace), root) for namespace in namespaces)


async def _wait_published(
    srv: KubeAPIServer, namespaces: Iterable[str], root: x509.Certificate
) -> None:
    wanted = sorted(namespaces)
    try:
        await srv.wait_until(lambda: _everywhere(srv, wanted, root), WAIT)
    except TimeoutError:
        published = {ns: cm.get("data") for ns, cm in _published(srv).items()}
        raise AssertionError(f"root not published in {wanted}; ConfigMaps: {published}") from None


def _writes(srv: KubeAPIServer) -> list[tuple[str, str]]:
    """(method, namespace) of every write to a ConfigMap."""
    return [
        (r.method, r.path.split("/")[4])
        for r in srv.requests_for("ConfigMap")
        if r.method not in ("GET", "HEAD")
    ]


@asynccontextmanager
async def _cluster(folder: Path, *namespaces: str) -> AsyncIterator[tuple[KubeAPIServer, Path]]:
    async with KubeAPIServer() as srv:
        for name in namespaces:
            srv.apply(_namespace(name))
        yield srv, write_kubeconfig(folder / "kubeconfig.yaml", srv.url)


@asynccontextmanager
async def _pilot(
    folder: Path, kubeconfig: Path, ca: PluggedIn, *flags: str
) -> AsyncIterator[PilotProcess]:
    pilot = await start_pilot(folder, kubeconfig, ca.directory, ca.root.cert_pem.encode(), *flags)
    try:
        yield pilot
    finally:
        await pilot.stop()


async def test_every_namespace_gets_exactly_pilots_root_and_keeps_it(tmp_path: Path) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    root = ca.root.cert
    async with (
        _cluster(tmp_path, "shop", "web") as (srv, kubeconfig),
        _pilot(tmp_path, kubeconfig, ca),
    ):
        await _wait_published(srv, ["default", "shop", "web"], root)
        assert not set(_published(srv)) & set(SYSTEM), "Kubernetes' own namespaces are left alone"
        assert _published(srv)["shop"]["metadata"]["labels"] == {"istio.io/config": "true"}

        srv.delete("ConfigMap", "shop", CONFIGMAP)
        await _wait_published(srv, ["shop"], root)

        edited = _published(srv)["web"]
        edited["data"] = {KEY: "not a root", "extra": "x"}
        edited["metadata"]["annotations"] = {"someone": "was here"}
        srv.update(edited)
        await _wait_published(srv, ["web"], root)
        assert _published(srv)["web"]["metadata"]["annotations"] == {"someone": "was here"}

        srv.apply(_namespace("late"))
        await _wait_published(srv, ["late"], root)

        # Idempotent: each change is one write, and nothing is written that was right.
        assert sorted(_writes(srv)) == sorted(
            [("POST", ns) for ns in ("default", "shop", "web", "shop", "late")] + [("PUT", "web")]
        )
        namespace_reads = srv.requests_for("Namespace")
        assert namespace_reads, "pilot never looked at Namespaces"
        assert all("as=PartialObjectMetadata" in r.accept for r in namespace_reads)


async def test_with_namespaces_only_those(tmp_path: Path) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    async with (
        _cluster(tmp_path, "shop", "web", "other") as (srv, kubeconfig),
        _pilot(tmp_path, kubeconfig, ca, "--namespaces", "shop,web"),
    ):
        await _wait_published(srv, ["shop", "web"], ca.root.cert)
        srv.delete("ConfigMap", "web", CONFIGMAP)
        srv.apply(_namespace("late"))
        await _wait_published(srv, ["web"], ca.root.cert)
        assert set(_published(srv)) == {"shop", "web"}
        assert srv.requests_for("Namespace") == [], "named namespaces need no Namespace watch"


async def test_a_new_root_replaces_the_old_one_everywhere(tmp_path: Path) -> None:
    first, second = write_plugged_in(tmp_path / "ca-1"), write_plugged_in(tmp_path / "ca-2")
    async with _cluster(tmp_path, "shop") as (srv, kubeconfig):
        async with _pilot(tmp_path, kubeconfig, first):
            await _wait_published(srv, ["default", "shop"], first.root.cert)
        async with _pilot(tmp_path, kubeconfig, second):
            await _wait_published(srv, ["default", "shop"], second.root.cert)
    assert sorted(_writes(srv)) == sorted(
        [("POST", "default"), ("POST", "shop"), ("PUT", "default"), ("PUT", "shop")]
    )


def _holder(pilots: list[PilotProcess]) -> Callable[[], PilotProcess | None]:
    def holder() -> PilotProcess | None:
        leaders = [p for p in pilots if p.logged(lambda e: "now holds lease" in e["msg"])]
        return leaders[0] if len(leaders) == 1 else None

    return holder


async def test_two_replicas_write_once_and_the_other_takes_over(tmp_path: Path) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    root = ca.root.cert
    async with _cluster(tmp_path, "shop", "web") as (srv, kubeconfig), AsyncExitStack() as stack:
        pilots = [
            await stack.enter_async_context(_pilot(tmp_path / name, kubeconfig, ca))
            for name in ("one", "two")
        ]
        await _wait_published(srv, ["default", "shop", "web"], root)
        assert sorted(_writes(srv)) == [("POST", "default"), ("POST", "shop"), ("POST", "web")]
        holder = _holder(pilots)()
        assert holder is not None, "exactly one replica holds the Lease"
        other = next(p for p in pilots if p is not holder)

        await holder.stop()
        mark = other.mark()
        srv.delete("ConfigMap", "shop", CONFIGMAP)
        await other.wait_logged(lambda e: "now holds lease" in e["msg"], "taking over", mark, 20)
        await _wait_published(srv, ["shop"], root)


def _rbac_grants(resources: set[str]) -> set[tuple[str, str, str]]:
    """(resource, verb, resourceName or '') that deploy/rbac.yaml grants pilot on these."""
    found = set()
    for role in yaml.safe_load_all(RBAC.read_text()):
        for rule in role.get("rules", []):
            for resource in set(rule["resources"]) & resources:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames", [""]):
                        found.add((resource, verb, name))
    return found


def _verb(record: RequestRecord) -> tuple[str, str, str]:
    """The RBAC (resource, verb, resourceName) a request needs."""
    parts = record.path.strip("/").split("/")
    named = parts[-2] in ("configmaps", "namespaces")
    resource = parts[-2] if named else parts[-1]
    if record.method == "GET":
        verb = "get" if named else "watch" if record.is_watch else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[
            record.method
        ]
    selector = record.query.get("fieldSelector", "")
    name = parts[-1] if named else selector.removeprefix("metadata.name=")
    return resource, verb, name if verb != "create" else ""


async def test_pilot_asks_for_exactly_what_the_rbac_grants(tmp_path: Path) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    async with (
        _cluster(tmp_path, "shop") as (srv, kubeconfig),
        _pilot(tmp_path, kubeconfig, ca),
    ):
        await _wait_published(srv, ["default", "shop"], ca.root.cert)
        edited = _published(srv)["shop"] | {"data": {KEY: "edited"}}
        srv.update(edited)  # so that pilot also updates
        await _wait_published(srv, ["shop"], ca.root.cert)
    used = {_verb(r) for r in [*srv.requests_for("ConfigMap"), *srv.requests_for("Namespace")]}
    assert used == _rbac_grants({"configmaps", "namespaces"})
