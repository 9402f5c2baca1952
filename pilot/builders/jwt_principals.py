"""Request principals and `request.auth.*` as RBAC principals on the JWT payload (pure).

The `jwt_authn` filter (`pilot.builders.jwt_authn`) puts a verified token's
payload in its dynamic metadata under the issuer's name; upstream Envoy has no
`istio_authn` filter to join `iss/sub`, so each value is matched there:

- `requestPrincipals` and `request.auth.principal` (`iss/sub`): an issuer is a URL
  with slashes of its own, so the value is split against the issuers of the
  RequestAuthentications that apply to the workload (each one it can start with),
  and the rest matched on that issuer's `sub`. `*` is any verified token; `x*` and
  `*x` prefixes and suffixes of the whole `iss/sub`, as Istio's. A value that names
  no known issuer matches nothing: no token of it can have passed the filter.
- `request.auth.audiences` (`aud`), `request.auth.presenter` (`azp`) and
  `request.auth.claims[a][b]` (nested claims by path), under any known issuer; a
  claim that is a list matches when one of its entries does.

A workload with no known issuer gets none of these (the caller fails closed).
"""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.rbac.v3 import rbac_pb2
from envoy.type.matcher.v3 import metadata_pb2, regex_pb2, string_pb2, value_pb2

from pilot.builders.jwt_authn import JWT_AUTHN
from pilot.registry.authorization_policy import claim_path

PRINCIPAL_KEY = "request.auth.principal"
AUDIENCES_KEY = "request.auth.audiences"
PRESENTER_KEY = "request.auth.presenter"
NOTHING = rbac_pb2.Principal(not_id=rbac_pb2.Principal(any=True))


def _string(value: str) -> string_pb2.StringMatcher:
    """Istio's value matching: `*` any non-empty, `*x` a suffix, `x*` a prefix, else exact."""
    if value == "*":
        return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=".+"))
    if value.startswith("*"):
        return string_pb2.StringMatcher(suffix=value[1:])
    if value.endswith("*"):
        return string_pb2.StringMatcher(prefix=value[:-1])
    return string_pb2.StringMatcher(exact=value)


def _on(path: Sequence[str], value: value_pb2.ValueMatcher) -> rbac_pb2.Principal:
    matcher = metadata_pb2.MetadataMatcher(
        filter=JWT_AUTHN,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=k) for k in path],
        value=value,
    )
    # The request's dynamic metadata (SourcedMetadata's default source).
    return rbac_pb2.Principal(sourced_metadata=rbac_pb2.SourcedMetadata(metadata_matcher=matcher))


def _any(principals: Sequence[rbac_pb2.Principal]) -> rbac_pb2.Principal:
    if not principals:
        return NOTHING
    if len(principals) == 1:
        return principals[0]
    return rbac_pb2.Principal(or_ids=rbac_pb2.Principal.Set(ids=principals))


def _sub(issuer: str, matcher: string_pb2.StringMatcher) -> rbac_pb2.Principal:
    return _on([issuer, "sub"], value_pb2.ValueMatcher(string_match=matcher))


def _verified(issuer: str) -> rbac_pb2.Principal:
    return _on([issuer], value_pb2.ValueMatcher(present_match=True))


def _principal_under(issuer: str, value: str) -> list[rbac_pb2.Principal]:
    """What `value` (an `iss/sub` pattern) asks of a token of `issuer`."""
    head = issuer + "/"
    if value == "*":
        return [_verified(issuer)]
    if value.startswith("*"):
        suffix = value[1:]
        found = [_sub(issuer, string_pb2.StringMatcher(suffix=suffix))]
        # `iss/sub` may end with `suffix` partly in the issuer: sub is then its rest.
        for k in range(1, min(len(suffix), len(head) + 1)):
            if head.endswith(suffix[:k]):
                found.append(_sub(issuer, string_pb2.StringMatcher(exact=suffix[k:])))
        if head.endswith(suffix):
            found.append(_verified(issuer))
        return found
    if value.endswith("*"):
        prefix = value[:-1]
        if prefix.startswith(head) and len(prefix) > len(head):
            return [_sub(issuer, string_pb2.StringMatcher(prefix=prefix[len(head) :]))]
        return [_verified(issuer)] if head.startswith(prefix) else []
    if value.startswith(head) and len(value) > len(head):
        return [_sub(issuer, string_pb2.StringMatcher(exact=value[len(head) :]))]
    return []


def request_principal(value: str, issuers: Sequence[str]) -> rbac_pb2.Principal:
    """One `requestPrincipals` (or `request.auth.principal`) value."""
    return _any([p for issuer in issuers for p in _principal_under(issuer, value)])


def _claim(path: Sequence[str], value: str, issuers: Sequence[str]) -> rbac_pb2.Principal:
    """A claim equal to `value`, or a list claim holding it, under any known issuer."""
    matcher = value_pb2.ValueMatcher(string_match=_string(value))
    in_list = value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=matcher))
    found = []
    for issuer in issuers:
        found += [_on([issuer, *path], matcher), _on([issuer, *path], in_list)]
    return _any(found)


def auth_condition(key: str, value: str, issuers: Sequence[str]) -> rbac_pb2.Principal:
    """One value of a `request.auth.*` `when` key (`is_auth_key`)."""
    if key == PRINCIPAL_KEY:
        return request_principal(value, issuers)
    if key == AUDIENCES_KEY:
        return _claim(["aud"], value, issuers)
    if key == PRESENTER_KEY:
        return _claim(["azp"], value, issuers)
    path = claim_path(key)
    if path is None:
        raise ValueError(f"{key!r} is not a request.auth key")
    return _claim(path, value, issuers)
