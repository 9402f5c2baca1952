"""The registry file format, Istio-style durations, and the debounce settings."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from pilot.durations import parse_duration
from pilot.push.settings import DebounceSettings
from pilot.settings import SettingsError, debounce_from_env
from pilot.sources.file import RegistryFileError, parse_registry

KUBECTL_LIST = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec: {ports: [{name: http, port: 80}]}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web, namespace: shop}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: web, namespace: shop}
subsets: []
"""


def test_kubectl_list_and_multiple_documents() -> None:
    state = parse_registry(KUBECTL_LIST, "mesh.yaml")
    assert [str(s.key) for s in state.services] == ["shop/web"]
    assert sorted(s.key.kind for s in state.endpoint_sets) == ["EndpointSlice", "Endpoints"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [", "mesh.yaml: not valid YAML"),
        ("- a\n- b\n", "mesh.yaml: document 1 is not a mapping"),
        ("metadata: {name: x}\n", "document 1: has no kind"),
        (
            "kind: List\nitems: [{kind: EndpointSlice, metadata: {name: s}}]",
            "document 1 item 0: EndpointSlice default/s: label kubernetes.io/service-name"
            " is missing",
        ),
    ],
)
def test_broken_files_say_where_and_what(text: str, message: str) -> None:
    with pytest.raises(RegistryFileError, match=re.escape(message)):
        parse_registry(text, "mesh.yaml")


def test_durations_like_istio() -> None:
    assert parse_duration("100ms") == pytest.approx(0.1)
    assert parse_duration("1m30s") == 90
    assert parse_duration("24h") == 86400
    assert parse_duration("0") == 0
    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("1d12h") == 36 * 3600
    for bad in ("", "10", "5x", "1h-2m", "1w"):
        with pytest.raises(ValueError, match=r"is not a duration|empty duration"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="'-5m' is negative"):
        parse_duration("-5m")


def test_debounce_settings_from_environment() -> None:
    settings = debounce_from_env(
        {
            "PILOT_DEBOUNCE_AFTER": "250ms",
            "PILOT_DEBOUNCE_MAX": "5s",
            "PILOT_ENABLE_EDS_DEBOUNCE": "false",
        }
    )
    assert settings == DebounceSettings(after=0.25, max_delay=5.0, eds_debounce=False)
    assert debounce_from_env({}) == DebounceSettings()
    with pytest.raises(SettingsError, match="PILOT_DEBOUNCE_AFTER"):
        debounce_from_env({"PILOT_DEBOUNCE_AFTER": "soon"})


def test_kubectl_json_reads_as_the_same_registry_as_its_yaml() -> None:
    """`-o json` is parsed as JSON (and means what the YAML means)."""
    document = yaml.safe_load(KUBECTL_LIST.split("---", maxsplit=1)[0])
    as_json = parse_registry(json.dumps(document, indent=4), "mesh.json")
    as_yaml = parse_registry(KUBECTL_LIST.split("---", maxsplit=1)[0], "mesh.yaml")
    assert as_json == as_yaml and as_json.services


def test_yaml_in_flow_style_is_still_yaml() -> None:
    """A file that starts like JSON but is not JSON is read as YAML."""
    state = parse_registry(
        "{kind: Service, metadata: {name: web, namespace: shop}, spec: {ports: [{port: 80}]}}",
        "mesh.yaml",
    )
    assert [str(s.key) for s in state.services] == ["shop/web"]


def test_a_json_list_of_objects_is_one_document_each() -> None:
    text = json.dumps(
        [
            {
                "kind": "Service",
                "metadata": {"name": "a", "namespace": "x"},
                "spec": {"ports": [{"port": 80}]},
            },
            {"kind": "Deployment", "metadata": {"name": "a", "namespace": "x"}},
            {"kind": "Service"},
        ]
    )
    with pytest.raises(RegistryFileError, match=re.escape("mesh.json: document 3")):
        parse_registry(text, "mesh.json")
