"""Two proxies behind one node id: who they are, how they ask for secrets, what they got.

A `Peer` is one xDS stream standing in for an Envoy (or for someone pretending to be
one): its own channel and service-account token, a node id, and every secret it was
sent, as `SecretSummary`s (SAN URIs, serial, whether the key fits the certificate;
never the key). It ACKs every response as Envoy does.

`barrier()` proves that nothing is still on its way to the peer without sleeping: it
sends a request pilot must answer and reads up to that answer, so that any push pilot
decided on before the request is read too. The request leaves the secret subscription
as it is where it can: on ADS it subscribes to one more cluster's endpoints, on delta
SDS to a secret that does not exist; on SotW SDS it adds `ROOTCA`.

`victim`, `attacker`, `gets_its_secrets` and `attacks` are the two parties' moves;
`wait_streams` waits until pilot's /debug/connections shows a node's streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.ca import PluggedIn, Token, sa_token, write_plugged_in
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.pilot_process import Entry, PilotProcess, start_pilot
from tests.support.xds_client import (
    ENDPOINT,
    SECRET,
    Closed,
    DeltaResponse,
    DeltaStream,
    DiscoveryResponse,
    SecretSummary,
    SotwStream,
    XdsClient,
    describe,
    node,
    secret_summaries,
    sotw_names,
)

WORKLOAD, ROOTCA = "default", "ROOTCA"
TRUST_DOMAIN = "cluster.local"
WAIT = 10.0  # seconds any one thing may take
WILDCARD_WARNING = "secrets are served by name only"
BARRIER_SERVICES = ("barrier-a", "barrier-b", "barrier-c")


@dataclass(frozen=True)
class Account:
    """A Kubernetes service account, and the SPIFFE identity Istio gives it."""

    namespace: str
    name: str

    @property
    def uri(self) -> str:
        return f"spiffe://{TRUST_DOMAIN}/ns/{self.namespace}/sa/{self.name}"

    @property
    def metadata(self) -> dict[str, str]:
        """Node metadata as Istio's sidecar sends it."""
        return {"NAMESPACE": self.namespace, "SERVICE_ACCOUNT": self.name}

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


VICTIM = Account("ns-b", "victim")
ATTACKER = Account("ns-a", "attacker")
# pilot's own namespace (no POD_NAMESPACE: "default"): its accounts read every proxy.
OPERATOR = Account("default", "operator")
# Listed in PILOT_CSDS_TRUSTED_ACCOUNTS: reads every proxy too.
AUDITOR = Account("ns-c", "auditor")
ACCOUNTS = (VICTIM, ATTACKER, OPERATOR, AUDITOR)


def victim_node_id(tag: str) -> str:
    """A sidecar node id as Istio builds it (type~ip~pod.namespace~namespace.svc...)."""
    return f"sidecar~10.0.0.2~victim-{tag}.ns-b~ns-b.svc.{TRUST_DOMAIN}"


@dataclass(frozen=True)
class Route:
    """How a stream asks for secrets: which service, SotW or delta, which names.

    `names` empty is the legacy wildcard (a first request naming nothing).
    """

    id: str
    service: str  # "ads" or "sds"
    delta: bool
    names: tuple[str, ...]

    @property
    def wildcard(self) -> bool:
        return not self.names or "*" in self.names


@dataclass
class Mesh:
    """The running pilot, the API server behind it, and the two accounts' tokens."""

    pilot: PilotProcess
    srv: KubeAPIServer
    ca: PluggedIn
    tokens: dict[Account, Token] = field(repr=False)
    _ids: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    @property
    def barrier_clusters(self) -> list[str]:
        return [cluster_name(name) for name in BARRIER_SERVICES]

    def node_id(self) -> str:
        """A node id no other test uses (the victim's; the attacker sends it too)."""
        return victim_node_id(f"{next(self._ids):03d}")


def show(secret: SecretSummary) -> str:
    """A secret for a failure message: name, identity, serial; never the key."""
    if secret.kind != "tls_certificate":
        return secret.name
    key = "with its private key" if secret.has_key else "without a key"
    return (
        f"{secret.name} ({', '.join(secret.uris) or 'no URI SAN'}, serial {secret.serial}, {key})"
    )


def show_all(secrets: Sequence[SecretSummary]) -> str:
    return "[" + "; ".join(show(s) for s in secrets) + "]"


class Peer:
    """One stream with its own token and channel; records every secret it is sent."""

    def __init__(
        self,
        role: str,
        account: Account,
        client: XdsClient,
        stream: SotwStream | DeltaStream,
        *,
        service: str,
        barrier_clusters: Sequence[str],
    ) -> None:
        self.role = role
        self.account = account
        self.client = client
        self.stream = stream
        self.service = service
        self.secrets: list[SecretSummary] = []  # every secret received, in order
        self.held: dict[str, SecretSummary] = {}  # what it holds now, by name
        self.closed: Closed | None = None
        self._barrier_clusters = list(barrier_clusters)
        self._barriers = 0
        self._seen: set[str] = set()  # endpoint and (delta) secret names answered
        self._last_batch = 0  # where the secrets of the latest response start
        self.barrier_roots: set[int] = set()  # indexes in `secrets`
        self._roots_received = 0
        self._secret_names: list[str] = []
        self._open = True

    def __repr__(self) -> str:
        return f"Peer({self.role}, {self.account}, {self.stream.label})"

    @classmethod
    def connect(
        cls,
        pilot: PilotProcess,
        role: str,
        account: Account,
        token: str,
        *,
        tls: bool,
        node_id: str,
        metadata: dict[str, str] | None,
        service: str,
        delta: bool,
        barrier_clusters: Sequence[str] = (),
    ) -> Peer:
        client = pilot.client(tls, token)
        sent_node = node(node_id, metadata)
        if service == "ads":
            stream: SotwStream | DeltaStream = (
                client.delta_ads(sent_node) if delta else client.ads(sent_node)
            )
        else:
            stream = client.delta_sds(sent_node) if delta else client.sds(sent_node)
        return cls(
            role, account, client, stream, service=service, barrier_clusters=barrier_clusters
        )

    # -- what it holds -----------------------------------------------------------

    def certificates(self) -> list[SecretSummary]:
        """Every certificate it was sent (with or without a key), in order."""
        return [s for s in self.secrets if s.kind == "tls_certificate"]

    @property
    def workload(self) -> SecretSummary | None:
        held = self.held.get(WORKLOAD)
        return held if held is not None and held.kind == "tls_certificate" else None

    # -- requests ------------------------------------------------------------------

    async def ask(self, names: Sequence[str]) -> None:
        """The peer's secret subscription (names empty: a request naming nothing)."""
        self._secret_names = [n for n in names if n != "*"]
        await self.stream.subscribe(SECRET, names)

    async def barrier(self, what: str) -> None:
        """Send a request pilot must answer and read every response up to its answer.

        ADS: subscribe to one more cluster's endpoints. Delta SDS: subscribe to a secret
        that does not exist (answered in removed_resources). SotW SDS has no request
        whose answer tells itself apart: add ROOTCA and read until a ROOTCA arrives; the
        ROOTCAs of that last response are recorded as the barrier's (`barrier_roots`).
        """
        if self.service == "ads":
            cluster = self._barrier_clusters[self._barriers]
            self._barriers += 1
            if isinstance(self.stream, DeltaStream):
                await self.stream.subscribe(ENDPOINT, [cluster])
            else:
                await self.stream.subscribe(ENDPOINT, self._barrier_clusters[: self._barriers])
            await self.pump_until(lambda: cluster in self._seen, what)
            return
        if isinstance(self.stream, DeltaStream):
            name = f"no-such-secret-{self._barriers}"
            self._barriers += 1
            await self.stream.subscribe(SECRET, [name])
            await self.pump_until(lambda: name in self._seen, what)
            return
        before = self._roots_received
        self._secret_names.append(ROOTCA)
        await self.stream.subscribe(SECRET, self._secret_names)
        await self.pump_until(lambda: self._roots_received > before, what)
        self.barrier_roots |= {
            i for i in range(self._last_batch, len(self.secrets)) if self.secrets[i].name == ROOTCA
        }

    def unasked(self) -> list[SecretSummary]:
        """Every secret received but the ROOTCAs a barrier asked for."""
        return [s for i, s in enumerate(self.secrets) if i not in self.barrier_roots]

    # -- responses -----------------------------------------------------------------

    async def accept(self, item: DiscoveryResponse | DeltaResponse | Closed) -> None:
        """Record a response and ACK it (as Envoy does), or record how the stream ended."""
        if isinstance(item, Closed):
            self.closed = item
            return
        summaries = secret_summaries(item)
        self._last_batch = len(self.secrets)
        self.secrets.extend(summaries)
        self._roots_received += sum(1 for s in summaries if s.name == ROOTCA)
        self.held.update((s.name, s) for s in summaries)
        if isinstance(item, DeltaResponse):
            self._seen |= {r.name for r in item.resources} | set(item.removed_resources)
            if item.type_url == SECRET:
                for name in item.removed_resources:
                    self.held.pop(name, None)
        elif item.type_url == ENDPOINT:
            self._seen |= set(sotw_names(item))
        await self.stream.ack(item)  # type: ignore[arg-type]  # a stream gets its own kind

    async def pump_until(self, condition: Callable[[], bool], what: str) -> None:
        """Read (and ACK) responses until `condition()` holds; fail after WAIT seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while not condition():
            if self.closed is not None:
                pytest.fail(
                    f"{self.role}: waiting for {what}, the stream ended: "
                    f"{self.closed.code.name} {self.closed.details}"
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                pytest.fail(f"{self.role}: no {what} within {WAIT:g}s; {self._story()}")
            try:
                item = await self.stream.next_event(remaining)
            except AssertionError:
                pytest.fail(f"{self.role}: no {what} within {WAIT:g}s; {self._story()}")
            await self.accept(item)

    async def pump_until_logged(
        self, pilot: PilotProcess, predicate: Callable[[Entry], bool], since: int
    ) -> None:
        """Until pilot logs a matching line or a response arrives (which is read),
        whichever comes first; neither within WAIT seconds is left to the caller."""
        read = asyncio.create_task(self.stream.next_event(WAIT))
        logged = asyncio.create_task(pilot.until_logged(predicate, since, WAIT))
        done, _ = await asyncio.wait({read, logged}, return_when=asyncio.FIRST_COMPLETED)
        for task in (read, logged):
            if task not in done:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, AssertionError):
                await task  # AssertionError: nothing arrived in time
        if read in done and read.exception() is None:
            await self.accept(read.result())

    def _story(self) -> str:
        seen = [describe(r) for r in self.stream.received[-4:]]
        return f"it received {show_all(self.secrets)} in responses {seen}"

    async def close(self) -> None:
        """Disconnect, as an Envoy going away does (again: nothing)."""
        if self._open:
            self._open = False
            await self.client.aclose()


# -- the two parties -------------------------------------------------------------


def wildcard_warning(entry: Entry) -> bool:
    """pilot's warning that a stream asked for secrets by wildcard."""
    return entry["level"] == "warning" and WILDCARD_WARNING in entry["msg"]


@contextlib.asynccontextmanager
async def running_mesh(
    folder: Path, *pilot_flags: str, env: Mapping[str, str] | None = None
) -> AsyncIterator[Mesh]:
    """The API server (barrier Services, every account's token) and pilot on it,
    with a plugged-in CA written under `folder` so that tests know the root."""
    ca = write_plugged_in(folder / "plugged-in-ca")
    async with KubeAPIServer() as srv:
        for name in BARRIER_SERVICES:
            srv.apply(service(name))
            srv.apply(endpoint_slice(name, [Ep("10.1.0.1")]))
        tokens = {account: sa_token(srv, account.namespace, account.name) for account in ACCOUNTS}
        kubeconfig = write_kubeconfig(folder / "kubeconfig.yaml", srv.url)
        root = ca.root.cert_pem.encode()
        settings = {"PILOT_CSDS_TRUSTED_ACCOUNTS": f"{AUDITOR.namespace}/{AUDITOR.name}"}
        settings |= env or {}
        pilot = await start_pilot(
            folder, kubeconfig, ca.directory, root, *pilot_flags, env=settings
        )
        try:
            yield Mesh(pilot, srv, ca, tokens)
        finally:
            await pilot.stop()


def victim(mesh: Mesh, node_id: str, tls: bool, *, service: str = "ads", delta: bool) -> Peer:
    """The victim's Envoy: its own token, its node id, Istio's node metadata."""
    return Peer.connect(
        mesh.pilot,
        "victim",
        VICTIM,
        mesh.tokens[VICTIM],
        tls=tls,
        node_id=node_id,
        metadata=VICTIM.metadata,
        service=service,
        delta=delta,
        barrier_clusters=mesh.barrier_clusters,
    )


def attacker(mesh: Mesh, node_id: str, tls: bool, route: Route, claims: Account | None) -> Peer:
    """The attacker: its own token (ns-a/attacker), the victim's node id, and node metadata
    naming the account `claims` (its own, the victim's, or none)."""
    return Peer.connect(
        mesh.pilot,
        "attacker",
        ATTACKER,
        mesh.tokens[ATTACKER],
        tls=tls,
        node_id=node_id,
        metadata=claims.metadata if claims else None,
        service=route.service,
        delta=route.delta,
        barrier_clusters=mesh.barrier_clusters,
    )


async def gets_its_secrets(peer: Peer) -> None:
    """Subscribe to `default` and `ROOTCA` as Envoy does; read until it holds both."""
    await peer.ask([WORKLOAD, ROOTCA])
    await peer.pump_until(
        lambda: peer.workload is not None and ROOTCA in peer.held,
        "certificate (default) and root (ROOTCA)",
    )


async def attacks(mesh: Mesh, peer: Peer, route: Route, mark: int) -> None:
    """Ask for secrets the route's way; then read its own certificate (named), or until
    pilot logs the wildcard warning or answers (wildcard)."""
    await peer.ask(route.names)
    if route.wildcard:
        await peer.pump_until_logged(mesh.pilot, wildcard_warning, mark)
    else:
        await peer.pump_until(lambda: peer.workload is not None, "certificate for `default`")


def rows_for(rows: Any, key: str, value: str) -> list[dict[str, Any]]:
    """The rows of a /debug JSON list whose `key` is `value`."""
    assert isinstance(rows, list), f"expected a JSON list of rows, got {type(rows).__name__}"
    return [row for row in rows if isinstance(row, dict) and row.get(key) == value]


async def wait_streams(pilot: PilotProcess, node_id: str, count: int) -> list[dict[str, Any]]:
    """/debug/connections rows for `node_id`, once there are exactly `count`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        rows = rows_for(await pilot.get_json("/debug/connections"), "proxy", node_id)
        if len(rows) == count:
            return rows
        if loop.time() > deadline:
            pytest.fail(f"pilot shows {len(rows)} streams for {node_id}, not {count}")
        await asyncio.sleep(0.02)  # polling pilot's view of its streams, with a deadline
