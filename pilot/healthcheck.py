"""The container's HEALTHCHECK: is the `pilot discovery` of this container ready?

    python -m pilot.healthcheck [PID]

A HEALTHCHECK command is fixed in the image, but `--http-addr` is whatever the
container was started with, so this reads the command line of the container's
main process (PID 1, the image's entrypoint) and asks `/ready` where that
`--http-addr` points (a wildcard host is asked on loopback). Exit 0 when it
answers 200; 1 otherwise (503 before the first full state, a refused
connection, no such process), with one line saying why. Only the standard
library is imported: it runs every few seconds.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

DEFAULT_HTTP_ADDR = "0.0.0.0:15014"  # pilot discovery's --http-addr default
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
TIMEOUT = 3.0


def http_addr(argv: Sequence[str]) -> str:
    """The value of the last `--http-addr` in a command line (as argparse takes it)."""
    found = DEFAULT_HTTP_ADDR
    for position, arg in enumerate(argv):
        if arg == "--http-addr" and position + 1 < len(argv):
            found = argv[position + 1]
        elif arg.startswith("--http-addr="):
            found = arg.partition("=")[2]
    return found


def ready_url(address: str) -> str:
    """`/ready` at `HOST:PORT`, a wildcard host replaced by loopback."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    host = _WILDCARDS.get(host, host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/ready"


def command_line(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    pid = int(args[0]) if args else 1
    try:
        url = ready_url(http_addr(command_line(pid)))
    except OSError as error:
        print(f"unhealthy: cannot read process {pid}'s command line: {error}")
        return 1
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as reply:
            status = reply.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:
        print(f"unhealthy: {url}: {error}")
        return 1
    if status != 200:
        print(f"unhealthy: {url}: HTTP {status}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
