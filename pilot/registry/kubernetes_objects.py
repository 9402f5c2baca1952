"""Turn Kubernetes-shaped objects (dicts, as YAML or the API gives them) into registry values.

Accepts what `kubectl get svc,endpointslices,endpoints,pods -A -o yaml` prints
and what the API server returns. Anything malformed raises `ObjectError` saying
which object and which field; unknown kinds are the caller's business. Each
parser stamps the values with the id of the cluster the object came from.

A field that Kubernetes' own validation requires and pilot reads is required here
too, and its absence raises `MissingField` (an `ObjectError`) naming it: an API
server never sends such an object, so one without it is a hand-written mistake
(a Service without `spec` or `spec.ports` otherwise loaded as a service with no
port, silently). They are: a Service's `spec.ports` (unless headless,
`clusterIP: None`, or `type: ExternalName`, as Kubernetes allows), each port's
`port`, and its `name` when there is more than one; an EndpointSlice's
`addressType` and each endpoint's `addresses` (its `endpoints` may be empty or
null); a legacy Endpoints' addresses' `ip` and ports' `port`; a Pod's `spec` and
`status` (the API server sets it at creation, and the pod's addresses are in it),
and each container port's `containerPort`. Fields Kubernetes requires that pilot
never reads (a container's image, an ExternalName's `externalName`) are not
checked, nor a Pod's `spec.containers`: pilot reads them only for named ports.

An endpoint's `targetRef` (of an EndpointSlice endpoint, or of a legacy
Endpoints address) is kept as the name of the Pod it names (`pod_name`), and
only within the object's own namespace: a targetRef to a Pod of another
namespace becomes NO_POD (the endpoint has no pod), and a targetRef to any
other kind is as if absent (its pod is found by address), as Istio reads them.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Mapping
from typing import Any

from pilot.registry.model import (
    NO_POD,
    Endpoint,
    EndpointGroup,
    EndpointPort,
    EndpointSet,
    EndpointSetKey,
    Node,
    NodeKey,
    Pod,
    PodKey,
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
    """An object is not a valid Service, EndpointSlice, Endpoints, Node or Pod."""


class MissingField(ObjectError):
    """An object lacks a field Kubernetes requires of it (`field`, as a path)."""

    def __init__(self, obj: Obj, field: str, why: str = "") -> None:
        super().__init__(f"{object_label(obj)}: {field} is missing{f' ({why})' if why else ''}")
        self.field = field


def object_label(obj: Obj) -> str:
    """`Kind namespace/name` for messages, as far as the object says: each part one line of
    printable characters, bounded (a name may be anything until a parser checks it)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    kind, namespace = obj.get("kind", "?"), meta.get("namespace", "default")
    return f"{_printable(kind)} {_printable(namespace)}/{_printable(meta.get('name', '?'))}"


_LABEL_PART = 253  # the longest name Kubernetes allows


def _printable(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)[: _LABEL_PART * 2]
    shown = "".join(ch if ch.isprintable() else "?" for ch in text[:_LABEL_PART])
    return shown if len(text) <= _LABEL_PART else shown + "..."


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
    if value is None:
        raise MissingField(obj, where)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise _fail(obj, f"{where} must be a port number (1-65535), got {value!r}")
    return value


def _condition(conditions: Mapping[str, Any], name: str, default: bool) -> bool:
    value = conditions.get(name)
    return default if value is None else bool(value)


_PORTS_WHY = "a Service needs ports unless clusterIP is None or type is ExternalName"


def parse_service(obj: Obj, cluster: str = "") -> Service:
    """A Service; ExternalName services have no endpoints and keep no ports."""
    namespace, name = _metadata(obj)
    spec = obj.get("spec")
    if spec is None:
        raise MissingField(obj, "spec", _PORTS_WHY)
    if not isinstance(spec, Mapping):
        raise _fail(obj, "spec must be a mapping")
    cluster_ip = _cluster_ip(obj, spec.get("clusterIP"))
    if spec.get("type") == "ExternalName":
        ports: tuple[ServicePort, ...] = ()
    else:
        ports = _service_ports(obj, spec.get("ports"), headless=spec.get("clusterIP") == "None")
    return Service(ServiceKey(namespace, name), ports, cluster, cluster_ip)


def _service_ports(obj: Obj, raw_ports: Any, headless: bool) -> tuple[ServicePort, ...]:
    """spec.ports: required but for a headless Service; each named when there are two or
    more (endpoints find their port by its name), as Kubernetes validates them."""
    raw_list = _list(obj, raw_ports, "spec.ports")
    if not raw_list and not headless:
        raise MissingField(obj, "spec.ports", _PORTS_WHY)
    ports = []
    for i, raw in enumerate(raw_list):
        if not isinstance(raw, Mapping):
            raise _fail(obj, f"spec.ports[{i}] must be a mapping")
        if len(raw_list) > 1 and not raw.get("name"):
            raise MissingField(
                obj, f"spec.ports[{i}].name", "required when a Service has two ports or more"
            )
        ports.append(
            ServicePort(
                name=str(raw.get("name") or ""),
                port=_port_number(obj, raw.get("port"), f"spec.ports[{i}].port"),
                protocol=str(raw.get("protocol") or "TCP"),
                app_protocol=str(raw.get("appProtocol") or ""),
            )
        )
    return tuple(ports)


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


def _endpoint_ports(
    obj: Obj, raw_ports: Any, where: str, numbered: bool = False
) -> tuple[EndpointPort, ...]:
    """A slice's or a subset's ports; `numbered`: each must have its number (a legacy
    Endpoints' must; a slice port without one means the Service port has no target)."""
    ports = []
    for i, raw in enumerate(_list(obj, raw_ports, where)):
        if not isinstance(raw, Mapping):
            raise _fail(obj, f"{where}[{i}] must be a mapping")
        if raw.get("port") is None and not numbered:
            continue  # a slice port with no number: the Service port has no target
        ports.append(
            EndpointPort(
                name=str(raw.get("name") or ""),
                port=_port_number(obj, raw.get("port"), f"{where}[{i}].port"),
                protocol=str(raw.get("protocol") or "TCP"),
            )
        )
    return tuple(ports)


def _target_pod(obj: Obj, ref: Any, namespace: str, where: str) -> str | None:
    """The name of the Pod a targetRef names in `namespace` (`Endpoint.pod_name`): None
    when it names no Pod, NO_POD when it names a Pod of another namespace."""
    if ref is None:
        return None
    if not isinstance(ref, Mapping):
        raise _fail(obj, f"{where} must be a mapping")
    if ref.get("kind") != "Pod":
        return None  # a VM, a Node, or nothing said: the endpoint's pod is found by address
    name, in_namespace = ref.get("name"), ref.get("namespace") or namespace
    if not isinstance(name, str) or not isinstance(in_namespace, str):
        raise _fail(obj, f"{where}.name and {where}.namespace must be strings")
    if in_namespace != namespace:
        return NO_POD  # an object names its own namespace's pods only
    return _checked(obj, name, _DNS_SUBDOMAIN, f"{where}.name")


def _slice_endpoint(obj: Obj, raw: Any, i: int, namespace: str) -> Endpoint:
    if not isinstance(raw, Mapping):
        raise _fail(obj, f"endpoints[{i}] must be a mapping")
    addresses = _list(obj, raw.get("addresses"), f"endpoints[{i}].addresses")
    if not addresses:
        raise MissingField(obj, f"endpoints[{i}].addresses")
    if not all(isinstance(a, str) and a for a in addresses):
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
        pod_name=_target_pod(obj, raw.get("targetRef"), namespace, f"endpoints[{i}].targetRef"),
    )


def parse_endpoint_slice(obj: Obj, cluster: str = "") -> EndpointSet | None:
    """An EndpointSlice; None for FQDN slices, which EDS cannot carry as IPs."""
    namespace, name = _metadata(obj)
    labels = (obj.get("metadata") or {}).get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(service, str) or not service:
        raise _fail(obj, f"label {SERVICE_NAME_LABEL} is missing")
    address_type = obj.get("addressType")
    if address_type is None or address_type == "":
        raise MissingField(obj, "addressType", "IPv4, IPv6 or FQDN")
    if not isinstance(address_type, str):
        raise _fail(obj, "addressType must be a string")
    if address_type not in _IP_ADDRESS_TYPES:
        return None
    endpoints = tuple(
        _slice_endpoint(obj, raw, i, namespace)
        for i, raw in enumerate(_list(obj, obj.get("endpoints"), "endpoints"))
    )
    group = EndpointGroup(_endpoint_ports(obj, obj.get("ports"), "ports"), endpoints)
    key = EndpointSetKey("EndpointSlice", namespace, name, cluster)
    return EndpointSet(key, ServiceKey(namespace, service), (group,))


def _legacy_addresses(
    obj: Obj, raw: Any, where: str, ready: bool, namespace: str
) -> list[Endpoint]:
    found = []
    for i, address in enumerate(_list(obj, raw, where)):
        ip = address.get("ip") if isinstance(address, Mapping) else None
        if not isinstance(ip, str) or not ip:
            raise MissingField(obj, f"{where}[{i}].ip")
        node_name = str(address.get("nodeName") or "")
        pod_name = _target_pod(obj, address.get("targetRef"), namespace, f"{where}[{i}].targetRef")
        found.append(
            Endpoint((ip,), ready=ready, serving=ready, node_name=node_name, pod_name=pod_name)
        )
    return found


def parse_endpoints(obj: Obj, cluster: str = "") -> EndpointSet:
    """A legacy v1 Endpoints object: each subset is a group; notReadyAddresses are not ready."""
    namespace, name = _metadata(obj)
    groups = []
    for i, subset in enumerate(_list(obj, obj.get("subsets"), "subsets")):
        if not isinstance(subset, Mapping):
            raise _fail(obj, f"subsets[{i}] must be a mapping")
        where = f"subsets[{i}]"
        endpoints = _legacy_addresses(
            obj, subset.get("addresses"), f"{where}.addresses", True, namespace
        )
        endpoints += _legacy_addresses(
            obj, subset.get("notReadyAddresses"), f"{where}.notReadyAddresses", False, namespace
        )
        ports = _endpoint_ports(obj, subset.get("ports"), f"{where}.ports", numbered=True)
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


# -- Pods ---------------------------------------------------------------------------
# Only what auto mTLS and workload selectors need is kept. Every name kept becomes part of a
# SPIFFE URI in a cluster's SANs, so each is checked as Kubernetes checks it, and every list
# is bounded: whoever writes a Pod (a remote cluster, the registry file) gets an error,
# never a larger pilot.

TLS_MODE_LABEL = "security.istio.io/tlsMode"
ISTIO_TLS_MODE = "istio"
MAX_POD_IPS = 2  # Kubernetes allows one address per family
MAX_POD_PORTS = 256  # container ports of one pod
MAX_POD_LABELS = 64  # labels of one pod kept for workload selectors (more: none kept)
MAX_LABEL_CHARS = 317  # a label key: a 253-character prefix, '/', 63 characters
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")
_PHASES = frozenset({"Pending", "Running", "Succeeded", "Failed", "Unknown"})


def _checked(obj: Obj, value: str, rule: re.Pattern[str], what: str) -> str:
    if not rule.fullmatch(value):
        raise _fail(obj, f"{what} is not a valid name: {value[:64]!r}")
    return value


def _shared(obj: Obj, value: str, rule: re.Pattern[str], what: str) -> str:
    """A checked name many pods share (a namespace, a service account): held once."""
    return sys.intern(_checked(obj, value, rule, what))


def _pod_ips(obj: Obj, status: Mapping[str, Any]) -> tuple[str, ...]:
    """status.podIPs (else status.podIP), each a valid address, normalised, at most two."""
    raw = _list(obj, status.get("podIPs"), "status.podIPs")
    if len(raw) > MAX_POD_IPS:
        raise _fail(obj, f"status.podIPs lists {len(raw)} addresses (at most {MAX_POD_IPS})")
    values = [entry.get("ip") if isinstance(entry, Mapping) else entry for entry in raw]
    if not values and status.get("podIP"):
        values = [status.get("podIP")]
    ips: list[str] = []
    for value in values:
        if not isinstance(value, str) or len(value) > 64:
            raise _fail(obj, "status.podIPs must list IP addresses")
        try:
            ip = str(ipaddress.ip_address(value))
        except ValueError:
            raise _fail(obj, f"status.podIPs: {value!r} is not an IP address") from None
        if ip not in ips:
            ips.append(ip)
    return tuple(ips)


def _container_ports(obj: Obj, spec: Mapping[str, Any]) -> tuple[EndpointPort, ...]:
    ports: list[EndpointPort] = []
    for i, container in enumerate(_list(obj, spec.get("containers"), "spec.containers")):
        if not isinstance(container, Mapping):
            raise _fail(obj, f"spec.containers[{i}] must be a mapping")
        where = f"spec.containers[{i}].ports"
        for j, raw in enumerate(_list(obj, container.get("ports"), where)):
            if not isinstance(raw, Mapping):
                raise _fail(obj, f"{where}[{j}] must be a mapping")
            if len(ports) == MAX_POD_PORTS:
                raise _fail(obj, f"more than {MAX_POD_PORTS} container ports")
            name = raw.get("name") or ""
            if name:
                name = _shared(obj, str(name), _PORT_NAME, f"{where}[{j}].name")
            protocol = raw.get("protocol") or "TCP"
            if not isinstance(protocol, str) or protocol not in {"TCP", "UDP", "SCTP"}:
                raise _fail(obj, f"{where}[{j}].protocol must be TCP, UDP or SCTP")
            number = _port_number(obj, raw.get("containerPort"), f"{where}[{j}].containerPort")
            ports.append(EndpointPort(name, number, sys.intern(protocol)))
    return tuple(ports)


def _pod_labels(labels: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """Labels as sorted pairs of shared strings (replicas of one workload share them);
    None where they are not kept (too many, too long, not strings): the pod stays (its
    IPs and sidecar matter to auto mTLS), and no selector can be told to match it."""
    if len(labels) > MAX_POD_LABELS:
        return None
    pairs = []
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return None
        if len(key) > MAX_LABEL_CHARS or len(value) > MAX_LABEL_CHARS:
            return None
        pairs.append((sys.intern(key), sys.intern(value)))
    return tuple(sorted(pairs))


def parse_pod(obj: Obj, cluster: str = "") -> Pod:
    """A Pod's IPs, service account, labels, phase and container ports.

    A pod on the host's network has no address of its own (it shares its Node's),
    so it keeps none: no endpoint is its.
    """
    namespace, name = _metadata(obj)
    meta: Mapping[str, Any] = obj["metadata"]
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise _fail(obj, "metadata.labels must be a mapping")
    spec, status = obj.get("spec"), obj.get("status")
    if spec is None:
        raise MissingField(obj, "spec", "a Pod needs spec.containers")
    if status is None:
        raise MissingField(obj, "status", "the API server sets it: it holds the pod's addresses")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        raise _fail(obj, "spec and status must be mappings")
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    if not isinstance(account, str):
        raise _fail(obj, "spec.serviceAccountName must be a string")
    phase = status.get("phase") or ""
    if not isinstance(phase, str) or (phase and phase not in _PHASES):
        phase = "Unknown"  # what the API server says of a pod it cannot tell
    ips = () if spec.get("hostNetwork") is True else _pod_ips(obj, status)
    return Pod(
        PodKey(
            sys.intern(cluster),
            _shared(obj, namespace, _DNS_LABEL, "metadata.namespace"),
            _checked(obj, name, _DNS_SUBDOMAIN, "metadata.name"),
        ),
        ips,
        _shared(obj, account, _DNS_SUBDOMAIN, "spec.serviceAccountName"),
        labels.get(TLS_MODE_LABEL) == ISTIO_TLS_MODE,
        sys.intern(phase),
        _container_ports(obj, spec),
        _pod_labels(labels),
    )
