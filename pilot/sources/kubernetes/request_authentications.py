"""RequestAuthentication from the local cluster: Istio's custom resource, listed and watched.

As AuthorizationPolicy (`authorization_policies.py`): the local cluster only,
`v1` where served, else `v1beta1`, in the watched namespaces and the root one. An
object that does not parse is one warning naming it and the field, counted
(`pilot_config_rejected_total{kind}`, and `invalid` in the watch faults) and
skipped: the last good version pilot holds of it keeps applying (dropping one never
opens anything: its issuers then give no request principal).
"""

from __future__ import annotations

from pilot.kube.informer import Obj, WatchFaults
from pilot.registry.istio_config import ConfigError, ConfigKey, key_of
from pilot.registry.request_authentication import (
    KIND,
    parse_request_authentication,
    refusal_of,
)
from pilot.registry.updater import RegistryUpdater

PLURAL = "requestauthentications"
_PARSE_ERRORS = (ConfigError, TypeError, ValueError, KeyError, AttributeError, RecursionError)


class RequestAuthenticationHandler:
    """Parses each RequestAuthentication into the updater; a bad one is said and skipped."""

    def __init__(self, updater: RegistryUpdater, cluster: str, faults: WatchFaults) -> None:
        self._updater = updater
        self._cluster = cluster
        self._faults = faults

    def upsert(self, obj: Obj) -> None:
        try:
            ra = parse_request_authentication(obj)
        except _PARSE_ERRORS as error:
            self._updater.config_refused(key_of(KIND, obj))
            self._faults.report(
                self._cluster,
                KIND,
                "invalid",
                f"an invalid {refusal_of(obj, error)}",
                "skipped: its last good version (if any) keeps applying",
            )
            return
        self._updater.upsert_request_authentication(ra)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete_request_authentication(ConfigKey(KIND, namespace or "default", name))
