"""Pod templates inside workload kinds (kube-inject's side): where each kind keeps its
template, Lists, kinds without pods, and errors naming the object."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from pilot.inject.workloads import TEMPLATE_PATHS, ObjectError, inject_object
from tests.support.inject_pods import app_pod, workload

SETTINGS = InjectSettings()


def _at(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        document = document[key]
    return document


@pytest.mark.parametrize("kind", sorted(TEMPLATE_PATHS))
def test_each_kinds_template_is_injected_with_the_workload_as_owner(kind: str) -> None:
    document = workload(kind)
    injected = inject_object(document, SETTINGS, "default")
    owner = {"kind": kind, "apiVersion": document["apiVersion"], "name": "web"}
    template = _at(document, TEMPLATE_PATHS[kind])
    assert _at(injected, TEMPLATE_PATHS[kind]) == inject(
        template, SETTINGS, namespace="shop", owner=owner
    )
    assert document == workload(kind)  # the caller's object is left as it was


def test_a_list_injects_each_item_and_a_service_is_unchanged() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {}}
    listed = {"apiVersion": "v1", "kind": "List", "items": [service, workload("Job")]}
    injected = inject_object(listed, SETTINGS, "default")
    assert injected["items"][0] == service
    assert (
        injected["items"][1]["spec"]["template"]["spec"]["initContainers"][0]["name"]
        == "istio-init"
    )


def test_a_pod_without_a_namespace_takes_the_given_one() -> None:
    injected = inject_object(app_pod(), SETTINGS, "team-a")
    env = {e["name"]: e.get("value") for e in injected["spec"]["initContainers"][1]["env"]}
    assert env["ISTIO_META_OWNER"] == "kubernetes://apis/v1/namespaces/team-a/pods/web-1"
    assert "namespace" not in injected["metadata"]


def test_errors_name_the_object_and_the_list_item() -> None:
    bad = workload("CronJob", name="report")
    bad["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"] = []
    with pytest.raises(ObjectError, match="a pod needs at least one container") as refused:
        inject_object(bad, SETTINGS, "default")
    assert refused.value.label == "CronJob report"
    with pytest.raises(ObjectError) as refused:
        inject_object({"kind": "List", "items": [app_pod(), bad]}, SETTINGS, "default")
    assert refused.value.label == "item 1 (CronJob report)"
    with pytest.raises(ObjectError, match=r"spec\.jobTemplate\.spec: expected an object"):
        inject_object(
            {"kind": "CronJob", "spec": {"jobTemplate": {"spec": 3}}}, SETTINGS, "default"
        )
