"""The Istio traffic objects pilot holds: DestinationRules, VirtualServices, and the kinds
it does not implement, with the last good version of each object.

Sources hand over parsed objects (`upsert`, `delete`, or a file's whole set with
`replace_all`, which names the objects of the file that did not parse: those keep
their last good version, as an informer keeps an object whose update it refused).
Each change answers which hosts' clusters it touched (a DestinationRule's; a
VirtualService touches routes only), so the caller rebuilds only the clusters of
those services.

Which DestinationRule a service's clusters follow (`rule_for`): pilot builds one
set of clusters for every sidecar, so only a rule that applies to every sidecar
is taken: one exported to every namespace (`exportTo` absent or `*`), from the
service's own namespace, else from the root namespace (`istio-system`); an exact
host before a wildcard one, the longest wildcard first, and of several the oldest
(`creationTimestamp`, then name). A rule exported to fewer namespaces, or written
in a client's namespace for another namespace's service, is held and listed but
applied to no cluster (Istio would give it to those clients alone): the clusters
every sidecar shares never take a policy another namespace's owner wrote for
itself.

Unsupported kinds are kept by key only: counted by kind (`unsupported_counts`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable

from pilot.registry.destination_rule import DestinationRule
from pilot.registry.istio_config import ConfigKey, exported_to_all, host_matches
from pilot.registry.model import ServiceKey
from pilot.registry.virtual_service import VirtualService

ROOT_NAMESPACE = "istio-system"
Config = DestinationRule | VirtualService


def _hosts_of(config: Config | None) -> set[str]:
    """The hosts whose clusters `config` shapes: a DestinationRule's; a VirtualService
    shapes routes only (built elsewhere), so it moves no cluster."""
    if isinstance(config, DestinationRule):
        return {config.host}
    return set()


def _route_hosts_of(config: Config | None) -> set[str]:
    """The hosts whose routes `config` shapes: a VirtualService's."""
    return set(config.hosts) if isinstance(config, VirtualService) else set()


class TrafficConfig:
    """Every DestinationRule and VirtualService held, and the unsupported objects' keys."""

    def __init__(self, cluster_domain: str = "cluster.local", root: str = ROOT_NAMESPACE) -> None:
        self.cluster_domain = cluster_domain
        self.root_namespace = root
        self._objects: dict[ConfigKey, Config] = {}
        self._unsupported: set[ConfigKey] = set()
        self._rules_by_host: dict[str, list[DestinationRule]] = {}
        self._wildcard_rules: list[DestinationRule] = []
        self._with_subsets = 0
        self._kinds_seen: set[str] = set()  # unsupported kinds already warned about
        self._routes_moved: set[str] = set()  # VirtualService hosts moved, not yet taken

    # -- reading -------------------------------------------------------------------

    def objects(self) -> list[Config]:
        return [self._objects[k] for k in sorted(self._objects)]

    def unsupported(self) -> list[ConfigKey]:
        return sorted(self._unsupported)

    def unsupported_counts(self) -> Counter[str]:
        return Counter(key.kind for key in self._unsupported)

    def rule_for(self, service: ServiceKey) -> DestinationRule | None:
        """The DestinationRule every sidecar's clusters of `service` follow (see above)."""
        host = service.hostname(self.cluster_domain)
        for namespace in (service.namespace, self.root_namespace):
            exact = self._applicable(self._rules_by_host.get(host, ()), namespace)
            if exact:
                return exact[0]
            wild = [r for r in self._wildcard_rules if host_matches(r.host, host)]
            wild = self._applicable(wild, namespace)
            if wild:
                return max(wild, key=lambda r: (len(r.host), _negated(r.age)))
        return None

    @staticmethod
    def _applicable(rules: Iterable[DestinationRule], namespace: str) -> list[DestinationRule]:
        found = [r for r in rules if r.key.namespace == namespace and exported_to_all(r.export_to)]
        return sorted(found, key=lambda r: r.age)

    def has_subsets(self) -> bool:
        """Whether any rule held has subsets (else a pod's labels change no cluster)."""
        return self._with_subsets > 0

    def virtual_services(self) -> list[VirtualService]:
        return [o for o in self.objects() if isinstance(o, VirtualService)]

    # -- changing ------------------------------------------------------------------

    def upsert(self, config: Config) -> set[str]:
        """Add or change one object; returns the hosts whose config moved."""
        old = self._objects.get(config.key)
        if old == config:
            return set()
        self._objects[config.key] = config
        self._reindex()
        self._routes_moved |= _route_hosts_of(old) | _route_hosts_of(config)
        return _hosts_of(old) | _hosts_of(config)

    def delete(self, key: ConfigKey) -> set[str]:
        old = self._objects.pop(key, None)
        self._unsupported.discard(key)
        if old is None:
            return set()
        self._reindex()
        self._routes_moved |= _route_hosts_of(old)
        return _hosts_of(old)

    def upsert_unsupported(self, key: ConfigKey) -> set[str]:
        """Note one object of a kind pilot does not build; returns its kind if that kind
        was never seen before (to be warned about once)."""
        self._unsupported.add(key)
        return self._first_seen({key.kind})

    def _first_seen(self, kinds: set[str]) -> set[str]:
        new = kinds - self._kinds_seen
        self._kinds_seen |= new
        return new

    def replace_all(
        self,
        configs: Iterable[Config],
        unsupported: Iterable[ConfigKey] = (),
        refused: Iterable[ConfigKey] = (),
    ) -> set[str]:
        """Hold exactly these (a file's good objects), plus the last good version of each
        `refused` one; returns the hosts whose config moved."""
        wanted: dict[ConfigKey, Config] = {c.key: c for c in configs}
        for key in refused:
            if key not in wanted and key in self._objects:
                wanted[key] = self._objects[key]
        self._unsupported = set(unsupported)
        return self._replace(wanted)

    def take_route_hosts(self) -> set[str]:
        """The hosts whose VirtualServices moved since the last call (their routes are
        rebuilt; `pilot.generators.mesh_routes` picks what each host follows)."""
        moved, self._routes_moved = self._routes_moved, set()
        return moved

    def new_unsupported_kinds(self) -> set[str]:
        """The unsupported kinds held now that were never warned about (now they are)."""
        return self._first_seen({key.kind for key in self._unsupported})

    def _replace(self, wanted: dict[ConfigKey, Config]) -> set[str]:
        if wanted == self._objects:
            return set()
        moved: set[str] = set()
        for key in wanted.keys() | self._objects.keys():
            old, new = self._objects.get(key), wanted.get(key)
            if old != new:
                moved |= _hosts_of(old) | _hosts_of(new)
                self._routes_moved |= _route_hosts_of(old) | _route_hosts_of(new)
        self._objects = wanted
        self._reindex()
        return moved

    def _reindex(self) -> None:
        by_host: dict[str, list[DestinationRule]] = {}
        wildcard: list[DestinationRule] = []
        for config in self._objects.values():
            if not isinstance(config, DestinationRule):
                continue
            if config.host.startswith("*"):
                wildcard.append(config)
            else:
                by_host.setdefault(config.host, []).append(config)
        self._rules_by_host, self._wildcard_rules = by_host, wildcard
        self._with_subsets = sum(
            1 for c in self._objects.values() if isinstance(c, DestinationRule) and c.subsets
        )

    def services_of(
        self, hosts: Iterable[str], services: Collection[ServiceKey]
    ) -> set[ServiceKey]:
        """The services (of `services`) that `hosts`, wildcards included, name: an exact
        host is looked up, only wildcards are matched against every service."""
        found: set[ServiceKey] = set()
        wild = []
        suffix = f".svc.{self.cluster_domain}"
        for host in hosts:
            if host.startswith("*"):
                wild.append(host)
            elif host.endswith(suffix) and host.count(".") == 1 + suffix.count("."):
                name, namespace = host[: -len(suffix)].split(".")
                if (key := ServiceKey(namespace, name)) in services:
                    found.add(key)
        if wild:
            for service in services:
                host = service.hostname(self.cluster_domain)
                if any(host_matches(p, host) for p in wild):
                    found.add(service)
        return found


def _negated(age: tuple[str, str]) -> tuple[int, ...]:
    """A key that sorts the oldest last (for max(): the oldest of equal hosts wins)."""
    return tuple(-ord(c) for c in "\0".join(age))
