"""RequestAuthentication: which JWTs each sidecar's inbound side verifies, read strictly.

Istio's `security.istio.io/v1` (and `v1beta1`) kind `RequestAuthentication`:
`spec.selector.matchLabels` and `spec.jwtRules`, each with `issuer` (required),
`audiences`, `jwksUri` or `jwks` (inline, checked: `pilot.registry.jwks`), where
the token is (`fromHeaders` name and prefix, `fromParams`, `fromCookies`; none:
Envoy's default, `Authorization: Bearer` and the `access_token` parameter), what
reaches the app (`outputPayloadToHeader`, `outputClaimToHeaders`,
`forwardOriginalToken`), `timeout` (of the JWKS fetch) and `spaceDelimitedClaims`
(claims whose space-separated words match one by one, beside Istio's `scope` and
`permission`). Every field is checked
against Istio's API (an unknown one is an error), every list and string against a
bound; control characters (NUL, newlines) are refused everywhere.

A rule with neither `jwks` nor `jwksUri` is refused: istiod would fetch the
issuer's OpenID discovery document itself, and pilot connects nowhere on an
object's say (Envoy fetches `jwksUri`, through a cluster pilot adds for it).

Scopes, as AuthorizationPolicy's: in the root namespace without a selector, every
sidecar of the mesh; with one, the workloads of every namespace it selects;
elsewhere its namespace's sidecars, or those it selects. Every one that applies
counts (their rules are merged). A sidecar whose Pod cannot be told gets only the
namespace- and mesh-wide ones: a selector's issuers give no principal there, so
an ALLOW on them matches nothing (fails closed).

`targetRef`/`targetRefs` name a Gateway, Service or waypoint, none of which is a
sidecar: such an object applies to no sidecar (as in Istio), said once in a
warning; its issuers give no principal anywhere.

An object that is not valid is one warning and counted
(`pilot_config_rejected_total{kind="RequestAuthentication"}`); its last good
version keeps applying. Dropping one never opens anything: without it a token of
its issuer yields no principal, so `requestPrincipals` rules naming it match
nothing in ALLOW policies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pilot.registry.istio_config import ConfigError, ConfigKey, Reader, key_of, metadata
from pilot.registry.jwks import JwksError, JwksUri, check_jwks, parse_jwks_uri
from pilot.registry.peer_authentication import Labels
from pilot.registry.scoped_store import Scoped, ScopedStore, read_selector

KIND = "RequestAuthentication"
GROUP = "security.istio.io"
VERSIONS = ("v1", "v1beta1")
API_VERSIONS = frozenset(f"{GROUP}/{v}" for v in VERSIONS)
MAX_JWT_RULES = 64  # jwtRules of one object
MAX_ENTRIES = 64  # fromHeaders, fromParams, fromCookies, outputClaimToHeaders of a rule
MAX_AUDIENCES = 1024
MAX_VALUE = 1024  # characters of an issuer, an audience, a prefix, a claim
DEFAULT_TIMEOUT = 5.0  # seconds: Istio's JWKS fetch timeout
MAX_TIMEOUT = 3600.0
_SPEC_FIELDS = frozenset({"selector", "targetRef", "targetRefs", "jwtRules"})
_RULE_FIELDS = frozenset(
    {
        "issuer",
        "audiences",
        "jwksUri",
        "jwks",
        "fromHeaders",
        "fromParams",
        "fromCookies",
        "outputPayloadToHeader",
        "outputClaimToHeaders",
        "forwardOriginalToken",
        "timeout",
        "spaceDelimitedClaims",
    }
)
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")
# Headers a claim must never write: what the app (or Envoy) trusts as pilot's own say.
_RESERVED_HEADERS = frozenset({"host", "x-forwarded-client-cert", "content-length"})
_RESERVED_PREFIXES = ("x-envoy-", ":")


@dataclass(frozen=True, slots=True)
class JwtRule:
    """One `jwtRules` entry, checked."""

    issuer: str
    audiences: tuple[str, ...] = ()
    jwks_uri: JwksUri | None = None
    jwks: str = ""  # inline JWKS text (checked)
    from_headers: tuple[tuple[str, str], ...] = ()  # (name, prefix)
    from_params: tuple[str, ...] = ()
    from_cookies: tuple[str, ...] = ()
    output_payload_to_header: str = ""
    output_claim_to_headers: tuple[tuple[str, str], ...] = ()  # (header, claim)
    forward_original_token: bool = False
    timeout: float = DEFAULT_TIMEOUT
    space_delimited_claims: tuple[str, ...] = ()  # beside Istio's own, scope and permission


@dataclass(frozen=True, slots=True)
class RequestAuthentication(Scoped):
    """What pilot keeps of one RequestAuthentication."""

    key: ConfigKey
    selector: Labels = ()  # matchLabels; () applies to the whole namespace
    rules: tuple[JwtRule, ...] = ()
    # It names targetRef(s): it applies to no sidecar (the warning says so).
    targeted: bool = False
    created: str = field(default="", compare=False)


def _header_name(reader: Reader, raw: Any, where: str, output: bool = False) -> str:
    name = reader.string(raw, where, 256)
    if not _HEADER_NAME.fullmatch(name):
        raise reader.fail(where, f"{name[:64]!r} is not an HTTP header name")
    lower = name.lower()
    if output and (lower in _RESERVED_HEADERS or lower.startswith(_RESERVED_PREFIXES)):
        raise reader.fail(where, f"{name!r} is a header the app trusts as Envoy's own")
    return lower


def _strings(reader: Reader, raw: Any, where: str, limit: int = MAX_ENTRIES) -> tuple[str, ...]:
    entries = reader.items(raw, where, limit)
    found = []
    for i, entry in enumerate(entries):
        value = reader.string(entry, f"{where}[{i}]", MAX_VALUE)
        if not value:
            raise reader.fail(f"{where}[{i}]", "is empty")
        found.append(value)
    return tuple(found)


def _from_headers(reader: Reader, raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    found = []
    for i, entry in enumerate(reader.items(raw, where, MAX_ENTRIES)):
        here = f"{where}[{i}]"
        body = reader.mapping(entry, here, frozenset({"name", "prefix"}))
        name = _header_name(reader, body.get("name"), f"{here}.name")
        found.append((name, reader.optional_string(body.get("prefix"), f"{here}.prefix", 256)))
    return tuple(found)


def _claim_headers(reader: Reader, raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    found = []
    for i, entry in enumerate(reader.items(raw, where, MAX_ENTRIES)):
        here = f"{where}[{i}]"
        body = reader.mapping(entry, here, frozenset({"header", "claim"}))
        header = _header_name(reader, body.get("header"), f"{here}.header", output=True)
        claim = reader.string(body.get("claim"), f"{here}.claim", 256)
        if not claim:
            raise reader.fail(f"{here}.claim", "is empty")
        found.append((header, claim))
    return tuple(found)


def _keys(reader: Reader, body: Mapping[str, Any], where: str) -> tuple[JwksUri | None, str]:
    raw_uri, raw_jwks = body.get("jwksUri"), body.get("jwks")
    if raw_uri is not None and raw_jwks is not None:
        raise reader.fail(where, "has both jwksUri and jwks (one of them)")
    if raw_uri is None and raw_jwks is None:
        raise reader.fail(
            where, "has neither jwksUri nor jwks (pilot fetches no OpenID discovery document)"
        )
    try:
        if raw_uri is not None:
            return parse_jwks_uri(reader.string(raw_uri, f"{where}.jwksUri", 2048)), ""
        jwks = reader.string(raw_jwks, f"{where}.jwks", 65_536)
        check_jwks(jwks)
        return None, jwks
    except JwksError as error:
        name = "jwksUri" if raw_uri is not None else "jwks"
        raise reader.fail(f"{where}.{name}", str(error)) from None


def _rule(reader: Reader, raw: Any, where: str) -> JwtRule:
    body = reader.mapping(raw, where, _RULE_FIELDS)
    issuer = reader.string(body.get("issuer"), f"{where}.issuer", MAX_VALUE)
    if not issuer:
        raise reader.fail(f"{where}.issuer", "is empty")
    jwks_uri, jwks = _keys(reader, body, where)
    payload = body.get("outputPayloadToHeader")
    here = f"{where}.outputPayloadToHeader"
    payload_header = "" if payload is None else _header_name(reader, payload, here, output=True)
    timeout = reader.duration(body.get("timeout"), f"{where}.timeout", 0.001)
    if timeout is not None and timeout > MAX_TIMEOUT:
        raise reader.fail(f"{where}.timeout", f"is longer than {MAX_TIMEOUT:g}s")
    return JwtRule(
        issuer=issuer,
        audiences=_strings(reader, body.get("audiences"), f"{where}.audiences", MAX_AUDIENCES),
        jwks_uri=jwks_uri,
        jwks=jwks,
        from_headers=_from_headers(reader, body.get("fromHeaders"), f"{where}.fromHeaders"),
        from_params=_strings(reader, body.get("fromParams"), f"{where}.fromParams"),
        from_cookies=_strings(reader, body.get("fromCookies"), f"{where}.fromCookies"),
        output_payload_to_header=payload_header,
        output_claim_to_headers=_claim_headers(
            reader, body.get("outputClaimToHeaders"), f"{where}.outputClaimToHeaders"
        ),
        forward_original_token=reader.boolean(
            body.get("forwardOriginalToken"), f"{where}.forwardOriginalToken"
        ),
        timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
        space_delimited_claims=_strings(
            reader, body.get("spaceDelimitedClaims"), f"{where}.spaceDelimitedClaims"
        ),
    )


def parse_request_authentication(obj: Mapping[str, Any]) -> RequestAuthentication:
    """One RequestAuthentication (a dict, as the API server or a file gives it).

    Raises ConfigError (one line naming the object and the field) on anything that is not
    Istio's API or that Envoy must not get.
    """
    reader = Reader(key_of(KIND, obj))
    version = obj.get("apiVersion")
    if version is not None and version not in API_VERSIONS:
        raise reader.fail("apiVersion", f"is not one of {', '.join(sorted(API_VERSIONS))}")
    namespace, created = metadata(reader, obj)
    key = ConfigKey(KIND, namespace, reader.key.name)
    reader.key = key
    spec = reader.mapping(obj.get("spec"), "spec", _SPEC_FIELDS)
    if spec.get("targetRef") is not None:
        reader.mapping(spec["targetRef"], "spec.targetRef", _TARGET_FIELDS)
    for i, target in enumerate(reader.items(spec.get("targetRefs"), "spec.targetRefs", 16)):
        reader.mapping(target, f"spec.targetRefs[{i}]", _TARGET_FIELDS)
    entries = reader.items(spec.get("jwtRules"), "spec.jwtRules", MAX_JWT_RULES)
    rules = tuple(_rule(reader, entry, f"spec.jwtRules[{i}]") for i, entry in enumerate(entries))
    targeted = spec.get("targetRef") is not None or spec.get("targetRefs") is not None
    return RequestAuthentication(
        key, read_selector(reader, spec.get("selector")), rules, targeted, created
    )


_TARGET_FIELDS = frozenset({"group", "kind", "name", "namespace"})


def refusal_of(obj: Mapping[str, Any], error: BaseException) -> str:
    """The one line saying why an object is refused."""
    if isinstance(error, ConfigError):
        return str(error)
    return f"{key_of(KIND, obj)}: malformed ({type(error).__name__})"


@dataclass(frozen=True, slots=True)
class AppliedAuthentications:
    """The RequestAuthentications that apply to one workload (sorted by key)."""

    objects: tuple[RequestAuthentication, ...] = ()

    def __bool__(self) -> bool:
        return any(o.rules for o in self.objects)

    @property
    def rules(self) -> tuple[JwtRule, ...]:
        return tuple(rule for o in self.objects for rule in o.rules)

    @property
    def issuers(self) -> tuple[str, ...]:
        """The issuers a request principal of this workload can come from (sorted)."""
        return tuple(sorted({rule.issuer for rule in self.rules}))

    @property
    def jwks_uris(self) -> tuple[JwksUri, ...]:
        """The distinct JWKS URIs (one cluster each; sorted)."""
        return tuple(sorted({r.jwks_uri for r in self.rules if r.jwks_uri is not None}))


NO_AUTHENTICATIONS = AppliedAuthentications()


class RequestAuthentications(ScopedStore[RequestAuthentication]):
    """Every RequestAuthentication known, and those that apply to each workload."""

    def applied(
        self, namespace: str, workloads: Sequence[Mapping[str, str]]
    ) -> AppliedAuthentications:
        """What applies to a proxy of `namespace` whose Pod has one of these label sets.

        Exactly one label set: those without a selector and those that select it. None or
        several (its Pod is not known, or not one): only those without a selector.
        """
        certain = len(workloads) == 1
        found = [
            ra
            for ra in self.in_scope(namespace)
            if not ra.targeted and (not ra.selector or (certain and ra.selects(workloads[0])))
        ]
        return AppliedAuthentications(tuple(sorted(found, key=lambda ra: ra.key)))


__all__ = [
    "KIND",
    "NO_AUTHENTICATIONS",
    "AppliedAuthentications",
    "JwtRule",
    "RequestAuthentication",
    "RequestAuthentications",
    "parse_request_authentication",
    "refusal_of",
]
