"""How pushes are paced: Istio's debounce knobs, the write throttle and the send timeout."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DebounceSettings:
    """PILOT_DEBOUNCE_AFTER, PILOT_DEBOUNCE_MAX and PILOT_ENABLE_EDS_DEBOUNCE."""

    after: float = 0.1
    max_delay: float = 10.0
    eds_debounce: bool = True


@dataclass(frozen=True, slots=True)
class PushSettings:
    """PILOT_PUSH_THROTTLE (writes in flight at once), PILOT_XDS_SEND_TIMEOUT (0: none),
    PILOT_MAX_LOCALITIES (proxy localities with assignment variants of their own,
    for streams that proved an identity) and PILOT_MAX_UNVERIFIED_LOCALITIES (the same,
    a separate budget for streams that proved none)."""

    throttle: int = 100
    send_timeout: float = 10.0
    max_localities: int = 100
    max_unverified_localities: int = 10
