"""What it takes to watch a cluster, without the client library: settings and errors.

The command line and the settings read these without loading
kubernetes-asyncio, so that commands that never talk to a cluster (`pilot
agent`, `pilot proxy-status`) do not pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class KubernetesUnavailable(RuntimeError):
    """No usable Kubernetes configuration, or the API server cannot be reached."""


class EndpointsApi(StrEnum):
    """Which API carries endpoints: EndpointSlices (default) or legacy Endpoints."""

    ENDPOINTSLICES = "endpointslices"
    ENDPOINTS = "endpoints"


@dataclass(frozen=True, slots=True)
class InformerSettings:
    """Timeouts and paging; the defaults suit a real cluster."""

    watch_timeout: float = 300.0
    connect_timeout: float = 10.0
    page_size: int = 500
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    # PILOT_MAX_WATCH_EVENT_BYTES: one watch event (a list page: four times that). etcd
    # keeps objects of at most 1.5 MiB; as JSON, in an event, one is at most about twice that.
    max_event_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """`--kubeconfig`, `--namespaces`, `--endpoints-api`, and informer tuning."""

    kubeconfig: Path | None = None
    namespaces: tuple[str, ...] = ()
    endpoints_api: EndpointsApi = EndpointsApi.ENDPOINTSLICES
    informer: InformerSettings = field(default_factory=InformerSettings)
