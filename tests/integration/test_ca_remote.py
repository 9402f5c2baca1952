"""`CA_ADDR`: pilot's SDS has a separate Istio-protocol CA sign its proxies' certificates.

The CA is either `FakeIstioCa` (ca_support: records every request, signs with
its own root, can go down and come back on the same port, can answer broken
chains) or a second pilot on its own ports. A proxy subscribes to `default` and
`ROOTCA` over ADS with node metadata (`--xds-auth none`); its certificate must
root at *that* CA, which must have seen pilot's token (CA_TOKEN_FILE), the
proxy's identity as `ImpersonatedIdentity` when it is not pilot's own, and the
configured lifetime. pilot always has the CA's root (CA_ROOT_CERT), TLS or
plaintext: `ROOTCA` is that root and every chain must lead to it; nothing is
trusted on first use. While the CA is down or answers something that does not
verify (or more than MAX_CHAIN certificates, or more than MAX_ANSWER_BYTES),
`ca_errors` rises and no secret (least of all an empty one) is pushed; the
subscription gets its secret once the CA signs properly again. The answer is
checked off the event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pilot.security import ca_client, secrets
from pilot.security.ca_client import RemoteCaSettings
from pilot.security.identity import Identity
from pilot.security.secrets import SdsSettings
from pilot.xds import types
from tests.support.ca import (
    IMPERSONATED,
    FakeIstioCa,
    Fault,
    Token,
    assert_issued_chain,
    kube_api,
    load_chain,
    node,
    record_signatures,
    reviews,
    sa_token,
    san_uris,
    spiffe,
)
from tests.support.envoy_process import wait_until
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.sds_secrets import (
    ROOT,
    WORKLOAD,
    WorkloadCert,
    root_in,
    workload_in,
    workloads_received,
)
from tests.support.xds_client import SotwStream, XdsClient

MESH = simple_mesh({"a": ["10.0.0.1"]})
PILOT_ACCOUNT = ("istio-system", "istiod")
OWN = Identity("cluster.local", *PILOT_ACCOUNT)
PROXY = ("ns1", "sa1")
TTL = datetime.timedelta(hours=2)
FAST_RETRY = SdsSettings(ttl=TTL, retry_initial=0.05, retry_max=0.25)
TOKEN = Token("pilot-token-from-ca-token-file")
WAIT = 10.0


def _subdir(parent: Path, name: str) -> Path:
    path = parent / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _token_file(directory: Path, token: str = TOKEN) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "istio-token"
    path.write_text(token + "\n")
    return path


def _root_file(directory: Path, root_pem: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ca-root.pem"
    path.write_text(root_pem)
    return path


@asynccontextmanager
async def _pilot_using(
    directory: Path, address: str, root_pem: str, *, tls: bool = False
) -> AsyncIterator[RunningPilot]:
    """A pilot whose SDS has the CA at `address` sign, its CA_ROOT_CERT holding `root_pem`
    (TLS verified with it, or plaintext with CA_INSECURE=true)."""
    remote = RemoteCaSettings(
        address=address,
        root_cert=_root_file(directory, root_pem),
        insecure=not tls,
        token_file=_token_file(directory),
        own_identity=OWN,
    )
    security = {"remote_ca": remote, "sds": FAST_RETRY}
    async with running_pilot(directory, MESH, security=security) as pilot:
        yield pilot


def _stats(pilot: RunningPilot) -> Any:
    assert pilot.discovery.security is not None
    return pilot.discovery.security.secrets.stats


async def _ca_errors_reach(pilot: RunningPilot, count: int) -> None:
    await wait_until(
        lambda: _stats(pilot).ca_errors, 15, f"{count} CA errors", until=lambda n: n >= count
    )


async def _workload_for(pilot: RunningPilot, proxy: Any) -> WorkloadCert:
    """Subscribe `proxy` to `default` on a stream of its own; its certificate once it came."""
    async with XdsClient(pilot.grpc_target) as xds:
        ads = xds.ads(proxy)
        await ads.subscribe(types.SECRET, [WORKLOAD])
        return workload_in(await ads.ack_until(types.SECRET, [WORKLOAD], WAIT))


async def _no_workload_pushed(ads: SotwStream) -> None:
    """No `default` (ROOTCA, the configured root, may be there) and no empty response."""
    await ads.ack_pending()
    assert workloads_received(ads) == [], (
        "no `default` may be pushed before the CA signs a chain that verifies"
    )
    sizes = [len(r.resources) for r in ads.received if r.type_url == types.SECRET]
    assert 0 not in sizes, "an empty SDS response"


def _only_complete_secrets(ads: SotwStream) -> None:
    """No empty SDS response, and every `default` has a chain and its key (decoding
    fails on one without)."""
    sizes = [len(r.resources) for r in ads.received if r.type_url == types.SECRET]
    assert 0 not in sizes, "an empty SDS response"
    workloads_received(ads)


# ------------------------------------------------------------------ happy paths


async def test_proxy_certificate_roots_at_the_remote_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        FakeIstioCa({TOKEN: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address, fake.root_pem) as pilot,
    ):
        assert pilot.discovery.security is not None
        local_ca = pilot.discovery.security.ca
        local_signatures = record_signatures(monkeypatch, local_ca)
        async with XdsClient(pilot.grpc_target) as xds:
            ads = xds.ads(node("proxy-1", *PROXY))
            await ads.subscribe(types.SECRET, [WORKLOAD, ROOT])
            secrets = await ads.ack_until(types.SECRET, [WORKLOAD, ROOT], WAIT)

    workload = workload_in(secrets)
    chain = list(workload.chain)
    assert_issued_chain(chain, fake.root.cert)
    assert chain[-1] != local_ca.root
    assert san_uris(chain[0]) == [spiffe(*PROXY)]
    assert workload.key_matches_leaf, "the secret's key is not the certificate's"
    assert load_chain(root_in(secrets)) == [fake.root.cert]
    assert local_signatures == [], "pilot's own CA must not sign when CA_ADDR is set"

    assert len(fake.calls) == 1, "one certificate, one request"
    call = fake.calls[0]
    sent_token = call.authorization == f"Bearer {TOKEN}"
    assert sent_token, "the CA did not get 'Bearer <contents of CA_TOKEN_FILE>'"
    assert call.caller == OWN.uri
    assert call.impersonated == spiffe(*PROXY)
    assert call.request_metadata == {IMPERSONATED: spiffe(*PROXY)}
    assert call.csr_uris == [spiffe(*PROXY)]
    assert call.validity_duration == int(TTL.total_seconds())
    assert _stats(pilot).ca_errors == 0
    _only_complete_secrets(ads)


async def test_no_impersonation_for_pilots_own_identity(tmp_path: Path) -> None:
    async with (
        FakeIstioCa({TOKEN: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address, fake.root_pem) as pilot,
    ):
        workload = await _workload_for(pilot, node("proxy-own", *PILOT_ACCOUNT))
    assert san_uris(workload.chain[0]) == [OWN.uri]
    assert [(c.impersonated, c.request_metadata) for c in fake.calls] == [(None, {})]


async def test_token_file_is_read_on_every_call(tmp_path: Path) -> None:
    """Projected tokens rotate: the CA gets whatever CA_TOKEN_FILE holds at the time."""
    rotated = Token("pilot-token-after-rotation")
    async with (
        FakeIstioCa({TOKEN: OWN.uri, rotated: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address, fake.root_pem) as pilot,
    ):
        await _workload_for(pilot, node("proxy-1", *PROXY))
        _token_file(tmp_path, rotated)
        await _workload_for(pilot, node("proxy-2", "ns2", "sa2"))
    assert len(fake.calls) == 2
    tokens = (TOKEN, rotated)
    sent = [c.authorization == f"Bearer {t}" for c, t in zip(fake.calls, tokens, strict=True)]
    assert sent == [True, True], "the second call must carry the rotated token"


async def test_tls_verified_with_ca_root_cert(tmp_path: Path) -> None:
    async with (
        FakeIstioCa({TOKEN: OWN.uri}, tls=True) as fake,
        _pilot_using(tmp_path, fake.address, fake.root_pem, tls=True) as pilot,
        XdsClient(pilot.grpc_target) as xds,
    ):
        ads = xds.ads(node("proxy-1", *PROXY))
        await ads.subscribe(types.SECRET, [WORKLOAD, ROOT])
        secrets = await ads.ack_until(types.SECRET, [WORKLOAD, ROOT], WAIT)
    assert_issued_chain(list(workload_in(secrets).chain), fake.root.cert)
    assert root_in(secrets) == fake.root_pem
    assert len(fake.calls) == 1


async def test_tls_ca_not_matching_ca_root_cert_is_never_used(tmp_path: Path) -> None:
    async with (
        FakeIstioCa({TOKEN: OWN.uri}, tls=True) as fake,
        _pilot_using(tmp_path, fake.address, fake.other.cert_pem, tls=True) as pilot,
        XdsClient(pilot.grpc_target) as xds,
    ):
        ads = xds.ads(node("proxy-1", *PROXY))
        await ads.subscribe(types.SECRET, [WORKLOAD])
        await _ca_errors_reach(pilot, 3)
        await _no_workload_pushed(ads)
    assert fake.calls == [], "no request (and no token) may reach an unverified server"


# ------------------------------------------------------------------ faults


async def test_secret_arrives_once_the_ca_is_back(tmp_path: Path) -> None:
    fake = FakeIstioCa({TOKEN: OWN.uri})
    await fake.start()
    await fake.stop()  # keep its port, be down
    try:
        async with (
            _pilot_using(tmp_path, fake.address, fake.root_pem) as pilot,
            XdsClient(pilot.grpc_target) as xds,
        ):
            ads = xds.ads(node("proxy-1", *PROXY))
            await ads.subscribe(types.SECRET, [WORKLOAD, ROOT])
            rootca = root_in(await ads.ack_until(types.SECRET, [ROOT], WAIT))
            await _ca_errors_reach(pilot, 3)
            await _no_workload_pushed(ads)
            errors_while_down = _stats(pilot).ca_errors
            await fake.start()
            workload = workload_in(await ads.ack_until(types.SECRET, [WORKLOAD], 20))
            assert _stats(pilot).ca_errors >= errors_while_down
            assert _stats(pilot).minted == 1
            _only_complete_secrets(ads)
    finally:
        await fake.stop()
    assert rootca == fake.root_pem, "ROOTCA is CA_ROOT_CERT, even while the CA is down"
    assert_issued_chain(list(workload.chain), fake.root.cert)
    assert san_uris(workload.chain[0]) == [spiffe(*PROXY)]
    assert len(fake.signed) == 1


REFUSAL = {
    Fault.LEAF_NOT_SIGNED_BY_ROOT: "returned a chain that does not verify",
    Fault.WRONG_IDENTITY: "signed for ['spiffe://cluster.local/ns/somewhere-else",
    Fault.LONG_CHAIN: "returned a chain of 11 certificates (at most 10)",
    Fault.HUGE_ANSWER: "RESOURCE_EXHAUSTED",  # refused by gRPC as it arrives, never parsed
}


@pytest.mark.parametrize("fault", list(REFUSAL), ids=lambda f: f.value)
async def test_chain_that_does_not_verify_is_refused(
    tmp_path: Path, fault: Fault, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        FakeIstioCa({TOKEN: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address, fake.root_pem) as pilot,
        XdsClient(pilot.grpc_target) as xds,
    ):
        ads = xds.ads(node("proxy-1", *PROXY))
        fake.fault = fault
        await ads.subscribe(types.SECRET, [WORKLOAD, ROOT])
        rootca = root_in(await ads.ack_until(types.SECRET, [ROOT], WAIT))
        await _ca_errors_reach(pilot, 3)
        await _no_workload_pushed(ads)
        assert _stats(pilot).minted == 0
        refusals = [
            r.getMessage() for r in caplog.records if "cannot get a certificate" in r.getMessage()
        ]
        assert refusals and all(REFUSAL[fault] in r for r in refusals), refusals

        fake.fault = Fault.NONE  # the CA mends its ways: the retry succeeds
        secrets = await ads.ack_until(types.SECRET, [WORKLOAD], WAIT)
        _only_complete_secrets(ads)
    assert_issued_chain(list(workload_in(secrets).chain), fake.root.cert)
    assert load_chain(rootca) == [fake.root.cert]


async def test_the_cas_answer_is_checked_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying the chain, and loading the key to match it with the leaf, are crypto:
    none of it runs on the event loop's thread, which a rollout would otherwise stall."""
    ran_on: dict[str, int] = {}

    def recorded(name: str, check: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any) -> Any:
            ran_on[name] = threading.get_ident()
            return check(*args)

        return spy

    monkeypatch.setattr(ca_client, "verify_chain", recorded("verify", ca_client.verify_chain))
    monkeypatch.setattr(secrets, "key_matches", recorded("key match", secrets.key_matches))
    async with (
        FakeIstioCa({TOKEN: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address, fake.root_pem) as pilot,
    ):
        workload = await _workload_for(pilot, node("proxy-1", *PROXY))
    assert workload.key_matches_leaf
    assert set(ran_on) == {"verify", "key match"}
    assert threading.get_ident() not in ran_on.values(), "a check ran on the event loop"


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
async def test_no_root_is_learned_from_the_ca(tmp_path: Path, tls: bool) -> None:
    """From its very first answer on, a CA signing under another root than CA_ROOT_CERT
    gets nothing served, over plaintext too; ROOTCA is CA_ROOT_CERT all along."""
    async with (
        FakeIstioCa({TOKEN: OWN.uri}, tls=tls) as fake,
        _pilot_using(tmp_path, fake.address, fake.root_pem, tls=tls) as pilot,
        XdsClient(pilot.grpc_target) as xds,
    ):
        fake.fault = Fault.OTHER_ROOT
        ads = xds.ads(node("proxy-1", *PROXY))
        await ads.subscribe(types.SECRET, [WORKLOAD, ROOT])
        rootca = root_in(await ads.ack_until(types.SECRET, [ROOT], WAIT))
        await _ca_errors_reach(pilot, 3)
        await ads.ack_pending()
        assert rootca == fake.root_pem
        assert workloads_received(ads) == [], "a chain under another root was served"
        assert _stats(pilot).minted == 0
        assert len(fake.calls) >= 3

        fake.fault = Fault.NONE
        secrets = await ads.ack_until(types.SECRET, [WORKLOAD], WAIT)
    assert_issued_chain(list(workload_in(secrets).chain), fake.root.cert)


# ------------------------------------------------------------------ a pilot as the CA


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "not-trusted"])
async def test_second_pilot_as_the_ca(tmp_path: Path, trusted: bool) -> None:
    """Pilot A's SDS asks pilot B's CA, authenticated by a TokenReview at B's API server."""
    async with kube_api(tmp_path) as (srv, kubeconfig):
        token = sa_token(srv, *PILOT_ACCOUNT)
        accounts = ("/".join(PILOT_ACCOUNT),) if trusted else ()
        async with running_pilot(
            _subdir(tmp_path, "b"),
            MESH,
            kubeconfig=kubeconfig,
            security={"trusted_node_accounts": accounts},
        ) as ca_pilot:
            assert ca_pilot.discovery.security is not None
            ca_root = ca_pilot.discovery.security.ca.root
            remote = RemoteCaSettings(
                address=ca_pilot.grpc_target,
                root_cert=_root_file(tmp_path / "a", ca_pilot.discovery.security.ca.root_pem),
                insecure=True,
                token_file=_token_file(tmp_path / "a", token),
                own_identity=OWN,
            )
            security = {"remote_ca": remote, "sds": FAST_RETRY}
            async with (
                running_pilot(tmp_path / "a", MESH, security=security) as pilot,
                XdsClient(pilot.grpc_target) as xds,
            ):
                assert pilot.discovery.security is not None
                assert pilot.discovery.security.ca.root != ca_root
                ads = xds.ads(node("proxy-1", *PROXY))
                await ads.subscribe(types.SECRET, [WORKLOAD])
                if trusted:
                    secrets = await ads.ack_until(types.SECRET, [WORKLOAD], WAIT)
                    chain = list(workload_in(secrets).chain)
                    assert_issued_chain(chain, ca_root)
                    assert san_uris(chain[0]) == [spiffe(*PROXY)]
                    lifetime = chain[0].not_valid_after_utc - chain[0].not_valid_before_utc
                    assert lifetime == TTL + datetime.timedelta(minutes=2)
                else:
                    await _ca_errors_reach(pilot, 3)
                    await _no_workload_pushed(ads)
        username = f"system:serviceaccount:{PILOT_ACCOUNT[0]}:{PILOT_ACCOUNT[1]}"
        assert set(reviews(srv)) == {(("istio-ca",), True, username)}


# ------------------------------------------------------------------ pilot discovery


@pytest.mark.parametrize("insecure", ["", "true"], ids=["tls", "plaintext"])
async def test_pilot_discovery_with_ca_addr_needs_ca_root_cert(
    tmp_path: Path, insecure: str
) -> None:
    """As users run it: without the root, `pilot discovery` says so in one line and stops."""
    config = tmp_path / "mesh.yaml"
    write_mesh(config, MESH)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CA_")}
    environment |= {"CA_ADDR": "ca.example:15012", "CA_INSECURE": insecure}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pilot", "discovery", "--config", str(config)),
        *("--grpc-addr", "127.0.0.1:0", "--grpc-tls-addr", "", "--http-addr", "127.0.0.1:0"),
        *("--webhook-addr", ""),
        env=environment | {"HOME": str(tmp_path)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, stderr = await process.communicate()
    assert process.returncode == 2
    assert stderr.decode().splitlines() == [
        "pilot: error: CA_ADDR=ca.example:15012: set CA_ROOT_CERT to the root its certificates"
        " must chain to (needed with CA_INSECURE=true too: no root is taken from the CA)"
    ]
