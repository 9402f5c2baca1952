"""The webhook's JSON patch: applied to the pod (by a second RFC 6902 implementation,
tests/support/json_patch.py) it gives exactly the injected pod."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.inject.patch import create_patch, pointer
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from tests.support.inject_pods import app_pod, probed_pod
from tests.support.json_patch import apply_patch


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("pod", [app_pod(), probed_pod(), app_pod(annotations={"a/b~c": "x"})])
def test_the_patch_gives_the_injected_pod(pod: dict[str, Any], native: bool) -> None:
    injected = inject(pod, InjectSettings(native_sidecars=native), namespace="shop")
    assert apply_patch(pod, create_patch(pod, injected)) == injected


def test_the_patch_adds_the_sidecar_and_sends_back_nothing_else() -> None:
    """A pod of 500 containers gets a patch the size of the sidecar, not of the pod."""
    pod = app_pod(
        initContainers=[{"name": f"c{n}", "image": "registry.example/c"} for n in range(498)]
    )
    patch = create_patch(pod, inject(pod, InjectSettings(), namespace="shop"))
    added = {op["path"] for op in patch if op["path"].startswith("/spec/initContainers")}
    assert added == {"/spec/initContainers/0", "/spec/initContainers/1"}
    assert len(json.dumps(patch)) < 10_000 < len(json.dumps(pod))


def test_a_changed_list_is_replaced_whole() -> None:
    assert create_patch({"a": [1, 2]}, {"a": [2, 1]}) == [
        {"op": "replace", "path": "/a", "value": [2, 1]}
    ]


def test_annotation_names_are_escaped_as_json_pointers() -> None:
    assert pointer(["metadata", "annotations", "sidecar.istio.io/status"]) == (
        "/metadata/annotations/sidecar.istio.io~1status"
    )
    assert pointer(["a~b/c"]) == "/a~0b~1c"


def test_only_add_remove_and_replace_and_nothing_for_equal_pods() -> None:
    pod = probed_pod()
    ops = {operation["op"] for operation in create_patch(pod, inject(pod, InjectSettings()))}
    assert ops <= {"add", "replace"}
    assert create_patch(pod, copy.deepcopy(pod)) == []


def test_json_types_are_told_apart() -> None:
    """Python's True == 1: JSON's true and 1 are different values, and a patch says so."""
    assert create_patch({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert create_patch({"a": [1]}, {"a": [1.0]}) != []


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b/c", "~d", ""]), children, max_size=3)
    ),
    max_leaves=8,
)


_KEYS = st.sampled_from(["a", "b/c", "~d", "name"])


# Generation speed is the shared machine's, not the code's: no health check on it.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(_KEYS, _json, max_size=3), st.dictionaries(_KEYS, _json, max_size=3))
def test_any_two_objects_patch_into_each_other(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert apply_patch(old, create_patch(old, new)) == new
