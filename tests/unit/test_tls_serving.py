"""The TLS port's certificate renewal outlives a CA that can no longer sign.

The renewal loop must not end when the CA has expired: the current serving
certificate keeps serving, the failure is logged, and renewal is tried again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from pilot.security import serving
from pilot.security.ca import CaExpired, CaSettings, CertificateAuthority
from pilot.security.certs import utcnow


async def test_renewal_keeps_trying_when_the_ca_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ca = CertificateAuthority.load(CaSettings(state_dir=tmp_path / "ca"))
    tls = serving.TlsServing(ca, ["localhost"])
    tls._expires = utcnow()  # due for renewal now

    def expired(*args: Any) -> Any:
        raise CaExpired("the CA expired")

    monkeypatch.setattr(ca, "issue_server", expired)
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def quick_sleep(seconds: float) -> None:
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(serving.asyncio, "sleep", quick_sleep)
    caplog.set_level(logging.ERROR, "pilot.security")
    renewal = asyncio.create_task(tls.run())
    try:
        while len(waits) < 6:
            assert not renewal.done(), "the renewal loop ended"
            await real_sleep(0)
    finally:
        renewal.cancel()
    assert serving.RETRY_SECONDS in waits, "it waits before trying again"
    assert any("cannot renew" in r.getMessage() for r in caplog.records)
