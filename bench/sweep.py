"""`python -m bench.sweep`: eds_push at growing sizes, as a Markdown table and a PNG plot.

Each point is one `bench.eds_push` run (pilot, then the bare grpc.aio floor,
in the same run; see that module for the method). Two axes, so that growth
shows at a glance:

- clients: 100, 300, 1,000, 3,000 delta ADS clients, each subscribed to every
  one of `--at-services` services;
- services: 100, 1,000, 10,000 services, with `--at-clients` clients each
  subscribed to all of them.

What should hold: CPU per change grows with the subscribers only (the clients
axis), not with the services that did not change (the services axis); memory
per client stays flat along the clients axis and grows with the clusters each
client holds along the services axis. Client processes grow with the clients
(`--per-process` streams each, `--channels` connections each), and a failed
stream is retried with Envoy's backoff. A size on both axes (by default 1,000
services x 300 clients) is measured once and shown on both.

Writes `sweep.md` and `sweep.png` into `--out`, and prints the table.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench.fleet import FleetSpec
from bench.report import PhaseResult, percentile
from bench.run import Config, measure
from bench.runner import DEFAULT_PILOT_ENV, run_reporting


@dataclass(frozen=True)
class Point:
    """One size measured: which axis it belongs to, and its figures."""

    axis: str  # "clients" or "services"
    services: int
    clients: int
    pilot: PhaseResult
    floor: PhaseResult


# (label, unit, figure of a phase)
FIGURES = (
    ("latency p50", "ms", lambda r: percentile(r.latencies, 50) * 1e3),
    ("latency p99", "ms", lambda r: percentile(r.latencies, 99) * 1e3),
    ("CPU per change", "ms", lambda r: r.cpu_per_change * 1e3),
    ("memory per client", "KiB", lambda r: r.memory_per_client / 1024),
    ("initial sync", "s", lambda r: r.sync_seconds),
)
PLOTTED = ("latency p50", "CPU per change", "memory per client")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers and commas: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers: {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=_ints, default=[100, 300, 1000, 3000])
    parser.add_argument("--services", type=_ints, default=[100, 1000, 10000])
    parser.add_argument("--at-services", type=int, default=1000, help="on the clients axis")
    parser.add_argument("--at-clients", type=int, default=300, help="on the services axis")
    parser.add_argument("--changes", type=int, default=50, help="per point (50)")
    parser.add_argument("--per-process", type=int, default=1000, help="streams per client process")
    parser.add_argument("--channels", type=int, default=8, help="per client process (8)")
    parser.add_argument("--retries", type=int, default=10, help="per failed stream (10)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per wait, seconds")
    parser.add_argument("--out", type=Path, default=Path("sweep"), help="directory (./sweep)")
    return parser.parse_args(argv)


def _sizes(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(axis, services, clients) for every point, the clients axis first."""
    points = [("clients", args.at_services, c) for c in args.clients]
    points += [("services", s, args.at_clients) for s in args.services]
    return points


def _config(args: argparse.Namespace, services: int, clients: int) -> Config:
    processes = max(1, math.ceil(clients / args.per_process))
    return Config(
        services=services,
        clients=clients,
        changes=args.changes,
        endpoints=3,
        fleet=FleetSpec(clients, processes, args.channels, args.retries),
        timeout=args.timeout,
        pilot_env=dict(DEFAULT_PILOT_ENV),
    )


async def _measure_point(args: argparse.Namespace, axis: str, services: int, clients: int) -> Point:
    workdir = Path(tempfile.mkdtemp(prefix="pilot-sweep-"))
    try:
        measured = await measure(_config(args, services, clients), workdir)
    except BaseException:
        print(f"sweep: logs kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return Point(axis, services, clients, measured.pilot.result, measured.floor.result)


def markdown(points: Sequence[Point]) -> str:
    """One row per point: each figure as pilot / floor (ratio)."""
    header = ["axis", "services", "clients"] + [f"{label} ({unit})" for label, unit, _ in FIGURES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for point in points:
        cells = [point.axis, f"{point.services:,}", f"{point.clients:,}"]
        for _label, _unit, figure in FIGURES:
            ours, base = figure(point.pilot), figure(point.floor)
            ratio = ours / base if base > 0 else math.nan
            cells.append(f"{ours:.3g} / {base:.3g} ({ratio:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Each cell: pilot / bare grpc.aio floor (ratio), measured in the same run.")
    return "\n".join(lines)


def plot(points: Sequence[Point], path: Path) -> None:
    """Two rows (the clients axis, the services axis) of the plotted figures, log-log."""
    import matplotlib  # noqa: PLC0415  (only the sweep needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: PLC0415

    plain = FuncFormatter(lambda value, _pos: f"{value:,.4g}")

    axes_names = ("clients", "services")
    fig, grid = plt.subplots(2, len(PLOTTED), figsize=(4.2 * len(PLOTTED), 7.5), squeeze=False)
    for row, axis in enumerate(axes_names):
        on_axis = [p for p in points if p.axis == axis]
        xs = [getattr(p, axis) for p in on_axis]
        for col, label in enumerate(PLOTTED):
            unit, figure = next((u, f) for name, u, f in FIGURES if name == label)
            ax = grid[row][col]
            ax.plot(xs, [figure(p.pilot) for p in on_axis], "o-", label="pilot")
            ax.plot(xs, [figure(p.floor) for p in on_axis], "s--", label="grpc.aio floor")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(xs, [f"{x:,}" for x in xs])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(_axis_label(axis, on_axis))
            ax.set_title(f"{label} ({unit})")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.suptitle("pilot against a bare grpc.aio server pushing the same bytes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _axis_label(axis: str, points: Sequence[Point]) -> str:
    if axis == "clients":
        held = points[0].services if points else 0
        return f"clients (each subscribed to {held:,} services)"
    held = points[0].clients if points else 0
    return f"services (all subscribed by {held:,} clients)"


async def _sweep(args: argparse.Namespace) -> list[Point]:
    """Every point of both axes; a size on both (`--at-services` x `--at-clients`) runs once."""
    points: list[Point] = []
    measured: dict[tuple[int, int], Point] = {}
    for axis, services, clients in _sizes(args):
        size = (services, clients)
        if size not in measured:
            print(f"sweep: {services} services x {clients} clients ...", file=sys.stderr)
            measured[size] = await _measure_point(args, axis, services, clients)
        points.append(replace(measured[size], axis=axis))
    return points


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    points, status = run_reporting(_sweep(args), "sweep")
    if points is None:
        return status
    args.out.mkdir(parents=True, exist_ok=True)
    table = markdown(points)
    (args.out / "sweep.md").write_text(table + "\n")
    plot(points, args.out / "sweep.png")
    print(table)
    print(f"\nwrote {args.out / 'sweep.md'} and {args.out / 'sweep.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
