"""What the bench needs to know of pilot's command line: newer flags, and the knobs in force.

The bench does not import pilot (that takes seconds, and the pilot it runs may
be another copy, through PYTHONPATH). Newer pilots want `--xds-auth none`
(the clients carry no service-account token), `--ca-state-dir` and
`--grpc-tls-addr ''` (the default 0.0.0.0:15012 may be taken); an
older pilot refuses them as unrecognized, and is started again without.
`pilot discovery --help` names each PILOT_* knob with its default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_KNOB = re.compile(r"^\s+(PILOT_[A-Z_]+)\s.*\(default ([^),]+)")
UNRECOGNIZED = "unrecognized arguments"


def newer_flags(workdir: Path) -> list[str]:
    """Unauthenticated xDS, a CA state directory of the run's own, no fixed TLS port."""
    return ["--xds-auth", "none", "--ca-state-dir", str(workdir / "ca"), "--grpc-tls-addr", ""]


def knobs(usage: str, env: Mapping[str, str]) -> dict[str, str]:
    """Each PILOT_* knob the usage text lists: its value in env, else its default."""
    found = {}
    for line in usage.splitlines():
        match = _KNOB.match(line)
        if match:
            name, default = match.groups()
            found[name] = env.get(name, default.strip())
    return found


def describe(knob_values: Mapping[str, str], flags: list[str]) -> str:
    shown = " ".join(f"{name}={value}" for name, value in knob_values.items())
    return f"{shown}; flags: {' '.join(flags)}"
