"""AuthorizationPolicy: who may reach each sidecar's inbound side, read strictly.

Istio's `security.istio.io/v1` (and `v1beta1`) kind `AuthorizationPolicy`:
`spec.action` (ALLOW, DENY, AUDIT, CUSTOM with `provider.name`),
`spec.selector.matchLabels`, `spec.rules` (each `from` sources, `to`
operations, `when` conditions). Every field is checked against Istio's API (an
unknown one is an error), every list and string against a bound.

Scopes, as Istio's: a policy in the root namespace (`istio-system`) without a
selector applies to every sidecar of the mesh, with a selector to the workloads
of every namespace it selects; elsewhere, without a selector to its namespace's
sidecars, with one to those it selects. Every policy that applies counts (they
are not ranked as PeerAuthentications are): a request is denied when a CUSTOM
or DENY policy matches it, else allowed when no ALLOW policy applies or one
matches.

Failing closed, never open:
- `targetRef`/`targetRefs` (a policy for a Gateway, Service or waypoint) is not
  implemented: the policy becomes *deny everything* for its namespace's
  sidecars (its targets are objects of its own namespace);
- CUSTOM names an external authorizer, and pilot configures none: *deny
  everything* for the workloads it applies to, as istiod does when the provider
  is not found;
- an object that is not valid (it reached pilot through the API server or a file
  anyway) becomes *deny everything* for its namespace: ignoring it would drop
  what it denied;
- a condition pilot cannot check (an unknown `when` key, an exact path template too
  long for Envoy's RE2) makes its rule match nothing in an ALLOW policy and match
  regardless in a DENY policy (`pilot.builders.rbac`); so do `requestPrincipals`
  and `request.auth.*` on a workload no RequestAuthentication applies to (it has no
  request principal) and on TCP chains.

Paths and path templates (`{*}`, `{**}`) are checked as Istio's validation checks
them: a `{` or `}` other than a whole `{*}` or `{**}` segment, anything after
`{**}`, or a template's other segment outside RFC 3986's pchar makes the object
invalid.
Each is one warning line when the policy arrives (`fail_closed` says why) and
counted (`pilot_authz_failed_closed_total`).

The store answers `policies_for(namespace, workloads)` and says, for each change,
which namespaces' proxies to reconsider (the root namespace's: every one's).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pilot.builders.path_matchers import (
    MATCH_ANY,
    MATCH_ONE,
    PathTooComplex,
    exact_template_regex,
    is_template,
)
from pilot.registry.istio_config import ConfigError, ConfigKey, Reader, key_of, metadata
from pilot.registry.peer_authentication import Labels
from pilot.registry.scoped_store import Scoped, ScopedStore, read_selector

KIND = "AuthorizationPolicy"
GROUP = "security.istio.io"
VERSIONS = ("v1", "v1beta1")
API_VERSIONS = frozenset(f"{GROUP}/{v}" for v in VERSIONS)
MAX_RULES = 512  # rules of one policy
MAX_VALUES = 1024  # entries of one list (principals, paths, ...)
MAX_VALUE = 1024  # characters of one value
# Values (principals, paths, ...) of one policy in all: what one object can cost the
# translation, which runs on the event loop once per shape that holds it.
MAX_TOTAL_VALUES = 16384
# Characters of every path of one policy: widening a path into RE2 regexes costs up to
# about 4 ms a 1,000 characters (pilot.builders.path_matchers), on the event loop.
MAX_PATH_CHARACTERS = 65536
# RFC 3986's pchar, as Istio's validation checks a template's literal segments.
_PCHARS = re.compile(r"[a-zA-Z0-9\-._~%!$&'()+,;:@=]+")

_SPEC_FIELDS = frozenset({"selector", "targetRef", "targetRefs", "rules", "action", "provider"})
_RULE_FIELDS = frozenset({"from", "to", "when"})
_SOURCE_LISTS = (
    "principals",
    "notPrincipals",
    "requestPrincipals",
    "notRequestPrincipals",
    "namespaces",
    "notNamespaces",
    "serviceAccounts",
    "notServiceAccounts",
    "ipBlocks",
    "notIpBlocks",
    "remoteIpBlocks",
    "notRemoteIpBlocks",
    "trustDomains",
    "notTrustDomains",
)
_OPERATION_LISTS = (
    "hosts",
    "notHosts",
    "ports",
    "notPorts",
    "methods",
    "notMethods",
    "paths",
    "notPaths",
)
_IP_LISTS = frozenset({"ipBlocks", "notIpBlocks", "remoteIpBlocks", "notRemoteIpBlocks"})
# `when` keys pilot checks (Istio's documented ones, less those that need a JWT).
WHEN_KEYS = frozenset(
    {
        "source.ip",
        "remote.ip",
        "source.namespace",
        "source.principal",
        "source.serviceAccount",
        "destination.ip",
        "destination.port",
        "connection.sni",
    }
)
HEADER_KEY = "request.headers"  # request.headers[NAME]
# `when` keys on the request's JWT (checked where a RequestAuthentication applies).
AUTH_KEYS = frozenset(
    {"request.auth.principal", "request.auth.audiences", "request.auth.presenter"}
)
_CLAIM_KEY = re.compile(r"request\.auth\.claims((?:\[[^\[\]]+\])+)")
MAX_CLAIM_DEPTH = 16


def claim_path(key: str) -> list[str] | None:
    """`request.auth.claims[a][b]` -> ["a", "b"]; None if `key` is not one."""
    match = _CLAIM_KEY.fullmatch(key)
    if match is None:
        return None
    path = match.group(1)[1:-1].split("][")
    return path if len(path) <= MAX_CLAIM_DEPTH else None


def is_auth_key(key: str) -> bool:
    """Whether a `when` key is on the request's JWT (`request.auth.*` that pilot knows)."""
    return key in AUTH_KEYS or claim_path(key) is not None


class Action(StrEnum):
    """`spec.action`."""

    ALLOW = "ALLOW"
    DENY = "DENY"
    AUDIT = "AUDIT"
    CUSTOM = "CUSTOM"


Values = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Source:
    """One `from[].source`: field name (Istio's) -> its values; fields are ANDed."""

    fields: tuple[tuple[str, Values], ...]


@dataclass(frozen=True, slots=True)
class Operation:
    """One `to[].operation`: field name (Istio's) -> its values; fields are ANDed."""

    fields: tuple[tuple[str, Values], ...]


@dataclass(frozen=True, slots=True)
class Condition:
    """One `when` entry."""

    key: str
    values: Values = ()
    not_values: Values = ()


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: any of `sources` (None: any source) and any of `operations` (None: any)
    and every condition."""

    sources: tuple[Source, ...] | None = None
    operations: tuple[Operation, ...] | None = None
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthorizationPolicy(Scoped):
    """What pilot keeps of one AuthorizationPolicy."""

    key: ConfigKey
    action: Action = Action.ALLOW
    created: str = ""
    selector: Labels = ()  # matchLabels; () applies to the whole namespace
    rules: tuple[Rule, ...] = ()
    # Why this policy denies everything it applies to (empty: it is translated as written).
    deny_all: str = ""
    # Why parts of it fail closed (one line each), for the warning when it arrives.
    fail_closed: tuple[str, ...] = field(default=(), compare=False)


def _values(reader: Reader, raw: Any, where: str) -> Values:
    entries = reader.items(raw, where, MAX_VALUES)
    return tuple(reader.string(v, f"{where}[{i}]", MAX_VALUE) for i, v in enumerate(entries))


def _ip_values(reader: Reader, raw: Any, where: str) -> Values:
    values = _values(reader, raw, where)
    for i, value in enumerate(values):
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise reader.fail(f"{where}[{i}]", f"{value!r} is not an IP or CIDR") from None
    return values


def _template_problem(path: str) -> str | None:
    """Why Istio's validation refuses `path` (CheckValidPathTemplate), None when it does
    not: `{` or `}` only as a whole segment `{*}` or `{**}`, nothing after `{**}`, and in
    a template every other segment a literal of RFC 3986's pchar set."""
    templated = is_template(path)
    seen_any = False
    for segment in path.strip("/").split("/"):
        if segment in (MATCH_ONE, MATCH_ANY):
            if seen_any:
                return "{**} is not the last operator"
            seen_any = segment == MATCH_ANY
            continue
        if "{" in segment or "}" in segment:
            return "it holds '{' or '}' beyond a path template ({*} or {**} as a whole segment)"
        if templated and not _PCHARS.fullmatch(segment):
            return f"segment {segment[:64]!r} of a template is not a literal of RFC 3986's pchar"
    return None


def _path_values(reader: Reader, raw: Any, where: str) -> Values:
    values = _values(reader, raw, where)
    for i, value in enumerate(values):
        if (problem := _template_problem(value)) is not None:
            raise reader.fail(f"{where}[{i}]", f"{value[:64]!r} is not a valid path: {problem}")
    return values


def _port_values(reader: Reader, raw: Any, where: str) -> Values:
    values = _values(reader, raw, where)
    for i, value in enumerate(values):
        reader.integer(value, f"{where}[{i}]", 0, 65535)
    return values


def _fields(
    reader: Reader, raw: Any, where: str, names: Sequence[str]
) -> tuple[tuple[str, Values], ...]:
    body = reader.mapping(raw, where, frozenset(names))
    found = []
    for name in names:
        if body.get(name) is None:
            continue
        here = f"{where}.{name}"
        if name in _IP_LISTS:
            values = _ip_values(reader, body[name], here)
        elif name in ("ports", "notPorts"):
            values = _port_values(reader, body[name], here)
        elif name in ("paths", "notPaths"):
            values = _path_values(reader, body[name], here)
        else:
            values = _values(reader, body[name], here)
        found.append((name, values))
    return tuple(found)


def _sources(reader: Reader, raw: Any, where: str) -> tuple[Source, ...] | None:
    if raw is None:
        return None
    entries = reader.items(raw, where, MAX_VALUES)
    found = []
    for i, entry in enumerate(entries):
        body = reader.mapping(entry, f"{where}[{i}]", frozenset({"source"}))
        found.append(
            Source(_fields(reader, body.get("source"), f"{where}[{i}].source", _SOURCE_LISTS))
        )
    return tuple(found)


def _operations(reader: Reader, raw: Any, where: str) -> tuple[Operation, ...] | None:
    if raw is None:
        return None
    entries = reader.items(raw, where, MAX_VALUES)
    found = []
    for i, entry in enumerate(entries):
        here = f"{where}[{i}]"
        body = reader.mapping(entry, here, frozenset({"operation"}))
        found.append(
            Operation(_fields(reader, body.get("operation"), f"{here}.operation", _OPERATION_LISTS))
        )
    return tuple(found)


def _conditions(reader: Reader, raw: Any, where: str) -> tuple[Condition, ...]:
    entries = reader.items(raw, where, MAX_VALUES)
    found = []
    for i, entry in enumerate(entries):
        here = f"{where}[{i}]"
        body = reader.mapping(entry, here, frozenset({"key", "values", "notValues"}))
        key = reader.string(body.get("key"), f"{here}.key", 256)
        read = _WHEN_READERS.get(key, _values)  # as Istio validates them: IPs, ports
        values = read(reader, body.get("values"), f"{here}.values")
        not_values = read(reader, body.get("notValues"), f"{here}.notValues")
        if not values and not not_values:
            raise reader.fail(here, "needs values or notValues")
        found.append(Condition(key, values, not_values))
    return tuple(found)


_WHEN_READERS = {
    "source.ip": _ip_values,
    "remote.ip": _ip_values,
    "destination.ip": _ip_values,
    "destination.port": _port_values,
}


def _rules(reader: Reader, raw: Any) -> tuple[Rule, ...]:
    entries = reader.items(raw, "spec.rules", MAX_RULES)
    rules = []
    for i, entry in enumerate(entries):
        here = f"spec.rules[{i}]"
        body = reader.mapping(entry, here, _RULE_FIELDS)
        rules.append(
            Rule(
                _sources(reader, body.get("from"), f"{here}.from"),
                _operations(reader, body.get("to"), f"{here}.to"),
                _conditions(reader, body.get("when"), f"{here}.when"),
            )
        )
    return tuple(rules)


def _check_api_version(reader: Reader, obj: Mapping[str, Any]) -> None:
    version = obj.get("apiVersion")
    if version is not None and version not in API_VERSIONS:
        raise reader.fail("apiVersion", f"is not one of {', '.join(sorted(API_VERSIONS))}")


def parse_authorization_policy(obj: Mapping[str, Any]) -> AuthorizationPolicy:
    """One AuthorizationPolicy (a dict, as the API server or a file gives it).

    Raises ConfigError (one line naming the object and the field) on anything that is not
    Istio's API; `refused_policy` is what stands in for such an object.
    """
    reader = Reader(key_of(KIND, obj))
    _check_api_version(reader, obj)
    namespace, created = metadata(reader, obj)
    key = ConfigKey(KIND, namespace, reader.key.name)
    spec = reader.mapping(obj.get("spec"), "spec", _SPEC_FIELDS)
    raw_action = spec.get("action")
    action = (
        Action(reader.enum(raw_action, "spec.action", list(Action))) if raw_action else Action.ALLOW
    )
    provider = reader.mapping(spec.get("provider"), "spec.provider", frozenset({"name"}))
    if provider:
        reader.string(provider.get("name"), "spec.provider.name", 253)
    if provider and action is not Action.CUSTOM:
        raise reader.fail("spec.provider", "is only for action CUSTOM")
    policy = AuthorizationPolicy(
        key,
        action,
        created,
        read_selector(reader, spec.get("selector")),
        _rules(reader, spec.get("rules")),
    )
    total = _values_in(policy)
    if total > MAX_TOTAL_VALUES:
        raise reader.fail("spec.rules", f"hold {total} values in all (at most {MAX_TOTAL_VALUES})")
    characters = _path_characters(policy)
    if characters > MAX_PATH_CHARACTERS:
        raise reader.fail(
            "spec.rules", f"hold {characters} characters of paths (at most {MAX_PATH_CHARACTERS})"
        )
    return _with_failing_closed(policy, spec)


def _values_in(policy: AuthorizationPolicy) -> int:
    """Entries and values of every rule: what translating the policy costs."""
    total = 0
    for rule in policy.rules:
        parts: list[Source | Operation] = [*(rule.sources or ()), *(rule.operations or ())]
        for part in parts:
            total += 1 + sum(len(values) for _, values in part.fields)
        total += sum(1 + len(c.values) + len(c.not_values) for c in rule.conditions)
    return total


def _path_characters(policy: AuthorizationPolicy) -> int:
    """Characters of every path and notPath: what widening them costs the translation."""
    return sum(
        len(value)
        for rule in policy.rules
        for operation in rule.operations or ()
        for name, values in operation.fields
        if name in ("paths", "notPaths")
        for value in values
    )


def _with_failing_closed(
    policy: AuthorizationPolicy, spec: Mapping[str, Any]
) -> AuthorizationPolicy:
    """The policy as pilot enforces it: what it cannot translate fails closed (said why)."""
    deny_all = ""
    if spec.get("targetRef") is not None or spec.get("targetRefs") is not None:
        deny_all = (
            "targetRef(s) are not implemented: it denies every request to its namespace's sidecars"
        )
        policy = AuthorizationPolicy(policy.key, Action.DENY, policy.created, (), (), deny_all)
    elif policy.action is Action.CUSTOM:
        deny_all = (
            "CUSTOM needs an external authorizer and pilot configures none:"
            " it denies every request it applies to"
        )
    reasons = [deny_all] if deny_all else []
    reasons += sorted(set(_unchecked(policy)))
    return AuthorizationPolicy(
        policy.key,
        policy.action,
        policy.created,
        policy.selector,
        policy.rules,
        deny_all,
        tuple(reasons),
    )


def _unchecked(policy: AuthorizationPolicy) -> Iterable[str]:
    """Conditions pilot cannot check (their rules fail closed), for the warning."""
    if policy.deny_all:
        return
    effect = "matches nothing" if policy.action is not Action.DENY else "denies regardless of it"
    for rule in policy.rules:
        for operation in rule.operations or ():
            for name, values in operation.fields:
                exact = (name == "paths") != (policy.action in (Action.DENY, Action.AUDIT))
                for value in values if exact and name in ("paths", "notPaths") else ():
                    try:
                        exact_template_regex(value) if is_template(value) else None
                    except PathTooComplex as error:
                        yield f"{error}: its rule {effect}"
        for condition in rule.conditions:
            if not is_checked_key(condition.key) and not is_auth_key(condition.key):
                yield f"when key {condition.key[:64]!r} is not supported: its rule {effect}"


def is_checked_key(key: str) -> bool:
    """Whether pilot checks a `when` key everywhere (request.auth.*: where a
    RequestAuthentication applies, `is_auth_key`; unknown keys: no)."""
    if key in WHEN_KEYS:
        return True
    return key.startswith(HEADER_KEY + "[") and key.endswith("]") and len(key) > len(HEADER_KEY) + 2


def refused_policy(obj: Mapping[str, Any], error: ConfigError | None) -> AuthorizationPolicy | None:
    """What stands in for an object that is not valid (`error`; None: malformed beyond
    what the reader says): deny everything in its namespace (None: not even its name can
    be told, so nothing can stand in for it)."""
    key = key_of(KIND, obj)
    if key.name == "?" or key.namespace == "?":
        return None
    what = str(error)[:300] if error is not None else f"{key}: malformed"
    reason = f"not valid ({what}): it denies every request to its namespace's sidecars"
    return AuthorizationPolicy(key, Action.DENY, "", (), (), reason, (reason,))


@dataclass(frozen=True, slots=True)
class AppliedPolicies:
    """The policies that apply to one workload, and whether the allow set is unknown."""

    policies: tuple[AuthorizationPolicy, ...] = ()  # sorted by key
    # Its Pod (labels) could not be told and ALLOW policies could select it: it allows
    # nothing but what the namespace- and mesh-wide ALLOW policies allow (fail closed).
    allow_uncertain: bool = False

    def __bool__(self) -> bool:
        return bool(self.policies) or self.allow_uncertain


NO_POLICIES = AppliedPolicies()


class AuthorizationPolicies(ScopedStore[AuthorizationPolicy]):
    """Every AuthorizationPolicy known, and those that apply to each workload."""

    def policies_for(
        self, namespace: str, workloads: Sequence[Mapping[str, str]]
    ) -> AppliedPolicies:
        """What applies to a proxy of `namespace` whose Pod has one of these label sets.

        Exactly one label set: the policies that select it. None or several (its Pod is
        not known, or not one): every CUSTOM, DENY and AUDIT policy that could select it,
        and of the ALLOW ones only the namespace- and mesh-wide (`allow_uncertain`).
        """
        found: list[AuthorizationPolicy] = []
        uncertain = False
        certain = len(workloads) == 1
        for policy in self.in_scope(namespace):
            if not policy.selector:
                found.append(policy)
            elif certain:
                if policy.selects(workloads[0]):
                    found.append(policy)
            elif policy.action is Action.ALLOW:
                uncertain = True
            else:
                found.append(policy)
        if uncertain and not any(p.action is Action.ALLOW for p in found):
            return AppliedPolicies(tuple(sorted(found, key=lambda p: p.key)), True)
        return AppliedPolicies(tuple(sorted(found, key=lambda p: p.key)), False)

    def has_selecting(self, namespace: str) -> bool:
        """Whether a policy with a selector could apply to a proxy of `namespace`."""
        return any(p.selector for p in self.in_scope(namespace))


__all__ = [
    "KIND",
    "NO_POLICIES",
    "Action",
    "AppliedPolicies",
    "AuthorizationPolicies",
    "AuthorizationPolicy",
    "Condition",
    "ConfigError",
    "Operation",
    "Rule",
    "Source",
    "is_auth_key",
    "is_checked_key",
    "parse_authorization_policy",
    "refused_policy",
]
