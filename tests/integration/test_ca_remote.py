"""`CA_ADDR`: pilot's SDS has a separate Istio-protocol CA sign its proxies' certificates.

The CA is either `FakeIstioCa` (ca_support: records every request, signs with
its own root, can go down and come back on the same port, can answer broken
chains) or a second pilot on its own ports. A proxy subscribes to `default` and
`ROOTCA` over ADS with node metadata (`--xds-auth none`); its certificate must
root at *that* CA, which must have seen pilot's token (CA_TOKEN_FILE), the
proxy's identity as `ImpersonatedIdentity` when it is not pilot's own, and the
configured lifetime. While the CA is down or answers something that does not
verify, `ca_errors` rises and no secret (least of all an empty one) is pushed;
the subscription gets its secret once the CA signs properly again.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pilot.security.ca_client import RemoteCaSettings
from pilot.security.identity import Identity
from pilot.security.secrets import SdsSettings
from pilot.xds import types
from tests.harness.envoy_process import wait_until
from tests.integration.ca_support import (
    IMPERSONATED,
    AdsClient,
    FakeIstioCa,
    Fault,
    Token,
    assert_issued_chain,
    is_complete_workload_secret,
    kube_api,
    load_chain,
    node,
    record_signatures,
    reviews,
    sa_token,
    san_uris,
    secret_key_matches_leaf,
    spiffe,
    workload_chain,
)
from tests.support.mesh import simple_mesh
from tests.support.pilot import RunningPilot, running_pilot

MESH = simple_mesh({"a": ["10.0.0.1"]})
PILOT_ACCOUNT = ("istio-system", "istiod")
OWN = Identity("cluster.local", *PILOT_ACCOUNT)
PROXY = ("ns1", "sa1")
TTL = datetime.timedelta(hours=2)
FAST_RETRY = SdsSettings(ttl=TTL, retry_initial=0.05, retry_max=0.25)
TOKEN = Token("pilot-token-from-ca-token-file")


def _subdir(parent: Path, name: str) -> Path:
    path = parent / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _token_file(directory: Path, token: str = TOKEN) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "istio-token"
    path.write_text(token + "\n")
    return path


@asynccontextmanager
async def _pilot_using(
    directory: Path, address: str, *, root_cert: Path | None = None
) -> AsyncIterator[RunningPilot]:
    """A pilot whose SDS has the CA at `address` sign (plaintext unless `root_cert`)."""
    remote = RemoteCaSettings(
        address=address,
        root_cert=root_cert,
        insecure=root_cert is None,
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


def _no_secret_pushed(ads: AdsClient) -> None:
    pushed = [
        (r.version_info, len(r.resources)) for r in ads.responses if r.type_url == types.SECRET
    ]
    assert pushed == [], "no secret may be pushed before the CA signs a chain that verifies"


def _only_complete_secrets(ads: AdsClient) -> None:
    for response in ads.responses:
        if response.type_url == types.SECRET:
            assert len(response.resources) > 0, "an empty SDS response"
    assert all(is_complete_workload_secret(s) for s in ads.secrets_named("default"))


# ------------------------------------------------------------------ happy paths


async def test_proxy_certificate_roots_at_the_remote_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        FakeIstioCa({TOKEN: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address) as pilot,
    ):
        assert pilot.discovery.security is not None
        local_ca = pilot.discovery.security.ca
        local_signatures = record_signatures(monkeypatch, local_ca)
        async with AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads:
            await ads.subscribe(types.SECRET, ["default", "ROOTCA"])
            workload = await ads.secret("default")
            rootca = await ads.secret("ROOTCA")

    chain = workload_chain(workload)
    assert_issued_chain(chain, fake.root.cert)
    assert chain[-1] != local_ca.root
    assert san_uris(chain[0]) == [spiffe(*PROXY)]
    assert secret_key_matches_leaf(workload), "the secret's key is not the certificate's"
    assert load_chain(rootca.validation_context.trusted_ca.inline_bytes) == [fake.root.cert]
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
        _pilot_using(tmp_path, fake.address) as pilot,
        AdsClient(pilot.grpc_target, node("proxy-own", *PILOT_ACCOUNT)) as ads,
    ):
        await ads.subscribe(types.SECRET, ["default"])
        workload = await ads.secret("default")
    assert san_uris(workload_chain(workload)[0]) == [OWN.uri]
    assert [(c.impersonated, c.request_metadata) for c in fake.calls] == [(None, {})]


async def test_token_file_is_read_on_every_call(tmp_path: Path) -> None:
    """Projected tokens rotate: the CA gets whatever CA_TOKEN_FILE holds at the time."""
    rotated = Token("pilot-token-after-rotation")
    async with (
        FakeIstioCa({TOKEN: OWN.uri, rotated: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address) as pilot,
    ):
        async with AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads:
            await ads.subscribe(types.SECRET, ["default"])
            await ads.secret("default")
        _token_file(tmp_path, rotated)
        async with AdsClient(pilot.grpc_target, node("proxy-2", "ns2", "sa2")) as ads:
            await ads.subscribe(types.SECRET, ["default"])
            await ads.secret("default")
    assert len(fake.calls) == 2
    tokens = (TOKEN, rotated)
    sent = [c.authorization == f"Bearer {t}" for c, t in zip(fake.calls, tokens, strict=True)]
    assert sent == [True, True], "the second call must carry the rotated token"


async def test_tls_verified_with_ca_root_cert(tmp_path: Path) -> None:
    async with FakeIstioCa({TOKEN: OWN.uri}, tls=True) as fake:
        root_file = tmp_path / "ca-root.pem"
        root_file.write_text(fake.root_pem)
        async with (
            _pilot_using(tmp_path / "pilot", fake.address, root_cert=root_file) as pilot,
            AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads,
        ):
            await ads.subscribe(types.SECRET, ["default", "ROOTCA"])
            workload = await ads.secret("default")
            rootca = await ads.secret("ROOTCA")
    assert_issued_chain(workload_chain(workload), fake.root.cert)
    assert rootca.validation_context.trusted_ca.inline_bytes.decode() == fake.root_pem
    assert len(fake.calls) == 1


async def test_tls_ca_not_matching_ca_root_cert_is_never_used(tmp_path: Path) -> None:
    async with FakeIstioCa({TOKEN: OWN.uri}, tls=True) as fake:
        wrong_root = tmp_path / "wrong-root.pem"
        wrong_root.write_text(fake.other.cert_pem)
        async with (
            _pilot_using(tmp_path / "pilot", fake.address, root_cert=wrong_root) as pilot,
            AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads,
        ):
            await ads.subscribe(types.SECRET, ["default"])
            await _ca_errors_reach(pilot, 3)
            _no_secret_pushed(ads)
    assert fake.calls == [], "no request (and no token) may reach an unverified server"


# ------------------------------------------------------------------ faults


async def test_secret_arrives_once_the_ca_is_back(tmp_path: Path) -> None:
    fake = FakeIstioCa({TOKEN: OWN.uri})
    await fake.start()
    await fake.stop()  # keep its port, be down
    try:
        async with (
            _pilot_using(tmp_path, fake.address) as pilot,
            AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads,
        ):
            await ads.subscribe(types.SECRET, ["default", "ROOTCA"])
            await _ca_errors_reach(pilot, 3)
            _no_secret_pushed(ads)
            errors_while_down = _stats(pilot).ca_errors
            await fake.start()
            workload = await ads.secret("default", within=20)
            assert _stats(pilot).ca_errors >= errors_while_down
            assert _stats(pilot).minted == 1
            await ads.secret("ROOTCA")
            _only_complete_secrets(ads)
    finally:
        await fake.stop()
    assert_issued_chain(workload_chain(workload), fake.root.cert)
    assert san_uris(workload_chain(workload)[0]) == [spiffe(*PROXY)]
    assert len(fake.signed) == 1


@pytest.mark.parametrize(
    "fault", [Fault.LEAF_NOT_SIGNED_BY_ROOT, Fault.WRONG_IDENTITY], ids=lambda f: f.value
)
async def test_chain_that_does_not_verify_is_refused(tmp_path: Path, fault: Fault) -> None:
    async with (
        FakeIstioCa({TOKEN: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address) as pilot,
        AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads,
    ):
        fake.fault = fault
        await ads.subscribe(types.SECRET, ["default", "ROOTCA"])
        await _ca_errors_reach(pilot, 3)
        _no_secret_pushed(ads)  # not `default`, and no ROOTCA learned from a bad chain
        assert _stats(pilot).minted == 0

        fake.fault = Fault.NONE  # the CA mends its ways: the retry succeeds
        workload = await ads.secret("default")
        rootca = await ads.secret("ROOTCA")
        _only_complete_secrets(ads)
    assert_issued_chain(workload_chain(workload), fake.root.cert)
    assert load_chain(rootca.validation_context.trusted_ca.inline_bytes) == [fake.root.cert]


async def test_chain_under_another_root_than_the_one_served_is_refused(tmp_path: Path) -> None:
    """Without CA_ROOT_CERT, the root is learned from the first chain; later chains must
    verify against it, or a proxy gets a `default` its ROOTCA (and every peer) rejects."""
    async with (
        FakeIstioCa({TOKEN: OWN.uri}) as fake,
        _pilot_using(tmp_path, fake.address) as pilot,
    ):
        async with AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as first:
            await first.subscribe(types.SECRET, ["default", "ROOTCA"])
            await first.secret("default")
            learned = await first.secret("ROOTCA")
        assert load_chain(learned.validation_context.trusted_ca.inline_bytes) == [fake.root.cert]

        fake.fault = Fault.OTHER_ROOT
        errors_before = _stats(pilot).ca_errors
        async with AdsClient(pilot.grpc_target, node("proxy-2", "ns2", "sa2")) as ads:
            await ads.subscribe(types.SECRET, ["default", "ROOTCA"])
            rootca = await ads.secret("ROOTCA")
            await wait_until(
                lambda: (
                    bool(ads.secrets_named("default"))
                    or _stats(pilot).ca_errors >= errors_before + 3
                ),
                15,
                "a secret for proxy-2 or 3 more CA errors",
            )
    trusted = load_chain(rootca.validation_context.trusted_ca.inline_bytes)
    for secret in ads.secrets_named("default"):
        served_under = workload_chain(secret)[-1].subject.rfc4514_string()
        assert workload_chain(secret)[-1] in trusted, (
            f"pilot served a `default` chain ending in {served_under!r} next to a ROOTCA of "
            f"{trusted[0].subject.rfc4514_string()!r}: no peer can verify it"
        )


async def test_chain_under_another_root_than_ca_root_cert_is_refused(tmp_path: Path) -> None:
    async with FakeIstioCa({TOKEN: OWN.uri}, tls=True) as fake:
        root_file = tmp_path / "ca-root.pem"
        root_file.write_text(fake.root_pem)
        async with (
            _pilot_using(tmp_path / "pilot", fake.address, root_cert=root_file) as pilot,
            AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads,
        ):
            fake.fault = Fault.OTHER_ROOT
            await ads.subscribe(types.SECRET, ["default"])
            await _ca_errors_reach(pilot, 3)
            _no_secret_pushed(ads)
            assert len(fake.calls) >= 3


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
                insecure=True,
                token_file=_token_file(tmp_path / "a", token),
                own_identity=OWN,
            )
            security = {"remote_ca": remote, "sds": FAST_RETRY}
            async with (
                running_pilot(tmp_path / "a", MESH, security=security) as pilot,
                AdsClient(pilot.grpc_target, node("proxy-1", *PROXY)) as ads,
            ):
                assert pilot.discovery.security is not None
                assert pilot.discovery.security.ca.root != ca_root
                await ads.subscribe(types.SECRET, ["default"])
                if trusted:
                    workload = await ads.secret("default")
                    chain = workload_chain(workload)
                    assert_issued_chain(chain, ca_root)
                    assert san_uris(chain[0]) == [spiffe(*PROXY)]
                    lifetime = chain[0].not_valid_after_utc - chain[0].not_valid_before_utc
                    assert lifetime == TTL + datetime.timedelta(minutes=2)
                else:
                    await _ca_errors_reach(pilot, 3)
                    _no_secret_pushed(ads)
        username = f"system:serviceaccount:{PILOT_ACCOUNT[0]}:{PILOT_ACCOUNT[1]}"
        assert set(reviews(srv)) == {(("istio-ca",), True, username)}
