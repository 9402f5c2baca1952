"""The registry file format, Istio-style durations, and the debounce knobs."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from pilot.durations import parse_duration
from pilot.push.debounce import Debouncer, DebounceSettings
from pilot.registry.index import IndexChange
from pilot.registry.model import ServiceKey
from pilot.settings import SettingsError, debounce_from_env
from pilot.sources.file import RegistryFileError, parse_registry

KUBECTL_LIST = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec: {ports: [{name: http, port: 80}]}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web, namespace: shop}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints: [{addresses: [10.0.0.1]}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: web, namespace: shop}
subsets: []
"""


def test_kubectl_list_and_multiple_documents() -> None:
    state = parse_registry(KUBECTL_LIST, "mesh.yaml")
    assert [str(s.key) for s in state.services] == ["shop/web"]
    assert sorted(s.key.kind for s in state.endpoint_sets) == ["EndpointSlice", "Endpoints"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [", "mesh.yaml: not valid YAML"),
        ("- a\n- b\n", "mesh.yaml: document 1 is not a mapping"),
        ("metadata: {name: x}\n", "document 1: has no kind"),
        (
            "kind: List\nitems: [{kind: EndpointSlice, metadata: {name: s}}]",
            "document 1 item 0: EndpointSlice default/s: label kubernetes.io/service-name"
            " is missing",
        ),
    ],
)
def test_broken_files_say_where_and_what(text: str, message: str) -> None:
    with pytest.raises(RegistryFileError, match=re.escape(message)):
        parse_registry(text, "mesh.yaml")


def test_durations_like_istio() -> None:
    assert parse_duration("100ms") == pytest.approx(0.1)
    assert parse_duration("1m30s") == 90
    assert parse_duration("24h") == 86400
    assert parse_duration("0") == 0
    for bad in ("", "10", "5x", "1h-2m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_debounce_settings_from_environment() -> None:
    settings = debounce_from_env(
        {
            "PILOT_DEBOUNCE_AFTER": "250ms",
            "PILOT_DEBOUNCE_MAX": "5s",
            "PILOT_ENABLE_EDS_DEBOUNCE": "false",
        }
    )
    assert settings == DebounceSettings(after=0.25, max_delay=5.0, eds_debounce=False)
    assert debounce_from_env({}) == DebounceSettings()
    with pytest.raises(SettingsError, match="PILOT_DEBOUNCE_AFTER"):
        debounce_from_env({"PILOT_DEBOUNCE_AFTER": "soon"})


def _endpoints(name: str) -> IndexChange:
    return IndexChange(endpoints=frozenset({ServiceKey("ns", name)}))


async def _run_debouncer(
    settings: DebounceSettings, feed: list[IndexChange]
) -> list[tuple[IndexChange, float]]:
    flushed: list[tuple[IndexChange, float]] = []
    done = asyncio.Event()

    def flush(change: IndexChange, opened: float) -> None:
        flushed.append((change, time.monotonic() - opened))
        done.set()

    debouncer = Debouncer(flush, settings)
    task = asyncio.create_task(debouncer.run())
    try:
        for change in feed:
            debouncer.submit(change)
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
    return flushed


async def test_a_burst_inside_the_window_is_one_merged_push() -> None:
    burst = [_endpoints(f"svc-{i % 10}") for i in range(1000)]
    flushed = await _run_debouncer(DebounceSettings(after=0.05, max_delay=5), burst)
    assert len(flushed) == 1
    assert len(flushed[0][0].endpoints) == 10


async def test_endpoint_changes_skip_the_wait_when_eds_debounce_is_off() -> None:
    flushed = await _run_debouncer(
        DebounceSettings(after=30, max_delay=60, eds_debounce=False), [_endpoints("a")]
    )
    assert flushed[0][1] < 5, "flushed without waiting for the 30s quiet period"


async def test_a_window_never_stays_open_longer_than_max() -> None:
    full = IndexChange(full=frozenset({ServiceKey("ns", "a")}))
    flushed = await _run_debouncer(
        DebounceSettings(after=30, max_delay=0.1, eds_debounce=False), [full]
    )
    assert flushed[0][1] < 5, "flushed at PILOT_DEBOUNCE_MAX, not after the 30s quiet period"
