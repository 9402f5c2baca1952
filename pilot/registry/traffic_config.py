"""The Istio traffic objects pilot holds: DestinationRules, VirtualServices, and the kinds
it does not implement, with the last good version of each object.

Sources hand over parsed objects (`upsert`, `delete`, or a file's whole set with
`replace_all`, which names the objects of the file that did not parse: those keep
their last good version, as an informer keeps an object whose update it refused).
Each change answers which hosts' clusters it touched (a DestinationRule's; a
VirtualService touches routes only), so the caller rebuilds only the clusters of
those services.

Which DestinationRule a service's clusters follow (`rule_for`), as Istio's sidecar
scope picks it for a client in namespace C: a rule written in C that C sees
(`exportTo` absent, `*`, `.` or naming C), else one in the service's namespace
exported to C (absent, `*`, or naming C), else one in the root namespace
(`istio-system`) exported to C; in each, an exact host before a wildcard one, the
longest wildcard first, and of several the oldest (`creationTimestamp`, then
name). The shared clusters, which every sidecar reads unless its namespace has its
own, follow the rule for no client in particular: one exported to every namespace,
from the service's namespace, else from the root. `client_namespaces` names the
namespaces whose sidecars may see other rules (those that hold a rule, or that a
rule's `exportTo` names), and `differing` the services whose rule is another for
them (`pilot.generators.client_clusters` builds those clusters for them alone).

Unsupported kinds are kept by key only: counted by kind (`unsupported_counts`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable

from pilot.registry.destination_rule import DestinationRule
from pilot.registry.istio_config import (
    EXPORT_SELF,
    ConfigKey,
    exported_to_all,
    host_matches,
)
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
        self._limited: list[DestinationRule] = []  # not exported to every namespace
        self._rules_in: dict[str, list[DestinationRule]] = {}  # by the rule's namespace
        self._with_subsets = 0
        self._kinds_seen: set[str] = set()  # unsupported kinds already warned about
        self._routes_moved: set[str] = set()  # VirtualService hosts moved, not yet taken
        self.rules_generation = 0  # rises with every change of the DestinationRules

    # -- reading -------------------------------------------------------------------

    def objects(self) -> list[Config]:
        return [self._objects[k] for k in sorted(self._objects)]

    def unsupported(self) -> list[ConfigKey]:
        return sorted(self._unsupported)

    def unsupported_counts(self) -> Counter[str]:
        return Counter(key.kind for key in self._unsupported)

    def rule_for(self, service: ServiceKey, client: str | None = None) -> DestinationRule | None:
        """The DestinationRule the clusters of `service` follow for sidecars of namespace
        `client` (None: the shared clusters; see above)."""
        host = service.hostname(self.cluster_domain)
        for namespace in self._tiers(service.namespace, client):
            exact = self._applicable(self._rules_by_host.get(host, ()), namespace, client)
            if exact:
                return exact[0]
            wild = [r for r in self._wildcard_rules if host_matches(r.host, host)]
            wild = self._applicable(wild, namespace, client)
            if wild:
                return max(wild, key=lambda r: (len(r.host), _negated(r.age)))
        return None

    def _tiers(self, owner: str, client: str | None) -> list[str]:
        """The namespaces whose rules are looked at, in order (Istio skips the client's
        own first when it is the root namespace)."""
        tiers = [client] if client is not None and client != self.root_namespace else []
        return [n for n in dict.fromkeys([*tiers, owner, self.root_namespace])]

    @staticmethod
    def _applicable(
        rules: Iterable[DestinationRule], namespace: str, client: str | None
    ) -> list[DestinationRule]:
        found = [r for r in rules if r.key.namespace == namespace and _visible(r, client)]
        return sorted(found, key=lambda r: r.age)

    def client_namespaces(self) -> set[str]:
        """The namespaces whose sidecars may follow another rule than the shared one: those
        holding a rule, and those a rule's `exportTo` names."""
        found = set(self._rules_in)
        for rule in self._limited:
            found.update(n for n in rule.export_to if n != EXPORT_SELF)
        return found

    def differing(self, client: str, services: Collection[ServiceKey]) -> set[ServiceKey]:
        """The services (of `services`) whose clusters follow another rule for sidecars of
        `client` than the shared one. Only a rule the shared clusters cannot take makes a
        difference: one `client` sees that is not exported to every namespace, or one
        written in `client` for another namespace's host; the services those name are
        looked at."""
        suffix = f".{client}.svc.{self.cluster_domain}"
        hosts = [r.host for r in self._limited if _visible(r, client)]
        hosts += [
            r.host
            for r in self._rules_in.get(client, ())
            if exported_to_all(r.export_to)
            and not (r.host.endswith(suffix) and r.host.count(".") == suffix.count(".") + 1)
        ]
        return {
            key
            for key in self.services_of(hosts, services)
            if self.rule_for(key, client) is not self.rule_for(key)
        }

    def subsets_for(self, service: ServiceKey) -> bool:
        """Whether a rule for `service` has subsets, for any client (its pods' labels
        choose the endpoints of some sidecar's clusters)."""
        host = service.hostname(self.cluster_domain)
        rules = [*self._rules_by_host.get(host, ()), *self._wildcard_rules]
        return any(r.subsets and host_matches(r.host, host) for r in rules)

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
        return self._rules_moved(_hosts_of(old) | _hosts_of(config))

    def delete(self, key: ConfigKey) -> set[str]:
        old = self._objects.pop(key, None)
        self._unsupported.discard(key)
        if old is None:
            return set()
        self._reindex()
        self._routes_moved |= _route_hosts_of(old)
        return self._rules_moved(_hosts_of(old))

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
        return self._rules_moved(moved)

    def _rules_moved(self, hosts: set[str]) -> set[str]:
        """Count a change of the DestinationRules (some `hosts` moved)."""
        if hosts:
            self.rules_generation += 1
        return hosts

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
        rules = [*wildcard, *(r for found in by_host.values() for r in found)]
        self._limited = [r for r in rules if not exported_to_all(r.export_to)]
        self._rules_in = {}
        for rule in rules:
            self._rules_in.setdefault(rule.key.namespace, []).append(rule)
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


def _visible(rule: DestinationRule, client: str | None) -> bool:
    """Whether sidecars of namespace `client` see `rule` (None: every namespace does)."""
    if exported_to_all(rule.export_to):
        return True
    if client is None:
        return False
    return client in rule.export_to or (
        EXPORT_SELF in rule.export_to and rule.key.namespace == client
    )


def _negated(age: tuple[str, str]) -> tuple[int, ...]:
    """A key that sorts the oldest last (for max(): the oldest of equal hosts wins)."""
    return tuple(-ord(c) for c in "\0".join(age))
