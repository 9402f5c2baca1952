"""Whether a pod is injected: the re-checks the API server's selectors cannot make."""

from __future__ import annotations

import pytest

from pilot.inject.decision import injection_required
from pilot.inject.errors import InjectError
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from tests.support.inject_pods import app_pod

SETTINGS = InjectSettings()


@pytest.mark.parametrize(
    ("labels", "annotations", "injected"),
    [
        ({}, {}, True),
        ({}, {"sidecar.istio.io/inject": "true"}, True),
        ({}, {"sidecar.istio.io/inject": "false"}, False),
        ({}, {"sidecar.istio.io/inject": "False"}, False),
        ({}, {"sidecar.istio.io/inject": "0"}, False),
        ({"sidecar.istio.io/inject": "false"}, {}, False),
        # The label wins over the annotation, as in Istio.
        ({"sidecar.istio.io/inject": "true"}, {"sidecar.istio.io/inject": "false"}, True),
        ({"sidecar.istio.io/inject": "false"}, {"sidecar.istio.io/inject": "true"}, False),
        # Not a boolean: no opt-out (Istio falls back to the policy, which injects).
        ({}, {"sidecar.istio.io/inject": "nope"}, True),
    ],
)
def test_the_pods_own_say(
    labels: dict[str, str], annotations: dict[str, str], injected: bool
) -> None:
    pod = app_pod(labels=labels, annotations=annotations)
    required, why = injection_required(pod, "shop", SETTINGS)
    assert required is injected
    assert (why == "") is injected
    if not injected:
        assert "sidecar.istio.io/inject" in why


@pytest.mark.parametrize(
    "namespace", ["kube-system", "kube-public", "kube-node-lease", "local-path-storage"]
)
def test_system_namespaces_are_never_injected(namespace: str) -> None:
    pod = app_pod(annotations={"sidecar.istio.io/inject": "true"})
    assert injection_required(pod, namespace, SETTINGS) == (
        False,
        f"namespace {namespace} is a system namespace",
    )


def test_a_pod_on_the_hosts_network_is_not_injected() -> None:
    required, why = injection_required(app_pod(hostNetwork=True), "shop", SETTINGS)
    assert not required
    assert "hostNetwork" in why
    assert injection_required(app_pod(hostNetwork=False), "shop", SETTINGS) == (True, "")


def test_an_injected_pod_is_not_injected_again() -> None:
    injected = inject(app_pod(), SETTINGS, namespace="shop")
    required, why = injection_required(injected, "shop", SETTINGS)
    assert not required
    assert "already injected" in why


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": [], "spec": {}},
        {"metadata": {}, "spec": "containers"},
        {"metadata": {"annotations": {"sidecar.istio.io/inject": False}}, "spec": {}},
        {"metadata": {"labels": ["a"]}, "spec": {}},
    ],
)
def test_a_field_of_the_wrong_type_is_an_inject_error(pod: dict[str, object]) -> None:
    with pytest.raises(InjectError):
        injection_required(pod, "shop", SETTINGS)
