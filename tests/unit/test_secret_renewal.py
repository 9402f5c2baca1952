"""The secret manager renews each wanted certificate with a callback and a timer, no task.

- Wanted certificates hold no task each: a rollout's thousand proxies add none.
- A proxy released while its mint still waits in the queue gets no key made.
- A released proxy's rotation never comes; a wanted one's keeps coming.
- A mint that raises what no check foresaw is logged at ERROR with its traceback
  and tried again; an expired CA is a CA error, a warning, tried again too.
- A `ready` callback that raises does not stop the certificate's renewal.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pilot.security.ca import CaExpired, CaSettings, CertificateAuthority, Leaf
from pilot.security.ca_client import LocalCa
from pilot.security.identity import Identity
from pilot.security.secrets import SdsSettings, SecretManager
from pilot.xds.proxy import ProxyKey
from tests.support.envoy_process import wait_until

WAIT = 30.0
FAST_RETRY = SdsSettings(retry_initial=0.01, retry_max=0.02)
SHORT_TTL = SdsSettings(ttl=datetime.timedelta(seconds=2), grace_ratio=0.95)  # renewed ~0.1 s on


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load(CaSettings(state_dir=tmp_path / "ca"))


def _proxy(name: str) -> ProxyKey:
    return ProxyKey(f"sidecar~198.18.0.1~{name}.shop~shop.svc.cluster.local", _identity(name).uri)


def _identity(name: str) -> Identity:
    return Identity("cluster.local", "shop", name)


def _count_mints(ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many leaves the CA issued, per service account."""
    issued: Counter[str] = Counter()
    issue = ca.issue_workload

    def counted(spki: bytes, who: Identity, ttl: datetime.timedelta) -> Leaf:
        issued[who.service_account] += 1
        return issue(spki, who, ttl)

    monkeypatch.setattr(ca, "issue_workload", counted)
    return issued


async def _until(condition: Callable[[], bool], what: str) -> None:
    await wait_until(condition, WAIT, what)


async def test_wanted_certificates_hold_no_task_each(ca: CertificateAuthority) -> None:
    secrets = SecretManager(LocalCa(ca, asyncio.Semaphore(1)), ca.root_pem, SdsSettings())
    before = len(asyncio.all_tasks())
    served: set[ProxyKey] = set()
    proxies = [_proxy(f"sa-{i}") for i in range(40)]
    for proxy in proxies:
        assert secrets.want(proxy, served.add)
    await _until(lambda: len(served) == len(proxies), "every proxy served")
    assert len(asyncio.all_tasks()) == before, "a task was left per certificate"
    assert all(secrets.current(proxy) is not None for proxy in proxies)
    await secrets.close()


async def test_a_proxy_released_before_its_mint_ran_gets_no_key(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = _count_mints(ca, monkeypatch)
    slots = asyncio.Semaphore(1)
    secrets = SecretManager(LocalCa(ca, slots), ca.root_pem, SdsSettings())
    served: list[ProxyKey] = []
    async with slots:  # the CA is busy: both mints wait in the queue
        secrets.want(_proxy("gone"), served.append)
        secrets.want(_proxy("kept"), served.append)
        secrets.release(_proxy("gone"))
    await _until(lambda: served == [_proxy("kept")], "the kept proxy served")
    assert issued == {"kept": 1}, "a key was made for a proxy no longer wanted"
    assert secrets.current(_proxy("gone")) is None
    await secrets.close()


async def test_a_released_proxy_is_not_renewed_while_a_wanted_one_is(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = _count_mints(ca, monkeypatch)
    slots = asyncio.Semaphore(1)
    secrets = SecretManager(LocalCa(ca, slots), ca.root_pem, SHORT_TTL)
    served: Counter[ProxyKey] = Counter()
    for name in ("gone", "kept"):
        secrets.want(_proxy(name), lambda proxy: served.update([proxy]))
    # A renewal is due ~0.1 s after each mint, so a slow poll may see the first one already.
    await _until(lambda: served[_proxy("gone")] >= 1, "the first certificate")
    async with slots:  # no mint is in flight while the proxy is released
        secrets.release(_proxy("gone"))
        issued_when_released = issued["gone"]
    kept_when_released = served[_proxy("kept")]
    rotated_when_released = secrets.stats.rotated
    # The wanted proxy's renewals are the clock: each is a rotation the other would be due.
    await _until(
        lambda: served[_proxy("kept")] >= kept_when_released + 3,
        "three rotations of the wanted one",
    )
    assert issued["gone"] == issued_when_released, "a released proxy's certificate was renewed"
    assert secrets.stats.rotated >= rotated_when_released + 3
    await secrets.close()


async def _served_after_one_failure(
    ca: CertificateAuthority,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failure: Exception,
) -> SecretManager:
    """A proxy's certificate, once the CA's first leaf for it raised `failure`."""
    issue, failures = ca.issue_workload, [failure]

    def failing_once(spki: bytes, who: Identity, ttl: datetime.timedelta) -> Leaf:
        if failures:
            raise failures.pop()
        return issue(spki, who, ttl)

    monkeypatch.setattr(ca, "issue_workload", failing_once)
    secrets = SecretManager(LocalCa(ca, asyncio.Semaphore(1)), ca.root_pem, FAST_RETRY)
    served: list[ProxyKey] = []
    with caplog.at_level(logging.INFO, "pilot.security.sds"):
        secrets.want(_proxy("cart"), served.append)
        await _until(lambda: served == [_proxy("cart")], "a certificate after the failure")
    await secrets.close()
    return secrets


async def test_a_mint_that_raises_is_logged_with_its_traceback_and_tried_again(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failure = RuntimeError("a fault of pilot's")
    secrets = await _served_after_one_failure(ca, monkeypatch, caplog, failure)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "cannot get a certificate for proxy" in errors[0].getMessage()
    assert "a fault of pilot's" in errors[0].getMessage() and errors[0].exc_info is not None
    assert secrets.stats.ca_errors == 1 and secrets.stats.minted == 1


async def test_an_expired_ca_is_a_ca_error_warned_of_and_tried_again(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failure = CaExpired("the CA's certificate expired")
    secrets = await _served_after_one_failure(ca, monkeypatch, caplog, failure)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("pilot's CA: the CA's certificate expired" in line for line in warnings), warnings
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert secrets.stats.ca_errors == 1 and secrets.stats.minted == 1


async def test_a_ready_callback_that_raises_does_not_stop_renewal(
    ca: CertificateAuthority,
) -> None:
    secrets = SecretManager(LocalCa(ca, asyncio.Semaphore(1)), ca.root_pem, SHORT_TTL)
    calls: list[ProxyKey] = []
    loop = asyncio.get_running_loop()
    handled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: handled.append(context))

    def ready(proxy: ProxyKey) -> None:
        calls.append(proxy)
        if len(calls) == 1:
            raise RuntimeError("the pipeline refused")

    try:
        secrets.want(_proxy("cart"), ready)
        await _until(lambda: len(calls) >= 3, "renewals after a ready that raised")
    finally:
        loop.set_exception_handler(None)
    assert secrets.stats.rotated >= 2
    assert [str(c.get("exception")) for c in handled] == ["the pipeline refused"]
    await secrets.close()
