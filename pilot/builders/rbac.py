"""AuthorizationPolicy as Envoy RBAC filters on a sidecar's inbound chains (pure).

HTTP chains get `envoy.filters.http.rbac` filters before the router, TCP chains
(and the passthrough ones) `envoy.filters.network.rbac` before the proxy, in
Istio's order of evaluation: a DENY filter first (CUSTOM and DENY policies: a
request one of them matches is refused), then an AUDIT one (Envoy's LOG action:
it marks, never refuses), then an ALLOW filter when an ALLOW policy applies (a
request none of them matches is refused; an ALLOW policy without rules, `spec:
{}`, matches nothing). Refused HTTP requests get Envoy's 403 `RBAC: access
denied`; refused TCP connections are closed.

Each rule is one Envoy policy named as istiod names them
(`ns[NS]-policy[NAME]-rule[I]`): its principals from `from` (principals as
`spiffe://` URIs of the peer certificate, `*` as a prefix or suffix as Istio's;
namespaces and service accounts as regexes on it; ipBlocks on the peer's
address, remoteIpBlocks on the client's) and the source-side `when` keys, its
permissions from `to` (hosts on `:authority`, case-insensitive; methods; paths,
after the connection manager's normalization; ports) and the destination-side
`when` keys. A plaintext caller has no certificate, so it matches no principal
rule (and every `notPrincipals` one).

Paths are matched after the connection manager's normalization, and widened to
their other spellings where that denies more, exact where it would allow more
(`pilot.builders.path_matchers`; path templates too).

`requestPrincipals` and the `request.auth.*` keys are matched on the JWT payload the
`jwt_authn` filter leaves in its metadata, split against the issuers of the
RequestAuthentications that apply to the workload (`pilot.builders.jwt_principals`).

Failing closed: a condition that cannot be checked here (HTTP fields on a TCP
chain, as Istio; `requestPrincipals` and `request.auth.*` on a TCP chain or on a
workload no RequestAuthentication applies to, which has no request principal, or
past `MAX_JWT_WORK` splits of its values against the issuers; an unknown `when` key;
an exact path template too long for Envoy's RE2) makes its rule match nothing in an
ALLOW or AUDIT policy, and is left out of a DENY
policy's rule (which then denies regardless of it). A policy pilot cannot
translate at all (`AuthorizationPolicy.deny_all`, CUSTOM) denies everything.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence

from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2

from pilot.builders.jwt_principals import auth_condition, request_principal
from pilot.builders.listeners import typed
from pilot.builders.path_matchers import PathTooComplex, path_permission, quote_meta
from pilot.registry.authorization_policy import (
    HEADER_KEY,
    Action,
    AppliedPolicies,
    AuthorizationPolicy,
    Condition,
    Operation,
    Rule,
    Source,
    is_auth_key,
    is_checked_key,
)

SPIFFE = "spiffe://"
MAX_JWT_WORK = 200_000  # issuer x value (x suffix length) splits of one policy
RULES_CACHED = 16  # (policies, chain kind) translations kept: a listener's chains share them
HTTP_RBAC = "envoy.filters.http.rbac"
NETWORK_RBAC = "envoy.filters.network.rbac"
_HTTP_ONLY = frozenset({"hosts", "notHosts", "methods", "notMethods", "paths", "notPaths"})


class _Unchecked(Exception):
    """A condition this chain cannot check (its rule fails closed)."""


def _regex(pattern: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=pattern))


def string_matcher(
    value: str, prefix: str = "", ignore_case: bool = False
) -> string_pb2.StringMatcher:
    """Istio's value matching: `*` any non-empty, `*x` a suffix, `x*` a prefix, else exact
    (`prefix` put before the value: `spiffe://` for principals)."""
    if value == "*":
        return _regex(".+")
    if value.startswith("*"):
        if prefix:
            return _regex(quote_meta(prefix) + ".*" + quote_meta(value[1:]))
        return string_pb2.StringMatcher(suffix=value[1:], ignore_case=ignore_case)
    if value.endswith("*"):
        return string_pb2.StringMatcher(prefix=prefix + value[:-1], ignore_case=ignore_case)
    return string_pb2.StringMatcher(exact=prefix + value, ignore_case=ignore_case)


def _authenticated(matcher: string_pb2.StringMatcher) -> rbac_pb2.Principal:
    return rbac_pb2.Principal(
        authenticated=rbac_pb2.Principal.Authenticated(principal_name=matcher)
    )


def _namespace(value: str) -> rbac_pb2.Principal:
    pattern = ".*".join(quote_meta(part) for part in value.split("*"))
    return _authenticated(_regex(f".*/ns/{pattern}/.*"))


def _service_account(value: str, namespace: str) -> rbac_pb2.Principal:
    ns, slash, sa = value.partition("/")  # `ns/sa`, or `sa` of the policy's namespace
    if not slash:
        ns, sa = namespace, value
    return _authenticated(
        _regex(f"spiffe://.+/ns/{quote_meta(ns)}/(.+/|)sa/{quote_meta(sa)}(/.+)?")
    )


def _trust_domain(value: str) -> rbac_pb2.Principal:
    if value == "*":
        return _authenticated(string_pb2.StringMatcher(prefix=SPIFFE))
    if "*" not in value:
        return _authenticated(string_pb2.StringMatcher(prefix=f"{SPIFFE}{value}/"))
    head, _, tail = value.partition("*")
    return _authenticated(_regex(f"spiffe://{quote_meta(head)}[^/]*{quote_meta(tail)}/.*"))


def _cidr(value: str) -> address_pb2.CidrRange:
    network = ipaddress.ip_network(value, strict=False)
    return address_pb2.CidrRange(
        address_prefix=str(network.network_address), prefix_len={"value": network.prefixlen}
    )


def _header(name: str, value: str, ignore_case: bool = False) -> route_components_pb2.HeaderMatcher:
    """`*` is the header's presence, empty value included (as istiod: a DENY on a header's
    presence must not be escaped by sending it empty)."""
    if value == "*":
        return route_components_pb2.HeaderMatcher(name=name, present_match=True)
    return route_components_pb2.HeaderMatcher(
        name=name, string_match=string_matcher(value, ignore_case=ignore_case)
    )


def _path(value: str, widened: bool) -> rbac_pb2.Permission:
    try:
        return path_permission(value, widened)
    except PathTooComplex:  # an exact template Envoy would refuse: its rule fails closed
        raise _Unchecked from None


def _source_principal(name: str, value: str, namespace: str, tcp: bool) -> rbac_pb2.Principal:
    """One value of one source field (or source-side `when` key)."""
    if name in ("principals", "source.principal"):
        return _authenticated(string_matcher(value, SPIFFE))
    if name in ("namespaces", "source.namespace"):
        return _namespace(value)
    if name in ("serviceAccounts", "source.serviceAccount"):
        return _service_account(value, namespace)
    if name == "trustDomains":
        return _trust_domain(value)
    if name in ("ipBlocks", "source.ip"):
        return rbac_pb2.Principal(direct_remote_ip=_cidr(value))
    if name in ("remoteIpBlocks", "remote.ip"):
        return rbac_pb2.Principal(remote_ip=_cidr(value))
    if name.startswith(HEADER_KEY + "[") and not tcp:
        return rbac_pb2.Principal(header=_header(name[len(HEADER_KEY) + 1 : -1], value))
    raise _Unchecked  # requestPrincipals, request.auth.*, headers on TCP


def _operation_permission(
    name: str, value: str, tcp: bool, widened: bool = False
) -> rbac_pb2.Permission:
    """One value of one operation field (or destination-side `when` key); `widened`: a
    path matches its other spellings too (`pilot.builders.path_matchers`)."""
    if name in ("ports", "destination.port"):
        return rbac_pb2.Permission(destination_port=int(value))
    if name == "destination.ip":
        return rbac_pb2.Permission(destination_ip=_cidr(value))
    if name == "connection.sni":
        return rbac_pb2.Permission(requested_server_name=string_matcher(value))
    if tcp:
        raise _Unchecked
    if name == "hosts":
        return rbac_pb2.Permission(header=_header(":authority", value, ignore_case=True))
    if name == "methods":
        return rbac_pb2.Permission(header=_header(":method", value))
    if name == "paths":
        return _path(value, widened)
    raise _Unchecked


_ANY_PRINCIPAL = rbac_pb2.Principal(any=True)
_ANY_PERMISSION = rbac_pb2.Permission(any=True)
_PRINCIPAL_SIDE = frozenset(
    {"source.ip", "remote.ip", "source.namespace", "source.principal", "source.serviceAccount"}
)


def _any_principal(principals: Sequence[rbac_pb2.Principal]) -> rbac_pb2.Principal:
    if len(principals) == 1:
        return principals[0]
    return rbac_pb2.Principal(or_ids=rbac_pb2.Principal.Set(ids=principals))


def _all_principals(principals: Sequence[rbac_pb2.Principal]) -> rbac_pb2.Principal:
    if not principals:
        return rbac_pb2.Principal(any=True)
    if len(principals) == 1:
        return principals[0]
    return rbac_pb2.Principal(and_ids=rbac_pb2.Principal.Set(ids=principals))


def _any_permission(permissions: Sequence[rbac_pb2.Permission]) -> rbac_pb2.Permission:
    if len(permissions) == 1:
        return permissions[0]
    return rbac_pb2.Permission(or_rules=rbac_pb2.Permission.Set(rules=permissions))


def _all_permissions(permissions: Sequence[rbac_pb2.Permission]) -> rbac_pb2.Permission:
    if not permissions:
        return rbac_pb2.Permission(any=True)
    if len(permissions) == 1:
        return permissions[0]
    return rbac_pb2.Permission(and_rules=rbac_pb2.Permission.Set(rules=permissions))


class _RuleBuilder:
    """One rule's principals and permissions; an unchecked condition is dropped (DENY)
    or makes the rule match nothing (ALLOW, AUDIT: `_Unchecked` propagates)."""

    def __init__(self, policy: AuthorizationPolicy, tcp: bool, issuers: tuple[str, ...]) -> None:
        self.namespace = policy.namespace
        self.tcp = tcp
        self.lenient = policy.action is Action.DENY  # an unchecked part is left out
        self.denies = policy.action in (Action.DENY, Action.AUDIT)  # AUDIT as DENY
        # Whom a request principal can come from: none on TCP chains (no JWT there).
        self.issuers = () if tcp else issuers
        self.jwt_work = 0  # matchers the JWT values of this policy make, roughly

    def _one_principal(self, name: str, value: str) -> rbac_pb2.Principal:
        if name == "requestPrincipals" or is_auth_key(name):
            if not self.issuers:
                raise _Unchecked  # no request principal here: fail closed
            # Each value is split against every issuer (a suffix at each of its places):
            # past a budget the policy's JWT parts fail closed instead of costing the loop.
            self.jwt_work += len(self.issuers) * (len(value) if value.startswith("*") else 1)
            if self.jwt_work > MAX_JWT_WORK:
                raise _Unchecked
            if name == "requestPrincipals":
                return request_principal(value, self.issuers)
            return auth_condition(name, value, self.issuers)
        return _source_principal(name, value, self.namespace, self.tcp)

    def principal(self, name: str, values: Sequence[str]) -> rbac_pb2.Principal | None:
        try:
            found = [self._one_principal(name, v) for v in values]
        except _Unchecked:
            if self.lenient:
                return None
            raise
        return _any_principal(found)

    def permission(
        self, name: str, values: Sequence[str], negated: bool = False
    ) -> rbac_pb2.Permission | None:
        # Paths are widened where matching more denies more: a DENY's (or AUDIT's)
        # `paths`, an ALLOW's `notPaths`; exact where it would allow more.
        widened = self.denies != negated
        try:
            found = [_operation_permission(name, v, self.tcp, widened) for v in values]
        except _Unchecked:
            if self.lenient:
                return None
            raise
        return _any_permission(found)

    def source(self, source: Source) -> rbac_pb2.Principal:
        parts = []
        for name, values in source.fields:
            if not values:
                continue
            negated = name.startswith("not")
            base = name[3].lower() + name[4:] if negated else name
            made = self.principal(base, values)
            if made is not None:
                parts.append(rbac_pb2.Principal(not_id=made) if negated else made)
        return _all_principals(parts)

    def operation(self, operation: Operation) -> rbac_pb2.Permission:
        parts = []
        for name, values in operation.fields:
            if not values:
                continue
            negated = name.startswith("not")
            base = name[3].lower() + name[4:] if negated else name
            made = self.permission(base, values, negated)
            if made is not None:
                parts.append(rbac_pb2.Permission(not_rule=made) if negated else made)
        return _all_permissions(parts)

    def condition(
        self, condition: Condition
    ) -> tuple[rbac_pb2.Principal | None, rbac_pb2.Permission | None]:
        """A `when` entry: on the principal side (source.*, remote.ip, headers) or the
        permission side (destination.*, connection.sni); (None, None): left out."""
        auth = is_auth_key(condition.key)
        if (not auth and not is_checked_key(condition.key)) or (
            self.tcp and condition.key.startswith(HEADER_KEY)
        ):
            if self.lenient:
                return None, None
            raise _Unchecked
        if auth or condition.key in _PRINCIPAL_SIDE or condition.key.startswith(HEADER_KEY):
            return self._principal_condition(condition), None
        return None, self._permission_condition(condition)

    def _principal_condition(self, condition: Condition) -> rbac_pb2.Principal:
        made = []
        if condition.values:
            made.append(self.principal(condition.key, condition.values) or _ANY_PRINCIPAL)
        if condition.not_values:
            inner = self.principal(condition.key, condition.not_values)
            if inner is not None:
                made.append(rbac_pb2.Principal(not_id=inner))
        return _all_principals(made)

    def _permission_condition(self, condition: Condition) -> rbac_pb2.Permission:
        made = []
        if condition.values:
            made.append(self.permission(condition.key, condition.values) or _ANY_PERMISSION)
        if condition.not_values:
            inner = self.permission(condition.key, condition.not_values)
            if inner is not None:
                made.append(rbac_pb2.Permission(not_rule=inner))
        return _all_permissions(made)

    def rule(self, rule: Rule) -> rbac_pb2.Policy:
        principals = (
            [_any_principal([self.source(s) for s in rule.sources])] if rule.sources else []
        )
        permissions = (
            [_any_permission([self.operation(o) for o in rule.operations])]
            if rule.operations
            else []
        )
        for condition in rule.conditions:
            principal, permission = self.condition(condition)
            if principal is not None:
                principals.append(principal)
            if permission is not None:
                permissions.append(permission)
        return rbac_pb2.Policy(
            principals=[_all_principals(principals)], permissions=[_all_permissions(permissions)]
        )


def _deny_everything() -> rbac_pb2.Policy:
    return rbac_pb2.Policy(
        principals=[rbac_pb2.Principal(any=True)], permissions=[rbac_pb2.Permission(any=True)]
    )


def policy_name(policy: AuthorizationPolicy, rule: int | str) -> str:
    """istiod's name of one rule's Envoy policy."""
    return f"ns[{policy.namespace}]-policy[{policy.name}]-rule[{rule}]"


def _policies(
    policy: AuthorizationPolicy, tcp: bool, issuers: tuple[str, ...] = ()
) -> dict[str, rbac_pb2.Policy]:
    """One AuthorizationPolicy's Envoy policies on one kind of chain."""
    if policy.deny_all or policy.action is Action.CUSTOM:
        return {policy_name(policy, "all"): _deny_everything()}
    builder = _RuleBuilder(policy, tcp, issuers)
    found = {}
    for i, rule in enumerate(policy.rules):
        try:
            found[policy_name(policy, i)] = builder.rule(rule)
        except _Unchecked:
            continue  # ALLOW / AUDIT: this rule matches nothing
        except ValueError:  # a value the parser let through and Envoy cannot take
            if policy.action is Action.DENY:  # never fail open: this rule denies all
                found[policy_name(policy, i)] = _deny_everything()
    return found


def _action_of(policy: AuthorizationPolicy) -> int:
    if policy.deny_all or policy.action in (Action.DENY, Action.CUSTOM):
        return _DENY
    if policy.action is Action.AUDIT:
        return _LOG
    return _ALLOW


_DENY: int = rbac_pb2.RBAC.DENY
_LOG: int = rbac_pb2.RBAC.LOG
_ALLOW: int = rbac_pb2.RBAC.ALLOW
_ORDER = (_DENY, _LOG, _ALLOW)


def rbac_rules(
    applied: AppliedPolicies, tcp: bool, issuers: tuple[str, ...] = ()
) -> list[rbac_pb2.RBAC]:
    """The RBAC rule sets of one chain, in the order Envoy must evaluate them (a copy of
    what is built once per (policies, chain kind, issuers): every chain of a listener
    shares them, and a big policy costs hundreds of milliseconds to translate)."""
    built = _built_rules(applied, tcp, issuers)
    copies = []
    for rules in built:
        copy = rbac_pb2.RBAC()
        copy.CopyFrom(rules)
        copies.append(copy)
    return copies


@functools.lru_cache(maxsize=RULES_CACHED)
def _built_rules(
    applied: AppliedPolicies, tcp: bool, issuers: tuple[str, ...] = ()
) -> tuple[rbac_pb2.RBAC, ...]:
    by_action: dict[int, rbac_pb2.RBAC] = {}
    for policy in applied.policies:
        action = _action_of(policy)
        rules = by_action.setdefault(action, rbac_pb2.RBAC(action=action))
        for name, made in _policies(policy, tcp, issuers).items():
            rules.policies[name].CopyFrom(made)
    if applied.allow_uncertain:
        by_action.setdefault(rbac_pb2.RBAC.ALLOW, rbac_pb2.RBAC(action=rbac_pb2.RBAC.ALLOW))
    return tuple(by_action[action] for action in _ORDER if action in by_action)


def _suffix(action: int) -> str:
    return {rbac_pb2.RBAC.DENY: "deny", rbac_pb2.RBAC.LOG: "audit"}.get(action, "allow")


@functools.lru_cache(maxsize=RULES_CACHED)
def http_rbac_filters(
    applied: AppliedPolicies, issuers: tuple[str, ...] = ()
) -> tuple[hcm_pb2.HttpFilter, ...]:
    """The HTTP RBAC filters of an HTTP chain (none when no policy applies): built and
    packed once for every chain of the policies (callers copy them into their chains);
    `issuers` are those of the RequestAuthentications that apply (request principals)."""
    filters = []
    for rules in _built_rules(applied, False, issuers):
        config = http_rbac_pb2.RBAC()
        config.rules.CopyFrom(rules)
        config.rules.SetInParent()
        filters.append(hcm_pb2.HttpFilter(name=HTTP_RBAC, typed_config=typed(config)))
    return tuple(filters)


@functools.lru_cache(maxsize=RULES_CACHED)
def network_rbac_filters(applied: AppliedPolicies) -> tuple[listener_components_pb2.Filter, ...]:
    """The network RBAC filters of a TCP chain (none when no policy applies), as the HTTP
    ones; their stats are `tcp.<action>.rbac.*` for every chain (istiod's are `tcp.`)."""
    filters = []
    for rules in _built_rules(applied, tcp=True):
        config = network_rbac_pb2.RBAC(stat_prefix=f"tcp.{_suffix(rules.action)}.")
        config.rules.CopyFrom(rules)
        config.rules.SetInParent()
        filters.append(
            listener_components_pb2.Filter(name=NETWORK_RBAC, typed_config=typed(config))
        )
    return tuple(filters)


def applied_names(applied: AppliedPolicies) -> list[str]:
    """`ACTION namespace/name` of each policy applied (for a listener's metadata), and a
    line saying so when an unknown Pod allows nothing more than the wide policies."""
    names = [f"{p.action.value} {p.namespace}/{p.name}" for p in applied.policies]
    if applied.allow_uncertain:
        names.append("ALLOW nothing (its Pod is not known and ALLOW policies select workloads)")
    return names
