"""`pilot agent iptables`: istio-iptables' capture rules, set in the pod's network namespace.

Run once before the app starts (Istio's `istio-init` container), as root in the
pod's network namespace. The rules are Istio's REDIRECT mode, in its chains:

- inbound: PREROUTING -> ISTIO_INBOUND; the excluded ports (`-d`, default
  15090, 15021, 15020: Envoy's Prometheus and readiness listeners, the agent's
  status port) RETURN; every other port (`-b '*'`), or only the listed ones, goes
  to ISTIO_IN_REDIRECT, REDIRECT to `-z` (15006, Envoy's `virtualInbound`);
- outbound: OUTPUT -> ISTIO_OUTPUT; Envoy's own traffic (uid and gid `-u`/`-g`,
  1337) leaves uncaptured, except what it sends to the pod's own address over
  loopback (a call from the app to itself through Envoy, which goes inbound);
  Envoy's inbound passthrough source 127.0.0.6 and the app's own loopback
  traffic RETURN, as do excluded outbound ports (`-o`, first) and ranges (`-x`);
  then the included outbound ports (`-q`) and ranges (`-i`: `*` every address,
  the default; '' none) go to ISTIO_REDIRECT, REDIRECT to `-p` (15001, Envoy's
  `virtualOutbound`); anything left leaves uncaptured.

`-m` is the inbound interception mode: REDIRECT only. TPROXY is refused (these
rules would not be what it asks for: fail closed, never a weaker capture). Ranges
are CIDRs (`10.0.0.0/8`); pilot sets IPv4 rules only, so an IPv6 range to include
is refused, and one to exclude needs no rule (IPv6 is not captured at all).

The rules are one `iptables-restore --noflush` transaction on the nat table:
all of them are set or none. A namespace that already has ISTIO_ chains is left
alone and refused with a line saying so (running twice would capture twice);
`--cleanup` removes them. `--dry-run` prints the rules and changes nothing.
Nothing here reads anything but flags: ports are numbers in range, ranges are
CIDRs, at most MAX_ENTRIES of either per flag, all checked before any rule is
built (the injector writes them from a pod's annotations).
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from dataclasses import dataclass

CHAINS = ("ISTIO_INBOUND", "ISTIO_REDIRECT", "ISTIO_IN_REDIRECT", "ISTIO_OUTPUT")
# What the rules jump from, in the nat table: (built-in chain, rule), removed by --cleanup.
_HOOKS = (("PREROUTING", "ISTIO_INBOUND"), ("OUTPUT", "ISTIO_OUTPUT"))
INBOUND_PASSTHROUGH_SOURCE = "127.0.0.6/32"  # Envoy's source address toward the app
COMMAND_TIMEOUT = 30.0
MAX_ENTRIES = 256  # ports or ranges in one flag: each is a rule
INTERCEPTION_MODES = ("REDIRECT",)


class CaptureError(Exception):
    """The rules cannot be built or set; the message says what and where."""


@dataclass(frozen=True, slots=True)
class CaptureSettings:
    """istio-iptables' flags, with its defaults."""

    proxy_port: int = 15001  # -p
    inbound_capture_port: int = 15006  # -z
    proxy_uid: int = 1337  # -u
    proxy_gid: int = 1337  # -g
    inbound_ports: tuple[int, ...] | None = None  # -b: None is '*', every port
    exclude_inbound_ports: tuple[int, ...] = (15090, 15021, 15020)  # -d
    exclude_outbound_ports: tuple[int, ...] = ()  # -o
    include_outbound_ports: tuple[int, ...] = ()  # -q
    include_outbound_ranges: tuple[str, ...] | None = None  # -i: None is '*', every address
    exclude_outbound_ranges: tuple[str, ...] = ()  # -x


def parse_ports(flag: str, text: str, wildcard: bool = False) -> tuple[int, ...] | None:
    """`15090,15021`: each a port 1-65535; '' is none; '*' (where allowed) is None: all."""
    text = text.strip()
    if wildcard and text == "*":
        return None
    ports = []
    for word in _words(flag, text):
        if not word.isdigit() or not 0 < int(word) < 65536:
            raise CaptureError(f"{flag} {text[:64]!r}: {word[:16]!r} is not a port (1-65535)")
        ports.append(int(word))
    return tuple(dict.fromkeys(ports))


def parse_ranges(
    flag: str, text: str, wildcard: bool = False, ipv6: bool = True
) -> tuple[str, ...] | None:
    """`10.0.0.0/8,192.168.0.0/16`: IPv4 CIDRs; '' is none; '*' (where allowed) is None.

    IPv6 CIDRs are dropped where `ipv6` (nothing to exclude: IPv6 is not captured),
    refused otherwise.
    """
    text = text.strip()
    if wildcard and text == "*":
        return None
    ranges = []
    for word in _words(flag, text):
        try:
            network = ipaddress.ip_network(word, strict=False) if "/" in word else None
        except ValueError:
            network = None
        if network is None:
            raise CaptureError(f"{flag} {text[:64]!r}: {word[:48]!r} is not a CIDR (10.0.0.0/8)")
        if network.version == 6 and not ipv6:
            raise CaptureError(
                f"{flag} {text[:64]!r}: {word[:48]!r}: IPv6 ranges cannot be captured"
                " (pilot sets IPv4 rules only)"
            )
        if network.version == 4:
            ranges.append(str(network))
    return tuple(dict.fromkeys(ranges))


def check_mode(mode: str) -> str:
    """`-m`: REDIRECT; TPROXY and anything else refused (never a weaker capture)."""
    if mode == "TPROXY":
        raise CaptureError(
            "-m TPROXY: not supported; pilot sets REDIRECT rules only (use -m REDIRECT)"
        )
    if mode not in INTERCEPTION_MODES:
        raise CaptureError(f"-m {mode[:32]!r}: not an interception mode (REDIRECT)")
    return mode


def _words(flag: str, text: str) -> list[str]:
    """The comma-separated words of `text`, empty ones skipped, at most MAX_ENTRIES."""
    words = [word for word in (w.strip() for w in text.split(",")) if word]
    if len(words) > MAX_ENTRIES:
        raise CaptureError(f"{flag}: {len(words)} entries, at most {MAX_ENTRIES}")
    return words


def _check_id(flag: str, value: int) -> None:
    if not 0 <= value < 2**32 - 1:
        raise CaptureError(f"{flag} {value}: not a uid or gid")


def _inbound(settings: CaptureSettings) -> list[str]:
    rules = ["-A PREROUTING -p tcp -j ISTIO_INBOUND"]
    if settings.inbound_ports is None:
        rules += [
            f"-A ISTIO_INBOUND -p tcp --dport {port} -j RETURN"
            for port in settings.exclude_inbound_ports
        ]
        rules.append("-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT")
    else:
        rules += [
            f"-A ISTIO_INBOUND -p tcp --dport {port} -j ISTIO_IN_REDIRECT"
            for port in settings.inbound_ports
            if port not in settings.exclude_inbound_ports
        ]
    return rules


def _owner(match: str, value: int) -> list[str]:
    """Envoy's own traffic, by uid or gid: to itself over loopback goes inbound, else out."""
    return [
        f"-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -m owner --{match}-owner {value}"
        " -j ISTIO_IN_REDIRECT",
        f"-A ISTIO_OUTPUT -o lo -m owner ! --{match}-owner {value} -j RETURN",
        f"-A ISTIO_OUTPUT -m owner --{match}-owner {value} -j RETURN",
    ]


def _outbound(settings: CaptureSettings) -> list[str]:
    rules = ["-A OUTPUT -p tcp -j ISTIO_OUTPUT"]
    rules += [
        f"-A ISTIO_OUTPUT -p tcp --dport {port} -j RETURN"
        for port in settings.exclude_outbound_ports
    ]
    rules.append(f"-A ISTIO_OUTPUT -o lo -s {INBOUND_PASSTHROUGH_SOURCE} -j RETURN")
    rules += _owner("uid", settings.proxy_uid)
    rules += _owner("gid", settings.proxy_gid)
    rules.append("-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN")
    rules += [f"-A ISTIO_OUTPUT -d {cidr} -j RETURN" for cidr in settings.exclude_outbound_ranges]
    rules += [
        f"-A ISTIO_OUTPUT -p tcp --dport {port} -j ISTIO_REDIRECT"
        for port in settings.include_outbound_ports
    ]
    if settings.include_outbound_ranges is None:
        rules.append("-A ISTIO_OUTPUT -j ISTIO_REDIRECT")
    else:
        rules += [
            f"-A ISTIO_OUTPUT -d {cidr} -j ISTIO_REDIRECT"
            for cidr in settings.include_outbound_ranges
        ]
    return rules


def capture_rules(settings: CaptureSettings) -> str:
    """The nat table's rules as `iptables-restore` input (one transaction)."""
    for flag, value in (("-p", settings.proxy_port), ("-z", settings.inbound_capture_port)):
        if not 0 < value < 65536:
            raise CaptureError(f"{flag} {value}: not a port (1-65535)")
    _check_id("-u", settings.proxy_uid)
    _check_id("-g", settings.proxy_gid)
    lines = ["*nat", *(f"-N {chain}" for chain in CHAINS)]
    lines += [
        f"-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports {settings.proxy_port}",
        f"-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports {settings.inbound_capture_port}",
    ]
    lines += _inbound(settings) + _outbound(settings)
    return "\n".join([*lines, "COMMIT", ""])


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise CaptureError(f"{name} not found on PATH (Debian: apt-get install iptables)")
    return path


def _run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CaptureError(f"{command[0]}: {error}") from error


def _present_chains() -> list[str]:
    result = _run([_tool("iptables-save"), "-t", "nat"])
    if result.returncode != 0:
        raise CaptureError(f"iptables-save -t nat exited {result.returncode}: {_first(result)}")
    declared = {line[1:].split()[0] for line in result.stdout.splitlines() if line[:1] == ":"}
    return [chain for chain in CHAINS if chain in declared]


def _first(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[0][:300] if lines else "no output"


def apply(settings: CaptureSettings) -> str:
    """Set the rules in this network namespace; return them. Raises CaptureError."""
    rules = capture_rules(settings)
    present = _present_chains()
    if present:
        raise CaptureError(
            f"capture rules are already set in this network namespace (nat chain {present[0]}"
            " exists); remove them first with `pilot agent iptables --cleanup`"
        )
    result = _run([_tool("iptables-restore"), "--noflush"], stdin=rules)
    if result.returncode != 0:
        raise CaptureError(f"iptables-restore exited {result.returncode}: {_first(result)}")
    return rules


def cleanup() -> list[str]:
    """Remove the jumps into the ISTIO_ chains and the chains; return the chains removed."""
    iptables = _tool("iptables")
    present = _present_chains()
    for hook, chain in _HOOKS:
        if chain in present:
            _run([iptables, "-t", "nat", "-D", hook, "-p", "tcp", "-j", chain])
    for chain in present:
        _run([iptables, "-t", "nat", "-F", chain])
    for chain in present:
        result = _run([iptables, "-t", "nat", "-X", chain])
        if result.returncode != 0:
            raise CaptureError(f"iptables -t nat -X {chain}: {_first(result)}")
    return present
