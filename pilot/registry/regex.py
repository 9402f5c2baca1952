"""Regexes from users' objects, checked as Envoy's RE2 will compile them.

A VirtualService's uri, header and query-parameter regexes end up in Envoy's
`safe_regex` (Google RE2). Python's `re` accepts what RE2 refuses (lookaround,
backreferences, possessive quantifiers), and RE2 refuses programs larger than
Envoy's `re2.max_program_size.error_level` (100 unless the operator's runtime
says otherwise): either would make Envoy reject the whole route configuration.
So each regex is compiled here by RE2 itself (the `google-re2` wheel), with a
memory budget, and its program size held to Envoy's limit; its length is bounded
first, so no object can make pilot compile for long.
"""

from __future__ import annotations

import re2

MAX_REGEX_LENGTH = 1024  # characters of one regex
ENVOY_MAX_PROGRAM_SIZE = 100  # Envoy's default re2.max_program_size.error_level
_RE2_MEMORY = 1 << 20  # bytes RE2 may use to compile one


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _RE2_MEMORY
    return options


def re2_problem(pattern: str) -> str | None:
    """Why Envoy would refuse `pattern` (None: it compiles within Envoy's limits)."""
    if len(pattern) > MAX_REGEX_LENGTH:
        return f"is longer than {MAX_REGEX_LENGTH} characters"
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as error:
        detail = error.args[0] if error.args else error
        text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        return f"is not a valid RE2 regex ({text[:120]})"
    size = compiled.programsize
    if size > ENVOY_MAX_PROGRAM_SIZE:
        return (
            f"is too complex for Envoy (RE2 program size {size}, at most {ENVOY_MAX_PROGRAM_SIZE})"
        )
    return None
