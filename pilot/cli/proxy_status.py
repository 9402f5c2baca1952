"""`pilot proxy-status`: a row per proxy connected to pilot, from its CSDS; and how both
proxy commands reach CSDS."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from envoy.service.status.v3 import csds_pb2

from pilot.cli.flags import Parser
from pilot.debug import proxy_status_table, tables
from pilot.logs import clipped


def csds_flags(parser: argparse.ArgumentParser) -> None:
    """How `proxy-status` and `proxy-config` reach pilot's CSDS, and what they print."""
    parser.add_argument(
        "--addr", default="localhost:15010", help="pilot's gRPC address (default %(default)s)"
    )
    parser.add_argument(
        "--root-cert",
        type=Path,
        help="talk TLS, verifying pilot with this PEM root (pilot's TLS port, e.g. :15012)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        help="present this service-account token (a Kubernetes-mode pilot wants one, over TLS)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=tables.FORMATS,
        default="table",
        help="table (default), or json or yaml: a list of objects keyed by the columns",
    )


def proxy_status_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    """`pilot proxy-status`'s flags."""
    status = commands.add_parser(
        "proxy-status",
        help="what each connected Envoy holds (from CSDS)",
        description="One row per connected proxy: CDS, LDS, EDS, RDS, SDS state (like istioctl).",
    )
    csds_flags(status)


def client_status(
    args: argparse.Namespace, request: csds_pb2.ClientStatusRequest | None = None
) -> csds_pb2.ClientStatusResponse | None:
    """CSDS from --addr as the access flags say; None once the error is printed."""
    address = args.addr
    try:
        access = proxy_status_table.Access.from_files(args.root_cert, args.token_file)
        return proxy_status_table.fetch(address, access, request=request)
    except OSError as error:
        print(f"pilot: error: {error}", file=sys.stderr)
    except grpc.RpcError as error:
        hint = proxy_status_table.hint(error.code())
        # The details are the server's words: escaped and cut short like a client's.
        details = clipped(error.details() or "", 1000)
        print(
            f"pilot: error: {address}: {error.code().name}: {details}{hint}",
            file=sys.stderr,
        )
    return None


def proxy_status_command(args: argparse.Namespace) -> int:
    response = client_status(args)
    if response is None:
        return 2
    print(tables.formatted(proxy_status_table.status_table(response), args.output))
    return 0
