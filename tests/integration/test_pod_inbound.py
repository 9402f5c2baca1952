"""A sidecar's inbound side in a real pod: plaintext and mTLS reach the app; STRICT takes mTLS only.

Pod a (tests/support/pods: a network namespace) has the agent's capture rules
(`pilot agent iptables`, as an init container would), `pilot discovery` on a
registry file (a Service `echo.shop` whose endpoint is pod a, port 9080 to
target 8080 and TCP port 9082 to 8082), the app (the test backend on 8080,
8081 and 8082, which answers with the `x-forwarded-client-cert` it saw and
where the request came from) and `pilot agent` starting Envoy as uid 1337.
Pod b has no sidecar. Then, from pod b, to pod a's address and app port:

- plaintext reaches the app through Envoy's `virtualInbound` (PERMISSIVE, the
  default): Envoy counts the connection on 15006 and the request on
  `inbound|8080||`, whose connection to the app comes from 127.0.0.6 (which
  the capture rules let through); a client-cert header the client forged does
  not reach the app;
- TLS with a certificate from pilot's CA for `spiffe://cluster.local/ns/other/
  sa/client` and Istio's ALPN reaches the app, which sees that URI in XFCC;
  Envoy counts the handshake;
- a port of the app no service names is reached the same way, through the
  passthrough chains and `InboundPassthroughCluster`; a TCP service port's
  target is proxied as bytes, plaintext or mTLS with Istio's TCP ALPN;
- a certificate from another CA is refused;
- with a STRICT PeerAuthentication for `shop` written to the file, plaintext
  is refused (on every port) and mTLS still works; PERMISSIVE again takes
  plaintext again, with no restart of anything.

The client certificate is one pilot's CA mints (CreateCertificate, with a
token of `other/client`), as it would for another pod's sidecar.
"""

from __future__ import annotations

import json
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.integration.agent_process import PILOT
from tests.integration.cart_sidecar import (
    TOKEN,
    agent_argv_to,
    cart_agent_folder,
    get_from,
    pod_env,
)
from tests.integration.sidecar_support import PROXY_UID, pilot_in_pod
from tests.support.ca import (
    Issuer,
    issue_leaf,
    new_ca,
    pem,
)
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, service, write_mesh
from tests.support.pilot_process import PilotProcess
from tests.support.pod_process import running_in
from tests.support.pods import Pod, leftovers, pod_network

APP_PORT = 8080
OTHER_PORT = 8081  # the app listens here too, but no service names it: passthrough
TCP_PORT = 8082  # and here, the target of a TCP service port: proxied, not routed
TCP_ALPN = ("--alpn", "istio-peer-exchange,istio")
CLIENT = "spiffe://cluster.local/ns/other/sa/client"
CLIENT_TOKEN = "client-token-0123456789abcdef"
WAIT = 30.0


def _mesh(address: str, mode: str | None = None) -> list[dict[str, Any]]:
    objects = [
        service("echo", "shop", [("http", 9080), ("tcp-raw", 9082)]),
        endpoint_slice("echo", [Ep(address)], "shop", [("http", APP_PORT), ("tcp-raw", TCP_PORT)]),
    ]
    if mode is not None:
        objects.append(
            {
                "apiVersion": "security.istio.io/v1",
                "kind": "PeerAuthentication",
                "metadata": {"name": "default", "namespace": "shop"},
                "spec": {"mtls": {"mode": mode}},
            }
        )
    return objects


def _pilot_in(pod: Pod, folder: Path, mesh: Path) -> AbstractAsyncContextManager[PilotProcess]:
    """`pilot discovery` in the pod, on `mesh`, its streams proven by token."""
    tokens = {
        TOKEN: "system:serviceaccount:shop:cart",
        CLIENT_TOKEN: "system:serviceaccount:other:client",
    }
    return pilot_in_pod(pod, folder, mesh, tokens)


def _client_files(folder: Path, name: str, issuer: Issuer, chain: str) -> list[str]:
    """A client key and certificate for CLIENT from `issuer` (not pilot's CA); the options
    that use them (the server still checked against pilot's root)."""
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = issue_leaf(issuer, key.public_key(), [CLIENT])
    (folder / f"{name}.pem").write_text(pem(leaf) + chain)
    (folder / f"{name}-key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return [
        "--cert", str(folder / f"{name}.pem"),
        "--key", str(folder / f"{name}-key.pem"),
        "--root", str(folder / "root.pem"),
    ]  # fmt: skip


async def _minted_by_pilot(pod: Pod, pilot: PilotProcess, folder: Path) -> list[str]:
    """A client certificate pilot's CA mints for CLIENT (asked for with its token from
    inside the pod, where pilot's TLS port is); the options that use it."""
    out = folder / "minted"
    out.mkdir()
    (folder / "root.pem").write_bytes(pilot.root_pem)
    argv = [sys.executable, "-m", "tests.support.mint_client", f"localhost:{pilot.tls_port}"]
    status, uri, err = await pod.run(*argv, str(folder / "root.pem"), CLIENT_TOKEN, str(out))
    assert status == 0, err
    assert uri.strip() == CLIENT
    return [
        "--cert", str(out / "cert.pem"),
        "--key", str(out / "key.pem"),
        "--root", str(folder / "root.pem"),
    ]  # fmt: skip


async def _call(pod: Pod, host: str, *options: str, port: int = APP_PORT) -> dict[str, Any]:
    argv = [sys.executable, "-m", "tests.support.inbound_client", host, str(port), *options]
    status, out, err = await pod.run(*argv)
    assert status == 0, err
    answer: dict[str, Any] = json.loads(out)
    return answer


async def _stat(pod: Pod, name: str) -> int:
    """One counter of pod's Envoy (0 when it has none yet)."""
    status, text = await get_from(pod, f"http://127.0.0.1:15000/stats?filter=^{name}$")
    assert status == 200, text
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


async def test_plaintext_and_mtls_reach_the_app_through_virtual_inbound(tmp_path: Path) -> None:
    async with pod_network(["a", "b"]) as network:
        a, b = network["a"], network["b"]
        status, _, err = await a.run(str(PILOT), "agent", "iptables")
        assert status == 0, err
        mesh = tmp_path / "mesh.yaml"
        write_mesh(mesh, _mesh(a.address))
        backend = [sys.executable, "-m", "tests.integration.http_backend"]
        app = [*backend, "--host", "0.0.0.0", "--port", str(APP_PORT)]
        other = [*backend, "--host", "0.0.0.0", "--port", str(OTHER_PORT)]
        raw = [*backend, "--host", "0.0.0.0", "--port", str(TCP_PORT)]
        async with (
            _pilot_in(a, tmp_path, mesh) as pilot,
            running_in(a, app, "serving on"),
            running_in(a, other, "serving on"),
            running_in(a, raw, "serving on"),
        ):
            with cart_agent_folder(pilot.root_pem.decode(), owner=PROXY_UID) as folder:
                agent_argv, env = agent_argv_to(pilot), pod_env(a.address)
                async with running_in(
                    a, agent_argv, "started Envoy", uid=PROXY_UID, cwd=folder, env=env
                ) as agent:
                    context = agent.tail
                    await _exercise(a, b, pilot=pilot, mesh=mesh, folder=tmp_path, context=context)
    assert leftovers(network) == []


async def _exercise(
    a: Pod, b: Pod, *, pilot: PilotProcess, mesh: Path, folder: Path, context: Any
) -> None:
    plain = await wait_until(
        lambda: _call(b, a.address, "--xfcc", f"By=x;URI={CLIENT}"),
        WAIT,
        "plaintext through virtualInbound",
        until=lambda answer: answer["status"] == 200,
        context=context,
    )
    assert plain["xfcc"] == "", "a client-cert header the client forged never reaches the app"
    assert plain["peer"] == "127.0.0.6", "Envoy reached the app from its inbound source"
    assert await _stat(a, "listener.0.0.0.0_15006.downstream_cx_total") >= 1
    assert await _stat(a, "cluster.inbound|8080||.upstream_rq_total") >= 1

    mtls = await _minted_by_pilot(a, pilot, folder)
    answer = await _call(b, a.address, *mtls)
    assert answer["status"] == 200, answer
    assert f"URI={CLIENT}" in answer["xfcc"], answer
    assert await _stat(a, "listener.0.0.0.0_15006.ssl.handshake") >= 1

    passthrough = await _call(b, a.address, port=OTHER_PORT)
    assert passthrough["status"] == 200 and passthrough["peer"] == "127.0.0.6", passthrough
    assert (await _call(b, a.address, *mtls, port=OTHER_PORT))["status"] == 200
    assert await _stat(a, "cluster.InboundPassthroughCluster.upstream_cx_total") >= 2

    tcp_plain = await _call(b, a.address, "--xfcc", "URI=forged", port=TCP_PORT)
    assert tcp_plain["status"] == 200 and tcp_plain["peer"] == "127.0.0.6", tcp_plain
    assert tcp_plain["xfcc"] == "URI=forged", "a TCP port is proxied, bytes as they came"
    tcp_mtls = await _call(b, a.address, *mtls, *TCP_ALPN, port=TCP_PORT)
    assert tcp_mtls["status"] == 200, tcp_mtls
    assert await _stat(a, f"cluster.inbound|{TCP_PORT}||.upstream_cx_total") >= 2
    http_alpn_on_tcp = await _call(b, a.address, *mtls, port=TCP_PORT)
    assert http_alpn_on_tcp["status"] == 0, "a TCP port's mTLS chain takes Istio's TCP ALPN"

    stranger = new_ca("another mesh")
    forged = _client_files(folder, "stranger", stranger, stranger.cert_pem)
    refused = await _call(b, a.address, *forged)
    assert refused["status"] == 0, f"a certificate from another CA got in: {refused}"

    write_mesh(mesh, _mesh(a.address, "STRICT"))
    await wait_until(
        lambda: _call(b, a.address),
        WAIT,
        "STRICT to refuse plaintext",
        until=lambda answer: answer["status"] == 0,
        context=context,
    )
    assert (await _call(b, a.address, *mtls))["status"] == 200, "mTLS still works"
    assert (await _call(b, a.address, port=OTHER_PORT))["status"] == 0, "passthrough too"
    assert (await _call(b, a.address, port=TCP_PORT))["status"] == 0, "TCP too"
    assert (await _call(b, a.address, *mtls, *TCP_ALPN, port=TCP_PORT))["status"] == 200
    assert (await _call(b, a.address, *mtls, port=OTHER_PORT))["status"] == 200

    write_mesh(mesh, _mesh(a.address, "PERMISSIVE"))
    await wait_until(
        lambda: _call(b, a.address),
        WAIT,
        "PERMISSIVE to take plaintext again",
        until=lambda answer: answer["status"] == 200,
        context=context,
    )
