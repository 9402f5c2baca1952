"""CSDS `node_matchers`, compiled once per request and safe against hostile patterns.

Envoy's StringMatcher (exact, prefix, suffix, contains, safe_regex) on the node
id. Regexes run on RE2, which matches in time linear in the input, with a cap
on the pattern's length and RE2's memory, and without RE2 logging parse
errors to pilot's stderr: a caller cannot make one request cost pilot more than
a few microseconds per proxy. Patterns that do not compile, or too many
matchers, are the caller's error (`MatcherError`, INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import re2
from envoy.type.matcher.v3 import node_pb2, string_pb2

MAX_MATCHERS = 32
MAX_PATTERN_LENGTH = 1024
_RE2_MEMORY = 1 << 20  # bytes RE2 may use to compile one pattern

Match = Callable[[str], bool]


class MatcherError(ValueError):
    """A node matcher pilot will not run; the message says why."""


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _RE2_MEMORY
    return options


def _regex(pattern: str) -> Match:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise MatcherError(f"safe_regex longer than {MAX_PATTERN_LENGTH} characters")
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as error:
        raise MatcherError(f"safe_regex does not compile: {error}") from error
    return lambda value: compiled.fullmatch(value) is not None


def compile_string_matcher(matcher: string_pb2.StringMatcher) -> Match:
    """Envoy's StringMatcher as a function of the value."""
    kind = matcher.WhichOneof("match_pattern")
    if kind is None:
        return lambda value: True
    if kind == "safe_regex":
        return _regex(matcher.safe_regex.regex)
    pattern = getattr(matcher, kind)
    if not isinstance(pattern, str):
        raise MatcherError(f"unsupported string matcher {kind}")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise MatcherError(f"{kind} longer than {MAX_PATTERN_LENGTH} characters")
    fold = str.lower if matcher.ignore_case else str
    pattern = fold(pattern)
    tests: dict[str, Callable[[str], bool]] = {
        "exact": lambda value: value == pattern,
        "prefix": lambda value: value.startswith(pattern),
        "suffix": lambda value: value.endswith(pattern),
        "contains": lambda value: pattern in value,
    }
    if kind not in tests:
        raise MatcherError(f"unsupported string matcher {kind}")
    test = tests[kind]
    return lambda value: test(fold(value))


def compile_node_matchers(matchers: Sequence[node_pb2.NodeMatcher]) -> Match:
    """A node id passes if any matcher accepts it (no matchers: every node)."""
    if len(matchers) > MAX_MATCHERS:
        raise MatcherError(f"more than {MAX_MATCHERS} node_matchers")
    compiled = [compile_string_matcher(m.node_id) for m in matchers if m.HasField("node_id")]
    if len(compiled) < len(matchers):
        return lambda node_id: True  # a matcher without node_id matches every node
    if not compiled:
        return lambda node_id: True
    return lambda node_id: any(match(node_id) for match in compiled)
