"""One `pilot discovery` subprocess and one test API server for all of tests/security.

pilot runs as users run it against Kubernetes: `--xds-auth` is left at its default
(`kubernetes`: every stream carries a service-account token, checked by TokenReview),
with `--plaintext-secrets` so that every attack is tried on both ports
(`test_ports.py` runs a pilot of its own with the default, secrets on TLS only).
Its CA is a plugged-in one written here, so that tests know the root. The API server
holds a few Services (so that ADS streams can subscribe to endpoints, see
`Peer.barrier`) and the tokens of the two accounts the tests play: ns-b/victim and
ns-a/attacker. Tests share the process; each uses node ids of its own (`Mesh.node_id`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.support.peers import Mesh, running_mesh


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    # The attacks run on both ports: the plaintext one serves secrets only when asked to.
    folder = tmp_path_factory.mktemp("security")
    async with running_mesh(folder, "--plaintext-secrets") as running:
        yield running
