"""Leader election on a `coordination.k8s.io/v1` Lease, for duties that need one writer.

client-go's scheme: a replica holds the Lease while it renews it within
`lease_duration`; another may take it over once that has passed (optimistic
concurrency on resourceVersion decides races). The holder releases it on
shutdown by clearing the holder, so a successor need not wait. Whoever must
act when this replica starts or stops holding it registers with `on_change`.

Every attempt has a deadline, as client-go's RenewDeadline: a holder whose API
server does not answer within two thirds of the Lease's duration stops acting as
holder before the Lease can pass to another replica; the release on shutdown gets
RELEASE_WITHIN seconds, after which pilot stops anyway and the Lease expires.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable

from kubernetes_asyncio import client

from pilot.kube.api_client import API_FAILED

log = logging.getLogger("pilot.security")

CONFLICT, NOT_FOUND = 409, 404
RELEASE_WITHIN = 5.0  # seconds shutdown waits for the release
RENEW_DEADLINE = 2 / 3  # of the Lease's duration, as client-go's 10 s of 15


def default_identity() -> str:
    """POD_NAME where Kubernetes sets it, else host and process, plus a random tail."""
    base = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    return f"{base}-{secrets.token_hex(3)}"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaseElector:
    """Holds (or tries to hold) one Lease; `is_leader` says whether it does now."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        *,
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_every: float = 5.0,
    ) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self._duration = lease_duration
        self._renew_every = renew_every
        self._renew_deadline = lease_duration * RENEW_DEADLINE
        self.is_leader = False
        self._listeners: list[Callable[[bool], None]] = []

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(is_leader)` whenever this replica starts or stops holding the Lease."""
        self._listeners.append(listener)

    def _set_leader(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        self.is_leader = leading
        for listener in self._listeners:
            listener(leading)

    def _spec(self, transitions: int) -> client.V1LeaseSpec:
        now = _now()
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=int(self._duration),
            acquire_time=now,
            renew_time=now,
            lease_transitions=transitions,
        )

    async def try_acquire(self) -> bool:
        """Take or renew the Lease if it is free, expired or ours; False if another holds it."""
        try:
            lease = await self._api.read_namespaced_lease(self.name, self.namespace)
        except client.ApiException as error:
            if error.status != NOT_FOUND:
                raise
            return await self._create()
        spec = lease.spec or client.V1LeaseSpec()
        if spec.holder_identity not in (None, "", self.identity) and not self._expired(spec):
            self._set_leader(False)
            return False
        transitions = (spec.lease_transitions or 0) + (spec.holder_identity != self.identity)
        lease.spec = self._spec(transitions)
        if spec.holder_identity == self.identity and spec.acquire_time is not None:
            lease.spec.acquire_time = spec.acquire_time
        return await self._replace(lease)

    def _expired(self, spec: client.V1LeaseSpec) -> bool:
        renewed = spec.renew_time or spec.acquire_time
        duration = spec.lease_duration_seconds or self._duration
        return renewed is None or renewed + datetime.timedelta(seconds=duration) < _now()

    async def _create(self) -> bool:
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=self._spec(0),
        )
        return await self._claim(self._api.create_namespaced_lease(self.namespace, body))

    async def _replace(self, lease: client.V1Lease) -> bool:
        return await self._claim(
            self._api.replace_namespaced_lease(self.name, self.namespace, lease)
        )

    async def _claim(self, write: Awaitable[object]) -> bool:
        """Write the Lease; a conflict means another replica got there first."""
        try:
            await write
        except client.ApiException as error:
            if error.status != CONFLICT:
                raise
            self._set_leader(False)
            return False
        return self._won()

    def _won(self) -> bool:
        if not self.is_leader:
            log.info("%s now holds lease %s/%s", self.identity, self.namespace, self.name)
        self._set_leader(True)
        return True

    async def run(self) -> None:
        """Keep trying to hold (and renew) the Lease until cancelled."""
        while True:
            try:
                async with asyncio.timeout(self._renew_deadline):
                    await self.try_acquire()
            except TimeoutError:
                log.warning(
                    "lease %s/%s: the API server did not answer within %gs; not holding it",
                    self.namespace,
                    self.name,
                    self._renew_deadline,
                )
                self._set_leader(False)
            except API_FAILED as error:
                log.warning("lease %s/%s: %s", self.namespace, self.name, error)
                self._set_leader(False)
            await asyncio.sleep(self._renew_every)

    async def release(self) -> None:
        """Give the Lease up (on shutdown) so that another replica need not wait it out."""
        if not self.is_leader:
            return
        self._set_leader(False)
        try:
            async with asyncio.timeout(RELEASE_WITHIN):
                await self._clear_holder()
        except TimeoutError:
            log.warning(
                "could not release lease %s/%s: the API server did not answer within %gs;"
                " it passes to another replica once it expires",
                self.namespace,
                self.name,
                RELEASE_WITHIN,
            )
        except API_FAILED as error:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, error)

    async def _clear_holder(self) -> None:
        lease = await self._api.read_namespaced_lease(self.name, self.namespace)
        if lease.spec is not None and lease.spec.holder_identity == self.identity:
            lease.spec.holder_identity = ""
            lease.spec.lease_duration_seconds = 1
            await self._api.replace_namespaced_lease(self.name, self.namespace, lease)
            log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)
