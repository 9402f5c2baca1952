"""One example end to end: perform the call, wait for pilot to settle, judge it.

`Fuzzer.observe` is what both the tests and `python -m bench.fuzz` run for each
example; `Fuzzer.check` is the tests' assertion: every violation must be explained by
a known defect (`known.KNOWN`), and inputs known to stall pilot are not sent at all
(Hypothesis is told to `assume` them away).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import aiohttp
from hypothesis import assume

from tests.fuzz import known
from tests.fuzz.calls import Call
from tests.fuzz.exchange import DEADLINE, Outcome, perform
from tests.fuzz.properties import Violation, violations
from tests.fuzz.ready import Sample
from tests.fuzz.target import Target
from tests.support.pilot_process import Entry

SETTLE_TIMEOUT = 60.0  # for everything after the call, on the loop


@dataclass
class Observation:
    """What one example did."""

    call: Call
    outcome: Outcome
    entries: list[Entry] = field(repr=False)
    ready: Sample | None
    violations: list[Violation]
    synced: bool = True

    @property
    def explained(self) -> list[tuple[Violation, known.Defect]]:
        found = [(v, known.explained_by(v, self)) for v in self.violations]
        return [(v, d) for v, d in found if d is not None]

    @property
    def unexplained(self) -> list[Violation]:
        return [v for v in self.violations if known.explained_by(v, self) is None]

    def report(self, shown: int = 6) -> str:
        """The call, its outcome, and each violation with the defect that explains it
        (the first `shown` of them, and how many more)."""
        lines = [f"call: {self.call!r}", f"outcome: {self.outcome}"]
        for violation in self.violations[:shown]:
            defect = known.explained_by(violation, self)
            lines.append(f"violation: {violation}")
            lines.append(f"  {'explained by known defect ' + defect.key if defect else 'NEW'}")
        if len(self.violations) > shown:
            lines.append(f"... and {len(self.violations) - shown} more violations")
        if not self.synced:
            lines.append("(pilot did not log a test stream's connection in time)")
        return "\n".join(lines)


class Fuzzer:
    """Runs examples against one target."""

    def __init__(self, target: Target, deadline: float = DEADLINE) -> None:
        self.target = target
        self.deadline = deadline  # for each call (see exchange)

    def observe(self, call: Call) -> Observation:
        target = self.target
        mark = target.pilot.mark()
        since = time.monotonic()
        outcome = perform(target.channel, call, target.metadata(call.credentials), target.clusters)
        ready, synced = target.loop.run(self._after(since), timeout=SETTLE_TIMEOUT)
        entries = list(target.pilot.log[mark:])
        alive = target.pilot.alive
        found = violations(call.method.path, outcome, entries, ready, alive)
        return Observation(call, outcome, entries, ready, found, synced)

    async def _after(self, since: float) -> tuple[Sample | None, bool]:
        """Once pilot dropped the example's streams and logged all it had to say about
        them: the worst /ready answer since the example started."""
        target = self.target
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            await target.settle()
            synced = await target.sync_logs()
            return await target.prober.window(since), synced
        return None, False

    def check(self, call: Call) -> Observation:
        """Assert that the example broke nothing that no known defect explains."""
        assume(known.avoided_by(call) is None)
        observation = self.observe(call)
        assert not observation.unexplained, observation.report()
        return observation
