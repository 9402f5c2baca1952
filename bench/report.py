"""What a bench phase measured, and the table that compares pilot with the floor (and
with the go-control-plane peers, when they ran)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class PhaseResult:
    """The figures of one server (pilot or the floor) over one phase."""

    latencies: list[float]  # seconds, from the change reaching the server to the last client
    cpu_per_change: float  # seconds of server CPU
    rss_before: int  # bytes, before any client
    rss_synced: int  # bytes, with every client synced
    clients: int
    sync_seconds: float
    client_cpu_per_change: float
    response_bytes: list[int]
    responses_per_client: float  # per change: 1.0 when each change costs one response each
    retried_streams: int = 0  # failed and opened again before the sync
    retries: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # why streams failed -> count
    ready_latencies: list[float] = field(default_factory=list)  # /ready during the sync
    idle_cpu_share: float | None = None  # of one core, all clients synced and quiet
    sync_cpu: float = 0.0  # server CPU seconds during the initial sync

    @property
    def memory_per_client(self) -> float:
        return (self.rss_synced - self.rss_before) / self.clients


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), interpolating linearly between order statistics."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


# The rows of the push table: a label and the figure of one phase.
FIGURES: tuple[tuple[str, Callable[[PhaseResult], float]], ...] = (
    ("latency p50 (ms)", lambda r: percentile(r.latencies, 50) * 1e3),
    ("latency p99 (ms)", lambda r: percentile(r.latencies, 99) * 1e3),
    ("CPU per change (ms)", lambda r: r.cpu_per_change * 1e3),
    ("memory per client (KiB)", lambda r: r.memory_per_client / 1024),
    ("initial sync (s)", lambda r: r.sync_seconds),
)


def table(
    pilot: PhaseResult, floor: PhaseResult, peers: Mapping[str, PhaseResult] | None = None
) -> str:
    """Rows latency p50/p99, CPU per change, memory per client, initial sync; columns
    pilot, floor, then each peer by name, then pilot's ratio to the floor."""
    servers = {"pilot": pilot, "floor": floor, **(peers or {})}
    widths = [max(10, len(name) + 2) for name in servers]
    header = "".join(f"{name:>{w}}" for name, w in zip(servers, widths, strict=True))
    lines = [f"{'':<30}{header}{'ratio':>8}"]
    for label, figure in FIGURES:
        cells = "".join(
            f"{figure(result):>{w}.2f}" for result, w in zip(servers.values(), widths, strict=True)
        )
        ratio = _ratio(figure(pilot), figure(floor))
        lines.append(f"{label:<30}{cells}{ratio:>8.2f}")
    return "\n".join(lines)


def latency_rows(ours: Sequence[float], base: Sequence[float]) -> list[tuple[str, float, float]]:
    """Rows latency p50 and p99 in milliseconds, of two sets of latencies in seconds."""
    return [
        (f"latency p{q} (ms)", percentile(ours, q) * 1e3, percentile(base, q) * 1e3)
        for q in (50, 99)
    ]


def ratio_table(
    columns: tuple[str, str], rows: Sequence[tuple[str, float, float]], width: int = 10
) -> str:
    """Rows of two figures and the first's ratio to the second, under the columns' names."""
    lines = [f"{'':<30}{columns[0]:>{width}}{columns[1]:>{width}}{'ratio':>8}"]
    for label, ours, base in rows:
        lines.append(f"{label:<30}{ours:>{width}.2f}{base:>{width}.2f}{_ratio(ours, base):>8.2f}")
    return "\n".join(lines)


def _lag(latencies: list[float]) -> str:
    if not latencies:
        return ""
    return (
        f", /ready during it p99 {percentile(latencies, 99) * 1e3:.0f} ms,"
        f" worst {max(latencies) * 1e3:.0f} ms ({len(latencies)} probes)"
    )


def _failures(failures: dict[str, int]) -> str:
    if not failures:
        return ""
    top = sorted(failures.items(), key=lambda item: -item[1])[:3]
    return ": " + ", ".join(f"{count} x {kind!r}" for kind, count in top)


def details(name: str, result: PhaseResult) -> str:
    """One line of context for a phase: sync time, response size, client CPU, RSS."""
    size = sum(result.response_bytes) / max(1, len(result.response_bytes))
    return (
        f"{name}: initial sync of all clients {result.sync_seconds:.1f}s"
        f" (server CPU {result.sync_cpu:.2f} s; {result.retried_streams} streams retried,"
        f" {result.retries} retries"
        f"{_failures(result.failures)}){_lag(result.ready_latencies)}; "
        f"assignment response {size:.0f} B, {result.responses_per_client:.2f} per client "
        "per change; "
        f"client CPU per change {result.client_cpu_per_change * 1e3:.1f} ms; "
        f"server RSS {result.rss_before / 2**20:.1f} MiB before clients, "
        f"{result.rss_synced / 2**20:.1f} MiB synced"
        + (
            f"; idle with every client connected: {result.idle_cpu_share:.2%} of a core"
            if result.idle_cpu_share is not None
            else ""
        )
    )
