"""`python -m bench.sidecar`: the full sidecar config (CDS, EDS, LDS, RDS) for N sidecars.

One run, every process on 127.0.0.1 with ephemeral ports:

1. The test API server starts with `bench.sidecar_mesh`'s mesh of S services
   (ClusterIPs, one in ten with a TCP port too, a Pod with
   `security.istio.io/tlsMode: istio` behind every endpoint); pilot
   (`pilot discovery --kubeconfig`) syncs from it.
2. N `bench.clients` streams connect as sidecars, Pods of the mesh, and do what
   Envoy does on delta ADS: CDS `*`; EDS for every EDS cluster; once those are
   in, LDS `*`; RDS for the route configurations the listeners name; every
   response ACKed. Initial sync: until every sidecar has ACKed all four types.
   Secrets (SDS) are not asked for (in Istio's split the agent serves them),
   unless `--secrets` (below).
3. A services are added one at a time (the EndpointSlice first, then, pilot
   idle again, the Service), each timed until every sidecar has received its
   clusters, their assignments, its listener and route configuration 80.
4. K endpoint changes one at a time (the EndpointSlice alone, the new address's
   Pod already there), each timed until every sidecar has its new assignment.

5. Floor: pilot stops; `bench.floor`, a bare grpc.aio server, serves new
   sidecars of the same kind the responses pilot sent sidecar 0: those of its
   sync (each type's at its first subscription), then, on each trigger, those
   of one service added (all four at once) or of one endpoint changed. The
   floor serves no secrets, with `--secrets` too.

With `--secrets`, certificates at the rate of a rollout: step 2 is done twice,
each time by a pilot started afresh on the same mesh (two pilot phases rather
than two syncs of one pilot, so that neither sync finds the other's heap,
caches and warmed code: the difference is the secrets' alone). First the
sidecars as above (the sync the floor is compared with); pilot stopped; a new
pilot, and the sidecars again, each also opening, once its clusters arrive (their
transport sockets name SDS secrets from `sds-grpc`), a stream of its own as
Envoy's `sds-grpc` cluster does: delta SDS
(`SecretDiscoveryService/DeltaSecrets`: the SDS service, not ADS, since
`sds-grpc` is a config source of its own, on connections of its own; delta as
the bench's other streams, though the clusters pilot sends say `api_type:
GRPC`, for which Envoy would call StreamSecrets) for `default` and `ROOTCA`,
its node the sidecar's (NAMESPACE and SERVICE_ACCOUNT metadata: pilot runs
with `--xds-auth none` and takes the identity from them), every response
ACKed. That sync ends once every sidecar also holds both secrets (its listeners
asked for only then, as Envoy's clusters warm only with their secrets), and
steps 3 and 4 run on it. Reported: certificates per second from the first SDS
request to the last certificate (`default`) received; pilot's CPU per certificate, (its
CPU over the sync with secrets - over the sync without) / N, against a bare
mint (`bench.certificates.bare_mint_seconds`, here, after the run); /ready
during each sync.

With `--istiod`, pilot and istiod (Istio's `pilot-discovery`, `bench.istiod`:
tools/istiod/build, run as tools/istiod/README.md says) side by side in one
run, on one real API server (`bench.cluster`: etcd and kube-apiserver of
tests.cluster, with RBAC and TLS, no controller manager, so that the mesh's
slices are the only ones; Istio's CRDs applied) rather than the test one:

1. the mesh is written on it with concurrent requests: ServiceAccounts, Pods
   with their status (Running, Ready, their IP), Services (ClusterIPs in its
   service range, selecting their Pods), EndpointSlices (labelled managed by
   the bench); pilot (`--kubeconfig`, the admin's) and the series as above,
   timed from the real server's watch events; pilot stopped;
2. the services pilot's series added are deleted, and istiod starts on the same
   server with Istio's defaults (debounce included: 100 ms after an event, at
   most 10 s, endpoint changes too; `--istiod-env KEY=VALUE` sets its
   environment); the same sidecars (the same nodes) sync on its plaintext port,
   retrying as Envoy does (istiod admits 15 + 5 per core new streams a second
   and refuses those that wait over a second); then series of their own: A
   more services added, K more endpoint changes (from the state pilot's left).
   What every sidecar is expected to get for a service added is what istiod
   sends: besides the service's clusters, assignments and route configuration,
   every listener again and the clusters that are no Service's;
3. the floor, as above.

The report adds a table of pilot, istiod and the floor: initial sync, CPU over
it, bytes per sidecar per type, RSS per sidecar and with all synced, and per
service added and per endpoint changed CPU, latency p50/p99 and bytes per
sidecar; and istiod's ratio to pilot.

Figures, for pilot and the floor: the initial sync time; bytes received per
sidecar, per type (the DeltaDiscoveryResponse messages, without gRPC's
framing); RSS per sidecar ((RSS with all synced - RSS before any) / N); CPU
per service added and per endpoint changed (user+system CPU over each series /
its length, the waits for idleness between items included) and their ratio;
the responses each sidecar got per item, by type (an endpoint change: EDS
alone). pilot's latency runs from the Service's (added) or EndpointSlice's
(changed) watch event reaching the API server's watchers, the floor's from its
trigger, to the last sidecar receiving the last of what it is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import math
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import istiod as istiod_server
from bench import pilot_cli, wire
from bench.certificates import bare_mint_seconds
from bench.cluster import ClusterApi, load, start_cluster
from bench.kube import SERVICE_NAME_LABEL, SERVICES, SLICES, KubeApi, Watch
from bench.procs import Child, wait_idle
from bench.report import latency_rows, percentile, ratio_table
from bench.run import ApiTrigger, Config, PipeTrigger, Run, Series, Synced
from bench.runner import (
    Machine,
    _env_pair,
    add_mesh_flags,
    add_run_flags,
    config_of,
    pilot_log_summary,
    run_main,
)
from bench.sidecar_mesh import TCP_EVERY, Addition, SidecarMesh
from bench.workload import Change
from tests.cluster.control_plane import ControlPlane

TYPES = list(wire.SHORT)  # Istio's push order: CDS, EDS, LDS, RDS
# In Kubernetes mode pilot's plaintext port serves CDS and EDS only, LDS and RDS on
# the TLS port (with a token); this flag has the plaintext port serve every type.
LISTENERS_ON_PLAINTEXT = ("--plaintext-secrets",)
BARE_MINTS = 300  # timed after the run, for pilot's CPU per certificate to be read against


@dataclass
class Phase:
    """One server's figures: the sidecars' sync, then both series."""

    sync: Synced
    added: Series
    changed: Series


@dataclass
class SidecarMeasured:
    """pilot's phase, the floor's, and how pilot ran; with secrets, also the sync without
    them (a pilot of its own) and the bare mint's seconds per certificate."""

    pilot: Phase
    floor: Phase
    pilot_knobs: dict[str, str]
    pilot_flags: list[str]
    plain: Synced | None = None
    bare_mint: float = math.nan
    istiod: Phase | None = None  # with --istiod
    istiod_build: str = ""  # its build's name (the istio.io/istio snapshot)
    istiod_env: dict[str, str] = dataclasses.field(default_factory=dict)  # over the defaults
    cluster_load: float = math.nan  # with --istiod: seconds to write the mesh on the API server

    @property
    def plain_sync(self) -> Synced:
        """The sync without secrets: the one the floor's compares with."""
        return self.plain or self.pilot.sync


class AdditionTrigger:
    """A service added: its EndpointSlice, then (pilot idle again) the Service; it reached
    pilot with the Service's watch event."""

    def __init__(self, api: KubeApi, slices: Watch, services: Watch, pilot: Child) -> None:
        self.api = api
        self.slices = slices
        self.services = services
        self.pilot = pilot

    async def __call__(
        self, index: int, addition: Addition | istiod_server.IstiodAddition
    ) -> float:
        await self.slices.arrival(await self.api.apply(addition.slice))
        await wait_idle([self.pilot.pid])
        return await self.services.arrival(await self.api.apply(addition.service))


@dataclass
class _Served:
    """What the phases share: the run, the API server (a session, pilot's kubeconfig, the
    bench's watches of slices and Services) and, with --istiod, the real one's plane and
    istiod's build."""

    run: Run
    api: KubeApi
    kubeconfig: Path
    slices: Watch
    services: Watch
    plane: ControlPlane | None = None
    binaries: Path | None = None


async def measure(
    config: Config,
    additions: int,
    workdir: Path,
    secrets: bool = False,
    istiod_env: dict[str, str] | None = None,
) -> SidecarMeasured:
    """Start the processes, sync the sidecars (with secrets: twice), run both series, stop
    everything. With `istiod_env` (its environment over Istio's defaults), on the real
    API server, and istiod's phase after pilot's."""
    istiod = istiod_env is not None
    rounds = 2 if istiod else 1  # istiod's series are fresh objects of their own
    mesh = SidecarMesh(
        config.services,
        config.endpoints,
        sidecars=config.clients,
        additions=additions * rounds,
        changes=config.changes * rounds,
        seed=config.seed,
    )
    ours_added, ours_changed = mesh.additions[:additions], mesh.changes[: config.changes]
    nodes = workdir / "nodes.jsonl"
    mesh.write_nodes(nodes)
    sidecars = dataclasses.replace(config.fleet, nodes=nodes)
    config = dataclasses.replace(config, fleet=sidecars, pilot_flags=LISTENERS_ON_PLAINTEXT)
    run = Run(config, workdir)
    try:
        binaries = await istiod_server.build() if istiod else None  # before anything is timed
        knobs = asyncio.create_task(run.pilot_knobs())  # only for the report: not waited on
        served, loaded = await _serve_mesh(run, mesh, binaries)
        initial = workdir / "initial.bin"
        plain = await _plain_sync(run, served.kubeconfig, initial) if secrets else None
        ours = await _pilot_phase(served, initial, (ours_added, ours_changed), secrets)
        theirs = None
        if istiod:
            for addition in ours_added:  # istiod starts on the mesh pilot started on
                await served.api.delete(addition.service)
                await served.api.delete(addition.slice)
            their_items = (mesh.additions[additions:], mesh.changes[config.changes :])
            theirs = await _istiod_phase(served, mesh, their_items, istiod_env or {})
        base = await _floor_phase(run, (ours_added, ours_changed), initial, ours)
        measured = SidecarMeasured(ours, base, await knobs, run.pilot_flags, plain)
        measured.istiod, measured.cluster_load = theirs, loaded
        measured.istiod_build = binaries.name if binaries is not None else ""
        measured.istiod_env = istiod_env or {}
    except Exception:
        run.report_logs()
        raise
    finally:
        await run.close()
    if secrets:  # every process stopped: the mint has the machine to itself, as pilot had
        measured.bare_mint = await asyncio.to_thread(bare_mint_seconds, BARE_MINTS)
    return measured


async def _serve_mesh(run: Run, mesh: SidecarMesh, binaries: Path | None) -> tuple[_Served, float]:
    """The mesh on the test API server, or (with istiod's build) on a real one: etcd and
    kube-apiserver, the mesh written on them, the admin's kubeconfig pilot's and
    istiod's. Also the seconds the real one took to be written (NaN: the test one)."""
    loaded = math.nan
    plane = None
    api: KubeApi
    if binaries is None:
        api, kubeconfig = await run.start_mesh(mesh.yaml())
    else:
        plane = run.stack.enter_context(start_cluster(run.workdir / "cluster"))
        api = ClusterApi(plane)
        run.stack.push_async_callback(api.close)
        loaded = await load(api, mesh.objects())
        # Istio's CRDs, as a cluster with Istio has them: both servers watch their kinds.
        plane.kubectl("apply", "--server-side", "-f", str(binaries / "istio-crds.yaml"))
        plane.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd", "--all")
        kubeconfig = plane.admin_kubeconfig
    slices = await run.watch(api, SLICES, SERVICE_NAME_LABEL)
    services = await run.watch(api, SERVICES)
    return _Served(run, api, kubeconfig, slices, services, plane, binaries), loaded


async def _pilot_phase(
    served: _Served, initial: Path, items: tuple[list[Addition], list[Change]], secrets: bool
) -> Phase:
    """pilot on the mesh; the sidecars (with secrets: also on SDS) sync, both series run;
    pilot stopped after. Its sync's responses to sidecar 0 are captured for the floor."""
    run = served.run
    pilot, target, http_port = await run.start_pilot(served.kubeconfig)
    spec = dataclasses.replace(run.config.fleet, secrets=secrets)
    # With secrets, the capture only serves the series (their raw responses): the floor
    # replays the sync without secrets.
    capture = run.workdir / "initial-secrets.bin" if secrets else initial
    synced = run.synced_fleet(
        "pilot", pilot, target, capture=capture, ready_port=http_port, spec=spec
    )
    async with synced as (fleet, sync):
        add = AdditionTrigger(served.api, served.slices, served.services, pilot)
        added = await run.series(fleet, pilot, add, items[0])
        change = ApiTrigger(served.api, served.slices)
        changed = await run.series(fleet, pilot, change, items[1])
    await pilot.stop()  # before the API server: its log ends with the run, not with retries
    return Phase(sync, added, changed)


async def _istiod_phase(
    served: _Served,
    mesh: SidecarMesh,
    items: tuple[list[Addition], list[Change]],
    env: dict[str, str],
) -> Phase:
    """istiod on the same API server, the same sidecars (the same nodes) on its plaintext
    port, the same kind of series on objects of their own; istiod stopped after."""
    run, api = served.run, served.api
    assert isinstance(api, ClusterApi) and served.plane and served.binaries
    istiod, target, http_port = await istiod_server.start(
        run, served.plane, api.kube, served.binaries, env
    )
    # istiod admits 25 new streams a second on 2 cores (PILOT_MAX_REQUESTS_PER_SECOND unset:
    # 15 + 5 per core) and refuses those that wait over a second: the sidecars retry as
    # Envoy does (its backoff), without end for the bench's purposes.
    retries = max(run.config.fleet.retries, istiod_server.RETRIES)
    spec = dataclasses.replace(run.config.fleet, retries=retries)
    synced = run.synced_fleet("istiod", istiod, target, ready_port=http_port, spec=spec)
    async with synced as (fleet, sync):
        add = AdditionTrigger(api, served.slices, served.services, istiod)
        added = await run.series(fleet, istiod, add, istiod_server.additions(mesh, items[0]))
        changed = await run.series(fleet, istiod, ApiTrigger(api, served.slices), items[1])
    await istiod.stop()
    return Phase(sync, added, changed)


async def _plain_sync(run: Run, kubeconfig: Path, capture: Path) -> Synced:
    """The sidecars' sync without secrets, by a pilot of its own (stopped after)."""
    pilot, target, http_port = await run.start_pilot(kubeconfig, name="pilot-plain")
    async with run.synced_fleet(
        "pilot-plain", pilot, target, capture=capture, ready_port=http_port
    ) as (_, sync):
        pass
    await pilot.stop()
    return sync


async def _floor_phase(
    run: Run, items: tuple[list[Addition], list[Change]], initial: Path, ours: Phase
) -> Phase:
    """The floor, replaying what pilot sent sidecar 0 (for pilot's series `items`), to
    sidecars of the same kind."""
    records: list[bytes] = []
    adding = _replay(ours.added, records)
    changing = _replay(ours.changed, records)
    replay = run.workdir / "changes.bin"
    wire.write_records(replay, records)
    floor, target = await run.start_floor(initial, replay)
    async with run.synced_fleet("floor", floor, target) as (fleet, sync):
        added = await run.series(fleet, floor, PipeTrigger(floor, adding), items[0])
        changed = await run.series(fleet, floor, PipeTrigger(floor, changing), items[1])
    await floor.stop()
    return Phase(sync, added, changed)


def _replay(series: Series, records: list[bytes]) -> list[list[int]]:
    """Per item, the responses sidecar 0 got for it (appended to records), in push order:
    their indices in records."""
    per_item = []
    for reports in series.reports:
        kinds: dict[bytes, str] = {}
        for report in reports:
            kinds.setdefault(base64.b64decode(report["raw"]), report["type"])
        ordered = sorted(kinds, key=lambda raw: TYPES.index(kinds[raw]))
        per_item.append(list(range(len(records), len(records) + len(ordered))))
        records.extend(ordered)
    return per_item


def _ready(sync: Synced) -> str:
    lags = sync.ready_latencies
    if not lags:
        return ": not probed"
    return f" p99 {percentile(lags, 99) * 1e3:.0f} ms, worst {max(lags) * 1e3:.0f} ms"


def _kib(value: float) -> str:
    return f"{value / 1024:.1f}"


def _by_type(counts: Counter[str], per: float, fmt: str = "{:.2f}") -> str:
    cells = [f"{wire.SHORT[t]} {fmt.format(counts[t] / per)}" for t in TYPES if counts[t]]
    others = sum(v for t, v in counts.items() if t not in wire.SHORT)
    if others:
        cells.append(f"other {fmt.format(others / per)}")
    return ", ".join(cells) or "none"


def _sync_table(pilot: Synced, floor: Synced, clients: int) -> str:
    """Initial sync and RSS per sidecar: pilot, the floor (the same bytes), the ratio."""
    rows = [
        ("initial sync (s)", pilot.seconds, floor.seconds),
        ("RSS per sidecar (KiB)", _per_sidecar(pilot, clients), _per_sidecar(floor, clients)),
    ]
    return ratio_table(("pilot", "floor"), rows)


def _per_sidecar(sync: Synced, clients: int) -> float:
    return (sync.rss_synced - sync.rss_before) / clients / 1024


def _traffic_table(sync: Synced, clients: int) -> str:
    lines = [f"{'per sidecar, initial sync':<30}" + "".join(f"{wire.SHORT[t]:>10}" for t in TYPES)]
    lines[0] += f"{'total':>10}"
    sizes = [sync.sent[t] / clients for t in TYPES]
    lines.append(
        f"{'bytes received (KiB)':<30}"
        + "".join(f"{_kib(v):>10}" for v in sizes)
        + f"{_kib(sum(sizes)):>10}"
    )
    counts = [sync.responses[t] / clients for t in TYPES]
    lines.append(
        f"{'responses':<30}" + "".join(f"{v:>10.2f}" for v in counts) + f"{sum(counts):>10.2f}"
    )
    return "\n".join(lines)


def _series_table(title: str, ours: Series, base: Series) -> str:
    """One kind of item, pilot against the floor: CPU, latency, client CPU."""
    count = max(1, len(ours.latencies))
    rows = [
        ("CPU (ms)", ours.server_cpu / count * 1e3, base.server_cpu / count * 1e3),
        *latency_rows(ours.latencies, base.latencies),
        ("client CPU (ms)", ours.client_cpu / count * 1e3, base.client_cpu / count * 1e3),
    ]
    table = ratio_table(("pilot", "floor"), rows)
    return f"{title:<30}" + table[30:]


def _cpu(series: Series) -> float:
    return series.server_cpu / max(1, len(series.latencies))


def _against(ours: Phase, base: Phase) -> str:
    """A service added against an endpoint changed: CPU on each server, bytes per sidecar."""
    pilot = _cpu(ours.added) / _cpu(ours.changed)
    floor = _cpu(base.added) / _cpu(base.changed)
    added, changed = _item_bytes(ours.added) / 1024, _item_bytes(ours.changed) / 1024
    return (
        f"service added / endpoint changed, CPU: pilot {pilot:.2f}, floor {floor:.2f};"
        f" bytes per sidecar {added:.1f} KiB / {changed:.2f} KiB"
    )


def _item_bytes(series: Series) -> float:
    """The bytes a sidecar is sent per item, on average: per item and type, the response
    that carried that type's resources (one each, as the responses per sidecar show)."""
    if not series.reports:
        return math.nan
    total = 0
    for reports in series.reports:
        largest: dict[str, int] = {}
        for report in reports:
            largest[report["type"]] = max(largest.get(report["type"], 0), int(report["bytes"]))
        total += sum(largest.values())
    return total / len(series.reports)


def _secrets_lines(measured: SidecarMeasured, clients: int) -> list[str]:
    """With secrets: their sync, certificates per second, pilot's CPU per certificate."""
    sync, plain = measured.pilot.sync, measured.plain
    held = sync.secrets
    if plain is None or held is None:
        return []
    per_cert = (sync.cpu - plain.cpu) / max(1, held.streams)
    bare = measured.bare_mint
    sds = sync.sent[wire.SECRET] / clients
    return [
        "with --secrets: a second pilot, started afresh, synced the sidecars again, each also"
        " with a delta SDS stream (DeltaSecrets) for `default` and `ROOTCA`; the series below"
        " ran on it",
        f"initial sync with secrets (CDS, EDS, LDS, RDS, SDS all ACKed): {sync.seconds:.2f} s"
        f" ({sync.retried_streams} streams retried, {sync.retries} retries); SDS per sidecar"
        f" {_kib(sds)} KiB in {sync.responses[wire.SECRET] / clients:.2f} responses;"
        f" /ready during it{_ready(sync)}",
        f"certificates: {held.streams} sidecars hold both secrets; first SDS request to last"
        f" certificate received {held.seconds:.2f} s: {held.streams / held.seconds:.0f}"
        " certificates/s",
        f"pilot CPU per certificate: ({sync.cpu:.2f} s over the sync with secrets -"
        f" {plain.cpu:.2f} s without) / {held.streams} = {per_cert * 1e3:.2f} ms; bare mint"
        f" {bare * 1e3:.2f} ms; ratio {per_cert / bare:.2f}",
        f"pilot RSS per sidecar with secrets: {_kib(_per_sidecar(sync, clients) * 1024)} KiB",
        "",
    ]


RATE_LIMIT = "PILOT_MAX_REQUESTS_PER_SECOND"  # istiod's new streams a second


def _three(rows: list[tuple[str, float, float, float]]) -> str:
    """Rows of pilot's, istiod's and the floor's figures, and istiod's ratio to pilot's."""
    lines = [f"{'':<34}{'pilot':>10}{'istiod':>10}{'floor':>10}{'istiod/pilot':>14}"]
    for label, ours, theirs, base in rows:
        ratio = theirs / ours if ours > 0 else math.nan
        lines.append(f"{label:<34}{ours:>10.2f}{theirs:>10.2f}{base:>10.2f}{ratio:>14.2f}")
    return "\n".join(lines)


def _phase_rows(phases: list[Phase], clients: int) -> list[tuple[str, float, float, float]]:
    """The rows of the pilot / istiod / floor table, each a figure of the three phases."""

    def row(label: str, figure: Callable[[Phase], float]) -> tuple[str, float, float, float]:
        ours, theirs, base = (figure(phase) for phase in phases)
        return label, ours, theirs, base

    rows = [
        row("initial sync (s)", lambda p: p.sync.seconds),
        row("CPU over the sync (s)", lambda p: p.sync.cpu),
    ]
    for kind in TYPES:
        name = wire.SHORT[kind]
        rows.append(
            row(f"{name} per sidecar (KiB)", lambda p, k=kind: p.sync.sent[k] / clients / 1024)
        )
    rows += [
        row(
            "bytes per sidecar (KiB)", lambda p: sum(p.sync.sent[t] for t in TYPES) / clients / 1024
        ),
        row("RSS per sidecar (KiB)", lambda p: _per_sidecar(p.sync, clients)),
        row("RSS with all synced (MiB)", lambda p: p.sync.rss_synced / 2**20),
    ]
    for title, pick in (("service added", _added), ("endpoint changed", _changed)):
        rows += [
            row(f"per {title}: CPU (ms)", lambda p, f=pick: _cpu(f(p)) * 1e3),
            row("  latency p50 (ms)", lambda p, f=pick: percentile(f(p).latencies, 50) * 1e3),
            row("  latency p99 (ms)", lambda p, f=pick: percentile(f(p).latencies, 99) * 1e3),
            row("  bytes per sidecar (KiB)", lambda p, f=pick: _item_bytes(f(p)) / 1024),
        ]
    return rows


def _added(phase: Phase) -> Series:
    return phase.added


def _changed(phase: Phase) -> Series:
    return phase.changed


def _istiod_lines(
    measured: SidecarMeasured, clients: int, adds: int, changes: int, workdir: Path
) -> list[str]:
    """With --istiod: pilot, istiod and the floor side by side, and how istiod ran."""
    theirs = measured.istiod
    if theirs is None:
        return []
    phases = [measured.pilot, theirs, measured.floor]
    sync = theirs.sync
    return [
        "",
        "with --istiod: pilot, then istiod, on one real API server (etcd, kube-apiserver; the"
        f" mesh written in {measured.cluster_load:.1f} s), the same sidecars (same nodes);"
        " then the floor",
        _three(_phase_rows(phases, clients)),
        f"istiod: {measured.istiod_build}; Istio's defaults{_over(measured.istiod_env)}:"
        " PILOT_DEBOUNCE_AFTER 100ms, PILOT_DEBOUNCE_MAX 10s, endpoint changes debounced too"
        " (part of its latency; pilot runs with the bench's PILOT_ENABLE_EDS_DEBOUNCE=false)"
        + _rate_limit(measured.istiod_env),
        f"istiod's sync: {sync.retried_streams} streams retried ({sync.retries} retries);"
        f" /ready during it{_ready(sync)}",
        "istiod: responses per sidecar per service added: "
        + _by_type(theirs.added.responses, clients * adds)
        + "; per endpoint changed: "
        + _by_type(theirs.changed.responses - theirs.added.responses, clients * changes),
        "istiod sends for a service added its clusters, their assignments and route"
        " configuration 80, and again every listener and the clusters that are no Service's"
        " (BlackHoleCluster, PassthroughCluster, InboundPassthroughCluster, inbound|8080||)",
        "istiod's series are objects of their own (services added after pilot's, other"
        " endpoints changed); pilot's added services were deleted before istiod started",
        istiod_server.log_summary(workdir / "istiod.log"),
    ]


def _over(env: dict[str, str]) -> str:
    """istiod's environment over Istio's defaults, for the report."""
    return "".join(f" but {key}={value}" for key, value in sorted(env.items()))


def _rate_limit(env: dict[str, str]) -> str:
    """What istiod's new streams a second are, unless set."""
    if RATE_LIMIT in env:
        return ""
    return (
        f"; {RATE_LIMIT} unset: 15 + 5 per core new streams a second, the others refused"
        " after a second's wait, and the sidecars retry with Envoy's backoff"
    )


def _log_lines(workdir: Path, secrets: bool) -> list[str]:
    """pilot's log summaries: the pilot of the series, and with secrets the one without."""
    lines = [pilot_log_summary(workdir / "pilot.log")]
    if secrets:
        lines.append("without secrets, " + pilot_log_summary(workdir / "pilot-plain.log"))
    return lines


def render(
    config: Config, additions: int, measured: SidecarMeasured, machine: Machine, workdir: str
) -> str:
    """The report: setup, the sync's figures, the two series side by side, context lines."""
    ours, base, clients = measured.pilot, measured.floor, config.clients
    sync = measured.plain_sync
    adds, changes = max(1, additions), max(1, config.changes)
    tcp = len(range(0, config.services, TCP_EVERY))
    return "\n".join(
        [
            f"S={config.services} services ({tcp} with a TCP port too) x {config.endpoints} "
            f"endpoints, each a Pod with security.istio.io/tlsMode: istio; N={clients} sidecars "
            f"({len(config.fleet.shares())} client process(es), {config.fleet.channels} channels "
            f"each), A={additions} services added, K={config.changes} endpoint changes",
            "pilot: "
            + pilot_cli.describe(measured.pilot_knobs, measured.pilot_flags).replace(
                workdir, "$RUN"
            ),
            "",
            f"initial sync of all sidecars (CDS, EDS, LDS, RDS all ACKed): {sync.seconds:.2f} s"
            f" ({sync.retried_streams} streams retried, {sync.retries} retries)",
            _traffic_table(sync, clients),
            f"pilot RSS per sidecar: {_kib((sync.rss_synced - sync.rss_before) / clients)} KiB"
            f" ({sync.rss_before / 2**20:.1f} MiB before any, {sync.rss_synced / 2**20:.1f} MiB"
            f" with all synced); /ready during the sync{_ready(sync)}",
            "",
            _sync_table(sync, base.sync, clients),
            f"floor: {base.sync.retried_streams} streams retried ({base.sync.retries} retries);"
            " it replays pilot's responses to sidecar 0 at each type's first subscription;"
            " no secrets (it serves no SDS)",
            "",
            *_secrets_lines(measured, clients),
            _series_table("per service added", ours.added, base.added),
            _series_table("per endpoint changed", ours.changed, base.changed),
            _against(ours, base),
            "responses per sidecar per service added: "
            + _by_type(ours.added.responses, clients * adds),
            "responses per sidecar per endpoint changed: "
            + _by_type(ours.changed.responses - ours.added.responses, clients * changes),
            "",
            "CPU: user+system CPU over each series / its length (a service added: its slice "
            "applied, pilot idle again, the Service applied, its push); latency: pilot's from "
            "the Service's (added) or EndpointSlice's (changed) watch event reaching the API "
            "server's watchers, the floor's from its trigger, to the last sidecar receiving the "
            "last of what it is sent.",
            *_log_lines(Path(workdir), measured.plain is not None),
            *_istiod_lines(measured, clients, adds, changes, Path(workdir)),
            machine.describe(os.cpu_count() or 1),
        ]
    )


@dataclass(frozen=True)
class Args:
    """The run's configuration, and what only this bench has."""

    config: Config
    additions: int
    secrets: bool
    istiod: bool = False
    istiod_env: dict[str, str] = dataclasses.field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sidecar",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_mesh_flags(
        parser,
        changes=50,
        clients_are="sidecars",
        endpoints="per service (default: 3, or ceil(N / S) + 1 if more: one no sidecar sits on)",
    )
    parser.add_argument("--additions", type=int, default=10, help="A (default %(default)s)")
    parser.add_argument(
        "--secrets", action="store_true", help="sync again, each sidecar also on SDS (above)"
    )
    parser.add_argument(
        "--istiod", action="store_true", help="on a real API server, istiod beside pilot (above)"
    )
    parser.add_argument(
        "--istiod-env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="istiod's environment, over Istio's defaults (repeatable)",
    )
    add_run_flags(parser)
    args = parser.parse_args(argv)
    if args.additions < 1 or args.services < 1 or args.clients < 1:
        parser.error("counts must be positive")
    on_each = math.ceil(args.clients / args.services)  # sidecars on a service's endpoints
    if args.endpoints is None:
        args.endpoints = max(3, on_each + 1)
    if on_each >= args.endpoints:
        parser.error("each service needs an endpoint no sidecar sits on: more --endpoints")
    config = config_of(parser, args)
    if args.istiod:
        _istiod_fits(parser, config, args.secrets)
    return Args(config, args.additions, args.secrets, args.istiod, dict(args.istiod_env))


def _istiod_fits(parser: argparse.ArgumentParser, config: Config, secrets: bool) -> None:
    """--istiod's limits: no secrets (istiod's SDS is the agent's, not measured here), and
    in every client process a sidecar on a service without a TCP port: istiod sends only
    those on one `inbound|5432||`, which a process's report of the clusters all its
    streams got must not hold."""
    if secrets:
        parser.error("--istiod and --secrets: one or the other")
    first = 0
    for share in config.fleet.shares():
        if all((j % config.services) % TCP_EVERY == 0 for j in range(first, first + share)):
            parser.error("--istiod: each client process needs a sidecar off the TCP services")
        first += share


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config, additions = args.config, args.additions
    return run_main(
        lambda workdir: measure(
            config, additions, workdir, args.secrets, args.istiod_env if args.istiod else None
        ),
        lambda measured, machine, workdir: render(config, additions, measured, machine, workdir),
    )


if __name__ == "__main__":
    sys.exit(main())
