"""RequestAuthentication as Envoy's `jwt_authn` filter and its JWKS clusters (pure).

On every inbound HTTP chain of a workload some RequestAuthentication applies to,
`envoy.filters.http.jwt_authn` runs before the RBAC filters, as istiod puts it:

- one provider per `jwtRules` entry, named as istiod names them (`origins-I`, in
  the order of the objects by namespace and name, then of their rules): its issuer
  and audiences, where the token is (`from_headers`, `from_params`,
  `from_cookies`; none given: Envoy's default, `Authorization: Bearer` and the
  `access_token` parameter, which are Istio's), whether it reaches the app
  (`forward`, false unless `forwardOriginalToken`: Envoy removes it), the payload
  and claims as headers (`forward_payload_header`, `claim_to_headers`), and its
  payload in the filter's dynamic metadata under the issuer's name
  (`payload_in_metadata`), where the RBAC filters read the request principal
  (`iss/sub`) and `request.auth.*` (`pilot.builders.rbac`);
- one requirement for every path, istiod's: with one provider, its token or none
  (`requires_any` of it and `allow_missing`); with several, any one provider's token,
  or every provider's token valid where it is given (`requires_all` of each one's
  `requires_any` with `allow_missing`), so that a token is never ignored because
  another was good. A request with a token that fails (bad signature, expired, keys
  not fetched) is refused with 401, a wrong audience with 403; one without a token
  passes, with no request principal, and AuthorizationPolicy decides;
- the claims `scope` and `permission` (and `spaceDelimitedClaims`) split at spaces
  in the metadata (`normalize_payload_in_metadata`), as Istio's, so a `when` on
  `request.auth.claims[scope]` matches one word of it; keys are cached five minutes.

Keys: an inline `jwks` is `local_jwks`; a `jwksUri` is `remote_jwks`, fetched by
Envoy through a cluster pilot adds for the URI's scheme, host and port
(`jwks_cluster`): TLS for https with the host as SNI, the server's certificate
checked against the system's roots (`SYSTEM_ROOTS`) and the host. A URI that does not answer
leaves the provider without keys, so every token of it is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2, http_uri_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import duration_pb2, empty_pb2

from pilot.builders.cds import CONNECT_TIMEOUT_SECONDS
from pilot.builders.listeners import socket_address, typed
from pilot.registry.jwks import JwksUri
from pilot.registry.request_authentication import AppliedAuthentications, JwtRule

JWT_AUTHN = "envoy.filters.http.jwt_authn"
SPACE_DELIMITED_CLAIMS = ("permission", "scope")  # always, as Istio's
JWKS_CACHE_SECONDS = 300  # Istio's
# The roots an https jwksUri's certificate is checked against: the system bundle where
# Istio's proxy image (Ubuntu) keeps it. Envoy's own `system_root_certs` does not count
# as a trusted CA for its SAN check, which refuses a name check without one.
SYSTEM_ROOTS = "/etc/ssl/certs/ca-certificates.crt"


def provider_name(index: int) -> str:
    """istiod's name of the provider of the `index`th rule."""
    return f"origins-{index}"


def _duration(seconds: float) -> duration_pb2.Duration:
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def _keys(rule: JwtRule, provider: jwt_pb2.JwtProvider) -> None:
    if rule.jwks_uri is None:
        provider.local_jwks.inline_string = rule.jwks
        return
    provider.remote_jwks.http_uri.CopyFrom(
        http_uri_pb2.HttpUri(
            uri=rule.jwks_uri.uri, cluster=rule.jwks_uri.cluster, timeout=_duration(rule.timeout)
        )
    )
    provider.remote_jwks.cache_duration.seconds = JWKS_CACHE_SECONDS


def _provider(rule: JwtRule) -> jwt_pb2.JwtProvider:
    provider = jwt_pb2.JwtProvider(
        issuer=rule.issuer,
        audiences=list(rule.audiences),
        forward=rule.forward_original_token,
        from_headers=[jwt_pb2.JwtHeader(name=n, value_prefix=p) for n, p in rule.from_headers],
        from_params=list(rule.from_params),
        from_cookies=list(rule.from_cookies),
        forward_payload_header=rule.output_payload_to_header,
        payload_in_metadata=rule.issuer,
        normalize_payload_in_metadata=jwt_pb2.JwtProvider.NormalizePayload(
            space_delimited_claims=sorted({*rule.space_delimited_claims, *SPACE_DELIMITED_CLAIMS})
        ),
        claim_to_headers=[
            jwt_pb2.JwtClaimToHeader(header_name=h, claim_name=c)
            for h, c in rule.output_claim_to_headers
        ],
    )
    _keys(rule, provider)
    return provider


def _any(options: list[jwt_pb2.JwtRequirement]) -> jwt_pb2.JwtRequirement:
    return jwt_pb2.JwtRequirement(requires_any=jwt_pb2.JwtRequirementOrList(requirements=options))


def _provider_or_none(index: int) -> jwt_pb2.JwtRequirement:
    """The provider's token valid, or none where it looks."""
    return _any(
        [
            jwt_pb2.JwtRequirement(provider_name=provider_name(index)),
            jwt_pb2.JwtRequirement(allow_missing=empty_pb2.Empty()),
        ]
    )


def _requirement(count: int) -> jwt_pb2.JwtRequirement:
    """istiod's: one provider, its token or none; several, any one's token (they may share
    a place), or each one's token valid or missing (a failing one is refused)."""
    if count == 1:
        return _provider_or_none(0)
    each = jwt_pb2.JwtRequirement(
        requires_all=jwt_pb2.JwtRequirementAndList(
            requirements=[_provider_or_none(i) for i in range(count)]
        )
    )
    return _any(
        [*(jwt_pb2.JwtRequirement(provider_name=provider_name(i)) for i in range(count)), each]
    )


def jwt_authn_config(applied: AppliedAuthentications) -> jwt_pb2.JwtAuthentication:
    rules: Sequence[JwtRule] = applied.rules
    return jwt_pb2.JwtAuthentication(
        providers={provider_name(i): _provider(rule) for i, rule in enumerate(rules)},
        rules=[
            jwt_pb2.RequirementRule(
                match=route_components_pb2.RouteMatch(prefix="/"),
                requires=_requirement(len(rules)),
            )
        ],
        bypass_cors_preflight=True,
    )


def jwt_authn_filters(applied: AppliedAuthentications) -> list[hcm_pb2.HttpFilter]:
    """The filter for an inbound HTTP chain (none when no rule applies)."""
    if not applied:
        return []
    return [hcm_pb2.HttpFilter(name=JWT_AUTHN, typed_config=typed(jwt_authn_config(applied)))]


def _tls(uri: JwksUri) -> base_pb2.TransportSocket:
    """TLS to the JWKS server: SNI the host, its certificate checked against the system's
    roots and naming the host (Envoy checks no name unless told)."""
    san_type = (
        common_pb2.SubjectAltNameMatcher.IP_ADDRESS
        if uri.is_ip
        else common_pb2.SubjectAltNameMatcher.DNS
    )
    validation = common_pb2.CertificateValidationContext(
        trusted_ca=base_pb2.DataSource(filename=SYSTEM_ROOTS),
        match_typed_subject_alt_names=[
            common_pb2.SubjectAltNameMatcher(
                san_type=san_type, matcher=string_pb2.StringMatcher(exact=uri.host)
            )
        ],
    )
    context = tls_pb2.UpstreamTlsContext(
        sni="" if uri.is_ip else uri.host,
        common_tls_context=tls_pb2.CommonTlsContext(validation_context=validation),
    )
    return base_pb2.TransportSocket(name="envoy.transport_sockets.tls", typed_config=typed(context))


def jwks_cluster(uri: JwksUri) -> cluster_pb2.Cluster:
    """The cluster Envoy fetches `uri`'s keys through: the host as written (resolved by
    DNS unless an IP), on the URI's port."""
    endpoint = endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(address=socket_address(uri.host, uri.port))
    )
    cluster = cluster_pb2.Cluster(
        name=uri.cluster,
        type=cluster_pb2.Cluster.STATIC if uri.is_ip else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=duration_pb2.Duration(seconds=CONNECT_TIMEOUT_SECONDS),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=uri.cluster,
            endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[endpoint])],
        ),
    )
    if not uri.is_ip:
        cluster.dns_lookup_family = cluster_pb2.Cluster.V4_PREFERRED
    if uri.tls:
        cluster.transport_socket.CopyFrom(_tls(uri))
    return cluster
