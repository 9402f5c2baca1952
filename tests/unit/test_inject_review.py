"""AdmissionReview in, answer out, as Istio's webhook answers: the HTTP errors with their
status codes, the uid echoed on every answer, allowed: false with the reason for a pod
the template cannot take, and the same pod as `pilot kube-inject` makes."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from pilot.inject.pod import inject
from pilot.inject.review import MAX_BODY_BYTES, ReviewError, answer, review
from pilot.inject.settings import InjectSettings
from tests.support.admission import pod_review, review_body
from tests.support.inject_pods import app_pod, probed_pod
from tests.support.json_patch import apply_patch

SETTINGS = InjectSettings()
JSON = "application/json"


def _response(body: bytes, content_type: str | None = JSON) -> dict[str, Any]:
    document = json.loads(answer(body, content_type, SETTINGS))
    assert document["apiVersion"] == "admission.k8s.io/v1"
    assert document["kind"] == "AdmissionReview"
    return dict(document["response"])


def _patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    return apply_patch(pod, json.loads(base64.b64decode(response["patch"])))


@pytest.mark.parametrize("pod", [app_pod(), probed_pod()])
def test_the_webhooks_patch_gives_what_kube_inject_gives(pod: dict[str, Any]) -> None:
    """Issue 38: the same template and decisions as kube-inject, results equal."""
    response = _response(review_body(pod, namespace="shop", uid="u-1"))
    assert response["uid"] == "u-1"
    assert response["allowed"] is True
    assert _patched(pod, response) == inject(pod, SETTINGS, namespace="shop")


def test_a_deployments_pod_without_name_or_namespace_is_injected_as_its_deployment() -> None:
    pod = app_pod(labels={"pod-template-hash": "5f6b7"})
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5f6b7", "controller": True}
    labels = pod["metadata"]["labels"]
    pod["metadata"] = {"generateName": "web-5f6b7-", "labels": labels, "ownerReferences": [owner]}
    patched = _patched(pod, _response(review_body(pod, namespace="shop")))
    env = {e["name"]: e.get("value") for e in patched["spec"]["initContainers"][1]["env"]}
    assert env["ISTIO_META_OWNER"] == "kubernetes://apis/apps/v1/namespaces/shop/deployments/web"
    assert "namespace" not in patched["metadata"]  # the API server sets it, not the patch


@pytest.mark.parametrize(
    ("pod", "namespace"),
    [
        (app_pod(annotations={"sidecar.istio.io/inject": "false"}), "shop"),
        (app_pod(hostNetwork=True), "shop"),
        (app_pod(), "kube-system"),
        (inject(app_pod(), SETTINGS, namespace="shop"), "shop"),
    ],
)
def test_not_injecting_is_allowed_without_a_patch(pod: dict[str, Any], namespace: str) -> None:
    assert _response(review_body(pod, namespace=namespace, uid="u-2")) == {
        "uid": "u-2",
        "allowed": True,
    }


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (app_pod(annotations={"traffic.sidecar.istio.io/excludeInboundPorts": "80;reboot"}),
         "annotation traffic.sidecar.istio.io/excludeInboundPorts: '80;reboot' is not a port"),
        ({"metadata": {}, "spec": ["containers"]}, "spec: expected an object, got list"),
        (app_pod(initContainers=[{"name": f"i{n}"} for n in range(500)]),
         "501 containers, over the injector's bound of 500"),
    ],
)  # fmt: skip
def test_a_pod_the_template_cannot_take_is_refused_with_the_reason(
    pod: dict[str, Any], message: str
) -> None:
    response = _response(review_body(pod, uid="u-3"))
    assert response["uid"] == "u-3"
    assert response["allowed"] is False
    assert message in response["status"]["message"]
    assert "patch" not in response


def test_a_pod_nested_past_pythons_recursion_is_refused_not_raised() -> None:
    pod = app_pod()
    deep: dict[str, Any] = {}
    for _ in range(600):  # below json's own limit, past what copying takes
        deep = {"x": deep}
    pod["spec"]["containers"][0]["livenessProbe"] = {"exec": deep}
    body = json.dumps(pod_review(pod, uid="u-4")).encode()
    assert _response(body) == {
        "uid": "u-4",
        "allowed": False,
        "status": {"code": 400, "message": "the pod is nested too deep"},
    }


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"", JSON, 400),
        (b" " * (MAX_BODY_BYTES + 1), JSON, 400),
        (review_body(app_pod()), "text/plain", 415),
        (review_body(app_pod()), None, 415),
        (review_body(app_pod()), "application/yaml", 415),
        (b"{not json", JSON, 400),
        (b"\xff\xfe\x00", JSON, 400),
        (b"[" * 100_000 + b"]" * 100_000, JSON, 400),
        (b"[]", JSON, 400),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {}}',
            JSON,
            400,
        ),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",'
            b' "request": {"uid": 5}}',
            JSON,
            400,
        ),
        (review_body(app_pod(), operation="UPDATE"), JSON, 400),
    ],
)
def test_http_errors_as_istios_webhook(body: bytes, content_type: str | None, status: int) -> None:
    with pytest.raises(ReviewError) as refused:
        answer(body, content_type, SETTINGS)
    assert refused.value.status == status
    assert "\n" not in refused.value.reason
    assert len(refused.value.reason) < 200


def test_content_type_parameters_are_accepted() -> None:
    assert _response(review_body(app_pod()), "application/json; charset=utf-8")["allowed"] is True


def test_a_review_of_something_else_than_a_pod_is_400() -> None:
    document = pod_review(app_pod())
    document["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    with pytest.raises(ReviewError) as refused:
        answer(json.dumps(document).encode(), JSON, SETTINGS)
    assert refused.value.status == 400


def test_the_outcome_says_what_happened() -> None:
    injected = review(review_body(app_pod(), uid="a"), JSON, SETTINGS)[1]
    assert (injected.uid, injected.injected, injected.refusal, injected.skipped) == (
        "a",
        True,
        "",
        "",
    )
    skipped = review(review_body(app_pod(hostNetwork=True), uid="b"), JSON, SETTINGS)[1]
    assert not skipped.injected
    assert "hostNetwork" in skipped.skipped
    refused = review(review_body({"spec": 1}, uid="c"), JSON, SETTINGS)[1]
    assert refused.refusal == "spec: expected an object, got int"
