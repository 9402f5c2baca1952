"""The supervisor: pilot's long-lived tasks, each started again with backoff when it fails.

Every background service of `pilot discovery` and `pilot agent` (each informer of
each cluster, the multi-cluster Secret reconciler, the file source's poll loop,
the push pipeline, TLS renewal, the CA lease, the root publisher) runs as a named
task under one `Supervisor`, from a factory that makes a fresh coroutine, so that
it can be run again.

When one raises anything but CancelledError, the supervisor logs it at ERROR with
the task's name and the traceback, counts it (`failures`, exported as
`pilot_task_failures_total{task}`), shows it in `/ready`'s detail (`lines`) and
starts it again after an exponential backoff with jitter. A task that has run for
`healthy_after` seconds since its last start is healthy again: its backoff starts
from the beginning and its `/ready` line goes. A task started with `forever=True`
(all of pilot's are) that returns is a failure too; one started with
`forever=False` is then finished, and never started again.

Task names are pilot's own plus cluster ids (bounded by configuration), so they
can be metric labels. An error's text is reduced to one line of printable
characters and cut, so that what a hostile peer put in an exception cannot forge
another `/ready` line. The asyncio task keeps the supervised name, which is what
`/debug/tasks` lists.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pilot.runtime.backoff import Backoff

log = logging.getLogger("pilot.supervisor")

Factory = Callable[[], Coroutine[Any, Any, None]]
ERROR_CHARS = 160


def one_line(text: str, limit: int = ERROR_CHARS) -> str:
    """`text` as one line of printable characters, at most `limit` long (`...` if cut)."""
    printable = "".join(ch if ch.isprintable() else " " for ch in text[: limit * 4])
    flat = " ".join(printable.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def describe(error: BaseException) -> str:
    """`KeyError: 'x'`: the exception's type and text, as one bounded line."""
    text = str(error)
    return one_line(f"{type(error).__name__}: {text}" if text else type(error).__name__)


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    """How soon a failed task starts again, and when it counts as healthy again."""

    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    healthy_after: float = 60.0


class TaskState(enum.Enum):
    RUNNING = "running"
    RESTARTING = "restarting"  # failed; waiting out its backoff
    FINISHED = "finished"  # returned, and was not meant to run forever
    STOPPED = "stopped"


@dataclass(eq=False)
class SupervisedTask:
    """One supervised task: what starts it, and what happened to it."""

    name: str
    factory: Factory = field(repr=False)
    forever: bool
    state: TaskState = TaskState.RUNNING
    failures: int = 0  # since it was first started
    recent_failures: int = 0  # since it was last healthy
    last_error: str = ""
    started_at: float = 0.0
    restart_at: float = 0.0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def healthy(self, now: float, settings: SupervisorSettings) -> bool:
        """Running and not failed lately (or running for `healthy_after` since)."""
        return self.state is TaskState.RUNNING and (
            self.recent_failures == 0 or now - self.started_at >= settings.healthy_after
        )

    def line(self, now: float, settings: SupervisorSettings) -> str | None:
        """Its `/ready` detail line, or None while it is healthy (or done)."""
        if self.state in (TaskState.FINISHED, TaskState.STOPPED) or self.healthy(now, settings):
            return None
        count = f"{self.recent_failures} failure{'s' if self.recent_failures != 1 else ''}"
        name = one_line(self.name, 120)
        if self.state is TaskState.RESTARTING:
            wait = max(self.restart_at - now, 0.0)
            return f"task {name}: restarting in {wait:.1f}s after {self.last_error} ({count})"
        return f"task {name}: running again after {self.last_error} ({count})"


class Supervisor:
    """Runs named long-lived tasks, restarting each that fails; `stop` ends them all."""

    def __init__(
        self,
        settings: SupervisorSettings | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings or SupervisorSettings()
        self._clock = clock
        self._tasks: list[SupervisedTask] = []
        self.failures: Counter[str] = Counter()  # task name -> failures, for the metric

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    @property
    def tasks(self) -> list[SupervisedTask]:
        return list(self._tasks)

    def start(self, name: str, factory: Factory, *, forever: bool = True) -> SupervisedTask:
        """Run `factory()` as task `name` now, and again after each failure."""
        supervised = SupervisedTask(name, factory, forever, started_at=self._now())
        supervised.task = asyncio.create_task(self._run(supervised), name=name)
        self._tasks.append(supervised)
        return supervised

    async def stop_task(self, supervised: SupervisedTask) -> None:
        """Cancel one task, wait for it, and forget it (and, if none other has its name,
        its failure count: a removed cluster's label leaves the metric)."""
        if supervised in self._tasks:
            self._tasks.remove(supervised)
        await _cancel(supervised)
        if not any(t.name == supervised.name for t in self._tasks):
            self.failures.pop(supervised.name, None)

    async def stop(self) -> None:
        """Cancel every task and wait until each has ended."""
        stopping, self._tasks = self._tasks, []
        for supervised in stopping:
            if supervised.task is not None:
                supervised.task.cancel()
        for supervised in stopping:
            await _cancel(supervised)

    def lines(self) -> list[str]:
        """A `/ready` detail line for each task that failed and is not healthy again."""
        now = self._now()
        found = (t.line(now, self.settings) for t in self._tasks)
        return [line for line in found if line is not None]

    async def _run(self, supervised: SupervisedTask) -> None:
        backoff = Backoff(self.settings.backoff_initial, self.settings.backoff_max)
        while True:
            supervised.state = TaskState.RUNNING
            supervised.started_at = self._now()
            error = await self._run_once(supervised)
            if error is None:
                supervised.state = TaskState.FINISHED
                return
            if self._now() - supervised.started_at >= self.settings.healthy_after:
                backoff.reset()  # it ran well for a while: this is a new failure, not a loop
                supervised.recent_failures = 0
            delay = backoff.next_delay()
            self._failed(supervised, error, delay)
            await asyncio.sleep(delay)

    async def _run_once(self, supervised: SupervisedTask) -> str | None:
        """Run the task once: None if it finished as it may, else why it must run again."""
        try:
            await supervised.factory()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # anything it raised: logged below with the traceback
            log.error("task %s failed: %s", supervised.name, describe(error), exc_info=error)
            return describe(error)
        if supervised.forever:
            log.error("task %s returned, but it runs until pilot stops", supervised.name)
            return "it returned"
        return None

    def _failed(self, supervised: SupervisedTask, error: str, delay: float) -> None:
        supervised.failures += 1
        supervised.recent_failures += 1
        supervised.last_error = error
        supervised.state = TaskState.RESTARTING
        supervised.restart_at = self._now() + delay
        self.failures[supervised.name] += 1
        log.warning(
            "task %s: restarting in %.1fs (%d failures in a row)",
            supervised.name,
            delay,
            supervised.recent_failures,
        )


async def _cancel(supervised: SupervisedTask) -> None:
    supervised.state = TaskState.STOPPED
    task = supervised.task
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # whoever is stopping us is being cancelled too: let it through
