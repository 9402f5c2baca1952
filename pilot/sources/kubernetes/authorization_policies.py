"""AuthorizationPolicy from the local cluster: Istio's custom resource, listed and watched.

As PeerAuthentication (`peer_authentications.py`): the local cluster only, `v1`
where served, else `v1beta1`, in the watched namespaces and the root one. One
difference, for failing closed: an object that does not parse is not skipped
(skipping it would drop what it denied) but stands in as *deny everything* for
its namespace's sidecars (`refused_policy`), counted and logged as `invalid`.
An API server that serves no AuthorizationPolicy (Istio's CRDs are not
installed) can hold none, so there is nothing to enforce: one warning line.
"""

from __future__ import annotations

from pilot.kube.informer import Obj, WatchFaults
from pilot.registry.authorization_policy import (
    KIND,
    ConfigError,
    parse_authorization_policy,
    refused_policy,
)
from pilot.registry.istio_config import ConfigKey
from pilot.registry.updater import RegistryUpdater
from pilot.runtime.supervisor import describe

PLURAL = "authorizationpolicies"
_PARSE_ERRORS = (ConfigError, TypeError, ValueError, KeyError, AttributeError, RecursionError)


class AuthorizationPolicyHandler:
    """Parses each AuthorizationPolicy into the updater; a bad one denies its namespace."""

    def __init__(self, updater: RegistryUpdater, cluster: str, faults: WatchFaults) -> None:
        self._updater = updater
        self._cluster = cluster
        self._faults = faults

    def upsert(self, obj: Obj) -> None:
        try:
            policy = parse_authorization_policy(obj)
        except _PARSE_ERRORS as error:
            stand_in = refused_policy(obj, error if isinstance(error, ConfigError) else None)
            if stand_in is None:  # not even its name: nothing can stand in for it
                what = str(error) if isinstance(error, ConfigError) else describe(error)
                self._faults.report(self._cluster, KIND, "invalid", f"an invalid {what}")
                return
            # Counted as every refused object is; said once, by the updater (fails closed).
            self._faults.counts[(self._cluster, KIND, "invalid")] += 1
            self._updater.upsert_authorization_policy(stand_in)
            return
        self._updater.upsert_authorization_policy(policy)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete_authorization_policy(ConfigKey(KIND, namespace or "default", name))
