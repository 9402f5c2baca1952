"""AdmissionReviews as kube-apiserver sends them to a mutating webhook (admission.k8s.io/v1)."""

from __future__ import annotations

import json
from typing import Any


def pod_review(
    pod: dict[str, Any],
    *,
    namespace: str = "shop",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
    operation: str = "CREATE",
) -> dict[str, Any]:
    """The review of creating `pod` in `namespace`."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def review_body(pod: dict[str, Any], **request: Any) -> bytes:
    """`pod_review` as the bytes of a request body."""
    return json.dumps(pod_review(pod, **request)).encode()
