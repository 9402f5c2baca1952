"""A container's probes, run as a kubelet runs them: from the node, to the pod's address.

`run_probe` runs one probe once and says (passed, why): httpGet is an HTTP/1.1 GET
from the node's side of the bridge (tests.support.pods.client_socket_in) to the pod
IP (or the probe's host) and port (a number or one of the container's named ports),
with the probe's headers and `User-Agent: kube-probe/...`, passing on 200-399;
tcpSocket passes when the connection opens; exec runs the command in the container
and passes on exit 0. Each within the probe's timeoutSeconds (default 1). gRPC probes
are not run by this kubelet: they fail, saying so (the injector rewrites them to
httpGet on the agent's 15020).

`Prober` runs one probe of one container on its schedule (initialDelaySeconds, then
every periodSeconds, capped at MAX_PERIOD so a test is not slowed by a ten-second
period) and keeps its verdict as a kubelet does: success after successThreshold
passes in a row, failure after failureThreshold failures in a row; every result is
counted (`passed`, `failed`) and the last reason kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.pods import client_socket_in

Obj = dict[str, Any]
USER_AGENT = "kube-probe/1.37"
MAX_PERIOD = 1.0  # seconds: a kubelet's schedule, compressed for tests
Exec = Callable[[list[str], float], Awaitable[tuple[int, str]]]


def probe_port(port: int | str, container: Obj) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"container {container['name']}: no port named {str(port)[:40]!r}")


async def _connect(
    node_netns: str, host: str, port: int, tls: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = client_socket_in(node_netns)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except OSError:
        sock.close()
        raise
    context = None
    if tls:  # a kubelet does not verify a probe's certificate
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return await asyncio.open_connection(sock=sock, ssl=context)


async def _http_get(spec: Obj, container: Obj, pod_ip: str, node_netns: str) -> tuple[bool, str]:
    host, port = spec.get("host") or pod_ip, probe_port(spec["port"], container)
    reader, writer = await _connect(node_netns, host, port, spec.get("scheme") == "HTTPS")
    try:
        headers = {"Host": f"{host}:{port}", "User-Agent": USER_AGENT, "Accept": "*/*",
                   "Connection": "close"}  # fmt: skip
        headers |= {h["name"]: h["value"] for h in spec.get("httpHeaders", [])}
        lines = [
            f"GET {spec.get('path', '/')} HTTP/1.1",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        status_line = (await reader.readline()).decode(errors="replace").strip()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = status_line.split()
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return 200 <= status < 400, f"GET {spec.get('path', '/')} on {port}: {status_line[:80]!r}"


async def _tcp(spec: Obj, container: Obj, pod_ip: str, node_netns: str) -> tuple[bool, str]:
    port = probe_port(spec["port"], container)
    _, writer = await _connect(node_netns, spec.get("host") or pod_ip, port, tls=False)
    writer.close()
    return True, f"connected to {port}"


async def run_probe(
    probe: Obj, container: Obj, pod_ip: str, node_netns: str, exec_in: Exec
) -> tuple[bool, str]:
    """One run of `probe`: (passed, why)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        async with asyncio.timeout(timeout):
            if "httpGet" in probe:
                return await _http_get(probe["httpGet"], container, pod_ip, node_netns)
            if "tcpSocket" in probe:
                return await _tcp(probe["tcpSocket"], container, pod_ip, node_netns)
    except (OSError, TimeoutError) as error:
        return False, f"{type(error).__name__}: {error}"
    if "exec" in probe:
        status, output = await exec_in(list(probe["exec"]["command"]), timeout)
        return status == 0, f"exit {status}: {output.strip()[-120:]!r}"
    return False, f"probe {sorted(probe)}: not run by this kubelet"


@dataclass
class Prober:
    """One probe of one container on its schedule, and its verdict."""

    kind: str  # liveness, readiness, startup
    probe: Obj
    check: Callable[[], Awaitable[tuple[bool, str]]]
    succeeded: bool = False  # the verdict (successThreshold passes in a row)
    failed_out: bool = False  # failureThreshold failures in a row
    passed: int = 0
    failed: int = 0
    reason: str = "not run yet"
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _record(self, ok: bool, reason: str, streak: list[int]) -> None:
        self.reason = reason
        if ok:
            self.passed += 1
            streak[:] = [streak[0] + 1, 0]
        else:
            self.failed += 1
            streak[:] = [0, streak[1] + 1]
        before = (self.succeeded, self.failed_out)
        if streak[0] >= int(self.probe.get("successThreshold", 1)):
            self.succeeded, self.failed_out = True, False
        if streak[1] >= int(self.probe.get("failureThreshold", 3)):
            self.succeeded, self.failed_out = False, True
        if (self.succeeded, self.failed_out) != before:
            self.changed.set()

    async def run(self, until_success: bool = False) -> None:
        """Probe forever (a startup probe: until it succeeds or fails out)."""
        period = min(float(self.probe.get("periodSeconds", 10)), MAX_PERIOD)
        await asyncio.sleep(min(float(self.probe.get("initialDelaySeconds", 0)), MAX_PERIOD))
        streak = [0, 0]
        while True:
            self._record(*await self.check(), streak)
            if until_success and (self.succeeded or self.failed_out):
                return
            await asyncio.sleep(period)
