"""PILOT_MAX_WATCH_EVENT_BYTES: its default, a value, and values pilot refuses at start."""

from __future__ import annotations

import pytest

from pilot.settings import SettingsError, informer_from_env


def test_the_default_is_8_mib_and_a_value_is_taken() -> None:
    assert informer_from_env({}).max_event_bytes == 8 * 1024 * 1024
    assert informer_from_env({"PILOT_MAX_WATCH_EVENT_BYTES": "2097152"}).max_event_bytes == (
        2 * 1024 * 1024
    )


@pytest.mark.parametrize("raw", ["", "-1", "12", "8MiB", "1e9"])
def test_a_value_pilot_cannot_use_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError, match="PILOT_MAX_WATCH_EVENT_BYTES"):
        informer_from_env({"PILOT_MAX_WATCH_EVENT_BYTES": raw})
