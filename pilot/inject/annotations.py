"""Every pod annotation the template honours, parsed and validated strictly.

Values reach the init container's iptables arguments, the proxy's resources and its
PROXY_CONFIG env, so each is checked against its grammar (port lists, CIDRs,
Kubernetes quantities, booleans, a bounded ProxyConfig object) and a bad one is an
`InjectError` naming the annotation: the webhook answers `allowed: false`, never a
pod with a value it did not understand. Annotations the template does not honour are
left alone (Istio's `interceptionMode`, `componentLogLevel` and others: see docs).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from pilot.inject.errors import InjectError
from pilot.inject.settings import ENVOY_LOG_LEVELS, MAX_CONCURRENCY, is_image
from pilot.inject.shape import shown

INJECT = "sidecar.istio.io/inject"
STATUS = "sidecar.istio.io/status"
NATIVE_SIDECAR = "sidecar.istio.io/nativeSidecar"
REWRITE_PROBES = "sidecar.istio.io/rewriteAppHTTPProbers"
PROXY_CONFIG = "proxy.istio.io/config"
PROXY_IMAGE = "sidecar.istio.io/proxyImage"
LOG_LEVEL = "sidecar.istio.io/logLevel"
AGENT_LOG_LEVEL = "sidecar.istio.io/agentLogLevel"
INCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/includeInboundPorts"
EXCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/excludeInboundPorts"
INCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/includeOutboundPorts"
EXCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/excludeOutboundPorts"
INCLUDE_OUTBOUND_RANGES = "traffic.sidecar.istio.io/includeOutboundIPRanges"
EXCLUDE_OUTBOUND_RANGES = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
RESOURCES = {
    "sidecar.istio.io/proxyCPU": ("requests", "cpu"),
    "sidecar.istio.io/proxyMemory": ("requests", "memory"),
    "sidecar.istio.io/proxyCPULimit": ("limits", "cpu"),
    "sidecar.istio.io/proxyMemoryLimit": ("limits", "memory"),
}

# Go's strconv.ParseBool, which Istio reads these booleans with.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# A Kubernetes quantity, unsigned: digits with an optional fraction, then a binary or
# decimal SI suffix or a decimal exponent.
_QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?")
_MAX_LIST = 4096  # characters of one port or CIDR list
_MAX_QUANTITY = 32
_PROXY_CONFIG_KEY = re.compile(r"[a-zA-Z][a-zA-Z0-9]{0,99}")
_MAX_DEPTH = 16  # of the ProxyConfig object
# Istio's agent levels (--log_output_level) as pilot's --log-level spells them.
_AGENT_LEVELS = {"debug": "debug", "info": "info", "warn": "warning", "warning": "warning",
                 "error": "error"}  # fmt: skip
_MAX_AGENT_LEVELS = 512  # characters of agentLogLevel


@dataclass(frozen=True)
class Capture:
    """What istio-init is asked to capture, each value normalised (never the raw text)."""

    include_inbound_ports: str = "*"  # -b
    exclude_inbound_ports: str = ""  # appended to -d
    include_outbound_ports: str | None = None  # -q, only when asked
    exclude_outbound_ports: str | None = None  # -o, only when asked
    include_outbound_ranges: str = "*"  # -i
    exclude_outbound_ranges: str = ""  # -x


@dataclass(frozen=True)
class PodOptions:
    """Everything a pod's annotations ask of the template."""

    capture: Capture = field(default_factory=Capture)
    resources: dict[str, dict[str, str]] | None = None  # None: the template's default
    proxy_config: dict[str, Any] = field(default_factory=dict)
    native_sidecar: bool | None = None  # None: the operator's setting
    rewrite_probes: bool = True
    proxy_image: str | None = None  # None: the operator's --proxy-image
    proxy_log_level: str | None = None  # None: the operator's --proxy-log-level
    agent_log_level: str | None = None  # pilot's --log-level spelling; None: not asked

    @property
    def hold_application(self) -> bool:
        """ProxyConfig's holdApplicationUntilProxyStarts."""
        return self.proxy_config.get("holdApplicationUntilProxyStarts") is True

    @property
    def concurrency(self) -> int | None:
        """ProxyConfig's concurrency (checked when parsed); None: the operator's."""
        value = self.proxy_config.get("concurrency")
        return None if value is None else int(value)


def parse_bool(value: str, name: str) -> bool:
    """A boolean annotation as Go's ParseBool reads it; anything else refused."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InjectError(f"annotation {name}: {shown(value)} is not a boolean (true or false)")


def is_false(value: str) -> bool:
    """`value` is one of ParseBool's false spellings."""
    return value in _FALSE


def pod_options(annotations: dict[str, str], max_proxy_config_bytes: int) -> PodOptions:
    """The options `annotations` ask for; InjectError on the first bad value."""
    native = annotations.get(NATIVE_SIDECAR)
    rewrite = annotations.get(REWRITE_PROBES)
    return PodOptions(
        capture=_capture(annotations),
        resources=_resources(annotations),
        proxy_config=_proxy_config(annotations.get(PROXY_CONFIG), max_proxy_config_bytes),
        native_sidecar=None if native is None else parse_bool(native, NATIVE_SIDECAR),
        rewrite_probes=True if rewrite is None else parse_bool(rewrite, REWRITE_PROBES),
        proxy_image=_optional(annotations, PROXY_IMAGE, image),
        proxy_log_level=_optional(annotations, LOG_LEVEL, envoy_log_level),
        agent_log_level=_optional(annotations, AGENT_LOG_LEVEL, agent_log_level),
    )


def _optional(
    annotations: dict[str, str], name: str, parse: Callable[[str, str], str]
) -> str | None:
    value = annotations.get(name)
    return None if value is None else parse(value, name)


def image(value: str, name: str) -> str:
    """An image reference, as given (Istio takes any; pilot also one without a `/`)."""
    if not is_image(value):
        raise InjectError(f"annotation {name}: {shown(value)} is not an image reference")
    return value


def envoy_log_level(value: str, name: str) -> str:
    """One of Envoy's log levels, exactly (it reaches --proxy-log-level)."""
    if value not in ENVOY_LOG_LEVELS:
        raise InjectError(
            f"annotation {name}: {shown(value)} is not one of Envoy's log levels"
            f" ({', '.join(ENVOY_LOG_LEVELS)})"
        )
    return value


def agent_log_level(value: str, name: str) -> str:
    """Istio's `[scope:]level,...` as pilot's --log-level: `warn` is `warning`, the scope
    `default` or one of pilot's; Istio's own scopes (ads, cache, ...) are refused."""
    # Here, not at the top: pilot.logs brings asyncio, which the template never needs.
    from pilot.logs import SCOPES, LogSpecError, parse_levels  # noqa: PLC0415

    if len(value) > _MAX_AGENT_LEVELS:
        raise InjectError(f"annotation {name}: over {_MAX_AGENT_LEVELS} characters")
    parts = []
    for item in _items(value, name):
        scope, colon, level = item.rpartition(":")
        known = scope == "default" or scope in SCOPES or not (scope or colon)
        if level not in _AGENT_LEVELS or not known:
            raise InjectError(
                f"annotation {name}: {shown(item)} is not [SCOPE:]LEVEL (levels:"
                f" {', '.join(_AGENT_LEVELS)}; scopes: default, {', '.join(SCOPES)})"
            )
        parts.append(f"{scope}:{_AGENT_LEVELS[level]}" if scope else _AGENT_LEVELS[level])
    if not parts:
        raise InjectError(f"annotation {name}: empty (expected [SCOPE:]LEVEL,...)")
    spec = ",".join(parts)
    try:
        parse_levels(spec)  # what the agent will read: checked by the agent's own parser
    except LogSpecError as error:
        raise InjectError(f"annotation {name}: {error}") from None
    return spec


def _capture(annotations: dict[str, str]) -> Capture:
    def ports(name: str, wildcard: bool = False) -> str | None:
        value = annotations.get(name)
        return None if value is None else port_list(value, name, wildcard=wildcard)

    def ranges(name: str) -> str | None:
        value = annotations.get(name)
        return None if value is None else cidr_list(value, name)

    return Capture(
        include_inbound_ports=_or(ports(INCLUDE_INBOUND_PORTS, wildcard=True), "*"),
        exclude_inbound_ports=_or(ports(EXCLUDE_INBOUND_PORTS), ""),
        include_outbound_ports=ports(INCLUDE_OUTBOUND_PORTS),
        exclude_outbound_ports=ports(EXCLUDE_OUTBOUND_PORTS),
        include_outbound_ranges=_or(ranges(INCLUDE_OUTBOUND_RANGES), "*"),
        exclude_outbound_ranges=_or(ranges(EXCLUDE_OUTBOUND_RANGES), ""),
    )


def _or(value: str | None, default: str) -> str:
    return default if value is None else value


def _items(value: str, name: str) -> list[str]:
    """A comma list's items, spaces around them dropped; "" is no item."""
    if len(value) > _MAX_LIST:
        raise InjectError(f"annotation {name}: over {_MAX_LIST} characters")
    if value.strip() == "":
        return []
    return [item.strip() for item in value.split(",")]


def port_list(value: str, name: str, *, wildcard: bool = False) -> str:
    """A comma list of ports 1-65535 (or `*` where allowed), normalised."""
    items = _items(value, name)
    if wildcard and items == ["*"]:
        return "*"
    ports = []
    for item in items:
        # isascii: str.isdigit also takes other scripts' digits, which int() reads.
        if not (item.isascii() and item.isdigit() and len(item) <= 5 and 1 <= int(item) <= 65535):
            allowed = "ports 1-65535" + (" or '*'" if wildcard else "")
            raise InjectError(f"annotation {name}: {shown(item)} is not a port ({allowed})")
        ports.append(str(int(item)))
    return ",".join(ports)


def cidr_list(value: str, name: str) -> str:
    """A comma list of CIDRs (IPv4 or IPv6) or `*`, normalised."""
    items = _items(value, name)
    if items == ["*"]:
        return "*"
    ranges = []
    for item in items:
        try:
            if "/" not in item:
                raise ValueError(item)
            ranges.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise InjectError(f"annotation {name}: {shown(item)} is not a CIDR") from None
    return ",".join(ranges)


def quantity(value: str, name: str) -> str:
    """A Kubernetes quantity (e.g. 100m, 128Mi), as given."""
    if len(value) > _MAX_QUANTITY or not _QUANTITY.fullmatch(value):
        raise InjectError(f"annotation {name}: {shown(value)} is not a Kubernetes quantity")
    return value


def _resources(annotations: dict[str, str]) -> dict[str, dict[str, str]] | None:
    """As Istio: any resource annotation replaces the default with exactly what is asked."""
    asked = [name for name in RESOURCES if name in annotations]
    if not asked:
        return None
    resources: dict[str, dict[str, str]] = {}
    for name in asked:
        kind, resource = RESOURCES[name]
        resources.setdefault(kind, {})[resource] = quantity(annotations[name], name)
    return resources


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors: an alias shares one object, which JSON would copy out
    (a few hundred bytes of aliases become gigabytes of PROXY_CONFIG)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise InjectError(f"annotation {PROXY_CONFIG}: YAML aliases are not accepted")
        return super().compose_node(parent, index)


def _proxy_config(value: str | None, max_bytes: int) -> dict[str, Any]:
    """proxy.istio.io/config (YAML or JSON, as Istio) as a JSON object."""
    if value is None:
        return {}
    if len(value.encode()) > max_bytes:
        raise InjectError(f"annotation {PROXY_CONFIG}: over {max_bytes} bytes")
    try:
        loaded = yaml.load(value, Loader=_NoAliases)  # a SafeLoader
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise InjectError(f"annotation {PROXY_CONFIG}: not YAML or JSON: {first}") from None
    except RecursionError:
        raise InjectError(f"annotation {PROXY_CONFIG}: nested too deep") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise InjectError(f"annotation {PROXY_CONFIG}: expected an object (ProxyConfig)")
    _check_json(loaded, 0)
    for key in loaded:
        if not (isinstance(key, str) and _PROXY_CONFIG_KEY.fullmatch(key)):
            raise InjectError(f"annotation {PROXY_CONFIG}: {shown(key)} is not a ProxyConfig field")
    hold = loaded.get("holdApplicationUntilProxyStarts")
    if hold is not None and not isinstance(hold, bool):
        raise InjectError(
            f"annotation {PROXY_CONFIG}: holdApplicationUntilProxyStarts must be true or false"
        )
    _check_concurrency(loaded.get("concurrency"))
    return loaded


def _check_concurrency(value: Any) -> None:
    """concurrency reaches --concurrency: an integer 0-MAX_CONCURRENCY (protobuf's JSON
    also writes an int32 as a string of digits)."""
    if value is None:
        return
    digits = isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5
    number = isinstance(value, int) and not isinstance(value, bool)
    if not ((number or digits) and 0 <= int(value) <= MAX_CONCURRENCY):
        raise InjectError(
            f"annotation {PROXY_CONFIG}: concurrency {shown(value)} is not a number"
            f" 0-{MAX_CONCURRENCY}"
        )


def _check_json(value: Any, depth: int) -> None:
    """Only JSON's types (YAML also makes dates, sets, non-string keys), nested a little."""
    if depth > _MAX_DEPTH:
        raise InjectError(f"annotation {PROXY_CONFIG}: nested over {_MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InjectError(f"annotation {PROXY_CONFIG}: {shown(key)} is not a string key")
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise InjectError(f"annotation {PROXY_CONFIG}: {shown(value)} is not a JSON value")
    elif isinstance(value, float) and not math.isfinite(value):
        raise InjectError(f"annotation {PROXY_CONFIG}: {shown(value)} is not a JSON number")


def proxy_config_json(config: dict[str, Any]) -> str:
    """PROXY_CONFIG's value: the object as compact JSON ("{}" when nothing was asked)."""
    return json.dumps(config, separators=(",", ":"), sort_keys=True)
