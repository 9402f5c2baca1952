"""What pilot still does wrong (or cannot help) under fuzz, so the search can tell it apart.

Every `Defect` names what it `explains`: the violations it causes, matched narrowly
on status details and log text (a violation is judged with the rest of its example:
a stream left hanging is explained by the log line that says why, a stall by the
thousands of lines logged meanwhile). Defects
that would stall pilot for long also name the inputs the tests' random search must
`avoid`. A defect gets a deterministic reproducer in `test_known_defects` under
`xfail(strict=True)`: once it is fixed its test passes, the strict xfail fails the
suite, and whoever fixed it deletes the entry here (so that the search stops
tolerating or avoiding it). None is known today.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pytest

from tests.fuzz.calls import Call
from tests.fuzz.properties import Violation
from tests.support.pilot_process import Entry

SECRET_WARNING = "that pilot does not make"  # the one summary line per stream


class Seen(Protocol):
    """What a defect may look at to explain a violation: the whole example."""

    @property
    def call(self) -> Call: ...

    @property
    def entries(self) -> list[Entry]: ...

    @property
    def violations(self) -> list[Violation]: ...


Explains = Callable[[Violation, Seen], bool]


def _never(_call: Call) -> bool:
    return False


def _nothing(_violation: Violation, _seen: Seen) -> bool:
    return False


@dataclass(frozen=True)
class Defect:
    """A known defect: what it explains and which inputs must not be sent."""

    key: str
    summary: str
    explains: Explains = _nothing
    avoid: Callable[[Call], bool] = _never

    def xfail(self) -> pytest.MarkDecorator:
        reason = f"known defect {self.key}: {self.summary} (then delete it from known.py)"
        return pytest.mark.xfail(strict=True, reason=reason)


_DEFECTS: tuple[Defect, ...] = ()
KNOWN = {defect.key: defect for defect in _DEFECTS}


def explained_by(violation: Violation, seen: Seen) -> Defect | None:
    return next((d for d in _DEFECTS if d.explains(violation, seen)), None)


def avoided_by(call: Call) -> Defect | None:
    return next((d for d in _DEFECTS if d.avoid(call)), None)
