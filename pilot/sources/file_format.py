"""What a registry file may say: Kubernetes objects as JSON or YAML.

Reads Service, EndpointSlice and Endpoints objects (an endpoint's `targetRef`
too: the Pod it names, as Kubernetes writes it), Pods (for auto mTLS: their
IPs, service account and `security.istio.io/tlsMode` label) and
PeerAuthentications (`security.istio.io/v1` or `v1beta1`), DestinationRules and
VirtualServices (`networking.istio.io/v1`, `v1beta1`, `v1alpha3`), one per document or
in a `kind: List` (what `kubectl get svc,endpointslices,pods -A -o yaml` or
`-o json` prints). JSON is parsed as JSON (fifty times faster than as YAML,
which it also is); anything else, or JSON that does not parse, as YAML. Errors are one line
naming the file and the document and object, or the line and column where the
text stops being JSON or YAML.

RequestAuthentications (`security.istio.io/v1` or `v1beta1`) are read as
DestinationRules are: one that is not valid is named in `config_errors` and
`jwt_refused` (its last good version keeps applying).

AuthorizationPolicies (`security.istio.io/v1` or `v1beta1`) are read too; one that
is not valid does not refuse the file either: it stands in as *deny everything* for
its namespace's sidecars (said in one warning line when it is applied)
(`pilot.registry.authorization_policy.refused_policy`), since ignoring it would
let through what it denied.

A DestinationRule or VirtualService that is not valid does not refuse the file: it is
named in `RegistryState.config_errors` (one line each: kind, namespace, name, what is
wrong) and `refused` (its key: its last good version keeps serving), and every other
object of the file applies. Objects of Istio's other kinds (`UNSUPPORTED_KINDS`) are
only noted (`unsupported`), to be counted and listed.

A document may say which cluster its objects come from (`cluster: ID` beside
`kind`, for a `kind: List` its items'); objects of documents that name none
belong to the local cluster (the cluster id pilot was given, `--cluster-id`).

A file with no document at all (zero bytes, only whitespace, comments or `---`)
is what a truncating save leaves behind mid-write, not a registry: it is
refused (`EmptyRegistryFile`). An empty registry is said explicitly, with a
`kind: List` whose `items` are empty (`{"kind": "List", "items": []}`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from pilot.cluster_ids import RULE, is_cluster_id
from pilot.registry.authorization_policy import KIND as AUTHORIZATION_POLICY
from pilot.registry.authorization_policy import (
    AuthorizationPolicy,
    parse_authorization_policy,
    refused_policy,
)
from pilot.registry.destination_rule import KIND as DESTINATION_RULE
from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.istio_config import (
    UNSUPPORTED_KINDS,
    ConfigError,
    ConfigKey,
    istio_kind,
    key_of,
)
from pilot.registry.kubernetes_objects import (
    SUPPORTED_KINDS,
    ObjectError,
    object_label,
    parse_endpoint_slice,
    parse_endpoints,
    parse_pod,
    parse_service,
)
from pilot.registry.model import DEFAULT_CLUSTER_ID, EndpointSet, Pod, PodKey, Service
from pilot.registry.peer_authentication import (
    GROUP,
    KIND,
    VERSIONS,
    PeerAuthentication,
    PolicyError,
    parse_peer_authentication,
)
from pilot.registry.request_authentication import KIND as REQUEST_AUTHENTICATION
from pilot.registry.request_authentication import (
    RequestAuthentication,
    parse_request_authentication,
    refusal_of,
)
from pilot.registry.traffic_config import Config
from pilot.registry.virtual_service import KIND as VIRTUAL_SERVICE
from pilot.registry.virtual_service import parse_virtual_service

log = logging.getLogger("pilot.sources.file")

# libyaml parses a large registry an order of magnitude faster than pure Python.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_JSON_START = re.compile(r"\s*[\[{]")


class RegistryFileError(ValueError):
    """The registry file cannot be used; the message names the file and the problem."""


class EmptyRegistryFile(RegistryFileError):
    """The file holds no document at all: a broken (truncated) write, never applied."""

    def __init__(self, origin: str) -> None:
        super().__init__(
            f"{origin}: the file is empty (no document: a truncated or unfinished write?);"
            " an empty registry is a `kind: List` with `items: []`"
        )


def is_blank(data: bytes) -> bool:
    """Whether the file's bytes are nothing but whitespace (zero bytes included)."""
    return not data.strip()


@dataclass(frozen=True, slots=True)
class RegistryState:
    """Everything one version of the file says."""

    services: tuple[Service, ...]
    endpoint_sets: tuple[EndpointSet, ...]
    peer_authentications: tuple[PeerAuthentication, ...] = ()
    pods: tuple[Pod, ...] = ()
    traffic: tuple[Config, ...] = ()  # the valid DestinationRules and VirtualServices
    refused: tuple[ConfigKey, ...] = ()  # those that are not valid (their last good stays)
    config_errors: tuple[str, ...] = ()  # one line for each of them
    unsupported: tuple[ConfigKey, ...] = ()  # objects of Istio kinds pilot does not build
    # Valid ones, and a deny-everything stand-in for each that is not (see above).
    authorization_policies: tuple[AuthorizationPolicy, ...] = ()
    request_authentications: tuple[RequestAuthentication, ...] = ()  # the valid ones
    jwt_refused: tuple[ConfigKey, ...] = ()  # those that are not (their last good stays)


def _loaded(text: str, origin: str) -> list[Any]:
    """The file's documents: JSON if it is JSON, else YAML."""
    json_error: json.JSONDecodeError | None = None
    if _JSON_START.match(text):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            json_error = error  # YAML in flow style, or broken JSON
        else:
            return value if isinstance(value, list) else [value]
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as error:
        if json_error is not None:  # it looked like JSON: JSON's complaint is the one meant
            raise RegistryFileError(_json_problem(origin, json_error)) from error
        raise RegistryFileError(_yaml_problem(origin, text, error)) from error


def _json_problem(origin: str, error: json.JSONDecodeError) -> str:
    return f"{origin}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}"


def _yaml_problem(origin: str, text: str, error: yaml.YAMLError) -> str:
    """One line: the file, where in it (line and column, counted from 1), and what.

    PyYAML's own message spans lines and names its input `<unicode string>`."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        what = _one_line(error.problem or "")
        start = error.context_mark
        if (
            error.context
            and start is not None
            and (start.line, start.column)
            != (
                mark.line,
                mark.column,
            )
        ):
            what += (
                f" ({_one_line(error.context)} that starts at line {start.line + 1},"
                f" column {start.column + 1})"
            )
    elif isinstance(error, yaml.reader.ReaderError):
        before = text[: error.position]
        line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        where = f"line {line}, column {column}"
        what = _one_line(str(error).split("\n", 1)[0])
    else:
        return f"{origin}: not valid YAML: {_one_line(str(error))}"
    return f"{origin}: not valid YAML at {where}: {what}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


Located = tuple[str, str, Mapping[str, Any]]  # where, cluster, the object


def _documents(text: str, origin: str, local: str) -> Iterator[Located]:
    documents = _loaded(text, origin)
    if all(document is None for document in documents):
        raise EmptyRegistryFile(origin)
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue
        if not isinstance(document, Mapping):
            raise RegistryFileError(f"{origin}: document {number} is not a mapping")
        cluster = _cluster_of(document, f"{origin}: document {number}", local)
        if document.get("kind") == "List" or str(document.get("kind", "")).endswith("List"):
            items = document.get("items") or []
            if not isinstance(items, list):
                raise RegistryFileError(f"{origin}: document {number}: items must be a list")
            for index, item in enumerate(items):
                yield f"{origin}: document {number} item {index}", cluster, item
        else:
            yield f"{origin}: document {number}", cluster, document


def _cluster_of(document: Mapping[str, Any], where: str, local: str) -> str:
    cluster = document.get("cluster", local)
    if not isinstance(cluster, str) or not is_cluster_id(cluster):
        raise RegistryFileError(f"{where}: cluster must be a cluster id ({RULE})")
    return cluster


def _kind_of(where: str, obj: Any) -> str:
    if not isinstance(obj, Mapping):
        raise RegistryFileError(f"{where}: not a mapping")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise RegistryFileError(f"{where}: has no kind (is it a Kubernetes object?)")
    return kind


_PARSERS: dict[str, Callable[[Mapping[str, Any], str], Config]] = {
    DESTINATION_RULE: parse_destination_rule,
    VIRTUAL_SERVICE: parse_virtual_service,
}
_CONFIG_PARSE_ERRORS = (
    ConfigError,
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    RecursionError,
)


class _Traffic:
    """The file's Istio traffic objects: the good ones, the refused ones, the others."""

    def __init__(self, cluster_domain: str) -> None:
        self.cluster_domain = cluster_domain
        self.good: dict[ConfigKey, Config] = {}
        self.refused: list[ConfigKey] = []
        self.errors: list[str] = []
        self.unsupported: list[ConfigKey] = []
        self.authz: dict[ConfigKey, AuthorizationPolicy] = {}
        self.jwt: dict[ConfigKey, RequestAuthentication] = {}
        self.jwt_refused: list[ConfigKey] = []

    def take_request_authentication(self, where: str, obj: Mapping[str, Any]) -> None:
        """A valid one as written; one that is not is named (its last good version stays)."""
        key = key_of(REQUEST_AUTHENTICATION, obj)
        try:
            ra = parse_request_authentication(obj)
        except _CONFIG_PARSE_ERRORS as error:
            self.jwt_refused.append(key)
            self.errors.append(f"{where}: {refusal_of(obj, error)}")
            return
        if ra.key in self.jwt:
            self.jwt_refused.append(key)
            self.errors.append(f"{where}: {key} is already in the file")
            return
        self.jwt[ra.key] = ra

    def take_authorization_policy(self, where: str, obj: Mapping[str, Any]) -> None:
        """A valid one as written; one that is not, as its deny-everything stand-in."""
        key = key_of(AUTHORIZATION_POLICY, obj)
        try:
            policy: AuthorizationPolicy | None = parse_authorization_policy(obj)
        except _CONFIG_PARSE_ERRORS as error:  # said once, by the updater, as failing closed
            policy = refused_policy(obj, error if isinstance(error, ConfigError) else None)
        if policy is None:
            return
        if policy.key in self.authz:
            self.errors.append(f"{where}: {key} is already in the file")
            return
        self.authz[policy.key] = policy

    def take(self, where: str, kind: str, obj: Mapping[str, Any]) -> None:
        parse = _PARSERS[kind]
        key = key_of(kind, obj)
        try:
            config = parse(obj, self.cluster_domain)
        except _CONFIG_PARSE_ERRORS as error:
            what = str(error) if isinstance(error, ConfigError) else f"{key}: malformed"
            self.refused.append(key)
            self.errors.append(f"{where}: {what}")
            return
        if config.key in self.good:
            self.refused.append(key)
            self.errors.append(f"{where}: {key} is already in the file")
            return
        self.good[config.key] = config


def parse_registry(
    text: str,
    origin: str,
    cluster: str = DEFAULT_CLUSTER_ID,
    cluster_domain: str = "cluster.local",
) -> RegistryState:
    """Parse a whole file, objects of documents naming no cluster in `cluster`; raises
    RegistryFileError naming the first bad object (an invalid DestinationRule or
    VirtualService is noted in the state instead: see the module's docstring)."""
    services: list[Service] = []
    endpoint_sets: list[EndpointSet] = []
    policies: list[PeerAuthentication] = []
    pods: dict[PodKey, Pod] = {}
    traffic = _Traffic(cluster_domain)
    for where, at, obj in _documents(text, origin, cluster):
        kind = _kind_of(where, obj)
        if kind in _PARSERS:
            traffic.take(where, kind, obj)
            continue
        if kind == AUTHORIZATION_POLICY and istio_kind(obj) is not None:
            traffic.take_authorization_policy(where, obj)
            continue
        if kind == REQUEST_AUTHENTICATION and istio_kind(obj) is not None:
            traffic.take_request_authentication(where, obj)
            continue
        if kind in UNSUPPORTED_KINDS and istio_kind(obj) is not None:
            traffic.unsupported.append(key_of(kind, obj))
            continue
        if kind == KIND:
            policies.append(_peer_authentication(where, obj))
            continue
        if kind == POD_KIND:
            _add_pod(pods, where, obj, at)
            continue
        if kind not in SUPPORTED_KINDS:
            log.debug("%s: skipping %s", where, object_label(obj))
            continue
        try:
            if kind == "Service":
                services.append(parse_service(obj, at))
            elif kind == "EndpointSlice":
                parsed = parse_endpoint_slice(obj, at)
                if parsed is not None:
                    endpoint_sets.append(parsed)
            else:
                endpoint_sets.append(parse_endpoints(obj, at))
        except ObjectError as error:
            raise RegistryFileError(f"{where}: {error}") from error
    return RegistryState(
        tuple(services),
        tuple(endpoint_sets),
        tuple(policies),
        pods=tuple(pods.values()),
        traffic=tuple(traffic.good.values()),
        refused=tuple(traffic.refused),
        config_errors=tuple(traffic.errors),
        unsupported=tuple(traffic.unsupported),
        authorization_policies=tuple(traffic.authz.values()),
        request_authentications=tuple(traffic.jwt.values()),
        jwt_refused=tuple(traffic.jwt_refused),
    )


_API_VERSIONS = frozenset(f"{GROUP}/{version}" for version in VERSIONS)


def _peer_authentication(where: str, obj: Mapping[str, Any]) -> PeerAuthentication:
    """A PeerAuthentication of Istio's API (whatever `cluster` its document names: mesh
    policy is not per cluster)."""
    api_version = obj.get("apiVersion", next(iter(sorted(_API_VERSIONS))))
    if api_version not in _API_VERSIONS:
        shown = repr(api_version)[:60]
        raise RegistryFileError(
            f"{where}: {KIND} apiVersion {shown} is not one of {', '.join(sorted(_API_VERSIONS))}"
        )
    try:
        return parse_peer_authentication(obj)
    except PolicyError as error:
        raise RegistryFileError(f"{where}: {error}") from error


POD_KIND = "Pod"


def _add_pod(pods: dict[PodKey, Pod], where: str, obj: Mapping[str, Any], cluster: str) -> None:
    """A Pod of the file; the same pod twice is refused, as kubectl would refuse it."""
    try:
        pod = parse_pod(obj, cluster)
    except ObjectError as error:
        raise RegistryFileError(f"{where}: {error}") from error
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as error:
        # a shape no check foresaw: still one line naming the object, never a crash
        what = f"{type(error).__name__}: {str(error)[:200]}"
        raise RegistryFileError(f"{where}: {object_label(obj)}: malformed ({what})") from error
    if pod.key in pods:
        raise RegistryFileError(f"{where}: {object_label(obj)} is already in the file")
    pods[pod.key] = pod
