"""Authorization paths as RBAC permissions, widened where that denies more and exact
where it would allow more (pure; pilot.builders.path_matchers).

Each permission is evaluated here as Envoy evaluates it (RE2 full matches on the path
without its query, and/or/not), so a test says which requested paths a policy value
matches; real Envoys check the same in tests/integration/test_pod_paths.py.
"""

from __future__ import annotations

import re2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.type.matcher.v3 import string_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.builders.path_matchers import (
    ENVOY_MAX_PROGRAM_SIZE,
    PathTooComplex,
    exact_template_regex,
    path_permission,
    program_size,
    widened_regexes,
)

# The spellings of /deny an app may take for it, under Istio's default normalization.
DENY_SPELLINGS = [
    "/deny", "/DENY", "/Deny", "//deny", "///deny", "/%2Fdeny", "/%2fdeny", "/%5Cdeny",
    "/%5cdeny", "\\deny", "/deny/", "/deny//", "/deny%2F",
]  # fmt: skip
OTHER_PATHS = ["/denyx", "/x/deny", "/allowed", "/de", "/deny.html", "/", ""]


def _string(matcher: string_pb2.StringMatcher, text: str) -> bool:
    kind = matcher.WhichOneof("match_pattern")
    if kind == "exact":
        return text == matcher.exact
    if kind == "prefix":
        return text.startswith(matcher.prefix)
    if kind == "suffix":
        return text.endswith(matcher.suffix)
    assert kind == "safe_regex", kind
    assert program_size(matcher.safe_regex.regex) <= ENVOY_MAX_PROGRAM_SIZE
    return re2.fullmatch(matcher.safe_regex.regex, text) is not None


def matches(permission: rbac_pb2.Permission, path: str) -> bool:
    """Envoy's RBAC on `path` (url_path: the path without its query)."""
    kind = permission.WhichOneof("rule")
    if kind == "url_path":
        return _string(permission.url_path.path, path.partition("?")[0])
    if kind == "and_rules":
        return all(matches(r, path) for r in permission.and_rules.rules)
    if kind == "or_rules":
        return any(matches(r, path) for r in permission.or_rules.rules)
    if kind == "not_rule":
        return not matches(permission.not_rule, path)
    assert kind == "any", kind
    return True


def widened(value: str, path: str) -> bool:
    return matches(path_permission(value, widened=True), path)


def exact(value: str, path: str) -> bool:
    return matches(path_permission(value, widened=False), path)


def test_a_widened_path_matches_every_spelling_of_it_and_no_other_path() -> None:
    for path in DENY_SPELLINGS:
        assert widened("/deny", path), path
        assert widened("/deny", path + "?x=1"), path
    for path in OTHER_PATHS:
        assert not widened("/deny", path), path


def test_a_dot_dot_segment_beside_an_escaped_slash_matches_every_widened_path() -> None:
    """The normalization resolves `/x/../deny` itself; `/x/..%2Fdeny` it leaves, and an
    app that decodes %2F then lands on /deny (or anywhere): widened paths match it."""
    for path in ("/x/..%2Fdeny", "/x%2F..%2Fdeny", "/x/..%5cdeny", "/x\\..\\deny", "/x%2f.."):
        assert widened("/deny", path) and widened("/admin/*", path), path
        assert not exact("/public/*", path.replace("/x", "/public/x")), path
    for path in ("/a..b/c", "/x/...y", "/deny..", "/x/..y%2F"):
        assert not widened("/deny", path), path
    assert widened("*", "/x/..%2Fdeny")


def test_an_exact_path_matches_only_as_written() -> None:
    assert exact("/deny", "/deny") and exact("/deny", "/deny?x=1")
    for path in DENY_SPELLINGS[1:] + OTHER_PATHS:
        assert not exact("/deny", path), path


def test_prefix_and_suffix_forms_keep_their_meaning() -> None:
    for path in ("/admin/", "/admin/x", "/ADMIN//x", "//admin%2Fx/y", "/Admin\\x"):
        assert widened("/admin/*", path), path
    for path in ("/admin", "/administrator", "/x/admin/y"):
        assert not widened("/admin/*", path), path
    for path in ("/a.php", "/x/y.PHP", "/y.php/"):
        assert widened("*.php", path), path
    assert not widened("*.php", "/a.phpx")
    assert widened("*", "/anything") and exact("*", "/anything") and exact("*", "/a%2Fb")


def test_exact_prefixes_and_templates_refuse_escaped_slashes_and_backslashes() -> None:
    """An ALLOW on /public/* must not let in what an app decodes into another path."""
    assert exact("/public/*", "/public/x")
    for path in ("/public/..%2Fadmin", "/public/..%5cadmin", "/public/..\\admin", "/PUBLIC/x"):
        assert not exact("/public/*", path), path
    assert exact("*.css", "/a/b.css") and not exact("*.css", "/a%2F..%2Fb.css")


def test_regex_metacharacters_stay_literal() -> None:
    weird = "/a.b(c)|d[e]^$+*\\x"  # no `?`: it starts a query
    assert widened(weird, weird) and widened(weird, weird.upper())
    assert exact(weird, weird)
    for other in ("/aXb(c)|d[e]^$+*\\x", "/abc", "/a.b(c)", "/a.bc|d[e]^$+*\\x"):
        assert not widened(weird, other) and not exact(weird, other), other


def test_templates_match_one_segment_or_the_rest() -> None:
    one = "/users/{*}/secret"
    for path in ("/users/bob/secret", "/USERS/bob//secret", "/users/a%2Fb/secret"):
        assert widened(one, path), path
    for path in ("/users/a/b/secret", "/users//secret", "/users/bob/secrets"):
        assert not widened(one, path), path
    assert exact(one, "/users/bob/secret") and exact(one, "/users/bob/secret?q=1")
    for path in ("/users/a/b/secret", "/Users/bob/secret", "/users/a%2Fb/secret", "/users//secret"):
        assert not exact(one, path), path
    rest = "/files/{**}"
    for path in ("/files/", "/files/a/b/c", "/FILES//a"):
        assert widened(rest, path), path
    assert exact(rest, "/files/a/b") and exact(rest, "/files/")
    assert not widened(rest, "/files") and not exact(rest, "/files")  # as Envoy's template
    assert not exact(rest, "/files/a%2F..%2F..%2Fetc") and not exact(rest, "/Files/a")


def test_a_long_widened_path_is_cut_into_pieces_that_all_fit_and_all_must_match() -> None:
    value = "/" + "/".join(f"segment{i}" for i in range(60))
    regexes = widened_regexes(value)
    assert len(regexes) > 1
    assert all(program_size(r) <= ENVOY_MAX_PROGRAM_SIZE for r in regexes)
    assert widened(value, value.upper().replace("/", "//"))
    assert not widened(value, value.replace("segment59", "segment5"))
    assert not widened(value, value.replace("segment0/", "segment0x/"))


def test_an_exact_template_envoy_would_refuse_is_too_complex() -> None:
    long = "/" + "a" * 200 + "/{*}"
    try:
        exact_template_regex(long)
    except PathTooComplex as error:
        assert "too long for Envoy's RE2" in str(error)
    else:
        raise AssertionError("a 200-character template fitted Envoy's program size")
    assert widened(long, long.replace("{*}", "X"))  # the widened one is cut instead


_PIECES = [*"/\\%2FfC5c.*+?()[]{}^$|kKsS\u00e9\u212a\x00\n \t#;", "{*}", "{**}", "admin"]


@settings(max_examples=300, deadline=None)
@given(value=st.lists(st.sampled_from(_PIECES), max_size=400).map("".join))
def test_every_widened_regex_compiles_within_envoys_bound_and_matches_its_own_value(
    value: str,
) -> None:
    regexes = widened_regexes(value)
    assert all(program_size(r) <= ENVOY_MAX_PROGRAM_SIZE for r in regexes)
    literal = value.replace("{**}", "x").replace("{*}", "x")
    if value not in ("", "*") and "*" not in literal and "\n" not in literal:
        assert all(re2.fullmatch(r, literal) for r in regexes), (value, regexes)
