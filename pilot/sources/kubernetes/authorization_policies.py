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

from pilot.kube.informer import Obj
from pilot.registry.authorization_policy import (
    KIND,
    AuthorizationPolicy,
    ConfigError,
    parse_authorization_policy,
    refused_policy,
)
from pilot.registry.istio_config import ConfigKey
from pilot.runtime.supervisor import describe
from pilot.sources.kubernetes.policy_handler import PolicyHandler

PLURAL = "authorizationpolicies"


class AuthorizationPolicyHandler(PolicyHandler[AuthorizationPolicy]):
    """Parses each AuthorizationPolicy into the updater; a bad one denies its namespace."""

    def parse(self, obj: Obj) -> AuthorizationPolicy:
        return parse_authorization_policy(obj)

    def refused(self, obj: Obj, error: BaseException) -> None:
        stand_in = refused_policy(obj, error if isinstance(error, ConfigError) else None)
        if stand_in is None:  # not even its name: nothing can stand in for it
            what = str(error) if isinstance(error, ConfigError) else describe(error)
            self._faults.report(self._cluster, KIND, "invalid", f"an invalid {what}")
            return
        # Counted as every refused object is; said once, by the updater (fails closed).
        self._faults.counts[(self._cluster, KIND, "invalid")] += 1
        self._updater.upsert_authorization_policy(stand_in)

    def apply(self, parsed: AuthorizationPolicy) -> None:
        self._updater.upsert_authorization_policy(parsed)

    def remove(self, namespace: str, name: str) -> None:
        self._updater.delete_authorization_policy(ConfigKey(KIND, namespace, name))
