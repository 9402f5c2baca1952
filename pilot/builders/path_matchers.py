"""An AuthorizationPolicy's `paths` as Envoy RBAC permissions, failing closed both ways
(pure).

A path an app receives can be spelled in ways the connection manager's normalization
(`pilot.builders.path_normalization`) leaves alone: another letter case, doubled
slashes, `%2F` or `%5C` for a slash, a trailing slash. Many apps take those for the
same resource. So a path is matched in one of two ways, whichever denies more:

- *widened*, where matching more denies more (a DENY or AUDIT policy's `paths`, an
  ALLOW policy's `notPaths`): one RE2 regex, case-insensitive, in which each `/` of
  the value matches a run of `/`, `\\`, `%2F` or `%5C` (either case) and a trailing
  run of them may follow; literal parts escaped. `/admin/*` keeps its meaning (what
  lies under `/admin/`), `*.php` too (what ends so), `*` is any path. `{*}` is one
  segment (anything but a slash), `{**}` anything. And any path with a `..` segment
  beside an escaped slash or a backslash (`/x/..%2Fdeny`, left so by the
  normalization) matches every widened path: an app that decodes it could land on any.
- *exact*, where matching more allows more (an ALLOW policy's `paths`, a DENY
  policy's `notPaths`): Istio's own matcher (exact, prefix, suffix; case and
  spelling as written), and a prefix, suffix or template form never matches a path
  that holds an escaped slash or a backslash (an app could decode it into another
  path): an odd spelling is denied rather than allowed. `{*}` and `{**}` are
  Envoy's uri_template globs (one segment of its pchar set, the rest).

Envoy refuses a regex whose RE2 program is larger than its
`re2.max_program_size.error_level` (100 unless a bootstrap's runtime says more). A
widened regex that would be larger is cut into pieces, each within the bound, all
of which must match (the first anchored at the start, the last at the end): every
path the whole regex matches, and perhaps a few more, which only denies more. An
exact template that does not fit cannot be cut that way (it would allow more): it
is `PathTooComplex`, and its rule fails closed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

import re2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.type.matcher.v3 import path_pb2, regex_pb2, string_pb2

MATCH_ONE = "{*}"
MATCH_ANY = "{**}"
ENVOY_MAX_PROGRAM_SIZE = 100  # Envoy's default re2.max_program_size.error_level
CACHED = 4096  # distinct (path, way) translations kept
_SPECIALS = frozenset("\\.+*?()|[]{}^$")
_SEPARATOR = r"(?:[/\\]|%2f|%5c)"  # under (?i): %2F and %5C too
_SEPARATORS = _SEPARATOR + "+"
_TRAILING = _SEPARATOR + "*"
_WIDE_ONE = r"[^/\\]+"
_ANY = ".*"
# Envoy's uri_template pchar set (RFC 3986's, less `*` and `=`), for exact templates.
_PCHAR = r"a-zA-Z0-9\-._~%!$&'()+,;:@"
_EXACT_ONE = f"[{_PCHAR}]+"
_EXACT_ANY = f"[{_PCHAR}/]*"
# A path with an escaped slash or backslash, or a raw backslash: never exactly matched.
_ODD_SLASH = r".*(?:%2[fF]|%5[cC]|\\).*"
# Characters of one literal token (ASCII, other): any token fits the bound alone.
_LITERAL_PIECE = (16, 6)
# A `..` segment the normalization left because a separator next to it is escaped (or a
# backslash): an app that decodes it resolves it to a path nobody can tell, so every
# widened path matches it (`/x/..%2Fdeny` is `/deny` to such an app).
TRAVERSAL = r"(?i).*[/\\]?(?:%2f|%5c|\\)\.\.(?:[/\\]|%2f|%5c|$).*|.*[/\\]\.\.(?:%2f|%5c|\\).*"
_TEMPLATE = re.compile(r"(\{\*\*\}|\{\*\})")
_FOLDED = {c: f"(?-i:[{c.lower()}{c.upper()}])" for c in "kKsS"}


class PathTooComplex(ValueError):
    """An exact path template whose regex Envoy would refuse (its rule fails closed)."""


def is_template(value: str) -> bool:
    """Whether `value` uses Istio's path templates (`{*}`, `{**}`)."""
    return MATCH_ONE in value or MATCH_ANY in value


def quote_meta(text: str) -> str:
    """`text` as a literal in an RE2 regex (Go's regexp.QuoteMeta's set)."""
    return "".join("\\" + c if c in _SPECIALS else c for c in text)


def _quote_folded(text: str) -> str:
    """`text` as a literal for a case-insensitive regex, each letter matching its ASCII
    cases only: `k` and `s` would fold to the Kelvin sign and the long s too (four
    instructions each), letters other than ASCII keep their case (their folding sets
    can make one character a large program)."""
    return "".join(_FOLDED.get(c, c) if c.isascii() else f"(?-i:{c})" for c in quote_meta(text))


def program_size(pattern: str) -> int:
    """The size of `pattern`'s RE2 program, as Envoy's limit counts it."""
    options = re2.Options()
    options.log_errors = False
    return int(re2.compile(pattern, options).programsize)


def _regex(pattern: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=pattern))


def _url_path(matcher: string_pb2.StringMatcher) -> rbac_pb2.Permission:
    return rbac_pb2.Permission(url_path=path_pb2.PathMatcher(path=matcher))


def _all(permissions: Sequence[rbac_pb2.Permission]) -> rbac_pb2.Permission:
    if len(permissions) == 1:
        return permissions[0]
    return rbac_pb2.Permission(and_rules=rbac_pb2.Permission.Set(rules=permissions))


# -- widened --------------------------------------------------------------------


def _literal_tokens(text: str, one: str, rest: str, quote: Callable[[str], str]) -> list[str]:
    """A part between slashes: its template globs, and its literal text in short pieces."""
    tokens = []
    for part in _TEMPLATE.split(text):
        if part == MATCH_ONE:
            tokens.append(one)
        elif part == MATCH_ANY:
            tokens.append(rest)
        else:
            step = _LITERAL_PIECE[0] if part.isascii() else _LITERAL_PIECE[1]
            tokens += [quote(part[i : i + step]) for i in range(0, len(part), step)]
    return tokens


def widened_tokens(value: str) -> list[str]:
    """The widened regex of `value`, as tokens to be joined (see the module's doc)."""
    if value == "*":
        return [".+"]
    lead, body, trail = [], value, [_TRAILING]
    if not is_template(value) and value.startswith("*"):
        lead, body = [_ANY], value[1:]
    elif not is_template(value) and value.endswith("*"):
        body, trail = value[:-1], [_ANY]
    if body.endswith("/") or body.endswith(MATCH_ANY):
        trail = [] if trail == [_TRAILING] else trail
    tokens = list(lead)
    for part in re.split(r"(/+)", body):
        if part.startswith("/"):
            tokens.append(_SEPARATORS)
        elif part:
            tokens += _literal_tokens(part, _WIDE_ONE, _ANY, _quote_folded)
    return tokens + trail


_FIXED = frozenset({_SEPARATORS, _TRAILING, _ANY, _WIDE_ONE, ".+"})


@functools.cache
def _fixed_cost(token: str) -> int:
    return program_size("(?i)" + token) - program_size("(?i)")


def _cost(token: str) -> int:
    """About what `token` adds to a program: the fixed tokens measured once; a literal an
    instruction a character (`(?-i:[kK])` is one too), doubled a byte when not ASCII.
    The pieces are compiled once made, and cut again where this was wrong."""
    if token in _FIXED:
        return _fixed_cost(token)
    if not token.isascii():
        return 2 * len(token.encode())
    return len(token) - 9 * token.count("(?-i:[")


def _estimated_runs(tokens: Sequence[str], limit: int) -> list[list[str]]:
    """`tokens` in consecutive runs whose estimated program, wrapped in `.*`, fits."""
    budget = limit - program_size("(?i).*.*")
    runs: list[list[str]] = [[]]
    used = 0
    for token in tokens:
        cost = _cost(token)
        if runs[-1] and used + cost > budget:
            runs.append([])
            used = 0
        runs[-1].append(token)
        used += cost
    return runs


def _fitted(run: list[str], limit: int) -> list[list[str]]:
    """`run`, cut in halves until each half compiles within `limit` wrapped in `.*`."""
    if len(run) == 1 or program_size("(?i).*" + "".join(run) + ".*") <= limit:
        return [run]
    half = len(run) // 2
    return _fitted(run[:half], limit) + _fitted(run[half:], limit)


def _pieces(tokens: Sequence[str], limit: int) -> list[list[str]]:
    """`tokens` in consecutive runs, each a regex within `limit` even wrapped in `.*`."""
    return [piece for run in _estimated_runs(tokens, limit) for piece in _fitted(run, limit)]


@functools.lru_cache(maxsize=CACHED)
def widened_regexes(value: str, limit: int = ENVOY_MAX_PROGRAM_SIZE) -> tuple[str, ...]:
    """The regexes that must all match for `value`'s widened form to (one when it fits)."""
    tokens = widened_tokens(value)
    whole = "(?i)" + "".join(tokens)
    if sum(map(_cost, tokens)) <= limit and program_size(whole) <= limit:
        return (whole,)  # a long value is not compiled whole: it could not fit
    runs = _pieces(tokens, limit)
    last = len(runs) - 1
    return tuple(
        "(?i)" + ("" if i == 0 else _ANY) + "".join(run) + ("" if i == last else _ANY)
        for i, run in enumerate(runs)
    )


# -- exact -------------------------------------------------------------------------


@functools.lru_cache(maxsize=CACHED)
def exact_template_regex(value: str) -> str:
    """Envoy's uri_template regex of `value` (slashes as written); PathTooComplex when
    Envoy would refuse it."""
    tokens = []
    for part in re.split(r"(/)", value):
        if part == "/":
            tokens.append("/")
        elif part:
            tokens += _literal_tokens(part, _EXACT_ONE, _EXACT_ANY, quote_meta)
    pattern = "".join(tokens)
    size = program_size(pattern)
    if size > ENVOY_MAX_PROGRAM_SIZE:
        raise PathTooComplex(
            f"path template {value[:64]!r} is too long for Envoy's RE2"
            f" (program size {size}, at most {ENVOY_MAX_PROGRAM_SIZE})"
        )
    return pattern


def _istio_matcher(value: str) -> string_pb2.StringMatcher:
    """Istio's path matcher: `*` any non-empty, `*x` a suffix, `x*` a prefix, else exact."""
    if value == "*":
        return _regex(".+")
    if value.startswith("*"):
        return string_pb2.StringMatcher(suffix=value[1:])
    if value.endswith("*"):
        return string_pb2.StringMatcher(prefix=value[:-1])
    return string_pb2.StringMatcher(exact=value)


def _exact(value: str) -> rbac_pb2.Permission:
    if is_template(value):
        matched = _url_path(_regex(exact_template_regex(value)))
    else:
        matched = _url_path(_istio_matcher(value))
        if value == "*" or not (value.startswith("*") or value.endswith("*")):
            return matched  # any path, or exactly one spelling
    odd = rbac_pb2.Permission(not_rule=_url_path(_regex(_ODD_SLASH)))
    return _all([matched, odd])


def path_permission(value: str, widened: bool) -> rbac_pb2.Permission:
    """The permission of one `paths` value, widened or exact (see the module's doc);
    raises PathTooComplex for an exact template Envoy would refuse."""
    if not widened:
        return _exact(value)
    spellings = _all([_url_path(_regex(r)) for r in widened_regexes(value)])
    if value == "*":
        return spellings
    traversal = _url_path(_regex(TRAVERSAL))
    return rbac_pb2.Permission(or_rules=rbac_pb2.Permission.Set(rules=[spellings, traversal]))
