"""The `pilot` command line: one module per command (discovery, agent, proxy-status,
proxy-config), the flags they share, and the discovery settings assembled from flags."""

from pilot.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
