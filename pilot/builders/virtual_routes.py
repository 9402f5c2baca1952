"""A VirtualService's http routes as Envoy routes, as istiod writes them for a sidecar.

Pure functions from `pilot.registry.virtual_service` objects to `route_components`
messages, for one route configuration (one port) of the calling sidecar:

- each `match` of a route becomes one Envoy route, in order (Envoy takes the first
  that matches, as Istio's first match wins); a route without `match` matches `/`;
  a match naming another `port` is left out of this port's configuration;
- a match naming `sourceLabels` or `sourceNamespace` depends on who asks: it is kept
  only in the configuration built for a `RouteClient` it selects (its namespace, the
  sourceLabels selectors its pod matches), as Istio keeps it only for the proxies it
  selects; the shared configuration every other sidecar reads leaves it out, so no
  sidecar is sent a route meant for another;
- destinations go to `outbound|PORT|SUBSET|FQDN`, several as weighted clusters; a
  subset no DestinationRule defines still names its cluster (Envoy answers 503);
- no `retries`: Istio's default policy (`pilot.builders.istio_defaults`); `attempts:
  0`: none; a `timeout` is the route's, none is 0 (no timeout), as Istio;
- `fault` and `corsPolicy` go in the route's per-filter config of the fault and CORS
  filters every outbound HTTP connection manager carries (`pilot.builders.listeners`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.extensions.filters.common.fault.v3 import fault_pb2 as common_fault_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2

from pilot.builders.istio_defaults import (
    DEFAULT_RETRY_ON,
    HOST_SELECTION_RETRY_MAX_ATTEMPTS,
    outbound_retry_policy,
)
from pilot.registry.virtual_service import (
    Cors,
    Destination,
    Fault,
    HeaderOps,
    Headers,
    HttpMatch,
    HttpRoute,
    Pairs,
    Redirect,
    Retries,
    RouteDestination,
    StringMatch,
)

FAULT_FILTER = "envoy.filters.http.fault"
CORS_FILTER = "envoy.filters.http.cors"
_REDIRECT_CODES = {
    301: rc_pb2.RedirectAction.MOVED_PERMANENTLY,
    302: rc_pb2.RedirectAction.FOUND,
    303: rc_pb2.RedirectAction.SEE_OTHER,
    307: rc_pb2.RedirectAction.TEMPORARY_REDIRECT,
    308: rc_pb2.RedirectAction.PERMANENT_REDIRECT,
}
_ADD = base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD
_SET = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

# (destination) -> its cluster's name, for this route configuration's port.
ClusterOf = Callable[[Destination], str]


@dataclass(frozen=True, slots=True)
class RouteClient:
    """Whom a route configuration is built for: a namespace ("": none in particular) and
    the `sourceLabels` selectors (sorted pairs) its pods carry every label of."""

    namespace: str = ""
    selectors: frozenset[Pairs] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.namespace or self.selectors)


# What every sidecar shares: no source-dependent match selects it.
ANY_CLIENT = RouteClient()


def _duration(seconds: float) -> duration_pb2.Duration:
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def _packed(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


def _million(percent: float) -> percent_pb2.FractionalPercent:
    """A percentage as Istio writes it: parts per million."""
    return percent_pb2.FractionalPercent(
        numerator=round(percent * 10_000), denominator=percent_pb2.FractionalPercent.MILLION
    )


# -- matching -----------------------------------------------------------------------


def string_matcher(match: StringMatch, ignore_case: bool = False) -> string_pb2.StringMatcher:
    """exact, prefix or regex (RE2, checked when the object was read)."""
    if match.kind == "regex":
        regex = regex_pb2.RegexMatcher(regex=match.value)
        return string_pb2.StringMatcher(safe_regex=regex)
    if match.kind == "prefix":
        return string_pb2.StringMatcher(prefix=match.value, ignore_case=ignore_case)
    return string_pb2.StringMatcher(exact=match.value, ignore_case=ignore_case)


def header_matcher(name: str, match: StringMatch, invert: bool = False) -> rc_pb2.HeaderMatcher:
    if match.kind == "present":
        return rc_pb2.HeaderMatcher(name=name, present_match=True, invert_match=invert)
    return rc_pb2.HeaderMatcher(name=name, string_match=string_matcher(match), invert_match=invert)


def _path(route_match: rc_pb2.RouteMatch, match: HttpMatch) -> None:
    uri = match.uri
    if uri is None:
        route_match.prefix = "/"
    elif uri.kind == "exact":
        route_match.path = uri.value
    elif uri.kind == "prefix":
        route_match.prefix = uri.value
    else:
        route_match.safe_regex.regex = uri.value
    # Written out either way, as istiod does for a route that has a match.
    route_match.case_sensitive.value = not match.ignore_uri_case


def route_match(match: HttpMatch) -> rc_pb2.RouteMatch:
    """One Istio HTTPMatchRequest as Envoy's RouteMatch (its port was checked by the caller)."""
    found = rc_pb2.RouteMatch()
    _path(found, match)
    pseudo = (("method", ":method"), ("authority", ":authority"), ("scheme", ":scheme"))
    for field, header in pseudo:
        value: StringMatch | None = getattr(match, field)
        if value is not None:
            found.headers.append(header_matcher(header, value))
    found.headers.extend(header_matcher(name, m) for name, m in match.headers)
    found.headers.extend(header_matcher(name, m, invert=True) for name, m in match.without_headers)
    for name, value in match.query_params:
        parameter = found.query_parameters.add(name=name)
        if value.kind == "present":
            parameter.present_match = True
        else:
            parameter.string_match.CopyFrom(string_matcher(value))
    return found


def depends_on_client(match: HttpMatch) -> bool:
    """Whether the match selects its clients (labels, namespace): not in a shared config."""
    return bool(match.source_labels or match.source_namespace)


def selects(match: HttpMatch, client: RouteClient) -> bool:
    """Whether a match's source conditions take `client`, as Istio's `sourceMatchHTTP`:
    its namespace is the one named, and its pod carries every label of the selector."""
    if match.source_namespace and match.source_namespace != client.namespace:
        return False
    return not match.source_labels or match.source_labels in client.selectors


def matches_for_port(
    route: HttpRoute, port: int, client: RouteClient = ANY_CLIENT
) -> list[HttpMatch | None]:
    """The route's matches this port's configuration for `client` keeps (None: match all).

    A route whose every match is left out is left out (it selects no request here)."""
    if not route.matches:
        return [None]
    return [m for m in route.matches if (m.port is None or m.port == port) and selects(m, client)]


# -- the action -------------------------------------------------------------------


def _editable(name: str) -> bool:
    """Envoy refuses a route that adds or removes `:`-prefixed headers or Host; Istio
    leaves them out (an authority it sets becomes the route's host rewrite)."""
    return bool(name) and not name.startswith(":") and name.lower() != "host"


def _header_options(ops: HeaderOps) -> list[base_pb2.HeaderValueOption]:
    """Set and add, values literal: Envoy reads `%` as its substitution commands, and
    refuses the whole route configuration for one it does not know (`%2F`)."""
    written = [(n, v, _SET) for n, v in ops.set] + [(n, v, _ADD) for n, v in ops.add]
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=name, value=value.replace("%", "%%")),
            append_action=action,
        )
        for name, value, action in written
        if _editable(name)
    ]


def set_authority(ops: HeaderOps) -> str:
    """The authority a request's header ops set (`:authority` or `host`), "" for none."""
    found = [v for n, v in (*ops.set, *ops.add) if n.lower() in (":authority", "host")]
    return found[-1] if found else ""


def apply_headers(target: rc_pb2.Route | rc_pb2.WeightedCluster.ClusterWeight, h: Headers) -> None:
    target.request_headers_to_add.extend(_header_options(h.request))
    target.request_headers_to_remove.extend(n for n in h.request.remove if _editable(n))
    target.response_headers_to_add.extend(_header_options(h.response))
    target.response_headers_to_remove.extend(n for n in h.response.remove if _editable(n))
    authority = set_authority(h.request)
    if authority:
        if isinstance(target, rc_pb2.Route):
            if target.HasField("route"):
                target.route.host_rewrite_literal = authority
        else:
            target.host_rewrite_literal = authority


def retry_policy(retries: Retries | None) -> rc_pb2.RetryPolicy | None:
    """Istio's: absent is its default, 0 attempts none; status codes in retryOn listed."""
    if retries is None:
        return outbound_retry_policy()
    if retries.attempts == 0:
        return None
    policy = outbound_retry_policy()
    policy.num_retries.value = retries.attempts
    if retries.retry_on:
        named = [p for p in retries.retry_on if not p.isdigit()]
        codes = [int(p) for p in retries.retry_on if p.isdigit()]
        if codes and "retriable-status-codes" not in named:
            named.append("retriable-status-codes")
        policy.retry_on = ",".join(named) if named else DEFAULT_RETRY_ON
        policy.retriable_status_codes.extend(codes)
    if retries.per_try_timeout is not None:
        policy.per_try_timeout.CopyFrom(_duration(retries.per_try_timeout))
    policy.host_selection_retry_max_attempts = HOST_SELECTION_RETRY_MAX_ATTEMPTS
    return policy


def fault_config(fault: Fault) -> fault_pb2.HTTPFault:
    """The fault filter's per-route config: a fixed delay and an abort, each with its share."""
    config = fault_pb2.HTTPFault()
    if fault.delay is not None:
        config.delay.CopyFrom(
            common_fault_pb2.FaultDelay(
                fixed_delay=_duration(fault.delay), percentage=_million(fault.delay_percent)
            )
        )
    if fault.abort_status is not None:
        config.abort.http_status = fault.abort_status
        config.abort.percentage.CopyFrom(_million(fault.abort_percent))
    elif fault.abort_grpc_status:
        config.abort.grpc_status = _GRPC_CODES.get(fault.abort_grpc_status, 2)
        config.abort.percentage.CopyFrom(_million(fault.abort_percent))
    return config


_GRPC_CODES = {
    name: code
    for code, name in enumerate(
        (
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        )
    )
}


def cors_config(cors: Cors) -> cors_pb2.CorsPolicy:
    config = cors_pb2.CorsPolicy(
        allow_origin_string_match=[string_matcher(o) for o in cors.allow_origins],
        allow_methods=",".join(cors.allow_methods),
        allow_headers=",".join(cors.allow_headers),
        expose_headers=",".join(cors.expose_headers),
        forward_not_matching_preflights=wrappers_pb2.BoolValue(
            value=cors.forward_unmatched_preflights
        ),
    )
    config.filter_enabled.default_value.numerator = 100  # HUNDRED, as istiod
    if cors.max_age is not None:
        config.max_age = str(int(cors.max_age))
    if cors.allow_credentials is not None:
        config.allow_credentials.value = cors.allow_credentials
    return config


def _destinations(
    action: rc_pb2.RouteAction, route: HttpRoute, cluster_of: ClusterOf
) -> list[RouteDestination]:
    """Set the action's cluster or weighted clusters; returns the destinations used."""
    weighted = [d for d in route.route if d.weight > 0] if len(route.route) > 1 else []
    if len(weighted) <= 1:
        only = weighted[0] if weighted else route.route[0]
        action.cluster = cluster_of(only.destination)
        return [only]
    for destination in weighted:
        entry = action.weighted_clusters.clusters.add(
            name=cluster_of(destination.destination),
            weight=wrappers_pb2.UInt32Value(value=destination.weight),
        )
        apply_headers(entry, destination.headers)
    return weighted


def _action(
    route: HttpRoute, action: rc_pb2.RouteAction, cluster_of: ClusterOf
) -> rc_pb2.RouteAction:
    """The rest of a route's action, its destinations set."""
    action.timeout.CopyFrom(_duration(route.timeout or 0.0))
    # gRPC's grpc-timeout header is honoured up to the route's timeout (none: any), as
    # istiod; without it Envoy ignores the header.
    action.max_grpc_timeout.CopyFrom(action.timeout)
    policy = retry_policy(route.retries)
    if policy is not None:
        action.retry_policy.CopyFrom(policy)
    rewrite = route.rewrite
    if rewrite is not None:
        if rewrite.uri is not None:
            action.prefix_rewrite = rewrite.uri
        if rewrite.uri_regex is not None:
            action.regex_rewrite.pattern.regex = rewrite.uri_regex[0]
            action.regex_rewrite.substitution = rewrite.uri_regex[1]
        if rewrite.authority:
            action.host_rewrite_literal = rewrite.authority
    if route.mirror is not None:
        mirror = action.request_mirror_policies.add(
            cluster=cluster_of(route.mirror),
            # Mirrored requests keep their Host (no `-shadow` suffix) and are not traced,
            # as istiod sends them.
            trace_sampled=wrappers_pb2.BoolValue(value=False),
            disable_shadow_host_suffix_append=True,
        )
        mirror.runtime_fraction.default_value.CopyFrom(_million(route.mirror_percent))
    return action


def redirect_action(redirect: Redirect) -> rc_pb2.RedirectAction:
    action = rc_pb2.RedirectAction(response_code=_REDIRECT_CODES[redirect.redirect_code])
    if redirect.uri:
        action.path_redirect = redirect.uri
    if redirect.authority:
        action.host_redirect = redirect.authority
    if redirect.port is not None:
        action.port_redirect = redirect.port
    if redirect.scheme:
        action.scheme_redirect = redirect.scheme
    return action


def _route_name(route: HttpRoute, match: HttpMatch | None) -> str:
    if match is not None and match.name:
        return f"{route.name}.{match.name}" if route.name else match.name
    return route.name


def envoy_route(route: HttpRoute, match: HttpMatch | None, cluster_of: ClusterOf) -> rc_pb2.Route:
    """One Envoy route: one match of one http route of a VirtualService."""
    found = rc_pb2.Route(
        name=_route_name(route, match),
        match=route_match(match) if match is not None else rc_pb2.RouteMatch(prefix="/"),
    )
    if route.redirect is not None:
        found.redirect.CopyFrom(redirect_action(route.redirect))
    else:
        action = rc_pb2.RouteAction()
        used = _destinations(action, route, cluster_of)
        found.route.CopyFrom(_action(route, action, cluster_of))
        if len(used) == 1:
            apply_headers(found, used[0].headers)
    apply_headers(found, route.headers)
    if route.fault is not None:
        found.typed_per_filter_config[FAULT_FILTER].CopyFrom(_packed(fault_config(route.fault)))
    if route.cors is not None:
        found.typed_per_filter_config[CORS_FILTER].CopyFrom(_packed(cors_config(route.cors)))
    return found


def envoy_routes(
    routes: tuple[HttpRoute, ...],
    port: int,
    cluster_of: ClusterOf,
    client: RouteClient = ANY_CLIENT,
) -> Iterator[rc_pb2.Route]:
    """Every Envoy route of these http routes on `port` for `client`, in order."""
    for route in routes:
        for match in matches_for_port(route, port, client):
            yield envoy_route(route, match, cluster_of)
