"""The app's probes on the status port: read from ISTIO_KUBE_APP_PROBERS, run against the app.

The injector rewrites each app container's liveness, readiness and startup probe to
`GET :15020/app-health/CONTAINER/livez|readyz|startupz` and hands the originals to
the agent as ISTIO_KUBE_APP_PROBERS, Istio's JSON: `{"/app-health/C/livez":
{"httpGet": {"path", "port", "scheme", "httpHeaders"}, "timeoutSeconds": N}, ...}`,
or `tcpSocket: {port}`, or `grpc: {port, service}`. So a probe passes under STRICT
mTLS: the kubelet's plaintext request reaches the agent (15020 is never captured),
and the agent reaches the app directly at the pod's address, from 127.0.0.6, the
source the capture rules leave alone (as Envoy's own passthrough to the app), never
through Envoy's inbound listener.

What the variable says becomes connections the agent makes, so it is checked before
anything is probed (`probers_from_env`): at most MAX_PROBERS_BYTES of JSON and
MAX_PROBERS paths, each path Istio's form for a container name, each port a number
1-65535 that is none of the sidecar's own (OWN_PORTS: probing those would let a pod
report Envoy's health as the app's, or loop), the host empty or the pod's own
address (a prober never connects anywhere else), the path and headers free of
anything that would end a line. A variable that is not such JSON is ignored with one
warning (the agent starts: probes of paths it does not know are 404, as Istio's);
one prober that is not right is left out with a warning naming its path.

A probe answers healthy or not (the status port turns that into 200 or 503, Istio's
codes): HTTP is healthy on a 2xx or 3xx status, as the kubelet counts it, and a
redirect is never followed (so never off the pod); TCP when the connection is
accepted; gRPC when `grpc.health.v1.Health/Check` says SERVING. Each within its
timeoutSeconds (default 1, at most MAX_TIMEOUT).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pilot.agent import grpc_health
from pilot.inject.probes import HEADER_NAME, HEADER_VALUE, MAX_HEADERS

log = logging.getLogger("pilot.agent")

VARIABLE = "ISTIO_KUBE_APP_PROBERS"
MAX_PROBERS_BYTES = 64 * 1024
MAX_PROBERS = 64
MAX_TIMEOUT = 60
DEFAULT_TIMEOUT = 1
OWN_PORTS = frozenset({15000, 15001, 15006, 15020, 15021, 15090})
PASSTHROUGH_SOURCE = "127.0.0.6"  # left uncaptured by the capture rules (pilot.agent.iptables)
MAX_STATUS_LINE = 8192
_PATH = re.compile(r"/app-health/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/(livez|readyz|startupz)")
_URL_PATH = re.compile(r"/[\x21-\x7e]{0,2047}")  # printable ASCII, no space: one request line


class ProberError(ValueError):
    """A prober in ISTIO_KUBE_APP_PROBERS cannot be run; the message says why."""


@dataclass(frozen=True, slots=True)
class HttpGet:
    path: str
    port: int
    https: bool = False
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class TcpSocket:
    port: int


@dataclass(frozen=True, slots=True)
class Grpc:
    port: int
    service: str = ""


@dataclass(frozen=True, slots=True)
class AppProber:
    """One rewritten probe: what to ask the app, and how long to wait."""

    action: HttpGet | TcpSocket | Grpc
    timeout: float = DEFAULT_TIMEOUT


def probers_from_env(env: Mapping[str, str], pod_ip: str) -> dict[str, AppProber]:
    """The probers ISTIO_KUBE_APP_PROBERS names, by path; warned of and left out if unusable."""
    text = env.get(VARIABLE, "")
    if not text.strip():
        return {}
    if len(text.encode(errors="replace")) > MAX_PROBERS_BYTES:
        log.warning("%s is over %d bytes: ignored, app probes answer 404",
                    VARIABLE, MAX_PROBERS_BYTES)  # fmt: skip
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        log.warning("%s is not JSON: ignored, app probes answer 404", VARIABLE)
        return {}
    if not isinstance(data, dict) or len(data) > MAX_PROBERS:
        log.warning("%s is not an object of at most %d probers: ignored, app probes answer 404",
                    VARIABLE, MAX_PROBERS)  # fmt: skip
        return {}
    probers = {}
    for path, spec in data.items():
        try:
            probers[path] = _prober(path, spec, pod_ip)
        except ProberError as error:
            log.warning("%s: %s: left out (its probe answers 404)", VARIABLE, error)
    return probers


def _prober(path: str, spec: Any, pod_ip: str) -> AppProber:
    if not _PATH.fullmatch(path):
        raise ProberError(f"{path[:80]!r} is not /app-health/CONTAINER/livez|readyz|startupz")
    if not isinstance(spec, dict):
        raise ProberError(f"{path}: not an object")
    actions = [key for key in ("httpGet", "tcpSocket", "grpc") if key in spec]
    if len(actions) != 1 or not isinstance(spec[actions[0]], dict):
        raise ProberError(f"{path}: exactly one of httpGet, tcpSocket, grpc")
    body = spec[actions[0]]
    port = _port(path, body.get("port"))
    action: HttpGet | TcpSocket | Grpc
    if actions[0] == "httpGet":
        action = _http_get(path, body, port, pod_ip)
    elif actions[0] == "tcpSocket":
        _same_host(path, body, pod_ip)
        action = TcpSocket(port)
    else:
        service = body.get("service") or ""
        if not isinstance(service, str) or not HEADER_VALUE.fullmatch(service):
            raise ProberError(f"{path}: grpc.service is not a service name")
        action = Grpc(port, service)
    return AppProber(action, _timeout(path, spec.get("timeoutSeconds")))


def _port(path: str, value: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
        raise ProberError(f"{path}: port {str(value)[:32]!r} is not a port number 1-65535")
    if value in OWN_PORTS:
        raise ProberError(f"{path}: port {value} is the sidecar's own, not the app's")
    return value


def _same_host(path: str, body: dict[str, Any], pod_ip: str) -> None:
    host = body.get("host") or ""
    if not isinstance(host, str):
        raise ProberError(f"{path}: host is not a string")
    if host and not _is_pod(host, pod_ip):
        raise ProberError(f"{path}: host {host[:64]!r} is not this pod ({pod_ip})")


def _is_pod(host: str, pod_ip: str) -> bool:
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(pod_ip)
    except ValueError:
        return False


def _http_get(path: str, body: dict[str, Any], port: int, pod_ip: str) -> HttpGet:
    _same_host(path, body, pod_ip)
    url_path = body.get("path") or "/"
    if not isinstance(url_path, str) or not _URL_PATH.fullmatch(url_path):
        raise ProberError(f"{path}: httpGet.path is not an absolute path of printable ASCII")
    scheme = str(body.get("scheme") or "HTTP").upper()
    if scheme not in ("HTTP", "HTTPS"):
        raise ProberError(f"{path}: httpGet.scheme {scheme[:16]!r} is not HTTP or HTTPS")
    headers = body.get("httpHeaders") or []
    if not isinstance(headers, list) or len(headers) > MAX_HEADERS:
        raise ProberError(f"{path}: httpHeaders is not a list of at most {MAX_HEADERS}")
    pairs = []
    for header in headers:
        name = header.get("name") if isinstance(header, dict) else None
        value = header.get("value", "") if isinstance(header, dict) else None
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            raise ProberError(f"{path}: a header name that is not a token")
        if not isinstance(value, str) or not HEADER_VALUE.fullmatch(value):
            raise ProberError(f"{path}: header {name}: a value with a line break or control")
        pairs.append((name, value))
    return HttpGet(url_path, port, scheme == "HTTPS", tuple(pairs))


def _timeout(path: str, value: Any) -> float:
    if value is None:
        return DEFAULT_TIMEOUT
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_TIMEOUT:
        raise ProberError(f"{path}: timeoutSeconds {str(value)[:16]!r}: 1-{MAX_TIMEOUT}")
    return float(value)


# --------------------------------------------------------------------------- probing


async def probe(prober: AppProber, pod_ip: str) -> bool:
    """Whether the app passes `prober` at `pod_ip`, within the prober's timeout."""
    action = prober.action
    try:
        async with asyncio.timeout(prober.timeout):
            if isinstance(action, HttpGet):
                return await _http(action, pod_ip)
            if isinstance(action, TcpSocket):
                _, writer = await _connect(pod_ip, action.port)
                writer.close()
                return True
            return await _grpc(action, pod_ip)
    except (
        OSError,
        TimeoutError,
        ValueError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
    ):
        return False


async def _connect(
    pod_ip: str, port: int, tls: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the app from 127.0.0.6 (IPv4; IPv6 is never captured)."""
    source = (PASSTHROUGH_SOURCE, 0) if ipaddress.ip_address(pod_ip).version == 4 else None
    return await asyncio.open_connection(
        pod_ip,
        port,
        local_addr=source,
        ssl=tls,
        server_hostname="" if tls is not None else None,
        limit=MAX_STATUS_LINE,
    )


def _insecure_tls() -> ssl.SSLContext:
    """The kubelet's HTTPS probe: encrypted, the app's certificate not verified."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def _http(action: HttpGet, pod_ip: str) -> bool:
    reader, writer = await _connect(pod_ip, action.port, _insecure_tls() if action.https else None)
    try:
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        lines = [
            f"GET {action.path} HTTP/1.1",
            f"Host: {host}:{action.port}",
            "User-Agent: kube-probe/pilot-agent",
            "Accept: */*",
            "Connection: close",
        ]
        names = {name.lower() for name, _ in action.headers}
        lines = [line for line in lines if line.split(":")[0].lower() not in names]
        lines += [f"{name}: {value}" for name, value in action.headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        status_line = await reader.readline()
    finally:
        writer.close()
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return False
    return 200 <= int(parts[1]) < 400  # the kubelet's success; a redirect is never followed


async def _grpc(action: Grpc, pod_ip: str) -> bool:
    """grpc.health.v1.Health/Check over a connection from 127.0.0.6 (`grpc_health`)."""
    reader, writer = await _connect(pod_ip, action.port)
    try:
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        return await grpc_health.check(reader, writer, f"{host}:{action.port}", action.service)
    finally:
        writer.close()
