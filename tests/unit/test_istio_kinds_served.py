"""Which Istio kinds the config cluster's API server serves, asked once each.

An API server that cannot be asked costs one request, not one per group version:
DestinationRule and VirtualService are then watched at their first version anyway
(their informers retry and hold readiness back, so no rule is dropped because the API
server was slow at start); the kinds only counted are left out.
"""

from __future__ import annotations

from typing import Any

from pilot.sources.kubernetes.istio_config import KINDS, served_versions


class Unreachable:
    """An API client whose every call fails, counting them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call_api(self, path: str, *_args: Any, **_kwargs: Any) -> Any:
        self.calls.append(path)
        raise OSError("connection refused")


async def test_an_unreachable_api_server_is_asked_once() -> None:
    api = Unreachable()
    found = await served_versions(api)  # type: ignore[arg-type]
    assert len(api.calls) == 1
    assert {(k.kind, v) for k, v in found.items()} == {
        (k.kind, k.versions[0]) for k in KINDS if k.whole
    }
