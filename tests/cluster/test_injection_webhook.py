"""Sidecar injection decided by the real API server and pilot together.

deploy/ applied as is (its MutatingWebhookConfiguration pilot-sidecar-injector among it);
pilot runs as its ServiceAccount under deploy/'s RBAC, with the shared root, and keeps
the configuration's caBundle at that root. The API server calls the webhook as in a
cluster: it resolves Service pilot/pilot-system port 443 to its ClusterIP and dials it
through tests.cluster.cluster_network, which carries the bytes to the local pilot's
webhook port; TLS is verified against the caBundle pilot wrote, for
`pilot.pilot-system.svc`. Nothing here posts a review itself: Pods are created, and
come back with the sidecar or without it.
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.client import KubeError, admin, path_of
from tests.cluster.control_plane import REPO, ControlPlane
from tests.cluster.injector import (
    CONFIGURATION,
    container_names,
    injected,
    running_injector,
    wait_bundles,
)
from tests.support.envoy_process import wait_until
from tests.support.pilot_process import PilotProcess

Obj = dict[str, Any]
BY_DEFAULT = REPO / "deploy" / "inject-by-default"
TIMEOUT = 30.0  # seconds for the controllers' Pods


@pytest.fixture
async def injector(deployed: ControlPlane, tmp_path: Path) -> AsyncIterator[PilotProcess]:
    """pilot, its webhook reachable at its Service, the caBundle written."""
    async with running_injector(deployed, tmp_path / "pilot") as pilot:
        yield pilot


@contextmanager
def _namespace(plane: ControlPlane, **labels: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    plane.kubectl("create", "namespace", name)
    if labels:
        plane.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in labels.items()))
    try:
        yield name
    finally:
        plane.kubectl("delete", "namespace", name, "--wait=false")


def _pod(
    namespace: str,
    labels: Obj | None = None,
    annotations: Obj | None = None,
    host_network: bool = False,
) -> Obj:
    spec: Obj = {
        "containers": [{"name": "app", "image": "app:1", "ports": [{"containerPort": 8080}]}]
    }
    if host_network:
        spec["hostNetwork"] = True
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}", "namespace": namespace,
                     "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
    }  # fmt: skip


INJECT_TRUE = {"sidecar.istio.io/inject": "true"}
INJECT_FALSE = {"sidecar.istio.io/inject": "false"}
REV_DEFAULT = {"istio.io/rev": "default"}
# (namespace labels, pod labels, pod annotations, hostNetwork) -> injected?
MATRIX = [
    pytest.param({"istio-injection": "enabled"}, {}, {}, False, True, id="ns-enabled"),
    pytest.param({"istio-injection": "enabled"}, INJECT_FALSE, {}, False, False,
                 id="ns-enabled-pod-label-false"),
    pytest.param({"istio-injection": "enabled"}, {}, INJECT_FALSE, False, False,
                 id="ns-enabled-pod-annotation-false"),
    pytest.param({"istio-injection": "enabled"}, {}, {}, True, False,
                 id="ns-enabled-host-network"),
    pytest.param({"istio-injection": "disabled"}, {}, {}, False, False, id="ns-disabled"),
    pytest.param({"istio-injection": "disabled"}, INJECT_TRUE, {}, False, False,
                 id="ns-disabled-pod-true"),
    pytest.param({}, {}, {}, False, False, id="no-labels"),
    pytest.param({}, INJECT_TRUE, {}, False, True, id="pod-true"),
    pytest.param({}, REV_DEFAULT, {}, False, True, id="pod-rev-default"),
    pytest.param(REV_DEFAULT, {}, {}, False, True, id="ns-rev-default"),
    pytest.param(REV_DEFAULT, INJECT_FALSE, {}, False, False, id="ns-rev-default-pod-false"),
]  # fmt: skip


async def test_the_selector_matrix(deployed: ControlPlane, injector: PilotProcess) -> None:
    async with admin(deployed) as kube:
        for case in MATRIX:
            ns_labels, labels, annotations, host_network, expected = case.values
            with _namespace(deployed, **ns_labels) as namespace:
                created = await kube.create(_pod(namespace, labels, annotations, host_network))
                assert injected(created) == expected, (case.id, container_names(created))
                if expected:
                    assert "sidecar.istio.io/status" in created["metadata"]["annotations"]


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public"])
async def test_no_pod_of_a_system_namespace_is_sent(
    deployed: ControlPlane, injector: PilotProcess, namespace: str
) -> None:
    async with admin(deployed) as kube:
        pod = _pod(namespace, INJECT_TRUE)
        created = await kube.create(pod)
        try:
            assert not injected(created)
        finally:
            await kube.request("DELETE", path_of("Pod", namespace, pod["metadata"]["name"]))


async def test_a_deployments_pods_come_out_injected(
    deployed: ControlPlane, injector: PilotProcess
) -> None:
    with _namespace(deployed, **{"istio-injection": "enabled"}) as namespace:
        deployed.kubectl("create", "deployment", "web", "--image=web:1", "--port=8080",
                         "--replicas=2", "-n", namespace)  # fmt: skip
        async with admin(deployed) as kube:

            async def pods() -> list[Obj]:
                items: list[Obj] = (await kube.get(path_of("Pod", namespace)))["items"]
                return items

            created = await wait_until(pods, TIMEOUT, "the ReplicaSet's Pods",
                                       until=lambda items: len(items) == 2)  # fmt: skip
        assert all(injected(pod) for pod in created), [container_names(p) for p in created]
        labels = created[0]["metadata"]["labels"]
        assert labels["service.istio.io/canonical-name"] == "web"


async def test_a_template_error_refuses_the_pod_with_the_message(
    deployed: ControlPlane, injector: PilotProcess
) -> None:
    hostile = {"traffic.sidecar.istio.io/includeInboundPorts": "8080;reboot"}
    with _namespace(deployed, **{"istio-injection": "enabled"}) as namespace:
        async with admin(deployed) as kube:
            with pytest.raises(KubeError) as refused:
                await kube.create(_pod(namespace, annotations=hostile))
    message = str(refused.value)
    assert "namespace.sidecar-injector.istio.io" in message, message
    assert "includeInboundPorts" in message, message


async def test_the_ca_bundle_comes_back_after_an_edit(
    deployed: ControlPlane, injector: PilotProcess
) -> None:
    blank = '[{"op": "replace", "path": "/webhooks/2/clientConfig/caBundle", "value": ""}]'
    deployed.kubectl("patch", "mutatingwebhookconfiguration", CONFIGURATION,
                     "--type=json", "-p", blank)  # fmt: skip
    async with admin(deployed) as kube:
        await wait_bundles(kube, injector)
        with _namespace(deployed, **{"istio-injection": "enabled"}) as namespace:
            assert injected(await kube.create(_pod(namespace)))


async def test_without_pilot_an_injected_namespace_refuses_pods(
    deployed: ControlPlane, tmp_path: Path
) -> None:
    """failurePolicy Fail: no Pod of an injected namespace starts without its sidecar."""
    with _namespace(deployed, **{"istio-injection": "enabled"}) as namespace:
        async with admin(deployed) as kube:
            with pytest.raises(KubeError, match=r"sidecar-injector\.istio\.io"):
                await kube.create(_pod(namespace))
            # and a namespace that did not ask is not held up
            with _namespace(deployed) as other:
                assert not injected(await kube.create(_pod(other)))


def _kustomization_with_by_default(folder: Path) -> Path:
    """deploy/ with the inject-by-default component, as a user's kustomization would say
    (kustomize takes relative paths only)."""
    folder.mkdir(parents=True, exist_ok=True)
    deploy, component = (os.path.relpath(p, folder) for p in (REPO / "deploy", BY_DEFAULT))
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n- {deploy}\ncomponents:\n- {component}\n"
    )
    return folder


async def test_the_by_default_component_injects_unlabelled_namespaces(
    deployed: ControlPlane, injector: PilotProcess, tmp_path: Path
) -> None:
    deployed.kubectl("apply", "-k", str(_kustomization_with_by_default(tmp_path / "k")))
    try:
        async with admin(deployed) as kube:
            await wait_bundles(kube, injector)
            with _namespace(deployed) as namespace:
                assert injected(await kube.create(_pod(namespace)))
                assert not injected(await kube.create(_pod(namespace, INJECT_FALSE)))
            with _namespace(deployed, **{"istio-injection": "disabled"}) as namespace:
                assert not injected(await kube.create(_pod(namespace)))
    finally:
        deployed.kubectl("apply", "-k", str(REPO / "deploy"))
    webhooks = deployed.kubectl("get", "mutatingwebhookconfiguration", CONFIGURATION,
                                "-o", "jsonpath={.webhooks[*].name}").split()  # fmt: skip
    assert "auto.sidecar-injector.istio.io" not in webhooks


README_COMMAND = "kubectl label namespace default istio-injection=enabled"  # deploy/README.md


async def test_the_readmes_command_turns_injection_on(
    deployed: ControlPlane, injector: PilotProcess
) -> None:
    deployed.kubectl(*shlex.split(README_COMMAND)[1:])
    try:
        async with admin(deployed) as kube:
            pod = _pod("default")
            created = await kube.create(pod)
            await kube.request("DELETE", path_of("Pod", "default", pod["metadata"]["name"]))
        assert injected(created), container_names(created)
    finally:
        deployed.kubectl("label", "namespace", "default", "istio-injection-")


async def test_a_missing_configuration_is_a_warning_and_filled_once_applied(
    deployed: ControlPlane, injector: PilotProcess
) -> None:
    deployed.kubectl("delete", "mutatingwebhookconfiguration", CONFIGURATION)
    try:
        await injector.wait_logged(
            lambda e: f"{CONFIGURATION} not found" in e["msg"], "the missing configuration",
            within=TIMEOUT,
        )  # fmt: skip
        assert (await injector.get("/ready"))[0] == 200, "unready for want of injection"
    finally:
        deployed.kubectl("apply", "-k", str(REPO / "deploy"))
    async with admin(deployed) as kube:
        await wait_bundles(kube, injector)
        with _namespace(deployed, **{"istio-injection": "enabled"}) as namespace:
            assert injected(await kube.create(_pod(namespace)))
