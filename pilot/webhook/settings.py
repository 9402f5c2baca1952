"""The webhook's settings: where it listens (--webhook-addr) and its bounds, each from an
environment variable checked at start (`webhook_from_env`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pilot.durations import parse_duration

# Istio's webhook reads at most 6 MiB of a review (kube.HTTPConfigReader): a Pod is at
# most what etcd stores of one object (1.5 MiB by default), JSON-escaped.
MAX_REVIEW_BYTES = 6 * 1024 * 1024
CONFIGURATION = "pilot-sidecar-injector"  # deploy/sidecar-injector.yaml


class WebhookSettingError(ValueError):
    """A webhook variable has a value pilot cannot use."""


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """Where the webhook listens ('' : off), and what one caller may make it hold."""

    address: str = ""  # the CLI fills in its default (pilot.cli.discovery_settings)
    configuration: str = CONFIGURATION  # --injector-webhook-config (Kubernetes mode)
    max_reviews: int = 1000  # PILOT_MAX_INJECTION_REVIEWS: reviews being answered at once
    # PILOT_MAX_INJECTION_BYTES: request bodies held at once (read, queued, being answered).
    max_bytes: int = 64 * 1024 * 1024
    # PILOT_INJECTION_BODY_TIMEOUT: from the request's headers to its last body byte. The
    # API server gives a webhook 10 s by default (30 s at most): slower is an attack.
    body_timeout: float = 10.0
    workers: int = 4  # threads answering reviews: JSON of 6 MiB stays off the event loop


ENV = {
    "max_reviews": "PILOT_MAX_INJECTION_REVIEWS",
    "max_bytes": "PILOT_MAX_INJECTION_BYTES",
    "body_timeout": "PILOT_INJECTION_BODY_TIMEOUT",
}


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    if not raw.strip().isdigit() or int(raw) == 0:
        raise WebhookSettingError(f"{name}: expected a positive integer, got {raw!r}")
    return int(raw)


def _duration(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = parse_duration(raw)
    except ValueError as error:
        raise WebhookSettingError(f"{name}: {error}") from None
    if value <= 0:
        raise WebhookSettingError(f"{name}: must be more than 0, got {raw!r}")
    return value


def webhook_from_env(
    address: str, configuration: str, env: Mapping[str, str] | None = None
) -> WebhookSettings:
    """The settings for `address` and `configuration`, bounds from the environment."""
    env = os.environ if env is None else env
    defaults = WebhookSettings()
    max_bytes = _positive(env, ENV["max_bytes"], defaults.max_bytes)
    if max_bytes < MAX_REVIEW_BYTES:
        raise WebhookSettingError(
            f"{ENV['max_bytes']}: at least {MAX_REVIEW_BYTES} (one review of the largest"
            f" size), got {max_bytes}"
        )
    return WebhookSettings(
        address=address,
        configuration=configuration,
        max_reviews=_positive(env, ENV["max_reviews"], defaults.max_reviews),
        max_bytes=max_bytes,
        body_timeout=_duration(env, ENV["body_timeout"], defaults.body_timeout),
    )
