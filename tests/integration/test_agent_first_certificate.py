"""A sidecar's first certificate arrives without a retry, however pilot and the pod race.

In a cluster the pods of a Deployment and pilot come up together: an injected agent
asks for its first certificate as soon as Envoy asks it for one, and pilot may not
listen yet. Here the agent (the injected command, as a kubelet runs it: uid 1337,
read-only root) starts in pod `a` first, dialling pilot's Service name
(`pilot.pilot-system.svc:15012`, resolved by the pod's hosts file to pod `p`); only
once the agent has started Envoy does `pilot discovery` start in pod `p`. The pod's
nameserver never answers (its packets are dropped, as where DNS is not reachable), so
only the hosts file names pilot: gRPC's own DNS client (c-ares) would wait for the
nameserver's AAAA answer for ~11 s, past the CA call's deadline, so the first request
used to time out and the second succeed ~12 s later; pilot's processes resolve names
with the system's resolver (`GRPC_DNS_RESOLVER=native`, set in `pilot/__init__`), as
the hosts file says at once. The certificate comes from pilot's CA in one request
(pilot's own log: one "CA signed" line) and the agent never logs that a request
failed and is retried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.integration.cart_sidecar import TOKEN
from tests.integration.injected_sidecar import (
    injected_env,
    kubelet_volumes,
    proxy_argv,
    read_only_root,
)
from tests.support.ca import write_plugged_in
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot_process import (
    PilotProcess,
    discovery_command,
    pilot_environment,
    start_command,
)
from tests.support.pod_process import running_in
from tests.support.pods import Pod, leftovers, pod_network

SERVICE = "pilot.pilot-system.svc"
ABSENT_GATEWAY = "198.18.0.254"
SIGNED = "CA signed a certificate for spiffe://cluster.local/ns/shop/sa/cart"


def _tls_on_15012(command: list[str]) -> list[str]:
    """pilot's TLS port where its Service sends 15012, on the pod's address."""
    at = command.index("--grpc-tls-addr")
    return [*command[: at + 1], "0.0.0.0:15012", *command[at + 2 :]]


async def _dns_that_never_answers(pod: Pod) -> None:
    """A default route to a gateway that is not there: the host's nameserver is asked
    and never answers, as where cluster DNS drops what it does not serve. The hosts
    file still names pilot's Service."""
    status, _, err = await pod.run("ip", "route", "add", "default", "via", ABSENT_GATEWAY)
    assert status == 0, err


@asynccontextmanager
async def _pilot_in(pod: Pod, folder: Path, ca_dir: Path) -> AsyncIterator[PilotProcess]:
    """`pilot discovery` in pod `p` as the Service's pod, the agent's token proven by file."""
    mesh = folder / "mesh.yaml"
    write_mesh(mesh, simple_mesh({"reviews": ["198.18.0.9"]}))
    tokens = folder / "tokens.csv"
    tokens.write_text(f"{TOKEN},system:serviceaccount:shop:cart\n")
    tokens.chmod(0o600)
    source = ["--config", str(mesh), "--xds-auth", "kubernetes", "--token-auth-file", str(tokens)]
    command = pod.command(*_tls_on_15012(discovery_command(folder, source, ca_dir)))
    env = pilot_environment(folder, {"POD_NAMESPACE": "pilot-system"})
    pilot = await start_command(folder, command, env=env)
    try:
        yield pilot
    finally:
        await pilot.stop()


async def test_the_first_certificate_comes_in_one_request_from_a_pilot_that_starts_later(
    tmp_path: Path,
) -> None:
    ca = write_plugged_in(tmp_path / "plugged-in-ca")
    async with pod_network(["p", "a"], hosts={SERVICE: "198.18.0.2"}) as network:
        p, a = network["p"], network["a"]
        await _dns_that_never_answers(a)
        with kubelet_volumes(ca.root.cert_pem) as volumes:
            argv = read_only_root(volumes, proxy_argv(volumes, f"{SERVICE}:15012"))
            async with (
                running_in(a, argv, "started Envoy", env=injected_env(volumes, a.address)) as agent,
                _pilot_in(p, tmp_path, ca.directory) as pilot,
            ):
                await agent.wait_line("minted certificate for proxy", within=60)
        # Counted once pilot has stopped: its log is read as it writes, and the agent
        # can hold the certificate before pilot's line has been read.
        signed = [e["msg"] for e in pilot.log if SIGNED in e["msg"]]
        assert signed == [SIGNED], pilot.tail()
        retried = [line for line in agent.lines if "cannot get a certificate" in line]
        assert retried == [], agent.tail()
    assert leftovers(network) == []
