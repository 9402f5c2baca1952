"""One AdmissionReview answered, for the webhook's worker threads: `pilot.inject.review`
says what to send and what it came to; this turns that into the webhook's `Outcome`
(the status, and the kind the server counts and logs)."""

from __future__ import annotations

from pilot.inject import review as inject_review
from pilot.inject.settings import InjectSettings
from pilot.webhook import refusals
from pilot.webhook.outcome import INJECTED, SKIPPED, Outcome, Reviewer


def reviewer(settings: InjectSettings) -> Reviewer:
    """`review` with the injection settings pilot runs with."""
    return lambda body, content_type: review(body, content_type, settings)


def review(body: bytes, content_type: str | None, settings: InjectSettings) -> Outcome:
    """The answer to one request's body: an AdmissionReview (200), or 400/415 as Istio."""
    try:
        answered, outcome = inject_review.review(body, content_type, settings)
    except inject_review.ReviewError as error:
        kind = refusals.CONTENT_TYPE if error.status == 415 else refusals.UNDECODABLE
        return Outcome(error.status, f"{error.reason}\n".encode(), kind, error.reason)
    if outcome.refusal:
        reason = f"refused Pod (uid {outcome.uid}): {outcome.refusal}"
        return Outcome(200, answered, refusals.TEMPLATE, reason)
    return Outcome(200, answered, INJECTED if outcome.injected else SKIPPED)
