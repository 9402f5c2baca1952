"""`pilot proxy-config clusters|endpoints|listeners|routes|secrets NODE_ID`: from CSDS.

Like `istioctl proxy-config`. The proxy is asked of pilot's CSDS by its exact
node id (`request_for`), with resource contents, and CSDS answers as it does
`pilot proxy-status`: for the proxies this caller may read, and none other.
A proxy is a node id and the identity its streams proved, so two identities
behind one node id are two proxies: `select` wants `--identity` then.

Each table has a row per resource (per endpoint for endpoints, per filter
chain for listeners, per route for routes, per certificate for secrets) and
says what CSDS says of it: its state (SYNCED, STALE, NOT_SENT, ERROR; and
version, for clusters), ERROR what the proxy said when it rejected it (CSDS
`error_state`: Envoy's words for that resource when its NACK named it, else
for the whole update; cut short in `-o table`), and what its contents hold
where CSDS sent them (a cluster's subset, LB and the rest of its traffic policy,
POLICY; an endpoint's locality, with its PRIORITY and WEIGHT for this proxy; a
route's retries, RETRIES, and timeout, TIMEOUT; `routing_rows` words listeners and
routes as istioctl does). A resource CSDS sent no contents of (or none that decode) is one row of
its name and state.
Secrets come from CSDS with their private keys already redacted
(`proxy_status.packed`); `secrets` reads only the certificates, and only
public facts of them (SANs, serial, validity) reach a row.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import TypeVar

from cryptography import x509
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import message

from pilot.debug import routing_rows
from pilot.debug.cluster_policy import cluster_policy
from pilot.debug.tables import Cell, Table
from pilot.logs import clipped
from pilot.security.certs import uri_sans
from pilot.xds import types

M = TypeVar("M", bound=message.Message)

# Envoy's words for a rejected resource, cut in `-o table` (all of them in -o json).
ERROR_CHARS = {"ERROR": 160}
# The policies a chain's RBAC filters come from, cut in `-o table` (all in -o json).
AUTHZ_CHARS = {"AUTHZ": 120}


class ProxyNotFound(LookupError):
    """No proxy with that node id (and identity) that this caller may read."""


class AmbiguousProxy(LookupError):
    """Several identities use the node id; the message names them."""


def request_for(node_id: str) -> csds_pb2.ClientStatusRequest:
    """CSDS for this node id exactly, with resource contents (the rows read them)."""
    request = csds_pb2.ClientStatusRequest()
    request.node_matchers.add().node_id.exact = node_id
    return request


def select(
    response: csds_pb2.ClientStatusResponse, node_id: str, identity: str | None = None
) -> csds_pb2.ClientConfig:
    """The one proxy with this node id (and identity, if given).

    Raises ProxyNotFound, or AmbiguousProxy when several identities use the node
    id and `identity` does not pick one.
    """
    found = [
        config
        for config in response.config
        if config.node.id == node_id and identity in (None, config.client_scope)
    ]
    if not found:
        which = f"node id {_quoted(node_id)}"
        which += f" and identity {_quoted(identity)}" if identity else ""
        raise ProxyNotFound(
            f"no proxy with {which} is connected to pilot (among those this caller may read;"
            " `pilot proxy-status` lists them)"
        )
    if len(found) > 1:
        scopes = sorted(clipped(config.client_scope) or "(none)" for config in found)
        raise AmbiguousProxy(
            f"{len(found)} proxies use node id {_quoted(node_id)}, with identities"
            f" {', '.join(scopes)}:"
            " pick one with --identity"
        )
    return found[0]


def _quoted(text: str) -> str:
    """A node id or identity for an error line: quoted, control characters escaped, cut short."""
    return f"'{clipped(text)}'"


def _held(
    config: csds_pb2.ClientConfig, type_url: str
) -> list[csds_pb2.ClientConfig.GenericXdsConfig]:
    return sorted(
        (c for c in config.generic_xds_configs if c.type_url == type_url), key=lambda c: c.name
    )


def _contents(generic: csds_pb2.ClientConfig.GenericXdsConfig, message_class: type[M]) -> M | None:
    """The resource as CSDS sent it; None when it sent none (NOT_SENT, or excluded)."""
    if not generic.HasField("xds_config"):
        return None
    return routing_rows.unpacked(generic.xds_config, message_class)


def _status(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> str:
    return str(csds_pb2.ConfigStatus.Name(generic.config_status))


def _error(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> str | None:
    """What the proxy said when it rejected this resource (None: it did not)."""
    return generic.error_state.details if generic.HasField("error_state") else None


def _state(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> dict[str, Cell]:
    """The STATUS and ERROR cells every table ends with."""
    return {"status": _status(generic), "error": _error(generic)}


# --- clusters --------------------------------------------------------------------------


def _discovery_type(cluster: cluster_pb2.Cluster | None) -> str | None:
    if cluster is None:
        return None
    if cluster.WhichOneof("cluster_discovery_type") == "cluster_type":
        return str(cluster.cluster_type.name)
    return str(cluster_pb2.Cluster.DiscoveryType.Name(cluster.type))


def _lb_policy(cluster: cluster_pb2.Cluster | None) -> str | None:
    if cluster is None:
        return None
    return str(cluster_pb2.Cluster.LbPolicy.Name(cluster.lb_policy))


def _subset(name: str) -> str | None:
    """The SUBSET part of Istio's `outbound|PORT|SUBSET|HOST` (None: none)."""
    parts = name.split("|")
    return parts[2] or None if len(parts) == 4 else None


def _cluster_record(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> dict[str, Cell]:
    cluster = _contents(generic, cluster_pb2.Cluster)
    return {
        "name": generic.name,
        "subset": _subset(generic.name),
        "type": _discovery_type(cluster),
        "lb": _lb_policy(cluster),
        "policy": cluster_policy(cluster) if cluster is not None else None,
        "version": generic.version_info,
    } | _state(generic)


def clusters(config: csds_pb2.ClientConfig) -> Table:
    """A row per cluster: its name, its DestinationRule subset, how its endpoints are found
    and balanced, the rest of its traffic policy (`cluster_policy`), its state and version."""
    records = [_cluster_record(generic) for generic in _held(config, types.CLUSTER)]
    headers = ("NAME", "SUBSET", "TYPE", "LB", "POLICY", "STATUS", "VERSION", "ERROR")
    return Table.of(headers, records, ERROR_CHARS | {"POLICY": 240})


# --- endpoints -------------------------------------------------------------------------


def _locality(locality: base_pb2.Locality) -> str | None:
    """Istio's `region/zone/subzone`, without the empty parts at its end."""
    parts = [locality.region, locality.zone, locality.sub_zone]
    while parts and not parts[-1]:
        parts.pop()
    return "/".join(parts) or None


def _address(lb_endpoint: endpoint_components_pb2.LbEndpoint) -> str:
    socket = lb_endpoint.endpoint.address.socket_address
    host = f"[{socket.address}]" if ":" in socket.address else socket.address
    return f"{host}:{socket.port_value}"


def _endpoint_records(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> Iterator[dict[str, Cell]]:
    assignment = _contents(generic, endpoint_pb2.ClusterLoadAssignment)
    if assignment is None:
        return
    for locality in assignment.endpoints:
        for lb_endpoint in locality.lb_endpoints:
            yield {
                "endpoint": _address(lb_endpoint),
                "status": health_check_pb2.HealthStatus.Name(lb_endpoint.health_status),
                "cluster": assignment.cluster_name or generic.name,
                "locality": _locality(locality.locality),
                "priority": locality.priority,
                # A locality's share where its cluster balances by locality weight.
                "weight": locality.load_balancing_weight.value
                if locality.HasField("load_balancing_weight")
                else None,
                "error": _error(generic),
            }


def endpoints(config: csds_pb2.ClientConfig) -> Table:
    """A row per endpoint of every cluster: address:port, health, cluster, locality, and its
    locality's priority and weight for this proxy."""
    records = [
        record for generic in _held(config, types.ENDPOINT) for record in _endpoint_records(generic)
    ]
    headers = ("ENDPOINT", "STATUS", "CLUSTER", "LOCALITY", "PRIORITY", "WEIGHT", "ERROR")
    return Table.of(headers, records, ERROR_CHARS)


# --- secrets ---------------------------------------------------------------------------


def _pem_certificates(data: base_pb2.DataSource) -> list[x509.Certificate]:
    pem = data.inline_bytes or data.inline_string.encode()
    try:
        return x509.load_pem_x509_certificates(pem) if pem else []
    except ValueError:
        return []


def _certificates(secret: secret_pb2.Secret | None) -> tuple[str | None, list[x509.Certificate]]:
    """The secret's kind as istioctl names it, and its certificates (a chain: the leaf)."""
    if secret is None:
        return None, []
    if secret.HasField("tls_certificate"):
        chain = _pem_certificates(secret.tls_certificate.certificate_chain)
        return "Cert Chain", chain[:1]
    if secret.HasField("validation_context"):
        return "CA", _pem_certificates(secret.validation_context.trusted_ca)
    return secret.WhichOneof("type"), []


def _time(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _certificate_cells(certificate: x509.Certificate, now: datetime.datetime) -> dict[str, Cell]:
    not_before, not_after = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    return {
        "san": ",".join(uri_sans(certificate)) or None,
        "valid_cert": not_before <= now <= not_after,
        "serial_number": format(certificate.serial_number, "x"),
        "not_after": _time(not_after),
        "not_before": _time(not_before),
    }


def secrets(config: csds_pb2.ClientConfig, now: datetime.datetime | None = None) -> Table:
    """A row per certificate of every secret: its SPIFFE SANs, serial and validity."""
    now = now or datetime.datetime.now(datetime.UTC)
    records: list[dict[str, Cell]] = []
    for generic in _held(config, types.SECRET):
        kind, certificates = _certificates(_contents(generic, secret_pb2.Secret))
        row: dict[str, Cell] = {
            "resource_name": generic.name,
            "type": kind,
        } | _state(generic)
        records.extend(row | _certificate_cells(c, now) for c in certificates)
        if not certificates:
            records.append(row)
    headers = ("RESOURCE NAME", "TYPE", "STATUS", "SAN", "VALID CERT", "SERIAL NUMBER")
    return Table.of((*headers, "NOT AFTER", "NOT BEFORE", "ERROR"), records, ERROR_CHARS)


# --- listeners -------------------------------------------------------------------------


def _listener_records(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> list[dict[str, Cell]]:
    """A row per filter chain (the default one last); one row of name and state without
    contents."""
    known: dict[str, Cell] = {"name": generic.name} | _state(generic)
    listener = _contents(generic, listener_pb2.Listener)
    if listener is None:
        return [known]
    where: dict[str, Cell] = {
        "addresses": routing_rows.addresses(listener),
        "port": routing_rows.port(listener),
    }
    chains = routing_rows.filter_chains(listener)
    if not chains:
        return [where | known]
    return [
        where
        | {
            "match": routing_rows.chain_match(chain.filter_chain_match),
            "destination": routing_rows.chain_destination(chain),
            "authz": routing_rows.chain_authz(chain),
        }
        | known
        for chain in chains
    ]


def _by_port(records: list[dict[str, Cell]]) -> tuple[bool, int, str, str]:
    port = records[0].get("port")
    where = (port is None, port if isinstance(port, int) else 0, str(records[0].get("addresses")))
    return (*where, str(records[0]["name"]))


def listeners(config: csds_pb2.ClientConfig) -> Table:
    """A row per filter chain of every listener, by port then address, as istioctl prints."""
    per_listener = sorted(
        (_listener_records(generic) for generic in _held(config, types.LISTENER)), key=_by_port
    )
    records = [record for rows in per_listener for record in rows]
    headers = ("ADDRESSES", "PORT", "MATCH", "DESTINATION", "AUTHZ", "NAME", "STATUS", "ERROR")
    return Table.of(headers, records, ERROR_CHARS | AUTHZ_CHARS)


# --- routes ----------------------------------------------------------------------------


def _route_records(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> list[dict[str, Cell]]:
    """A row per route of every virtual host; one row of name and state without contents."""
    known: dict[str, Cell] = {"name": generic.name}
    state = _state(generic)
    config = _contents(generic, route_pb2.RouteConfiguration)
    if config is None:
        return [known | state]
    return [
        known
        | {
            "vhost_name": host.name,
            "domains": routing_rows.domains(host.domains),
            "match": match,
            "destination": destination,
            "retries": retries,
            "timeout": timeout,
        }
        | state
        for host in config.virtual_hosts
        for match, destination, retries, timeout in routing_rows.virtual_host_routes(host)
    ] or [known | state]


def _route_order(generic: csds_pb2.ClientConfig.GenericXdsConfig) -> tuple[bool, int, str]:
    """Numeric names (Istio's ports) in numeric order, then the others by name."""
    numeric = generic.name.isdecimal() and len(generic.name) < 10
    return (not numeric, int(generic.name) if numeric else 0, generic.name)


def routes(config: csds_pb2.ClientConfig) -> Table:
    """A row per route of every route configuration: its virtual host, domains, match, target
    (weights too), retries, timeout."""
    held = sorted(_held(config, types.ROUTE), key=_route_order)
    records = [record for generic in held for record in _route_records(generic)]
    headers = (
        "NAME", "VHOST NAME", "DOMAINS", "MATCH", "DESTINATION", "RETRIES", "TIMEOUT", "STATUS",
        "ERROR",
    )  # fmt: skip
    return Table.of(headers, records, ERROR_CHARS)


TABLES: dict[str, Callable[[csds_pb2.ClientConfig], Table]] = {
    "clusters": clusters,
    "endpoints": endpoints,
    "listeners": listeners,
    "routes": routes,
    "secrets": secrets,
}
