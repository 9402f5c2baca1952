"""What Istio's networking objects share: their names, hosts, exportTo and strict reading.

DestinationRule and VirtualService (`networking.istio.io/v1`, `v1beta1`,
`v1alpha3`) are read with `Reader`: every field is checked against the fields
Istio's API has (an unknown one is an error, as `istioctl validate` says), each
value for its type, and every list and string against a bound, so one object can
cost pilot only so much. An error is a `ConfigError` whose message names the
kind, namespace and name of the object and the field (`spec.subsets[2].name`),
in one line (names are escaped and cut short: they are anyone's text).

Hosts: a short name (no dot) is a service of the object's namespace
(`reviews` in `default` is `reviews.default.svc.cluster.local`, as Istio
resolves it); anything with a dot is taken as written, `*` prefixes included.
`exportTo` is `*` (every namespace, the default), `.` (the object's own) or
namespace names.

The other Istio kinds pilot does not implement (`UNSUPPORTED_KINDS`) are only
counted and listed: `istio_kind` tells them apart from the objects of other
APIs a registry file may hold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pilot.durations import parse_duration
from pilot.logs import clipped

NETWORKING_GROUP = "networking.istio.io"
NETWORKING_VERSIONS = ("v1", "v1beta1", "v1alpha3")
API_VERSIONS = frozenset(f"{NETWORKING_GROUP}/{v}" for v in NETWORKING_VERSIONS)
ISTIO_GROUPS = frozenset(
    {NETWORKING_GROUP, "security.istio.io", "telemetry.istio.io", "extensions.istio.io"}
)
# Istio kinds pilot reads nowhere: counted, listed on /debug, warned about once per kind.
UNSUPPORTED_KINDS = (
    "EnvoyFilter",
    "Gateway",
    "ProxyConfig",
    "ServiceEntry",
    "Sidecar",
    "Telemetry",
    "WasmPlugin",
    "WorkloadEntry",
    "WorkloadGroup",
)
EXPORT_ALL, EXPORT_SELF = "*", "."
MAX_LIST = 1024  # entries of any one list of an object (subsets, routes, matches, hosts)
MAX_STRING = 1024  # characters of a string that is not a regex or a name
MAX_NAME = 253  # a DNS name: hosts, namespaces
# Entries of every list and map of one object together: each list is bounded, but lists
# of lists multiply (256 routes x 1024 matches x 1024 headers): this bounds the product.
MAX_ENTRIES = 20_000
MAX_DURATION_SECONDS = 9_223_372_036  # Envoy refuses more: it converts to int64 nanoseconds
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_HOST = re.compile(r"(\*|\*\.)?[A-Za-z0-9]([-A-Za-z0-9._]{0,251}[A-Za-z0-9])?|\*")


class ConfigError(ValueError):
    """An object is not valid; the message names it and the field, in one line."""


@dataclass(frozen=True, slots=True, order=True)
class ConfigKey:
    """An Istio object's identity."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {clipped(self.namespace)}/{clipped(self.name)}"


def istio_kind(obj: Mapping[str, Any]) -> str | None:
    """The object's kind if its apiVersion is one of Istio's groups, else None."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    return kind if api_version.partition("/")[0] in ISTIO_GROUPS else None


def key_of(kind: str, obj: Mapping[str, Any]) -> ConfigKey:
    """The object's key as well as it can be told (for an error about it, too)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace, name = meta.get("namespace") or "default", meta.get("name")
    return ConfigKey(
        kind,
        namespace if isinstance(namespace, str) else "?",
        name if isinstance(name, str) and name else "?",
    )


def resolve_host(host: str, namespace: str, cluster_domain: str) -> str:
    """Istio's short-name resolution: a name without a dot is a service of `namespace`."""
    if "." in host or host.startswith("*"):
        return host
    return f"{host}.{namespace}.svc.{cluster_domain}"


def host_matches(pattern: str, host: str) -> bool:
    """Whether a (resolved) host, `*.example.com` wildcards included, names `host`."""
    if pattern == "*":
        return True
    if pattern.startswith("*"):
        return host.endswith(pattern[1:])
    return pattern == host


class Reader:
    """Strict reading of one object's fields; every error names the object and field."""

    def __init__(self, key: ConfigKey) -> None:
        self.key = key
        self._entries = 0

    def count(self, entries: int, where: str) -> None:
        """Charge `entries` to the object's budget (`MAX_ENTRIES`)."""
        self._entries += entries
        if self._entries > MAX_ENTRIES:
            raise self.fail(
                where, f"makes the object too large (over {MAX_ENTRIES} entries in all)"
            )

    def fail(self, where: str, what: str) -> ConfigError:
        return ConfigError(f"{self.key}: {where} {what}")

    def mapping(self, value: Any, where: str, fields: frozenset[str]) -> Mapping[str, Any]:
        """A mapping with only `fields` (None: empty)."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(where, f"must be a mapping, not a {type(value).__name__}")
        for field in value:
            if field not in fields:
                shown = clipped(str(field), 60)
                raise self.fail(where, f"has an unknown field {shown!r}")
        return value

    def items(self, value: Any, where: str, limit: int = MAX_LIST) -> Sequence[Any]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list, not a {type(value).__name__}")
        if len(value) > limit:
            raise self.fail(where, f"has {len(value)} entries (at most {limit})")
        self.count(len(value), where)
        return value

    def string(self, value: Any, where: str, limit: int = MAX_STRING) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, not a {type(value).__name__}")
        if len(value) > limit:
            raise self.fail(where, f"is {len(value)} characters long (at most {limit})")
        if not value.isprintable():
            raise self.fail(where, "has control characters")
        return value

    def optional_string(self, value: Any, where: str, limit: int = MAX_STRING) -> str:
        return "" if value is None else self.string(value, where, limit)

    def string_map(self, value: Any, where: str) -> tuple[tuple[str, str], ...]:
        """A map of strings to strings (labels, headers), sorted."""
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise self.fail(where, "must be a mapping of strings")
        if len(value) > MAX_LIST:
            raise self.fail(where, f"has {len(value)} entries (at most {MAX_LIST})")
        self.count(len(value), where)
        pairs = [
            (self.string(k, f"{where} key", MAX_NAME), self.string(v, f"{where}[{k}]"))
            for k, v in value.items()
        ]
        return tuple(sorted(pairs))

    def integer(self, value: Any, where: str, low: int = 0, high: int = 2**31 - 1) -> int:
        # JSON from the API server may give a wrapped integer as a string of digits.
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
            number = int(value)
        if number is None:
            raise self.fail(where, f"must be an integer, not a {type(value).__name__}")
        if not low <= number <= high:
            raise self.fail(where, f"{number} is not in {low}..{high}")
        return number

    def optional_integer(
        self, value: Any, where: str, low: int = 0, high: int = 2**31 - 1
    ) -> int | None:
        return None if value is None else self.integer(value, where, low, high)

    def number(self, value: Any, where: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"must be a number, not a {type(value).__name__}")
        if not math.isfinite(value) or not low <= value <= high:
            raise self.fail(where, f"{value} is not in {low}..{high}")
        return float(value)

    def boolean(self, value: Any, where: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(where, "must be true or false")
        return value

    def duration(self, value: Any, where: str, minimum: float = 0.0) -> float | None:
        """Seconds of a duration (`1s`, `0.5s`, `3m`, `30ms`); None when absent."""
        if value is None:
            return None
        text = self.string(value, where, 64)
        try:
            seconds = parse_duration(text)
        except ValueError as error:
            raise self.fail(where, str(error)) from None
        if seconds > MAX_DURATION_SECONDS:
            raise self.fail(where, "is longer than a Duration can be")
        if seconds < minimum:
            raise self.fail(where, f"must be at least {minimum * 1000:g}ms")
        return seconds

    def enum(self, value: Any, where: str, allowed: Sequence[str]) -> str:
        text = self.string(value, where, 64)
        if text not in allowed:
            raise self.fail(where, f"{text!r} is not one of {', '.join(allowed)}")
        return text

    def dns_label(self, value: Any, where: str) -> str:
        text = self.string(value, where, 63)
        if not _DNS_LABEL.fullmatch(text):
            raise self.fail(where, f"{text!r} is not a DNS-1123 label")
        return text

    def host(self, value: Any, where: str) -> str:
        text = self.string(value, where, MAX_NAME)
        if not _HOST.fullmatch(text):
            raise self.fail(where, f"{text!r} is not a host name")
        return text

    def export_to(self, value: Any, where: str) -> tuple[str, ...]:
        """`exportTo`: `*`, `.` or namespace names; absent: every namespace."""
        entries = self.items(value, where)
        if not entries:
            return (EXPORT_ALL,)
        names = []
        for i, entry in enumerate(entries):
            text = self.string(entry, f"{where}[{i}]", 63)
            if text not in (EXPORT_ALL, EXPORT_SELF) and not _DNS_LABEL.fullmatch(text):
                raise self.fail(f"{where}[{i}]", f"{text!r} is not *, . or a namespace")
            names.append(text)
        return tuple(sorted(set(names)))


def exported_to_all(export_to: tuple[str, ...]) -> bool:
    return EXPORT_ALL in export_to


def metadata(reader: Reader, obj: Mapping[str, Any]) -> tuple[str, str]:
    """The object's namespace and creationTimestamp, its name checked; raises ConfigError."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise reader.fail("metadata", "must be a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise reader.fail("metadata.name", "is missing")
    reader.string(name, "metadata.name", MAX_NAME)
    namespace = meta.get("namespace") or "default"
    reader.string(namespace, "metadata.namespace", 63)
    created = meta.get("creationTimestamp")
    return namespace, created if isinstance(created, str) else ""


def api_version_checked(reader: Reader, obj: Mapping[str, Any]) -> None:
    version = obj.get("apiVersion")
    if version not in API_VERSIONS:
        shown = clipped(str(version), 60)
        raise reader.fail(
            "apiVersion", f"{shown!r} is not one of {', '.join(sorted(API_VERSIONS))}"
        )
