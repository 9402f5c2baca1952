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
4. Peer phases (`--peers`, by default both when Go is found): the floor
   stops; go-control-plane v0.14 (`bench/gcp`, built by `bench/gcp/build`)
   serves new clients the resources pilot sent, decoded, from its LinearCache
   and then from its SnapshotCache; each trigger updates the cache, timed as
   the floor's. Its clients must follow as many assignments as pilot's and get
   exactly the changed ones, else the run fails.

For every server: CPU per change is user+system CPU over the K changes / K;
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
import dataclasses
import os
import sys
from pathlib import Path

from bench import peers, pilot_cli
from bench.report import details, percentile, table
from bench.run import Config, Measured, measure
from bench.runner import (
    Machine,
    add_mesh_flags,
    add_run_flags,
    config_of,
    pilot_log_summary,
    run_main,
)


def render(config: Config, measured: Measured, machine: Machine, workdir: str) -> str:
    """The report: setup, table, what the latency means, context lines."""
    fleet, ours, base = config.fleet, measured.pilot, measured.floor
    gcp = {tag: phase.result for tag, phase in measured.peers.items()}
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
            table(ours.result, base.result, gcp),
            "",
            "latency: pilot, from the EndpointSlice watch event reaching the API server's "
            "watchers to the last client receiving the new assignment; floor"
            + (" and go-control-plane" if gcp else "")
            + ", from its trigger to the last client. ratio: pilot / floor.",
            "pilot latency from the apply request (POST /_test/apply sent; an upper bound: "
            f"adds the API server and watch delivery): p50 {percentile(from_apply, 50) * 1e3:.2f}"
            f" ms, p99 {percentile(from_apply, 99) * 1e3:.2f} ms",
            details("pilot", ours.result),
            details("floor", base.result),
            *(details(tag, result) for tag, result in gcp.items()),
            *([measured.peers_note] if measured.peers_note else []),
            pilot_log_summary(Path(workdir) / "pilot.log"),
            machine.describe(cores),
        ]
    )


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.eds_push",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_mesh_flags(parser, changes=200, clients_are="delta ADS clients")
    add_run_flags(parser)
    parser.add_argument(
        "--idle", type=float, default=0.0, help="seconds of quiet CPU measured after the sync (0)"
    )
    parser.add_argument(
        "--peers",
        type=_peers,
        default="auto",
        help="go-control-plane caches served after the floor: linear, snapshot, both "
        "comma-separated, none, or auto (default: both when Go is found, else none)",
    )
    args = parser.parse_args(argv)
    config = config_of(parser, args)
    return dataclasses.replace(config, idle_seconds=args.idle, peers=args.peers)


def _peers(text: str) -> tuple[str, ...] | None:
    try:
        return peers.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    return run_main(
        lambda workdir: measure(config, workdir),
        lambda measured, machine, workdir: render(config, measured, machine, workdir),
    )


if __name__ == "__main__":
    sys.exit(main())
