"""What `python -m bench.fuzz` counts, and the report it prints.

`Tally` adds up the observations of the fuzz examples; `log_summary` reads pilot's
whole log for the run (examples and cycles alike); `Targets` holds the figures the
run is judged on, and `render` prints everything with PASS/FAIL per target.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from tests.fuzz import known
from tests.fuzz.fuzzer import Observation
from tests.fuzz.properties import DIED, bad_entry, coalesce
from tests.support.pilot_process import Entry

MB = 1_000_000
RSS_LIMIT = 5 * MB
READY_LIMIT = 0.100
_NUMBERS = re.compile(r"\b\d+\b")


@dataclass
class Tally:
    """The fuzz examples of a run: how they ended and what they broke."""

    examples: int = 0
    seconds: float = 0.0
    by_method: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)  # not sent: defect key
    statuses: Counter[str] = field(default_factory=Counter)
    unknown: Counter[tuple[str, str]] = field(default_factory=Counter)  # (method, details)
    violations: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, defect)
    new: list[str] = field(default_factory=list)  # reports of unexplained violations
    crash: str = ""  # the example after which pilot was found dead
    slowest: list[tuple[float, str]] = field(default_factory=list)  # /ready, the call
    rss: list[int] = field(default_factory=list)  # pilot's RSS after each campaign

    def add(self, observation: Observation) -> None:
        self.examples += 1
        method = observation.call.method.short
        self.by_method[method] += 1
        outcome = observation.outcome
        self.statuses[outcome.code.name if outcome.code else "kept open"] += 1
        if outcome.code is grpc.StatusCode.UNKNOWN:
            self.unknown[(method, _head(outcome.details))] += 1
        for violation in observation.violations:
            defect = known.explained_by(violation, observation)
            self.violations[(violation.kind, defect.key if defect else "NEW")] += 1
            if defect is None and len(self.new) < 10:
                self.new.append(observation.report())
            if violation.kind == DIED and not self.crash:
                self.crash = observation.report()
        self._note_ready(observation)

    def _note_ready(self, observation: Observation) -> None:
        """Keep the five examples during which /ready took longest."""
        if observation.ready is None:
            return
        self.slowest.append((observation.ready.latency, repr(observation.call)[:240]))
        self.slowest.sort(reverse=True)
        del self.slowest[5:]

    @property
    def unknown_count(self) -> int:
        return sum(self.unknown.values())


def _head(text: str, size: int = 90) -> str:
    return _NUMBERS.sub("N", text.splitlines()[0] if text else "")[:size]


@dataclass(frozen=True)
class LogSummary:
    tracebacks: int
    errors: int
    longest: int
    common: list[tuple[str, int]]


def log_summary(entries: Sequence[Entry]) -> LogSummary:
    """Lines at ERROR or with a traceback in `entries`, grouped by their first words."""
    bad = [e for e in coalesce(entries) if bad_entry(e)]
    groups = Counter(f"{e['scope'] or 'stderr'}: {_head(e['msg'], 100)}" for e in bad)
    return LogSummary(
        tracebacks=sum(1 for e in bad if e.get("error")),
        errors=sum(1 for e in bad if e["level"] in ("error", "critical")),
        longest=max((int(e.get("size", 0)) for e in entries), default=0),
        common=groups.most_common(8),
    )


@dataclass
class Targets:
    """The figures a run is judged on."""

    crashes: int
    unknown: int
    rss_before: int
    rss_after: int
    tasks_before: int
    tasks_after: int
    worst_ready: float  # seconds (inf: a probe failed)
    probes: int
    worst_during: str = ""  # the phase of the run it happened in

    def verdicts(self) -> list[tuple[str, str, bool, str]]:
        """(target, measured, passed, what passing means) for each target."""
        growth = self.rss_after - self.rss_before
        exported = self.tasks_before >= 0
        return [
            ("crashes", f"{self.crashes}", self.crashes == 0, "0"),
            ("UNKNOWN statuses", f"{self.unknown:,}", self.unknown == 0, "0"),
            (
                "RSS growth",
                f"{growth / MB:+.1f} MB ({self.rss_before / MB:.1f} -> {self.rss_after / MB:.1f})",
                growth < RSS_LIMIT,
                "< 5 MB",
            ),
            (
                "asyncio tasks",
                f"{self.tasks_before} -> {self.tasks_after}" if exported else "not exported",
                exported and self.tasks_after <= self.tasks_before,
                "back to baseline",
            ),
            (
                "worst /ready",
                f"{self.worst_ready * 1e3:.1f} ms ({self.worst_during}), {self.probes:,} probes",
                self.worst_ready <= READY_LIMIT,
                "<= 100 ms throughout",
            ),
        ]

    @property
    def passed(self) -> bool:
        return all(ok for _, _, ok, _ in self.verdicts())


def render_targets(targets: Targets) -> list[str]:
    lines = [f"{'target':<18} {'measured':<42} verdict"]
    for name, measured, ok, meaning in targets.verdicts():
        lines.append(f"{name:<18} {measured:<42} {'PASS' if ok else 'FAIL'} ({meaning})")
    return lines


def render_tally(tally: Tally) -> list[str]:
    lines = [
        f"examples per method: {_counts(tally.by_method)}",
        f"statuses: {_counts(tally.statuses)}",
    ]
    if tally.skipped:
        lines.append(f"not sent (inputs known to stall pilot): {_counts(tally.skipped)}")
    lines.append("violations, by kind and the known defect that explains them:")
    for (kind, defect), count in sorted(tally.violations.items()):
        lines.append(f"  {count:>7,}  {kind:<11} {defect}")
    if tally.unknown:
        lines.append("UNKNOWN statuses by method:")
        for (method, details), count in tally.unknown.most_common(12):
            lines.append(f"  {count:>7,}  {method}: {details}")
    if tally.rss:
        step = max(1, len(tally.rss) // 10)
        trace = " ".join(f"{r / MB:.0f}" for r in tally.rss[step - 1 :: step])
        lines.append(f"pilot's RSS along the fuzzing (MB): {trace}")
    lines.append("slowest /ready during an example:")
    lines += [f"  {latency * 1e3:7.1f} ms  {call}" for latency, call in tally.slowest]
    for report in tally.new:
        lines.append("NEW (no known defect explains it):")
        lines.extend(f"    {line[:300]}" for line in report.splitlines())
    return lines


def render_logs(logs: LogSummary) -> list[str]:
    lines = [
        f"tracebacks logged: {logs.tracebacks:,} (lines at ERROR: {logs.errors:,});"
        f" longest log line: {logs.longest:,} characters"
    ]
    lines += [f"  {count:>7,}  {text}" for text, count in logs.common]
    return lines


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{key} {count:,}" for key, count in counter.most_common())
