"""`pilot agent`: its flags and steps (the SDS agent, `proxy`, `bootstrap`, `wait`, `iptables`).

`pilot agent ... proxy sidecar` is what an injected `istio-proxy` container runs
(Istio's `pilot-agent proxy sidecar`): SDS, the bootstrap and Envoy, found on PATH
unless --binary-path names one, at Istio's absolute paths unless flags say
otherwise (the other steps keep their paths relative to the working directory).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pilot.agent import iptables as agent_iptables
from pilot.agent.envoy import (
    DEFAULT_CONFIG_PATH,
    SIDECAR_CONFIG_PATH,
    EnvoySettings,
    find_envoy,
)
from pilot.agent.iptables import CaptureSettings
from pilot.agent.sds_agent import (
    DEFAULT_DISCOVERY_ADDRESS,
    DEFAULT_ROOT_CERT,
    DEFAULT_SOCKET,
    SIDECAR_ROOT_CERT,
    SIDECAR_SOCKET,
    Agent,
    AgentSettings,
    agent_settings,
)
from pilot.agent.status_port import DEFAULT_STATUS_PORT
from pilot.agent.wait import READY_URL, WaitSettings, wait_until_ready
from pilot.cli.flags import Parser, key_type_flag, log_flags, version_flag
from pilot.cli.running import run_until_signalled
from pilot.runtime import event_loop
from pilot.security.certs import KeyType
from pilot.security.identity import check_trust_domain
from pilot.security.settings import SecuritySettingsError

log = logging.getLogger("pilot")
DEFAULT_TRUST_DOMAIN = "cluster.local"

_AGENT_EPILOG = f"""\
environment:
  POD_NAMESPACE, SERVICE_ACCOUNT  the workload identity (required)
  TRUST_DOMAIN               its SPIFFE trust domain, unless --trust-domain
  CA_TOKEN_FILE              service-account token presented to the CA
  CA_ADDR                    the CA (default: --discovery-address)
  CA_ROOT_CERT               the root that verifies the CA and every chain, served to
                             Envoy as ROOTCA (default ./{DEFAULT_ROOT_CERT})
  CA_INSECURE                true: plaintext to the CA (chains are still verified)
  SECRET_TTL, SECRET_GRACE_PERIOD_RATIO  lifetime and rotation point
  POD_NAME, INSTANCE_IP      with --binary-path or `bootstrap`: the pod, in Envoy's node id
  ISTIO_META_INTERCEPTION_MODE  REDIRECT (default: traffic captured) or NONE
"""


def agent_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    agent = commands.add_parser(
        "agent",
        help="serve SDS next to Envoy on a Unix socket (keys never leave the node)",
        description="Mint this pod's workload certificates and serve them to Envoy over SDS.",
        epilog=_AGENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    version_flag(agent)
    agent.add_argument(
        "--sds-socket",
        type=Path,
        help=f"the Unix socket Envoy reads its certificates from (default {DEFAULT_SOCKET};"
        f" with `proxy`: {SIDECAR_SOCKET}); in a directory others can write (an emptyDir)"
        " it goes into a 0700 directory `agent` of its own there",
    )
    agent.add_argument(
        "--discovery-address",
        default=DEFAULT_DISCOVERY_ADDRESS,
        help="pilot's TLS gRPC address, the default CA_ADDR (default %(default)s)",
    )
    agent.add_argument(
        "--trust-domain",
        help="SPIFFE trust domain of the workload's identity (default $TRUST_DOMAIN, as the"
        " injector sets it, else cluster.local)",
    )
    key_type_flag(agent)
    _sidecar_flags(agent)
    log_flags(agent)
    steps = agent.add_subparsers(dest="agent_step", metavar="STEP")
    steps.add_parser(
        "bootstrap",
        help="print the sidecar's Envoy bootstrap (JSON) and exit",
        description="Print the bootstrap --binary-path would start Envoy with.",
    )
    _proxy_parser(steps)
    _wait_parser(steps)
    _iptables_parser(steps)


def _proxy_parser(steps: argparse._SubParsersAction[Parser]) -> None:
    """Istio's `pilot-agent proxy sidecar`: the injected container's command."""
    proxy = steps.add_parser(
        "proxy",
        help="run the sidecar: SDS, the bootstrap, and Envoy (from PATH unless --binary-path)",
        description="Serve SDS, write Envoy's bootstrap and run Envoy until SIGTERM (exit 0)."
        f" Paths default to Istio's: the socket {SIDECAR_SOCKET}, the bootstrap under"
        f" {SIDECAR_CONFIG_PATH}, the root {SIDECAR_ROOT_CERT} (or CA_ROOT_CERT).",
    )
    proxy.add_argument(
        "kind",
        nargs="?",
        choices=["sidecar"],
        default="sidecar",
        help="the proxy's kind: sidecar (the only one; the default)",
    )


def _wait_parser(steps: argparse._SubParsersAction[Parser]) -> None:
    """Istio's `pilot-agent wait` (its camelCase flags, and kebab-case ones)."""
    wait = steps.add_parser(
        "wait",
        help="wait until Envoy is ready (the classic sidecar's postStart hook)",
        description=f"Poll {READY_URL} until it answers 200 (exit 0) or the time is up (exit 1).",
    )
    wait.add_argument("--timeout-seconds", "--timeoutSeconds", dest="timeout_seconds",
                      type=_positive_int, default=60,
                      help="give up after this many seconds (default %(default)s)")  # fmt: skip
    wait.add_argument("--period-millis", "--periodMillis", dest="period_millis",
                      type=_positive_int, default=500,
                      help="milliseconds between attempts (default %(default)s)")  # fmt: skip
    wait.add_argument("--request-timeout-millis", "--requestTimeoutMillis",
                      dest="request_timeout_millis", type=_positive_int, default=1000,
                      help="milliseconds each attempt may take (default %(default)s)")  # fmt: skip


def _positive_int(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 86400_000:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: expected a positive whole number")
    return int(text)


def _sidecar_flags(agent: argparse.ArgumentParser) -> None:
    """`pilot agent` bringing Envoy up (Istio's ProxyConfig names: binaryPath, configPath)."""
    group = agent.add_argument_group("sidecar (Envoy started by the agent)")
    group.add_argument(
        "--binary-path",
        type=Path,
        help="start this Envoy once SDS serves, with the bootstrap written to --config-path"
        " (with `proxy`: default `envoy` on PATH)",
    )
    group.add_argument(
        "--config-path",
        type=Path,
        help=f"where envoy-rev.json is written (default {DEFAULT_CONFIG_PATH};"
        f" with `proxy`: {SIDECAR_CONFIG_PATH})",
    )
    group.add_argument(
        "--cluster-domain",
        default="cluster.local",
        help="the DNS suffix in the sidecar's node id (default %(default)s)",
    )
    group.add_argument(
        "--proxy-log-level", default="warning", help="Envoy's log level (default %(default)s)"
    )
    group.add_argument("--concurrency", type=int, default=2, help="Envoy's worker threads")
    group.add_argument(
        "--status-port",
        type=_port_or_zero,
        default=DEFAULT_STATUS_PORT,
        help="the agent's status port, /healthz/ready on 0.0.0.0 (Istio's statusPort; default"
        " %(default)s; 0: none, and 15020 is then left to whatever binds it)",
    )


def _port_or_zero(text: str) -> int:
    """A port number 1-65535, or 0."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: expected a port number 1-65535, or 0")
    return int(text)


def _iptables_parser(steps: argparse._SubParsersAction[Parser]) -> None:
    """istio-iptables' flags and defaults."""
    defaults = CaptureSettings()
    rules = steps.add_parser(
        "iptables",
        help="set the capture rules in this network namespace (as root, before the app)",
        description="Redirect the pod's TCP to Envoy, as istio-iptables (REDIRECT mode).",
    )
    rules.add_argument("-p", dest="proxy_port", type=int, default=defaults.proxy_port,
                       help="outbound capture port (default %(default)s)")  # fmt: skip
    rules.add_argument("-z", dest="inbound_port", type=int,
                       default=defaults.inbound_capture_port,
                       help="inbound capture port (default %(default)s)")  # fmt: skip
    rules.add_argument("-u", dest="proxy_uid", type=int, default=defaults.proxy_uid,
                       help="Envoy's uid, never captured (default %(default)s)")  # fmt: skip
    rules.add_argument("-g", dest="proxy_gid", type=int, default=None,
                       help="Envoy's gid (default: -u)")  # fmt: skip
    rules.add_argument("-b", dest="inbound_ports", default="*",
                       help="inbound ports to capture, or '*' (default)")  # fmt: skip
    rules.add_argument("-d", dest="exclude_inbound", default="15090,15021,15020",
                       help="inbound ports never captured (default %(default)s)")  # fmt: skip
    rules.add_argument("-o", dest="exclude_outbound", default="",
                       help="outbound ports never captured (default none)")  # fmt: skip
    rules.add_argument("-q", dest="include_outbound", default="",
                       help="outbound ports captured whatever -i says (default none)")  # fmt: skip
    rules.add_argument("-i", dest="include_ranges", default="*",
                       help="outbound IPv4 CIDRs captured: '*' (default), '' (none)")  # fmt: skip
    rules.add_argument("-x", dest="exclude_ranges", default="",
                       help="outbound CIDRs never captured (default none)")  # fmt: skip
    rules.add_argument("-m", dest="mode", default="REDIRECT",
                       help="inbound interception mode: REDIRECT (the default and only one;"
                       " TPROXY is refused)")  # fmt: skip
    action = rules.add_mutually_exclusive_group()
    action.add_argument("--dry-run", action="store_true", help="print the rules, change nothing")
    action.add_argument("--cleanup", action="store_true", help="remove the rules")


async def _run_agent(settings: AgentSettings) -> int:
    agent = Agent(settings)
    await run_until_signalled(agent, lambda: "while starting")
    return agent.exit_status


def _envoy(args: argparse.Namespace) -> EnvoySettings | None:
    """The Envoy to start: `proxy` always (found on PATH unless named), else --binary-path."""
    proxy = args.agent_step == "proxy"
    if not proxy and (args.binary_path is None or args.agent_step is not None):
        return None
    binary = find_envoy(args.binary_path) if proxy else args.binary_path
    config_path = args.config_path or (SIDECAR_CONFIG_PATH if proxy else DEFAULT_CONFIG_PATH)
    return EnvoySettings(binary, config_path, args.proxy_log_level, args.concurrency)


def agent_command(args: argparse.Namespace) -> int:
    """`pilot agent` and its steps (proxy, bootstrap, wait, iptables)."""
    if args.agent_step == "iptables":
        return _iptables(args)
    if args.agent_step == "wait":
        return _wait(args)
    proxy = args.agent_step == "proxy"
    settings = agent_settings(
        args.sds_socket or (SIDECAR_SOCKET if proxy else DEFAULT_SOCKET),
        args.discovery_address,
        _trust_domain(args.trust_domain, os.environ),
        KeyType(args.key_type),
        envoy=_envoy(args),
        sidecar=args.agent_step == "bootstrap",
        cluster_domain=args.cluster_domain,
        status_port=args.status_port,
        default_root=SIDECAR_ROOT_CERT if proxy else DEFAULT_ROOT_CERT,
    )
    if args.agent_step == "bootstrap":
        print(json.dumps(settings.bootstrap(), indent=2))
        return 0
    return event_loop.run(_run_agent(settings))


def _trust_domain(flag: str | None, env: Mapping[str, str]) -> str:
    """--trust-domain, else TRUST_DOMAIN (Istio's agent reads it; the injector sets it)."""
    if flag:
        return flag
    value = env.get("TRUST_DOMAIN", "").strip()
    if not value:
        return DEFAULT_TRUST_DOMAIN
    try:
        return check_trust_domain(value)
    except ValueError as error:
        raise SecuritySettingsError(f"TRUST_DOMAIN: {error}") from None


def _wait(args: argparse.Namespace) -> int:
    settings = WaitSettings(
        timeout=args.timeout_seconds,
        period=args.period_millis / 1000,
        request_timeout=args.request_timeout_millis / 1000,
        port=args.status_port or DEFAULT_STATUS_PORT,
    )
    ready, last = wait_until_ready(settings)
    if ready:
        log.info("Envoy is ready")
        return 0
    print(
        f"pilot: error: Envoy was not ready within {args.timeout_seconds}s"
        f" (last answer from http://localhost:{settings.port}/healthz/ready: {last})",
        file=sys.stderr,
    )
    return 1


def _iptables(args: argparse.Namespace) -> int:
    if args.cleanup:
        removed = agent_iptables.cleanup()
        log.info("removed capture chains: %s", ", ".join(removed) or "none were set")
        return 0
    agent_iptables.check_mode(args.mode)
    settings = CaptureSettings(
        proxy_port=args.proxy_port,
        inbound_capture_port=args.inbound_port,
        proxy_uid=args.proxy_uid,
        proxy_gid=args.proxy_uid if args.proxy_gid is None else args.proxy_gid,
        inbound_ports=agent_iptables.parse_ports("-b", args.inbound_ports, wildcard=True),
        exclude_inbound_ports=agent_iptables.parse_ports("-d", args.exclude_inbound) or (),
        exclude_outbound_ports=agent_iptables.parse_ports("-o", args.exclude_outbound) or (),
        include_outbound_ports=agent_iptables.parse_ports("-q", args.include_outbound) or (),
        include_outbound_ranges=agent_iptables.parse_ranges(
            "-i", args.include_ranges, wildcard=True, ipv6=False
        ),
        exclude_outbound_ranges=agent_iptables.parse_ranges("-x", args.exclude_ranges) or (),
    )
    if args.dry_run:
        print(agent_iptables.capture_rules(settings), end="")
        return 0
    agent_iptables.apply(settings)
    log.info(
        "capture rules set: outbound to %d, inbound to %d, uid %d exempt",
        settings.proxy_port,
        settings.inbound_capture_port,
        settings.proxy_uid,
    )
    return 0
