"""Turn Kubernetes-shaped objects (dicts, as YAML or the API gives them) into registry values.

Accepts what `kubectl get svc,endpointslices,endpoints -A -o yaml` prints and
what the API server returns. Anything malformed raises `ObjectError` saying
which object and which field; unknown kinds are the caller's business. Each
parser stamps the values with the id of the cluster the object came from.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from pilot.registry.model import (
    Endpoint,
    EndpointGroup,
    EndpointPort,
    EndpointSet,
    EndpointSetKey,
    Node,
    NodeKey,
    Service,
    ServiceKey,
    ServicePort,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
REGION_LABEL = "topology.kubernetes.io/region"
ZONE_LABEL = "topology.kubernetes.io/zone"
SUPPORTED_KINDS = frozenset({"Service", "EndpointSlice", "Endpoints"})
_IP_ADDRESS_TYPES = frozenset({"IPv4", "IPv6"})

Obj = Mapping[str, Any]


class ObjectError(ValueError):
    """An object is not a valid Service, EndpointSlice or Endpoints."""


def object_label(obj: Obj) -> str:
    """`Kind namespace/name` for messages, as far as the object says."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    return f"{obj.get('kind', '?')} {meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def _fail(obj: Obj, message: str) -> ObjectError:
    return ObjectError(f"{object_label(obj)}: {message}")


def _metadata(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise _fail(obj, "metadata.name is missing")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise _fail(obj, "metadata.namespace must be a string")
    return namespace, meta["name"]


def _list(obj: Obj, value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(obj, f"{where} must be a list")
    return value


def _port_number(obj: Obj, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise _fail(obj, f"{where} must be a port number (1-65535), got {value!r}")
    return value


def _condition(conditions: Mapping[str, Any], name: str, default: bool) -> bool:
    value = conditions.get(name)
    return default if value is None else bool(value)


def parse_service(obj: Obj, cluster: str = "") -> Service:
    """A Service; ExternalName services have no endpoints and keep no ports."""
    namespace, name = _metadata(obj)
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise _fail(obj, "spec must be a mapping")
    ports = []
    if spec.get("type") != "ExternalName":
        for i, raw in enumerate(_list(obj, spec.get("ports"), "spec.ports")):
            if not isinstance(raw, Mapping):
                raise _fail(obj, f"spec.ports[{i}] must be a mapping")
            ports.append(
                ServicePort(
                    name=str(raw.get("name") or ""),
                    port=_port_number(obj, raw.get("port"), f"spec.ports[{i}].port"),
                    protocol=str(raw.get("protocol") or "TCP"),
                    app_protocol=str(raw.get("appProtocol") or ""),
                )
            )
    cluster_ip = _cluster_ip(obj, spec.get("clusterIP"))
    return Service(ServiceKey(namespace, name), tuple(ports), cluster, cluster_ip)


def _cluster_ip(obj: Obj, value: Any) -> str:
    """spec.clusterIP as an address ("" for a headless Service, "None", or none given).

    It names a listener (`CLUSTERIP_PORT`) and a route domain, so anything but an
    address is refused here rather than carried into Envoy's configuration.
    """
    if value is None or value in {"", "None"}:
        return ""
    if not isinstance(value, str) or len(value) > 64:
        raise _fail(obj, "spec.clusterIP must be an IP address or None")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise _fail(obj, f"spec.clusterIP must be an IP address or None, got {value!r}") from None


def _endpoint_ports(obj: Obj, raw_ports: Any, where: str) -> tuple[EndpointPort, ...]:
    ports = []
    for i, raw in enumerate(_list(obj, raw_ports, where)):
        if not isinstance(raw, Mapping):
            raise _fail(obj, f"{where}[{i}] must be a mapping")
        if raw.get("port") is None:
            continue  # a slice port with no number: the Service port has no target
        ports.append(
            EndpointPort(
                name=str(raw.get("name") or ""),
                port=_port_number(obj, raw.get("port"), f"{where}[{i}].port"),
                protocol=str(raw.get("protocol") or "TCP"),
            )
        )
    return tuple(ports)


def _slice_endpoint(obj: Obj, raw: Any, i: int) -> Endpoint:
    if not isinstance(raw, Mapping):
        raise _fail(obj, f"endpoints[{i}] must be a mapping")
    addresses = _list(obj, raw.get("addresses"), f"endpoints[{i}].addresses")
    if not addresses or not all(isinstance(a, str) and a for a in addresses):
        raise _fail(obj, f"endpoints[{i}].addresses must list at least one address")
    conditions = raw.get("conditions") or {}
    if not isinstance(conditions, Mapping):
        raise _fail(obj, f"endpoints[{i}].conditions must be a mapping")
    ready = _condition(conditions, "ready", True)
    return Endpoint(
        addresses=tuple(addresses),
        ready=ready,
        serving=_condition(conditions, "serving", ready),
        terminating=_condition(conditions, "terminating", False),
        zone=str(raw.get("zone") or ""),
        node_name=str(raw.get("nodeName") or ""),
    )


def parse_endpoint_slice(obj: Obj, cluster: str = "") -> EndpointSet | None:
    """An EndpointSlice; None for FQDN slices, which EDS cannot carry as IPs."""
    namespace, name = _metadata(obj)
    labels = (obj.get("metadata") or {}).get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(service, str) or not service:
        raise _fail(obj, f"label {SERVICE_NAME_LABEL} is missing")
    address_type = obj.get("addressType", "IPv4")
    if not isinstance(address_type, str):
        raise _fail(obj, "addressType must be a string")
    if address_type not in _IP_ADDRESS_TYPES:
        return None
    endpoints = tuple(
        _slice_endpoint(obj, raw, i)
        for i, raw in enumerate(_list(obj, obj.get("endpoints"), "endpoints"))
    )
    group = EndpointGroup(_endpoint_ports(obj, obj.get("ports"), "ports"), endpoints)
    key = EndpointSetKey("EndpointSlice", namespace, name, cluster)
    return EndpointSet(key, ServiceKey(namespace, service), (group,))


def _legacy_addresses(obj: Obj, raw: Any, where: str, ready: bool) -> list[Endpoint]:
    found = []
    for i, address in enumerate(_list(obj, raw, where)):
        ip = address.get("ip") if isinstance(address, Mapping) else None
        if not isinstance(ip, str) or not ip:
            raise _fail(obj, f"{where}[{i}].ip is missing")
        node_name = str(address.get("nodeName") or "")
        found.append(Endpoint((ip,), ready=ready, serving=ready, node_name=node_name))
    return found


def parse_endpoints(obj: Obj, cluster: str = "") -> EndpointSet:
    """A legacy v1 Endpoints object: each subset is a group; notReadyAddresses are not ready."""
    namespace, name = _metadata(obj)
    groups = []
    for i, subset in enumerate(_list(obj, obj.get("subsets"), "subsets")):
        if not isinstance(subset, Mapping):
            raise _fail(obj, f"subsets[{i}] must be a mapping")
        where = f"subsets[{i}]"
        endpoints = _legacy_addresses(obj, subset.get("addresses"), f"{where}.addresses", True)
        endpoints += _legacy_addresses(
            obj, subset.get("notReadyAddresses"), f"{where}.notReadyAddresses", False
        )
        ports = _endpoint_ports(obj, subset.get("ports"), f"{where}.ports")
        groups.append(EndpointGroup(ports, tuple(endpoints)))
    key = EndpointSetKey("Endpoints", namespace, name, cluster)
    return EndpointSet(key, ServiceKey(namespace, name), tuple(groups))


def parse_node(obj: Obj, cluster: str = "") -> Node:
    """A Node's locality: its region and zone labels, nothing else of it is kept."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise _fail(obj, "metadata.name is missing")
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise _fail(obj, "metadata.labels must be a mapping")
    region, zone = labels.get(REGION_LABEL), labels.get(ZONE_LABEL)
    return Node(
        NodeKey(cluster, meta["name"]),
        region if isinstance(region, str) else "",
        zone if isinstance(zone, str) else "",
    )
