"""What pilot asks of the API server to keep ConfigMap `istio-ca-root-cert`, read off the
test API server's request log (a real server keeps none a test can read).

A real `pilot discovery` (a subprocess, tests/security/pilot_process) with a plugged-in
CA written here. pilot asks for exactly what deploy/rbac.yaml grants it: ConfigMaps
listed and watched by name only, created and updated; Namespaces listed and watched as
metadata only; with `--namespaces`, no Namespace at all.

What a user sees of the ConfigMap (in every namespace but Kubernetes' own, back after a
deletion or an edit, in a namespace created later, a new root after a restart, only the
named namespaces with `--namespaces`, one writer among replicas) is tested on the real
API server: tests/cluster/test_root_configmap_everywhere.py and
test_shared_root_replicas.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from tests.kubeapi import KubeAPIServer, RequestRecord, write_kubeconfig
from tests.support.ca import PluggedIn, write_plugged_in
from tests.support.pilot_process import PilotProcess, start_pilot

CONFIGMAP = "istio-ca-root-cert"
KEY = "root-cert.pem"
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
    namespace_reads = srv.requests_for("Namespace")
    assert all("as=PartialObjectMetadata" in r.accept for r in namespace_reads), (
        "Namespaces are read as metadata only"
    )


async def test_with_named_namespaces_pilot_reads_no_namespace(tmp_path: Path) -> None:
    ca = write_plugged_in(tmp_path / "ca")
    async with (
        _cluster(tmp_path, "shop", "web") as (srv, kubeconfig),
        _pilot(tmp_path, kubeconfig, ca, "--namespaces", "shop,web"),
    ):
        await _wait_published(srv, ["shop", "web"], ca.root.cert)
    assert srv.requests_for("Namespace") == [], "named namespaces need no Namespace watch"
