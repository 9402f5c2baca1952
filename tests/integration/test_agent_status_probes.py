"""The status port 15020 of an injected sidecar: the app's rewritten probes, quitting, waiting.

Pod `a` is an injected pod: the capture rules set first (as istio-init), `pilot
discovery` (its control plane, on loopback), an app with HTTP and gRPC health
endpoints (tests/integration/probe_app) and the injected agent as a kubelet runs it
(uid 1337, read-only root, emptyDirs) with ISTIO_KUBE_APP_PROBERS as the injector
writes it. Pod `b` plays the kubelet: its GETs of a's 15020 `/app-health/...` paths
answer 200 or 503 as the app's HTTP (2xx/3xx; HTTPS too, its certificate not
verified, as the kubelet's), TCP and gRPC (SERVING) health says;
the app sees them come from 127.0.0.6, and Envoy's inbound listener (15006) never
sees a connection: the probes reach the app directly, so they pass whatever mTLS
mode the port has. A 302 to an address off the pod is an answer, never followed.

Hostile probers: one naming Envoy's admin port, one naming another pod as its host,
one whose path would end the request line: each is left out with a warning and its
path answers 404, as an unknown path does.

`POST /quitquitquit` is refused from pod b and from 127.0.0.6 (what Envoy passes
through from outside comes from there), not allowed as GET, and from 127.0.0.1 (the
pod's own Job app) stops Envoy and the agent with exit 0. `pilot agent wait`, the
classic sidecar's postStart hook, exits 0 once the sidecar is ready, and 1 with one
line when nothing gets ready in time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from pilot.security.certs import cert_pem, key_pem, self_signed_root
from tests.integration.agent_process import PILOT
from tests.integration.cart_sidecar import TOKEN, get_from
from tests.integration.injected_sidecar import (
    injected_env,
    kubelet_volumes,
    proxy_argv,
    read_only_root,
)
from tests.integration.sidecar_support import PROXY_UID, envoy_pid, pilot_in_pod
from tests.support.envoy_process import wait_until
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pod_process import PodProcess, running_in
from tests.support.pods import Pod, leftovers, pod_network

HTTP_PORT, GRPC_PORT, HTTPS_PORT, CLOSED_PORT = 9080, 9090, 9443, 9099
PROBERS = {
    "/app-health/app/livez": {"httpGet": {"path": "/healthz", "port": HTTP_PORT}},
    "/app-health/app/readyz": {"httpGet": {"path": "/fail", "port": HTTP_PORT}},
    "/app-health/app/startupz": {
        "httpGet": {"path": "/moved", "port": str(HTTP_PORT), "scheme": "HTTP"},
        "timeoutSeconds": 2,
    },
    "/app-health/headers/livez": {
        "httpGet": {
            "path": "/headers",
            "port": HTTP_PORT,
            "httpHeaders": [{"name": "x-probe", "value": "yes"}],
        },
    },
    "/app-health/tls/livez": {
        "httpGet": {"path": "/healthz", "port": HTTPS_PORT, "scheme": "HTTPS"}
    },
    "/app-health/tls/readyz": {"httpGet": {"path": "/fail", "port": HTTPS_PORT, "scheme": "HTTPS"}},
    "/app-health/tcp/livez": {"tcpSocket": {"port": HTTP_PORT}},
    "/app-health/tcp/readyz": {"tcpSocket": {"port": CLOSED_PORT}},
    "/app-health/grpc/livez": {"grpc": {"port": GRPC_PORT}},
    "/app-health/grpc/readyz": {"grpc": {"port": GRPC_PORT, "service": "down"}},
    "/app-health/evil/livez": {"httpGet": {"path": "/ready", "port": 15000}},
    "/app-health/evil/readyz": {"httpGet": {"path": "/", "port": HTTP_PORT, "host": "198.18.0.3"}},
    "/app-health/evil/startupz": {"httpGet": {"path": "/x\r\nX-Injected: 1", "port": HTTP_PORT}},
}
EXPECTED = {
    "/app-health/app/livez": 200,
    "/app-health/app/readyz": 503,
    "/app-health/app/startupz": 200,
    "/app-health/headers/livez": 200,
    "/app-health/tls/livez": 200,
    "/app-health/tls/readyz": 503,
    "/app-health/tcp/livez": 200,
    "/app-health/tcp/readyz": 503,
    "/app-health/grpc/livez": 200,
    "/app-health/grpc/readyz": 503,
    "/app-health/evil/livez": 404,
    "/app-health/evil/readyz": 404,
    "/app-health/evil/startupz": 404,
    "/app-health/nobody/livez": 404,
}
_REQUEST = """\
import socket, sys
host, port, method, path, source = sys.argv[1:6]
s = socket.socket()
if source:
    s.bind((source, 0))
s.settimeout(5)
try:
    s.connect((host, int(port)))
    head = f"{method} {path} HTTP/1.1\\r\\nHost: {host}\\r\\nContent-Length: 0\\r\\n\\r\\n"
    s.sendall(head.encode())
    print(s.recv(200).split(b" ")[1].decode())
except OSError:
    print(0)
"""


async def _request(pod: Pod, method: str, url_host: str, path: str, source: str = "") -> int:
    """A raw HTTP/1.1 request from `pod` (bound to `source` if given): the status, 0 if none."""
    status, out, err = await pod.run(sys.executable, "-c", _REQUEST, url_host, "15020", method,
                                     path, source)  # fmt: skip
    assert status == 0, err
    return int(out.strip())


@dataclass
class InjectedPod:
    a: Pod
    b: Pod
    app: PodProcess
    agent: PodProcess


def _app_certificate(folder: Path) -> list[str]:
    """The app's own TLS certificate and key (self-signed: a kubelet's HTTPS probe, and
    the agent's, does not verify it)."""
    key, certificate = self_signed_root("app.example")
    paths = [folder / "app-cert.pem", folder / "app-key.pem"]
    paths[0].write_text(cert_pem(certificate))
    paths[1].write_bytes(key_pem(key))
    return [str(path) for path in paths]


@asynccontextmanager
async def _injected_pod(folder: Path) -> AsyncIterator[InjectedPod]:
    async with pod_network(["a", "b"]) as network:
        a, b = network["a"], network["b"]
        status, _, err = await a.run(str(PILOT), "agent", "iptables", "-m", "REDIRECT")
        assert status == 0, err
        mesh = folder / "mesh.yaml"
        write_mesh(mesh, simple_mesh({"reviews": ["198.18.0.9"]}))
        app_argv = [sys.executable, "-m", "tests.integration.probe_app", str(HTTP_PORT),
                    str(GRPC_PORT), str(HTTPS_PORT), *_app_certificate(folder)]  # fmt: skip
        async with (
            pilot_in_pod(a, folder, mesh, {TOKEN: "system:serviceaccount:shop:cart"}) as pilot,
            running_in(a, app_argv, "serving") as app,
        ):
            with kubelet_volumes(pilot.root_pem.decode()) as volumes:
                env = injected_env(volumes, a.address)
                env["ISTIO_KUBE_APP_PROBERS"] = json.dumps(PROBERS)
                argv = read_only_root(volumes, proxy_argv(volumes, f"localhost:{pilot.tls_port}"))
                async with running_in(a, argv, "started Envoy", env=env) as agent:
                    yield InjectedPod(a, b, app, agent)
    assert leftovers(network) == []


async def _wait_ready(pod: Pod) -> None:
    await wait_until(
        lambda: get_from(pod, f"http://{pod.address}:15021/healthz/ready"),
        30,
        "the sidecar to be ready",
        until=lambda answer: answer[0] == 200,
    )


async def test_the_apps_probes_reach_it_directly_through_the_status_port(tmp_path: Path) -> None:
    async with _injected_pod(tmp_path) as pod:
        a, b = pod.a, pod.b
        await _wait_ready(a)
        answers = {
            path: (await get_from(b, f"http://{a.address}:15020{path}"))[0] for path in EXPECTED
        }
        assert answers == EXPECTED
        _, inbound = await get_from(
            a, "http://127.0.0.1:15000/stats?filter=^listener.0.0.0.0_15006.downstream_cx_total$"
        )
        assert inbound.strip() == "listener.0.0.0.0_15006.downstream_cx_total: 0", inbound
        probes = [line for line in pod.app.lines if line.startswith("probe ")]
        assert "probe 127.0.0.6 GET /healthz" in probes, probes
        assert probes.count("probe 127.0.0.6 GET /moved") == 1, "a redirect was followed"
        assert not any(path in line for line in probes for path in ("/ready", "/x")), probes
        warnings = [line for line in pod.agent.lines if "ISTIO_KUBE_APP_PROBERS" in line]
        assert len(warnings) == 3, warnings
        assert any("port 15000 is the sidecar's own" in line for line in warnings)
        assert any("host '198.18.0.3' is not this pod" in line for line in warnings)
        assert not any("X-Injected" in line for line in warnings)


async def test_quitquitquit_from_the_pod_only_stops_envoy_and_the_agent(tmp_path: Path) -> None:
    async with _injected_pod(tmp_path) as pod:
        a, b, agent = pod.a, pod.b, pod.agent
        waited = await a.run(str(PILOT), "agent", "wait", "--timeoutSeconds", "60", uid=PROXY_UID)
        assert waited[0] == 0, waited
        assert await _request(b, "POST", a.address, "/quitquitquit") == 403
        assert await _request(a, "POST", a.address, "/quitquitquit", "127.0.0.6") == 403
        assert await _request(a, "GET", "127.0.0.1", "/quitquitquit") == 405
        envoy = envoy_pid(agent)
        assert await _request(a, "POST", "127.0.0.1", "/quitquitquit") == 200
        assert await agent.process.wait() == 0, agent.tail()
        assert not _exists(Path(f"/proc/{envoy}")), "Envoy outlived the agent"


def _exists(path: Path) -> bool:
    return path.exists()


async def test_wait_gives_up_in_one_line_when_nothing_gets_ready() -> None:
    async with pod_network(["a"]) as network:
        status, out, err = await network["a"].run(
            str(PILOT), "agent", "wait", "--timeout-seconds", "1", "--periodMillis", "100"
        )
    assert (status, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith(
        "pilot: error: Envoy was not ready within 1s"
        " (last answer from http://localhost:15020/healthz/ready: ConnectionRefusedError"
    )
