"""`/debug/tasks`: every asyncio task and where it waits, like Go's goroutine dump.

For a stream that will not go away or a push that never ends, the question is
which `await` it sits in. Each task is listed with its name and its chain of
awaits, outermost first (`file:line function`), down to the future it waits
on. Task names and code locations only: no argument or local is shown, so no
token or key can appear.
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from pathlib import Path
from typing import Any

MAX_DEPTH = 32


def tasks() -> dict[str, Any]:
    """The running loop's tasks: a count per place they wait, and each task."""
    listed = [_task(task) for task in asyncio.all_tasks()]
    listed.sort(key=lambda t: (t["waits_in"], t["name"]))
    waiting = Counter(t["waits_in"] for t in listed)
    return {"count": len(listed), "waiting_in": dict(waiting.most_common()), "tasks": listed}


def _task(task: asyncio.Task[Any]) -> dict[str, Any]:
    chain = _await_chain(task.get_coro())
    return {"name": task.get_name(), "waits_in": chain[-1] if chain else "", "stack": chain}


def _await_chain(awaitable: Any) -> list[str]:
    """The coroutine, what it awaits, what that awaits, ... (generators and futures too)."""
    chain: list[str] = []
    while awaitable is not None and len(chain) < MAX_DEPTH:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            if type(awaitable).__name__ == "coroutine_wrapper":
                # Compiled code (gRPC's handler, running a stream's writer) awaits a
                # coroutine through its __await__ wrapper, which names it only to the
                # collector.
                awaitable = _wrapped(awaitable)
                continue
            if isinstance(awaitable, asyncio.Future):
                chain.append(f"<{type(awaitable).__name__}>")
            break
        code = frame.f_code
        chain.append(f"{_short(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    return chain


def _wrapped(wrapper: object) -> Any:
    """The coroutine a `coroutine_wrapper` (what `coro.__await__()` returns) runs."""
    return next((r for r in gc.get_referents(wrapper) if asyncio.iscoroutine(r)), None)


def _short(filename: str) -> str:
    """A path from its package down (`pilot/server/connection.py`, `asyncio/tasks.py`)."""
    parts = Path(filename).parts
    for anchor in ("pilot", "asyncio", "grpc", "aiohttp", "kubernetes_asyncio"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor) - 1 :])
    return Path(filename).name
