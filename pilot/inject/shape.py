"""Reading a pod that came from anyone: each field checked for its JSON type before use.

A review's pod is whatever a client sent (a `spec` that is a list, a name that is a
number); every read goes through these, so a wrong type is an `InjectError` naming
the field, never a KeyError or TypeError out of the template.
"""

from __future__ import annotations

import re
from typing import Any

from pilot.inject.errors import InjectError

# Kubernetes' DNS-1123 label (container names, namespaces) and subdomain (object names).
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SHOWN = 40  # characters of a refused value shown in an error


def shown(value: object) -> str:
    """`value` for a one-line message: repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def mapping(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """parent[key] as an object ({} when absent or null)."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InjectError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def sequence(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    """parent[key] as a list ([] when absent or null)."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InjectError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def objects(parent: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    """parent[key] as a list of objects."""
    items = sequence(parent, key, where)
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InjectError(f"{where}[{index}]: expected an object, got {type(item).__name__}")
    return items


def text(parent: dict[str, Any], key: str, where: str) -> str:
    """parent[key] as a string ("" when absent or null)."""
    value = parent.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InjectError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def strings(parent: dict[str, Any], key: str, where: str) -> dict[str, str]:
    """parent[key] as a map of strings to strings (labels, annotations)."""
    found = mapping(parent, key, where)
    for name, value in found.items():
        if not isinstance(value, str):
            raise InjectError(f"{where}[{shown(name)}]: expected a string")
    return found


def dns_label(value: str, where: str) -> str:
    """`value` when it is a DNS-1123 label (a container name, a namespace)."""
    if not _LABEL.fullmatch(value):
        raise InjectError(f"{where}: {shown(value)} is not a DNS-1123 label")
    return value


def dns_subdomain(value: str, where: str) -> str:
    """`value` when it is empty or a DNS-1123 subdomain (an object's name)."""
    if value and (len(value) > 253 or not _SUBDOMAIN.fullmatch(value)):
        raise InjectError(f"{where}: {shown(value)} is not a DNS-1123 subdomain")
    return value
