"""An AdmissionReview (admission.k8s.io/v1) in, the webhook's answer out, as Istio's
webhook answers it.

HTTP-level refusals are `ReviewError`s the webhook's shell turns into a status: an
empty body or one over 6 MiB, 400; a Content-Type other than JSON, 415; a body that
does not decode, is not an AdmissionReview v1 with a request uid, or is not a Pod
CREATE, 400. Once the uid is read every other answer is a review that echoes it: no
injection needed is `allowed: true` without a patch; a pod the template cannot take
(a bad annotation, a field of the wrong type, a pod past the bounds, nesting too
deep) is `allowed: false` with the one-line reason in `status.message`. Nothing
raised inside escapes `answer` but a ReviewError.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from pilot.inject.decision import injection_required
from pilot.inject.errors import InjectError
from pilot.inject.patch import create_patch
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from pilot.inject.shape import shown

MAX_BODY_BYTES = 6 * 1024 * 1024  # Istio's: twice etcd's largest object, with room
API_VERSION = "admission.k8s.io/v1"
_POD = {"group": "", "version": "v1", "kind": "Pod"}


class ReviewError(Exception):
    """A body the webhook answers with an HTTP error: `status` and a one-line `reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Outcome:
    """What one review came to (for the webhook's metrics and log lines)."""

    uid: str
    injected: bool
    refusal: str  # "" unless allowed: false
    skipped: str  # why not injected, "" when injected or refused


def answer(body: bytes, content_type: str | None, settings: InjectSettings) -> bytes:
    """The AdmissionReview answering `body` (JSON bytes); ReviewError for HTTP errors."""
    return review(body, content_type, settings)[0]


def review(
    body: bytes, content_type: str | None, settings: InjectSettings
) -> tuple[bytes, Outcome]:
    """`answer`'s bytes with what they say, for a caller that counts outcomes."""
    request = _request(body, content_type)
    uid = request["uid"]
    try:
        response, outcome = _respond(request, settings)
    except InjectError as error:
        response, outcome = _refused(uid, str(error))
    except RecursionError:
        response, outcome = _refused(uid, "the pod is nested too deep")
    document = {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
    return json.dumps(document, separators=(",", ":")).encode(), outcome


def _request(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The review's request, once the body is JSON, an AdmissionReview v1, a Pod CREATE."""
    if not body:
        raise ReviewError(400, "no body found")
    if len(body) > MAX_BODY_BYTES:
        raise ReviewError(400, f"body over {MAX_BODY_BYTES} bytes")
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        raise ReviewError(415, "invalid Content-Type, want `application/json`")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        reason = str(error).splitlines()[0][:100] if str(error) else "nested too deep"
        raise ReviewError(400, f"could not decode body: {reason}") from None
    if not isinstance(document, dict) or document.get("kind") != "AdmissionReview":
        raise ReviewError(400, "could not decode body: not an AdmissionReview")
    if document.get("apiVersion") != API_VERSION:
        raise ReviewError(
            400, f"AdmissionReview {shown(document.get('apiVersion'))}: want {API_VERSION}"
        )
    request = document.get("request")
    if (
        not isinstance(request, dict)
        or not isinstance(request.get("uid"), str)
        or not request["uid"]
    ):
        raise ReviewError(400, "AdmissionReview without a request uid")
    if request.get("kind") != _POD or request.get("operation") != "CREATE":
        raise ReviewError(400, "not a Pod CREATE review (the webhook injects pods on creation)")
    if not isinstance(request.get("object"), dict):
        raise ReviewError(400, "the review's object is not a pod")
    return request


def _respond(request: dict[str, Any], settings: InjectSettings) -> tuple[dict[str, Any], Outcome]:
    uid = request["uid"]
    pod = request["object"]
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise InjectError("the review names no namespace")
    required, why = injection_required(pod, namespace, settings)
    if not required:
        return {"uid": uid, "allowed": True}, Outcome(uid, injected=False, refusal="", skipped=why)
    patch = create_patch(pod, inject(pod, settings, namespace=namespace))
    encoded = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    response = {"uid": uid, "allowed": True, "patchType": "JSONPatch", "patch": encoded}
    return response, Outcome(uid, injected=True, refusal="", skipped="")


def _refused(uid: str, message: str) -> tuple[dict[str, Any], Outcome]:
    response = {"uid": uid, "allowed": False, "status": {"code": 400, "message": message}}
    return response, Outcome(uid, injected=False, refusal=message, skipped="")
