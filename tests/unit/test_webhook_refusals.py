"""The webhook's refusal lines and the caBundle patch, without a server or an API server.

A flood of one kind of bad request is one line per 10 s saying how many more came, a
caller's newline never reaches the log as a line of its own; the caBundle patch touches
only the webhooks whose bundle differs, each guarded by a test of its name.
"""

from __future__ import annotations

import logging

import pytest

from pilot.webhook import refusals
from pilot.webhook.ca_bundle import bundle_patch
from pilot.webhook.refusals import InjectionStats, Refusals


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pilot.webhook"]


def test_one_line_per_kind_per_period(caplog: pytest.LogCaptureFixture) -> None:
    stats, clock = InjectionStats(), _Clock()
    refused = Refusals(stats, clock)
    with caplog.at_level(logging.WARNING, "pilot.webhook"):
        for _ in range(1000):
            refused.refused(refusals.TOO_LARGE, "10.0.0.5", "the body is 7000000 bytes")
        refused.refused(refusals.CONTENT_TYPE, "10.0.0.5", "text/plain")
        clock.now = refusals.LOG_EVERY + 1
        refused.refused(refusals.TOO_LARGE, "10.0.0.5", "the body is 7000000 bytes")
    lines = _lines(caplog)
    assert len(lines) == 3, lines
    assert "999 more since the last such line" in lines[2]
    assert stats.refusals[refusals.TOO_LARGE] == 1001


def test_a_callers_newline_is_escaped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "pilot.webhook"):
        Refusals(InjectionStats()).refused(
            refusals.NOT_FOUND, "10.0.0.5", "no such path '/x\nFORGED line'"
        )
    (line,) = _lines(caplog)
    assert "\n" not in line and "\\n" in line


def _webhook(name: str, bundle: str | None) -> dict[str, object]:
    config: dict[str, object] = {"service": {"name": "pilot", "namespace": "pilot-system"}}
    if bundle is not None:
        config["caBundle"] = bundle
    return {"name": name, "clientConfig": config}


def test_the_patch_sets_only_the_bundles_that_differ() -> None:
    configuration = {
        "webhooks": [_webhook("a", "ROOT"), _webhook("b", None), _webhook("c", "OLD"), "junk"]
    }
    assert bundle_patch(configuration, "ROOT") == [
        {"op": "test", "path": "/webhooks/1/name", "value": "b"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "ROOT"},
        {"op": "test", "path": "/webhooks/2/name", "value": "c"},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "ROOT"},
    ]
    assert bundle_patch({"webhooks": [_webhook("a", "ROOT")]}, "ROOT") == []
    assert bundle_patch({}, "ROOT") == []
