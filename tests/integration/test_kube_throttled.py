"""An API server that throttles pilot's lists (429 with a Retry-After), on the test API
server: a real one does so while its watch cache fills, as after a CRD is created, and
which requests it picks cannot be chosen there.

pilot waits as the server asks and lists again without calling the cluster unreachable,
as client-go does, up to ten 429s in a row; a Retry-After past 10 s is waited as 10 s; a
server that never lets go fails the informer (its `error`, what /ready shows) until a
list succeeds again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pilot.kube.informer import MAX_THROTTLED
from tests.kubeapi.server import KubeAPIServer
from tests.support.envoy_process import wait_until
from tests.support.kube_helpers import MeshDriver, informers, kube_api, ready, relists
from tests.support.pilot import RunningPilot, running_kube_pilot

LOGGER = "pilot.sources.kubernetes"
WAIT = 20.0


@dataclass
class Throttled:
    srv: KubeAPIServer
    pilot: RunningPilot
    mesh: MeshDriver
    relists: dict[str, int]  # each informer's relists before the throttled ones


@asynccontextmanager
async def throttled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, lists: int | None, retry_after: str
) -> AsyncIterator[Throttled]:
    """pilot synced on the test API server, whose next `lists` lists (None: all) get 429
    with `retry_after`; once every informer watches, every watch ends with 410, so each
    lists again."""
    caplog.set_level(logging.INFO, LOGGER)
    async with kube_api(tmp_path) as (srv, kubeconfig):
        mesh = MeshDriver(srv, {"alpha": ready("127.0.1.1")})
        async with running_kube_pilot(kubeconfig) as pilot:
            before = relists(pilot)
            srv.throttle_lists(lists, retry_after)
            kinds = [informer.kind for informer in informers(pilot)]
            await srv.wait_until(lambda: all(srv.open_watches_for(k) for k in kinds), timeout=WAIT)
            srv.expire_watches()
            yield Throttled(srv, pilot, mesh, before)


def _waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "asks to wait" in r.getMessage()]


def _failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "429" in r.getMessage()
    ]


async def test_throttled_relists_are_waited_out_without_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with throttled(tmp_path, caplog, 4, "0") as up:  # the first four lists get 429
        up.mesh.edit("moved", alpha=ready("127.0.1.2"))

        def relisted() -> bool:
            now = relists(up.pilot)
            return all(now[kind] > up.relists[kind] for kind in now)

        await wait_until(relisted, WAIT, "every informer listed again", until=bool)
        assert len(_waits(caplog)) == 4, _waits(caplog)
        assert _failures(caplog) == []
        assert all(i.synced for i in informers(up.pilot))


async def test_a_server_that_never_lets_go_fails_the_informer_until_it_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with throttled(tmp_path, caplog, None, "0") as up:

        def failing() -> list[str]:
            return [i.error for i in informers(up.pilot) if "429" in i.error]

        await wait_until(failing, WAIT, "an informer failing on 429s", until=bool)
        assert len(_waits(caplog)) >= MAX_THROTTLED
        up.srv.throttle_lists(0)
        await wait_until(
            lambda: all(i.synced for i in informers(up.pilot)),
            WAIT,
            "every informer listed again once the server let go",
            until=bool,
        )


async def test_a_retry_after_past_ten_seconds_is_waited_as_ten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with throttled(tmp_path, caplog, 1, "99999999999999999999"):
        waits = await wait_until(lambda: _waits(caplog), WAIT, "a throttled list", until=bool)
        assert waits[0].endswith("retrying in 10.0s"), waits
