"""Whether a pod gets the sidecar: what pilot re-checks that the API server's selectors
cannot (Istio's `injectRequired`).

The MutatingWebhookConfiguration's selectors choose which pods reach the webhook;
this says no for a pod that opted out (annotation or label `sidecar.istio.io/inject`
false; the label wins when both are set, as Istio), uses the host's network (the
capture rules would rewrite the node's routing), lives in a system namespace, or is
already injected. A value other than true or false is no opt-out, as in Istio.
"""

from __future__ import annotations

from typing import Any

from pilot.inject.annotations import INJECT, STATUS, is_false
from pilot.inject.settings import InjectSettings
from pilot.inject.shape import mapping, strings

IGNORED_NAMESPACES = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}
)


def injection_required(
    pod: dict[str, Any], namespace: str, settings: InjectSettings
) -> tuple[bool, str]:
    """(True, "") when `pod` in `namespace` is to be injected, else (False, why not).

    Raises InjectError when a field it reads has the wrong JSON type.
    """
    del settings  # the same decision whatever the template's settings (kept for the contract)
    metadata = mapping(pod, "metadata", "metadata")
    spec = mapping(pod, "spec", "spec")
    annotations = strings(metadata, "annotations", "metadata.annotations")
    labels = strings(metadata, "labels", "metadata.labels")
    if spec.get("hostNetwork") is True:
        return False, "the pod uses the host's network (hostNetwork)"
    if namespace in IGNORED_NAMESPACES:
        return False, f"namespace {namespace} is a system namespace"
    if STATUS in annotations:
        return False, f"already injected ({STATUS})"
    asked = labels.get(INJECT, annotations.get(INJECT))
    if asked is not None and is_false(asked):
        where = "label" if INJECT in labels else "annotation"
        return False, f"{where} {INJECT} is {asked}"
    return True, ""
