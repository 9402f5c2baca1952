"""One `pilot discovery` subprocess and one test API server for all of tests/security.

pilot runs as users run it against Kubernetes: `--xds-auth` is left at its default
(`kubernetes`: every stream carries a service-account token, checked by TokenReview).
Its CA is a plugged-in one written here, so that tests know the root. The API server
holds a few Services (so that ADS streams can subscribe to endpoints, see
`Peer.barrier`) and the tokens of the two accounts the tests play: ns-b/victim and
ns-a/attacker. Tests share the process; each uses node ids of its own (`Mesh.node_id`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.integration.ca_support import sa_token, write_plugged_in
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.security.peers import ATTACKER, BARRIER_SERVICES, VICTIM, Mesh
from tests.security.pilot_process import start_pilot
from tests.support.mesh import Ep, endpoint_slice, service


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    folder = tmp_path_factory.mktemp("security")
    ca = write_plugged_in(folder / "plugged-in-ca")
    async with KubeAPIServer() as srv:
        for name in BARRIER_SERVICES:
            srv.apply(service(name))
            srv.apply(endpoint_slice(name, [Ep("10.1.0.1")]))
        tokens = {
            account: sa_token(srv, account.namespace, account.name)
            for account in (VICTIM, ATTACKER)
        }
        kubeconfig = write_kubeconfig(folder / "kubeconfig.yaml", srv.url)
        pilot = await start_pilot(folder, kubeconfig, ca.directory, ca.root.cert_pem.encode())
        try:
            yield Mesh(pilot, srv, ca, tokens)
        finally:
            await pilot.stop()
