"""The injector against hostile pods: sizes past its bounds, names as code, fields of the
wrong type, a pod naming another service account (granted nothing)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pilot.inject.errors import InjectError
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings, InjectSettingsError
from tests.support.inject_pods import app_pod

SETTINGS = InjectSettings()


def _many(count: int) -> list[dict[str, Any]]:
    return [{"name": f"c{n}", "image": "registry.example/c"} for n in range(count)]


def test_the_bounds_hold_exactly() -> None:
    inject(app_pod(initContainers=_many(499)), SETTINGS, namespace="shop")
    with pytest.raises(InjectError, match="501 containers, over the injector's bound of 500"):
        inject(app_pod(initContainers=_many(500)), SETTINGS, namespace="shop")
    volumes = [{"name": f"v{n}", "emptyDir": {}} for n in range(1001)]
    with pytest.raises(InjectError, match="1001 volumes, over the bound of 1000"):
        inject(app_pod(volumes=volumes), SETTINGS, namespace="shop")
    pod = app_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": f"E{n}", "value": "x"} for n in range(1001)]
    with pytest.raises(InjectError, match=r"spec.containers\[0\].env: 1001 entries"):
        inject(pod, SETTINGS, namespace="shop")


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"spec": []}, "spec: expected an object, got list"),
        ({"spec": {"containers": {}}}, "spec.containers: expected a list"),
        ({"spec": {"containers": []}}, "a pod needs at least one container"),
        ({"spec": {"containers": ["web"]}}, r"spec.containers\[0\]: expected an object"),
        ({"spec": {"containers": [{"name": 7}]}}, r"spec.containers\[0\].name: expected a string"),
        ({"metadata": {"annotations": {"a": 1}}, "spec": {}}, "metadata.annotations"),
        ({"metadata": {"name": "Web_1"}, "spec": {"containers": [{"name": "web"}]}},
         "workload name: 'Web_1' is not a DNS-1123 subdomain"),
        ({"spec": {"containers": [{"name": "istio-proxy"}]}}, "at least one container besides"),
        ({"spec": {"containers": [{"name": "web"}], "volumes": [{"name": "istio-token"}]}},
         "the injector's own volume"),
    ],
)  # fmt: skip
def test_malformed_pods_are_one_line_errors(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(InjectError, match=message):
        inject(pod, SETTINGS, namespace="shop")


@pytest.mark.parametrize(
    "reference",
    [
        {"apiVersion": "apps/v1", "kind": "Replica Set", "name": "web-1", "controller": True},
        {
            "apiVersion": "apps/v1/../../x",
            "kind": "ReplicaSet",
            "name": "web-1",
            "controller": True,
        },
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web\nforged", "controller": True},
    ],
)
def test_owner_references_reaching_node_metadata_are_checked(reference: dict[str, Any]) -> None:
    pod = app_pod()
    pod["metadata"] = {"generateName": "web-1-", "ownerReferences": [reference]}
    with pytest.raises(InjectError, match="workload"):
        inject(pod, SETTINGS, namespace="shop")


@pytest.mark.parametrize("name", ["web..1", "web-.1", "-web", "web.", "a" * 254, "wéb"])
def test_pod_names_reaching_node_metadata_must_be_dns_subdomains(name: str) -> None:
    with pytest.raises(InjectError, match="is not a DNS-1123 subdomain"):
        inject(app_pod(name), SETTINGS, namespace="shop")


def test_a_long_dotted_pod_name_is_a_name() -> None:
    name = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    env = inject(app_pod(name), SETTINGS, namespace="shop")["spec"]["initContainers"][1]["env"]
    assert {"name": "ISTIO_META_WORKLOAD_NAME", "value": name} in env


def test_the_namespace_must_be_a_dns_label() -> None:
    with pytest.raises(
        InjectError, match=re.escape("namespace: 'shop/../x' is not a DNS-1123 label")
    ):
        inject(app_pod(), SETTINGS, namespace="shop/../x")


def test_a_pod_naming_another_service_account_is_granted_nothing() -> None:
    """The certificate comes from the pod's own projected token; nothing in the spec names
    an identity, so a pod claiming `pilot` gets no more than its token proves."""
    pod = app_pod(serviceAccountName="pilot")
    pod["metadata"]["annotations"] = {
        "proxy.istio.io/config": "proxyMetadata: {SERVICE_ACCOUNT: pilot}"
    }
    injected = inject(pod, SETTINGS, namespace="shop")
    assert injected["spec"]["serviceAccountName"] == "pilot"  # the pod's own, untouched
    token = next(v for v in injected["spec"]["volumes"] if v["name"] == "istio-token")
    assert token["projected"]["sources"] == [
        {
            "serviceAccountToken": {
                "path": "istio-token",
                "expirationSeconds": 43200,
                "audience": "istio-ca",
            }
        }
    ]  # no serviceAccountName in a projection: always the pod's own account
    proxy = injected["spec"]["initContainers"][1]
    env = {e["name"]: e for e in proxy["env"]}
    account = {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}
    assert env["SERVICE_ACCOUNT"] == {"name": "SERVICE_ACCOUNT", "valueFrom": account}
    # No literal "pilot" anywhere the spec could name an account: args, env, volumes.
    assert "pilot" not in proxy["args"]
    assert "pilot" not in {entry.get("value") for entry in proxy["env"]}
    volumes = json.dumps(injected["spec"]["volumes"])
    assert "serviceAccountName" not in volumes
    assert '"secret"' not in volumes
    assert "automountServiceAccountToken" not in injected["spec"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("proxy_image", "pilot-proxy:1 --privileged"),
        ("proxy_image", ""),
        ("discovery_address", "pilot:15012\n"),
        ("discovery_address", "pilot"),
        ("discovery_address", "pilot:99999"),
        ("ca_address", "http://ca:15012"),
        ("proxy_log_level", "loud"),
        ("proxy_concurrency", -1),
        ("trust_domain", "td example"),
        ("cluster_id", "west\nforged"),
    ],
)
def test_settings_that_cannot_go_into_a_pod_are_refused(field: str, value: object) -> None:
    with pytest.raises(InjectSettingsError):
        InjectSettings(**{field: value})  # type: ignore[arg-type]
