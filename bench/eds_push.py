"""`python -m bench.eds_push`: how fast pilot pushes endpoint changes to N delta ADS clients.

One run, every process on 127.0.0.1 with ephemeral ports:

1. The test API server (`python -m tests.kubeapi`) starts with a mesh of S
   services (one port, E endpoints each); pilot (`pilot discovery
   --kubeconfig`) syncs from it.
2. Pilot phase: `bench.clients` opens N delta ADS streams (CDS `*`, then EDS
   for every cluster, ACKing every response like Envoy). Once all are synced,
   K endpoint changes are applied one at a time through the API server, each
   to one endpoint of a random service. Latency runs from the EndpointSlice
   watch event reaching the API server's watchers (the bench keeps a watch of
   its own, like pilot's) to the last client receiving the new assignment.
3. Floor phase: pilot stops; `bench.floor`, a bare grpc.aio server, serves new
   client processes of the same kind with the bytes pilot sent, and on each
   of K triggers (a line on its stdin) writes that change's response to the
   subscribed streams. Its latency runs from the trigger.

For both servers: CPU per change is user+system CPU over the K changes / K;
memory per client is (RSS with N clients synced - RSS before any client) / N.
A reconnect storm is the initial sync with `--channels` as large as the streams
per process (each client on its own connection) and `--retries` (a failed
stream is opened again after Envoy's backoff): the report counts the streams
retried and why they failed, pilot's `/ready` latency during its sync (probed
every 10 ms), and the tracebacks and ERROR lines in pilot's log.
Between changes the bench waits until the server and clients are idle.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import pilot_cli
from bench.fleet import FleetSpec
from bench.procs import machine_busy_seconds, own_cpu_seconds
from bench.report import details, percentile, table
from bench.run import Config, Measured, measure

DEFAULT_PILOT_ENV = {"PILOT_ENABLE_EDS_DEBOUNCE": "false"}


@dataclass(frozen=True)
class Machine:
    """How busy the machine was during the run, besides the bench's own processes."""

    wall: float
    busy: float  # CPU seconds, every process
    ours: float  # CPU seconds, the bench and its children

    @property
    def others(self) -> float:
        return max(0.0, self.busy - self.ours)


def _pilot_log_summary(log: Path) -> str:
    """How many tracebacks, ERROR and WARNING lines pilot logged over the run."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "pilot's log: not found"
    tracebacks = sum(line.startswith("Traceback") for line in lines)
    errors = sum(" ERROR " in line for line in lines)
    warnings = collections.Counter(
        line.split(" WARNING ", 1)[1][:70] for line in lines if " WARNING " in line
    )
    common = "; ".join(f"{n} x {text!r}" for text, n in warnings.most_common(3))
    return (
        f"pilot's log: {tracebacks} tracebacks, {errors} lines at ERROR, "
        f"{sum(warnings.values())} at WARNING{': ' + common if common else ''}"
    )


def render(config: Config, measured: Measured, machine: Machine, workdir: str) -> str:
    """The report: setup, table, what the latency means, context lines."""
    fleet, ours, base = config.fleet, measured.pilot, measured.floor
    from_apply = [last - t for last, t in zip(ours.last, measured.sent, strict=True)]
    cores = os.cpu_count() or 1
    return "\n".join(
        [
            f"S={config.services} services x {config.endpoints} endpoints, "
            f"N={config.clients} delta ADS clients ({len(fleet.shares())} client process(es), "
            f"{fleet.channels} channels each), K={config.changes} endpoint changes",
            "pilot: "
            + pilot_cli.describe(measured.pilot_knobs, measured.pilot_flags).replace(
                workdir, "$RUN"
            ),
            "",
            table(ours.result, base.result),
            "",
            "latency: pilot, from the EndpointSlice watch event reaching the API server's "
            "watchers to the last client receiving the new assignment; floor, from its trigger "
            "to the last client.",
            "pilot latency from the apply request (POST /_test/apply sent; an upper bound: "
            f"adds the API server and watch delivery): p50 {percentile(from_apply, 50) * 1e3:.2f}"
            f" ms, p99 {percentile(from_apply, 99) * 1e3:.2f} ms",
            details("pilot", ours.result),
            details("floor", base.result),
            _pilot_log_summary(Path(workdir) / "pilot.log"),
            f"run time {machine.wall:.1f}s on {cores} CPUs; other processes used "
            f"{machine.others:.1f} CPU-s meanwhile ({machine.others / machine.wall / cores:.0%} "
            "of the machine)",
        ]
    )


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.eds_push",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--services", type=int, default=1000, help="S (default %(default)s)")
    parser.add_argument("--clients", type=int, default=1000, help="N (default %(default)s)")
    parser.add_argument("--changes", type=int, default=200, help="K (default %(default)s)")
    parser.add_argument("--endpoints", type=int, default=3, help="per service (%(default)s)")
    parser.add_argument("--client-procs", type=int, default=1, help="client processes (1)")
    parser.add_argument("--channels", type=int, default=8, help="per client process (8)")
    parser.add_argument(
        "--retries", type=int, default=0, help="per failed stream, with Envoy's backoff (0)"
    )
    parser.add_argument("--seed", type=int, default=1, help="for the changes (1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per wait, seconds (300)")
    parser.add_argument(
        "--pilot-env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pilot's environment, over PILOT_ENABLE_EDS_DEBOUNCE=false (repeatable)",
    )
    parser.add_argument("--pilot-log-level", default="info", help="(info)")
    parser.add_argument(
        "--idle", type=float, default=0.0, help="seconds of quiet CPU measured after the sync (0)"
    )
    args = parser.parse_args(argv)
    if min(args.services, args.clients, args.changes, args.endpoints, args.client_procs) < 1:
        parser.error("counts must be positive")
    return Config(
        services=args.services,
        clients=args.clients,
        changes=args.changes,
        endpoints=args.endpoints,
        fleet=FleetSpec(args.clients, args.client_procs, args.channels, args.retries),
        seed=args.seed,
        timeout=args.timeout,
        pilot_env={**DEFAULT_PILOT_ENV, **dict(args.pilot_env)},
        pilot_log_level=args.pilot_log_level,
        idle_seconds=args.idle,
    )


async def _main(config: Config) -> None:
    """Run in a fresh directory: kept (with the logs) on failure, else removed.

    SIGTERM cancels the run like Ctrl-C does: every child is stopped first.
    """
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    started, busy, ours = time.monotonic(), machine_busy_seconds(), own_cpu_seconds()
    workdir = tempfile.mkdtemp(prefix="pilot-bench-")
    try:
        measured = await measure(config, Path(workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    except BaseException:
        print(f"bench: logs kept in {workdir}", file=sys.stderr)
        raise
    machine = Machine(
        time.monotonic() - started,
        machine_busy_seconds() - busy,
        own_cpu_seconds() - ours,
    )
    print(render(config, measured, machine, workdir), flush=True)
    shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        asyncio.run(_main(config))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, OSError) as error:
        print(f"bench failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
