"""Once pilot serves, what it built is frozen and young collections are rare; stopping undoes it."""

from __future__ import annotations

import gc

from pilot.runtime import collector


def test_settle_freezes_the_heap_and_release_gives_it_and_the_thresholds_back() -> None:
    before = gc.get_threshold()
    kept = [object() for _ in range(10)]  # something alive to freeze
    try:
        previous = collector.settle()
        assert previous == before
        assert gc.get_freeze_count() > len(kept)
        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *collector.OLDER_THRESHOLDS)
    finally:
        collector.release(before)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
