"""The gRPC services pilot serves on its plaintext port in file mode, as reflection lists them."""

from __future__ import annotations

ADS = "envoy.service.discovery.v3.AggregatedDiscoveryService"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
REFLECTION_V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
SERVICES = frozenset(
    {
        REFLECTION_V1,
        REFLECTION_V1ALPHA,
        "grpc.health.v1.Health",
        ADS,
        "envoy.service.cluster.v3.ClusterDiscoveryService",
        "envoy.service.endpoint.v3.EndpointDiscoveryService",
        "envoy.service.secret.v3.SecretDiscoveryService",
        "envoy.service.status.v3.ClientStatusDiscoveryService",
        "istio.v1.auth.IstioCertificateService",
    }
)
