"""RequestAuthentication from the local cluster: Istio's custom resource, listed and watched.

As AuthorizationPolicy (`authorization_policies.py`): the local cluster only,
`v1` where served, else `v1beta1`, in the watched namespaces and the root one. An
object that does not parse is one warning naming it and the field, counted
(`pilot_config_rejected_total{kind}`, and `invalid` in the watch faults) and
skipped: the last good version pilot holds of it keeps applying (dropping one never
opens anything: its issuers then give no request principal).
"""

from __future__ import annotations

from pilot.kube.informer import Obj
from pilot.registry.istio_config import ConfigKey, key_of
from pilot.registry.request_authentication import (
    KIND,
    RequestAuthentication,
    parse_request_authentication,
    refusal_of,
)
from pilot.sources.kubernetes.policy_handler import PolicyHandler

PLURAL = "requestauthentications"


class RequestAuthenticationHandler(PolicyHandler[RequestAuthentication]):
    """Parses each RequestAuthentication into the updater; a bad one is said and skipped."""

    def parse(self, obj: Obj) -> RequestAuthentication:
        return parse_request_authentication(obj)

    def refused(self, obj: Obj, error: BaseException) -> None:
        self._updater.config_refused(key_of(KIND, obj))
        self._faults.report(
            self._cluster,
            KIND,
            "invalid",
            f"an invalid {refusal_of(obj, error)}",
            "skipped: its last good version (if any) keeps applying",
        )

    def apply(self, parsed: RequestAuthentication) -> None:
        self._updater.upsert_request_authentication(parsed)

    def remove(self, namespace: str, name: str) -> None:
        self._updater.delete_request_authentication(ConfigKey(KIND, namespace, name))
