"""The JSON behind pilot's /debug endpoints: sync state, connections, EDS, registry, config,
pushes.

Everything here reads pilot's live state and returns plain JSON-ready values.
Secrets are redacted as in CSDS: no private key is ever part of a debug answer.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections import Counter
from typing import Any

from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import json_format

from pilot.builders.rbac import applied_names
from pilot.debug.proxy_status import LiveProxies, ProxyStatus, packed
from pilot.generators.inbound_proxies import namespace_of, sidecar_of
from pilot.push.history import PushHistory, PushRecord
from pilot.registry.authorization_policy import AuthorizationPolicies, AuthorizationPolicy
from pilot.registry.destination_rule import DestinationRule
from pilot.registry.index import EndpointIndex
from pilot.registry.istio_config import ConfigKey
from pilot.registry.request_authentication import RequestAuthentication, RequestAuthentications
from pilot.registry.traffic_config import TrafficConfig
from pilot.xds import types
from pilot.xds.cache import ResourceCache

Json = dict[str, Any]


class NotFound(LookupError):
    """The thing asked for does not exist; the message says what."""


class Ambiguous(LookupError):
    """The question names several things; the message says how to pick one."""


def syncz(proxies: LiveProxies) -> list[Json]:
    """Per proxy and type: how many resources are in each sync state."""
    return [_sync_summary(status) for status in proxies.statuses()]


def _sync_summary(status: ProxyStatus) -> Json:
    by_type: dict[str, Counter[str]] = {}
    for resource in status.resources:
        by_type.setdefault(types.short_name(resource.type_url), Counter())[resource.status] += 1
    errors = [
        {"type": types.short_name(r.type_url), "name": r.name, "error": r.error}
        for r in status.resources
        if r.error is not None
    ]
    return {
        "proxy": status.proxy.node_id,
        "identity": status.proxy.identity,
        "streams": list(status.streams),
        "types": {name: dict(counts) for name, counts in sorted(by_type.items())},
        "errors": errors,
    }


def connections(proxies: LiveProxies) -> list[Json]:
    """Every live stream: who, how, since when, subscribed to what."""
    now = time.time()
    found = []
    for connection in sorted(proxies.connections, key=lambda c: c.id):
        subscriptions = {}
        for type_url, names in connection.stream.subscriptions():
            state = connection.stream.state(type_url)
            wildcard = bool(state and state.subscription.wildcard)
            subscriptions[types.short_name(type_url)] = {"wildcard": wildcard, "names": len(names)}
        found.append(
            {
                "id": connection.id,  # its tasks in /debug/tasks are named stream-ID-...
                "proxy": connection.proxy_id,
                "stream": connection.kind.label,
                "peer": connection.peer,
                "identity": connection.identity,
                "connected_seconds": round(now - connection.connected_at, 3),
                "subscriptions": subscriptions,
            }
        )
    return found


def edsz(cache: ResourceCache, cluster: str | None) -> Json:
    """One ClusterLoadAssignment as JSON, or every assignment's version."""
    if cluster is None:
        names = sorted(cache.names(types.ENDPOINT))
        versions = {}
        for name in names:
            resource = cache.get(types.ENDPOINT, name)
            if resource is not None:
                versions[name] = resource.version
        return {"version": cache.version(types.ENDPOINT), "clusters": versions}
    resource = cache.get(types.ENDPOINT, cluster)
    if resource is None:
        raise NotFound(f"no ClusterLoadAssignment named {cluster!r}")
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(resource.payload)
    return {"version": resource.version, "assignment": json_format.MessageToDict(assignment)}


def registryz(index: EndpointIndex) -> Json:
    """The registry as pilot sees it: services (with the clusters that have each) and the
    endpoint sets feeding each (with the cluster each came from)."""
    services = []
    for key in sorted(index.services):
        service = index.services[key]
        services.append(
            {
                "namespace": key.namespace,
                "name": key.name,
                "clusters": index.clusters_of(key),
                "ports": [dataclasses.asdict(port) for port in service.ports],
                "endpoint_sets": [
                    {
                        "kind": s.key.kind,
                        "name": s.key.name,
                        "cluster": s.key.cluster,
                        "groups": _groups(s.groups),
                    }
                    for s in index.endpoint_sets(key)
                ],
            }
        )
    return {"services": services}


def _groups(groups: Any) -> list[Json]:
    return [dataclasses.asdict(group) for group in groups]


def registry_size(index: EndpointIndex) -> Json:
    """How big the registry is: services, and the endpoint sets and endpoints feeding them."""
    sets = [s for key in index.services for s in index.endpoint_sets(key)]
    endpoints = sum(len(group.endpoints) for s in sets for group in s.groups)
    return {"services": len(index.services), "endpoint_sets": len(sets), "endpoints": endpoints}


def pushz(history: PushHistory) -> list[Json]:
    """The last pushes, newest first: what changed, to how many streams, how long it took."""
    return [_push(record) for record in history.newest_first()]


def _push(record: PushRecord) -> Json:
    return dataclasses.asdict(record) | {"at": timestamp(record.at)}


def timestamp(seconds: float) -> str:
    """A wall-clock time as ISO 8601 in UTC, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def config_dump(proxies: LiveProxies, proxy_id: str, identity: str | None = None) -> Json:
    """Everything one proxy subscribes to, with its state and contents (secrets redacted).

    A node id claimed under several identities is several proxies: then
    `identity` must say which one.
    """
    matching = [
        status
        for status in proxies.statuses()
        if status.proxy.node_id == proxy_id and identity in (None, status.proxy.identity)
    ]
    if not matching:
        raise NotFound(f"no connected proxy {proxy_id!r}")
    if len(matching) > 1:
        claimed = ", ".join(str(status.proxy.identity) for status in matching)
        raise Ambiguous(
            f"node id {proxy_id!r} is claimed under several identities ({claimed}):"
            " say which with &identity="
        )
    return _dump(matching[0])


def _dump(status: ProxyStatus) -> Json:
    return {
        "proxy": status.proxy.node_id,
        "identity": status.proxy.identity,
        "streams": list(status.streams),
        "resources": [
            {
                "type": r.type_url,
                "name": r.name,
                "version": r.version,
                "status": str(r.status),
                "error": r.error,
                "resource": json_format.MessageToDict(packed(r.resource)) if r.resource else None,
            }
            for r in status.resources
        ],
    }


def _clients_of_rules(traffic: TrafficConfig, index: EndpointIndex) -> dict[ConfigKey, Json]:
    """Per rule, the namespaces whose sidecars follow it instead of the shared rule, and for
    which services."""
    found: dict[ConfigKey, dict[str, list[str]]] = {}
    for namespace in sorted(traffic.client_namespaces()):
        for key in sorted(traffic.differing(namespace, index.services.keys())):
            rule = traffic.rule_for(key, namespace)
            if rule is not None:
                found.setdefault(rule.key, {}).setdefault(namespace, []).append(str(key))
    return dict(found)


def configz(traffic: TrafficConfig, index: EndpointIndex) -> Json:
    """The Istio objects held: each DestinationRule and VirtualService (with the services
    whose shared clusters a rule shapes, and the namespaces whose sidecars follow it for
    others), and the objects of kinds pilot does not implement."""
    applied: dict[ConfigKey, list[str]] = {}
    for key in sorted(index.services):
        rule = traffic.rule_for(key)
        if rule is not None:
            applied.setdefault(rule.key, []).append(str(key))
    clients = _clients_of_rules(traffic, index)
    objects = []
    for config in traffic.objects():
        entry: Json = {
            "kind": config.key.kind,
            "namespace": config.key.namespace,
            "name": config.key.name,
            "exportTo": list(config.export_to),
        }
        if isinstance(config, DestinationRule):
            entry |= {
                "host": config.host,
                "subsets": [s.name for s in config.subsets],
                "appliedTo": applied.get(config.key, []),
                "sidecarsOf": clients.get(config.key, {}),
            }
        else:
            entry |= {
                "hosts": list(config.hosts),
                "gateways": list(config.gateways),
                "http": len(config.http),
                "tcp": len(config.tcp),
            }
        objects.append(entry)
    unsupported = [
        {"kind": k.kind, "namespace": k.namespace, "name": k.name} for k in traffic.unsupported()
    ]
    return {
        "objects": objects,
        "unsupported": unsupported,
        "unsupportedByKind": dict(sorted(traffic.unsupported_counts().items())),
    }


def _scope(policy: AuthorizationPolicy | RequestAuthentication, root_namespace: str) -> str:
    if policy.selector:
        return "workloads selected" + (
            " in every namespace" if policy.namespace == root_namespace else ""
        )
    return "mesh" if policy.namespace == root_namespace else "namespace"


def authorizationz(
    authz: AuthorizationPolicies,
    proxies: LiveProxies,
    index: EndpointIndex,
    jwt: RequestAuthentications | None = None,
) -> Json:
    """The AuthorizationPolicies and RequestAuthentications held, each with its scope (and
    for a policy what fails closed in it) and the connected sidecars it applies to; and per
    connected sidecar, those applying."""
    jwt = jwt if jwt is not None else RequestAuthentications()
    applying: dict[str, list[str]] = {}
    per_proxy = []
    for status in proxies.statuses():
        where = sidecar_of(status.proxy.node_id)
        if where is None:
            continue
        ip, claimed = where
        namespace = namespace_of(status.proxy, claimed)
        workloads = index.pod_labels_in(namespace, ip)
        applied = authz.policies_for(namespace, workloads)
        verified = jwt.applied(namespace, workloads)
        for key in [p.key for p in applied.policies] + [ra.key for ra in verified.objects]:
            applying.setdefault(str(key), []).append(status.proxy.node_id)
        per_proxy.append(
            {
                "proxy": status.proxy.node_id,
                "identity": status.proxy.identity,
                "policies": applied_names(applied),
                "podUnknownAllowsNothingMore": applied.allow_uncertain,
                "requestAuthentications": [f"{o.namespace}/{o.name}" for o in verified.objects],
            }
        )
    policies = [
        {
            "namespace": policy.namespace,
            "name": policy.name,
            "action": policy.action.value,
            "scope": _scope(policy, authz.root_namespace),
            "selector": dict(policy.selector),
            "rules": len(policy.rules),
            "deniesEverything": policy.deny_all or None,
            "failsClosed": list(policy.fail_closed),
            "appliesTo": applying.get(str(policy.key), []),
        }
        for policy in authz.objects()
    ]
    authentications = [
        {
            "namespace": ra.namespace,
            "name": ra.name,
            "scope": _scope(ra, jwt.root_namespace),
            "selector": dict(ra.selector),
            "issuers": sorted({rule.issuer for rule in ra.rules}),
            "jwksUris": sorted({r.jwks_uri.uri for r in ra.rules if r.jwks_uri is not None}),
            "appliesToNoSidecar": "targetRef(s)" if ra.targeted else None,
            "appliesTo": applying.get(str(ra.key), []),
        }
        for ra in jwt.objects()
    ]
    return {
        "policies": policies,
        "requestAuthentications": authentications,
        "proxies": per_proxy,
    }
