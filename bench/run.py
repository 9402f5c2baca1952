"""One bench run: the processes (API server, pilot, floor, peers, clients) and the phases.

`measure` builds the go-control-plane peers asked for (`bench.peers`), starts
the test API server with the mesh, then pilot, runs the pilot phase, stops
pilot, starts the floor with the bytes pilot sent, runs the floor phase, then
one phase per peer (go-control-plane serving the same resources, triggered as
the floor is), and stops everything, also on errors and cancellation. Every
server after pilot must give the clients what pilot gave them: as many
assignments at the sync, and per change exactly the expected resources.

A phase: RSS of the server with no client; N clients connect and sync; RSS
again; then the K changes one at a time, each timed from when it reached the
server to the last client's receipt, waiting for the server and clients to go
idle before the next; server CPU is read before the first and after the last.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import aiohttp

from bench import peers, pilot_cli, wire
from bench.fleet import Expected, Fleet, FleetSpec, Report, SecretsHeld
from bench.kube import SERVICE_NAME_LABEL, SLICES, KubeApi, Watch
from bench.procs import (
    PYTHON,
    ROOT,
    Child,
    cpu_seconds,
    log_match,
    read_line_starting,
    rss_bytes,
    spawn,
    wait_idle,
)
from bench.report import PhaseResult
from bench.workload import Change, Workload
from tests.fuzz.ready import ReadyProber

# Reached the server at (time.monotonic()), for change K.
Trigger = Callable[[int, Change], Awaitable[float]]


@dataclass(frozen=True)
class Config:
    """What one run measures, and how patiently."""

    services: int
    clients: int
    changes: int
    endpoints: int
    fleet: FleetSpec
    seed: int = 1
    timeout: float = 300.0
    pilot_env: dict[str, str] = field(default_factory=dict)
    pilot_log_level: str = "info"
    idle_seconds: float = 0.0  # after the sync: the server's CPU over this quiet window
    pilot_flags: tuple[str, ...] = ()  # more of pilot's flags, after the bench's own
    peers: tuple[str, ...] | None = ()  # go-control-plane caches (bench.peers); None: auto


@dataclass(frozen=True)
class Synced:
    """A server's RSS before any client and with all synced; how long the sync took."""

    rss_before: int
    rss_synced: int
    seconds: float
    retried_streams: int
    retries: int
    failures: dict[str, int]
    ready_latencies: list[float]  # /ready answers during the sync (empty: not probed)
    sent: Counter[str]  # bytes per type URL, all clients, until synced
    responses: Counter[str]  # responses per type URL, all clients, until synced
    cpu: float = 0.0  # the server's CPU seconds (user + system) from the start until synced
    secrets: SecretsHeld | None = None  # the sidecars' SDS streams, if they had any
    held: Counter[str] = field(default_factory=Counter)  # per type, what all clients follow


class Expectation(Protocol):
    """Something a series triggers: what to call it, and what every client is sent for it."""

    @property
    def label(self) -> str: ...

    @property
    def expected(self) -> Expected: ...


E = TypeVar("E", bound=Expectation)


@dataclass
class Series:
    """Items triggered one at a time: latencies, last receipts, process 0's reports, CPU."""

    latencies: list[float]
    last: list[float]
    reports: list[list[Report]]  # per item
    server_cpu: float  # seconds, over the whole series
    client_cpu: float
    responses: Counter[str]  # per type URL, all clients, since the sync, at the series' end


@dataclass
class PhaseRun:
    """A phase's figures, each change's last receipt, process 0's reports, and what the
    clients held at the sync."""

    result: PhaseResult
    last: list[float]
    reports: list[Report]
    held: Counter[str] = field(default_factory=Counter)


@dataclass
class Measured:
    """The phases, when pilot's apply requests were sent, and how pilot ran."""

    pilot: PhaseRun
    floor: PhaseRun
    sent: list[float]
    pilot_knobs: dict[str, str]
    pilot_flags: list[str]
    peers: dict[str, PhaseRun] = field(default_factory=dict)  # by tag (gcp-linear, ...)
    peers_note: str = ""  # why no peer ran, if none did


class Run:
    """The processes of one bench run; `close` stops whatever is still running."""

    def __init__(self, config: Config, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.children: list[Child] = []
        self.pilot_flags: list[str] = []
        self.stack = contextlib.AsyncExitStack()

    async def close(self) -> None:
        await self.stack.aclose()
        await asyncio.gather(*(c.stop() for c in self.children), return_exceptions=True)

    @contextlib.asynccontextmanager
    async def within(self, what: str) -> AsyncIterator[None]:
        """Fail with a clear message if the body takes longer than the configured timeout."""
        try:
            async with asyncio.timeout(self.config.timeout):
                yield
        except TimeoutError:
            raise TimeoutError(f"{what}: not done within {self.config.timeout:g}s") from None

    def report_logs(self) -> None:
        for child in self.children:
            print(f"--- {child.name} ({child.log}) ---\n{child.log_tail()}", file=sys.stderr)

    async def start_kubeapi(self, mesh_yaml: str) -> tuple[str, Path]:
        """The test API server loaded with the mesh; returns its URL and a kubeconfig."""
        mesh = self.workdir / "mesh.yaml"
        mesh.write_text(mesh_yaml)
        kubeconfig = self.workdir / "kubeconfig"
        argv = [PYTHON, "-m", "tests.kubeapi", "--port", "0", "--kubeconfig", str(kubeconfig)]
        child = await self._spawn("kubeapi", [*argv, "--load", str(mesh)], stdout=True)
        async with self.within("the API server's start"):
            url = await read_line_starting(child, "kubeapi listening on")
        return url, kubeconfig

    async def start_mesh(self, mesh_yaml: str) -> tuple[KubeApi, Path]:
        """The API server loaded with the mesh: a session to it (closed with the run), a
        kubeconfig for pilot."""
        url, kubeconfig = await self.start_kubeapi(mesh_yaml)
        api = KubeApi(url)
        self.stack.push_async_callback(api.close)
        return api, kubeconfig

    async def watch(self, api: KubeApi, path: str, label_selector: str | None = None) -> Watch:
        """A watch of the bench's own (stopped with the run)."""
        watch = Watch(api, path, label_selector)
        await watch.start()
        self.stack.push_async_callback(watch.stop)
        return watch

    async def start_pilot(self, kubeconfig: Path, name: str = "pilot") -> tuple[Child, str, int]:
        """Pilot on the Kubernetes registry, once /ready: it, its xDS address, its HTTP port.

        Pilot runs from the run's directory, not the repository root, so that a
        PYTHONPATH in its environment can choose which pilot runs. Its log is
        `name`.log there.
        """
        newer = pilot_cli.newer_flags(self.workdir)
        started = await self._start_pilot(kubeconfig, newer, name)
        if started is None:
            self.pilot_flags = self.pilot_flags[: -len(newer)]
            started = await self._start_pilot(kubeconfig, [], name)
        if started is None:
            raise RuntimeError(f"pilot refused its flags:\n{self.children[-1].log_tail()}")
        return started

    async def _start_pilot(
        self, kubeconfig: Path, extra: list[str], name: str
    ) -> tuple[Child, str, int] | None:
        """None if pilot exits refusing the extra flags."""
        self.pilot_flags = ["--log-level", pilot_cli.log_level(self.config.pilot_log_level)]
        self.pilot_flags += [*extra, *self.config.pilot_flags]
        argv = [PYTHON, "-m", "pilot", "discovery", "--kubeconfig", str(kubeconfig)]
        argv += ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]
        argv += self.pilot_flags
        child = await self._spawn(name, argv, env=self.config.pilot_env, cwd=self.workdir)
        async with self.within("pilot's /ready"):
            with contextlib.suppress(RuntimeError):  # it exited: see below why
                serving = await log_match(child, pilot_cli.SERVING)
                grpc_port, http_port = pilot_cli.serving_ports(serving)
                if await wait_ready(child, f"http://127.0.0.1:{http_port}/ready"):
                    return child, f"127.0.0.1:{grpc_port}", http_port
        await child.stop()
        if extra and pilot_cli.UNRECOGNIZED in child.log.read_text(errors="replace"):
            return None
        raise RuntimeError(f"pilot exited early:\n{child.log_tail()}")

    async def pilot_knobs(self) -> dict[str, str]:
        """The PILOT_* knobs in force, from `pilot discovery --help` (seconds to import)."""
        child = await self._spawn(
            "pilot-help",
            [PYTHON, "-m", "pilot", "discovery", "--help"],
            stdout=True,
            env=self.config.pilot_env,
            cwd=self.workdir,
        )
        assert child.process.stdout is not None
        usage = await child.process.stdout.read()
        await child.process.wait()  # it exits by itself; terminating it could race its reaping
        await child.stop()
        return pilot_cli.knobs(usage.decode(), {**os.environ, **self.config.pilot_env})

    async def start_floor(self, initial: Path, changes: Path) -> tuple[Child, str]:
        argv = [PYTHON, "-m", "bench.floor", "--initial", str(initial), "--changes", str(changes)]
        # On pilot's event loop: what the floor saves on the loop is not pilot's to claim.
        loop = {k: v for k, v in self.config.pilot_env.items() if k == "PILOT_EVENT_LOOP"}
        child = await self._spawn("floor", argv, stdin=True, stdout=True, env=loop)
        async with self.within("the floor's start"):
            port = await read_line_starting(child, "floor listening on")
        return child, f"127.0.0.1:{port}"

    async def start_peer(
        self, binary: Path, kind: str, initial: Path, changes: Path
    ) -> tuple[Child, str]:
        """go-control-plane serving the recorded resources from its `kind` cache."""
        argv = [str(binary), "-cache", kind, "-initial", str(initial), "-changes", str(changes)]
        child = await self._spawn(peers.tag(kind), argv, stdin=True, stdout=True)
        async with self.within(f"{peers.tag(kind)}'s start"):
            port = await read_line_starting(child, peers.LISTENING)
        return child, f"127.0.0.1:{port}"

    async def spawn(
        self, name: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT
    ) -> Child:
        """Another server of the run (stopped with it); its stderr and stdout in `name`.log."""
        return await self._spawn(name, argv, env=env, cwd=cwd)

    async def _spawn(
        self,
        name: str,
        argv: list[str],
        *,
        stdout: bool = False,
        stdin: bool = False,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> Child:
        log = self.workdir / f"{name}.log"
        child = await spawn(name, argv, log, stdin=stdin, stdout=stdout, env=env, cwd=cwd)
        self.children.append(child)
        return child

    @contextlib.asynccontextmanager
    async def synced_fleet(
        self,
        tag: str,
        server: Child,
        target: str,
        *,
        capture: Path | None = None,
        ready_port: int | None = None,
        spec: FleetSpec | None = None,
    ) -> AsyncIterator[tuple[Fleet, Synced]]:
        """Connect N clients to the server and wait until all are synced; stop them after.

        With `ready_port`, the server's /ready is probed every 10 ms during the sync:
        its answers are the event loop's lag while every client connects at once.
        `spec`: the clients, if not the configured ones.
        """
        await wait_idle([server.pid])
        rss_before = rss_bytes(server.pid)
        fleet = Fleet()
        prober = ReadyProber(ready_port) if ready_port is not None else None
        try:
            if prober is not None:
                await prober.start()
            started, cpu_before = time.monotonic(), cpu_seconds(server.pid)
            await fleet.start(target, spec or self.config.fleet, self.workdir, tag, capture)
            async with self.within(f"{tag}: the clients' initial sync"):
                synced = await fleet.wait_synced() - started
            sync_cpu = cpu_seconds(server.pid) - cpu_before
            lag = prober.latencies_since(started) if prober is not None else []
            if prober is not None:
                await prober.stop()  # the changes are measured without probes
                prober = None
            await wait_idle([server.pid, *fleet.pids])
            sent, responses = fleet.sync_traffic()
            rss_synced = rss_bytes(server.pid)
            yield (
                fleet,
                Synced(
                    rss_before,
                    rss_synced,
                    synced,
                    *fleet.retried(),
                    lag,
                    sent,
                    responses,
                    sync_cpu,
                    fleet.secrets(),
                    fleet.held(),
                ),
            )
        finally:
            await fleet.stop()
            if prober is not None:
                await prober.stop()

    async def phase(
        self,
        tag: str,
        server: Child,
        target: str,
        *,
        trigger: Trigger,
        changes: Sequence[Change],
        capture: Path | None = None,
        ready_port: int | None = None,
    ) -> PhaseRun:
        """Connect N clients to the server, sync, then time each change."""
        synced = self.synced_fleet(tag, server, target, capture=capture, ready_port=ready_port)
        async with synced as (fleet, sync):
            idle = await _idle_share(server.pid, self.config.idle_seconds)
            series = await self.series(fleet, server, trigger, changes)
        count = max(1, len(changes))
        result = PhaseResult(
            latencies=series.latencies,
            cpu_per_change=series.server_cpu / count,
            rss_before=sync.rss_before,
            rss_synced=sync.rss_synced,
            clients=self.config.clients,
            sync_seconds=sync.seconds,
            sync_cpu=sync.cpu,
            client_cpu_per_change=series.client_cpu / count,
            response_bytes=[int(r[0]["bytes"]) for r in series.reports],
            responses_per_client=series.responses.total() / count / self.config.clients,
            retried_streams=sync.retried_streams,
            retries=sync.retries,
            failures=sync.failures,
            ready_latencies=sync.ready_latencies,
            idle_cpu_share=idle,
        )
        return PhaseRun(result, series.last, [r[0] for r in series.reports], sync.held)

    async def series(
        self,
        fleet: Fleet,
        server: Child,
        trigger: Callable[[int, E], Awaitable[float]],
        items: Sequence[E],
    ) -> Series:
        """Each item in turn: trigger it, wait until every client got what it sends, then
        until the server and clients are idle; server and client CPU over all of it."""
        pids = [server.pid, *fleet.pids]
        cpu_before = cpu_seconds(server.pid)
        clients_before = sum(cpu_seconds(pid) for pid in fleet.pids)
        latencies, last, reports = [], [], []
        got: list[list[Report]] = []
        for k, item in enumerate(items):
            async with self.within(f"change {k} ({item.label})"):
                reached = await trigger(k, item)
                got = await fleet.updates_for(item.expected)
            last.append(max(float(r["last"]) for mine in got for r in mine))
            latencies.append(last[-1] - reached)
            reports.append(got[0])
            await wait_idle(pids)
        responses: Counter[str] = Counter()
        for mine in got:  # each process's last report counts its responses since the sync
            responses.update(mine[-1]["by_type"])
        return Series(
            latencies,
            last,
            reports,
            cpu_seconds(server.pid) - cpu_before,
            sum(cpu_seconds(pid) for pid in fleet.pids) - clients_before,
            responses,
        )


async def _idle_share(pid: int, seconds: float) -> float | None:
    """The share of one core `pid` used over `seconds` with every client synced and quiet."""
    if seconds <= 0:
        return None
    before, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)  # the window measured: nothing happens in it by design
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


async def wait_ready(child: Child, url: str) -> bool:
    """True once url answers 200; False if the child exits first."""
    async with aiohttp.ClientSession() as session:
        while child.running:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return True
            await asyncio.sleep(0.05)
    return False


class ApiTrigger:
    """Changes go through the API server; one reaches pilot with its watch event."""

    def __init__(self, api: KubeApi, watch: Watch) -> None:
        self.api = api
        self.watch = watch
        self.sent: list[float] = []  # when each apply request was sent

    async def __call__(self, index: int, change: Change) -> float:
        self.sent.append(time.monotonic())
        resource_version = await self.api.apply(change.slice)
        return await self.watch.arrival(resource_version)


class PipeTrigger:
    """Changes reach the floor (or a peer) as a line on its stdin: change K's responses, by
    default response K alone."""

    def __init__(self, server: Child, responses: Sequence[Sequence[int]] | None = None) -> None:
        assert server.process.stdin is not None
        self.stdin = server.process.stdin
        self.responses = responses

    async def __call__(self, index: int, change: Expectation) -> float:
        line = " ".join(map(str, self.responses[index])) if self.responses else str(index)
        now = time.monotonic()
        self.stdin.write(f"{line}\n".encode())
        await self.stdin.drain()
        return now


async def measure(config: Config, workdir: Path) -> Measured:
    """Start the processes, run the phases, stop everything (logs shown on failure)."""
    workload = Workload(config.services, config.endpoints, config.seed)
    mesh_yaml = workload.yaml()
    changes = [workload.change() for _ in range(config.changes)]
    chosen = await peers.resolve(config.peers)  # built before anything is measured
    run = Run(config, workdir)
    try:
        knobs = asyncio.create_task(run.pilot_knobs())  # only for the report: not waited on
        api, kubeconfig = await run.start_mesh(mesh_yaml)
        watch = await run.watch(api, SLICES, SERVICE_NAME_LABEL)
        pilot, pilot_target, http_port = await run.start_pilot(kubeconfig)
        trigger = ApiTrigger(api, watch)
        initial = workdir / "initial.bin"
        ours = await run.phase(
            "pilot",
            pilot,
            pilot_target,
            trigger=trigger,
            changes=changes,
            capture=initial,
            ready_port=http_port,
        )
        await pilot.stop()
        replay = workdir / "changes.bin"
        wire.write_records(replay, [base64.b64decode(r["raw"]) for r in ours.reports])
        floor, floor_target = await run.start_floor(initial, replay)
        floor_trigger = PipeTrigger(floor)
        base = await run.phase("floor", floor, floor_target, trigger=floor_trigger, changes=changes)
        await floor.stop()
        same_mesh("floor", ours, base)
        others = await _peer_phases(run, chosen, (initial, replay), ours, changes)
        measured = Measured(ours, base, trigger.sent, await knobs, run.pilot_flags)
        measured.peers, measured.peers_note = others, chosen.note
        return measured
    except Exception:
        run.report_logs()
        raise
    finally:
        await run.close()


async def _peer_phases(
    run: Run,
    chosen: peers.Peers,
    recorded: tuple[Path, Path],
    ours: PhaseRun,
    changes: Sequence[Change],
) -> dict[str, PhaseRun]:
    """One phase per go-control-plane cache, each on the resources pilot sent (`recorded`:
    the initial and changes files), triggered as the floor is; each stopped before the next
    starts."""
    measured: dict[str, PhaseRun] = {}
    for kind in chosen.kinds:
        assert chosen.binary is not None
        tag = peers.tag(kind)
        peer, target = await run.start_peer(chosen.binary, kind, *recorded)
        trigger = PipeTrigger(peer)
        measured[tag] = await run.phase(tag, peer, target, trigger=trigger, changes=changes)
        await peer.stop()
        same_mesh(tag, ours, measured[tag])
    return measured


def same_mesh(tag: str, pilot: PhaseRun, other: PhaseRun) -> None:
    """RuntimeError unless the clients of `other` followed as many resources of each type
    at the sync as pilot's did: a server that serves less is no comparison. (Per change,
    `Run.series` already fails on anything but the expected resources.)"""
    if other.held != pilot.held:  # a type held by none equals one not reported
        raise RuntimeError(
            f"{tag}: the clients followed {dict(other.held)} at the sync, "
            f"pilot's {dict(pilot.held)}: not the same mesh"
        )
