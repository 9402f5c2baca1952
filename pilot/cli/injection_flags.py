"""The injection flags `pilot kube-inject` and `pilot discovery` share, and the
InjectSettings they make."""

from __future__ import annotations

import argparse

from pilot.inject.settings import ENVOY_LOG_LEVELS, MAX_CONCURRENCY, InjectSettings

_DEFAULTS = InjectSettings()


def injection_flags(parser: argparse.ArgumentParser) -> None:
    """--proxy-image, --injection-discovery-address, --injection-ca-address,
    --native-sidecars/--no-native-sidecars, --proxy-log-level, --proxy-concurrency."""
    group = parser.add_argument_group("sidecar injection (the injected pod)")
    group.add_argument(
        "--proxy-image",
        default=_DEFAULTS.proxy_image,
        help="image of istio-init and istio-proxy (default %(default)s)",
    )
    group.add_argument(
        "--injection-discovery-address",
        default=_DEFAULTS.discovery_address,
        help="pilot's TLS gRPC address as the sidecar reaches it (default %(default)s)",
    )
    group.add_argument(
        "--injection-ca-address",
        default=_DEFAULTS.ca_address,
        help="the CA's address as the sidecar reaches it (CA_ADDR; default: the discovery address)",
    )
    group.add_argument(
        "--native-sidecars",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULTS.native_sidecars,
        help="istio-proxy as a native sidecar (an init container that keeps running; Kubernetes"
        " 1.29+), else the first container (default: native)",
    )
    group.add_argument(
        "--proxy-log-level",
        choices=ENVOY_LOG_LEVELS,
        default=_DEFAULTS.proxy_log_level,
        help="Envoy's log level in injected pods (default %(default)s)",
    )
    group.add_argument(
        "--proxy-concurrency",
        type=_concurrency,
        default=_DEFAULTS.proxy_concurrency,
        help="Envoy's worker threads in injected pods (default %(default)s; 0: one per core)",
    )


def _concurrency(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) <= MAX_CONCURRENCY):
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: expected a number 0-{MAX_CONCURRENCY}")
    return int(text)


def inject_settings(args: argparse.Namespace) -> InjectSettings:
    """The settings the flags say (and --trust-domain, --cluster-id where the command has
    them). Raises InjectSettingsError naming the flag of a value a pod cannot take."""
    return InjectSettings(
        proxy_image=args.proxy_image,
        discovery_address=args.injection_discovery_address,
        ca_address=args.injection_ca_address,
        native_sidecars=args.native_sidecars,
        proxy_log_level=args.proxy_log_level,
        proxy_concurrency=args.proxy_concurrency,
        trust_domain=getattr(args, "trust_domain", None) or _DEFAULTS.trust_domain,
        cluster_id=getattr(args, "cluster_id", None) or _DEFAULTS.cluster_id,
    )
