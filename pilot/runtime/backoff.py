"""Exponential backoff with jitter, for retrying the API server and the CA."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with full jitter."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._current = initial

    def next_delay(self) -> float:
        delay = random.uniform(self._current / 2, self._current)
        self._current = min(self._current * 2, self._maximum)
        return delay

    def reset(self) -> None:
        self._current = self._initial
