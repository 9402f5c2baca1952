"""`python -m bench.registry_file`: a registry file at scale, loaded and reloaded.

For each format (`kubectl ... -o json`, then `-o yaml`), one `pilot discovery
--config FILE` subprocess on a file of N services (`bench.kubectl_files`):

1. start-up: seconds until pilot logged the file loaded (its own figure: from the
   read to the registry replaced);
2. once pilot is idle, a reload: one endpoint of one service changes (the file is
   rewritten whole, as `kubectl ... > file` does); seconds from the write until
   pilot logged it applied, pilot's own figure, and the slowest `/ready` answer
   meanwhile (probed every 10 ms by a process of its own: while the loop is busy,
   /ready waits).

Prints one row per format. Targets (issue 10): a 10,000-service JSON reload
applied in < 2 s, `/ready` (the loop's lag) under 100 ms during any reload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.kubectl_files import kubectl_list, pod_ip, render, write_whole
from bench.pilot_cli import SERVING, newer_flags, serving_ports
from bench.procs import PYTHON, Child, log_match, spawn, wait_idle
from tests.fuzz.ready import ReadyProber

LOADED = re.compile(r"^loaded .*: (\d+) services, (\d+) endpoint sets in ([0-9.]+) s$")
WAIT = 600.0  # seconds pilot may take to load a file (YAML at 10,000 services: ~20 s)


@dataclass(frozen=True)
class Figures:
    output: str
    megabytes: float
    services: int
    startup: float  # pilot's own figure for the first load
    reload_wall: float  # from the write to the log line
    reload_pilot: float  # pilot's own figure for the reload
    worst_ready: float  # seconds, during the reload


class PilotLog:
    """pilot's JSON log lines, read from its log file as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = 0

    async def next_loaded(self, child: Child) -> tuple[float, re.Match[str]]:
        """When pilot logged its next 'loaded' line, and the line."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            lines = self.path.read_text(errors="replace").splitlines()
            for line in lines[self._seen :]:
                self._seen += 1
                message = _message(line)
                if match := LOADED.match(message):
                    return time.monotonic(), match
                if "keeping the last good registry" in message:
                    raise RuntimeError(f"pilot refused the file: {message}")
            if not child.running:
                raise RuntimeError(f"pilot exited:\n{child.log_tail()}")
            await asyncio.sleep(0.01)  # polling pilot's log file, with a deadline
        raise RuntimeError(f"pilot logged no 'loaded' line within {WAIT:g}s")


def _message(line: str) -> str:
    try:
        return str(json.loads(line).get("msg", ""))
    except ValueError:
        return ""


async def measure(output: str, services: int, endpoints: int, workdir: Path) -> Figures:
    document = kubectl_list(services, endpoints)
    path = workdir / f"mesh.{output}"
    text = render(document, output)
    write_whole(path, text)
    log = PilotLog(workdir / f"pilot-{output}.log")
    argv = [PYTHON, "-m", "pilot", "discovery", "--config", str(path), "--log-format", "json"]
    argv += ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]
    argv += newer_flags(workdir / output)
    child = await spawn(f"pilot-{output}", argv, log.path)
    prober: ReadyProber | None = None
    try:
        _, first = await log.next_loaded(child)
        async with asyncio.timeout(WAIT):  # pilot says it serves right after the first load
            _, http_port = serving_ports(await log_match(child, SERVING))
        prober = ReadyProber(http_port)
        await prober.start()
        await wait_idle([child.pid], window=0.2, limit=60)  # the start-up push is over
        changed = text.replace(pod_ip(services // 2, 0), pod_ip(services + 1, 0), 1)
        prober.reset()
        written = time.monotonic()
        write_whole(path, changed)
        applied, reload = await log.next_loaded(child)
        await prober.window(written)
        worst = prober.worst
        return Figures(
            output,
            len(text.encode()) / 1e6,
            int(first[1]),
            float(first[3]),
            applied - written,
            float(reload[3]),
            worst.latency if worst is not None else float("nan"),
        )
    finally:
        if prober is not None:
            await prober.stop()
        await child.stop()


def render_table(rows: list[Figures]) -> str:
    lines = [
        "| file | size | services | start-up load | reload (write to applied) "
        "| reload (pilot) | slowest /ready during the reload |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `-o {r.output}` | {r.megabytes:.1f} MB | {r.services:,} | {r.startup:.2f} s "
            f"| {r.reload_wall:.2f} s | {r.reload_pilot:.2f} s | {r.worst_ready * 1000:.0f} ms |"
        )
    return "\n".join(lines)


async def run(services: int, endpoints: int, outputs: list[str]) -> list[Figures]:
    with tempfile.TemporaryDirectory(prefix="pilot-registry-file-") as folder:
        rows = []
        for output in outputs:
            print(f"[bench.registry_file] -o {output}: {services:,} services", file=sys.stderr)
            rows.append(await measure(output, services, endpoints, Path(folder)))
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.registry_file", description=__doc__)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=3, help="Pods per service (3)")
    parser.add_argument("--output", choices=["json", "yaml"], action="append")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.services, args.endpoints, args.output or ["json", "yaml"]))
    print(render_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
