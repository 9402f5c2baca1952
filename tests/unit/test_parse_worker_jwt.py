"""RequestAuthentications of a large registry file come back from the parse worker: the
valid ones and the keys of those refused (whose last good versions stay), exactly as
parsing in place gives them."""

from __future__ import annotations

import pytest

from bench.kubectl_files import kubectl_list, render
from pilot.sources.file_format import parse_registry
from pilot.sources.parse_worker import CHUNK, INLINE_BYTES, parse_off_loop
from tests.support.jwt_tokens import ISSUER, SigningKey

pytestmark = pytest.mark.asyncio
JWKS = SigningKey().jwks()


def _ra(i: int, issuer: str) -> dict[str, object]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": f"jwt-{i}", "namespace": "shop"},
        "spec": {"jwtRules": [{"issuer": issuer, "jwks": JWKS}]},
    }


async def test_request_authentications_come_back_from_the_worker() -> None:
    document = kubectl_list(50)
    document["items"] += [_ra(i, ISSUER) for i in range(CHUNK + 3)]
    document["items"].append(_ra(CHUNK + 3, "bad\nissuer"))
    text = render(document, "json")
    assert len(text) > INLINE_BYTES
    by_worker = await parse_off_loop(text.encode(), "mesh.json", "west")
    assert by_worker == parse_registry(text, "mesh.json", "west")
    assert len(by_worker.request_authentications) == CHUNK + 3
    assert [key.name for key in by_worker.jwt_refused] == [f"jwt-{CHUNK + 3}"]
