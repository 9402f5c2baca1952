"""The sidecar's status port 15020 is the agent's: no app takes it, nothing past it but the agent.

The capture rules leave 15020 uncaptured (Istio's `-d 15090,15021,15020`), so
whatever listens there is reached in plaintext, whatever a STRICT
PeerAuthentication says. `pilot agent --binary-path` holds it before it starts
Envoy. On the mesh of tests/integration/mesh_pods.py (pods `a` and `b` with
sidecars, `c` and `d` without):

1. under STRICT in b's namespace, an app in b (uid 1000) cannot listen on 15020
   (EADDRINUSE, with SO_REUSEADDR and SO_REUSEPORT too), and plaintext from c to
   b's address:15020 reaches the agent: `/healthz/ready` 200, any other path 404;
2. a client in c holding many connections that never finish their request, and
   one sending an endless request line, stall neither b's status port for
   another caller (d) nor b's sidecar (a -> reviews);

and in a pod of its own:

3. an agent whose status port is taken does not start: one line, exit 2, no Envoy;
4. `/healthz/ready` is 503 while Envoy is not LIVE (no pilot to give it listeners).
5. `--status-port 0` (Istio's `statusPort: 0`) holds nothing, and the agent warns.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pilot.security.certs import cert_pem, self_signed_root
from tests.integration.agent_process import REPO
from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    APP_UID,
    CONVERGE_TIMEOUT,
    PORT,
    Mesh,
    module_mesh,
    peer_authentication,
    pod_address,
    request_from,
)
from tests.integration.sidecar_support import (
    PROXY_UID,
    Workload,
    agent_argv,
    agent_folder,
    sidecar_env,
)
from tests.support.deadline import bounded
from tests.support.envoy_process import wait_until
from tests.support.pod_process import running_in
from tests.support.pods import Pod, leftovers, pod_network

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

STATUS_PORT = 15020
AGENT_EXIT_WITHIN = 30.0
HELD_CONNECTIONS = 100
SOLO = Workload("shop", "cart", "cart-7d4f9-x2x1z")

# An app's attempts to listen on 15020: plainly, and with both reuse options set.
_BIND = """
import errno, json, socket, sys
results = []
for host in ("0.0.0.0", sys.argv[1]):
    for reuse in (False, True):
        s = socket.socket()
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind((host, int(sys.argv[2])))
            s.listen()
            results.append("bound")
        except OSError as error:
            results.append(errno.errorcode.get(error.errno, str(error.errno)))
        s.close()
print(json.dumps(results))
"""

# An app that listens on 15020 first, until stopped.
_HOLD = """
import socket, sys, time
held = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("held", flush=True)
time.sleep(600)
"""

# Connections that start a request and never finish it, one that never ends its request
# line; held until the process is stopped.
_FLOOD = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    try:
        s = socket.create_connection((sys.argv[1], 15020), timeout=5)
        s.sendall(b"GET /healthz/ready HTTP/1.1\\r\\nHost: b\\r\\n")
        held.append(s)
    except OSError:
        pass
try:
    endless = socket.create_connection((sys.argv[1], 15020), timeout=5)
    endless.sendall(b"GET /" + b"a" * 65536)
    held.append(endless)
except OSError:
    pass
print("held", len(held), flush=True)
time.sleep(600)
"""


mesh = module_mesh("status-port")


def _status_url(pod: str, path: str) -> str:
    return f"http://{pod_address(pod)}:{STATUS_PORT}{path}"


async def _binds(pod: Pod) -> list[str]:
    """What each of an app's (uid 1000) attempts to listen on 15020 in `pod` got."""
    status, out, err = await pod.run(
        sys.executable, "-c", _BIND, pod.address, str(STATUS_PORT), uid=APP_UID
    )
    assert status == 0, err
    result: list[str] = json.loads(out)
    return result


async def _plaintext_chains(mesh: Mesh) -> int:
    """b's virtualInbound chains for the app's port that take a connection without TLS."""
    inbound: dict[str, Any] = (await mesh.reviews.listeners()).get("virtualInbound", {})
    return sum(
        1
        for chain in inbound.get("filter_chains", [])
        if chain.get("filter_chain_match", {}).get("destination_port") == PORT
        and chain["filter_chain_match"].get("transport_protocol") != "tls"
    )


async def test_under_strict_an_app_cannot_take_15020_and_plaintext_reaches_only_the_agent(
    mesh: Mesh,
) -> None:
    mesh.api.apply(peer_authentication("STRICT"))
    try:
        await wait_until(
            lambda: _plaintext_chains(mesh), CONVERGE_TIMEOUT,
            "b's virtualInbound to drop its plaintext chains (STRICT)",
            until=lambda count: count == 0, context=mesh.reviews.agent.tail,
        )  # fmt: skip
        app_port = f"http://{pod_address('b')}:{PORT}/strict"
        assert await request_from(mesh.pod("c"), app_port) == 0, "STRICT is not in force"
        attempts = await _binds(mesh.pod("b"))
        assert attempts == ["EADDRINUSE"] * 4, f"an app in b listened on 15020: {attempts}"
        ready = await request_from(mesh.pod("c"), _status_url("b", "/healthz/ready"))
        assert ready == 200, f"c -> b:15020/healthz/ready answered {ready}"
        other = await request_from(mesh.pod("c"), _status_url("b", "/reviews/1"))
        assert other == 404, f"c -> b:15020/reviews/1 answered {other}, not the agent's 404"
    finally:
        mesh.api.delete("PeerAuthentication", APP_NAMESPACE, "default")


async def test_a_flood_of_unfinished_requests_stalls_neither_the_port_nor_the_sidecar(
    mesh: Mesh,
) -> None:
    argv = [sys.executable, "-c", _FLOOD, pod_address("b"), str(HELD_CONNECTIONS)]
    async with running_in(mesh.pod("c"), argv, "held", uid=APP_UID, cwd=REPO):
        ready = await request_from(mesh.pod("d"), _status_url("b", "/healthz/ready"))
        assert ready == 200, f"d -> b:15020/healthz/ready answered {ready} during c's flood"
        through = await request_from(mesh.pod("a"), f"http://reviews.{APP_NAMESPACE}:{PORT}/x")
        assert through == 200, f"a -> reviews answered {through} during c's flood"


# ------------------------------------------------------------------ an agent alone


def _other_root() -> str:
    return cert_pem(self_signed_root("cluster.local")[1])


async def _agent(pod: Pod, folder: Path) -> asyncio.subprocess.Process:
    """`pilot agent --binary-path` as uid 1337 in `pod`, its pilot nowhere (localhost:1)."""
    return await asyncio.create_subprocess_exec(
        *pod.command(*agent_argv("localhost:1"), uid=PROXY_UID),
        cwd=folder,
        env=sidecar_env(pod.address, SOLO),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _curl(pod: Pod, url: str, *options: str) -> int:
    """The status `url` answers in `pod` (as uid 1000), 0 when nothing does."""
    argv: Sequence[str] = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *options]
    _, out, _ = await pod.run(*argv, "--max-time", "5", url, uid=APP_UID)
    return int(out or 0)


async def test_an_agent_whose_status_port_is_taken_does_not_start(tmp_path: Path) -> None:
    async with pod_network(["solo"]) as network:
        pod = network["solo"]
        listen = [sys.executable, "-c", _HOLD, str(STATUS_PORT)]
        async with running_in(pod, listen, "held", uid=APP_UID):
            with agent_folder(_other_root(), "token", owner=PROXY_UID) as folder:
                agent = await _agent(pod, folder)
                try:
                    out, err = await bounded(agent.communicate(), AGENT_EXIT_WITHIN)
                finally:
                    if agent.returncode is None:
                        agent.kill()
                        await agent.wait()
                assert not (folder / "etc").exists(), "the agent wrote Envoy's bootstrap"
        lines = err.decode().splitlines()
        assert agent.returncode == 2, (agent.returncode, lines[-5:])
        errors = [line for line in lines if line.startswith("pilot: error: ")]
        assert errors == [lines[-1]], lines[-5:]
        assert errors[0].startswith(
            "pilot: error: --status-port 15020: cannot listen on 0.0.0.0:15020"
        ), errors[0]
        assert "started Envoy" not in err.decode() + out.decode()
    assert leftovers(network) == []


async def test_healthz_ready_is_503_while_envoy_is_not_live(tmp_path: Path) -> None:
    async with pod_network(["solo"]) as network:
        pod = network["solo"]
        with agent_folder(_other_root(), "token", owner=PROXY_UID) as folder:
            argv = agent_argv("localhost:1")
            env = sidecar_env(pod.address, SOLO)
            async with running_in(
                pod, argv, "started Envoy", uid=PROXY_UID, cwd=folder, env=env
            ) as agent:
                url = f"http://{pod.address}:{STATUS_PORT}"
                # Envoy's admin answers, yet Envoy is not LIVE: no pilot, no listeners.
                await wait_until(
                    lambda: _curl(pod, "http://127.0.0.1:15000/ready"), CONVERGE_TIMEOUT,
                    "Envoy's admin to answer /ready", until=lambda code: code == 503,
                    context=agent.tail,
                )  # fmt: skip
                assert await _curl(pod, f"{url}/healthz/ready") == 503
                assert await _curl(pod, f"{url}/stats/prometheus") == 404
                assert await _curl(pod, f"{url}/healthz/ready", "-X", "POST") == 405
    assert leftovers(network) == []


async def test_status_port_zero_holds_nothing_and_says_so(tmp_path: Path) -> None:
    """Istio's `statusPort: 0`: no status port, and the agent warns that 15020 is open."""
    async with pod_network(["solo"]) as network:
        pod = network["solo"]
        with agent_folder(_other_root(), "token", owner=PROXY_UID) as folder:
            argv = [*agent_argv("localhost:1"), "--status-port", "0"]
            env = sidecar_env(pod.address, SOLO)
            async with running_in(
                pod, argv, "started Envoy", uid=PROXY_UID, cwd=folder, env=env
            ) as agent:
                warned = [line for line in agent.lines if "--status-port 0: no status port" in line]
                assert len(warned) == 1, agent.tail()
                assert await _curl(pod, f"http://{pod.address}:{STATUS_PORT}/healthz/ready") == 0
    assert leftovers(network) == []
