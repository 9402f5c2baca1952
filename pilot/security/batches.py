"""Crypto off the event loop, in batches: one thread hand-off for many calls.

A burst of proxies asks for hundreds of certificates at once: SDS streams
arriving together, or a rollout's `pilot agent`s calling CreateCertificate.
Handed to threads one call at a time, each costs a thread woken and the GIL
passed back and forth. EC keys, EC signatures and CSR checks hold the GIL
throughout, so several threads doing them at once only take turns, and the
event loop waits behind each of them for its own turn. `ThreadBatches` queues
the calls and runs them in batches of up to `batch`, in at most `threads`
threads, each batch holding one of `slots` (the signing slots the CA's callers
share). One lane with one thread serves everything that holds the GIL; RSA key
generation, which releases it, gets a lane of several threads, one key each.

Each call's outcome is its own: a call that raises fails alone, and a caller
that gave up (cancelled) is skipped before its batch runs. The queue is bounded
by whoever queues: each workload waits for its one mint, each CreateCertificate
call was admitted under PILOT_MAX_PENDING_CSRS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
SIGNING_BATCH = 16  # calls per hand-off on the signing lane: ~2 ms of EC work


@dataclass(frozen=True, slots=True)
class _Job:
    """One call to run in a thread, and where its outcome goes."""

    work: Callable[[], Any]
    result: asyncio.Future[Any]


class ThreadBatches:
    """A lane of calls run in threads in batches (see the module's docstring)."""

    def __init__(self, slots: asyncio.Semaphore, batch: int, threads: int, name: str) -> None:
        self._slots = slots
        self._batch = batch
        self._threads = threads
        self._name = name
        self._queue: list[_Job] = []
        self._drainers: set[asyncio.Task[None]] = set()

    async def run(self, work: Callable[[], T]) -> T:
        """`work()`'s result (or what it raised), once a thread of this lane has run it."""
        return await self.submit(work)

    def submit(self, work: Callable[[], T]) -> asyncio.Future[T]:
        """A future of `work()`'s outcome, for callers that want a callback, not a task.

        Cancelling it before its batch runs leaves `work` undone.
        """
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        self._queue.append(_Job(work, result))
        drainers = len(self._drainers)
        if drainers < self._threads and drainers * self._batch < len(self._queue):
            drainer = loop.create_task(self._drain(), name=self._name)
            self._drainers.add(drainer)
            drainer.add_done_callback(self._drainers.discard)
        return result

    async def _drain(self) -> None:
        """Run batches from the queue until it is empty."""
        try:
            await self._drain_batches()
        finally:
            # Now, not in a done callback: a call queued before that ran would see this
            # drainer still counted and start none, though this one takes no more.
            self._drainers.discard(asyncio.current_task())

    async def _drain_batches(self) -> None:
        while self._queue:
            async with self._slots:
                # Taken once a slot is free: calls queued meanwhile join this batch.
                batch = [job for job in self._queue[: self._batch] if not job.result.done()]
                del self._queue[: self._batch]
                if not batch:
                    continue
                try:
                    outcomes = await asyncio.to_thread(_run_batch, batch)
                except BaseException as error:
                    _fail(batch, error)
                    raise
            for job, outcome in zip(batch, outcomes, strict=True):
                _settle(job.result, outcome)


def _run_batch(batch: list[_Job]) -> list[Any]:
    """In a thread: each call's result, or the exception it raised (the others go on)."""
    outcomes: list[Any] = []
    for job in batch:
        try:
            outcomes.append(_Returned(job.work()))
        except Exception as error:
            outcomes.append(error)
    return outcomes


@dataclass(frozen=True, slots=True)
class _Returned:
    """A call's result, told apart from an exception it might return as a value."""

    value: Any


def _settle(result: asyncio.Future[Any], outcome: Any) -> None:
    if result.done():
        return  # its caller gave up meanwhile
    if isinstance(outcome, _Returned):
        result.set_result(outcome.value)
    else:
        result.set_exception(outcome)


def _fail(batch: list[_Job], error: BaseException) -> None:
    """A batch that never finished: its callers must not wait for ever."""
    for job in batch:
        if job.result.done():
            continue
        if isinstance(error, asyncio.CancelledError):
            job.result.cancel()
        else:
            job.result.set_exception(RuntimeError(f"a batch of {len(batch)} failed: {error}"))


def signing_lane(slots: asyncio.Semaphore) -> ThreadBatches:
    """The one-thread lane for what holds the GIL: CSRs signed, EC keys minted."""
    return ThreadBatches(slots, SIGNING_BATCH, 1, "ca-sign")
