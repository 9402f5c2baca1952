"""Run a real pilot `Discovery` in the test's event loop, on ephemeral loopback ports.

`responses_written` checks pilot's count of the responses it sent: pilot counts a
response once its write completes, which may be after the client has read it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pilot.app import Core, Discovery, start_discovery
from pilot.kube.config import EndpointsApi, InformerSettings, KubernetesSettings
from pilot.push.debounce import DebounceSettings
from pilot.security.ca import CaSettings
from pilot.security.settings import SecuritySettings
from pilot.security.xds_auth import XdsAuth
from pilot.settings import Settings
from pilot.stats import XdsStats
from tests.support.envoy_process import wait_until
from tests.support.mesh import write_mesh

FAST_DEBOUNCE = DebounceSettings(after=0.02, max_delay=1.0, eds_debounce=True)
# Real clusters get minutes-long watches and seconds of backoff; tests want faults to heal fast.
FAST_INFORMER = InformerSettings(watch_timeout=30.0, backoff_initial=0.05, backoff_max=0.5)


@dataclass
class RunningPilot:
    """A started pilot and the file that feeds it."""

    discovery: Discovery
    config: Path | None = None

    @property
    def grpc_port(self) -> int:
        return self.discovery.grpc.port

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_port(self) -> int:
        return self.discovery.http.port

    def write(self, objects: Iterable[dict[str, Any]]) -> None:
        """Replace the registry file; pilot notices and pushes."""
        assert self.config is not None, "this pilot watches Kubernetes, not a file"
        write_mesh(self.config, objects)


@asynccontextmanager
async def _running(settings: Settings, config: Path | None) -> AsyncIterator[RunningPilot]:
    discovery = await start_discovery(Core(settings))  # a failed start stops what it started
    try:
        yield RunningPilot(discovery, config)
    finally:
        await discovery.stop()


def _security(state_dir: Path, **overrides: Any) -> SecuritySettings:
    """Security settings whose self-signed root lives in the test's own directory.

    xDS streams are trusted by node metadata unless a test asks for tokens.
    """
    fields: dict[str, Any] = {"ca": CaSettings(state_dir=state_dir), "xds_auth": XdsAuth.NONE}
    return SecuritySettings(**(fields | overrides))


def _settings(state_dir: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "grpc_addr": "127.0.0.1:0",
        "http_addr": "127.0.0.1:0",
        "debounce": FAST_DEBOUNCE,
        "file_poll_interval": 0.02,
        "drain_duration": 0.5,
        # A full collection per started pilot costs every test ~0.2 s; the CLI keeps it on.
        "freeze_heap": False,
    }
    overrides.setdefault("security", _security(state_dir))
    return Settings(**(base | overrides))


@asynccontextmanager
async def running_kube_pilot(
    kubeconfig: Path,
    *,
    endpoints_api: EndpointsApi = EndpointsApi.ENDPOINTSLICES,
    namespaces: tuple[str, ...] = (),
    debounce: DebounceSettings = FAST_DEBOUNCE,
    informer: InformerSettings = FAST_INFORMER,
    xds_auth: XdsAuth = XdsAuth.NONE,
    security: dict[str, Any] | None = None,
    plaintext_secrets: bool = True,
    **overrides: Any,
) -> AsyncIterator[RunningPilot]:
    """A pilot on a Kubernetes source, reaching the API server through `kubeconfig`.

    xDS streams are trusted by node metadata unless `xds_auth` says otherwise;
    `security` overrides other SecuritySettings fields (e.g. `sds`, `remote_ca`),
    other keywords Settings fields (e.g. `grpc_tls_addr`).
    Tests talk plaintext gRPC, so the CA and SDS answer on the plaintext port
    too (`--plaintext-secrets`); tests/security/test_ports.py proves the
    default, which keeps them on the TLS port.
    """
    kubernetes = KubernetesSettings(kubeconfig, namespaces, endpoints_api, informer)
    settings = _settings(
        kubeconfig.parent / "ca",
        kubernetes=kubernetes,
        debounce=debounce,
        security=_security(kubeconfig.parent / "ca", xds_auth=xds_auth, **(security or {})),
        plaintext_secrets=plaintext_secrets,
        **overrides,
    )
    async with _running(settings, None) as pilot:
        yield pilot


@asynccontextmanager
async def running_pilot(
    tmp_path: Path,
    objects: Iterable[dict[str, Any]],
    debounce: DebounceSettings = FAST_DEBOUNCE,
    security: dict[str, Any] | None = None,
    kubeconfig: Path | None = None,
    *,
    clusters: Mapping[str, Iterable[dict[str, Any]]] | None = None,
    **overrides: Any,
) -> AsyncIterator[RunningPilot]:
    """A pilot on the file source, the file written from `objects` first (and a
    document per other cluster in `clusters`).

    `security` overrides SecuritySettings fields; `kubeconfig` gives it a
    Kubernetes API for TokenReview; other keywords override Settings fields.
    """
    config = tmp_path / "mesh.yaml"
    write_mesh(config, objects, clusters)
    settings = _settings(
        tmp_path / "ca",
        config=config,
        debounce=debounce,
        security=_security(tmp_path / "ca", **(security or {})),
        kubernetes=KubernetesSettings(kubeconfig=kubeconfig),
        **overrides,
    )
    async with _running(settings, config) as pilot:
        yield pilot


WRITES_TIMEOUT = 10.0


async def responses_written(stats: XdsStats, expected: Mapping[str, int]) -> None:
    """pilot has written exactly `expected` (type URL -> responses) since its stats were reset."""
    total = sum(expected.values())

    def written() -> bool:
        return sum(stats.responses.values()) >= total

    await wait_until(written, WRITES_TIMEOUT, "pilot's writes")
    assert dict(stats.responses) == dict(expected)
