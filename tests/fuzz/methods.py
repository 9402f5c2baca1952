"""Every gRPC method pilot serves: its path, its shape, and the message it takes.

Shapes: `unary` (one request, one answer), `server_stream` (one request, answers
until cancelled: Health/Watch), `bidi` (requests and answers both ways). A
bidi method `ends_on_half_close` when the server finishes the call once the
client stops sending (CSDS and reflection do; xDS streams keep pushing).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from pilot._gen.istio.v1.auth import ca_pb2
from pilot.server import reflection_v1
from tests.support.xds_client import (
    ADS_SERVICE,
    CDS_SERVICE,
    CLUSTER,
    CSDS_SERVICE,
    EDS_SERVICE,
    ENDPOINT,
    SDS_SERVICE,
    SECRET,
)

CA_SERVICE = "istio.v1.auth.IstioCertificateService"
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"


class Shape(Enum):
    UNARY = "unary"
    SERVER_STREAM = "server_stream"
    BIDI = "bidi"


@dataclass(frozen=True)
class Method:
    """One served method."""

    service: str
    name: str
    shape: Shape
    request: Any  # the request message class
    response: Any  # the response message class
    xds_types: tuple[str, ...] = ()  # xDS: the types it may carry (ADS: all)
    delta: bool = False

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def short(self) -> str:
        return f"{self.service.rsplit('.', 1)[-1]}/{self.name}"

    @property
    def xds_stream(self) -> bool:
        return bool(self.xds_types) and self.shape is Shape.BIDI

    @property
    def ends_on_half_close(self) -> bool:
        return self.shape is Shape.BIDI and not self.xds_types

    def __str__(self) -> str:
        return self.short


_SOTW = (discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse)
_DELTA = (discovery_pb2.DeltaDiscoveryRequest, discovery_pb2.DeltaDiscoveryResponse)
_CSDS = (csds_pb2.ClientStatusRequest, csds_pb2.ClientStatusResponse)
_CA = (ca_pb2.IstioCertificateRequest, ca_pb2.IstioCertificateResponse)
_HEALTH = (health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse)
_REFLECTION = (reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse)
_REFLECTION_V1 = (reflection_v1.ServerReflectionRequest, reflection_v1.ServerReflectionResponse)
_ALL = (CLUSTER, ENDPOINT, SECRET)


def _xds(service: str, name: str, types: tuple[str, ...], delta: bool = False) -> Method:
    return Method(service, name, Shape.BIDI, *(_DELTA if delta else _SOTW), types, delta)


def _fetch(service: str, name: str, type_url: str) -> Method:
    return Method(service, name, Shape.UNARY, *_SOTW, (type_url,))


ADS_SOTW = _xds(ADS_SERVICE, "StreamAggregatedResources", _ALL)
ADS_DELTA = _xds(ADS_SERVICE, "DeltaAggregatedResources", _ALL, delta=True)
CDS_SOTW = _xds(CDS_SERVICE, "StreamClusters", (CLUSTER,))
CDS_DELTA = _xds(CDS_SERVICE, "DeltaClusters", (CLUSTER,), delta=True)
CDS_FETCH = _fetch(CDS_SERVICE, "FetchClusters", CLUSTER)
EDS_SOTW = _xds(EDS_SERVICE, "StreamEndpoints", (ENDPOINT,))
EDS_DELTA = _xds(EDS_SERVICE, "DeltaEndpoints", (ENDPOINT,), delta=True)
EDS_FETCH = _fetch(EDS_SERVICE, "FetchEndpoints", ENDPOINT)
SDS_SOTW = _xds(SDS_SERVICE, "StreamSecrets", (SECRET,))
SDS_DELTA = _xds(SDS_SERVICE, "DeltaSecrets", (SECRET,), delta=True)
CSDS_FETCH = Method(CSDS_SERVICE, "FetchClientStatus", Shape.UNARY, *_CSDS)
CSDS_STREAM = Method(CSDS_SERVICE, "StreamClientStatus", Shape.BIDI, *_CSDS)
CA_CREATE = Method(CA_SERVICE, "CreateCertificate", Shape.UNARY, *_CA)
HEALTH_CHECK = Method(HEALTH_SERVICE, "Check", Shape.UNARY, *_HEALTH)
HEALTH_WATCH = Method(HEALTH_SERVICE, "Watch", Shape.SERVER_STREAM, *_HEALTH)
REFLECTION = Method(REFLECTION_SERVICE, "ServerReflectionInfo", Shape.BIDI, *_REFLECTION)
REFLECTION_V1 = Method(
    reflection_v1.SERVICE_NAME, "ServerReflectionInfo", Shape.BIDI, *_REFLECTION_V1
)
REFLECTIONS = (REFLECTION, REFLECTION_V1)

XDS_SERVICE_NAMES = (ADS_SERVICE, CDS_SERVICE, EDS_SERVICE, SDS_SERVICE)
XDS_STREAMS = (ADS_SOTW, ADS_DELTA, CDS_SOTW, CDS_DELTA, EDS_SOTW, EDS_DELTA, SDS_SOTW, SDS_DELTA)
FETCHES = (CDS_FETCH, EDS_FETCH)
ALL = (
    *XDS_STREAMS,
    *FETCHES,
    CSDS_FETCH,
    CSDS_STREAM,
    CA_CREATE,
    HEALTH_CHECK,
    HEALTH_WATCH,
    *REFLECTIONS,
)
