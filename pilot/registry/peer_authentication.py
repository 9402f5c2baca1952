"""PeerAuthentication: which namespaces take plaintext on their sidecars' inbound side.

Istio's `security.istio.io/v1` (and `v1beta1`) kind `PeerAuthentication`,
the part pilot reads: `spec.mtls.mode`, one of UNSET, PERMISSIVE, STRICT,
DISABLE. One without `spec.selector` sets the mode of its namespace; one in the
root namespace (`istio-system`) sets the mesh's, which namespaces that set
none (or UNSET) inherit; with none at all the mode is PERMISSIVE, as Istio's.
Of several namespace-wide ones in one namespace the oldest counts
(`metadata.creationTimestamp`, then name), as Istio's.

A PeerAuthentication with a `spec.selector` that has labels (one workload's
policy; an empty one is namespace-wide, as in Istio's) or
`spec.portLevelMtls` is kept but ignored: pilot has no per-workload or per-port
inbound modes, and half-applying one would be a mode nobody wrote. Each such
object is logged once (a warning) and counted (`ignored`).

The store answers `mode_of(namespace)` and says, for each change, which
namespaces' mode moved (the root namespace's: every namespace's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pilot.logs import clipped

log = logging.getLogger("pilot.registry")

KIND = "PeerAuthentication"
GROUP = "security.istio.io"
VERSIONS = ("v1", "v1beta1")
ROOT_NAMESPACE = "istio-system"  # Istio's default rootNamespace: the mesh-wide policy
MAX_IGNORED_LOGGED = 64  # distinct ignored objects that get their warning line


class MtlsMode(StrEnum):
    """`spec.mtls.mode`."""

    UNSET = "UNSET"
    PERMISSIVE = "PERMISSIVE"
    STRICT = "STRICT"
    DISABLE = "DISABLE"


DEFAULT_MODE = MtlsMode.PERMISSIVE


class PolicyError(ValueError):
    """An object is not a valid PeerAuthentication (the message names it and the field)."""


@dataclass(frozen=True, slots=True, order=True)
class PeerAuthenticationKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        # From a file these are anyone's strings: escaped and cut short for a log line.
        return f"{clipped(self.namespace)}/{clipped(self.name)}"


@dataclass(frozen=True, slots=True)
class PeerAuthentication:
    """What pilot keeps of one PeerAuthentication."""

    key: PeerAuthenticationKey
    mode: MtlsMode = MtlsMode.UNSET
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as text)
    # Why it is ignored ("" when it sets its namespace): a selector, port-level modes.
    ignored: str = ""


def _label(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace, name = meta.get("namespace", "default"), meta.get("name", "?")
    return f"{KIND} {_shown(namespace, 'default')}/{_shown(name, '?')}"


def _shown(value: Any, otherwise: str) -> str:
    """A name for a message: a string, cut short; anything else (of any depth) not shown."""
    return repr(value)[1:-1][:253] if isinstance(value, str) else otherwise


def _mapping(obj: Mapping[str, Any], value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyError(f"{_label(obj)}: {field} must be a mapping")
    return value


def parse_peer_authentication(obj: Mapping[str, Any]) -> PeerAuthentication:
    """One PeerAuthentication object (a dict, as the API server or a file gives it).

    Raises PolicyError on anything malformed: no name, a spec or mtls that is not a
    mapping, a mode that is not one of Istio's four.
    """
    meta = _mapping(obj, obj.get("metadata"), "metadata")
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{_label(obj)}: metadata.name is missing")
    if not isinstance(namespace, str):
        raise PolicyError(f"{_label(obj)}: metadata.namespace must be a string")
    created = meta.get("creationTimestamp")
    created = created if isinstance(created, str) else ""
    spec = _mapping(obj, obj.get("spec"), "spec")
    mtls = _mapping(obj, spec.get("mtls"), "spec.mtls")
    raw = mtls.get("mode", MtlsMode.UNSET.value)
    if not isinstance(raw, str) or raw not in MtlsMode.__members__:
        shown = repr(raw)[:40] if isinstance(raw, str) else f"a {type(raw).__name__}"
        raise PolicyError(
            f"{_label(obj)}: spec.mtls.mode {shown} is not one of"
            f" {', '.join(m.value for m in MtlsMode)}"
        )
    selector = _mapping(obj, spec.get("selector"), "spec.selector")
    labels = _mapping(obj, selector.get("matchLabels"), "spec.selector.matchLabels")
    ignored = ""
    if labels:  # an empty selector selects the namespace, as in Istio
        ignored = "it has a selector (per-workload policies are not supported)"
    elif spec.get("portLevelMtls") is not None:
        ignored = "it has portLevelMtls (per-port modes are not supported)"
    return PeerAuthentication(
        PeerAuthenticationKey(namespace, name), MtlsMode(raw), created, ignored
    )


class PeerAuthentications:
    """Every PeerAuthentication known, and the mode each namespace has from them."""

    def __init__(self, root_namespace: str = ROOT_NAMESPACE) -> None:
        self.root_namespace = root_namespace
        self._objects: dict[PeerAuthenticationKey, PeerAuthentication] = {}
        self._in: dict[str, dict[str, PeerAuthentication]] = {}  # namespace -> name -> it
        self._modes: dict[str, MtlsMode] = {}  # namespace -> its own mode (not UNSET)
        self.ignored = 0  # ignored objects seen (selector, portLevelMtls): a counter
        self._warned: set[PeerAuthenticationKey] = set()

    def mode_of(self, namespace: str) -> MtlsMode:
        """The mode of a namespace's sidecars: its own, else the mesh's, else PERMISSIVE."""
        own = self._modes.get(namespace)
        if own is not None:
            return own
        return self._modes.get(self.root_namespace, DEFAULT_MODE)

    def upsert(self, policy: PeerAuthentication) -> frozenset[str]:
        """Add or change one; returns the namespaces whose mode moved."""
        if self._objects.get(policy.key) == policy:
            return frozenset()
        if policy.ignored:
            self._note_ignored(policy)
        self._objects[policy.key] = policy
        self._in.setdefault(policy.key.namespace, {})[policy.key.name] = policy
        return self._recompute({policy.key.namespace})

    def delete(self, key: PeerAuthenticationKey) -> frozenset[str]:
        if self._objects.pop(key, None) is None:
            return frozenset()
        here = self._in[key.namespace]
        del here[key.name]
        if not here:
            del self._in[key.namespace]
        return self._recompute({key.namespace})

    def replace_all(self, policies: Iterable[PeerAuthentication]) -> frozenset[str]:
        """Make the store hold exactly these (a file reload)."""
        wanted = {p.key: p for p in policies}
        if wanted == self._objects:
            return frozenset()
        touched = {k.namespace for k in wanted.keys() ^ self._objects.keys()}
        touched |= {k.namespace for k, p in wanted.items() if self._objects.get(k) != p}
        for policy in wanted.values():
            if policy.ignored and self._objects.get(policy.key) != policy:
                self._note_ignored(policy)
        self._objects = wanted
        self._in = {}
        for key, policy in wanted.items():
            self._in.setdefault(key.namespace, {})[key.name] = policy
        return self._recompute(touched)

    def _recompute(self, namespaces: set[str]) -> frozenset[str]:
        moved: set[str] = set()
        for namespace in namespaces:
            mode = self._own_mode(namespace)
            if self._modes.get(namespace) == mode:
                continue
            if mode is None:
                del self._modes[namespace]
            else:
                self._modes[namespace] = mode
            moved.add(namespace)
        return frozenset(moved)

    def _own_mode(self, namespace: str) -> MtlsMode | None:
        """The oldest namespace-wide policy's mode (None: none, or UNSET)."""
        candidates = [p for p in self._in.get(namespace, {}).values() if not p.ignored]
        if not candidates:
            return None
        oldest = min(candidates, key=lambda p: (p.created, p.key.name))
        return None if oldest.mode is MtlsMode.UNSET else oldest.mode

    def _note_ignored(self, policy: PeerAuthentication) -> None:
        self.ignored += 1
        if policy.key in self._warned or len(self._warned) >= MAX_IGNORED_LOGGED:
            return
        self._warned.add(policy.key)
        log.warning(
            "%s %s is ignored: %s; its namespace keeps its mode (%s)",
            KIND,
            policy.key,
            policy.ignored,
            self.mode_of(policy.key.namespace).value,
        )
