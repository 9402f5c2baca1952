"""Fields Kubernetes requires, missing: each object is refused naming its kind,
namespace/name and the field, as a bad field already was; objects Kubernetes allows
without them (a headless Service without ports, an ExternalName one, a slice with
no endpoints) still load. Before, a Service without `spec` or `spec.ports` loaded
as a service with no port and an EndpointSlice without `addressType` as IPv4,
without a word.
"""

from __future__ import annotations

from typing import Any

import pytest

from pilot.registry.kubernetes_objects import (
    MissingField,
    ObjectError,
    parse_endpoint_slice,
    parse_endpoints,
    parse_pod,
    parse_service,
)
from pilot.sources.file_format import RegistryFileError, parse_registry
from tests.support.mesh import Ep, as_list, endpoint_slice, pod, service


def _without(obj: dict[str, Any], *path: str | int) -> dict[str, Any]:
    """`obj` with the field at `path` removed."""
    parent: Any = obj
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return obj


def _missing(parse: Any, obj: dict[str, Any], field: str, label: str) -> str:
    with pytest.raises(MissingField) as raised:
        parse(obj)
    assert raised.value.field == field
    message = str(raised.value)
    assert message.startswith(f"{label}: {field} is missing"), message
    return message


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (_without(service("web"), "spec"), "spec"),
        (_without(service("web"), "spec", "ports"), "spec.ports"),
        (service("web", ports=()), "spec.ports"),
        (
            {"kind": "Service", "metadata": {"name": "web"}, "spec": {"type": "NodePort"}},
            "spec.ports",
        ),
        (service("web", ports=(("http", 80), ("", 81))), "spec.ports[1].name"),
        (_without(service("web"), "spec", "ports", 0, "port"), "spec.ports[0].port"),
    ],
    ids=["no-spec", "no-ports", "empty-ports", "nodeport-no-ports", "unnamed-2nd", "no-number"],
)
def test_a_service_without_a_required_field_names_it(obj: dict[str, Any], field: str) -> None:
    message = _missing(parse_service, obj, field, "Service default/web")
    if field in {"spec", "spec.ports"}:
        assert "unless clusterIP is None or type is ExternalName" in message


@pytest.mark.parametrize(
    "spec",
    [{"clusterIP": "None"}, {"clusterIP": "None", "ports": []}, {"type": "ExternalName"}],
    ids=["headless", "headless-empty", "external-name"],
)
def test_services_kubernetes_allows_without_ports_load(spec: dict[str, Any]) -> None:
    parsed = parse_service({"kind": "Service", "metadata": {"name": "db"}, "spec": spec})
    assert parsed.ports == ()


def test_one_unnamed_port_is_still_allowed() -> None:
    parsed = parse_service(service("web", ports=(("", 80),)))
    assert [p.port for p in parsed.ports] == [80]


def test_an_endpoint_slice_without_address_type_names_it() -> None:
    obj = _without(endpoint_slice("web", [Ep("10.1.0.1")]), "addressType")
    _missing(parse_endpoint_slice, obj, "addressType", "EndpointSlice default/web-slice")


def test_an_endpoint_without_addresses_names_it() -> None:
    obj = endpoint_slice("web", [Ep("10.1.0.1")])
    del obj["endpoints"][0]["addresses"]
    _missing(parse_endpoint_slice, obj, "endpoints[0].addresses", "EndpointSlice default/web-slice")


@pytest.mark.parametrize("endpoints", [None, []], ids=["null", "empty"])
def test_a_slice_without_endpoints_is_legal(endpoints: Any) -> None:
    obj = endpoint_slice("web", [])
    obj["endpoints"] = endpoints
    parsed = parse_endpoint_slice(obj)
    assert parsed is not None and parsed.groups[0].endpoints == ()


def test_a_legacy_endpoints_port_without_a_number_names_it() -> None:
    obj = {
        "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "10.1.0.1"}], "ports": [{"name": "http"}]}],
    }
    _missing(parse_endpoints, obj, "subsets[0].ports[0].port", "Endpoints default/web")


@pytest.mark.parametrize("field", ["status", "spec"])
def test_a_pod_without_spec_or_status_names_it(field: str) -> None:
    obj = _without(pod("web-1", "10.1.0.1"), field)
    _missing(parse_pod, obj, field, "Pod default/web-1")


def test_a_container_port_without_a_number_names_it() -> None:
    obj = pod("web-1", "10.1.0.1")
    del obj["spec"]["containers"][0]["ports"][0]["containerPort"]
    field = "spec.containers[0].ports[0].containerPort"
    _missing(parse_pod, obj, field, "Pod default/web-1")


@pytest.mark.parametrize("name", ["web\nERROR forged line", "web\x1b[31mred\x1b[0m", "w" * 5000])
def test_a_hostile_name_stays_one_printable_bounded_line(name: str) -> None:
    obj = _without(service("web"), "spec")
    obj["metadata"]["name"] = name
    with pytest.raises(MissingField) as raised:
        parse_service(obj)
    message = str(raised.value)
    assert message.isprintable(), repr(message)
    assert len(message) < 400, len(message)
    assert message.endswith(
        "spec is missing (a Service needs ports unless clusterIP is None or type is ExternalName)"
    )


def test_in_a_registry_file_the_error_names_file_document_object_and_field() -> None:
    good = service("web")
    text = as_list([good, _without(service("cart"), "spec", "ports"), endpoint_slice("web", [])])
    with pytest.raises(RegistryFileError) as raised:
        parse_registry(text, "mesh.yaml")
    assert str(raised.value) == (
        "mesh.yaml: document 1 item 1: Service default/cart: spec.ports is missing"
        " (a Service needs ports unless clusterIP is None or type is ExternalName)"
    )
    assert isinstance(raised.value.__cause__, ObjectError)
