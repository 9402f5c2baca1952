"""What answering one review came to: the HTTP status and body, and the kind of outcome
(injected, skipped, or a kind of refusal) that the server counts and logs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The outcomes that are not refusals (those are `refusals`' kinds).
INJECTED = "injected"
SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The HTTP status and body to send, the kind of outcome, and a line for the log."""

    status: int
    body: bytes
    kind: str  # INJECTED, SKIPPED, or one of `refusals`' kinds
    reason: str = ""

    @property
    def content_type(self) -> str:
        return "application/json" if self.status == 200 else "text/plain"


# A request's body and Content-Type -> its outcome; run on the webhook's worker threads.
Reviewer = Callable[[bytes, str | None], Outcome]
