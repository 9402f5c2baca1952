"""`python -m bench.fuzz`: fuzz every gRPC method of a pilot process, then soak it with cycles.

One run, against one `pilot discovery` subprocess (`--mode kube`: on the test API
server, every call with a service-account token; `--mode file`: on
examples/mesh.yaml with `--xds-auth none`):

1. warm-up: a few hundred examples and cycles, so that caches and pools are full;
   then the baseline: pilot's RSS (/proc) and `pilot_asyncio_tasks` (/metrics);
2. fuzz: N examples from tests/fuzz's strategies, spread over every method, half
   random bytes, half hostile-but-valid calls (Hypothesis, seeded), each checked as
   the tests check it (status, log, /ready, liveness);
3. cycles: M connect/subscribe/disconnect cycles (tests/fuzz/cycles), P at a time;
4. once pilot has dropped every stream: RSS and tasks again.

It prints what it found (statuses, violations by the known defect that explains them,
UNKNOWN statuses, tracebacks logged) and a PASS/FAIL line per target: 0 crashes,
0 UNKNOWN statuses, RSS growth < 5 MB, tasks back to baseline, `/ready` within
100 ms throughout (sampled every 10 ms from the baseline on). Exit status 0 when
every target passes, 1 otherwise.

Inputs of known defects that stall pilot's event loop for long (`avoid` in
tests/fuzz/known.py) are not sent unless `--send-stalls`; the report counts them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from bench.fuzz_tally import (
    LogSummary,
    Tally,
    Targets,
    log_summary,
    render_logs,
    render_tally,
    render_targets,
)
from tests.fuzz import known, methods, strategies
from tests.fuzz.calls import Call
from tests.fuzz.cycles import CycleStats, baseline_tasks, run_cycles, tasks_back
from tests.fuzz.fuzzer import Fuzzer
from tests.fuzz.loop import LoopThread
from tests.fuzz.target import RESIDENT_METADATA, Target, start_target, stop_target
from tests.support.peers import VICTIM

SETTLE = 60.0  # seconds pilot gets to drop every stream and task at the end


@dataclass(frozen=True)
class Config:
    examples: int
    cycles: int
    parallel: int
    seed: int
    mode: str
    deadline: float
    warmup: int
    send_stalls: bool


@dataclass
class Run:
    tally: Tally
    cycles: CycleStats
    cycle_seconds: float
    targets: Targets
    logs: LogSummary


Campaign = tuple[str, st.SearchStrategy[Call]]


def campaigns(target: Target) -> list[Campaign]:
    """Every method twice: random bytes, and hostile-but-valid calls."""
    claims = VICTIM.metadata if target.kube else RESIDENT_METADATA
    found: list[Campaign] = []
    for method in methods.ALL:
        found.append((f"{method} random", strategies.raw_call(method)))
        hostile = strategies.hostile_call(method, target.clusters, claims)
        found.append((f"{method} hostile", hostile))
    return found


@dataclass
class Fuzzing:
    """Campaigns of examples against one pilot, added to one tally."""

    fuzzer: Fuzzer
    config: Config
    tally: Tally

    def run(self, total: int) -> None:
        """`total` examples (sent ones), spread evenly over the campaigns."""
        plan = campaigns(self.fuzzer.target)
        started = time.monotonic()
        for index, (name, strategy) in enumerate(plan):
            quota = total * (index + 1) // len(plan) - total * index // len(plan)
            goal = self.tally.examples + quota
            for attempt in range(10):  # another seed when Hypothesis runs out of examples
                if self.tally.examples >= goal or self.tally.crash:
                    break
                rng = self.config.seed * 1000 + index * 10 + attempt
                self.campaign(strategy, goal - self.tally.examples, rng)
            self.tally.rss.append(self.fuzzer.target.rss())
            _progress(f"{name}: {self.tally.examples:,}/{total:,} examples")
        self.tally.seconds += time.monotonic() - started

    def campaign(self, strategy: st.SearchStrategy[Call], count: int, rng: int) -> None:
        """Up to `count` examples of one strategy (fewer if Hypothesis runs out of them)."""

        @settings(
            max_examples=count,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @seed(rng)
        @given(strategy)
        def one(call: Call) -> None:
            self.example(call)

        one()

    def example(self, call: Call) -> None:
        if self.tally.crash:
            return
        avoided = known.avoided_by(call)
        if avoided is not None and not self.config.send_stalls:
            self.tally.skipped[avoided.key] += 1
            return
        self.tally.add(self.fuzzer.observe(call))


def _progress(text: str) -> None:
    print(f"[bench.fuzz] {text}", file=sys.stderr, flush=True)


def _cycles(target: Target, config: Config, count: int) -> tuple[CycleStats, float]:
    started = time.monotonic()
    stats = target.loop.run(run_cycles(target, count, config.parallel), timeout=None)
    return stats, time.monotonic() - started


async def _settled(target: Target, tasks_before: int) -> int:
    await target.settle(within=SETTLE)
    return await tasks_back(target, tasks_before, within=SETTLE)


@dataclass(frozen=True)
class Baseline:
    tasks: int
    rss: int
    mark: int  # pilot's log from here on is the run's
    started: float  # time.monotonic()


def _warm_up(fuzzer: Fuzzer, config: Config) -> Baseline:
    """Examples and cycles until pools and caches are full; then pilot's idle figures."""
    target = fuzzer.target
    _progress(f"warm-up: {config.warmup} examples and cycles")
    Fuzzing(fuzzer, config, Tally()).run(config.warmup)
    _cycles(target, config, config.warmup)
    target.loop.run(target.settle(within=SETTLE))
    tasks = target.loop.run(baseline_tasks(target))
    target.prober.reset()
    return Baseline(tasks, target.rss(), target.pilot.mark(), time.monotonic())


def measure(target: Target, config: Config) -> Run:
    """Warm up, take the baseline, fuzz, cycle, measure again."""
    fuzzer = Fuzzer(target, config.deadline)
    base = _warm_up(fuzzer, config)
    tally = Tally()
    Fuzzing(fuzzer, config, tally).run(config.examples)
    phases = {"fuzzing": time.monotonic()}
    cycles, cycle_seconds = CycleStats(), 0.0
    if not tally.crash:
        _progress(f"{config.cycles:,} cycles, {config.parallel} at a time")
        cycles, cycle_seconds = _cycles(target, config, config.cycles)
    phases["cycles"] = time.monotonic()
    alive = target.pilot.alive
    tasks_after = target.loop.run(_settled(target, base.tasks), timeout=3 * SETTLE) if alive else -1
    phases["the end"] = time.monotonic()
    worst = target.prober.worst
    targets = Targets(
        crashes=0 if alive else 1,
        unknown=tally.unknown_count,
        rss_before=base.rss,
        rss_after=target.rss() if alive else base.rss,
        tasks_before=base.tasks,
        tasks_after=tasks_after,
        worst_ready=worst.latency if worst is not None and worst.status == 200 else float("inf"),
        probes=target.prober.count,
        worst_during=next(
            (name for name, end in phases.items() if worst and worst.start < end), ""
        ),
    )
    return Run(tally, cycles, cycle_seconds, targets, log_summary(target.pilot.log[base.mark :]))


def render(config: Config, run: Run) -> str:
    mode = (
        "Kubernetes mode: test API server, --xds-auth kubernetes, every call with a token"
        if config.mode == "kube"
        else "file mode: examples/mesh.yaml, --xds-auth none"
    )
    tally, cycles = run.tally, run.cycles
    lines = [
        f"pilot discovery, {mode}; seed {config.seed}",
        f"fuzz examples: {tally.examples:,} in {tally.seconds:.1f} s over"
        f" {len(tally.by_method)} methods (random bytes and hostile calls)",
        f"connect/subscribe/disconnect cycles: {cycles.done + cycles.failed:,} in"
        f" {run.cycle_seconds:.1f} s, {config.parallel} at a time ({cycles.failed} failed)",
        *[f"  {error}" for error in cycles.errors],
        *render_tally(tally),
        *render_logs(run.logs),
    ]
    if tally.crash:
        lines += ["CRASH: pilot was found dead after:", *tally.crash.splitlines()]
    return "\n".join([*lines, "", *render_targets(run.targets)])


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--examples", type=int, default=20_000, help="fuzz examples (20000)")
    parser.add_argument("--cycles", type=int, default=10_000, help="connect cycles (10000)")
    parser.add_argument("--parallel", type=int, default=8, help="cycles at a time (8)")
    parser.add_argument("--seed", type=int, default=1, help="for Hypothesis (1)")
    parser.add_argument("--mode", choices=("kube", "file"), default="kube", help="(kube)")
    parser.add_argument("--deadline", type=float, default=3.0, help="per call, seconds (3)")
    parser.add_argument("--warmup", type=int, default=300, help="examples and cycles (300)")
    parser.add_argument(
        "--send-stalls", action="store_true", help="send inputs known to stall pilot too"
    )
    args = parser.parse_args(argv)
    if min(args.examples, args.cycles, args.parallel, args.warmup) < 0 or args.parallel < 1:
        parser.error("counts must not be negative (and --parallel at least 1)")
    return Config(
        args.examples,
        args.cycles,
        args.parallel,
        args.seed,
        args.mode,
        args.deadline,
        args.warmup,
        args.send_stalls,
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    with LoopThread() as loop, tempfile.TemporaryDirectory(prefix="pilot-fuzz-") as folder:
        target = start_target(loop, Path(folder), config.mode)
        try:
            run = measure(target, config)
        finally:
            stopped = _stop(target)
    print(render(config, run), flush=True)
    print(f"pilot {stopped} on SIGTERM", flush=True)
    return 0 if run.targets.passed and stopped == "exited 0" else 1


def _stop(target: Target) -> str:
    """SIGTERM: how pilot ended ("exited 0" when it drained and exited cleanly)."""
    try:
        stop_target(target)
    except (AssertionError, pytest.fail.Exception) as error:
        return f"did not exit cleanly ({str(error).splitlines()[0]})"
    return "exited 0"


if __name__ == "__main__":
    sys.exit(main())
