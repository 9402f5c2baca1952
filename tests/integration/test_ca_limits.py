"""The CA answers a bounded number of certificate requests at once (PILOT_MAX_PENDING_CSRS).

Signing is held up (the CA's `sign` waits for the test), so that requests pile
up: past the limit a request is refused at once with RESOURCE_EXHAUSTED, and
counted; those admitted are signed once signing resumes, and later requests are
admitted again.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from pilot.limits import Limits
from tests.support.ca import CaCaller, kube_api, make_csr, sa_token
from tests.support.mesh import simple_mesh
from tests.support.pilot import running_pilot

PENDING = 2


async def test_requests_past_the_pending_limit_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        kube_api(tmp_path) as (srv, kubeconfig),
        running_pilot(
            tmp_path,
            simple_mesh({"alpha": ["10.0.0.1"]}),
            kubeconfig=kubeconfig,
            limits=Limits(pending_csrs=PENDING),
        ) as pilot,
    ):
        security = pilot.discovery.security
        assert security is not None
        resume = threading.Event()
        signing = security.ca.sign

        def held_sign(*args: Any) -> list[str]:
            resume.wait(10)
            return signing(*args)

        monkeypatch.setattr(security.ca, "sign", held_sign)
        token = sa_token(srv, "shop", "cart")
        async with CaCaller(pilot.grpc_target) as ca:

            async def request() -> list[str]:
                _, csr = make_csr(["spiffe://cluster.local/ns/shop/sa/cart"])
                return await ca.create(csr, token=token)

            admitted = [asyncio.create_task(request()) for _ in range(PENDING)]
            await _until(lambda: security.ca_service.in_flight == PENDING)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await request()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "PILOT_MAX_PENDING_CSRS" in (refused.value.details() or "")
            assert pilot.discovery.admission.hits.counts["pending_csrs"] == 1
            resume.set()
            for chain in await asyncio.gather(*admitted):
                assert chain, "an admitted request is signed"
            assert await request(), "room again once they are answered"


async def _until(condition: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not condition():
        assert loop.time() < deadline, "requests never reached the CA"
        await asyncio.sleep(0.01)  # polling the CA's own count, with a deadline
