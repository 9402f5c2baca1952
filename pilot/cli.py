"""The `pilot` command line: `pilot discovery` runs the control plane."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pilot.app import Discovery
from pilot.generators.builder import BuildSettings
from pilot.settings import (
    Settings,
    SettingsError,
    debounce_from_env,
    push_from_env,
    split_host_port,
)
from pilot.sources.kubernetes.connection import KubernetesUnavailable
from pilot.sources.kubernetes.registry import EndpointsApi, KubernetesSettings

log = logging.getLogger("pilot")

_DISCOVERY_EPILOG = """\
environment:
  PILOT_DEBOUNCE_AFTER       quiet period before a push (default 100ms)
  PILOT_DEBOUNCE_MAX         longest a change waits for a push (default 10s)
  PILOT_ENABLE_EDS_DEBOUNCE  debounce endpoint-only changes too (default true)
  PILOT_PUSH_THROTTLE        responses built and written at once (default 100)
  PILOT_XDS_SEND_TIMEOUT     close a stream whose Envoy stops reading (default 10s, 0: never)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pilot", description="An asyncio xDS control plane for Envoy."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    discovery = commands.add_parser(
        "discovery",
        help="run the control plane (ADS, CDS, EDS)",
        description="Serve clusters and endpoints to Envoy over xDS (SotW and delta).",
        epilog=_DISCOVERY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    discovery.add_argument(
        "--grpc-addr",
        default="0.0.0.0:15010",
        help="xDS, gRPC health and reflection (default %(default)s)",
    )
    discovery.add_argument(
        "--http-addr",
        default="0.0.0.0:15014",
        help="/ready and later /metrics (default %(default)s)",
    )
    discovery.add_argument(
        "--config",
        type=Path,
        help="a YAML file of Services, EndpointSlices and Endpoints (reloaded on change)",
    )
    discovery.add_argument(
        "--kubeconfig",
        type=Path,
        help="without --config: kubeconfig to use (else $KUBECONFIG, in-cluster, ~/.kube/config)",
    )
    discovery.add_argument(
        "--namespaces",
        default="",
        help="comma-separated namespaces to watch (default: all)",
    )
    discovery.add_argument(
        "--endpoints-api",
        choices=[api.value for api in EndpointsApi],
        default=EndpointsApi.ENDPOINTSLICES.value,
        help="watch EndpointSlices (default) or legacy v1 Endpoints",
    )
    discovery.add_argument("--cluster-domain", default="cluster.local")
    discovery.add_argument(
        "--xds-cluster-name",
        default="xds-grpc",
        help="bootstrap cluster named in non-ADS EDS config sources (default %(default)s)",
    )
    discovery.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    for address in (args.grpc_addr, args.http_addr):
        split_host_port(address)
    return Settings(
        grpc_addr=args.grpc_addr,
        http_addr=args.http_addr,
        config=args.config,
        build=BuildSettings(args.cluster_domain, args.xds_cluster_name),
        debounce=debounce_from_env(),
        push=push_from_env(),
        kubernetes=KubernetesSettings(
            kubeconfig=args.kubeconfig,
            namespaces=tuple(n.strip() for n in args.namespaces.split(",") if n.strip()),
            endpoints_api=EndpointsApi(args.endpoints_api),
        ),
    )


async def _run_discovery(settings: Settings) -> None:

    discovery = Discovery(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await discovery.start()
    await stop.wait()
    log.info("shutting down")
    await discovery.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pilot` console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = _settings(args)
        asyncio.run(_run_discovery(settings))
    except (SettingsError, OSError, KubernetesUnavailable) as error:
        print(f"pilot: error: {error}", file=sys.stderr)
        return 2
    return 0
