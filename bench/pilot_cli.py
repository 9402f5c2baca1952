"""What the bench needs to know of pilot's command line: newer flags, and the knobs in force.

The bench does not import pilot (that takes seconds, and the pilot it runs may
be another copy, through PYTHONPATH). Newer pilots want `--xds-auth none`
(the clients carry no service-account token), `--ca-state-dir` and
`--grpc-tls-addr ''` and `--webhook-addr ''` (the defaults 0.0.0.0:15012 and
127.0.0.1:15017 may be taken); an
older pilot refuses them as unrecognized, and is started again without.
`pilot discovery --help` names each PILOT_* knob with its default.

pilot binds the ports it is given, 0 included, and says which it bound in the line
it logs once serving (`serving_ports` reads them), so the bench never picks a
port for it that something else may take first. That line is logged at info by
the logger `pilot`, which `log_level` keeps at info whatever level is asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_KNOB = re.compile(r"^\s+(PILOT_[A-Z_]+)\s.*\(default ([^),]+)")
UNRECOGNIZED = "unrecognized arguments"
# "pilot discovery serving xDS on ADDR (port P, TLS port T), HTTP on HOST:PORT"; older
# pilots, without a TLS port, leave that part out.
SERVING = re.compile(r"serving xDS on \S+ \(port (\d+)(?:, TLS port \d+)?\), HTTP on \S+:(\d+)")
# The scopes below `pilot` that `--log-level` names (its help lists them): they keep the
# level asked for when `pilot` itself is kept at info. `--log-level` takes scope names,
# not logger names: it refuses `pilot.xds:warning`, and pilot would not start.
_COMPONENT_SCOPES = (
    "xds",
    "push",
    "file",
    "kubernetes",
    "security",
    "agent",
    "limits",
    "supervisor",
)


def newer_flags(workdir: Path) -> list[str]:
    """Unauthenticated xDS, a CA state directory of the run's own, no fixed TLS port, no
    injection webhook."""
    return [
        *("--xds-auth", "none", "--ca-state-dir", str(workdir / "ca")),
        *("--grpc-tls-addr", "", "--webhook-addr", ""),
    ]


def serving_ports(serving: re.Match[str]) -> tuple[int, int]:
    """The xDS (plaintext gRPC) and HTTP ports of a `SERVING` line."""
    return int(serving[1]), int(serving[2])


def log_level(spec: str) -> str:
    """`--log-level spec`, but with pilot's "serving" line (logger `pilot`, info) kept.

    Above info, `pilot` is set to info and its components to the default level of
    `spec`; the scopes `spec` names keep their own levels (they come last).
    """
    default, scoped = "info", []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        scope, _, level = part.rpartition(":")
        if scope in ("", "default"):
            default = level
        else:
            scoped.append(part)
    if default.lower() in ("debug", "info"):
        return spec
    components = [f"{name}:{default}" for name in _COMPONENT_SCOPES]
    return ",".join([default, "pilot:info", *components, *scoped])


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
