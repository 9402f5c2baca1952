"""LocalityBudget: variants for proven streams and for streams that proved nothing,
in budgets of their own (pilot/push/localities.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pilot.push.localities import Joined, LocalityBudget
from pilot.xds.locality import Locality

PROVEN, UNVERIFIED = True, False


def _zone(n: int) -> Locality:
    return Locality("region", f"zone-{n}")


def test_streams_that_proved_nothing_never_take_a_proven_slot() -> None:
    budget = LocalityBudget(proven_slots=1, unverified_slots=2)
    made_up = [budget.join(_zone(n), UNVERIFIED) for n in range(5)]
    assert made_up == [Joined.NEW, Joined.NEW] + [Joined.REFUSED] * 3
    assert budget.join(_zone(100), PROVEN) is Joined.NEW, "the proven slot is still free"
    assert budget.join(_zone(101), PROVEN) is Joined.REFUSED, "and now taken"
    assert (budget.charged(PROVEN), budget.charged(UNVERIFIED)) == (1, 2)


def test_a_variant_is_shared_by_everyone_there_whoever_made_it() -> None:
    budget = LocalityBudget(proven_slots=1, unverified_slots=1)
    assert budget.join(_zone(1), UNVERIFIED) is Joined.NEW
    assert budget.join(_zone(1), UNVERIFIED) is Joined.SHARED
    assert budget.join(_zone(1), PROVEN) is Joined.SHARED
    # A proven stream reads it: it counts as proven, and frees the unverified slot.
    assert (budget.charged(PROVEN), budget.charged(UNVERIFIED)) == (1, 0)
    assert budget.join(_zone(2), UNVERIFIED) is Joined.NEW


def test_a_variant_its_proven_streams_left_goes_back_to_the_unverified_budget() -> None:
    budget = LocalityBudget(proven_slots=1, unverified_slots=1)
    budget.join(_zone(1), PROVEN)
    budget.join(_zone(1), UNVERIFIED)
    budget.join(_zone(2), UNVERIFIED)
    assert not budget.leave(_zone(1), PROVEN), "an unverified stream still reads it"
    # Over the unverified budget now: the proven slot is free, no new unverified variant.
    assert (budget.charged(PROVEN), budget.charged(UNVERIFIED)) == (0, 2)
    assert budget.join(_zone(3), UNVERIFIED) is Joined.REFUSED
    assert budget.join(_zone(4), PROVEN) is Joined.NEW
    assert budget.leave(_zone(1), UNVERIFIED), "its last stream: dropped"
    assert budget.leave(_zone(2), UNVERIFIED)
    assert budget.join(_zone(3), UNVERIFIED) is Joined.NEW


def test_a_zero_budget_gives_no_variant() -> None:
    budget = LocalityBudget(proven_slots=0, unverified_slots=0)
    assert budget.join(_zone(1), PROVEN) is Joined.REFUSED
    assert budget.join(_zone(1), UNVERIFIED) is Joined.REFUSED
    assert len(budget) == 0


Move = tuple[bool, int, bool]  # join (True) or leave, zone, proven


@given(
    st.integers(0, 3),
    st.integers(0, 3),
    st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.booleans()), max_size=60),
)
def test_the_proven_budget_only_ever_counts_variants_proven_streams_read(
    proven_slots: int, unverified_slots: int, moves: list[Move]
) -> None:
    budget = LocalityBudget(proven_slots, unverified_slots)
    joined: list[tuple[Locality, bool]] = []  # streams served a variant
    for join, zone, proven in moves:
        locality = _zone(zone)
        if join:
            if budget.join(locality, proven) is not Joined.REFUSED:
                joined.append((locality, proven))
        elif (locality, proven) in joined:
            joined.remove((locality, proven))
            dropped = budget.leave(locality, proven)
            assert dropped == all(where != locality for where, _ in joined)
        read_by_proven = {where for where, p in joined if p}
        assert budget.charged(PROVEN) <= min(proven_slots, len(read_by_proven))
        assert budget.charged(PROVEN) + budget.charged(UNVERIFIED) == len(budget)
        assert len(budget) == len({where for where, _ in joined})
