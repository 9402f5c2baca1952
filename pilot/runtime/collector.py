"""How pilot's Python heap is collected once it serves: frozen start-up, rarer young scans.

Two costs of CPython's cycle collector grow with what pilot holds:
- a full collection scans every object alive. The registry, cache and code
  are long-lived, so they are frozen once the initial state is built
  (`gc.freeze()`); they caused the push benchmark's p99 pauses.
- every stream holds about 130 objects that the collector tracks (gRPC's
  call state, tasks, futures, the stream's own). In a reconnect storm nearly
  everything allocated survives. With CPython's default thresholds (700, 10,
  10), 3,000 streams arriving at once cost 600 young and 54 middle scans and
  4 full ones, 0.85 s of a 3.9 s storm. The full scans stopped the loop for
  160 ms each.

So young collections wait for `YOUNG_THRESHOLD` new objects instead of 700.
The same storm then saw 9 young scans of 20-30 ms each and nothing older, and
pilot's CPU per pushed change fell by a fifth (`bench.eds_push` at 3,000
clients). Garbage cycles wait longer to be freed, by at most that many objects.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # new tracked objects between young collections (CPython: 700)
OLDER_THRESHOLDS = (10, 10)  # CPython's own: collections of the younger generation between


def settle() -> tuple[int, int, int]:
    """Collect, freeze what is alive, and collect the young rarely; returns the old thresholds."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    return before


def release(thresholds: tuple[int, int, int]) -> None:
    """Undo `settle`: what it froze becomes collectable again, at the thresholds before."""
    gc.unfreeze()
    gc.set_threshold(*thresholds)
