"""`python -m bench.route_push`: a VirtualService's weight change against an endpoint
change, pushed to N sidecars, from the registry file.

One `pilot discovery --config FILE` subprocess (127.0.0.1, ephemeral ports,
`--xds-auth none`) on a file of S services (`svc-I`, namespace `bench`, one HTTP
port 9080, two Pods labelled `version: v1` and `v2` behind it), each with a
DestinationRule (subsets v1, v2) and a VirtualService splitting it 50/50. N
sidecars (`bench.clients --nodes`: delta ADS, CDS `*`, EDS, LDS `*`, the RDS
their listeners name, every response ACKed; node ids of Pods of the mesh) sync.
Then, one at a time, each after pilot and the clients are idle:

- K weight changes: one service's VirtualService goes from 50/50 to 80/20 (or
  back); the file is rewritten whole, as `kubectl ... > file` does;
- K endpoint changes: one Pod of one service gets another address;
- K namespace-scoped changes: a VirtualService written in namespace `front`
  for svc-0000 with `exportTo: ["."]` goes from 50/50 to 80/20 (or back): only
  the F sidecars of `front` (a client process of their own, `--front`, node
  metadata NAMESPACE front) read it, through their namespace's route flavor;
- K endpoint changes under a namespace's own DestinationRule: front also has a
  DestinationRule of its own for svc-0000 (`exportTo: ["."]`, a subset `front-v1`
  of its v1 Pod and a connection pool), so front's sidecars read svc-0000's
  clusters and that subset's assignment from their namespace's flavor; svc-0000's
  v1 Pod gets another address, timed to the last of front's sidecars receiving
  their `front-v1` assignment (everyone else gets the shared assignments as in
  the endpoint series).

Latency runs from the write to the last sidecar receiving the new resource
(route configuration 9080, or the service's assignment; for the namespace-scoped
change, the last of front's sidecars); it includes pilot
noticing and parsing the whole file (JSON, as `kubectl ... -o json` writes it),
the same for both series, so the push alone is also timed from pilot's "loaded"
log line (its wall clock, mapped onto the bench's). Bytes per sidecar
is the size of the response carrying it; `responses` counts every response of
each type all sidecars received over the series (a weight change must cost one
RDS response per sidecar and nothing else; a namespace-scoped one, one per
sidecar of that namespace, F/(N+F) per sidecar; a process reports what its
streams received once all of them received a version, so what fewer of them got is
left out here: `tests/integration/test_counting_client_routes.py` proves the
scoped change reaches no one else). Every sidecar proves its namespace
by its node metadata (`--xds-auth none`: NAMESPACE, SERVICE_ACCOUNT).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.kubectl_files import write_whole
from bench.pilot_cli import SERVING, newer_flags, serving_ports
from bench.procs import PYTHON, Child, log_match, spawn, wait_idle
from bench.report import percentile
from pilot.xds import types

NAMESPACE = "bench"
FRONT = "front"
FRONT_SUBSET = "front-v1"  # the subset front's own DestinationRule gives svc-0000's v1 Pod
PORT = 9080
WAIT = 600.0  # seconds a sync or a change may take


def _ip(service: int, version: int) -> str:
    index = service * 2 + version
    return f"10.{64 + index // 65536}.{index // 256 % 256}.{index % 256}"


@dataclass
class Mesh:
    """The registry file's objects; `weights[i]` is svc-i's v1 weight (v2 has the rest)."""

    services: int
    weights: list[int] = field(default_factory=list)
    front_weight: int = 50  # the v1 weight of front's own VirtualService for svc-0000
    moved: dict[tuple[int, int], str] = field(default_factory=dict)  # pod -> its new IP

    def __post_init__(self) -> None:
        self.weights = [50] * self.services

    def pod_ip(self, service: int, version: int) -> str:
        return self.moved.get((service, version), _ip(service, version))

    def objects(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for i in range(self.services):
            found += self._service(i)
        return [*found, self._front_virtual_service(), self._front_destination_rule()]

    @staticmethod
    def _front_destination_rule() -> dict[str, Any]:
        """front's own DestinationRule for svc-0000, exported to front alone."""
        host = f"svc-0000.{NAMESPACE}.svc.cluster.local"
        spec = {
            "host": host,
            "exportTo": ["."],
            "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 100}}},
            "subsets": [{"name": FRONT_SUBSET, "labels": {"version": "v1"}}],
        }
        return {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "svc-0000-front", "namespace": FRONT},
            "spec": spec,
        }

    def _front_virtual_service(self) -> dict[str, Any]:
        """front's VirtualService for svc-0000, exported to front alone."""
        host = f"svc-0000.{NAMESPACE}.svc.cluster.local"
        split = (("v1", self.front_weight), ("v2", 100 - self.front_weight))
        route = [{"destination": {"host": host, "subset": v}, "weight": w} for v, w in split]
        return {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "svc-0000-front", "namespace": FRONT},
            "spec": {"hosts": [host], "exportTo": ["."], "http": [{"route": route}]},
        }

    def _service(self, i: int) -> list[dict[str, Any]]:
        name = f"svc-{i:04d}"
        meta = {"name": name, "namespace": NAMESPACE}
        ips = [self.pod_ip(i, v) for v in (0, 1)]
        pods = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-v{v + 1}",
                    "namespace": NAMESPACE,
                    "labels": {"app": name, "version": f"v{v + 1}"},
                },
                "spec": {"containers": [{"name": "app"}]},
                "status": {"phase": "Running", "podIP": ips[v], "podIPs": [{"ip": ips[v]}]},
            }
            for v in (0, 1)
        ]
        endpoints = [
            {
                "addresses": [ips[v]],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": f"{name}-v{v + 1}", "namespace": NAMESPACE},
            }
            for v in (0, 1)
        ]
        return [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": meta,
                "spec": {"ports": [{"name": "http", "port": PORT, "protocol": "TCP"}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-1",
                    "namespace": NAMESPACE,
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
            },
            *pods,
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "DestinationRule",
                "metadata": meta,
                "spec": {
                    "host": name,
                    "subsets": [{"name": v, "labels": {"version": v}} for v in ("v1", "v2")],
                },
            },
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": meta,
                "spec": {
                    "hosts": [name],
                    "http": [
                        {
                            "route": [
                                {
                                    "destination": {"host": name, "subset": v},
                                    "weight": w,
                                }
                                for v, w in (("v1", self.weights[i]), ("v2", 100 - self.weights[i]))
                            ]
                        }
                    ],
                },
            },
        ]

    def text(self) -> str:
        """`kubectl get ... -o json`'s shape: JSON reads faster than YAML at this size."""
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": self.objects()})

    def nodes(self, count: int) -> str:
        """Sidecar j is svc-(j % S)'s Pod v(j // S % 2 + 1), as bench.clients reads them."""
        lines = []
        for j in range(count):
            service, version = j % self.services, j // self.services % 2
            pod = f"svc-{service:04d}-v{version + 1}.{NAMESPACE}"
            node_id = f"sidecar~{self.pod_ip(service, version)}~{pod}~{NAMESPACE}.svc.cluster.local"
            lines.append(_node_line(node_id, NAMESPACE))
        return "".join(lines)

    @staticmethod
    def front_nodes(count: int) -> str:
        """Sidecars of namespace front (their Pods not in the file: the namespace's flavor)."""
        ids = (f"sidecar~10.250.{j // 256}.{j % 256}~c-{j}.{FRONT}~{FRONT}" for j in range(count))
        return "".join(_node_line(f"{node_id}.svc.cluster.local", FRONT) for node_id in ids)


def _node_line(node_id: str, namespace: str) -> str:
    metadata = {
        "NAMESPACE": namespace,
        "SERVICE_ACCOUNT": "default",
        "INTERCEPTION_MODE": "REDIRECT",
    }
    return json.dumps({"id": node_id, "metadata": metadata}) + "\n"


@dataclass
class Series:
    """One kind of change: its latencies (s) and the bytes one sidecar got for each."""

    latencies: list[float] = field(default_factory=list)
    pushes: list[float] = field(default_factory=list)  # from pilot's "loaded" line
    sizes: list[int] = field(default_factory=list)
    responses: Counter[str] = field(default_factory=Counter)


async def _next_event(child: Child) -> dict[str, Any]:
    assert child.process.stdout is not None
    while True:
        line = await child.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{child.name} exited: {child.log_tail()}")
        text = line.decode().strip()
        if text.startswith("{"):
            event: dict[str, Any] = json.loads(text)
            if event.get("event") == "error":
                raise RuntimeError(f"{child.name}: {event.get('message')}")
            return event


async def _updated(
    children: list[Child], type_url: str, name: str, seen: list[Counter[str]]
) -> tuple[float, int]:
    """The latest arrival over all processes of the next version of `name`, its size;
    `seen[p]` becomes process p's responses by type since the sync, as it last said."""
    last, size = 0.0, 0
    for p, child in enumerate(children):
        while True:
            event = await _next_event(child)
            if event.get("event") != "update":
                continue
            seen[p] = Counter(event["by_type"])
            if event["type"] == type_url and event["name"] == name:
                break
        last, size = max(last, event["last"]), int(event["bytes"])
    return last, size


@dataclass(frozen=True)
class Config:
    services: int
    sidecars: int
    changes: int
    processes: int
    front: int = 0  # sidecars of namespace front, besides `sidecars`


async def _start_clients(config: Config, grpc_port: int, nodes: Path, workdir: Path) -> list[Child]:
    children = []
    per = -(-config.sidecars // config.processes)
    for p in range(config.processes):
        count = min(per, config.sidecars - p * per)
        if count <= 0:
            break
        argv = [PYTHON, "-m", "bench.clients", "--target", f"127.0.0.1:{grpc_port}"]
        argv += ["--streams", str(count), "--first-id", str(p * per), "--nodes", str(nodes)]
        argv += ["--retries", "5"]  # a stream cut during the sync comes back, as Envoy's
        log = workdir / f"clients-{p}.log"
        children.append(await spawn(f"clients-{p}", argv, log, stdin=True, stdout=True))
    return children


async def _synced(children: list[Child]) -> None:
    for child in children:
        async with asyncio.timeout(WAIT):
            while (await _next_event(child)).get("event") != "synced":
                pass


class Run:
    """pilot, its file, the clients, and what they received."""

    def __init__(
        self, mesh: Mesh, path: Path, pilot: Child, children: list[Child], front: Child | None
    ) -> None:
        self.mesh, self.path, self.pilot = mesh, path, pilot
        self.children = [*children, *([front] if front is not None else [])]
        self.front = front
        self.pids = [pilot.pid, *(c.pid for c in self.children)]
        self.seen: list[Counter[str]] = [Counter() for _ in self.children]
        self._log_lines = 0

    def responses(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.seen:
            total.update(counts)
        return total

    async def change(
        self, series: Series, type_url: str, name: str, front_only: bool = False
    ) -> None:
        """Write the mesh as it is now; time it to `name`'s arrival at every sidecar (of
        front, `front_only`)."""
        written, wall = time.monotonic(), time.time()
        write_whole(self.path, self.mesh.text())
        waited = [self.front] if front_only and self.front is not None else self.children
        seen = [self.seen[self.children.index(c)] for c in waited]
        async with asyncio.timeout(WAIT):
            last, size = await _updated(waited, type_url, name, seen)
        for child, counts in zip(waited, seen, strict=True):
            self.seen[self.children.index(child)] = counts
        series.latencies.append(last - written)
        series.sizes.append(size)
        loaded = self._loaded_at()
        if loaded is not None:  # pilot's clock: its log line's wall time, on ours
            series.pushes.append(last - (written + loaded - wall))

    def _loaded_at(self) -> float | None:
        """The wall time of pilot's last "loaded" log line since the last call."""
        lines = self.pilot.log.read_text(errors="replace").splitlines()
        found = None
        for line in lines[self._log_lines :]:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if str(entry.get("msg", "")).startswith("loaded "):
                    found = datetime.datetime.fromisoformat(entry["time"]).timestamp()
        self._log_lines = len(lines)
        return found


@dataclass
class AllSeries:
    weights: Series = field(default_factory=Series)
    endpoints: Series = field(default_factory=Series)
    scoped: Series = field(default_factory=Series)  # front's VirtualService
    scoped_endpoints: Series = field(default_factory=Series)  # under front's rule


async def _series(run: Run, changes: int) -> AllSeries:
    found = AllSeries()
    weights, endpoints, scoped = found.weights, found.endpoints, found.scoped
    for k in range(changes):
        await wait_idle(run.pids, window=0.2, limit=30)
        # Never svc-0000: front's sidecars route it by their own VirtualService, so its
        # shared weights change nothing they read (and they would report no update).
        i = 1 + (k * 7919) % (run.mesh.services - 1) if run.mesh.services > 1 else 0
        run.mesh.weights[i] = 80 if run.mesh.weights[i] == 50 else 50
        await run.change(weights, types.ROUTE, str(PORT))
    await wait_idle(run.pids, window=0.2, limit=30)
    before = run.responses()
    weights.responses = before
    for k in range(changes):
        await wait_idle(run.pids, window=0.2, limit=30)
        i = (k * 104729) % run.mesh.services
        run.mesh.moved[(i, 1)] = f"10.200.{k // 256}.{k % 256}"
        host = f"svc-{i:04d}.{NAMESPACE}.svc.cluster.local"
        await run.change(endpoints, types.ENDPOINT, f"outbound|{PORT}||{host}")
    await wait_idle(run.pids, window=0.2, limit=30)
    endpoints.responses = run.responses() - before
    if run.front is None:
        return found
    before = run.responses()
    for _ in range(changes):
        await wait_idle(run.pids, window=0.2, limit=30)
        run.mesh.front_weight = 80 if run.mesh.front_weight == 50 else 50
        await run.change(scoped, types.ROUTE, str(PORT), front_only=True)
    await wait_idle(run.pids, window=0.2, limit=30)
    scoped.responses = run.responses() - before
    await _scoped_endpoints(run, changes, found.scoped_endpoints)
    return found


async def _scoped_endpoints(run: Run, changes: int, series: Series) -> None:
    """svc-0000's v1 Pod moves; timed to front's sidecars' `front-v1` assignment, read from
    their namespace's flavor of the clusters."""
    before = run.responses()
    name = f"outbound|{PORT}|{FRONT_SUBSET}|svc-0000.{NAMESPACE}.svc.cluster.local"
    for k in range(changes):
        await wait_idle(run.pids, window=0.2, limit=30)
        run.mesh.moved[(0, 0)] = f"10.201.{k // 256}.{k % 256}"
        await run.change(series, types.ENDPOINT, name, front_only=True)
    await wait_idle(run.pids, window=0.2, limit=30)
    series.responses = run.responses() - before


async def measure(config: Config, workdir: Path) -> tuple[AllSeries, float]:
    mesh = Mesh(config.services)
    path = workdir / "mesh.json"
    write_whole(path, mesh.text())
    nodes = workdir / "nodes.jsonl"
    nodes.write_text(mesh.nodes(config.sidecars))
    argv = [PYTHON, "-m", "pilot", "discovery", "--config", str(path), "--log-format", "json"]
    argv += ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", *newer_flags(workdir)]
    pilot = await spawn("pilot", argv, workdir / "pilot.log")
    children: list[Child] = []
    front: Child | None = None
    try:
        async with asyncio.timeout(WAIT):
            grpc_port, _ = serving_ports(await log_match(pilot, SERVING))
        started = time.monotonic()
        children = await _start_clients(config, grpc_port, nodes, workdir)
        if config.front:
            front_nodes = workdir / "front.jsonl"
            front_nodes.write_text(Mesh.front_nodes(config.front))
            front = await _front_client(config, grpc_port, front_nodes, workdir)
        await _synced([*children, *([front] if front is not None else [])])
        sync = time.monotonic() - started
        run = Run(mesh, path, pilot, children, front)
        return await _series(run, config.changes), sync
    except BaseException:
        print(f"pilot's log ends:\n{pilot.log_tail(40)}", file=sys.stderr)
        raise
    finally:
        for child in [*children, *([front] if front is not None else [])]:
            await child.stop()
        await pilot.stop()


async def _front_client(config: Config, grpc_port: int, nodes: Path, workdir: Path) -> Child:
    argv = [PYTHON, "-m", "bench.clients", "--target", f"127.0.0.1:{grpc_port}"]
    argv += ["--streams", str(config.front), "--nodes", str(nodes), "--retries", "5"]
    return await spawn(
        "clients-front", argv, workdir / "clients-front.log", stdin=True, stdout=True
    )


def _short(type_url: str) -> str:
    return types.short_name(type_url)


def render(config: Config, found: AllSeries, sync: float) -> str:
    everyone = config.sidecars + config.front

    def row(name: str, series: Series) -> str:
        ms = [latency * 1000 for latency in series.latencies]
        push = [latency * 1000 for latency in series.pushes]
        size = sum(series.sizes) / len(series.sizes) / 1024
        per_change = {
            _short(t): n / (config.changes * everyone) for t, n in series.responses.items()
        }
        sent = ", ".join(f"{t} {n:.2f}" for t, n in sorted(per_change.items()))
        return (
            f"| {name} | {percentile(ms, 50):,.0f} / {percentile(ms, 99):,.0f} ms"
            f" | {percentile(push, 50):,.0f} / {percentile(push, 99):,.0f} ms"
            f" | {size:.2f} KiB | {sent} |"
        )

    scoped_rows = (
        [
            row(f"weight, exported to one namespace ({config.front} sidecars)", found.scoped),
            row(
                f"endpoint, under that namespace's own DestinationRule ({config.front} sidecars)",
                found.scoped_endpoints,
            ),
        ]
        if config.front
        else []
    )
    return "\n".join(
        [
            f"S={config.services} services, each with a DestinationRule (2 subsets) and a"
            f" VirtualService (50/50); N={config.sidecars} sidecars of their namespace,"
            f" F={config.front} of namespace front; K={config.changes}"
            f" changes of each kind; initial sync {sync:.1f} s.",
            "",
            "| change | from the write p50 / p99 | from the file loaded p50 / p99"
            " | bytes per sidecar | responses per sidecar per change |",
            "|---|---|---|---|---|",
            row("weight (VirtualService)", found.weights),
            row("endpoint (EndpointSlice)", found.endpoints),
            *scoped_rows,
        ]
    )


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m bench.route_push", description=__doc__)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--sidecars", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=20, help="of each kind")
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument(
        "--front", type=int, default=100, help="sidecars of namespace front (0: no such series)"
    )
    args = parser.parse_args(argv)
    return Config(args.services, args.sidecars, args.changes, args.processes, args.front)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-route-push-") as workdir:
        found, sync = asyncio.run(measure(config, Path(workdir)))
    print(render(config, found, sync))
    return 0


if __name__ == "__main__":
    sys.exit(main())
