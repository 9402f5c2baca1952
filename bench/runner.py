"""What every bench command on a `bench.run.Run` shares: its flags, its directory, its exit.

`add_run_flags` adds the flags of the clients and of pilot's process;
`config_of` makes a `Config` of them. `run_main` runs a measurement in a fresh
directory (kept, with the logs, on failure; else removed), turns SIGTERM into a
cancellation as Ctrl-C is (every child is stopped first), prints the report
with how busy the machine was meanwhile, and gives the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.fleet import FleetSpec
from bench.procs import machine_busy_seconds, own_cpu_seconds
from bench.run import Config

M = TypeVar("M")
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

    def describe(self, cores: int) -> str:
        return (
            f"run time {self.wall:.1f}s on {cores} CPUs; other processes used "
            f"{self.others:.1f} CPU-s meanwhile ({self.others / self.wall / cores:.0%} "
            "of the machine)"
        )


def pilot_log_summary(log: Path) -> str:
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


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_mesh_flags(
    parser: argparse.ArgumentParser,
    *,
    changes: int,
    clients_are: str,
    endpoints: str | None = None,
) -> None:
    """S services of E endpoints, N clients, K endpoint changes.

    `endpoints`: the help of a bench whose default E depends on the other sizes;
    `--endpoints` is then None unless given, for the bench to fill in. Else E is 3.
    """
    parser.add_argument("--services", type=int, default=1000, help="S (default %(default)s)")
    parser.add_argument(
        "--clients", type=int, default=1000, help=f"N {clients_are} (default %(default)s)"
    )
    parser.add_argument("--changes", type=int, default=changes, help="K (default %(default)s)")
    if endpoints is None:
        parser.add_argument("--endpoints", type=int, default=3, help="per service (%(default)s)")
    else:
        parser.add_argument("--endpoints", type=int, help=endpoints)


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The clients' processes and channels, retries, seed, patience, pilot's environment."""
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


def config_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    """The run's Config from the flags of `add_mesh_flags` and `add_run_flags`."""
    sizes = (args.services, args.clients, args.changes, args.endpoints, args.client_procs)
    if min(sizes) < 1:
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
    )


async def _in_workdir(
    measure: Callable[[Path], Awaitable[M]], render: Callable[[M, Machine, str], str]
) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    started, busy, ours = time.monotonic(), machine_busy_seconds(), own_cpu_seconds()
    workdir = tempfile.mkdtemp(prefix="pilot-bench-")
    try:
        measured = await measure(Path(workdir))
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
    print(render(measured, machine, workdir), flush=True)
    shutil.rmtree(workdir, ignore_errors=True)


def run_main(
    measure: Callable[[Path], Awaitable[M]], render: Callable[[M, Machine, str], str]
) -> int:
    """Measure in a fresh directory, print the report; the exit status."""
    _, status = run_reporting(_in_workdir(measure, render))
    return status


def run_reporting(main: Coroutine[Any, Any, M], name: str = "bench") -> tuple[M | None, int]:
    """Run `main`; its result and 0, or None and the exit status of how it failed, said."""
    try:
        return asyncio.run(main), 0
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"{name}: interrupted", file=sys.stderr)
        return None, 130
    except (RuntimeError, TimeoutError, OSError) as error:
        print(f"{name} failed: {error}", file=sys.stderr)
        return None, 1
