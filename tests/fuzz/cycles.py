"""Streams that connect, subscribe like an Envoy, get their answers, and go away.

Each cycle opens a channel of its own (a new connection) with a node id of its own,
so every cycle is a new proxy to pilot, and rotates over four kinds of stream:
delta ADS (every cluster, one assignment, the workload certificate and the root),
SotW ADS (clusters, one assignment), SotW SDS (certificate and root) and delta CDS.
After many cycles, pilot should hold what it held before: `settle` and `tasks_back`
wait for that with a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from tests.fuzz.calls import Credentials
from tests.fuzz.target import RESIDENT_METADATA, Target
from tests.support.xds_client import CLUSTER, ENDPOINT, SECRET, XdsClient, node

SECRETS = ("default", "ROOTCA")
_ids = itertools.count()


@dataclass
class CycleStats:
    done: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)  # the first few failures


async def _delta_ads(client: XdsClient, target: Target, node_id: str) -> None:
    stream = client.delta_ads(_node(target, node_id))
    await stream.subscribe(CLUSTER, ["*"])
    await stream.ack_until(CLUSTER, target.clusters)
    await stream.subscribe(ENDPOINT, target.clusters[:1])
    await stream.ack_until(ENDPOINT, target.clusters[:1])
    await stream.subscribe(SECRET, SECRETS)
    await stream.ack_until(SECRET, SECRETS)


async def _sotw_ads(client: XdsClient, target: Target, node_id: str) -> None:
    stream = client.ads(_node(target, node_id))
    await stream.subscribe(CLUSTER)
    await stream.ack_until(CLUSTER, target.clusters)
    await stream.subscribe(ENDPOINT, target.clusters[:1])
    await stream.ack_until(ENDPOINT, target.clusters[:1])


async def _sotw_sds(client: XdsClient, target: Target, node_id: str) -> None:
    stream = client.sds(_node(target, node_id))
    await stream.subscribe(SECRET, SECRETS)
    await stream.ack_until(SECRET, SECRETS)


async def _delta_cds(client: XdsClient, target: Target, node_id: str) -> None:
    stream = client.delta_cds(_node(target, node_id))
    await stream.subscribe(CLUSTER, ["*"])
    await stream.ack_until(CLUSTER, target.clusters)


KINDS = (_delta_ads, _sotw_ads, _sotw_sds, _delta_cds)


def _node(target: Target, node_id: str) -> object:
    """Identity from the token in Kubernetes mode, from node metadata in file mode."""
    return node(node_id, None if target.kube else RESIDENT_METADATA)


async def cycle(target: Target, index: int) -> None:
    """One connect, subscribe, read, disconnect."""
    token = target.tokens.get(Credentials.DEFAULT)
    credentials = target.channel_credentials()
    async with XdsClient(target.grpc_target, credentials=credentials, token=token) as client:
        await KINDS[index % len(KINDS)](client, target, f"fuzz-cycle-{next(_ids)}")


async def run_cycles(target: Target, count: int, parallel: int) -> CycleStats:
    """`count` cycles, `parallel` at a time."""
    stats = CycleStats()
    slots = asyncio.Semaphore(parallel)

    async def one(index: int) -> None:
        async with slots:
            try:
                await cycle(target, index)
            except (AssertionError, OSError, TimeoutError) as error:
                stats.failed += 1
                if len(stats.errors) < 5:
                    stats.errors.append(f"cycle {index}: {str(error)[:300]}")
            else:
                stats.done += 1

    await asyncio.gather(*(one(i) for i in range(count)))
    return stats


async def baseline_tasks(target: Target, reads: int = 3) -> int:
    """pilot's task count when idle: the least of a few reads (a probe may be in flight)."""
    return min([await target.tasks() for _ in range(reads)])


async def tasks_back(target: Target, baseline: int, within: float = 10.0) -> int:
    """Wait until pilot has no more tasks than `baseline`; the last count read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        count = await target.tasks()
        if count <= baseline or loop.time() > deadline:
            return count
        await asyncio.sleep(0.02)  # polling pilot's /metrics, with a deadline
