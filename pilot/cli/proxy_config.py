"""`pilot proxy-config`: one proxy's clusters, endpoints, listeners, routes or secrets,
from CSDS."""

from __future__ import annotations

import argparse
import sys

from pilot.cli.flags import Parser
from pilot.cli.proxy_status import client_status, csds_flags
from pilot.debug import proxy_config, tables

_PROXY_CONFIG_KINDS = (
    ("clusters", ("cluster", "c"), "a row per cluster: name, type, state, version"),
    (
        "endpoints",
        ("endpoint", "ep"),
        "a row per endpoint: address, health, cluster, locality, priority, weight",
    ),
    (
        "listeners",
        ("listener", "l"),
        "a row per filter chain: addresses, port, what it matches, where it sends",
    ),
    ("routes", ("route", "r"), "a row per route: configuration, virtual host, domains, path"),
    ("secrets", ("secret", "s"), "a row per certificate: SPIFFE SAN, serial, validity"),
)


def proxy_config_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    config = commands.add_parser(
        "proxy-config",
        help="one proxy's clusters, endpoints, listeners, routes or secrets (from CSDS)",
        description="What pilot sent one proxy, and its state (like istioctl proxy-config).",
    )
    kinds = config.add_subparsers(dest="kind_given", required=True, metavar="KIND")
    for kind, aliases, summary in _PROXY_CONFIG_KINDS:
        parser = kinds.add_parser(kind, aliases=aliases, help=summary, description=summary)
        parser.set_defaults(kind=kind)
        parser.add_argument("node_id", metavar="NODE_ID", help="the proxy's node id")
        parser.add_argument(
            "--identity",
            help="its SPIFFE URI, when several identities use the node id (see proxy-status)",
        )
        csds_flags(parser)


def proxy_config_command(args: argparse.Namespace) -> int:
    """Exit 1 when no such proxy is connected (or readable), 2 when pilot cannot be asked."""
    response = client_status(args, proxy_config.request_for(args.node_id))
    if response is None:
        return 2
    try:
        config = proxy_config.select(response, args.node_id, args.identity)
    except LookupError as error:
        print(f"pilot: error: {args.addr}: {error}", file=sys.stderr)
        return 1
    print(tables.formatted(proxy_config.TABLES[args.kind](config), args.output))
    return 0
