"""`iss/sub` split against the issuers that apply, never on "/": what each requestPrincipals
value asks of which issuer's token (read back from the RBAC principal pilot builds)."""

from __future__ import annotations

import json

from envoy.config.rbac.v3 import rbac_pb2
from google.protobuf import json_format

from pilot.builders.jwt_principals import NOTHING, auth_condition, request_principal

ISSUERS = ("https://a.example.com/realms/x", "https://a.example.com/realms/x/y", "plain")


def asks(principal: rbac_pb2.Principal) -> set[tuple[str, ...]]:
    """(issuer, claim path..., how the value is matched) of each alternative."""
    if principal == NOTHING:
        return set()
    ids = principal.or_ids.ids if principal.HasField("or_ids") else [principal]
    found = set()
    for one in ids:
        matcher = one.sourced_metadata.metadata_matcher
        path = tuple(segment.key for segment in matcher.path)
        value = json_format.MessageToDict(matcher.value)
        found.add((*path, json.dumps(value, sort_keys=True)))
    return found


def test_an_exact_principal_is_split_at_each_issuer_it_starts_with() -> None:
    got = asks(request_principal("https://a.example.com/realms/x/y/alice", ISSUERS))
    assert got == {
        ("https://a.example.com/realms/x", "sub", '{"stringMatch": {"exact": "y/alice"}}'),
        ("https://a.example.com/realms/x/y", "sub", '{"stringMatch": {"exact": "alice"}}'),
    }


def test_a_principal_naming_no_known_issuer_matches_nothing() -> None:
    assert request_principal("https://evil.example.com/alice", ISSUERS) == NOTHING
    assert request_principal("plain", ISSUERS) == NOTHING  # no sub at all
    assert request_principal("plain/alice", ()) == NOTHING


def test_star_is_any_verified_token_and_prefixes_and_suffixes_span_the_slash() -> None:
    assert asks(request_principal("*", ("plain",))) == {("plain", '{"presentMatch": true}')}
    assert asks(request_principal("pla*", ("plain",))) == {("plain", '{"presentMatch": true}')}
    assert asks(request_principal("plain/ad*", ("plain",))) == {
        ("plain", "sub", '{"stringMatch": {"prefix": "ad"}}')
    }
    # `*n/bob` ends inside the issuer: sub is exactly `bob`, or any sub ending in `n/bob`.
    assert asks(request_principal("*n/bob", ("plain",))) == {
        ("plain", "sub", '{"stringMatch": {"suffix": "n/bob"}}'),
        ("plain", "sub", '{"stringMatch": {"exact": "bob"}}'),
    }


def test_claims_match_a_string_or_a_list_holding_it() -> None:
    got = asks(auth_condition("request.auth.claims[groups][0]", "admin", ("plain",)))
    assert got == {
        ("plain", "groups", "0", '{"stringMatch": {"exact": "admin"}}'),
        ("plain", "groups", "0", '{"listMatch": {"oneOf": {"stringMatch": {"exact": "admin"}}}}'),
    }
    assert {p[:2] for p in asks(auth_condition("request.auth.audiences", "r", ("plain",)))} == {
        ("plain", "aud")
    }
    assert {p[:2] for p in asks(auth_condition("request.auth.presenter", "r", ("plain",)))} == {
        ("plain", "azp")
    }
