"""The bench's `--pilot-log-level`: a spec pilot's own `--log-level` takes, with its
"serving" line kept at info (the bench waits for that line to know pilot's ports)."""

from __future__ import annotations

import pytest

from bench.pilot_cli import log_level
from pilot.logs import SCOPES, parse_levels


@pytest.mark.parametrize("quiet", ["warning", "error"])
def test_a_quiet_level_is_one_pilot_accepts_with_serving_kept_at_info(quiet: str) -> None:
    default, scoped = parse_levels(log_level(quiet))  # raises LogSpecError if refused
    assert default == quiet.upper()
    assert scoped.pop("pilot") == "INFO"
    assert scoped, "no component was kept at the level asked for"
    assert set(scoped.values()) == {quiet.upper()}
    # The bench keeps its own list (it does not import pilot): every component of pilot's
    # is in it, itself or through a scope above it (`ca` and `sds` through `security`).
    for logger in set(SCOPES.values()) - {"pilot"}:
        assert any(logger == kept or logger.startswith(f"{kept}.") for kept in scoped), logger


def test_a_scope_named_keeps_its_own_level() -> None:
    default, scoped = parse_levels(log_level("warning,xds:debug"))
    assert default == "WARNING"
    assert scoped["pilot.xds"] == "DEBUG"
    assert scoped["pilot.push"] == "WARNING"


@pytest.mark.parametrize("spec", ["info", "debug", "info,xds:debug"])
def test_info_or_more_is_passed_as_given(spec: str) -> None:
    assert log_level(spec) == spec
    parse_levels(spec)
