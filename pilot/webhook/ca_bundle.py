"""The caBundle of pilot's own MutatingWebhookConfiguration (Kubernetes mode only).

The API server verifies the webhook's serving certificate with each webhook's
`clientConfig.caBundle`: pilot keeps every one of them at its CA's root, as istiod does
for its injector. It watches the one configuration by name (--injector-webhook-config;
deploy/rbac.yaml grants get, list, watch and patch on that name only) and patches only
the webhooks whose caBundle differs, so an edit that blanks or changes one is put back,
and a configuration applied later (`kubectl apply -k deploy/`) is filled in at once.

A missing configuration is a warning, once, and a wait for the watch to bring it; never
unreadiness: pilot serves xDS whether or not injection is set up. Each patch names the
webhook it changes (a JSON patch `test` of its name at its index): a configuration
changed meanwhile fails the test (422) or conflicts (409), and the watch brings the new
one to look at again. Other failures are retried with backoff. Every replica does this:
they share one root, so their patches agree.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from pilot.kube.api_client import CONNECTION_FAILED
from pilot.kube.config import KubernetesSettings
from pilot.kube.informer import Informer, Obj
from pilot.logs import clipped
from pilot.runtime.backoff import Backoff
from pilot.runtime.supervisor import Supervisor

log = logging.getLogger("pilot.webhook")

CONFLICT, UNPROCESSABLE = 409, 422
KIND = "MutatingWebhookConfiguration"


class _Configuration:
    """The configuration as the watch last saw it (an informer's handler)."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self.current: Obj | None = None
        self._changed = changed

    def upsert(self, obj: Obj) -> None:
        self.current = obj
        self._changed()

    def delete(self, namespace: str, name: str) -> None:
        self.current = None
        self._changed()


def bundle_patch(configuration: Obj, ca_bundle: str) -> list[dict[str, Any]]:
    """The JSON patch setting every webhook's caBundle that differs to `ca_bundle` (base64),
    each guarded by a test of the webhook's name at its index; [] when all are right."""
    patch: list[dict[str, Any]] = []
    for index, webhook in enumerate(configuration.get("webhooks") or []):
        if not isinstance(webhook, dict):
            continue
        client_config = webhook.get("clientConfig")
        if not isinstance(client_config, dict) or client_config.get("caBundle") == ca_bundle:
            continue
        where = f"/webhooks/{index}"
        patch.append({"op": "test", "path": f"{where}/name", "value": webhook.get("name")})
        patch.append({"op": "add", "path": f"{where}/clientConfig/caBundle", "value": ca_bundle})
    return patch


class CaBundleKeeper:
    """Keeps the configuration's caBundles at pilot's root; `run` until cancelled."""

    def __init__(
        self,
        api_client: client.ApiClient,
        kubernetes: KubernetesSettings,
        name: str,
        root_pem: Callable[[], str],
        supervisor: Supervisor,
        *,
        retry_max: float = 30.0,
    ) -> None:
        self._api = client.AdmissionregistrationV1Api(api_client)
        self._name = name
        self._root_pem = root_pem
        self._supervisor = supervisor
        self._settings = kubernetes.informer
        self._retry_max = retry_max
        self._wake = asyncio.Event()
        self._configuration = _Configuration(self._wake.set)
        self._warned_missing = False
        self.patches = 0  # patches the API server accepted (what a test or /metrics reads)

    def _informer(self) -> Informer:
        request = functools.partial(
            self._api.list_mutating_webhook_configuration,
            field_selector=f"metadata.name={self._name}",
        )
        return Informer(KIND, request, self._configuration, self._settings)

    async def run(self) -> None:
        """Watch the configuration (task `webhook-config` of the supervisor), and patch."""
        # Started again after a failure: watch afresh.
        self._configuration = _Configuration(self._wake.set)
        informer = self._informer()
        task = self._supervisor.start("webhook-config", informer.run)
        try:
            await informer.listed.wait()
            self._wake.set()
            await self._work()
        finally:
            await self._supervisor.stop_task(task)

    async def _work(self) -> None:
        backoff = Backoff(0.5, self._retry_max)
        while True:
            await self._wake.wait()
            self._wake.clear()
            reason = await self._reconcile()
            if reason is None:
                backoff.reset()
                continue
            delay = backoff.next_delay()
            log.warning(
                "cannot set the caBundle of %s %s: %s; retrying in %.1fs",
                KIND,
                self._name,
                reason,
                delay,
            )
            asyncio.get_running_loop().call_later(delay, self._wake.set)

    async def _reconcile(self) -> str | None:
        """Patch what differs; None, or why it could not (to retry)."""
        current = self._configuration.current
        if current is None:
            if not self._warned_missing:
                log.warning(
                    "%s %s not found: no Pod is sent to the injection webhook until"
                    " it exists (kubectl apply -k deploy/); watching for it",
                    KIND,
                    clipped(self._name),
                )
                self._warned_missing = True
            return None
        self._warned_missing = False
        ca_bundle = base64.b64encode(self._root_pem().encode()).decode()
        patch = bundle_patch(current, ca_bundle)
        if not patch:
            return None
        try:
            await self._api.patch_mutating_webhook_configuration(self._name, patch)
        except client.ApiException as error:
            if error.status in (CONFLICT, UNPROCESSABLE):
                return None  # changed meanwhile: the watch brings it, and we look again
            return f"{error.status} {error.reason}"
        except CONNECTION_FAILED as error:
            return str(error) or type(error).__name__
        self.patches += 1
        log.info(
            "set the caBundle of %d webhooks of %s %s to pilot's root",
            len(patch) // 2,
            KIND,
            self._name,
        )
        return None
