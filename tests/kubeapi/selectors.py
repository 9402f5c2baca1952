"""Label and field selectors, parsed and matched the way kube-apiserver does.

Label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`,
`k>N`, `k<N`; a comma means AND. `!=` and `notin` also match objects without
the label. Field selectors: `path=v`, `path==v`, `path!=v` on any dotted path of
the object (metadata.name, metadata.namespace, type, spec.nodeName, ...).
Parse errors raise ValueError with a kube-apiserver-like message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^({_KEY})\s+(in|notin)\s*\((.*)\)$")
_EQ_RE = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_CMP_RE = re.compile(rf"^({_KEY})\s*([<>])\s*(-?\d+)$")
_EXISTS_RE = re.compile(rf"^({_KEY})$")
_NOT_EXISTS_RE = re.compile(rf"^!\s*({_KEY})$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        return present and _compare(value, self.op, int(self.values[0]))


def _compare(value: str, op: str, bound: int) -> bool:
    try:
        number = int(value)
    except ValueError:
        return False
    return number > bound if op == ">" else number < bound


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t.strip() for t in terms]


def _parse_requirement(term: str) -> Requirement:
    if m := _SET_RE.match(term):
        values = tuple(v.strip() for v in m.group(3).split(","))
        if not all(_VALUE_RE.match(v) for v in values):
            raise ValueError(f"unable to parse requirement: invalid values in {term!r}")
        return Requirement(m.group(1), m.group(2), values)
    if m := _EQ_RE.match(term):
        op = "=" if m.group(2) in ("=", "==") else "!="
        return Requirement(m.group(1), op, (m.group(3),))
    if m := _CMP_RE.match(term):
        return Requirement(m.group(1), m.group(2), (m.group(3),))
    if m := _NOT_EXISTS_RE.match(term):
        return Requirement(m.group(1), "!")
    if m := _EXISTS_RE.match(term):
        return Requirement(m.group(1), "exists")
    raise ValueError(f"unable to parse requirement: found {term!r}")


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    """Parse a labelSelector query value; empty means "everything"."""
    if not text or not text.strip():
        return ()
    return tuple(_parse_requirement(term) for term in _split_terms(text))


@dataclass(frozen=True)
class FieldRequirement:
    """One term of a field selector."""

    path: str
    value: str
    negate: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.path) == self.value) != self.negate


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted path into obj; "" when absent."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


def parse_field_selector(text: str | None) -> tuple[FieldRequirement, ...]:
    """Parse a fieldSelector query value; empty means "everything"."""
    if not text or not text.strip():
        return ()
    result: list[FieldRequirement] = []
    for term in _split_terms(text):
        for op in ("!=", "==", "="):
            if op in term:
                path, value = term.split(op, 1)
                result.append(FieldRequirement(path.strip(), value.strip(), op == "!="))
                break
        else:
            raise ValueError(f"invalid selector: {term!r}; can't understand {term!r}")
    return tuple(result)


@dataclass(frozen=True)
class Selector:
    """labelSelector AND fieldSelector AND (optionally) a namespace."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()
    namespace: str | None = None

    @classmethod
    def parse(
        cls, label_selector: str | None, field_selector: str | None, namespace: str | None
    ) -> Selector:
        return cls(
            parse_label_selector(label_selector), parse_field_selector(field_selector), namespace
        )

    @property
    def filters_content(self) -> bool:
        """True when the selector looks at more than the namespace."""
        return bool(self.labels or self.fields)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(
            f.matches(obj) for f in self.fields
        )
