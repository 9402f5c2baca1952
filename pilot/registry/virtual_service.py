"""VirtualService: the routes users write for a host, read and checked (routes are built
from it elsewhere).

Istio's `networking.istio.io` kind `VirtualService`, read strictly
(`pilot.registry.istio_config.Reader`): unknown fields, bad values, regexes
Envoy's RE2 would refuse (`pilot.registry.regex`) and lists over their bounds
refuse the object with one line naming it and the field. Its shape:

    VirtualService(key, hosts, gateways, export_to, http, tcp, created)
      hosts     resolved in its namespace (`reviews` -> reviews.NS.svc.<domain>)
      gateways  as written; () is `mesh` (sidecars)
      http      (HttpRoute, ...) in order: the first whose match matches wins
      tcp       (TcpRoute, ...)
    HttpRoute(name, matches, route, redirect, rewrite, timeout, retries, fault, mirror,
              mirror_percent, cors, headers)
      matches   (HttpMatch(name, uri, scheme, method, authority: StringMatch | None,
                 headers, without_headers, query_params: ((name, StringMatch), ...),
                 port, source_labels, source_namespace, ignore_uri_case, gateways), ...)
                 () matches every request; matches of one route are ORed
      route     (RouteDestination(destination: Destination(host, subset, port),
                 weight, headers: Headers), ...)
      redirect  Redirect(uri, authority, port, scheme, redirect_code, derive_port)
      rewrite   Rewrite(uri, authority, uri_regex: (match, substitution) | None)
      timeout   seconds | None;  retries Retries(attempts, per_try_timeout, retry_on,
                retry_remote_localities) | None
      fault     Fault(delay, delay_percent, abort_status, abort_grpc_status,
                abort_percent) | None
      mirror    Destination | None, mirror_percent (100 when not written)
      cors      Cors(allow_origins: (StringMatch, ...), allow_methods, allow_headers,
                expose_headers, max_age, allow_credentials,
                forward_unmatched_preflights) | None
      headers   Headers(request, response: HeaderOps(set, add, remove))
    StringMatch(kind: exact | prefix | regex | present, value)
    TcpRoute(matches: (TcpMatch(port, source_labels, source_namespace,
             destination_subnets, gateways), ...), route: (RouteDestination, ...))

Destination hosts are resolved like the object's own hosts. A route of several
destinations must weigh something in all (weights are relative, as Envoy sums them). `tls` routes,
`delegate`, `directResponse` and `mirrors` are refused (pilot does not build them).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pilot.registry.istio_config import (
    MAX_LIST,
    MAX_NAME,
    ConfigKey,
    Reader,
    api_version_checked,
    key_of,
    metadata,
    resolve_host,
)
from pilot.registry.regex import re2_problem

KIND = "VirtualService"
MESH_GATEWAY = "mesh"
MAX_ROUTES = 256  # http or tcp routes of one object
MAX_REGEXES = 256  # regexes of one object: each is compiled by RE2 to be checked
RETRY_ON = frozenset(
    {
        "5xx",
        "gateway-error",
        "reset",
        "connect-failure",
        "envoy-ratelimited",
        "retriable-4xx",
        "refused-stream",
        "retriable-status-codes",
        "retriable-headers",
        "reset-before-request",
        "http3-post-connect-failure",
        "cancelled",
        "deadline-exceeded",
        "internal",
        "resource-exhausted",
        "unavailable",
    }
)
REDIRECT_CODES = (301, 302, 303, 307, 308)
_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+|:(authority|method|path|scheme)")
_STATUS = re.compile(r"[1-5][0-9][0-9]")

_SPEC = frozenset({"hosts", "gateways", "http", "tls", "tcp", "exportTo"})
_HTTP = frozenset(
    {
        "name",
        "match",
        "route",
        "redirect",
        "directResponse",
        "delegate",
        "rewrite",
        "timeout",
        "retries",
        "fault",
        "mirror",
        "mirrors",
        "mirrorPercentage",
        "mirrorPercent",
        "mirror_percent",
        "corsPolicy",
        "headers",
    }
)
_MATCH = frozenset(
    {
        "name",
        "uri",
        "scheme",
        "method",
        "authority",
        "headers",
        "port",
        "sourceLabels",
        "gateways",
        "queryParams",
        "ignoreUriCase",
        "withoutHeaders",
        "sourceNamespace",
        "statPrefix",
    }
)
_STRING_MATCH = frozenset({"exact", "prefix", "regex"})
_DESTINATION = frozenset({"host", "subset", "port"})
_ROUTE_DESTINATION = frozenset({"destination", "weight", "headers"})
_HEADERS = frozenset({"request", "response"})
_HEADER_OPS = frozenset({"set", "add", "remove"})
_REDIRECT = frozenset({"uri", "authority", "port", "derivePort", "scheme", "redirectCode"})
_REWRITE = frozenset({"uri", "authority", "uriRegexRewrite"})
_RETRIES = frozenset({"attempts", "perTryTimeout", "retryOn", "retryRemoteLocalities"})
_FAULT = frozenset({"delay", "abort"})
_DELAY = frozenset({"fixedDelay", "percentage", "percent", "exponentialDelay"})
_ABORT = frozenset({"httpStatus", "grpcStatus", "http2Error", "percentage"})
_CORS = frozenset(
    {
        "allowOrigins",
        "allowOrigin",
        "allowMethods",
        "allowHeaders",
        "exposeHeaders",
        "maxAge",
        "allowCredentials",
        "unmatchedPreflights",
    }
)
_TCP = frozenset({"match", "route"})
_TCP_MATCH = frozenset(
    {"destinationSubnets", "port", "sourceLabels", "gateways", "sourceNamespace", "sourceSubnet"}
)
_NOT_BUILT = frozenset(
    {
        "tls",
        "delegate",
        "directResponse",
        "mirrors",
        "statPrefix",
        "exponentialDelay",
        "http2Error",
        "sourceSubnet",
    }
)

Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class StringMatch:
    kind: str  # exact, prefix, regex, or present (a header written as `{}`)
    value: str = ""


@dataclass(frozen=True, slots=True)
class HttpMatch:
    name: str = ""
    uri: StringMatch | None = None
    scheme: StringMatch | None = None
    method: StringMatch | None = None
    authority: StringMatch | None = None
    headers: tuple[tuple[str, StringMatch], ...] = ()
    without_headers: tuple[tuple[str, StringMatch], ...] = ()
    query_params: tuple[tuple[str, StringMatch], ...] = ()
    port: int | None = None
    source_labels: Pairs = ()
    source_namespace: str = ""
    ignore_uri_case: bool = False
    gateways: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Destination:
    host: str  # resolved
    subset: str = ""
    port: int | None = None


@dataclass(frozen=True, slots=True)
class HeaderOps:
    set: Pairs = ()
    add: Pairs = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Headers:
    request: HeaderOps = HeaderOps()
    response: HeaderOps = HeaderOps()


@dataclass(frozen=True, slots=True)
class RouteDestination:
    destination: Destination
    weight: int = 0  # 0 with a single destination: all of it
    headers: Headers = Headers()


@dataclass(frozen=True, slots=True)
class Redirect:
    uri: str = ""
    authority: str = ""
    port: int | None = None
    scheme: str = ""
    redirect_code: int = 301
    derive_port: str = ""


@dataclass(frozen=True, slots=True)
class Rewrite:
    uri: str | None = None
    authority: str = ""
    uri_regex: tuple[str, str] | None = None  # (match, substitution)


@dataclass(frozen=True, slots=True)
class Retries:
    attempts: int
    per_try_timeout: float | None = None
    retry_on: tuple[str, ...] = ()
    retry_remote_localities: bool = False


@dataclass(frozen=True, slots=True)
class Fault:
    delay: float | None = None
    delay_percent: float = 100.0
    abort_status: int | None = None
    abort_grpc_status: str = ""
    abort_percent: float = 100.0


@dataclass(frozen=True, slots=True)
class Cors:
    allow_origins: tuple[StringMatch, ...] = ()
    allow_methods: tuple[str, ...] = ()
    allow_headers: tuple[str, ...] = ()
    expose_headers: tuple[str, ...] = ()
    max_age: float | None = None
    allow_credentials: bool | None = None
    # unmatchedPreflights: FORWARD (the default) or IGNORE.
    forward_unmatched_preflights: bool = True


@dataclass(frozen=True, slots=True)
class HttpRoute:
    name: str = ""
    matches: tuple[HttpMatch, ...] = ()
    route: tuple[RouteDestination, ...] = ()
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None
    timeout: float | None = None
    retries: Retries | None = None
    fault: Fault | None = None
    mirror: Destination | None = None
    mirror_percent: float = 100.0
    cors: Cors | None = None
    headers: Headers = Headers()


@dataclass(frozen=True, slots=True)
class TcpMatch:
    port: int | None = None
    source_labels: Pairs = ()
    source_namespace: str = ""
    destination_subnets: tuple[str, ...] = ()
    gateways: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TcpRoute:
    matches: tuple[TcpMatch, ...] = ()
    route: tuple[RouteDestination, ...] = ()


@dataclass(frozen=True, slots=True)
class VirtualService:
    key: ConfigKey
    hosts: tuple[str, ...]
    gateways: tuple[str, ...] = ()
    export_to: tuple[str, ...] = ("*",)
    http: tuple[HttpRoute, ...] = ()
    tcp: tuple[TcpRoute, ...] = ()
    created: str = ""

    @property
    def for_mesh(self) -> bool:
        """Whether it applies to sidecars (no gateways, or `mesh` among them)."""
        return not self.gateways or MESH_GATEWAY in self.gateways


class _Service(Reader):
    """The reading of one VirtualService."""

    def __init__(self, key: ConfigKey, namespace: str, cluster_domain: str) -> None:
        super().__init__(key)
        self.namespace = namespace
        self.cluster_domain = cluster_domain
        self.regexes = 0

    def known(self, value: Any, where: str, fields: frozenset[str]) -> Mapping[str, Any]:
        found = self.mapping(value, where, fields)
        for field in found:
            if field in _NOT_BUILT:
                raise self.fail(f"{where}.{field}", "is not supported by pilot")
        return found

    def strings(self, value: Any, where: str, limit: int = MAX_NAME) -> tuple[str, ...]:
        return tuple(
            self.string(v, f"{where}[{i}]", limit) for i, v in enumerate(self.items(value, where))
        )

    def regex(self, value: Any, where: str) -> str:
        self.regexes += 1
        if self.regexes > MAX_REGEXES:
            raise self.fail(where, f"is one regex too many (at most {MAX_REGEXES} in an object)")
        pattern = self.string(value, where, 4096)
        problem = re2_problem(pattern)
        if problem is not None:
            raise self.fail(where, problem)
        return pattern

    def string_match(self, value: Any, where: str, present: bool = False) -> StringMatch | None:
        if value is None:
            return None
        spec = self.mapping(value, where, _STRING_MATCH)
        if not spec and present:
            return StringMatch("present")
        if len(spec) != 1:
            raise self.fail(where, "must give one of exact, prefix, regex")
        ((kind, raw),) = spec.items()
        if kind == "regex":
            return StringMatch(kind, self.regex(raw, f"{where}.regex"))
        return StringMatch(kind, self.string(raw, f"{where}.{kind}"))

    def named_matches(self, value: Any, where: str) -> tuple[tuple[str, StringMatch], ...]:
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise self.fail(where, "must be a mapping")
        if len(value) > MAX_LIST:
            raise self.fail(where, f"has {len(value)} entries (at most {MAX_LIST})")
        self.count(len(value), where)
        found = []
        for name, match in value.items():
            text = self.string(name, f"{where} key", 256)
            if not _HEADER_NAME.fullmatch(text):
                raise self.fail(f"{where} key", f"{text!r} is not a lower-case header name")
            found.append((text, self.string_match(match, f"{where}[{text}]", present=True)))
        return tuple(sorted((n, m) for n, m in found if m is not None))

    def host(self, value: Any, where: str) -> str:
        return resolve_host(super().host(value, where), self.namespace, self.cluster_domain)

    def destination(self, value: Any, where: str) -> Destination:
        spec = self.mapping(value, where, _DESTINATION)
        port = self.mapping(spec.get("port"), f"{where}.port", frozenset({"number"}))
        subset = spec.get("subset")
        return Destination(
            self.host(spec.get("host"), f"{where}.host"),
            self.dns_label(subset, f"{where}.subset") if subset is not None else "",
            self.optional_integer(port.get("number"), f"{where}.port.number", 1, 65535),
        )

    def header_ops(self, value: Any, where: str) -> HeaderOps:
        spec = self.mapping(value, where, _HEADER_OPS)
        return HeaderOps(
            self.string_map(spec.get("set"), f"{where}.set"),
            self.string_map(spec.get("add"), f"{where}.add"),
            self.strings(spec.get("remove"), f"{where}.remove", 256),
        )

    def headers(self, value: Any, where: str) -> Headers:
        spec = self.mapping(value, where, _HEADERS)
        return Headers(
            self.header_ops(spec.get("request"), f"{where}.request"),
            self.header_ops(spec.get("response"), f"{where}.response"),
        )

    def route(self, value: Any, where: str) -> tuple[RouteDestination, ...]:
        found = []
        for i, entry in enumerate(self.items(value, where, MAX_ROUTES)):
            at = f"{where}[{i}]"
            spec = self.mapping(entry, at, _ROUTE_DESTINATION)
            found.append(
                RouteDestination(
                    self.destination(spec.get("destination"), f"{at}.destination"),
                    self.optional_integer(spec.get("weight"), f"{at}.weight", 0, 2**31 - 1) or 0,
                    self.headers(spec.get("headers"), f"{at}.headers"),
                )
            )
        if len(found) > 1 and sum(d.weight for d in found) == 0:
            raise self.fail(where, "has several destinations and no weight")
        return tuple(found)

    def percent(self, value: Any, where: str) -> float:
        if value is None:
            return 100.0
        spec = self.mapping(value, where, frozenset({"value"}))
        return self.number(spec.get("value", 0), f"{where}.value", 0.0, 100.0)

    def fault(self, value: Any, where: str) -> Fault | None:
        if value is None:
            return None
        spec = self.known(value, where, _FAULT)
        if not spec:
            raise self.fail(where, "must give a delay or an abort")
        delay = self.known(spec.get("delay"), f"{where}.delay", _DELAY)
        abort = self.known(spec.get("abort"), f"{where}.abort", _ABORT)
        fixed = self.duration(delay.get("fixedDelay"), f"{where}.delay.fixedDelay", 0.001)
        if "delay" in spec and fixed is None:
            raise self.fail(f"{where}.delay", "must give fixedDelay")
        delay_percent = self.percent(delay.get("percentage"), f"{where}.delay.percentage")
        if "percent" in delay and "percentage" not in delay:
            delay_percent = float(self.integer(delay["percent"], f"{where}.delay.percent", 0, 100))
        status, grpc = abort.get("httpStatus"), abort.get("grpcStatus")
        if "abort" in spec and (status is None) == (grpc is None):
            raise self.fail(f"{where}.abort", "must give one of httpStatus, grpcStatus")
        return Fault(
            fixed,
            delay_percent,
            self.optional_integer(status, f"{where}.abort.httpStatus", 200, 599),
            self.optional_string(grpc, f"{where}.abort.grpcStatus", 64),
            self.percent(abort.get("percentage"), f"{where}.abort.percentage"),
        )

    def retries(self, value: Any, where: str) -> Retries | None:
        if value is None:
            return None
        spec = self.mapping(value, where, _RETRIES)
        raw = self.optional_string(spec.get("retryOn"), f"{where}.retryOn", 512)
        policies = tuple(p.strip() for p in raw.split(",") if p.strip())
        for policy in policies:
            if policy not in RETRY_ON and not _STATUS.fullmatch(policy):
                raise self.fail(f"{where}.retryOn", f"{policy!r} is not a retry policy")
        return Retries(
            self.optional_integer(spec.get("attempts"), f"{where}.attempts", 0, 1000) or 0,
            self.duration(spec.get("perTryTimeout"), f"{where}.perTryTimeout", 0.001),
            policies,
            self.boolean(spec.get("retryRemoteLocalities"), f"{where}.retryRemoteLocalities"),
        )

    def redirect(self, value: Any, where: str) -> Redirect | None:
        if value is None:
            return None
        spec = self.mapping(value, where, _REDIRECT)
        code = spec.get("redirectCode")
        derive = spec.get("derivePort")
        return Redirect(
            self.optional_string(spec.get("uri"), f"{where}.uri"),
            self.optional_string(spec.get("authority"), f"{where}.authority", MAX_NAME),
            self.optional_integer(spec.get("port"), f"{where}.port", 1, 65535),
            self.optional_string(spec.get("scheme"), f"{where}.scheme", 16),
            301 if code is None else self.integer(code, f"{where}.redirectCode", 301, 308),
            ""
            if derive is None
            else self.enum(
                derive, f"{where}.derivePort", ("FROM_PROTOCOL_DEFAULT", "FROM_REQUEST_PORT")
            ),
        )

    def rewrite(self, value: Any, where: str) -> Rewrite | None:
        if value is None:
            return None
        spec = self.mapping(value, where, _REWRITE)
        regex = self.mapping(
            spec.get("uriRegexRewrite"), f"{where}.uriRegexRewrite", frozenset({"match", "rewrite"})
        )
        if "uri" in spec and regex:
            raise self.fail(where, "gives both uri and uriRegexRewrite")
        uri_regex = None
        if regex:
            uri_regex = (
                self.regex(regex.get("match"), f"{where}.uriRegexRewrite.match"),
                self.string(regex.get("rewrite"), f"{where}.uriRegexRewrite.rewrite"),
            )
        uri = spec.get("uri")
        return Rewrite(
            None if uri is None else self.string(uri, f"{where}.uri"),
            self.optional_string(spec.get("authority"), f"{where}.authority", MAX_NAME),
            uri_regex,
        )

    def cors(self, value: Any, where: str) -> Cors | None:
        if value is None:
            return None
        spec = self.known(value, where, _CORS)
        origins = [
            self.string_match(o, f"{where}.allowOrigins[{i}]")
            for i, o in enumerate(self.items(spec.get("allowOrigins"), f"{where}.allowOrigins"))
        ]
        origins += [
            StringMatch("exact", o)
            for o in self.strings(spec.get("allowOrigin"), f"{where}.allowOrigin")
        ]
        credentials = spec.get("allowCredentials")
        return Cors(
            tuple(o for o in origins if o is not None),
            self.strings(spec.get("allowMethods"), f"{where}.allowMethods", 32),
            self.strings(spec.get("allowHeaders"), f"{where}.allowHeaders", 256),
            self.strings(spec.get("exposeHeaders"), f"{where}.exposeHeaders", 256),
            self.duration(spec.get("maxAge"), f"{where}.maxAge"),
            None if credentials is None else self.boolean(credentials, f"{where}.allowCredentials"),
            self._unmatched_preflights(spec.get("unmatchedPreflights"), where),
        )

    def _unmatched_preflights(self, value: Any, where: str) -> bool:
        """Whether preflights no origin matches go on to the app (FORWARD, the default)."""
        if value is None:
            return True
        where = f"{where}.unmatchedPreflights"
        return self.enum(value, where, ("UNSPECIFIED", "FORWARD", "IGNORE")) != "IGNORE"

    def http_match(self, value: Any, where: str) -> HttpMatch:
        spec = self.known(value, where, _MATCH)
        namespace = spec.get("sourceNamespace")
        return HttpMatch(
            self.optional_string(spec.get("name"), f"{where}.name", 256),
            self.string_match(spec.get("uri"), f"{where}.uri"),
            self.string_match(spec.get("scheme"), f"{where}.scheme"),
            self.string_match(spec.get("method"), f"{where}.method"),
            self.string_match(spec.get("authority"), f"{where}.authority"),
            self.named_matches(spec.get("headers"), f"{where}.headers"),
            self.named_matches(spec.get("withoutHeaders"), f"{where}.withoutHeaders"),
            self.query_params(spec.get("queryParams"), f"{where}.queryParams"),
            self.optional_integer(spec.get("port"), f"{where}.port", 1, 65535),
            self.string_map(spec.get("sourceLabels"), f"{where}.sourceLabels"),
            "" if namespace is None else self.dns_label(namespace, f"{where}.sourceNamespace"),
            self.boolean(spec.get("ignoreUriCase"), f"{where}.ignoreUriCase"),
            self.strings(spec.get("gateways"), f"{where}.gateways"),
        )

    def query_params(self, value: Any, where: str) -> tuple[tuple[str, StringMatch], ...]:
        if value is None:
            return ()
        if not isinstance(value, Mapping) or len(value) > MAX_LIST:
            raise self.fail(where, f"must be a mapping of at most {MAX_LIST} parameters")
        self.count(len(value), where)
        found = []
        for name, match in value.items():
            text = self.string(name, f"{where} key", 256)
            found.append((text, self.string_match(match, f"{where}[{text}]", present=True)))
        return tuple(sorted((n, m) for n, m in found if m is not None))

    def http_route(self, value: Any, where: str) -> HttpRoute:
        spec = self.known(value, where, _HTTP)
        route = self.route(spec.get("route"), f"{where}.route")
        redirect = self.redirect(spec.get("redirect"), f"{where}.redirect")
        if bool(route) == (redirect is not None):
            raise self.fail(where, "must give one of route, redirect")
        mirror = spec.get("mirror")
        mirror_percent = self.percent(spec.get("mirrorPercentage"), f"{where}.mirrorPercentage")
        for old in ("mirrorPercent", "mirror_percent"):
            if old in spec and "mirrorPercentage" not in spec:
                mirror_percent = float(self.integer(spec[old], f"{where}.{old}", 0, 100))
        return HttpRoute(
            self.optional_string(spec.get("name"), f"{where}.name", 256),
            tuple(
                self.http_match(m, f"{where}.match[{i}]")
                for i, m in enumerate(self.items(spec.get("match"), f"{where}.match"))
            ),
            route,
            redirect,
            self.rewrite(spec.get("rewrite"), f"{where}.rewrite"),
            self.duration(spec.get("timeout"), f"{where}.timeout"),
            self.retries(spec.get("retries"), f"{where}.retries"),
            self.fault(spec.get("fault"), f"{where}.fault"),
            None if mirror is None else self.destination(mirror, f"{where}.mirror"),
            mirror_percent,
            self.cors(spec.get("corsPolicy"), f"{where}.corsPolicy"),
            self.headers(spec.get("headers"), f"{where}.headers"),
        )

    def tcp_match(self, value: Any, where: str) -> TcpMatch:
        spec = self.known(value, where, _TCP_MATCH)
        subnets = self.strings(spec.get("destinationSubnets"), f"{where}.destinationSubnets", 64)
        for i, subnet in enumerate(subnets):
            try:
                ipaddress.ip_network(subnet, strict=False)
            except ValueError:
                raise self.fail(f"{where}.destinationSubnets[{i}]", "is not a CIDR") from None
        namespace = spec.get("sourceNamespace")
        return TcpMatch(
            self.optional_integer(spec.get("port"), f"{where}.port", 1, 65535),
            self.string_map(spec.get("sourceLabels"), f"{where}.sourceLabels"),
            "" if namespace is None else self.dns_label(namespace, f"{where}.sourceNamespace"),
            subnets,
            self.strings(spec.get("gateways"), f"{where}.gateways"),
        )

    def tcp_route(self, value: Any, where: str) -> TcpRoute:
        spec = self.mapping(value, where, _TCP)
        route = self.route(spec.get("route"), f"{where}.route")
        if not route:
            raise self.fail(f"{where}.route", "is empty")
        return TcpRoute(
            tuple(
                self.tcp_match(m, f"{where}.match[{i}]")
                for i, m in enumerate(self.items(spec.get("match"), f"{where}.match"))
            ),
            route,
        )


def parse_virtual_service(obj: Mapping[str, Any], cluster_domain: str) -> VirtualService:
    """One VirtualService (a dict, as a file or the API server gives it); raises
    ConfigError naming the object and the field."""
    probe = Reader(key_of(KIND, obj))
    api_version_checked(probe, obj)
    namespace, created = metadata(probe, obj)
    reader = _Service(probe.key, namespace, cluster_domain)
    spec = reader.known(obj.get("spec"), "spec", _SPEC)
    hosts = reader.items(spec.get("hosts"), "spec.hosts")
    if not hosts:
        raise reader.fail("spec.hosts", "is empty")
    http = reader.items(spec.get("http"), "spec.http", MAX_ROUTES)
    tcp = reader.items(spec.get("tcp"), "spec.tcp", MAX_ROUTES)
    if not http and not tcp:
        raise reader.fail("spec", "has no http or tcp route")
    return VirtualService(
        key=reader.key,
        hosts=tuple(reader.host(h, f"spec.hosts[{i}]") for i, h in enumerate(hosts)),
        gateways=reader.strings(spec.get("gateways"), "spec.gateways"),
        export_to=reader.export_to(spec.get("exportTo"), "spec.exportTo"),
        http=tuple(reader.http_route(r, f"spec.http[{i}]") for i, r in enumerate(http)),
        tcp=tuple(reader.tcp_route(r, f"spec.tcp[{i}]") for i, r in enumerate(tcp)),
        created=created,
    )
