"""Any pod at all in a review: `answer` says allowed true or false, or raises ReviewError,
and nothing else ever leaves it (a KeyError, TypeError or RecursionError would be a 500
and a webhook that fails every pod creation)."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.inject.review import ReviewError, answer
from pilot.inject.settings import InjectSettings
from tests.support.admission import pod_review
from tests.support.inject_pods import probed_pod

SETTINGS = InjectSettings()
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
# Where a hostile value goes: each field the template reads.
_PLACES = [
    ("metadata",), ("metadata", "name"), ("metadata", "labels"), ("metadata", "annotations"),
    ("metadata", "ownerReferences"), ("metadata", "generateName"), ("spec",),
    ("spec", "containers"), ("spec", "initContainers"), ("spec", "volumes"),
    ("spec", "securityContext"), ("spec", "hostNetwork"), ("spec", "containers", 0),
    ("spec", "containers", 0, "name"), ("spec", "containers", 0, "ports"),
    ("spec", "containers", 0, "env"), ("spec", "containers", 0, "readinessProbe"),
    ("spec", "containers", 0, "readinessProbe", "httpGet"),
    ("spec", "containers", 0, "readinessProbe", "httpGet", "port"),
    ("spec", "containers", 0, "livenessProbe", "tcpSocket"),
    ("spec", "containers", 0, "startupProbe", "timeoutSeconds"),
    ("metadata", "annotations", "proxy.istio.io/config"),
    ("metadata", "annotations", "sidecar.istio.io/inject"),
    ("metadata", "labels", "sidecar.istio.io/inject"),
]  # fmt: skip


def _placed(place: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    pod = copy.deepcopy(probed_pod())
    parent: Any = pod
    for key in place[:-1]:
        parent = parent[key] if not isinstance(parent, dict) else parent.setdefault(key, {})
    parent[place[-1]] = value
    return pod


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=300)
@given(st.sampled_from(_PLACES), _json)
def test_any_value_anywhere_is_answered(place: tuple[str | int, ...], value: Any) -> None:
    body = json.dumps(pod_review(_placed(place, value), uid="u")).encode()
    try:
        response = json.loads(answer(body, "application/json", SETTINGS))["response"]
    except ReviewError as error:
        assert error.status == 400
        return
    assert response["uid"] == "u"
    assert response["allowed"] in (True, False)
    if response["allowed"] is False:
        message = response["status"]["message"]
        assert message
        assert "\n" not in message


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=100)
@given(_json)
def test_any_object_as_the_review_is_answered_or_a_400(document: Any) -> None:
    try:
        answer(json.dumps(document).encode(), "application/json", SETTINGS)
    except ReviewError as error:
        assert error.status == 400
