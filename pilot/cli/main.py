"""The `pilot` command line: the parser of every command, and the entry point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pilot.agent.bootstrap import BootstrapError
from pilot.agent.iptables import CaptureError
from pilot.cli.agent import agent_command, agent_parser
from pilot.cli.discovery import discovery_parser, run_discovery
from pilot.cli.flags import Parser, negative_durations_joined, version_flag
from pilot.cli.kube_inject import kube_inject_command, kube_inject_parser
from pilot.cli.proxy_config import proxy_config_command, proxy_config_parser
from pilot.cli.proxy_status import proxy_status_command, proxy_status_parser
from pilot.kube.config import KubernetesUnavailable
from pilot.limits import LimitSettingError
from pilot.logs import LogSpecError
from pilot.logs import configure as configure_logging
from pilot.runtime.event_loop import EventLoopError
from pilot.security.ca import CaSetupError
from pilot.security.settings import SecuritySettingsError
from pilot.settings import SettingsError


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser, under `pilot`."""
    parser = Parser(prog="pilot", description="An asyncio xDS control plane for Envoy.")
    version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    discovery_parser(commands)
    agent_parser(commands)
    proxy_status_parser(commands)
    proxy_config_parser(commands)
    kube_inject_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pilot` console script."""
    given = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(negative_durations_joined(given))
    if args.command == "proxy-status":
        return proxy_status_command(args)
    if args.command == "proxy-config":
        return proxy_config_command(args)
    if args.command == "kube-inject":
        return kube_inject_command(args)
    try:
        configure_logging(args.log_level, args.log_format)
        if args.command == "agent":
            return agent_command(args)
        run_discovery(args)
    except (
        LogSpecError,
        EventLoopError,
        LimitSettingError,
        SettingsError,
        SecuritySettingsError,
        CaSetupError,
        OSError,
        KubernetesUnavailable,
        BootstrapError,
        CaptureError,
    ) as error:
        print(f"pilot: error: {error}", file=sys.stderr)
        return 2
    return 0
