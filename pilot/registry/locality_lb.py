"""A DestinationRule's `loadBalancer.localityLbSetting`, read as Istio validates it.

    LocalityLbSetting(enabled, distribute, failover)
      enabled     False only when written `enabled: false` (locality load balancing off)
      distribute  (Distribute(source, to: ((locality, weight), ...)), ...): the share of
                  traffic each endpoint locality gets from proxies in `source`
      failover    ((from region, to region), ...): where a region's proxies go next

Istio's rules (pkg/config/validation, `ValidateLocalityLbSetting`): not both
`distribute` and `failover`; each `to` map's weights in 1..100 summing to 100; a
locality is `region[/zone[/subzone]]` with no empty part and at most one `*`, last;
the `from` localities of `distribute` do not overlap, nor the keys of one `to`;
a failover names two different regions, without `/` or `*`.

Where pilot is narrower than Istio, the object is refused with a message naming the
field: `failoverPriority` (it orders endpoints by the calling proxy's own labels,
which would give every distinct set of pod labels its own copy of each assignment;
pilot builds one per locality), and a locality naming a sub-zone other than `*`
(pilot places endpoints by region and zone only, so a sub-zone would match
nothing). Lists are bounded (`MAX_LOCALITY_ENTRIES`): every assignment rebuild of
the service walks them once per proxy locality.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pilot.logs import clipped
from pilot.registry.istio_config import MAX_NAME, Reader

MAX_LOCALITY_ENTRIES = 64  # distribute entries, localities of one `to`, failover entries
WILDCARD = "*"

_SETTING = frozenset({"enabled", "distribute", "failover", "failoverPriority"})
_DISTRIBUTE = frozenset({"from", "to"})
_FAILOVER = frozenset({"from", "to"})


@dataclass(frozen=True, slots=True)
class Distribute:
    """From proxies in `source`, each endpoint locality of `to` gets its weight (%)."""

    source: str
    to: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class LocalityLbSetting:
    enabled: bool = True
    distribute: tuple[Distribute, ...] = ()
    failover: tuple[tuple[str, str], ...] = ()


def read_locality_lb(reader: Reader, value: Any, where: str) -> LocalityLbSetting:
    """The setting at `where`; raises ConfigError naming the field."""
    spec = reader.mapping(value, where, _SETTING)
    if spec.get("failoverPriority") is not None:
        raise reader.fail(
            f"{where}.failoverPriority",
            "is not supported by pilot (it would order endpoints by each proxy's own pod "
            "labels; pilot orders them by locality)",
        )
    enabled = spec.get("enabled")
    distribute = _distribute(reader, spec.get("distribute"), f"{where}.distribute")
    failover = _failover(reader, spec.get("failover"), f"{where}.failover")
    if distribute and failover:
        raise reader.fail(where, "can not give both distribute and failover")
    return LocalityLbSetting(
        enabled=True if enabled is None else reader.boolean(enabled, f"{where}.enabled"),
        distribute=distribute,
        failover=failover,
    )


def _distribute(reader: Reader, value: Any, where: str) -> tuple[Distribute, ...]:
    entries = reader.items(value, where, MAX_LOCALITY_ENTRIES)
    found = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        spec = reader.mapping(entry, at, _DISTRIBUTE)
        source = _locality(reader, spec.get("from"), f"{at}.from")
        found.append(Distribute(source, _weights(reader, spec.get("to"), f"{at}.to")))
    _no_overlap(reader, [d.source for d in found], f"{where}[].from")
    return tuple(found)


def _weights(reader: Reader, value: Any, where: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, Mapping) or not value:
        raise reader.fail(where, "must be a non-empty mapping of localities to weights")
    if len(value) > MAX_LOCALITY_ENTRIES:
        raise reader.fail(where, f"has {len(value)} entries (at most {MAX_LOCALITY_ENTRIES})")
    reader.count(len(value), where)
    weights = {}
    for key, weight in value.items():
        locality = _locality(reader, key, f"{where} key")
        weights[locality] = reader.integer(weight, f"{where}[{clipped(locality, 60)}]", 1, 100)
    total = sum(weights.values())
    if total != 100:
        raise reader.fail(where, f"weights sum to {total}, not 100")
    # A map has no order (Istio's check, and its matching, follow Go's random one): the
    # keys must not overlap in either order.
    _no_overlap(reader, sorted(weights), f"{where} keys")
    _no_overlap(reader, sorted(weights, reverse=True), f"{where} keys")
    return tuple(sorted(weights.items()))


def _failover(reader: Reader, value: Any, where: str) -> tuple[tuple[str, str], ...]:
    found = []
    for i, entry in enumerate(reader.items(value, where, MAX_LOCALITY_ENTRIES)):
        at = f"{where}[{i}]"
        spec = reader.mapping(entry, at, _FAILOVER)
        source = _region(reader, spec.get("from"), f"{at}.from")
        target = _region(reader, spec.get("to"), f"{at}.to")
        if source == target:
            raise reader.fail(at, "must name two different regions")
        found.append((source, target))
    return tuple(found)


def _region(reader: Reader, value: Any, where: str) -> str:
    text = reader.string(value, where, MAX_NAME)
    if not text or "/" in text or WILDCARD in text:
        raise reader.fail(where, "must be a region (no '/', no '*')")
    return text


def _locality(reader: Reader, value: Any, where: str) -> str:
    """`region[/zone[/subzone]]`, at most one `*`, last; a sub-zone only as `*`."""
    text = reader.string(value, where, MAX_NAME)
    shown = clipped(text, 60)
    stars = text.count(WILDCARD)
    if stars > 1 or (stars and not text.endswith(WILDCARD)):
        raise reader.fail(where, f"{shown!r}: a '*' may only come once, at the end")
    parts = text.split("/", 2)
    if any(not part for part in parts):
        raise reader.fail(where, f"{shown!r} has an empty region, zone or sub-zone")
    if any(WILDCARD in part and part != WILDCARD for part in parts):
        raise reader.fail(where, f"{shown!r}: '*' must be a whole region, zone or sub-zone")
    if len(parts) == 3 and parts[2] != WILDCARD:
        raise reader.fail(where, f"{shown!r} names a sub-zone (pilot places endpoints by zone)")
    return text


def _no_overlap(reader: Reader, localities: list[str], where: str) -> None:
    """Istio's rule, in order: a locality given twice, one inside a `*` or a region given
    before it, or a region after one of its zones, overlaps (a `*` counts as a name: a
    catch-all after specific localities is allowed, as Istio allows it)."""
    regions: dict[str, dict[str, set[str]]] = {}
    for locality in localities:
        if WILDCARD in regions or _overlaps(regions, locality.split("/")):
            raise reader.fail(where, f"{clipped(locality, 60)!r} overlaps another locality")


def _overlaps(regions: dict[str, dict[str, set[str]]], parts: list[str]) -> bool:
    """Whether `parts` overlaps what `regions` holds; records it if not."""
    region, zones = parts[0], regions.get(parts[0])
    if len(parts) == 1:
        regions[region] = {WILDCARD: {WILDCARD}}
        return zones is not None
    if zones is None:
        zones = regions[region] = {}
    if WILDCARD in zones:
        return True
    subzones = zones.get(parts[1])
    if len(parts) == 2:
        zones[parts[1]] = {WILDCARD}
        return subzones is not None
    if subzones is not None and (WILDCARD in subzones or parts[2] in subzones):
        return True
    zones.setdefault(parts[1], set()).add(parts[2])
    return False
