"""Refusals: an API server refusing pilot is one warning per cluster while it lasts."""

from __future__ import annotations

import logging

import pytest

from pilot.kube.refusals import Refusals

KINDS = ("Service", "EndpointSlice", "Pod", "Node")


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def _refuse_all(refusals: Refusals, cluster: str, rounds: int = 3) -> None:
    for _ in range(rounds):
        for kind in KINDS:
            refusals.refused(cluster, kind, f"list {kind}: HTTP 401: Unauthorized", 1.0)


def test_every_informer_refused_again_and_again_is_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "pilot.sources.kubernetes")
    refusals = Refusals()
    _refuse_all(refusals, "west")
    _refuse_all(refusals, "east")
    warnings = _lines(caplog, logging.WARNING)
    assert [w.split(":")[0] for w in warnings] == ["cluster west", "cluster east"]
    assert "list Service: HTTP 401: Unauthorized" in warnings[0]
    assert len(_lines(caplog, logging.INFO)) == 2 * (3 * len(KINDS) - 1)


def test_a_refusal_after_every_kind_answered_is_news_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "pilot.sources.kubernetes")
    refusals = Refusals()
    _refuse_all(refusals, "west", rounds=1)
    for kind in KINDS[:-1]:
        refusals.answered("west", kind)
    _refuse_all(refusals, "west", rounds=1)  # Node was refused all along
    assert len(_lines(caplog, logging.WARNING)) == 1
    for kind in KINDS:
        refusals.answered("west", kind)
    assert _lines(caplog, logging.INFO)[-1] == "cluster west: the API server answers pilot again"
    _refuse_all(refusals, "west", rounds=1)
    assert len(_lines(caplog, logging.WARNING)) == 2


def test_a_cluster_forgotten_and_watched_anew_is_warned_about_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = Refusals()
    _refuse_all(refusals, "west", rounds=1)
    refusals.forget("west")
    _refuse_all(refusals, "west", rounds=1)
    assert len(_lines(caplog, logging.WARNING)) == 2
