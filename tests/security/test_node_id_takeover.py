"""Another proxy's node id gets none of its secrets: attacks on a real `pilot discovery`.

Node ids are not secret. A workload holding any valid service-account token
(ns-a/attacker) connects with the node id of another proxy (ns-b/victim) and asks for
secrets every way xDS allows: a wildcard (a SotW first request naming nothing, delta
`*`, a delta first request naming nothing) or the name `default`, over ADS or the
SecretDiscoveryService, on the plaintext and the TLS port, with no identity metadata or
with its own (honest) NAMESPACE/SERVICE_ACCOUNT, before or after the victim connects.

A stream is who its token proves. So, whatever the attacker does:

* the victim's Envoy only ever holds a certificate for spiffe://cluster.local/ns/ns-b/sa/victim,
  whichever of the two connected first, and the attacker connecting, subscribing or
  disconnecting pushes nothing to it (same serial, no new secret: checked up to the
  answer of a request sent afterwards, see `Peer.barrier`);
* the attacker never receives the victim's certificate or key;
* a wildcard on secrets gets no secret at all, and pilot logs one warning saying that
  secrets are served by name only;
* naming `default` gets the attacker a certificate for its own identity, with its key.

Next to the attacks: the victim alone gets its certificate (key matching) and the root;
node metadata naming the victim's account with the attacker's token is refused.
"""

from __future__ import annotations

import pytest

from tests.support.peers import (
    ATTACKER,
    ROOTCA,
    VICTIM,
    WAIT,
    WILDCARD_WARNING,
    WORKLOAD,
    Mesh,
    Peer,
    Route,
    attacker,
    attacks,
    gets_its_secrets,
    show_all,
    victim,
    wait_streams,
    wildcard_warning,
)
from tests.support.xds_client import fingerprint

pytestmark = pytest.mark.asyncio(loop_scope="package")

ADS_SOTW_DEFAULT = Route("ads-sotw-default", "ads", delta=False, names=(WORKLOAD,))
ROUTES = [
    Route("ads-sotw-wildcard", "ads", delta=False, names=()),
    Route("ads-delta-star", "ads", delta=True, names=("*",)),
    Route("ads-delta-empty", "ads", delta=True, names=()),
    ADS_SOTW_DEFAULT,
    Route("ads-delta-default", "ads", delta=True, names=(WORKLOAD,)),
    Route("sds-sotw-wildcard", "sds", delta=False, names=()),
    Route("sds-delta-star", "sds", delta=True, names=("*",)),
    Route("sds-sotw-default", "sds", delta=False, names=(WORKLOAD,)),
    Route("sds-delta-default", "sds", delta=True, names=(WORKLOAD,)),
]
PORTS = {"plaintext": False, "tls": True}


def assert_victim_holds_only_its_own(victim: Peer) -> None:
    foreign = [s for s in victim.certificates() if s.uris != (VICTIM.uri,)]
    assert not foreign, (
        f"the victim's Envoy ({VICTIM}) was sent {show_all(foreign)}: it would present "
        "another workload's identity to its peers"
    )
    assert victim.workload is not None and victim.workload.key_matches_leaf


def assert_attacker_has_nothing_of_the_victims(attacker: Peer, victim: Peer) -> None:
    victim_keys = {s.leaf_public for s in victim.certificates() if VICTIM.uri in s.uris}
    stolen = [
        s
        for s in attacker.certificates()
        if VICTIM.uri in s.uris or (s.key_public is not None and s.key_public in victim_keys)
    ]
    assert not stolen, (
        f"the attacker (token {ATTACKER}, the victim's node id) was sent {show_all(stolen)}: "
        f"it can now impersonate {VICTIM.uri}"
    )


def assert_nothing_new(victim: Peer, since: int, serial: int | None, after: str) -> None:
    pushed = victim.secrets[since:]
    assert not pushed, f"after {after}, pilot pushed the victim's Envoy {show_all(pushed)}"
    assert victim.workload is not None and victim.workload.serial == serial, (
        f"after {after}, the victim's certificate changed"
    )


@pytest.mark.parametrize("attacker_metadata", [False, True], ids=["no-metadata", "own-metadata"])
@pytest.mark.parametrize("victim_first", [True, False], ids=["victim-first", "attacker-first"])
@pytest.mark.parametrize("route", ROUTES, ids=[r.id for r in ROUTES])
@pytest.mark.parametrize("tls", PORTS.values(), ids=PORTS.keys())
async def test_another_proxys_node_id_gets_none_of_its_secrets(
    mesh: Mesh, tls: bool, route: Route, victim_first: bool, attacker_metadata: bool
) -> None:
    """Both connect (in either order) and ask; then the attacker disconnects. After each
    step a barrier shows what reached the victim: nothing but its own certificate."""
    node_id = mesh.node_id()
    mark = mesh.pilot.mark()
    # The victim's Envoy: ADS, SotW or delta like the attacker's stream.
    good = victim(mesh, node_id, tls, delta=route.delta)
    bad = attacker(mesh, node_id, tls, route, ATTACKER if attacker_metadata else None)
    try:
        if victim_first:
            await gets_its_secrets(good)
            await attacks(mesh, bad, route, mark)
        else:
            await attacks(mesh, bad, route, mark)
            await gets_its_secrets(good)
        assert good.workload is not None
        held, serial = len(good.secrets), good.workload.serial
        # Whatever pilot pushed because of the other stream is read by now.
        await bad.barrier("answer to a request sent after both connected")
        await good.barrier("answer to a request sent after the attacker subscribed")

        assert_victim_holds_only_its_own(good)
        assert_attacker_has_nothing_of_the_victims(bad, good)
        assert_nothing_new(good, held, serial, "the attacker connected and subscribed")
        if route.wildcard:
            served = bad.unasked()
            assert not served, (
                f"a wildcard Secret subscription ({route.id}) was answered with "
                f"{show_all(served)}; secrets are served by name only"
            )
        else:
            own = bad.certificates()
            assert own and all(s.uris == (ATTACKER.uri,) for s in own), (
                f"naming `default` with another proxy's node id should get the attacker a "
                f"certificate for its own identity {ATTACKER.uri}; it got {show_all(own)}"
            )
            assert bad.workload is not None and bad.workload.key_matches_leaf, (
                "the attacker's certificate came without its key"
            )

        await bad.close()
        await wait_streams(mesh.pilot, node_id, 1)
        await good.barrier("answer to a request sent after the attacker disconnected")
        assert_nothing_new(good, held, serial, "the attacker disconnected")
        assert_victim_holds_only_its_own(good)

        if route.wildcard:
            await mesh.pilot.wait_logged(
                wildcard_warning, f"a warning that {WILDCARD_WARNING}", mark, WAIT
            )
            warnings = mesh.pilot.logged(wildcard_warning, mark)
            assert len(warnings) == 1, f"{len(warnings)} wildcard warnings for one stream"
    finally:
        await bad.close()
        await good.close()


@pytest.mark.parametrize(
    ("service", "delta"),
    [("ads", False), ("ads", True), ("sds", False), ("sds", True)],
    ids=["ads-sotw", "ads-delta", "sds-sotw", "sds-delta"],
)
@pytest.mark.parametrize("tls", PORTS.values(), ids=PORTS.keys())
async def test_a_proxy_gets_its_own_certificate_and_the_root(
    mesh: Mesh, tls: bool, service: str, delta: bool
) -> None:
    """The honest case next to the attacks: the victim alone."""
    node_id = mesh.node_id()
    alone = victim(mesh, node_id, tls, service=service, delta=delta)
    try:
        await gets_its_secrets(alone)
        workload = alone.workload
        assert workload is not None
        assert workload.uris == (VICTIM.uri,), f"the proxy got {show_all([workload])}"
        assert workload.has_key and workload.key_matches_leaf, "the key is not the certificate's"
        root = fingerprint(mesh.ca.root.cert_pem.encode())
        assert alone.held[ROOTCA].trusted_ca_sha256 == (root,), "ROOTCA is not pilot's root"
        assert_victim_holds_only_its_own(alone)
    finally:
        await alone.close()


@pytest.mark.parametrize("tls", PORTS.values(), ids=PORTS.keys())
async def test_claiming_the_victims_account_in_metadata_is_refused(mesh: Mesh, tls: bool) -> None:
    """The attacker's token with the victim's NAMESPACE/SERVICE_ACCOUNT: PERMISSION_DENIED,
    nothing sent, and the victim's Envoy keeps its certificate (nothing pushed)."""
    node_id = mesh.node_id()
    good = victim(mesh, node_id, tls, delta=False)
    liar = attacker(mesh, node_id, tls, ADS_SOTW_DEFAULT, claims=VICTIM)
    try:
        await gets_its_secrets(good)
        assert good.workload is not None
        held, serial = len(good.secrets), good.workload.serial
        await liar.ask([WORKLOAD, ROOTCA])
        ended = await liar.stream.next_event(WAIT)
        await liar.accept(ended)
        assert liar.closed is not None, f"the stream was served: {show_all(liar.secrets)}"
        assert liar.closed.code.name == "PERMISSION_DENIED", liar.closed.details
        await wait_streams(mesh.pilot, node_id, 1)
        await good.barrier("answer to a request sent after the refusal")
        assert_nothing_new(good, held, serial, "another account's stream was refused")
        assert_victim_holds_only_its_own(good)
    finally:
        await liar.close()
        await good.close()
