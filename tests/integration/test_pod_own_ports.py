"""A sidecar's own ports, from outside and from the registry: no loop, no rejected LDS.

One set-up for the module (tests/integration/mesh_pods.py): pods `a` and `b` with
sidecars (capture rules, `pilot agent`, Envoy as uid 1337), `c` without one.

1. c (no sidecar) opens one plaintext TCP connection to b's 15001 (and one to
   its 15006) and sends a few bytes. The capture rules take it to b's
   virtualInbound, whose passthrough hands it to b's own 15001; there
   virtualOutbound must send it to BlackHoleCluster, not on through
   PassthroughCluster to be captured again (a loop until Envoy runs out of
   descriptors). The connection is closed, b's admin API answers, its listeners
   count a handful of connections, not thousands, and a -> reviews still works.
2. A Service on 15000, 15001, 15006, 15020, 15021 and 15090 (HTTP and TCP, with
   a ClusterIP, its slice on pod b): both sidecars keep accepting LDS (a later
   honest Service gets its listener), no listener lands on those ports but
   Envoy's own, b gets no inbound chain there, and pilot says so once.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    CONVERGE_TIMEOUT,
    PORT,
    Mesh,
    PodEnvoy,
    module_mesh,
    pod_address,
    request_from,
)
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, service

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

OWN_PORTS = (15000, 15001, 15006, 15020, 15021, 15090)
ENVOYS_OWN = {"virtualOutbound": 15001, "virtualInbound": 15006}
LOOP_COUNTERS = r"^listener\.0\.0\.0\.0_150(01|06)\.downstream_cx_total$"
BLACKHOLE = "cluster.BlackHoleCluster.upstream_cx_none_healthy"
LDS_REJECTED = "listener_manager.lds.update_rejected"
# A connection that looped would open this many and more; an ended one opens 1 or 2.
LOOP_BOUND = 8
CLOSE_DEADLINE = 10.0  # seconds the client waits for b to close its connection
# One connection, a few bytes, then wait (bounded) for the peer to close it.
CLIENT = """
import socket, sys
host, port, deadline = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with socket.create_connection((host, port), timeout=5) as s:
    s.sendall(b"not http, not tls\\r\\n")
    s.settimeout(deadline)
    try:
        while s.recv(4096):
            pass
        print("closed")
    except ConnectionResetError:
        print("closed")
    except TimeoutError:
        print("open")
"""


mesh = module_mesh("pod-own-ports")


def _url(service_name: str, path: str) -> str:
    return f"http://{service_name}.{APP_NAMESPACE}:{PORT}{path}"


async def _connect_from_c(mesh: Mesh, port: int) -> str:
    """c's one connection to b's `port`: "closed" when b closed it, else "open"."""
    argv = [sys.executable, "-c", CLIENT, pod_address("b"), str(port), str(CLOSE_DEADLINE)]
    status, out, err = await mesh.pod("c").run(*argv)
    assert status == 0, f"the client in pod c to b:{port} exited {status}: {err.strip()[-500:]}"
    return out.strip()


async def _loop_counts(sidecar: PodEnvoy) -> int:
    return sum((await sidecar.stats(LOOP_COUNTERS)).values())


# The first test runs the set-up.
async def test_a_plaintext_connection_to_a_pods_own_ports_ends_in_the_blackhole(
    mesh: Mesh,
) -> None:
    b = mesh.reviews
    before, blackholed = await _loop_counts(b), await b.stat(BLACKHOLE) or 0
    for port in (15001, 15006):
        outcome = await _connect_from_c(mesh, port)
        # The admin API answering at all is the first thing a loop takes away.
        opened = await _loop_counts(b) - before
        assert outcome == "closed", (
            f"b kept c's connection to its {port} open for {CLOSE_DEADLINE:g}s;"
            f" its 15001/15006 listeners opened {opened} connections meanwhile"
        )
        assert opened <= LOOP_BOUND, f"c's connection to b:{port} made b open {opened}"
    await wait_until(
        lambda: b.stat(BLACKHOLE), CONVERGE_TIMEOUT, "b's BlackHoleCluster to count both",
        until=lambda count: (count or 0) >= blackholed + 2, context=b.agent.tail,
    )  # fmt: skip
    path = "/after-own-ports"
    status = await request_from(mesh.pod("a"), _url("reviews", path))
    assert status == 200, f"a -> reviews after c's connections answered {status}"
    await mesh.backends["b"].wait_seen(path)
    opened = await _loop_counts(b) - before
    assert opened <= LOOP_BOUND, f"b's listeners kept opening connections: {opened}"
    mesh.assert_nothing_restarted()


# ------------------------------------------------------------------ a Service on them

HOSTILE = "hostile"
HOSTILE_IP = "198.19.0.20"
HOSTILE_PORTS = (
    ("http-admin", 15000),
    ("http-outbound", 15001),
    ("tcp-inbound", 15006),
    ("tcp-agent", 15020),
    ("http-ready", 15021),
    ("tcp-prometheus", 15090),
)
HONEST = "honest"
HONEST_IP = "198.19.0.21"
HONEST_PORT = 9091


def _service(name: str, cluster_ip: str, ports: tuple[tuple[str, int], ...]) -> list[Any]:
    obj = service(name, APP_NAMESPACE, ports=ports)
    obj["spec"]["clusterIP"] = cluster_ip
    return [obj, endpoint_slice(name, [Ep(pod_address("b"))], APP_NAMESPACE, ports=ports)]


def _on_own_ports(listeners: dict[str, Any]) -> dict[str, int]:
    """Listeners other than Envoy's own whose port is one of the sidecar's own."""
    found = {}
    for name, listener in listeners.items():
        port = int(listener.get("address", {}).get("socket_address", {}).get("port_value", 0))
        if port in OWN_PORTS and ENVOYS_OWN.get(name) != port:
            found[name] = port
    return found


def _inbound_ports(listeners: dict[str, Any]) -> set[int]:
    chains = listeners.get("virtualInbound", {}).get("filter_chains", [])
    return {
        int(port)
        for chain in chains
        if (port := chain.get("filter_chain_match", {}).get("destination_port")) is not None
    }


async def test_a_service_on_the_sidecars_own_ports_leaves_every_sidecars_listeners_alone(
    mesh: Mesh,
) -> None:
    sidecars = (mesh.frontend, mesh.reviews)
    rejected = [await sidecar.stat(LDS_REJECTED) or 0 for sidecar in sidecars]
    mark = mesh.pilot.mark()
    for obj in _service(HOSTILE, HOSTILE_IP, HOSTILE_PORTS):
        mesh.api.apply(obj)
    for obj in _service(HONEST, HONEST_IP, (("tcp-honest", HONEST_PORT),)):
        mesh.api.apply(obj)
    honest = f"{HONEST_IP}_{HONEST_PORT}"
    for sidecar, before in zip(sidecars, rejected, strict=True):
        await wait_until(
            sidecar.listeners, CONVERGE_TIMEOUT,
            f"pod {sidecar.pod.name}'s Envoy to take the honest listener {honest}",
            until=lambda listeners: honest in listeners, context=sidecar.agent.tail,
        )  # fmt: skip
        now = await sidecar.stat(LDS_REJECTED) or 0
        assert now == before, f"pod {sidecar.pod.name}'s Envoy rejected {now - before} LDS updates"
        on_own = _on_own_ports(await sidecar.listeners())
        assert on_own == {}, f"pod {sidecar.pod.name} has listeners on its own ports: {on_own}"
    inbound = _inbound_ports(await mesh.reviews.listeners())
    assert HONEST_PORT in inbound, f"b's virtualInbound has no chain for {HONEST_PORT}"
    own = sorted(inbound & set(OWN_PORTS))
    assert own == [15006], f"b's virtualInbound has chains on own ports {own} (15006: blackhole)"

    def naming(entry: dict[str, str]) -> bool:
        return f"{APP_NAMESPACE}/{HOSTILE}" in entry["msg"]

    lines = mesh.pilot.logged(naming, since=mark)
    assert len(lines) == 1, f"pilot's lines naming the Service: {[e['msg'] for e in lines]}"
    assert lines[0]["level"].lower().startswith("warn"), lines[0]
    assert all(str(port) in lines[0]["msg"] for _, port in HOSTILE_PORTS), lines[0]["msg"]
    status = await request_from(mesh.pod("a"), _url("reviews", "/after-hostile"))
    assert status == 200, f"a -> reviews after the Service answered {status}"
    mesh.assert_nothing_restarted()
