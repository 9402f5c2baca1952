"""pilot's wire bytes read by a second decoder that shares no code with pilot's.

pilot writes xDS responses it assembles itself: each resource serialized once
(by protobuf, or by hand for ClusterLoadAssignments) and spliced into
DiscoveryResponse and DeltaDiscoveryResponse frames by hand. protobuf (upb),
which pilot also uses, is one reader of those bytes; envoy-data-plane is
another: dataclasses generated from Envoy's .proto files by betterproto2, a
pure-Python codec with no protobuf runtime underneath. `read_response` decodes
one response with both and fails unless

- envoy-data-plane meets no field it does not know, anywhere in the response or
  inside its resources (a field number or wire type written wrong by hand lands
  there; protobuf would keep it silently as an unknown field);
- both decoders give the same proto3 JSON form of the response around its
  resources, and of every resource, each unpacked from its `Any` by the
  library's own type registry (nested `Any`s, such as a cluster's protocol
  options, likewise);
- each resource's `Any` names the response's type, and a delta `Resource`'s
  name is the name of the resource it wraps.

It returns the response as envoy-data-plane's typed dataclasses, so that tests
check the content against what they fed pilot (`Frame`, `hosts`,
`ClusterFacts`, `SecretFacts`).

Secrets hold private keys: a failure names the JSON path where the decoders
part, never a value, and is raised from `_fail`, whose only argument is the
message (pytest prints the arguments of the frame that raised). `SecretFacts`
keeps digests of the key material, never the material.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import betterproto2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401 (registers it)
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

with warnings.catch_warnings():
    # envoy-data-plane 2.2.0's generated validators use a form pydantic 2.12 deprecates:
    # about a hundred warnings at import, about code no test here can change.
    warnings.simplefilter("ignore", DeprecationWarning)
    from envoy_data_plane.envoy.config.cluster import v3 as edp_cluster
    from envoy_data_plane.envoy.config.endpoint import v3 as edp_endpoint
    from envoy_data_plane.envoy.extensions.transport_sockets.tls import v3 as edp_tls
    from envoy_data_plane.envoy.extensions.upstreams.http import v3 as edp_http
    from envoy_data_plane.envoy.service.discovery import v3 as edp_discovery
    from envoy_data_plane.google import protobuf as edp_protobuf

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

T = TypeVar("T")

# type URL -> (envoy-data-plane class, protobuf class)
RESOURCE_CLASSES: dict[str, tuple[type[betterproto2.Message], type[Message]]] = {
    CLUSTER: (edp_cluster.Cluster, cluster_pb2.Cluster),
    ENDPOINT: (edp_endpoint.ClusterLoadAssignment, endpoint_pb2.ClusterLoadAssignment),
    SECRET: (edp_tls.Secret, secret_pb2.Secret),
}


def _fail(message: str) -> NoReturn:
    """Fail from a frame whose only argument is the message, never the bytes or a secret."""
    raise AssertionError(message)


# --------------------------------------------------------------------------- comparing


def _differences(ours: Any, theirs: Any, path: str) -> Iterator[str]:
    """JSON paths where two proto3 JSON values differ (the values themselves are not shown)."""
    if isinstance(ours, Mapping) and isinstance(theirs, Mapping):
        for key in sorted(set(ours) | set(theirs)):
            if key not in ours or key not in theirs:
                side = "protobuf" if key in theirs else "envoy-data-plane"
                yield f"{path}.{key} (only {side} has it)"
            else:
                yield from _differences(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            yield f"{path} ({len(ours)} items vs {len(theirs)})"
        for i, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
            yield from _differences(mine, other, f"{path}[{i}]")
    elif type(ours) is not type(theirs) or ours != theirs:
        yield path


def _check_same(ours: Any, theirs: Any, path: str) -> None:
    differences = list(_differences(ours, theirs, path))
    if differences:
        _fail(f"envoy-data-plane and protobuf read different values at {differences[:5]}")


def _fields(message: betterproto2.Message) -> Iterator[tuple[str, betterproto2.Message]]:
    """(path suffix, sub-message) for every message-typed value set in `message`."""
    for name in message._betterproto.meta_by_field_name:
        value = getattr(message, name)
        if isinstance(value, Mapping):
            items: Iterator[tuple[str, Any]] = ((f"{name}[{k!r}]", v) for k, v in value.items())
        elif isinstance(value, list):
            items = ((f"{name}[{i}]", v) for i, v in enumerate(value))
        else:
            items = iter([(name, value)])
        for suffix, item in items:
            if isinstance(item, betterproto2.Message):
                yield suffix, item


def unknown_fields(message: betterproto2.Message, path: str) -> Iterator[str]:
    """Paths of the messages (packed `Any` values included) holding fields their type lacks."""
    if message._unknown_fields:
        yield path
    if isinstance(message, edp_protobuf.Any) and message.type_url:
        yield from unknown_fields(_unpacked(message), f"{path}<{message.type_url}>")
    for suffix, sub in _fields(message):
        yield from unknown_fields(sub, f"{path}.{suffix}")


def _unpacked(packed: edp_protobuf.Any) -> betterproto2.Message:
    if not packed.type_url:
        _fail("an Any without a type URL")
    message = _attempt(f"envoy-data-plane cannot unpack a {packed.type_url!r}", packed.unpack)
    assert message is not None
    return message


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, repr=False)
class Frame:
    """One response as envoy-data-plane read it: the frame's fields and its resources.

    `version` is `version_info` (SotW) or `system_version_info` (delta);
    `versions` the delta `Resource.version` of each name (empty for SotW).
    """

    type_url: str
    version: str
    nonce: str
    resources: dict[str, Any]  # name -> envoy-data-plane message
    versions: dict[str, str]
    removed: tuple[str, ...]

    def __repr__(self) -> str:  # names only: a Secret holds a private key
        kind = self.type_url.rsplit(".", 1)[-1]
        return f"Frame({kind} {sorted(self.resources)}, removed={list(self.removed)})"

    def summaries(self) -> dict[str, object]:
        """name -> what a test compares of each resource (never key material)."""
        return {name: summarize(self.type_url, m) for name, m in self.resources.items()}


def resource_name(message: Any) -> str:
    """The name of a Cluster, ClusterLoadAssignment or Secret (either library's)."""
    name = message.cluster_name if hasattr(message, "cluster_name") else message.name
    return str(name)


def _attempt(action: str, operation: Callable[[], T]) -> T:
    """Run one decoder step; if it raises, fail saying what was being done and the kind of
    error only (its message, arguments and traceback may hold the bytes being decoded)."""
    try:
        return operation()
    except Exception as error:  # whatever a decoder raises on bad bytes
        kind = type(error).__name__
    _fail(f"{action}: {kind}")  # outside `except`: no chained exception to print


def _parse(message_class: Any, wire: bytes) -> Any:
    library = "envoy-data-plane" if issubclass(message_class, betterproto2.Message) else "protobuf"
    return _attempt(
        f"{library} cannot parse a {message_class.__name__}", lambda: message_class.FromString(wire)
    )


def _edp_json(message: betterproto2.Message, path: str) -> dict[str, Any]:
    return _attempt(f"{path}: envoy-data-plane cannot write it as JSON", message.to_dict)


def _pb_json(message: Message, path: str) -> dict[str, Any]:
    return _attempt(f"{path}: protobuf cannot write it as JSON", lambda: MessageToDict(message))


def _check_known(message: betterproto2.Message, path: str) -> None:
    unknown = list(unknown_fields(message, path))
    if unknown:
        _fail(f"fields envoy-data-plane does not know, in {unknown[:5]}")


def _resource(
    type_url: str, ours: edp_protobuf.Any, theirs: any_pb2.Any, path: str
) -> betterproto2.Message:
    """Unpack one resource with both libraries; they must agree on its JSON form."""
    if ours.type_url != type_url:
        _fail(f"{path}: a {ours.type_url!r} in a {type_url!r} response")
    if ours._unknown_fields:
        _fail(f"{path}: fields envoy-data-plane does not know in the Any")
    edp_class, pb_class = RESOURCE_CLASSES[type_url]
    message = _unpacked(ours)
    if not isinstance(message, edp_class):
        _fail(f"{path}: unpacked as {type(message).__name__}, not {edp_class.__name__}")
    _check_known(message, path)
    reference = pb_class()
    if not _attempt(f"{path}: protobuf cannot unpack it", lambda: theirs.Unpack(reference)):
        _fail(f"{path}: protobuf cannot unpack it as a {pb_class.__name__}")
    _check_same(_edp_json(message, path), _pb_json(reference, path), path)
    return message


def _named(entries: list[tuple[str, betterproto2.Message]]) -> dict[str, Any]:
    named: dict[str, Any] = {}
    for name, message in entries:
        if name in named:
            _fail(f"{name!r} twice in one response")
        named[name] = message
    return named


def _packed_pairs(ours: list[Any], theirs: Any) -> list[tuple[Any, Any]]:
    if len(ours) != len(theirs):
        _fail(f"envoy-data-plane reads {len(ours)} resources, protobuf {len(theirs)}")
    return list(zip(ours, theirs, strict=True))


def _check_frame(ours: betterproto2.Message, theirs: Message) -> None:
    """The response around its resources (each resource is compared on its own, once):
    `ours` and `theirs` come without them."""
    _check_known(ours, "response")
    _check_same(_edp_json(ours, "response"), _pb_json(theirs, "response"), "response")


def _read_sotw(wire: bytes) -> Frame:
    ours = _parse(edp_discovery.DiscoveryResponse, wire)
    theirs = _parse(discovery_pb2.DiscoveryResponse, wire)
    pairs = _packed_pairs(ours.resources, theirs.resources)
    ours.resources = []
    around = discovery_pb2.DiscoveryResponse()
    around.CopyFrom(theirs)
    around.ClearField("resources")
    _check_frame(ours, around)
    entries = []
    for i, (mine, other) in enumerate(pairs):
        message = _resource(ours.type_url, mine, other, f"resources[{i}]")
        entries.append((resource_name(message), message))
    return Frame(ours.type_url, ours.version_info, ours.nonce, _named(entries), {}, ())


def _read_delta(wire: bytes) -> Frame:
    ours = _parse(edp_discovery.DeltaDiscoveryResponse, wire)
    theirs = _parse(discovery_pb2.DeltaDiscoveryResponse, wire)
    pairs = []
    for i, (mine, other) in enumerate(_packed_pairs(ours.resources, theirs.resources)):
        if mine.resource is None:
            _fail(f"resources[{i}] ({mine.name!r}) carries no resource")
        pairs.append((mine.resource, other.resource))
        mine.resource = None
    around = discovery_pb2.DeltaDiscoveryResponse()
    around.CopyFrom(theirs)
    for wrapper in around.resources:
        wrapper.ClearField("resource")
    _check_frame(ours, around)  # the Resource wrappers (name, version, ...) included
    entries, versions = [], {}
    for i, (wrapper, (mine, other)) in enumerate(zip(ours.resources, pairs, strict=True)):
        message = _resource(ours.type_url, mine, other, f"resources[{i}]")
        if resource_name(message) != wrapper.name:
            _fail(
                f"resources[{i}]: Resource.name {wrapper.name!r} wraps {resource_name(message)!r}"
            )
        entries.append((wrapper.name, message))
        versions[wrapper.name] = wrapper.version
    return Frame(
        ours.type_url,
        ours.system_version_info,
        ours.nonce,
        _named(entries),
        versions,
        tuple(ours.removed_resources),
    )


def read_response(wire: bytes, *, delta: bool) -> Frame:
    """Decode a DiscoveryResponse (or, `delta`, a DeltaDiscoveryResponse) with both
    libraries; fails unless they agree and nothing in it is unknown (see the module)."""
    return _read_delta(wire) if delta else _read_sotw(wire)


# --------------------------------------------------------------------------- content


def summarize(type_url: str, message: Any) -> object:
    """A Cluster's `ClusterFacts`, an assignment's `hosts`, a Secret's `SecretFacts`."""
    if type_url == CLUSTER:
        return ClusterFacts.of(message)
    if type_url == ENDPOINT:
        return hosts(message)
    return SecretFacts.of(message)


def hosts(assignment: edp_endpoint.ClusterLoadAssignment) -> dict[tuple[str, int], tuple[str, str]]:
    """(address, port) -> (health status name, zone) of every endpoint of an assignment."""
    found = {}
    for group in assignment.endpoints:
        zone = group.locality.zone if group.locality is not None else ""
        for lb in group.lb_endpoints:
            address = lb.endpoint.address.socket_address
            found[(address.address, address.port_value)] = (lb.health_status.name, zone)
    return found


@dataclass(frozen=True)
class ClusterFacts:
    """What a test checks of a Cluster: discovery type, timeout, EDS source, HTTP/2."""

    name: str
    discovery: str  # "EDS"
    connect_timeout_seconds: float
    eds_source: str  # "ads", or the API type ("GRPC", "DELTA_GRPC") and cluster it names
    http2: bool

    @classmethod
    def of(cls, cluster: edp_cluster.Cluster) -> ClusterFacts:
        source = cluster.eds_cluster_config.eds_config
        if source.ads is not None:
            eds_source = "ads"
        else:
            api = source.api_config_source
            names = [g.envoy_grpc.cluster_name for g in api.grpc_services]
            eds_source = f"{api.api_type.name} {names}"
        options = [_unpacked(o) for o in cluster.typed_extension_protocol_options.values()]
        http2 = any(
            isinstance(option, edp_http.HttpProtocolOptions)
            and option.explicit_http_config is not None
            and option.explicit_http_config.http2_protocol_options is not None
            for option in options
        )
        timeout = cluster.connect_timeout
        return cls(
            cluster.name,
            cluster.type.name,
            timeout.total_seconds() if timeout is not None else 0.0,
            eds_source,
            http2,
        )


def expected_cluster(
    name: str, flavor: str, http2: bool, xds_cluster: str = "xds-grpc"
) -> ClusterFacts:
    """What pilot's cluster `name` must read as for a stream of this flavor (`ads`,
    `grpc`, `delta_grpc`): EDS, Istio's 10 s connect timeout, the EDS source the flavor
    implies, HTTP/2 upstream options when the port speaks it."""
    source = "ads" if flavor == "ads" else f"{flavor.upper()} [{xds_cluster!r}]"
    return ClusterFacts(name, "EDS", 10.0, source, http2)


def digest(material: bytes) -> str:
    """What a test keeps of key material: a SHA-256, never the bytes."""
    return hashlib.sha256(material).hexdigest()


@dataclass(frozen=True)
class SecretFacts:
    """A Secret as a test may compare and print it: digests of its inline material."""

    name: str
    chain_sha256: str = ""
    key_sha256: str = ""
    trusted_ca_sha256: str = ""

    @classmethod
    def of(cls, secret: edp_tls.Secret) -> SecretFacts:
        tls, context = secret.tls_certificate, secret.validation_context
        if tls is not None:
            chain = tls.certificate_chain.inline_bytes if tls.certificate_chain else b""
            key = tls.private_key.inline_bytes if tls.private_key else b""
            return cls(secret.name, chain_sha256=digest(chain), key_sha256=digest(key))
        if context is not None and context.trusted_ca is not None:
            return cls(secret.name, trusted_ca_sha256=digest(context.trusted_ca.inline_bytes))
        return cls(secret.name)
