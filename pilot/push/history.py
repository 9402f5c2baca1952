"""The last pushes, for an operator: what each one changed, to how many streams, how fast.

The pipeline appends one `PushRecord` per flush to a `PushHistory`, a deque
of the last 100: the oldest falls off, so memory stays bounded however long
pilot runs. Recording is on the push path, so it costs one append and a few
counts per push, never work per stream; and a record keeps at most `SAMPLED`
names of each kind (services, proxies) with their total, so a push that
touches every service of a big mesh still makes a small record.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from pilot.push.request import PushRequest
from pilot.registry.model import ServiceKey
from pilot.xds.proxy import ProxyKey

KEPT = 100
SAMPLED = 10


@dataclass(frozen=True, slots=True)
class Sample:
    """How many things of one kind a push touched, and the names of the first few."""

    total: int
    names: tuple[str, ...]

    @classmethod
    def of(cls, total: int, names: Iterable[str]) -> Sample:
        """`total` things, of which the first `SAMPLED` of `names` are kept."""
        return cls(total, tuple(sorted(itertools.islice(names, SAMPLED))))


NOTHING = Sample(0, ())


def _service(key: ServiceKey) -> str:
    return f"{key.namespace}/{key.name}"


def _proxy(key: ProxyKey) -> str:
    return f"{key.node_id} ({key.identity})" if key.identity else key.node_id


@dataclass(frozen=True, slots=True)
class PushRecord:
    """One push: when, what changed, to how many streams, and how long each step took.

    `full` are services whose clusters (and endpoints) were rebuilt, a full
    push in Istio's words; `endpoints` those whose endpoints only;
    `certificates` the proxies with a new workload certificate. `resources`
    counts the cached resources that really changed, per type (short name);
    `owned` the proxies whose own resources (secrets) changed. `streams` is
    how many streams were woken.
    """

    at: float  # wall-clock time of the flush (time.time())
    full: Sample
    endpoints: Sample
    certificates: Sample
    resources: Mapping[str, int]
    owned: int
    streams: int
    debounce_seconds: float  # from the first change of the window to the flush
    build_seconds: float  # the generators, into the cache
    fan_out_seconds: float  # marking the changed names on the streams that watch them

    @classmethod
    def of(
        cls,
        request: PushRequest,
        *,
        at: float,
        resources: Mapping[str, int],
        owned: int,
        streams: int,
        debounce_seconds: float,
        build_seconds: float,
        fan_out_seconds: float,
    ) -> PushRecord:
        """A record of `request`, with what the pipeline counted and timed."""
        registry = request.registry
        endpoints_only = registry.endpoints - registry.full  # a full push has them too
        return cls(
            at,
            Sample.of(len(registry.full), map(_service, registry.full)),
            Sample.of(len(endpoints_only), map(_service, endpoints_only)),
            Sample.of(len(request.certificates), map(_proxy, request.certificates)),
            resources,
            owned,
            streams,
            debounce_seconds,
            build_seconds,
            fan_out_seconds,
        )

    @property
    def seconds(self) -> float:
        """Build and fan-out: how long the push held the event loop."""
        return self.build_seconds + self.fan_out_seconds


class PushHistory:
    """The last `KEPT` pushes, oldest first."""

    def __init__(self, kept: int = KEPT) -> None:
        self._records: deque[PushRecord] = deque(maxlen=kept)

    def record(self, push: PushRecord) -> None:
        self._records.append(push)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[PushRecord]:
        return iter(self._records)

    def newest_first(self) -> list[PushRecord]:
        return list(reversed(self._records))
