"""PeerAuthentication: the mTLS mode of each port of each sidecar's inbound side.

Istio's `security.istio.io/v1` (and `v1beta1`) kind `PeerAuthentication`, the
part pilot reads: `spec.mtls.mode` (UNSET, PERMISSIVE, STRICT, DISABLE),
`spec.selector.matchLabels` and `spec.portLevelMtls` (port -> mode).

Three levels, the narrowest that says something wins, as Istio's: a workload
policy (a selector with labels, matched against the proxy's own Pod's labels),
the namespace's (no selector, or an empty one), the mesh's (no selector, in the
root namespace `istio-system`); else PERMISSIVE. At each level a port's mode is
the level's `portLevelMtls` entry for that port, else the level's mode; UNSET
says nothing (the next level decides). Of several policies at one level the
oldest counts (`metadata.creationTimestamp`, then name), as Istio's.

Where pilot honours what the operator wrote beyond istiod (which ignores both):
`portLevelMtls` on a namespace-wide or mesh policy applies (port level over
that level), and a selector in the root namespace selects workloads of every
namespace (as Istio's API documents), below a namespace's own workload
policies. Ignoring either would leave plaintext on ports written STRICT.

Where pilot cannot tell which workload policy selects a proxy (its Pod is not
known yet, or several Pods of its namespace claim its IP), every policy that
could gives its mode and the strictest wins per port (DISABLE < PERMISSIVE <
STRICT): `WorkloadModes.uncertain` says so, for the caller's warning and counter.

A port-level port out of 1..65535 or not an integer, a selector that is not a
mapping of strings, more than `MAX_PORT_LEVEL_MTLS` ports or `MAX_SELECTOR_LABELS`
labels: the object is refused (`PolicyError`, one line), and the last good
state keeps serving. The bounds are those of Istio's CRD, so that nothing the API
server admits is refused here: an ignored STRICT policy would fail open.

The store answers `modes_for(namespace, labels)` and says, for each change,
which namespaces' proxies to reconsider (the root namespace's: every one's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pilot.logs import clipped

KIND = "PeerAuthentication"
GROUP = "security.istio.io"
VERSIONS = ("v1", "v1beta1")
ROOT_NAMESPACE = "istio-system"  # Istio's default rootNamespace: the mesh-wide policy
# The bounds are Istio's CRD's (every port once; its matchLabels maxProperties), so every
# object the API server admits is applied: a refused STRICT policy would leave plaintext.
MAX_PORT_LEVEL_MTLS = 65535  # portLevelMtls entries of one object
MAX_SELECTOR_LABELS = 4096  # matchLabels entries of one object
MAX_LABEL_CHARS = 317  # a Kubernetes label key: a 253-char prefix, '/', 63 chars

Labels = tuple[tuple[str, str], ...]  # sorted (key, value) pairs


class MtlsMode(StrEnum):
    """`spec.mtls.mode`."""

    UNSET = "UNSET"
    PERMISSIVE = "PERMISSIVE"
    STRICT = "STRICT"
    DISABLE = "DISABLE"


DEFAULT_MODE = MtlsMode.PERMISSIVE
# Which of two modes is stronger, where pilot must pick without knowing (fail closed).
_STRENGTH = {MtlsMode.DISABLE: 0, MtlsMode.PERMISSIVE: 1, MtlsMode.STRICT: 2}


def strictest(modes: Iterable[MtlsMode]) -> MtlsMode:
    return max(modes, key=_STRENGTH.__getitem__)


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
    selector: Labels = ()  # matchLabels; () selects the whole namespace
    ports: tuple[tuple[int, MtlsMode], ...] = ()  # portLevelMtls, sorted, UNSET left out

    @property
    def age(self) -> tuple[str, str]:
        """What sorts the oldest first."""
        return self.created, self.key.name

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.selector)

    def mode_at(self, port: int | None) -> MtlsMode:
        """This level's mode for `port` (None: the level's own); UNSET: it says nothing."""
        if port is not None:
            for number, mode in self.ports:
                if number == port:
                    return mode
        return self.mode


@dataclass(frozen=True, slots=True)
class WorkloadModes:
    """One workload's modes: its own, and the ports whose mode differs from it."""

    mode: MtlsMode
    ports: tuple[tuple[int, MtlsMode], ...] = ()  # sorted; only where not `mode`
    uncertain: bool = False  # its workload policy could not be told: the strictest taken

    def at(self, port: int) -> MtlsMode:
        return dict(self.ports).get(port, self.mode)


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


def _mode(obj: Mapping[str, Any], mtls: Mapping[str, Any], field: str) -> MtlsMode:
    raw = mtls.get("mode", MtlsMode.UNSET.value)
    if not isinstance(raw, str) or raw not in MtlsMode.__members__:
        shown = repr(raw)[:40] if isinstance(raw, str) else f"a {type(raw).__name__}"
        raise PolicyError(
            f"{_label(obj)}: {field} {shown} is not one of {', '.join(m.value for m in MtlsMode)}"
        )
    return MtlsMode(raw)


def _selector(obj: Mapping[str, Any], spec: Mapping[str, Any]) -> Labels:
    selector = _mapping(obj, spec.get("selector"), "spec.selector")
    labels = _mapping(obj, selector.get("matchLabels"), "spec.selector.matchLabels")
    if len(labels) > MAX_SELECTOR_LABELS:
        raise PolicyError(
            f"{_label(obj)}: spec.selector.matchLabels has {len(labels)} labels"
            f" (at most {MAX_SELECTOR_LABELS})"
        )
    for key, value in labels.items():
        if not (isinstance(key, str) and isinstance(value, str)) or not key:
            raise PolicyError(f"{_label(obj)}: spec.selector.matchLabels must map strings")
        if len(key) > MAX_LABEL_CHARS or len(value) > MAX_LABEL_CHARS:
            raise PolicyError(f"{_label(obj)}: spec.selector.matchLabels has an overlong label")
    return tuple(sorted(labels.items()))


def _port_number(obj: Mapping[str, Any], raw: Any) -> int:
    """A portLevelMtls key: an integer 1..65535 (a YAML int, or digits as JSON gives it)."""
    number = -1
    if isinstance(raw, int) and not isinstance(raw, bool):
        number = raw
    elif isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 5:
        number = int(raw)
    if not 1 <= number <= 65535:
        shown = repr(raw)[:20] if isinstance(raw, (str, int)) else f"a {type(raw).__name__}"
        raise PolicyError(f"{_label(obj)}: spec.portLevelMtls port {shown} is not 1..65535")
    return number


def _port_level(
    obj: Mapping[str, Any], spec: Mapping[str, Any]
) -> tuple[tuple[int, MtlsMode], ...]:
    entries = _mapping(obj, spec.get("portLevelMtls"), "spec.portLevelMtls")
    if len(entries) > MAX_PORT_LEVEL_MTLS:
        raise PolicyError(
            f"{_label(obj)}: spec.portLevelMtls has {len(entries)} ports"
            f" (at most {MAX_PORT_LEVEL_MTLS})"
        )
    ports: dict[int, MtlsMode] = {}
    for raw, value in entries.items():
        port = _port_number(obj, raw)
        where = f"spec.portLevelMtls[{port}]"
        mode = _mode(obj, _mapping(obj, value, where), f"{where}.mode")
        if port in ports:  # "80" and 80 in one YAML mapping
            raise PolicyError(f"{_label(obj)}: spec.portLevelMtls names port {port} twice")
        ports[port] = mode
    return tuple(sorted((p, m) for p, m in ports.items() if m is not MtlsMode.UNSET))


def parse_peer_authentication(obj: Mapping[str, Any]) -> PeerAuthentication:
    """One PeerAuthentication object (a dict, as the API server or a file gives it).

    Raises PolicyError on anything malformed: no name, a spec, mtls or selector that is
    not a mapping, a mode that is not one of Istio's four, a port that is not 1..65535.
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
    mode = _mode(obj, _mapping(obj, spec.get("mtls"), "spec.mtls"), "spec.mtls.mode")
    return PeerAuthentication(
        PeerAuthenticationKey(namespace, name),
        mode,
        created,
        _selector(obj, spec),
        _port_level(obj, spec),
    )


def _resolve(levels: Sequence[PeerAuthentication], ports: Iterable[int]) -> WorkloadModes:
    """Modes from the levels that apply, narrowest first; the first that says wins."""

    def at(port: int | None) -> MtlsMode:
        for level in levels:
            mode = level.mode_at(port)
            if mode is not MtlsMode.UNSET:
                return mode
        return DEFAULT_MODE

    own = at(None)
    differ = ((p, at(p)) for p in sorted(set(ports)))
    return WorkloadModes(own, tuple((p, m) for p, m in differ if m is not own))


def _merge_strictest(options: Sequence[WorkloadModes]) -> WorkloadModes:
    """Per port, the strictest of what each option gives."""
    own = strictest(o.mode for o in options)
    ports = sorted({p for o in options for p, _ in o.ports})
    differ = ((p, strictest(o.at(p) for o in options)) for p in ports)
    return WorkloadModes(own, tuple((p, m) for p, m in differ if m is not own), uncertain=True)


class PeerAuthentications:
    """Every PeerAuthentication known, and the modes each workload has from them."""

    def __init__(self, root_namespace: str = ROOT_NAMESPACE) -> None:
        self.root_namespace = root_namespace
        self._objects: dict[PeerAuthenticationKey, PeerAuthentication] = {}
        self._in: dict[str, dict[str, PeerAuthentication]] = {}  # namespace -> name -> it
        # Per namespace: its oldest namespace-wide policy, and its workload policies,
        # oldest first (recomputed when one of its policies changes).
        self._wide: dict[str, PeerAuthentication] = {}
        self._selecting: dict[str, tuple[PeerAuthentication, ...]] = {}

    def mode_of(self, namespace: str) -> MtlsMode:
        """The mode of a namespace's sidecars that no workload policy selects."""
        return self.modes_for(namespace, [{}]).mode

    def has_workload_policies(self, namespace: str) -> bool:
        """Whether a workload policy could select a proxy of `namespace`."""
        return namespace in self._selecting or self.root_namespace in self._selecting

    def modes_for(self, namespace: str, workloads: Sequence[Mapping[str, str]]) -> WorkloadModes:
        """The modes of a proxy of `namespace` whose Pod has one of these label sets.

        No label set (its Pod is unknown): any of the workload policies there could
        select it, or none; with several, they could be any. Either way, where workload
        policies exist the strictest of their outcomes is taken (`uncertain`).
        """
        wide = [p for p in (self._wide.get(namespace), self._mesh_wide()) if p is not None]
        if not self.has_workload_policies(namespace):
            return _resolve(wide, self._ports_of(wide))
        candidates = self._candidates(namespace, workloads)
        if len(candidates) == 1:
            chosen = [c for c in candidates if c is not None]
            levels = chosen + wide
            return _resolve(levels, self._ports_of(levels))
        ports = self._ports_of([*wide, *(c for c in candidates if c is not None)])
        options = [_resolve([c, *wide] if c is not None else wide, ports) for c in candidates]
        return _merge_strictest(options)

    def _mesh_wide(self) -> PeerAuthentication | None:
        return self._wide.get(self.root_namespace)

    def _candidates(
        self, namespace: str, workloads: Sequence[Mapping[str, str]]
    ) -> list[PeerAuthentication | None]:
        """The workload policy each possible label set gets (None: none selects it)."""
        own = self._selecting.get(namespace, ())
        mesh = (
            self._selecting.get(self.root_namespace, ()) if namespace != self.root_namespace else ()
        )
        if not workloads:
            return [None, *own, *mesh]
        chosen: list[PeerAuthentication | None] = []
        for labels in workloads:
            policy = _oldest_selecting(own, labels) or _oldest_selecting(mesh, labels)
            if policy not in chosen:
                chosen.append(policy)
        return chosen

    @staticmethod
    def _ports_of(levels: Iterable[PeerAuthentication]) -> set[int]:
        return {port for level in levels for port, _ in level.ports}

    def upsert(self, policy: PeerAuthentication) -> frozenset[str]:
        """Add or change one; returns the namespaces whose proxies to reconsider."""
        if self._objects.get(policy.key) == policy:
            return frozenset()
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
        self._objects = wanted
        self._in = {}
        for key, policy in wanted.items():
            self._in.setdefault(key.namespace, {})[key.name] = policy
        return self._recompute(touched)

    def _recompute(self, namespaces: set[str]) -> frozenset[str]:
        """Re-sort the namespaces' levels; returns those whose levels moved."""
        moved: set[str] = set()
        for namespace in namespaces:
            here = sorted(self._in.get(namespace, {}).values(), key=lambda p: p.age)
            wide = next((p for p in here if not p.selector), None)
            selecting = tuple(p for p in here if p.selector)
            if (
                self._wide.get(namespace) == wide
                and self._selecting.get(namespace, ()) == selecting
            ):
                continue
            _put(self._wide, namespace, wide)
            _put(self._selecting, namespace, selecting or None)
            moved.add(namespace)
        return frozenset(moved)


def _oldest_selecting(
    policies: Sequence[PeerAuthentication], labels: Mapping[str, str]
) -> PeerAuthentication | None:
    """The first (oldest) of `policies` that selects `labels`."""
    return next((p for p in policies if p.selects(labels)), None)


def _put(table: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value
