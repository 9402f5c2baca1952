"""Large buffers freed by pilot go back to the system (`pilot.runtime.memory`).

In a fresh interpreter: a freed 8 MiB block (which makes glibc serve later 1 MiB
blocks from its heap), then 300 requests of 1 MiB held at once between small
blocks that live on, then the requests freed. With `map_large_buffers()` as
`pilot discovery` calls it, the process's RSS comes back to where it was; without
it glibc keeps part of them resident (the control, which shows the scenario bites).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = """
import sys
from pathlib import Path

def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmRSS")

if sys.argv[1] == "mapped":
    from pilot.runtime.memory import map_large_buffers
    assert map_large_buffers(), "mallopt refused"
block = bytearray(8 << 20)
del block
before = rss_mb()
small, requests = [], []
for i in range(300):
    requests.append(bytes(bytearray(1 << 20)))
    small.append(bytearray(2000 + i))
requests.clear()
print(rss_mb() - before)
"""


def _retained_mb(mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, mode],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return float(done.stdout)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_freed_large_buffers_leave_no_resident_memory() -> None:
    control = _retained_mb("default")
    if control < 4:
        pytest.skip(f"this C library gives large blocks back by itself ({control:.1f} MB kept)")
    assert _retained_mb("mapped") < 2, f"kept resident (glibc's default keeps {control:.1f} MB)"
