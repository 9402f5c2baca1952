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
from dataclasses import dataclass
from pathlib import Path

from bench import pilot_cli, wire
from bench.certificates import bare_mint_seconds
from bench.kube import SERVICE_NAME_LABEL, SERVICES, SLICES, KubeApi, Watch
from bench.procs import Child, wait_idle
from bench.report import latency_rows, percentile, ratio_table
from bench.run import ApiTrigger, Config, PipeTrigger, Run, Series, Synced
from bench.runner import (
    Machine,
    add_mesh_flags,
    add_run_flags,
    config_of,
    pilot_log_summary,
    run_main,
)
from bench.sidecar_mesh import TCP_EVERY, Addition, SidecarMesh

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

    async def __call__(self, index: int, addition: Addition) -> float:
        await self.slices.arrival(await self.api.apply(addition.slice))
        await wait_idle([self.pilot.pid])
        return await self.services.arrival(await self.api.apply(addition.service))


async def measure(
    config: Config, additions: int, workdir: Path, secrets: bool = False
) -> SidecarMeasured:
    """Start the processes, sync the sidecars (with secrets: twice), run both series, stop
    everything."""
    mesh = SidecarMesh(
        config.services,
        config.endpoints,
        sidecars=config.clients,
        additions=additions,
        changes=config.changes,
        seed=config.seed,
    )
    nodes = workdir / "nodes.jsonl"
    mesh.write_nodes(nodes)
    sidecars = dataclasses.replace(config.fleet, nodes=nodes)
    config = dataclasses.replace(config, fleet=sidecars, pilot_flags=LISTENERS_ON_PLAINTEXT)
    run = Run(config, workdir)
    try:
        knobs = asyncio.create_task(run.pilot_knobs())  # only for the report: not waited on
        api, kubeconfig = await run.start_mesh(mesh.yaml())
        slices = await run.watch(api, SLICES, SERVICE_NAME_LABEL)
        services = await run.watch(api, SERVICES)
        initial = workdir / "initial.bin"
        plain = await _plain_sync(run, kubeconfig, initial) if secrets else None
        pilot, target, http_port = await run.start_pilot(kubeconfig)
        spec = dataclasses.replace(sidecars, secrets=secrets)
        # With secrets, the capture only serves the series (their raw responses): the floor
        # replays the sync without secrets.
        capture = workdir / "initial-secrets.bin" if secrets else initial
        synced = run.synced_fleet(
            "pilot", pilot, target, capture=capture, ready_port=http_port, spec=spec
        )
        async with synced as (fleet, sync):
            add = AdditionTrigger(api, slices, services, pilot)
            added = await run.series(fleet, pilot, add, mesh.additions)
            changed = await run.series(fleet, pilot, ApiTrigger(api, slices), mesh.changes)
        ours = Phase(sync, added, changed)
        await pilot.stop()  # before the API server: its log ends with the run, not with retries
        base = await _floor_phase(run, mesh, initial, ours)
        measured = SidecarMeasured(ours, base, await knobs, run.pilot_flags, plain)
    except Exception:
        run.report_logs()
        raise
    finally:
        await run.close()
    if secrets:  # every process stopped: the mint has the machine to itself, as pilot had
        measured.bare_mint = await asyncio.to_thread(bare_mint_seconds, BARE_MINTS)
    return measured


async def _plain_sync(run: Run, kubeconfig: Path, capture: Path) -> Synced:
    """The sidecars' sync without secrets, by a pilot of its own (stopped after)."""
    pilot, target, http_port = await run.start_pilot(kubeconfig, name="pilot-plain")
    async with run.synced_fleet(
        "pilot-plain", pilot, target, capture=capture, ready_port=http_port
    ) as (_, sync):
        pass
    await pilot.stop()
    return sync


async def _floor_phase(run: Run, mesh: SidecarMesh, initial: Path, ours: Phase) -> Phase:
    """The floor, replaying what pilot sent sidecar 0, to sidecars of the same kind."""
    records: list[bytes] = []
    adding = _replay(ours.added, records)
    changing = _replay(ours.changed, records)
    replay = run.workdir / "changes.bin"
    wire.write_records(replay, records)
    floor, target = await run.start_floor(initial, replay)
    async with run.synced_fleet("floor", floor, target) as (fleet, sync):
        added = await run.series(fleet, floor, PipeTrigger(floor, adding), mesh.additions)
        changed = await run.series(fleet, floor, PipeTrigger(floor, changing), mesh.changes)
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
            machine.describe(os.cpu_count() or 1),
        ]
    )


@dataclass(frozen=True)
class Args:
    """The run's configuration, and what only this bench has."""

    config: Config
    additions: int
    secrets: bool


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
    add_run_flags(parser)
    args = parser.parse_args(argv)
    if args.additions < 1 or args.services < 1 or args.clients < 1:
        parser.error("counts must be positive")
    on_each = math.ceil(args.clients / args.services)  # sidecars on a service's endpoints
    if args.endpoints is None:
        args.endpoints = max(3, on_each + 1)
    if on_each >= args.endpoints:
        parser.error("each service needs an endpoint no sidecar sits on: more --endpoints")
    return Args(config_of(parser, args), args.additions, args.secrets)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config, additions = args.config, args.additions
    return run_main(
        lambda workdir: measure(config, additions, workdir, args.secrets),
        lambda measured, machine, workdir: render(config, additions, measured, machine, workdir),
    )


if __name__ == "__main__":
    sys.exit(main())
