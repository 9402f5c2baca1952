"""Which event loop pilot runs on: asyncio's own, or uvloop (`PILOT_EVENT_LOOP`).

gRPC's asyncio integration drives its completion queue from a thread of its
own and hands results to whatever loop runs the server, so either loop works.
asyncio's stays the default: measured against a floor on the same loop, uvloop
was no better overall (docs/performance.md, "uvloop").
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
LOOPS = ("asyncio", "uvloop")
DEFAULT = "asyncio"


class EventLoopError(ValueError):
    """PILOT_EVENT_LOOP names a loop pilot cannot run on."""


def loop_factory(
    env: Mapping[str, str] | None = None,
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop PILOT_EVENT_LOOP names (None: asyncio's default)."""
    env = os.environ if env is None else env
    name = env.get("PILOT_EVENT_LOOP", DEFAULT).strip().lower() or DEFAULT
    if name not in LOOPS:
        raise EventLoopError(f"PILOT_EVENT_LOOP={name}: choose one of {', '.join(LOOPS)}")
    if name == "asyncio":
        return None
    try:
        import uvloop  # noqa: PLC0415  (optional: only when asked for)
    except ImportError as error:
        raise EventLoopError(
            "PILOT_EVENT_LOOP=uvloop: uvloop is not installed (pip install 'pilot[uvloop]')"
        ) from error
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def running() -> str:
    """The name of the loop this code runs on, as PILOT_EVENT_LOOP spells it."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], env: Mapping[str, str] | None = None) -> T:
    """asyncio.run, on the loop PILOT_EVENT_LOOP names."""
    try:
        factory = loop_factory(env)
    except EventLoopError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
