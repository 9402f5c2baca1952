"""How `pilot proxy-config listeners|routes` words a listener's filter chains and a route.

istioctl's words, so its habits carry over: a filter chain's MATCH is what
its `filter_chain_match` asks for (`SNI: a,b; Trans: tls; App: istio,h2;
Addr: 10.0.0.0/8:9080`, `Addr: *:9080` for a port alone, `ALL` for nothing)
and its DESTINATION where its network filter sends the connection (`Route:
NAME` for an HTTP connection manager reading RDS, `Cluster: NAME` for a TCP
proxy, Istio's own clusters such as `PassthroughCluster` by their bare names,
`Inline Route: ...` for routes carried in the listener). A route's MATCH is its
path (`/*` for prefix `/`) and its header and query conditions in brackets, its
DESTINATION its cluster, its weighted clusters with their weights or its answer,
its RETRIES how many times and on what it tries again (`2 on connect-failure,...;
another host` for Istio's default: `previous_hosts` picks a host not tried), its
TIMEOUT the route's (`none` for Istio's 0).

Everything here reads the chain's match and filters, never a listener's name:
a listener holding a hundred chains (a `virtualInbound`) is a hundred rows,
each saying what it matches. Filters are recognised by their config's type,
as Envoy does, not by the name a control plane gave them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import any_pb2, message

M = TypeVar("M", bound=message.Message)

# How many of a virtual host's domains a cell names before "+ N more...", as istioctl.
DOMAINS_SHOWN = 2


def unpacked(packed: any_pb2.Any, message_class: type[M]) -> M | None:
    """`packed` as `message_class`; None when it is another type or does not decode."""
    if packed.type_url.rpartition("/")[2] != message_class.DESCRIPTOR.full_name:
        return None
    try:
        resource = message_class.FromString(packed.value)
    except message.DecodeError:
        return None
    return resource


# --- listeners ---------------------------------------------------------------------------


def _address(address: address_pb2.Address) -> str:
    kind = address.WhichOneof("address")
    if kind == "pipe":
        return str(address.pipe.path)
    if kind == "envoy_internal_address":
        return str(address.envoy_internal_address.server_listener_name)
    return str(address.socket_address.address)


def addresses(listener: listener_pb2.Listener) -> str:
    """The listener's address and its additional ones, comma-separated."""
    extra = (_address(a.address) for a in listener.additional_addresses)
    return ",".join([_address(listener.address), *extra])


def port(listener: listener_pb2.Listener) -> int | None:
    """The listener's port (None for a pipe or an internal listener)."""
    socket = listener.address.socket_address
    return socket.port_value if listener.address.HasField("socket_address") else None


def filter_chains(listener: listener_pb2.Listener) -> list[listener_components_pb2.FilterChain]:
    """Every chain a connection may take: the matched ones, then the default (as istioctl)."""
    chains = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    return chains


def _addr(match: listener_components_pb2.FilterChainMatch) -> str | None:
    suffix = f":{match.destination_port.value}" if match.HasField("destination_port") else ""
    if match.prefix_ranges:
        ranges = ",".join(f"{r.address_prefix}/{r.prefix_len.value}" for r in match.prefix_ranges)
        return f"Addr: {ranges}{suffix}"
    return f"Addr: *{suffix}" if suffix else None


def chain_match(match: listener_components_pb2.FilterChainMatch) -> str:
    """What a chain's `filter_chain_match` asks of a connection, `ALL` when nothing."""
    parts = [
        f"SNI: {','.join(match.server_names)}" if match.server_names else None,
        f"Trans: {match.transport_protocol}" if match.transport_protocol else None,
        f"App: {','.join(match.application_protocols)}" if match.application_protocols else None,
        _addr(match),
    ]
    return "; ".join(part for part in parts if part) or "ALL"


def cluster_cell(cluster: str) -> str:
    """A cluster as istioctl names it: Istio's own (PassthroughCluster...) by their bare name."""
    return cluster if "Cluster" in cluster else f"Cluster: {cluster}"


def _weighted(clusters: Iterable[tuple[str, int]]) -> str:
    """Weighted clusters with their weights: `Clusters: A=80,B=20` (weights are relative)."""
    return f"Clusters: {','.join(f'{name}={weight}' for name, weight in clusters)}"


def _tcp_destination(proxy: tcp_proxy_pb2.TcpProxy) -> str:
    if proxy.WhichOneof("cluster_specifier") == "weighted_clusters":
        return _weighted((c.name, c.weight) for c in proxy.weighted_clusters.clusters)
    return cluster_cell(proxy.cluster)


def _http_destination(manager: hcm_pb2.HttpConnectionManager) -> str:
    which = manager.WhichOneof("route_specifier")
    if which == "rds":
        return f"Route: {manager.rds.route_config_name}"
    if which == "route_config":
        return inline_route(manager.route_config)
    return "HTTP"


def chain_destination(chain: listener_components_pb2.FilterChain) -> str:
    """Where a chain sends a connection: the first HTTP manager's routes or TCP proxy's cluster."""
    for network_filter in chain.filters:
        manager = unpacked(network_filter.typed_config, hcm_pb2.HttpConnectionManager)
        if manager is not None:
            return _http_destination(manager)
        proxy = unpacked(network_filter.typed_config, tcp_proxy_pb2.TcpProxy)
        if proxy is not None:
            return _tcp_destination(proxy)
    return "Non-HTTP/Non-TCP"


_RBAC_FILTERS = frozenset({"envoy.filters.network.rbac", "envoy.filters.http.rbac"})
_JWT_FILTERS = frozenset({"envoy.filters.http.jwt_authn"})


def _runs(chain: listener_components_pb2.FilterChain, names: frozenset[str]) -> bool:
    for network_filter in chain.filters:
        if network_filter.name in names:
            return True
        manager = unpacked(network_filter.typed_config, hcm_pb2.HttpConnectionManager)
        if manager is not None and any(f.name in names for f in manager.http_filters):
            return True
    return False


def _named(chain: listener_components_pb2.FilterChain, key: str) -> list[str] | None:
    held = chain.metadata.filter_metadata.get("pilot")
    names = held.fields.get(key) if held is not None else None
    return None if names is None else [v.string_value for v in names.list_value.values]


def chain_authz(chain: listener_components_pb2.FilterChain) -> str | None:
    """The RequestAuthentications whose JWTs a chain verifies (`JWT ns/name`) and the
    AuthorizationPolicies whose RBAC filters it runs (from its metadata, where pilot names
    them); None when it runs neither."""
    parts = []
    if _runs(chain, _JWT_FILTERS):
        parts += [f"JWT {name}" for name in _named(chain, "request_authentications") or ["?"]]
    if _runs(chain, _RBAC_FILTERS):
        parts += _named(chain, "authorization_policies") or ["RBAC"]
    return "; ".join(parts) if parts else None


# --- routes ------------------------------------------------------------------------------


_PATHS: dict[str, Callable[[rc_pb2.RouteMatch], str]] = {
    "prefix": lambda match: f"{match.prefix}*",
    "path": lambda match: str(match.path),
    "safe_regex": lambda match: f"regex {match.safe_regex.regex}",
    "path_separated_prefix": lambda match: f"{match.path_separated_prefix}/*",
    "connect_matcher": lambda match: "CONNECT",
}


def route_path(match: rc_pb2.RouteMatch) -> str:
    """A route's path condition: `/*` for prefix `/`, the path, or the regex."""
    describe = _PATHS.get(match.WhichOneof("path_specifier") or "")
    return describe(match) if describe is not None else ""


def _string_condition(name: str, matcher: string_pb2.StringMatcher) -> str:
    kind = matcher.WhichOneof("match_pattern")
    if kind == "exact":
        return f"{name}={matcher.exact}"
    if kind == "prefix":
        return f"{name}^={matcher.prefix}"
    if kind == "safe_regex":
        return f"{name}~={matcher.safe_regex.regex}"
    return name


def _header_condition(header: rc_pb2.HeaderMatcher) -> str:
    text = (
        _string_condition(header.name, header.string_match)
        if header.HasField("string_match")
        else header.name
    )
    return f"!{text}" if header.invert_match else text


def route_match(match: rc_pb2.RouteMatch) -> str:
    """A route's path, then its header and query conditions: `/* [end-user=jason]`,
    `/api* [:method=GET; ?q^=x]` (`^=` a prefix, `~=` a regex, `!` none such)."""
    conditions = [_header_condition(h) for h in match.headers]
    conditions += [
        "?" + (_string_condition(q.name, q.string_match) if q.HasField("string_match") else q.name)
        for q in match.query_parameters
    ]
    path = route_path(match)
    return f"{path} [{'; '.join(conditions)}]" if conditions else path


def route_destination(route: rc_pb2.Route) -> str:
    """Where a route sends a request: a cluster, several, or the answer it gives itself."""
    action = route.WhichOneof("action")
    if action == "route":
        specifier = route.route.WhichOneof("cluster_specifier")
        if specifier == "cluster":
            return cluster_cell(route.route.cluster)
        if specifier == "weighted_clusters":
            clusters = route.route.weighted_clusters.clusters
            return _weighted((c.name, c.weight.value) for c in clusters)
        if specifier == "cluster_header":
            return f"Cluster header: {route.route.cluster_header}"
        return "Route"
    if action == "direct_response":
        return f"Direct response: {route.direct_response.status}"
    if action == "redirect":
        return "Redirect"
    return action or ""


def _match_all_cluster(config: route_pb2.RouteConfiguration) -> str | None:
    """One virtual host `*` with one route `/` to one cluster: istioctl names the cluster."""
    if len(config.virtual_hosts) != 1:
        return None
    host = config.virtual_hosts[0]
    if list(host.domains) != ["*"] or len(host.routes) != 1:
        return None
    route = host.routes[0]
    if route.match.WhichOneof("path_specifier") != "prefix" or route.match.prefix != "/":
        return None
    if route.WhichOneof("action") != "route" or not route.route.cluster:
        return None
    return cluster_cell(route.route.cluster)


def inline_route(config: route_pb2.RouteConfiguration) -> str:
    """Routes a listener carries itself: the cluster if one takes all, else each host's paths."""
    cluster = _match_all_cluster(config)
    if cluster is not None:
        return cluster
    hosts = []
    for host in config.virtual_hosts:
        paths = ", ".join(route_path(route.match) for route in host.routes)
        named = "" if list(host.domains) == ["*"] else "/".join(host.domains)
        hosts.append(f"{named} {paths}".strip())
    return f"Inline Route: {'; '.join(hosts)}"


def _bare(domain: str) -> bool:
    """Without a port: `reviews`, `10.0.0.1`, `[fd00::1]` (not `reviews:9080`, `[fd00::1]:80`)."""
    return ":" not in domain or (domain.startswith("[") and domain.endswith("]"))


def _expansions(domains: Sequence[str]) -> set[str]:
    """Domains another one abbreviates: `a.ns.svc.DOMAIN` and `a.ns.svc` when `a.ns` is there."""
    present = set(domains)
    longer = set()
    for domain in domains:
        short = domain.partition(".svc.")[0] if ".svc." in domain else domain.removesuffix(".svc")
        if short != domain and short in present:
            longer.add(domain)
    return longer


def domains(names: Iterable[str]) -> str | None:
    """A virtual host's domains as istioctl shortens them: without ports and without the
    spelled-out forms of a short name, the first two and how many more."""
    given = list(names)
    if len(given) <= 1:
        return given[0] if given else None
    bare = [domain for domain in given if _bare(domain)] or given
    longer = _expansions(bare)
    kept = [domain for domain in bare if domain not in longer]
    shown = ", ".join(kept[:DOMAINS_SHOWN])
    more = len(kept) - DOMAINS_SHOWN
    return f"{shown} + {more} more..." if more > 0 else shown


PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"


def retries(policy: rc_pb2.RetryPolicy) -> str:
    """A retry policy in a few words: `2 on connect-failure,...[503]; per try 2s; another
    host`; `none` when it makes no retry."""
    count = policy.num_retries.value if policy.HasField("num_retries") else 1  # Envoy's default
    if count == 0 or not policy.retry_on:
        return "none"
    codes = ",".join(str(code) for code in policy.retriable_status_codes)
    parts = [f"{count} on {policy.retry_on}" + (f" [{codes}]" if codes else "")]
    if policy.HasField("per_try_timeout"):
        parts.append(f"per try {policy.per_try_timeout.ToJsonString()}")
    if any(p.name == PREVIOUS_HOSTS for p in policy.retry_host_predicate):
        parts.append("another host")
    return "; ".join(parts)


def route_retries(host: rc_pb2.VirtualHost, route: rc_pb2.Route) -> str | None:
    """The retries of a route to a cluster (its own policy, else its virtual host's);
    None for a route that answers itself."""
    if route.WhichOneof("action") != "route":
        return None
    if route.route.HasField("retry_policy"):
        return retries(route.route.retry_policy)
    return retries(host.retry_policy) if host.HasField("retry_policy") else "none"


def route_timeout(route: rc_pb2.Route) -> str | None:
    """A route to a cluster's timeout (`none`: Envoy's 0, no timeout; absent: Envoy's 15s
    default); None for a route that answers itself."""
    if route.WhichOneof("action") != "route":
        return None
    if not route.route.HasField("timeout"):
        return "15s"
    timeout = route.route.timeout
    return "none" if timeout.seconds == 0 and timeout.nanos == 0 else timeout.ToJsonString()


def virtual_host_routes(
    host: rc_pb2.VirtualHost,
) -> Iterator[tuple[str, str, str | None, str | None]]:
    """(MATCH, DESTINATION, RETRIES, TIMEOUT) per route of a virtual host; a host without
    routes answers 404."""
    if not host.routes:
        yield "/*", "404", None, None
    for route in host.routes:
        yield (
            route_match(route.match),
            route_destination(route),
            route_retries(host, route),
            route_timeout(route),
        )
