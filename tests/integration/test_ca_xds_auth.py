"""`--xds-auth kubernetes`: every xDS stream proves who it is with a service-account token.

A pilot on a Kubernetes source (the test API server, which also answers
TokenReviews) with `XdsAuth.KUBERNETES`: pilot's own checks of what a stream claims,
once TokenReview has said whose a token is. A stream without a token ends
UNAUTHENTICATED; one whose node metadata (NAMESPACE, SERVICE_ACCOUNT, each where
present) names another account than its token ends PERMISSION_DENIED, and so does one
whose metadata is no Kubernetes name (with `--xds-auth none` too, where the metadata
is the identity); none gets a resource or has a certificate minted.

What TokenReview itself says of real tokens (accepted for istio-ca and served with the
token's identity; another audience, an expired token, a deleted Pod's, a string nobody
issued, all refused) is tested on the real API server: tests/cluster/test_bound_tokens.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2

from pilot.security.xds_auth import XdsAuth
from pilot.xds import types
from tests.kubeapi import KubeAPIServer
from tests.support.ca import (
    FETCH_CLUSTERS,
    Token,
    kube_api,
    node,
    reviews,
    sa_token,
    san_uris,
    spiffe,
)
from tests.support.mesh import Ep, endpoint_slice, service, simple_mesh
from tests.support.pilot import RunningPilot, running_kube_pilot, running_pilot
from tests.support.sds_secrets import ROOT, WORKLOAD, workload_in
from tests.support.xds_client import ADS_SOTW, SDS_SOTW, Closed, XdsClient, describe, first_reply

PROXY = ("ns1", "sa1")
WAIT = 10.0


@dataclass
class KubePilot:
    """A pilot requiring tokens on xDS, and the API server that reviews them."""

    srv: KubeAPIServer
    pilot: RunningPilot

    def token(
        self, namespace: str, account: str, audiences: tuple[str, ...] = ("istio-ca",)
    ) -> Token:
        return sa_token(self.srv, namespace, account, audiences)

    @property
    def secret_stats(self) -> Any:
        assert self.pilot.discovery.security is not None
        return self.pilot.discovery.security.secrets.stats

    async def refused(
        self, node_message: Any, token: Token | None, method: str = ADS_SOTW
    ) -> tuple[grpc.StatusCode, str]:
        """How the stream ends; fails if it received anything or had a certificate minted.

        A stream asking for both secrets, with `first_reply`: with grpc.aio, a write racing
        the server's status would report INTERNAL instead of that status.
        """
        request = discovery_pb2.DiscoveryRequest(
            node=node_message, type_url=types.SECRET, resource_names=[WORKLOAD, ROOT]
        )
        reply = await first_reply(self.pilot.grpc_target, method, [request], token=token)
        if not isinstance(reply, Closed):
            pytest.fail(f"the stream was served ({describe(reply)}) instead of refused")
        assert self.secret_stats.minted == 0, "no certificate for a refused stream"
        leaked = token is not None and token in reply.details
        assert not leaked, "the refusal message repeats the stream's token"
        return reply.code, reply.details


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubePilot]:
    async with kube_api(tmp_path) as (srv, kubeconfig):
        srv.apply(service("alpha"))
        srv.apply(endpoint_slice("alpha", [Ep("10.0.0.1")]))
        async with running_kube_pilot(kubeconfig, xds_auth=XdsAuth.KUBERNETES) as pilot:
            yield KubePilot(srv, pilot)


# ------------------------------------------------------------------ refused


@pytest.mark.parametrize("method", [ADS_SOTW, SDS_SOTW], ids=["ads", "sds"])
async def test_stream_without_token_is_unauthenticated(kube: KubePilot, method: str) -> None:
    code, details = await kube.refused(node("proxy-1", *PROXY), None, method)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer" in details
    assert reviews(kube.srv) == []


@pytest.mark.parametrize(
    "claimed",
    [("ns1", "admin"), ("kube-system", "sa1"), ("kube-system", "admin")],
    ids=["other-account", "other-namespace", "both"],
)
async def test_metadata_claiming_another_identity_is_permission_denied(
    kube: KubePilot, claimed: tuple[str, str]
) -> None:
    token = kube.token(*PROXY)
    code, details = await kube.refused(node("proxy-1", *claimed), token)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "/".join(claimed) in details, "say what the metadata claimed"
    assert "/".join(PROXY) in details, "say what the token is"


@pytest.mark.parametrize(
    ("namespace", "account"),
    [("kube-system", None), (None, "admin")],
    ids=["namespace-only", "service-account-only"],
)
async def test_partial_metadata_claiming_another_identity_is_permission_denied(
    kube: KubePilot, namespace: str | None, account: str | None
) -> None:
    """Each of NAMESPACE and SERVICE_ACCOUNT, where present, must match the token."""
    token = kube.token(*PROXY)
    code, _ = await kube.refused(node("proxy-1", namespace, account), token)
    assert code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("claimed", "part"),
    [
        (("..", "sa1"), "node metadata NAMESPACE: namespace '..'"),
        (("ns1", "sa1/../admin"), "node metadata SERVICE_ACCOUNT: service account 'sa1/../admin'"),
    ],
    ids=["namespace", "service-account"],
)
async def test_metadata_that_is_no_kubernetes_name_is_permission_denied(
    kube: KubePilot, claimed: tuple[str, str], part: str
) -> None:
    token = kube.token(*PROXY)
    code, details = await kube.refused(node("proxy-1", *claimed), token)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert part in details


async def test_unary_fetch_without_token_is_unauthenticated(kube: KubePilot) -> None:
    """FetchClusters is xDS too: without a token it must not reveal the mesh."""
    async with grpc.aio.insecure_channel(kube.pilot.grpc_target) as channel:
        fetch = channel.unary_unary(
            FETCH_CLUSTERS,
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
        )
        request = discovery_pb2.DiscoveryRequest(node=node("proxy-1", *PROXY))
        try:
            response = await fetch(request, timeout=10)
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        else:
            pytest.fail(
                f"FetchClusters without a token answered {len(response.resources)} clusters"
            )


# ------------------------------------------------------------------ --xds-auth none


@pytest.mark.parametrize(
    ("claimed", "part"),
    [
        (("..", "x"), "namespace '..'"),
        (("ns1", "x/y"), "service account 'x/y'"),
        (("kube-system/..", "admin"), "namespace 'kube-system/..'"),
    ],
)
async def test_without_xds_auth_metadata_must_still_be_kubernetes_names(
    tmp_path: Path, claimed: tuple[str, str], part: str
) -> None:
    """With `--xds-auth none` the metadata *is* the identity: a liar is refused, not minted
    a certificate for a SPIFFE path of its making; an honest proxy still gets its own."""
    async with running_pilot(tmp_path, simple_mesh({"alpha": ["10.0.0.1"]})) as pilot:
        assert pilot.discovery.security is not None
        secrets = pilot.discovery.security.secrets
        request = discovery_pb2.DiscoveryRequest(
            node=node("liar", *claimed), type_url=types.SECRET, resource_names=[WORKLOAD, ROOT]
        )
        reply = await first_reply(pilot.grpc_target, ADS_SOTW, [request])
        if not isinstance(reply, Closed):
            pytest.fail(f"the stream was served ({describe(reply)}) instead of refused")
        assert reply.code == grpc.StatusCode.PERMISSION_DENIED
        assert part in reply.details
        assert secrets.stats.minted == 0, "no certificate for a refused stream"

        async with XdsClient(pilot.grpc_target) as xds:
            ads = xds.ads(node("honest", *PROXY))
            await ads.subscribe(types.SECRET, [WORKLOAD, ROOT])
            honest = await ads.ack_until(types.SECRET, [WORKLOAD, ROOT], WAIT)
        assert san_uris(next(iter(workload_in(honest).chain))) == [spiffe(*PROXY)]
