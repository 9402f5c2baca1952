"""The supervisor on virtual time: a failing task is logged, counted, shown and started
again with growing backoff; one that ran healthily for long enough starts from the
shortest backoff again; a task that may finish is left finished; stopping cancels
and waits; what a failure says is one bounded line whatever the exception holds."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from pilot.runtime.supervisor import Supervisor, SupervisorSettings, TaskState, one_line
from tests.support.virtual_time import run_in_virtual_time

SETTINGS = SupervisorSettings(backoff_initial=1.0, backoff_max=8.0, healthy_after=60.0)


class Flaky:
    """A task body that fails `failures` times (at the moments given by `run_for`), then
    runs until cancelled; it records the loop time of every start."""

    def __init__(self, failures: int, run_for: float = 0.0) -> None:
        self.failures = failures
        self.run_for = run_for
        self.starts: list[float] = []
        self.cancelled = False

    async def __call__(self) -> None:
        self.starts.append(asyncio.get_running_loop().time())
        if len(self.starts) <= self.failures:
            await asyncio.sleep(self.run_for)
            raise KeyError("x")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def _wait_for(predicate: object, within: float = 1000.0) -> None:
    assert callable(predicate)
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - a condition with a deadline, on virtual time
            await asyncio.sleep(0.01)


def test_a_failing_task_is_logged_counted_shown_and_restarted_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    random.seed(7)
    flaky = Flaky(failures=4)

    async def main() -> None:
        supervisor = Supervisor(SETTINGS)
        task = supervisor.start("informer-west-Service", flaky)
        await _wait_for(lambda: len(flaky.starts) == 5)
        gaps = [b - a for a, b in zip(flaky.starts, flaky.starts[1:], strict=False)]
        # Full jitter on 1, 2, 4, 8 s: each wait within [half, whole] of its step.
        for gap, step in zip(gaps, (1.0, 2.0, 4.0, 8.0), strict=True):
            assert step / 2 <= gap <= step
        assert supervisor.failures["informer-west-Service"] == 4
        assert task.state is TaskState.RUNNING
        (line,) = supervisor.lines()
        assert line == "task informer-west-Service: running again after KeyError: 'x' (4 failures)"
        await supervisor.stop()
        assert flaky.cancelled

    with caplog.at_level(logging.ERROR, "pilot.supervisor"):
        run_in_virtual_time(main())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 4
    assert all("informer-west-Service" in r.getMessage() for r in errors)
    assert all(r.exc_info is not None and r.exc_info[0] is KeyError for r in errors)


def test_ready_line_while_waiting_to_restart() -> None:
    async def main() -> None:
        supervisor = Supervisor(SETTINGS)

        async def broken() -> None:
            raise ValueError("bad\nline")

        supervisor.start("remote-secrets", broken)
        await _wait_for(lambda: supervisor.failures["remote-secrets"] == 1)
        (line,) = supervisor.lines()
        assert line.startswith("task remote-secrets: restarting in ")
        assert line.endswith("after ValueError: bad line (1 failure)")
        await supervisor.stop()

    run_in_virtual_time(main())


def test_backoff_starts_over_after_a_healthy_run() -> None:
    random.seed(3)
    # Fails at once three times (backoff grows to 4 s), then runs 100 s and fails again.
    flaky = Flaky(failures=3)

    async def main() -> None:
        supervisor = Supervisor(SETTINGS)
        supervisor.start("push", flaky)
        await _wait_for(lambda: len(flaky.starts) == 4)
        assert supervisor.lines(), "just restarted after 3 failures: shown"
        await asyncio.sleep(SETTINGS.healthy_after)
        assert supervisor.lines() == [], "healthy for healthy_after: no longer shown"
        await supervisor.stop()

    run_in_virtual_time(main())

    # Runs 1-3 fail at once, run 4 after 100 s, run 5 at once: the backoff after run 4
    # is the first step again, and the failures in a row count from there.
    class LongThenShort:
        def __init__(self) -> None:
            self.starts: list[float] = []

        async def __call__(self) -> None:
            self.starts.append(asyncio.get_running_loop().time())
            runs = len(self.starts)
            await asyncio.sleep(100.0 if runs == 4 else 0.0)
            if runs <= 5:
                raise RuntimeError(f"run {runs}")
            await asyncio.Event().wait()

    body = LongThenShort()

    async def second() -> None:
        supervisor = Supervisor(SETTINGS)
        task = supervisor.start("ca-lease", body)
        await _wait_for(lambda: len(body.starts) == 6)
        after_long_run = body.starts[4] - (body.starts[3] + 100.0)
        assert SETTINGS.backoff_initial / 2 <= after_long_run <= SETTINGS.backoff_initial
        assert task.recent_failures == 2, "the run of 100 s ended the earlier streak"
        assert task.failures == 5
        await supervisor.stop()

    run_in_virtual_time(second())


def test_a_task_that_may_finish_is_not_restarted_and_one_that_may_not_is() -> None:
    async def main() -> None:
        supervisor = Supervisor(SETTINGS)
        runs = {"once": 0, "forever": 0}

        async def once() -> None:
            runs["once"] += 1

        async def returns() -> None:
            runs["forever"] += 1

        finished = supervisor.start("once", once, forever=False)
        supervisor.start("forever", returns)
        await _wait_for(lambda: runs["forever"] >= 3)
        assert runs["once"] == 1
        assert finished.state is TaskState.FINISHED
        assert supervisor.failures["forever"] >= 2
        assert "once" not in supervisor.failures
        assert any("forever" in line and "it returned" in line for line in supervisor.lines())
        await supervisor.stop()

    run_in_virtual_time(main())


def test_stop_cancels_every_task_and_waits_for_it() -> None:
    async def main() -> None:
        supervisor = Supervisor(SETTINGS)
        cleaned: list[str] = []

        def body(name: str) -> object:
            async def run() -> None:
                try:
                    await asyncio.Event().wait()
                finally:
                    await asyncio.sleep(1.0)  # cleanup that takes time must be awaited
                    cleaned.append(name)

            return run

        for name in ("a", "b", "c"):
            supervisor.start(name, body(name))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await supervisor.stop()
        assert sorted(cleaned) == ["a", "b", "c"]
        assert supervisor.tasks == []

    run_in_virtual_time(main())


def test_stopping_one_task_forgets_its_count() -> None:
    async def main() -> None:
        supervisor = Supervisor(SETTINGS)
        flaky = Flaky(failures=1)
        task = supervisor.start("informer-gone-Service", flaky)
        other = supervisor.start("push", Flaky(failures=0))
        await _wait_for(lambda: len(flaky.starts) == 2)
        assert supervisor.failures["informer-gone-Service"] == 1
        await supervisor.stop_task(task)
        assert "informer-gone-Service" not in supervisor.failures
        assert supervisor.tasks == [other]
        await supervisor.stop()

    run_in_virtual_time(main())


def test_an_error_text_cannot_forge_a_ready_line() -> None:
    hostile = "x\ncluster FORGED: synced\r\n\x1b[2J" + "y" * 10_000
    line = one_line(hostile)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert len(line) <= 160 and line.endswith("...")

    async def main() -> None:
        supervisor = Supervisor(SETTINGS)

        async def broken() -> None:
            raise KeyError(hostile)

        supervisor.start("informer-west-Service", broken)
        await _wait_for(lambda: supervisor.failures["informer-west-Service"] == 1)
        (line,) = supervisor.lines()
        assert "\n" not in line and len(line) < 300
        await supervisor.stop()

    run_in_virtual_time(main())
