"""DestinationRule: the subsets and traffic policy of a service's clusters.

Istio's `networking.istio.io` kind `DestinationRule`, read strictly
(`pilot.registry.istio_config.Reader`). Its shape, as pilot keeps it:

    DestinationRule(key, host, created, export_to, traffic_policy, subsets)
      host            resolved: `reviews` in `default` is reviews.default.svc.<domain>
      traffic_policy  TrafficPolicy(base: PortPolicy, ports: ((port, PortPolicy), ...))
      subsets         (Subset(name, labels, traffic_policy | None), ...)
    PortPolicy(load_balancer, connection_pool, outlier_detection, tls), each None when
      not written:
      LoadBalancer(simple, consistent_hash: ConsistentHash(header | cookie | source_ip |
        query_parameter, ring size; the route's hash policy is the routes' to build),
        locality: LocalityLbSetting (`pilot.registry.locality_lb`))
      ConnectionPool(max_connections, connect_timeout, http1_max_pending_requests,
        http2_max_requests, max_requests_per_connection, max_retries, idle_timeout)
      OutlierDetection(consecutive_5xx_errors, consecutive_gateway_errors, interval,
        base_ejection_time, max_ejection_percent, min_health_percent)
      ClientTls(mode DISABLE | SIMPLE | ISTIO_MUTUAL | MUTUAL, sni, subject_alt_names,
        ca_certificates, insecure_skip_verify, unsupported: why it must fail closed)

`policy_for(rule, port, subset)` is the policy one cluster gets, merged as
Istio's `MergeTrafficPolicy` merges it: the rule's port-level settings for that
port replace all four of the rule's fields, then the subset's fields replace
the rule's one by one, and the subset's own port-level settings replace all four.

Fields of Istio's API that pilot does not implement (localityLbSetting's
failoverPriority, warmup,
tunnel, proxyProtocol, TCP keepalive, ...) refuse the object with a message
naming the field: an object is applied as written or not at all. TLS that pilot
cannot build (MUTUAL, a `credentialName`, client certificates, a `caCertificates` file)
is kept, marked
`unsupported`: its clusters fail closed (they send nowhere) rather than in
plaintext. `workloadSelector` is refused: pilot's clusters are one set for
every sidecar.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pilot.registry.istio_config import (
    MAX_STRING,
    ConfigKey,
    Reader,
    api_version_checked,
    key_of,
    metadata,
    resolve_host,
)
from pilot.registry.locality_lb import LocalityLbSetting, read_locality_lb

KIND = "DestinationRule"
SIMPLE_POLICIES = (
    "UNSPECIFIED",
    "ROUND_ROBIN",
    "LEAST_CONN",
    "LEAST_REQUEST",
    "RANDOM",
    "PASSTHROUGH",
)
TLS_MODES = ("DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL")
DEFAULT_RING_SIZE = 1024  # Istio's minimumRingSize when a rule gives none
MAX_SUBSETS = 256
MAX_PORT_SETTINGS = 256
_UINT32 = 2**32 - 1
_INT32 = 2**31 - 1
_MS = 0.001

Labels = tuple[tuple[str, str], ...]

_SPEC = frozenset({"host", "trafficPolicy", "subsets", "exportTo", "workloadSelector"})
_POLICY = frozenset(
    {
        "loadBalancer",
        "connectionPool",
        "outlierDetection",
        "tls",
        "portLevelSettings",
        "tunnel",
        "proxyProtocol",
        "retryBudget",
    }
)
_PORT_POLICY = frozenset({"port", "loadBalancer", "connectionPool", "outlierDetection", "tls"})
_LB = frozenset({"simple", "consistentHash", "localityLbSetting", "warmupDurationSecs", "warmup"})
_HASH = frozenset(
    {
        "httpHeaderName",
        "httpCookie",
        "useSourceIp",
        "httpQueryParameterName",
        "ringHash",
        "maglev",
        "minimumRingSize",
    }
)
_COOKIE = frozenset({"name", "path", "ttl", "attributes"})
_POOL = frozenset({"tcp", "http"})
_TCP = frozenset(
    {"maxConnections", "connectTimeout", "tcpKeepalive", "maxConnectionDuration", "idleTimeout"}
)
_HTTP = frozenset(
    {
        "http1MaxPendingRequests",
        "http2MaxRequests",
        "maxRequestsPerConnection",
        "maxRetries",
        "idleTimeout",
        "h2UpgradePolicy",
        "useClientProtocol",
        "maxConcurrentStreams",
    }
)
_OUTLIER = frozenset(
    {
        "consecutiveErrors",
        "consecutive5xxErrors",
        "consecutiveGatewayErrors",
        "interval",
        "baseEjectionTime",
        "maxEjectionPercent",
        "minHealthPercent",
        "splitExternalLocalOriginErrors",
        "consecutiveLocalOriginFailures",
    }
)
_TLS = frozenset(
    {
        "mode",
        "clientCertificate",
        "privateKey",
        "caCertificates",
        "credentialName",
        "subjectAltNames",
        "sni",
        "insecureSkipVerify",
        "caCrl",
    }
)
_SUBSET = frozenset({"name", "labels", "trafficPolicy"})
# Istio's fields pilot does not build: the object is refused, naming the field.
_NOT_BUILT = frozenset(
    {
        "tunnel",
        "proxyProtocol",
        "retryBudget",
        "warmupDurationSecs",
        "warmup",
        "maglev",
        "tcpKeepalive",
        "maxConnectionDuration",
        "h2UpgradePolicy",
        "useClientProtocol",
        "maxConcurrentStreams",
        "splitExternalLocalOriginErrors",
        "consecutiveLocalOriginFailures",
        "attributes",
        "caCrl",
    }
)
# TLS pilot cannot build: client certificates, and file paths on the proxy (istio-agent
# serves those over SDS; read by Envoy itself, one rule's missing file would make every
# sidecar reject its clusters).
_FAIL_CLOSED_TLS = ("clientCertificate", "privateKey", "credentialName", "caCertificates")


@dataclass(frozen=True, slots=True)
class ConsistentHash:
    """What a ring hash hashes: one of a header, a cookie, the source IP, a query parameter."""

    header: str = ""
    cookie: str = ""
    cookie_path: str = ""
    cookie_ttl: float | None = None
    source_ip: bool = False
    query_parameter: str = ""
    minimum_ring_size: int = DEFAULT_RING_SIZE


@dataclass(frozen=True, slots=True)
class LoadBalancer:
    simple: str = "UNSPECIFIED"
    consistent_hash: ConsistentHash | None = None
    locality: LocalityLbSetting | None = None  # localityLbSetting (None: the mesh's default)


@dataclass(frozen=True, slots=True)
class ConnectionPool:
    max_connections: int | None = None
    connect_timeout: float | None = None  # seconds
    tcp_idle_timeout: float | None = None
    http1_max_pending_requests: int | None = None
    http2_max_requests: int | None = None
    max_requests_per_connection: int | None = None
    max_retries: int | None = None
    idle_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    consecutive_5xx_errors: int | None = None
    consecutive_gateway_errors: int | None = None
    interval: float | None = None
    base_ejection_time: float | None = None
    max_ejection_percent: int | None = None
    min_health_percent: int = 0


@dataclass(frozen=True, slots=True)
class ClientTls:
    mode: str = "DISABLE"
    sni: str = ""
    subject_alt_names: tuple[str, ...] = ()
    ca_certificates: str = ""  # a path on the proxy's file system: its clusters fail closed
    insecure_skip_verify: bool = False
    unsupported: str = ""  # why pilot cannot build it: its clusters fail closed


@dataclass(frozen=True, slots=True)
class PortPolicy:
    """The four parts of a traffic policy one cluster gets (None: not written)."""

    load_balancer: LoadBalancer | None = None
    connection_pool: ConnectionPool | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTls | None = None

    def __bool__(self) -> bool:
        return any((self.load_balancer, self.connection_pool, self.outlier_detection, self.tls))


@dataclass(frozen=True, slots=True)
class TrafficPolicy:
    base: PortPolicy = PortPolicy()
    ports: tuple[tuple[int, PortPolicy], ...] = ()  # portLevelSettings, by port number

    def at(self, port: int) -> PortPolicy:
        """The policy at `port`: its port-level settings replace the four fields whole."""
        for number, policy in self.ports:
            if number == port:
                return policy
        return self.base


@dataclass(frozen=True, slots=True)
class Subset:
    name: str
    labels: Labels
    traffic_policy: TrafficPolicy | None = None

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels)


@dataclass(frozen=True, slots=True)
class DestinationRule:
    key: ConfigKey
    host: str  # resolved in the rule's namespace
    created: str = ""
    export_to: tuple[str, ...] = ("*",)
    traffic_policy: TrafficPolicy | None = None
    subsets: tuple[Subset, ...] = ()

    @property
    def age(self) -> tuple[str, str]:
        return self.created, self.key.name

    def subset(self, name: str) -> Subset | None:
        return next((s for s in self.subsets if s.name == name), None)


def policy_for(rule: DestinationRule | None, port: int, subset: str = "") -> PortPolicy:
    """The policy of the cluster of `port` (and `subset`), merged as Istio merges it."""
    if rule is None:
        return PortPolicy()
    merged = rule.traffic_policy.at(port) if rule.traffic_policy else PortPolicy()
    chosen = rule.subset(subset) if subset else None
    if chosen is None or chosen.traffic_policy is None:
        return merged
    own = chosen.traffic_policy
    for number, policy in own.ports:
        if number == port:
            return policy
    return replace(
        merged,
        **{
            field: getattr(own.base, field)
            for field in ("load_balancer", "connection_pool", "outlier_detection", "tls")
            if getattr(own.base, field) is not None
        },
    )


class _Rule(Reader):
    """The reading of one DestinationRule."""

    def known(self, value: Any, where: str, fields: frozenset[str]) -> Mapping[str, Any]:
        """A mapping of Istio's `fields`, none of those pilot does not build."""
        found = self.mapping(value, where, fields)
        for field in found:
            if field in _NOT_BUILT:
                raise self.fail(f"{where}.{field}", "is not supported by pilot")
        return found

    def policy(self, value: Any, where: str) -> TrafficPolicy | None:
        if value is None:
            return None
        spec = self.known(value, where, _POLICY)
        ports: dict[int, PortPolicy] = {}
        entries = self.items(spec.get("portLevelSettings"), f"{where}.portLevelSettings")
        if len(entries) > MAX_PORT_SETTINGS:
            raise self.fail(f"{where}.portLevelSettings", f"has more than {MAX_PORT_SETTINGS}")
        for i, entry in enumerate(entries):
            at = f"{where}.portLevelSettings[{i}]"
            fields = self.known(entry, at, _PORT_POLICY)
            port = self.mapping(fields.get("port"), f"{at}.port", frozenset({"number"}))
            number = self.integer(port.get("number"), f"{at}.port.number", 1, 65535)
            if number in ports:
                raise self.fail(f"{at}.port.number", f"{number} is given twice")
            ports[number] = self.port_policy(fields, at)
        return TrafficPolicy(self.port_policy(spec, where), tuple(sorted(ports.items())))

    def port_policy(self, spec: Mapping[str, Any], where: str) -> PortPolicy:
        return PortPolicy(
            self.load_balancer(spec.get("loadBalancer"), f"{where}.loadBalancer"),
            self.pool(spec.get("connectionPool"), f"{where}.connectionPool"),
            self.outlier(spec.get("outlierDetection"), f"{where}.outlierDetection"),
            self.tls(spec.get("tls"), f"{where}.tls"),
        )

    def load_balancer(self, value: Any, where: str) -> LoadBalancer | None:
        if value is None:
            return None
        spec = self.known(value, where, _LB)
        simple = spec.get("simple")
        hashing = spec.get("consistentHash")
        if simple is not None and hashing is not None:
            raise self.fail(where, "gives both simple and consistentHash")
        setting = spec.get("localityLbSetting")
        locality = (
            None
            if setting is None
            else read_locality_lb(self, setting, f"{where}.localityLbSetting")
        )
        if hashing is not None:
            return LoadBalancer(
                consistent_hash=self.hash(hashing, f"{where}.consistentHash"), locality=locality
            )
        name = "UNSPECIFIED" if simple is None else simple
        return LoadBalancer(self.enum(name, f"{where}.simple", SIMPLE_POLICIES), locality=locality)

    def hash(self, value: Any, where: str) -> ConsistentHash:
        spec = self.known(value, where, _HASH)
        keys = [
            k
            for k in ("httpHeaderName", "httpCookie", "useSourceIp", "httpQueryParameterName")
            if spec.get(k) not in (None, False)
        ]
        if len(keys) != 1:
            raise self.fail(
                where,
                "must give one of httpHeaderName, httpCookie, useSourceIp, httpQueryParameterName",
            )
        ring = self.mapping(
            spec.get("ringHash"), f"{where}.ringHash", frozenset({"minimumRingSize"})
        )
        size = ring.get("minimumRingSize", spec.get("minimumRingSize"))
        hashing = ConsistentHash(
            minimum_ring_size=self.integer(size, f"{where}.ringHash.minimumRingSize", 1, 1 << 23)
            if size is not None
            else DEFAULT_RING_SIZE
        )
        if "httpHeaderName" in keys:
            return replace(
                hashing, header=self.string(spec["httpHeaderName"], f"{where}.httpHeaderName", 256)
            )
        if "useSourceIp" in keys:
            return replace(hashing, source_ip=self.boolean(spec["useSourceIp"], where))
        if "httpQueryParameterName" in keys:
            name = self.string(spec["httpQueryParameterName"], f"{where}.httpQueryParameterName")
            return replace(hashing, query_parameter=name)
        cookie = self.known(spec["httpCookie"], f"{where}.httpCookie", _COOKIE)
        return replace(
            hashing,
            cookie=self.string(cookie.get("name"), f"{where}.httpCookie.name", 256),
            cookie_path=self.optional_string(cookie.get("path"), f"{where}.httpCookie.path"),
            cookie_ttl=self.duration(cookie.get("ttl"), f"{where}.httpCookie.ttl"),
        )

    def pool(self, value: Any, where: str) -> ConnectionPool | None:
        if value is None:
            return None
        spec = self.known(value, where, _POOL)
        tcp = self.known(spec.get("tcp"), f"{where}.tcp", _TCP)
        http = self.known(spec.get("http"), f"{where}.http", _HTTP)

        def count(fields: Mapping[str, Any], name: str, at: str) -> int | None:
            return self.optional_integer(fields.get(name), f"{where}.{at}.{name}", 0, _INT32)

        return ConnectionPool(
            max_connections=count(tcp, "maxConnections", "tcp"),
            connect_timeout=self.duration(
                tcp.get("connectTimeout"), f"{where}.tcp.connectTimeout", _MS
            ),
            tcp_idle_timeout=self.duration(tcp.get("idleTimeout"), f"{where}.tcp.idleTimeout", _MS),
            http1_max_pending_requests=count(http, "http1MaxPendingRequests", "http"),
            http2_max_requests=count(http, "http2MaxRequests", "http"),
            max_requests_per_connection=count(http, "maxRequestsPerConnection", "http"),
            max_retries=count(http, "maxRetries", "http"),
            idle_timeout=self.duration(http.get("idleTimeout"), f"{where}.http.idleTimeout", _MS),
        )

    def outlier(self, value: Any, where: str) -> OutlierDetection | None:
        if value is None:
            return None
        spec = self.known(value, where, _OUTLIER)

        def wrapped(name: str) -> int | None:
            return self.optional_integer(spec.get(name), f"{where}.{name}", 0, _UINT32)

        five = wrapped("consecutive5xxErrors")
        if five is None:  # the deprecated name Istio still reads as the same
            five = wrapped("consecutiveErrors")
        return OutlierDetection(
            consecutive_5xx_errors=five,
            consecutive_gateway_errors=wrapped("consecutiveGatewayErrors"),
            interval=self.duration(spec.get("interval"), f"{where}.interval", _MS),
            base_ejection_time=self.duration(
                spec.get("baseEjectionTime"), f"{where}.baseEjectionTime", _MS
            ),
            max_ejection_percent=self.optional_integer(
                spec.get("maxEjectionPercent"), f"{where}.maxEjectionPercent", 0, 100
            ),
            min_health_percent=self.optional_integer(
                spec.get("minHealthPercent"), f"{where}.minHealthPercent", 0, 100
            )
            or 0,
        )

    def tls(self, value: Any, where: str) -> ClientTls | None:
        if value is None:
            return None
        spec = self.known(value, where, _TLS)
        mode = self.enum(spec.get("mode", "DISABLE"), f"{where}.mode", TLS_MODES)
        names = self.items(spec.get("subjectAltNames"), f"{where}.subjectAltNames", 64)
        unsupported = next((f for f in _FAIL_CLOSED_TLS if spec.get(f)), "")
        if mode == "MUTUAL":
            unsupported = "mode MUTUAL"
        return ClientTls(
            mode=mode,
            sni=self.optional_string(spec.get("sni"), f"{where}.sni", 253),
            subject_alt_names=tuple(
                self.string(n, f"{where}.subjectAltNames[{i}]", 253) for i, n in enumerate(names)
            ),
            ca_certificates=self.optional_string(
                spec.get("caCertificates"), f"{where}.caCertificates", MAX_STRING
            ),
            insecure_skip_verify=self.boolean(
                spec.get("insecureSkipVerify"), f"{where}.insecureSkipVerify"
            ),
            unsupported=unsupported,
        )

    def subsets(self, value: Any) -> tuple[Subset, ...]:
        found: dict[str, Subset] = {}
        for i, entry in enumerate(self.items(value, "spec.subsets", MAX_SUBSETS)):
            where = f"spec.subsets[{i}]"
            spec = self.mapping(entry, where, _SUBSET)
            name = self.dns_label(spec.get("name"), f"{where}.name")
            if name in found:
                raise self.fail(f"{where}.name", f"{name!r} is given twice")
            labels = self.string_map(spec.get("labels"), f"{where}.labels")
            found[name] = Subset(
                name, labels, self.policy(spec.get("trafficPolicy"), f"{where}.trafficPolicy")
            )
        return tuple(found.values())


def parse_destination_rule(obj: Mapping[str, Any], cluster_domain: str) -> DestinationRule:
    """One DestinationRule (a dict, as a file or the API server gives it); raises
    ConfigError naming the object and the field."""
    reader = _Rule(key_of(KIND, obj))
    api_version_checked(reader, obj)
    namespace, created = metadata(reader, obj)
    spec = reader.mapping(obj.get("spec"), "spec", _SPEC)
    if spec.get("workloadSelector") is not None:
        raise reader.fail("spec.workloadSelector", "is not supported by pilot")
    host = reader.host(spec.get("host"), "spec.host")
    return DestinationRule(
        key=reader.key,
        host=resolve_host(host, namespace, cluster_domain),
        created=created,
        export_to=reader.export_to(spec.get("exportTo"), "spec.exportTo"),
        traffic_policy=reader.policy(spec.get("trafficPolicy"), "spec.trafficPolicy"),
        subsets=reader.subsets(spec.get("subsets")),
    )
