"""Which proxy localities get assignments of their own: two budgets, by what streams proved.

A locality is whatever a proxy declares, and each one in use costs a variant of
every assignment, rebuilt on every change. So variants are rationed, and the
ration is split by what a stream proved about itself (`ProxyKey.identity`: a
token TokenReview accepted, a client certificate from pilot's CA, or with
`--xds-auth none` the node metadata the operator chose to trust):

- proven streams share `PILOT_MAX_LOCALITIES` variants;
- streams that proved nothing (Kubernetes mode's plaintext port asks nothing)
  share `PILOT_MAX_UNVERIFIED_LOCALITIES`, a small separate budget, and never
  take a slot of the proven one: a flood of made-up localities on the
  plaintext port cannot cost an authenticated proxy its variant (its priorities
  and weights, where a DestinationRule asks for locality load balancing).

A variant that exists is shared by every stream of its locality, whoever made
it. It is charged to the proven budget while a proven stream reads it (moved
there when one joins, if that budget has room), else to the unverified one.
When its last proven stream leaves, it goes back to the unverified budget even
if that is full (the unverified streams keep reading it; no new unverified
variant is made until the budget is under its bound again), so that the proven
budget only ever counts variants proven streams read. Pure bookkeeping: no
asyncio, no generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pilot.xds.locality import Locality


class Joined(Enum):
    """What a stream's locality got when it joined."""

    NEW = "new"  # a variant of its own, to build now
    SHARED = "shared"  # the variant another stream there already reads
    REFUSED = "refused"  # no slot left in its budget: the assignments without a locality


@dataclass
class _Variant:
    proven: int = 0  # streams with a proven identity reading it
    unverified: int = 0  # streams that proved nothing
    charged_proven: bool | None = None  # the budget it counts against (None: not yet)

    @property
    def streams(self) -> int:
        return self.proven + self.unverified


class LocalityBudget:
    """The localities with variants, the streams reading each, and the budget each uses."""

    def __init__(self, proven_slots: int, unverified_slots: int) -> None:
        self.proven_slots = proven_slots
        self.unverified_slots = unverified_slots
        self._variants: dict[Locality, _Variant] = {}
        self._charged = {True: 0, False: 0}  # proven budget -> variants charged to it

    def __contains__(self, locality: Locality) -> bool:
        return locality in self._variants

    def __len__(self) -> int:
        return len(self._variants)

    def charged(self, proven: bool) -> int:
        """Variants counted against the proven (or the unverified) budget."""
        return self._charged[proven]

    def has_room(self, proven: bool) -> bool:
        slots = self.proven_slots if proven else self.unverified_slots
        return self._charged[proven] < slots

    def join(self, locality: Locality, proven: bool) -> Joined:
        """A stream of `locality` joined; `proven`: its identity was proven."""
        variant = self._variants.get(locality)
        if variant is None:
            if not self.has_room(proven):
                return Joined.REFUSED
            variant = self._variants[locality] = _Variant()
            self._charge(variant, proven)
            outcome = Joined.NEW
        else:
            outcome = Joined.SHARED
        if proven:
            variant.proven += 1
            if variant.charged_proven is False and self.has_room(True):
                self._charge(variant, True)
        else:
            variant.unverified += 1
        return outcome

    def leave(self, locality: Locality, proven: bool) -> bool:
        """A stream that joined `locality` (and was not refused) left; True if that was
        the variant's last stream (drop it)."""
        variant = self._variants[locality]
        if proven:
            variant.proven -= 1
        else:
            variant.unverified -= 1
        if variant.streams == 0:
            self._charge(variant, None)
            del self._variants[locality]
            return True
        if variant.proven == 0 and variant.charged_proven:
            self._charge(variant, False)
        return False

    def _charge(self, variant: _Variant, proven: bool | None) -> None:
        """Count `variant` against the proven or the unverified budget (None: neither)."""
        if variant.charged_proven is not None:
            self._charged[variant.charged_proven] -= 1
        variant.charged_proven = proven
        if proven is not None:
            self._charged[proven] += 1
