"""PILOT_PATH_NORMALIZATION=MERGE_SLASHES and DECODE_AND_MERGE_SLASHES on real sidecars,
pilot started with the variable as the README prints it: the app receives the merged
(and decoded) paths, and a path DENY still refuses every spelling of its paths.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.integration.mesh_pods import Mesh
from tests.integration.path_pods import answers, hold, path_mesh, policy, release, to_paths

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

MODES = ["MERGE_SLASHES", "DECODE_AND_MERGE_SLASHES"]
SPELLINGS = [
    "/deny", "//deny", "/DENY", "/%2Fdeny", "/%2fdeny", "/%5Cdeny", "/x/..%2Fdeny", "/./deny",
    "/a/../deny", "/%64eny", "/admin//x", "/ADMIN/x", "/admin%2Fx", "///admin///x",
]  # fmt: skip
# What the app receives: slashes merged under both; %2F and %5C decoded under DECODE_.
RECEIVED = {
    "MERGE_SLASHES": {
        "//allowed//x": "/allowed/x",
        "/allowed%2Fx": "/allowed%2Fx",
        "/allowed%5Cx": "/allowed%5Cx",
        "/a//../allowed": "/a/allowed",
        "/%61llowed": "/allowed",
    },
    "DECODE_AND_MERGE_SLASHES": {
        "//allowed//x": "/allowed/x",
        "/allowed%2Fx": "/allowed/x",
        "/allowed%2f%2Fx": "/allowed/x",
        "/allowed%5Cx": "/allowed/x",
        "/a//../allowed": "/a/allowed",
        "/%61llowed": "/allowed",
    },
}


@pytest.fixture(scope="module", params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """The PILOT_PATH_NORMALIZATION pilot runs with."""
    value: str = request.param
    return value


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(mode: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    folder = tmp_path_factory.mktemp(f"pod-paths-{mode.lower()}")
    async with path_mesh(folder, {"PILOT_PATH_NORMALIZATION": mode}) as running:
        yield running


async def test_the_app_receives_merged_and_decoded_paths(mesh: Mesh, mode: str) -> None:
    expected = RECEIVED[mode]
    for client in ("c", "a"):
        found = await answers(mesh, client, list(expected))
        assert found == {t: (200, seen) for t, seen in expected.items()}, (client, found)


async def test_a_deny_still_holds(mesh: Mesh) -> None:
    deny = policy("deny-paths", "DENY", to_paths("paths", "/deny", "/admin/*"))
    await hold(mesh, deny)
    try:
        for client in ("c", "a"):
            found = await answers(mesh, client, SPELLINGS)
            through = {t: v for t, v in found.items() if v[1]}
            assert not through, (client, through)
            assert {status for status, _ in found.values()} <= {400, 403}, (client, found)
    finally:
        await release(mesh, deny)
