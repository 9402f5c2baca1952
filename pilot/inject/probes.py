"""The app's probes moved to the agent's status port, as Istio's `rewriteAppHTTPProbers`.

Under STRICT mTLS the kubelet's plaintext probe cannot reach the app through the
inbound listener, so each httpGet, tcpSocket or grpc liveness, readiness and startup
probe becomes `httpGet :15020/app-health/<container>/livez|readyz|startupz`, and the
original goes into ISTIO_KUBE_APP_PROBERS (Istio's JSON shape) for the agent, which
probes the app at the pod's IP itself. An httpGet probe's httpHeaders stay on the
rewritten probe too, as Istio's; they are checked here by the rules the agent sends
them by (a token name, a value without line break or control, at most MAX_HEADERS), so
a header the agent would not send is refused at admission, not dropped at run time.
Container names reach the paths and the JSON: they are DNS-1123 labels (checked by the
template) and JSON-encoded, never spliced.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pilot.inject.errors import InjectError
from pilot.inject.shape import mapping, objects, shown

STATUS_PORT = 15020
# Kubernetes' field, Istio's path suffix.
_PROBES = (("readinessProbe", "readyz"), ("livenessProbe", "livez"), ("startupProbe", "startupz"))
_HANDLERS = ("httpGet", "tcpSocket", "grpc")
# An httpGet probe's headers, which the agent sends to the app (pilot.agent.app_probes).
MAX_HEADERS = 16
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # an HTTP token
HEADER_VALUE = re.compile(r"[\t\x20-\x7e]{0,4096}")  # one line: no CR, LF or control


def app_health_path(container: str, suffix: str) -> str:
    """Istio's status-port path for one probe of one container."""
    return f"/app-health/{container}/{suffix}"


def rewrite(containers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rewrite each container's probes in place; the originals, keyed by their new path.

    A probe on a named port the container does not declare is left as it is (the
    agent could not tell which port to probe; the kubelet reports the same error).
    """
    probers: dict[str, dict[str, Any]] = {}
    for container in containers:
        name = container["name"]
        named = _named_ports(container, name)
        for field, suffix in _PROBES:
            probe = mapping(container, field, f"container {name} {field}")
            original = _prober(probe, named, f"container {name} {field}")
            if original is None:
                continue
            path = app_health_path(name, suffix)
            probers[path] = original
            container[field] = _rewritten(probe, path, original)
    return probers


def probers_json(probers: dict[str, dict[str, Any]]) -> str:
    """ISTIO_KUBE_APP_PROBERS' value."""
    return json.dumps(probers, separators=(",", ":"), sort_keys=True)


def _named_ports(container: dict[str, Any], name: str) -> dict[str, int]:
    named = {}
    for port in objects(container, "ports", f"container {name} ports"):
        if isinstance(port.get("name"), str) and isinstance(port.get("containerPort"), int):
            named[port["name"]] = port["containerPort"]
    return named


def _prober(probe: dict[str, Any], named: dict[str, int], where: str) -> dict[str, Any] | None:
    """Istio's Prober for `probe` (its handler, ports resolved, timeoutSeconds), or None."""
    handlers = [handler for handler in _HANDLERS if probe.get(handler) is not None]
    if not handlers:
        return None  # exec probes run in the container: nothing to move
    if len(handlers) > 1:
        raise InjectError(f"{where}: more than one handler ({', '.join(handlers)})")
    handler = handlers[0]
    action = dict(mapping(probe, handler, f"{where} {handler}"))
    if handler == "httpGet" and action.get("httpHeaders") is not None:
        action["httpHeaders"] = _headers(action["httpHeaders"], f"{where} httpGet.httpHeaders")
    port = action.get("port")
    if isinstance(port, str) and handler != "grpc":
        if port not in named:
            return None
        action["port"] = named[port]
    elif not (isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535):
        raise InjectError(f"{where} {handler}: port {shown(port)} is not 1-65535 or a port name")
    if action["port"] == STATUS_PORT:
        return None  # already the agent's: injected before, or the app's own choice
    prober: dict[str, Any] = {handler: action}
    timeout = probe.get("timeoutSeconds")
    if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout > 0:
        prober["timeoutSeconds"] = timeout
    return prober


def _headers(headers: Any, where: str) -> list[dict[str, str]]:
    """An httpGet probe's httpHeaders, checked as the agent checks them before sending."""
    if not isinstance(headers, list) or len(headers) > MAX_HEADERS:
        raise InjectError(f"{where}: not a list of at most {MAX_HEADERS} headers")
    checked = []
    for header in headers:
        if not isinstance(header, dict):
            raise InjectError(f"{where}: {shown(header)} is not a header object")
        name, value = header.get("name"), header.get("value", "")
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            raise InjectError(f"{where}: {shown(name)} is not a header name (an HTTP token)")
        if not isinstance(value, str) or not HEADER_VALUE.fullmatch(value):
            raise InjectError(
                f"{where}: header {name}: the value is not one line of printable ASCII"
                " (at most 4096 characters)"
            )
        checked.append({"name": name, "value": value})
    return checked


def _rewritten(probe: dict[str, Any], path: str, original: dict[str, Any]) -> dict[str, Any]:
    """The probe with its handler replaced by the agent's path; timings kept, and an
    httpGet's headers (as Istio's: the kubelet sends them to the agent, which ignores them)."""
    kept = {key: value for key, value in probe.items() if key not in _HANDLERS}
    action: dict[str, Any] = {"path": path, "port": STATUS_PORT, "scheme": "HTTP"}
    headers = (original.get("httpGet") or {}).get("httpHeaders")
    if headers is not None:
        action["httpHeaders"] = [dict(header) for header in headers]
    return {"httpGet": action, **kept}
