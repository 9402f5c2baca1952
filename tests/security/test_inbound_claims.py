"""Node ids claiming another pod's IP or namespace weaken nothing the pod's sidecar gets.

A real pilot (file source, `--xds-auth kubernetes`, tokens from a token file):
the pod `echo-1` (10.44.0.7) in namespace `shop`, STRICT, is the victim. Its
sidecar proves shop/cart with its token. Attackers hold a token of their own
(lax/evil) and connect with the victim's very node id, or with its IP and the
namespace `lax` (PERMISSIVE) in their node id. Then:

- each attacker gets an inbound listener for its *proven* namespace (lax:
  plaintext chains), whatever namespace its node id names, and none of shop's
  ports at the IP it claims (inbound ports come from the proxy's own
  namespace's slices);
- the victim's listener stays STRICT, and the attackers connecting sends the
  victim nothing (checked up to the answer of a request it sent afterwards);
- with a token, a node id naming shop changes nothing: the namespace is the
  one proven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.listener.v3 import listener_pb2

from pilot.security.xds_auth import XdsAuth
from pilot.xds import types
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

TIMEOUT = 30.0
VICTIM_TOKEN = "victim-token-0123456789abcdef"
ATTACKER_TOKEN = "attacker-token-0123456789abcdef"
VICTIM_ID = "sidecar~10.44.0.7~echo-1.shop~shop.svc.cluster.local"
LAX_ID = "sidecar~10.44.0.7~echo-1.lax~lax.svc.cluster.local"


def _mesh() -> list[dict[str, Any]]:
    return [
        service("echo", "shop", [("http", 9080)]),
        endpoint_slice("echo", [Ep("10.44.0.7")], "shop", [("http", 8080)]),
        {
            "apiVersion": "security.istio.io/v1",
            "kind": "PeerAuthentication",
            "metadata": {"name": "default", "namespace": "shop"},
            "spec": {"mtls": {"mode": "STRICT"}},
        },
    ]


async def _inbound(stream: DeltaStream) -> listener_pb2.Listener:
    """Subscribe like a sidecar; the virtualInbound it is sent first."""
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    while True:
        response = await stream.next_response(TIMEOUT)
        await stream.ack(response)
        held = delta_resources(response)
        if "virtualInbound" in held:
            listener: listener_pb2.Listener = held["virtualInbound"].message
            return listener


def _transports(listener: listener_pb2.Listener) -> set[str]:
    return {c.filter_chain_match.transport_protocol for c in listener.filter_chains}


async def test_claims_of_another_pods_ip_or_namespace_weaken_nothing(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.csv"
    tokens.write_text(
        f"{VICTIM_TOKEN},system:serviceaccount:shop:cart\n"
        f"{ATTACKER_TOKEN},system:serviceaccount:lax:evil\n"
    )
    tokens.chmod(0o600)
    security = {"xds_auth": XdsAuth.KUBERNETES, "token_auth_file": tokens}
    async with (
        running_pilot(tmp_path, _mesh(), security=security) as pilot,
        XdsClient(pilot.grpc_target, token=VICTIM_TOKEN) as victim_client,
        XdsClient(pilot.grpc_target, token=ATTACKER_TOKEN) as attacker_client,
    ):
        victim = victim_client.delta_ads(node(VICTIM_ID))
        assert _transports(await _inbound(victim)) == {"tls", ""}, "STRICT"
        seen = len(victim.received)

        for claimed in (VICTIM_ID, LAX_ID):
            attacker = attacker_client.delta_ads(node(claimed))
            mine = await _inbound(attacker)
            assert _transports(mine) == {"tls", "raw_buffer", ""}, (
                f"{claimed}: the proven namespace (lax, PERMISSIVE) decides"
            )
            ports = {c.filter_chain_match.destination_port.value for c in mine.filter_chains}
            assert 8080 not in ports, "shop's ports at the IP it claims stay shop's"

        # A request after the attackers: its answer comes after anything pushed before.
        await victim.subscribe(types.ENDPOINT, [cluster_name("echo", 9080, "shop")])
        answer = await victim.next_response(TIMEOUT)
        assert answer.type_url == types.ENDPOINT
        assert len(victim.received) == seen + 1, (
            f"the attackers pushed the victim {victim.received[seen:-1]}"
        )
        assert pilot.discovery.inbound is not None
        assert pilot.discovery.inbound.shapes == 2, "the victim's STRICT and lax's one"
