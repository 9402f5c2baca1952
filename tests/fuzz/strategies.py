"""Hypothesis strategies: for each method, random bytes and hostile-but-valid calls.

`raw_call(method)` sends random bytes, or a valid message with bytes flipped, cut or
appended. The others build well-formed messages that push on every edge pilot has:

- xDS (`xds_call`, `fetch_call`): unknown, empty and foreign type URLs; empty, garbage
  and huge nonces and versions; the latest nonce (ACKs and NACKs, including storms of
  them); huge names and many names; wildcards; subscribe/unsubscribe storms; node
  metadata of every shape;
- CSDS (`csds_call`): node matchers of every kind, with regexes valid, invalid and
  catastrophic (`CATASTROPHIC`: they backtrack on the resident proxy's node id);
- the CA (`ca_call`): CSRs with every SAN trick (`csr`), absurd validity durations,
  impersonation metadata, credentials of every kind;
- Health (`health_call`) and reflection (`reflection_call`).

`clusters` are the real cluster names of the target, so that some names exist.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from envoy.type.matcher.v3 import node_pb2, regex_pb2, string_pb2, struct_pb2
from google.protobuf import struct_pb2 as pb_struct
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import strategies as st

from pilot._gen.istio.v1.auth import ca_pb2
from tests.fuzz import csr, methods
from tests.fuzz.calls import Call, Credentials, Header, XdsStep
from tests.fuzz.methods import Method
from tests.support.xds_client import CLUSTER, ENDPOINT, LISTENER, SECRET

TRUST_DOMAIN = "cluster.local"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SERVED_TYPES = (CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET)
OTHER_TYPES = (
    "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration",
    "type.googleapis.com/envoy.config.cluster.v3.Cluster ",
    "type.googleapis.com/",
    "type.googleapis.com/google.protobuf.Empty",
    "TYPE.GOOGLEAPIS.COM/ENVOY.CONFIG.CLUSTER.V3.CLUSTER",
    "type.googleapis.com/envoy.api.v2.Cluster",
    "type.googleapis.com/envoy.service.status.v3.ClientConfig",
    "*",
)
SECRET_NAMES = ("default", "ROOTCA", "file-cert:/etc/passwd~/etc/shadow", "kubernetes://x")
CATASTROPHIC = (
    "fuzz-resident~(a+)+~y",
    "fuzz-resident~(a|a)*~y",
    "fuzz-resident~(a*)*~y",
)
HUGE_PATTERN = 20_000  # regexes this long take pilot's loop a while just to compile
VALID_REGEXES = (".*", "fuzz-.*", "sidecar~.*", "fuzz-resident~a+~x", "(?i)FUZZ.*", "[a-z~]+", "")
INVALID_REGEXES = ("(", ")", "[", "*", "+a", "a{2,1}", "(?P<x", "\\", "[z-a]", "(?<=a+)b")
ISTIO_KEYS = (
    "NAMESPACE",
    "SERVICE_ACCOUNT",
    "CLUSTER_ID",
    "LABELS",
    "ISTIO_VERSION",
    "INTERCEPTION_MODE",
    "PROXY_CONFIG",
    "WORKLOAD_NAME",
    "ImpersonatedIdentity",
)
ACCOUNT_WORDS = (
    "default",
    "ns-a",
    "ns-b",
    "victim",
    "attacker",
    "istio-system",
    "",
    "..",
    ".",
    "a/b",
    "/",
    "UPPER",
    " ",
    "ns\n",
    "*",
    "ns~b",
)
_ASCII = string.ascii_letters + string.digits + string.punctuation

# -- small pieces ------------------------------------------------------------------

short_text = st.text(max_size=30)
ascii_text = st.text(alphabet=_ASCII, max_size=40)
huge_text = st.builds(
    lambda char, size: char * size,
    st.sampled_from("xa~/*."),
    st.sampled_from([1_000, 100_000, 1_000_000]),
)
any_text = st.one_of(short_text, short_text, huge_text)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


def account_word() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(ACCOUNT_WORDS), short_text, huge_text)


json_value = st.recursive(
    st.none()
    | st.booleans()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(2**53), 2**53)
    | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(short_text, inner, max_size=4),
    max_leaves=8,
)


def metadata_dicts(claims: dict[str, str] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """Node metadata of every shape; `claims` (NAMESPACE, SERVICE_ACCOUNT) most often."""
    hostile = st.dictionaries(
        st.sampled_from(ISTIO_KEYS) | short_text,
        st.one_of(account_word(), json_value),
        max_size=6,
    )
    identities = st.fixed_dictionaries(
        {"NAMESPACE": account_word(), "SERVICE_ACCOUNT": account_word()}
    )
    return st.one_of(st.just(dict(claims or {})), identities, hostile)


def struct(values: dict[str, Any]) -> pb_struct.Struct:
    """A protobuf Struct holding `values` (JSON-like)."""
    result = pb_struct.Struct()
    result.update(values)
    return result


node_ids = st.one_of(
    st.sampled_from(
        [
            "sidecar~10.1.1.1~fuzz.default~default.svc.cluster.local",
            "router~10.1.1.2~gw.istio-system~istio-system.svc.cluster.local",
            "fuzz-resident~" + "a" * 23 + "~x",
            "",
            "~~~",
            "sidecar~::1~x~y",
        ]
    ),
    any_text,
)


def nodes(claims: dict[str, str] | None = None) -> st.SearchStrategy[base_pb2.Node]:
    return st.builds(
        lambda node_id, cluster, metadata, zone, agent: base_pb2.Node(
            id=node_id,
            cluster=cluster,
            metadata=struct(metadata),
            locality=base_pb2.Locality(zone=zone),
            user_agent_name=agent,
        ),
        node_ids,
        short_text,
        metadata_dicts(claims),
        short_text,
        st.sampled_from(["envoy", ""]) | short_text,
    )


def type_urls(method: Method) -> st.SearchStrategy[str]:
    own = st.sampled_from(method.xds_types)
    return st.one_of(
        own, own, own, st.sampled_from(SERVED_TYPES + OTHER_TYPES), st.just(""), any_text
    )


def names(clusters: Sequence[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(clusters),
        st.sampled_from(clusters),
        st.sampled_from(("*", "", *SECRET_NAMES)),
        short_text,
        huge_text,
    )


many_names = st.builds(
    lambda prefix, count: [f"{prefix}{i}" for i in range(count)],
    st.sampled_from(["n", "outbound|80||x", "default-"]),
    st.sampled_from([100, 1_000, 5_000, 50_000, 200_000]),
)


def name_lists(clusters: Sequence[str], many: bool = True) -> st.SearchStrategy[list[str]]:
    """A few names (real, wildcard, secrets, text, huge), or many (when `many`)."""
    few = st.lists(names(clusters), max_size=6)
    return st.one_of(few, few, few, many_names) if many else few


error_details = st.none() | st.builds(status_pb2.Status, code=int32, message=any_text)


# -- xDS -----------------------------------------------------------------------------


def _sotw_message(
    type_url: str, resource_names: list[str], version: str, nonce: str, error: Any
) -> discovery_pb2.DiscoveryRequest:
    message = discovery_pb2.DiscoveryRequest(
        type_url=type_url, resource_names=resource_names, version_info=version, response_nonce=nonce
    )
    if error is not None:
        message.error_detail.CopyFrom(error)
    return message


def _delta_message(
    type_url: str,
    names: tuple[list[str], list[str]],
    versions: dict[str, str],
    nonce: str,
    error: Any,
) -> discovery_pb2.DeltaDiscoveryRequest:
    subscribe, unsubscribe = names
    message = discovery_pb2.DeltaDiscoveryRequest(
        type_url=type_url,
        resource_names_subscribe=subscribe,
        resource_names_unsubscribe=unsubscribe,
        initial_resource_versions=versions,
        response_nonce=nonce,
    )
    if error is not None:
        message.error_detail.CopyFrom(error)
    return message


def xds_messages(
    method: Method, clusters: Sequence[str], many: bool = True
) -> st.SearchStrategy[Any]:
    """One DiscoveryRequest or DeltaDiscoveryRequest of the method's kind."""
    nonce = st.one_of(st.just(""), any_text)
    listed = name_lists(clusters, many)
    if method.delta:
        versions = st.dictionaries(names(clusters), any_text, max_size=4)
        return st.builds(
            _delta_message,
            type_urls(method),
            st.tuples(listed, listed),
            versions,
            nonce,
            error_details,
        )
    return st.builds(_sotw_message, type_urls(method), listed, any_text, nonce, error_details)


def xds_steps(
    method: Method, clusters: Sequence[str], many: bool = True
) -> st.SearchStrategy[XdsStep]:
    return st.builds(XdsStep, xds_messages(method, clusters, many), st.booleans())


def _storm(step: XdsStep, other: XdsStep, count: int) -> list[XdsStep]:
    return [step if i % 2 == 0 else other for i in range(count)]


def xds_sequences(method: Method, clusters: Sequence[str]) -> st.SearchStrategy[list[XdsStep]]:
    """A few requests, or a storm: two requests alternating many times (ACKs, NACKs,
    subscribe and unsubscribe, wildcard on and off)."""
    steps = xds_steps(method, clusters)
    small = xds_steps(method, clusters, many=False)
    storms = st.builds(_storm, small, small, st.sampled_from([20, 100, 400]))
    return st.one_of(st.lists(steps, min_size=1, max_size=6), storms)


def _with_node(steps: list[XdsStep], first: base_pb2.Node | None) -> list[XdsStep]:
    if first is None or not steps:
        return steps
    message = type(steps[0].message)()
    message.CopyFrom(steps[0].message)
    message.node.CopyFrom(first)
    return [XdsStep(message, steps[0].last_nonce), *steps[1:]]


def credentials() -> st.SearchStrategy[Credentials | Header]:
    """Mostly the target's own; sometimes none, another's, or a header of any shape."""
    headers = st.builds(
        Header,
        st.one_of(
            st.sampled_from(["Bearer", "Bearer ", "bearer x", "Basic YTpi", "Bearer a b", ""]),
            st.builds(lambda t: f"Bearer {t}", ascii_text),
            st.just("Bearer " + "x" * 6000),
        ),
    )
    named = st.sampled_from(list(Credentials))
    return st.one_of(st.just(Credentials.DEFAULT), st.just(Credentials.DEFAULT), named, headers)


def xds_call(
    method: Method, clusters: Sequence[str], claims: dict[str, str] | None = None
) -> st.SearchStrategy[Call]:
    """A stream of hostile requests; the first carries a node (an Envoy-like one most often)."""
    first = st.one_of(st.just(_node(claims)), nodes(claims), st.none())
    return st.builds(
        lambda steps, node, who: Call(method, tuple(_with_node(steps, node)), who),
        xds_sequences(method, clusters),
        first,
        credentials(),
    )


def _node(claims: dict[str, str] | None) -> base_pb2.Node:
    return base_pb2.Node(
        id="sidecar~10.1.1.1~fuzz.default~default.svc.cluster.local",
        cluster="fuzz",
        metadata=struct(dict(claims or {})),
    )


def fetch_call(
    method: Method, clusters: Sequence[str], claims: dict[str, str] | None = None
) -> st.SearchStrategy[Call]:
    """One DiscoveryRequest to FetchClusters or FetchEndpoints."""

    def build(message: Any, node: base_pb2.Node | None, who: Credentials | Header) -> Call:
        if node is not None:
            message.node.CopyFrom(node)
        return Call(method, (message,), who)

    messages = st.builds(
        _sotw_message,
        type_urls(method),
        name_lists(clusters),
        any_text,
        any_text,
        error_details,
    )
    return st.builds(build, messages, st.none() | nodes(claims), credentials())


# -- CSDS -----------------------------------------------------------------------------

regexes = st.one_of(
    st.sampled_from(VALID_REGEXES),
    st.sampled_from(INVALID_REGEXES),
    st.sampled_from(CATASTROPHIC),
    st.sampled_from([HUGE_PATTERN * 5, HUGE_PATTERN * 50]).map(lambda n: "a" * n),
    short_text,
)


def string_matchers() -> st.SearchStrategy[string_pb2.StringMatcher]:
    plain = st.one_of(st.sampled_from(["fuzz-resident", "~x", "sidecar~", ""]), any_text)

    def build(kind: str, text: str, regex: str, ignore_case: bool) -> string_pb2.StringMatcher:
        if kind == "safe_regex":
            matcher = string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=regex))
        else:
            matcher = string_pb2.StringMatcher(**{kind: text})
        matcher.ignore_case = ignore_case
        return matcher

    kinds = st.sampled_from(["exact", "prefix", "suffix", "contains", "safe_regex", "safe_regex"])
    return st.builds(build, kinds, plain, regexes, st.booleans())


def _node_matcher(
    matcher: string_pb2.StringMatcher | None, path: list[str]
) -> node_pb2.NodeMatcher:
    result = node_pb2.NodeMatcher()
    if matcher is not None:
        result.node_id.CopyFrom(matcher)
    if path:
        struct = result.node_metadatas.add()
        struct.path.extend(struct_pb2.StructMatcher.PathSegment(key=key) for key in path)
    return result


def csds_requests() -> st.SearchStrategy[csds_pb2.ClientStatusRequest]:
    matchers = st.builds(
        _node_matcher, st.none() | string_matchers(), st.lists(short_text, max_size=3)
    )

    def build(found: list[Any], node: base_pb2.Node | None, exclude: bool) -> Any:
        request = csds_pb2.ClientStatusRequest(
            node_matchers=found, exclude_resource_contents=exclude
        )
        if node is not None:
            request.node.CopyFrom(node)
        return request

    return st.builds(build, st.lists(matchers, max_size=4), st.none() | nodes(), st.booleans())


def csds_call(method: Method) -> st.SearchStrategy[Call]:
    count = 1 if method is methods.CSDS_FETCH else 4
    return st.builds(
        lambda found, who: Call(method, tuple(found), who),
        st.lists(csds_requests(), min_size=1, max_size=count),
        credentials(),
    )


def safe_regexes(call: Call) -> list[str]:
    """Every regex in a CSDS call's node matchers."""
    found = []
    for message in call.messages():
        for matcher in getattr(message, "node_matchers", ()):
            if matcher.node_id.WhichOneof("match_pattern") == "safe_regex":
                found.append(matcher.node_id.safe_regex.regex)
    return found


# -- the CA -----------------------------------------------------------------------------


def spiffe_tricks() -> st.SearchStrategy[str]:
    td = TRUST_DOMAIN
    return st.one_of(
        st.sampled_from(
            [
                f"spiffe://{td}/ns/ns-b/sa/victim",
                f"spiffe://{td}/ns/istio-system/sa/istiod",
                f"spiffe://{td}/ns/ns-a/sa/attacker",
                "spiffe://evil.example/ns/ns-b/sa/victim",
                f"spiffe://{td}/ns/../sa/victim",
                f"spiffe://{td}/ns/a/b/sa/c",
                f"SPIFFE://{td.upper()}/NS/NS-B/SA/VICTIM",
                f"spiffe://{td}/ns/ns-b/sa/victim/",
                f"spiffe://{td}/ns/ns-b/sa/victim?x=1#y",
                f"spiffe://{td}/ns/%2e%2e/sa/victim",
                "spiffe://",
                f"spiffe://{td}/ns//sa/",
                f"spiffe://{td}/ns/{'n' * 5000}/sa/victim",
            ]
        ),
        st.builds(lambda ns, sa: f"spiffe://{td}/ns/{ns}/sa/{sa}", ascii_text, ascii_text),
    )


def sans() -> st.SearchStrategy[list[tuple[str, str]]]:
    one = st.one_of(
        st.tuples(st.just("uri"), spiffe_tricks()),
        st.tuples(st.just("uri"), ascii_text),
        st.tuples(
            st.just("dns"),
            st.sampled_from(["*.example.com", "localhost", "..", "a" * 300, "-x-.com"])
            | ascii_text,
        ),
        st.tuples(st.just("ip"), st.sampled_from(["127.0.0.1", "::1", "0.0.0.0", "10.0.0.1"])),
        st.tuples(st.just("email"), st.sampled_from(["a@b", "root@localhost"]) | ascii_text),
    )
    many = st.builds(lambda s, n: [s] * n, one, st.sampled_from([50, 500]))
    return st.one_of(st.lists(one, max_size=5), many)


def csrs() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(
            csr.build_csr,
            st.sampled_from(csr.KEY_KINDS),
            st.none() | ascii_text | st.just("x" * 64),
            sans(),
            st.sampled_from(csr.MANGLES),
        ),
        any_text,
    )


validity = st.one_of(
    st.sampled_from(
        [0, 1, -1, 3600, 90 * 86400, 90 * 86400 + 1, 2**31, 2**62, 2**63 - 1, -(2**63)]
    ),
    int64,
)


def ca_call() -> st.SearchStrategy[Call]:
    impersonated = st.one_of(
        st.just({}),
        st.builds(lambda uri: {"ImpersonatedIdentity": uri}, spiffe_tricks()),
        st.builds(lambda value: {"ImpersonatedIdentity": value}, json_value),
        metadata_dicts(),
    )

    def build(pem: str, seconds: int, metadata: dict[str, Any], who: Any) -> Call:
        request = ca_pb2.IstioCertificateRequest(
            csr=pem, validity_duration=seconds, metadata=struct(metadata)
        )
        return Call(methods.CA_CREATE, (request,), who)

    return st.builds(build, csrs(), validity, impersonated, credentials())


# -- Health, reflection, random bytes ----------------------------------------------------


def health_call(method: Method) -> st.SearchStrategy[Call]:
    service = st.one_of(
        st.sampled_from(["", *methods.XDS_SERVICE_NAMES, "grpc.health.v1.Health", "nope"]),
        any_text,
    )
    return st.builds(
        lambda name, who: Call(method, (health_pb2.HealthCheckRequest(service=name),), who),
        service,
        credentials(),
    )


def _reflection_request(kind: str, text: str, number: int, host: str) -> Any:
    request = reflection_pb2.ServerReflectionRequest(host=host)
    if kind == "file_containing_extension":
        request.file_containing_extension.containing_type = text
        request.file_containing_extension.extension_number = number
    elif kind != "nothing":
        setattr(request, kind, text)
    return request


def reflection_call(method: Method = methods.REFLECTION) -> st.SearchStrategy[Call]:
    """v1 and v1alpha requests are the same bytes: one strategy serves both methods."""
    kinds = st.sampled_from(
        [
            "file_by_filename",
            "file_containing_symbol",
            "file_containing_extension",
            "all_extension_numbers_of_type",
            "list_services",
            "nothing",
        ]
    )
    text = st.one_of(
        st.sampled_from(
            [
                "envoy/service/discovery/v3/ads.proto",
                "envoy.service.discovery.v3.AggregatedDiscoveryService",
                "envoy.service.discovery.v3.DiscoveryRequest",
                "google.protobuf.Any",
                "google/protobuf/descriptor.proto",
                ".",
                "",
            ]
        ),
        any_text,
    )
    requests = st.builds(_reflection_request, kinds, text, int32, short_text)
    return st.builds(
        lambda found, who: Call(method, tuple(found), who),
        st.lists(requests, min_size=1, max_size=5),
        credentials(),
    )


def _seed(method: Method) -> bytes:
    """A small valid request of the method's kind, to mutate."""
    request = method.request()
    if method.xds_types:
        request.type_url = method.xds_types[0]
        request.node.id = "sidecar~10.1.1.1~fuzz.default~default.svc.cluster.local"
    elif method in methods.REFLECTIONS:
        request.list_services = ""
    return bytes(request.SerializeToString())


def _mutate(seed: bytes, position: int, flip: int, cut: bool, tail: bytes) -> bytes:
    data = bytearray(seed)
    if data:
        data[position % len(data)] ^= flip
    if cut:
        data = data[: position % (len(data) + 1)]
    return bytes(data) + tail


def raw_messages(method: Method) -> st.SearchStrategy[bytes]:
    mutated = st.builds(
        _mutate,
        st.just(_seed(method)),
        st.integers(0, 1 << 16),
        st.integers(0, 255),
        st.booleans(),
        st.binary(max_size=16),
    )
    return st.one_of(st.binary(max_size=256), mutated)


def raw_call(method: Method) -> st.SearchStrategy[Call]:
    """Random bytes (or a mutated valid message) as the request(s), the target's credentials."""
    count = 1 if method.shape is not methods.Shape.BIDI else 3
    return st.builds(
        lambda found: Call(method, tuple(found)),
        st.lists(raw_messages(method), min_size=1, max_size=count),
    )


def hostile_call(
    method: Method, clusters: Sequence[str], claims: dict[str, str] | None = None
) -> st.SearchStrategy[Call]:
    """The well-formed but hostile calls for any method."""
    if method.xds_stream:
        return xds_call(method, clusters, claims)
    if method in methods.FETCHES:
        return fetch_call(method, clusters, claims)
    if method in (methods.CSDS_FETCH, methods.CSDS_STREAM):
        return csds_call(method)
    if method is methods.CA_CREATE:
        return ca_call()
    if method in (methods.HEALTH_CHECK, methods.HEALTH_WATCH):
        return health_call(method)
    return reflection_call(method)
