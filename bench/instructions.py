"""`python -m bench.instructions`: `bench.arrival_path`'s burst, counted in instructions.

CPU time on a shared 2-core machine moves by a fifth from one run to the next,
so a change that saves 2% of a proxy's arrival cannot be seen in it, however
many runs. The instructions each thread executes hardly move: the same burst
counted twice agrees to about 0.1%. This runs `bench.arrival_path` (a real
`Discovery` in process, N delta ADS streams asking for `default` at once)
under valgrind's callgrind, counting only from the first stream's start to
the last certificate written, and prints instructions per proxy: the event
loop's thread (gRPC's part aside, pilot's own work on the loop), the other
threads (the minting thread: the crypto), and all of them.

Valgrind runs the process about fifty times slower, and one thread at a time:
the counts say how much work there is, not how long it takes or how the
threads contend. Compare two trees by running each from its own directory
(`python -m` puts the current directory first on `sys.path`). Needs valgrind
(Debian: `apt-get install valgrind`). `--storm S` counts the reconnect storm's
streams instead (`bench.arrival_path --storm`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import arrival_path

VALGRIND = "valgrind"
CONTROL = "callgrind_control"


@dataclass(frozen=True)
class Counts:
    """Instructions per proxy over the burst."""

    proxies: int
    loop: float
    others: float
    storm: int = 0  # services of the storm's streams; 0: proxies asking for certificates

    @property
    def total(self) -> float:
        return self.loop + self.others

    def render(self) -> str:
        return (
            f"{arrival_path.arrivals(self.proxies, self.storm)}, instructions per proxy:"
            f" the loop's thread {self.loop:,.0f}, the other threads {self.others:,.0f},"
            f" all {self.total:,.0f}"
        )


def _switch(on: bool) -> None:
    """In the counted process: count from here (True), or no more (False)."""
    switched = subprocess.run(
        [CONTROL, "--instr", "on" if on else "off", str(os.getpid())],
        capture_output=True,
        text=True,
        check=False,
    )
    if switched.returncode:
        raise RuntimeError(f"{CONTROL} failed: {switched.stderr or switched.stdout}")


def _counted(proxies: int, storm: int) -> None:
    """The child, under callgrind: the burst, with counting switched on around it."""
    arrival_path.run(proxies, _switch, storm)


def _thread_totals(folder: Path) -> dict[int, int]:
    """Instructions per thread (1: the main thread, the event loop's) from callgrind's
    files, one per thread (`--separate-threads`)."""
    totals: dict[int, int] = {}
    for path in folder.glob("callgrind.*"):
        thread = int(path.name.rsplit("-", 1)[1]) if "-" in path.name else 1
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                totals[thread] = totals.get(thread, 0) + int(line.split()[1])
    return totals


def count(proxies: int, storm: int = 0) -> Counts:
    """Run the burst under callgrind; its counts per proxy."""
    if shutil.which(VALGRIND) is None or shutil.which(CONTROL) is None:
        raise SystemExit("bench.instructions needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="pilot-instructions-") as folder:
        argv = [VALGRIND, "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"]
        argv += [f"--callgrind-out-file={folder}/callgrind.%p", "-q"]
        argv += [sys.executable, "-m", "bench.instructions", "--counted", str(proxies)]
        argv += ["--storm", str(storm)]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        totals = _thread_totals(Path(folder))
    if not totals.get(1):
        raise RuntimeError("callgrind counted nothing on the event loop's thread")
    others = sum(n for thread, n in totals.items() if thread != 1)
    return Counts(proxies, totals[1] / proxies, others / proxies, storm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--proxies", type=int, default=1000, help="(1000)")
    arrival_path.add_storm_flag(parser)
    parser.add_argument("--counted", type=int, help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args(argv)
    if args.counted is not None:
        _counted(args.counted, args.storm)
        return 0
    if args.proxies < 1 or args.storm < 0:
        parser.error("--proxies must be at least 1, --storm at least 0")
    print(count(args.proxies, args.storm).render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
