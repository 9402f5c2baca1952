"""The `pilot` command line: `pilot discovery` runs the control plane."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc
from envoy.service.status.v3 import csds_pb2

from pilot import cluster_ids
from pilot.agent import iptables as agent_iptables
from pilot.agent.bootstrap import BootstrapError
from pilot.agent.envoy import DEFAULT_CONFIG_PATH, EnvoySettings
from pilot.agent.iptables import CaptureError, CaptureSettings
from pilot.agent.sds_agent import (
    DEFAULT_DISCOVERY_ADDRESS,
    DEFAULT_ROOT_CERT,
    DEFAULT_SOCKET,
    Agent,
    AgentSettings,
    agent_settings,
)
from pilot.agent.status_port import DEFAULT_STATUS_PORT
from pilot.builders.settings import BuildSettings
from pilot.cluster_ids import is_cluster_id, quoted
from pilot.debug import proxy_config, proxy_status_table, tables
from pilot.durations import parse_duration
from pilot.kube.config import (
    EndpointsApi,
    KubernetesSettings,
    KubernetesUnavailable,
)
from pilot.limits import LimitSettingError, limits_from_env
from pilot.listen_check import check_address_forms, check_listen_addresses
from pilot.logs import SCOPES, LogSpecError, clipped
from pilot.logs import configure as configure_logging
from pilot.registry.model import DEFAULT_CLUSTER_ID
from pilot.runtime import event_loop
from pilot.runtime.event_loop import EventLoopError
from pilot.runtime.memory import map_large_buffers
from pilot.security.ca import CaSettings, CaSetupError, default_state_dir
from pilot.security.certs import KeyType
from pilot.security.settings import SecuritySettings, SecuritySettingsError, security_from_env
from pilot.security.xds_auth import XdsAuth
from pilot.settings import (
    Settings,
    SettingsError,
    csds_trusted_accounts_from_env,
    debounce_from_env,
    informer_from_env,
    is_loopback_host,
    outbound_from_env,
    push_from_env,
    remote_from_env,
    remote_kubeconfigs,
    split_host_port,
)

log = logging.getLogger("pilot")

_DISCOVERY_EPILOG = """\
environment:
  PILOT_DEBOUNCE_AFTER       quiet period before a push (default 100ms)
  PILOT_DEBOUNCE_MAX         longest a change waits for a push (default 10s)
  PILOT_ENABLE_EDS_DEBOUNCE  debounce endpoint-only changes too (default true)
  PILOT_PUSH_THROTTLE        responses built and written at once (default 100)
  PILOT_XDS_SEND_TIMEOUT     close a stream whose Envoy stops reading (default 10s, 0: never)
  PILOT_MAX_LOCALITIES       proxy localities served endpoints in priorities (default 100)
  PILOT_MAX_UNVERIFIED_LOCALITIES  the same for streams that proved no identity, a
                             budget of their own (default 10)
  PILOT_OUTBOUND_TRAFFIC_POLICY  where sidecars send traffic to unknown hosts: ALLOW_ANY
                             (PassthroughCluster) or REGISTRY_ONLY (BlackHoleCluster)
                             (default ALLOW_ANY)
  PILOT_EVENT_LOOP           asyncio or uvloop (pip install 'pilot[uvloop]') (default asyncio)
  CA_ADDR                    the CA that signs workload certificates (default: pilot's own)
  CA_ROOT_CERT               with CA_ADDR: the root its chains must lead to (required)
  CA_INSECURE                with CA_ADDR: plaintext instead of TLS verified with CA_ROOT_CERT
  CA_TOKEN_FILE              token pilot presents to CA_ADDR
  CA_TRUSTED_NODE_ACCOUNTS   ns/sa,... allowed to ask pilot's CA for another identity
  SECRET_TTL                 workload certificate lifetime (default 24h)
  SECRET_GRACE_PERIOD_RATIO  rotate when this share of the lifetime is left (default 0.5)
  POD_NAMESPACE, SERVICE_ACCOUNT  pilot's own identity (no impersonation needed for it)
  PILOT_CSDS_TRUSTED_ACCOUNTS  ns/sa,... that read every proxy over CSDS (others: their
                             own namespace; accounts of POD_NAMESPACE: every proxy)
limits (refusals are RESOURCE_EXHAUSTED, counted in pilot_limit_hits_total{limit}):
  PILOT_MAX_RESOURCE_NAMES   names one stream subscribes to, per type (default 10000)
  PILOT_MAX_STREAMS          xDS streams in all (default 20000)
  PILOT_MAX_STREAMS_PER_CONNECTION  streams on one HTTP/2 connection (default 1000)
  PILOT_MAX_REQUEST_BYTES    one request message (default 1048576)
  PILOT_MAX_NODE_BYTES       a stream's node, with its metadata (default 65536)
  PILOT_MAX_REQUESTS_PER_SECOND  new streams and calls per second (default 1000, 0: off)
  PILOT_MAX_CERTIFICATES_PER_IDENTITY  live workload keys of one identity (default 1000)
  PILOT_MAX_CERTIFICATES     live workload keys in all (default 50000)
  PILOT_MAX_PENDING_CSRS     CreateCertificate calls answered at once (default 1000)
  PILOT_TOKEN_CACHE_SIZE     TokenReview answers remembered (default 10000)
  PILOT_MAX_REMOTE_CLUSTERS  remote clusters watched at once (default 100)
  PILOT_MAX_REMOTE_KUBECONFIG_BYTES  one remote kubeconfig (default 65536)
  PILOT_MAX_REMOTE_SECRET_BYTES  one multi-cluster Secret's data (default 1048576)
  PILOT_REMOTE_CLUSTER_START_TIMEOUT  building one remote cluster's client (default 10s)
  PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS  remote kubeconfig options allowed
                             (exec,authProvider,tokenFile,clientCertificate,clientKey,
                             certificateAuthority; default none)
"""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: what is wrong, and where the flags are
    listed (the usage of `pilot discovery` alone is twenty lines that hide the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# gRPC keeps durations in 32-bit milliseconds: a longer one overflows it.
MAX_FLAG_DURATION = "24d"


def _duration(text: str) -> float:
    """A duration flag's value: 0 or more, at most MAX_FLAG_DURATION."""
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if seconds > parse_duration(MAX_FLAG_DURATION):
        raise argparse.ArgumentTypeError(f"{text!r} is too long (at most {MAX_FLAG_DURATION})")
    return seconds


_DURATION_FLAGS = ("--drain-duration", "--max-connection-age")
_NEGATIVE = re.compile(r"-[\d.]")


def _negative_durations_joined(argv: Sequence[str]) -> list[str]:
    """`--drain-duration -5m` as `--drain-duration=-5m`: argparse takes `-5m` for a flag and
    says "expected one argument", where the duration's own check says what is wrong."""
    joined = list(argv)
    for index in range(len(joined) - 1, 0, -1):  # backwards: a join shifts what follows
        flag, value = joined[index - 1], joined[index]
        if flag in _DURATION_FLAGS and _NEGATIVE.match(value):
            joined[index - 1 : index + 1] = [f"{flag}={value}"]
    return joined


def version() -> str:
    """pilot's version, as its installed package's metadata says."""
    try:
        return importlib.metadata.version("pilot")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout never installed
        return "unknown"


def _version_flag(parser: argparse.ArgumentParser) -> None:
    """`--version`: `pilot X.Y.Z` on stdout, exit status 0 (the flag Envoy and kubectl have)."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"pilot {version()}",
        help="print pilot's version and exit",
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pilot", description="An asyncio xDS control plane for Envoy.")
    _version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    discovery = commands.add_parser(
        "discovery",
        help="run the control plane (ADS, CDS, EDS)",
        description="Serve clusters and endpoints to Envoy over xDS (SotW and delta).",
        epilog=_DISCOVERY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _version_flag(discovery)
    discovery.add_argument(
        "--grpc-addr",
        help="xDS, gRPC health and reflection (default 0.0.0.0:15010; with --xds-auth none,"
        " 127.0.0.1:15010)",
    )
    discovery.add_argument(
        "--http-addr",
        help="/ready, /metrics and /debug (default 0.0.0.0:15014; with --xds-auth none,"
        " 127.0.0.1:15014)",
    )
    discovery.add_argument(
        "--grpc-tls-addr",
        help="xDS over TLS, certificate from pilot's CA ('' to disable; default 0.0.0.0:15012;"
        " with --xds-auth none, 127.0.0.1:15012)",
    )
    discovery.add_argument(
        "--insecure-bind-any",
        action="store_true",
        help="with --xds-auth none: bind all interfaces by default, and allow addresses off"
        " loopback (anyone who reaches them gets any identity's certificate from the CA)",
    )
    discovery.add_argument(
        "--plaintext-secrets",
        action="store_true",
        default=None,
        help="serve the CA, SDS and CSDS on the plaintext port too (the default only with"
        " --config; elsewhere tokens and private keys would cross the network unencrypted)",
    )
    discovery.add_argument(
        "--tls-dns-names",
        default="",
        help="names in the TLS port's certificate (default pilot, pilot.$POD_NAMESPACE.svc, ...)",
    )
    discovery.add_argument(
        "--grpc-tls-require-client-cert",
        action="store_true",
        help="TLS callers must present a certificate from pilot's CA (then the CA"
        " authenticates them by it; tokens alone no longer reach the TLS port)",
    )
    discovery.add_argument(
        "--drain-duration",
        type=_duration,
        default="5s",
        help="on SIGTERM, how long streams get to move elsewhere (default %(default)s)",
    )
    discovery.add_argument(
        "--max-connection-age",
        type=_duration,
        default="30m",
        help="close connections older than this, with jitter, to spread load"
        " (default %(default)s; 0: never)",
    )
    discovery.add_argument(
        "--debug-addr",
        help="serve /debug/* here instead of on --http-addr, where they answer loopback only",
    )
    discovery.add_argument(
        "--config",
        type=Path,
        help="a YAML file of Services, EndpointSlices and Endpoints (reloaded on change)",
    )
    discovery.add_argument(
        "--kubeconfig",
        type=Path,
        help="without --config: kubeconfig to use (else $KUBECONFIG, in-cluster, ~/.kube/config)",
    )
    discovery.add_argument(
        "--namespaces",
        default="",
        help="comma-separated namespaces to watch (default: all)",
    )
    discovery.add_argument(
        "--endpoints-api",
        choices=[api.value for api in EndpointsApi],
        default=EndpointsApi.ENDPOINTSLICES.value,
        help="watch EndpointSlices (default) or legacy v1 Endpoints",
    )
    _security_flags(discovery)
    discovery.add_argument(
        "--cluster-domain",
        default="cluster.local",
        help="the cluster's DNS suffix, in cluster names and the TLS port's certificate"
        " (default %(default)s)",
    )
    discovery.add_argument(
        "--cluster-id",
        type=_cluster_id,
        default=DEFAULT_CLUSTER_ID,
        help="this cluster's id: endpoints carry it, and remote clusters' services merge"
        " with its own (default %(default)s, as Istio)",
    )
    discovery.add_argument(
        "--remote-kubeconfig",
        type=_remote_kubeconfig,
        action="append",
        metavar="ID=PATH",
        help="also watch the remote cluster ID through this kubeconfig (repeatable; in"
        " Kubernetes mode, Secrets labelled istio/multiCluster=true add more)",
    )
    discovery.add_argument(
        "--refuse-insecure-skip-tls-verify",
        action="store_true",
        help="refuse remote kubeconfigs with insecure-skip-tls-verify: true (default: use"
        " them, with a warning naming the cluster)",
    )
    discovery.add_argument(
        "--xds-cluster-name",
        default="xds-grpc",
        help="bootstrap cluster named in non-ADS EDS config sources (default %(default)s)",
    )
    _log_flags(discovery)
    _agent_parser(commands)
    status = commands.add_parser(
        "proxy-status",
        help="what each connected Envoy holds (from CSDS)",
        description="One row per connected proxy: CDS, LDS, EDS, RDS, SDS state (like istioctl).",
    )
    _csds_flags(status)
    _proxy_config_parser(commands)
    return parser


def _csds_flags(parser: argparse.ArgumentParser) -> None:
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


_PROXY_CONFIG_KINDS = (
    ("clusters", ("cluster", "c"), "a row per cluster: name, type, state, version"),
    ("endpoints", ("endpoint", "ep"), "a row per endpoint: address, health, cluster, locality"),
    (
        "listeners",
        ("listener", "l"),
        "a row per filter chain: addresses, port, what it matches, where it sends",
    ),
    ("routes", ("route", "r"), "a row per route: configuration, virtual host, domains, path"),
    ("secrets", ("secret", "s"), "a row per certificate: SPIFFE SAN, serial, validity"),
)


def _proxy_config_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    config = commands.add_parser(
        "proxy-config",
        help="one proxy's clusters, endpoints, listeners, routes or secrets (from CSDS)",
        description="What pilot sent one proxy, and its state (like istioctl proxy-config).",
    )
    kinds = config.add_subparsers(dest="kind_given", required=True, metavar="KIND")
    for kind, aliases, summary in _PROXY_CONFIG_KINDS:
        parser = kinds.add_parser(kind, aliases=aliases, help=summary, description=summary)
        parser.set_defaults(kind=kind)
        parser.add_argument("node_id", metavar="NODE_ID", help="the proxy's node id")
        parser.add_argument(
            "--identity",
            help="its SPIFFE URI, when several identities use the node id (see proxy-status)",
        )
        _csds_flags(parser)


def _agent_parser(commands: argparse._SubParsersAction[_Parser]) -> None:
    agent = commands.add_parser(
        "agent",
        help="serve SDS next to Envoy on a Unix socket (keys never leave the node)",
        description="Mint this pod's workload certificates and serve them to Envoy over SDS.",
        epilog=_AGENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _version_flag(agent)
    agent.add_argument(
        "--sds-socket",
        type=Path,
        default=DEFAULT_SOCKET,
        help="the Unix socket Envoy reads its certificates from (default %(default)s)",
    )
    agent.add_argument(
        "--discovery-address",
        default=DEFAULT_DISCOVERY_ADDRESS,
        help="pilot's TLS gRPC address, the default CA_ADDR (default %(default)s)",
    )
    agent.add_argument(
        "--trust-domain",
        default="cluster.local",
        help="SPIFFE trust domain of the workload's identity (default %(default)s)",
    )
    _key_type_flag(agent)
    _sidecar_flags(agent)
    _log_flags(agent)
    steps = agent.add_subparsers(dest="agent_step", metavar="STEP")
    steps.add_parser(
        "bootstrap",
        help="print the sidecar's Envoy bootstrap (JSON) and exit",
        description="Print the bootstrap --binary-path would start Envoy with.",
    )
    _iptables_parser(steps)


def _sidecar_flags(agent: argparse.ArgumentParser) -> None:
    """`pilot agent` bringing Envoy up (Istio's ProxyConfig names: binaryPath, configPath)."""
    group = agent.add_argument_group("sidecar (Envoy started by the agent)")
    group.add_argument(
        "--binary-path",
        type=Path,
        help="start this Envoy once SDS serves, with the bootstrap written to --config-path",
    )
    group.add_argument(
        "--config-path",
        type=Path,
        default=DEFAULT_CONFIG_PATH,
        help="where envoy-rev.json is written (default %(default)s)",
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


def _iptables_parser(steps: argparse._SubParsersAction[_Parser]) -> None:
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
    action = rules.add_mutually_exclusive_group()
    action.add_argument("--dry-run", action="store_true", help="print the rules, change nothing")
    action.add_argument("--cleanup", action="store_true", help="remove the rules")


_AGENT_EPILOG = f"""\
environment:
  POD_NAMESPACE, SERVICE_ACCOUNT  the workload identity (required)
  CA_TOKEN_FILE              service-account token presented to the CA
  CA_ADDR                    the CA (default: --discovery-address)
  CA_ROOT_CERT               the root that verifies the CA and every chain, served to
                             Envoy as ROOTCA (default ./{DEFAULT_ROOT_CERT})
  CA_INSECURE                true: plaintext to the CA (chains are still verified)
  SECRET_TTL, SECRET_GRACE_PERIOD_RATIO  lifetime and rotation point
  POD_NAME, INSTANCE_IP      with --binary-path or `bootstrap`: the pod, in Envoy's node id
  ISTIO_META_INTERCEPTION_MODE  REDIRECT (default: traffic captured) or NONE
"""


def _log_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="info",
        help="default level, then per component: e.g. info,xds:debug,kubernetes:warning"
        f" (components: {', '.join(SCOPES)})",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (default) or json: one object per line",
    )


def _key_type_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--key-type`: the workload keys pilot discovery and pilot agent make."""
    parser.add_argument(
        "--key-type",
        choices=[k.value for k in KeyType],
        default=KeyType.EC.value,
        help="workload keys: ec (ECDSA P-256, default) or rsa (RSA 2048)",
    )


def _security_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (CA and SDS)")
    group.add_argument(
        "--ca-cert-dir",
        type=Path,
        help="plugged-in CA: ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem",
    )
    group.add_argument(
        "--ca-state-dir",
        type=Path,
        help=f"where a self-signed root is kept (default {default_state_dir()})",
    )
    group.add_argument(
        "--trust-domain",
        default="cluster.local",
        help="SPIFFE trust domain of the identities the CA signs (default %(default)s)",
    )
    group.add_argument(
        "--token-audience",
        default="istio-ca",
        help="audience service-account tokens must carry (default %(default)s)",
    )
    _key_type_flag(group)
    group.add_argument(
        "--xds-auth",
        choices=[m.value for m in XdsAuth],
        help="how xDS callers are identified (default: none with --config, else kubernetes)",
    )
    group.add_argument(
        "--token-auth-file",
        type=Path,
        help="with --config only: service-account tokens trusted without a TokenReview,"
        " one CSV line TOKEN,system:serviceaccount:NS:SA each (kube-apiserver's format)",
    )


def _security(args: argparse.Namespace) -> SecuritySettings:
    ca = CaSettings(
        cert_dir=args.ca_cert_dir, state_dir=args.ca_state_dir, trust_domain=args.trust_domain
    )
    xds_auth = XdsAuth(args.xds_auth) if args.xds_auth else None
    settings = security_from_env(ca, KeyType(args.key_type), xds_auth, (args.token_audience,))
    return dataclasses.replace(settings, token_auth_file=_token_auth_file(args))


def _token_auth_file(args: argparse.Namespace) -> Path | None:
    """`--token-auth-file`, where it may be used: Kubernetes mode checks tokens by TokenReview."""
    path: Path | None = args.token_auth_file
    if path is not None and not path.is_file():
        raise SettingsError(f"--token-auth-file {path}: no such file")
    if path is not None and args.config is None:
        raise SettingsError(
            "--token-auth-file: only with --config (in Kubernetes mode"
            " the API server checks tokens)"
        )
    if path is not None and args.kubeconfig is not None:
        raise SettingsError(
            "--token-auth-file and --kubeconfig: tokens are checked one way,"
            " by the file or by TokenReview; give one"
        )
    return path


def _cluster_id(text: str) -> str:
    """A cluster id by the one rule (`pilot.cluster_ids`)."""
    if not is_cluster_id(text):
        raise argparse.ArgumentTypeError(f"{quoted(text)}: {cluster_ids.RULE}")
    return text


def _remote_kubeconfig(text: str) -> tuple[str, Path]:
    """`ID=PATH`: a remote cluster's id and its kubeconfig file."""
    cluster, sep, path = text.partition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ID=PATH")
    return _cluster_id(cluster), Path(path)


def _settings(args: argparse.Namespace) -> Settings:
    """Every flag and variable checked; the ports last, so that a wrong flag is named
    before a port another program holds."""
    settings = _flag_settings(args)
    addresses = (settings.grpc_addr, settings.grpc_tls_addr, settings.http_addr)
    listened = zip(_ADDRESS_FLAGS, addresses, strict=True)
    # Every address, --debug-addr's too, must resolve and be free (`pilot.listen_check`).
    check_listen_addresses([*listened, ("--debug-addr", settings.debug_addr or "")])
    return settings


def _flag_settings(args: argparse.Namespace) -> Settings:
    grpc_addr, grpc_tls_addr, http_addr = _addresses(args)
    settings = Settings(
        grpc_addr=grpc_addr,
        http_addr=http_addr,
        debug_addr=args.debug_addr,
        grpc_tls_addr=grpc_tls_addr,
        plaintext_secrets=args.plaintext_secrets,
        csds_trusted_accounts=csds_trusted_accounts_from_env(),
        limits=limits_from_env(),
        tls_dns_names=tuple(n.strip() for n in args.tls_dns_names.split(",") if n.strip()),
        tls_require_client_cert=args.grpc_tls_require_client_cert,
        drain_duration=args.drain_duration,
        max_connection_age=args.max_connection_age,
        config=args.config,
        cluster_id=args.cluster_id,
        remote_kubeconfigs=remote_kubeconfigs(args.remote_kubeconfig, args.cluster_id),
        remote=dataclasses.replace(
            remote_from_env(),
            refuse_insecure_skip_tls_verify=args.refuse_insecure_skip_tls_verify,
        ),
        build=BuildSettings(args.cluster_domain, args.xds_cluster_name, args.trust_domain),
        outbound=outbound_from_env(),
        debounce=debounce_from_env(),
        push=push_from_env(),
        security=_security(args),
        kubernetes=KubernetesSettings(
            kubeconfig=args.kubeconfig,
            namespaces=tuple(n.strip() for n in args.namespaces.split(",") if n.strip()),
            endpoints_api=EndpointsApi(args.endpoints_api),
            informer=informer_from_env(),
        ),
    )
    _check_config_file(args.config)  # after the flags' own checks: a flag is named first
    return settings


ANY_ADDRESSES = ("0.0.0.0:15010", "0.0.0.0:15012", "0.0.0.0:15014")
LOOPBACK_ADDRESSES = ("127.0.0.1:15010", "127.0.0.1:15012", "127.0.0.1:15014")
_ADDRESS_FLAGS = ("--grpc-addr", "--grpc-tls-addr", "--http-addr")


def _trusts_metadata(args: argparse.Namespace) -> bool:
    """Whether streams are who their node metadata says (--xds-auth none, or its default
    with --config): then the CA hands any caller any identity's certificate."""
    if args.xds_auth:
        return XdsAuth(args.xds_auth) is XdsAuth.NONE
    return args.config is not None


def _addresses(args: argparse.Namespace) -> tuple[str, str, str]:
    """--grpc-addr, --grpc-tls-addr and --http-addr, defaults filled in and checked.

    With --xds-auth none pilot binds loopback by default and refuses an address off
    loopback (SettingsError, naming the flag), unless --insecure-bind-any says the
    operator means it: then all interfaces are the default, and pilot warns.
    """
    trusting = _trusts_metadata(args)
    defaults = LOOPBACK_ADDRESSES if trusting and not args.insecure_bind_any else ANY_ADDRESSES
    given = (args.grpc_addr, args.grpc_tls_addr, args.http_addr)
    chosen = tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))
    flagged = [*zip(_ADDRESS_FLAGS, chosen, strict=True), ("--debug-addr", args.debug_addr or "")]
    check_address_forms(flagged)
    exposed = [
        f"{flag} {address}"
        for flag, address in zip(_ADDRESS_FLAGS, chosen, strict=True)
        if address and not is_loopback_host(split_host_port(address)[0])
    ]
    if trusting and exposed and not args.insecure_bind_any:
        raise SettingsError(
            f"{exposed[0]}: with --xds-auth none any caller gets any identity's certificate,"
            " so pilot binds loopback only; add --insecure-bind-any to bind off loopback"
        )
    if trusting and exposed:
        log.warning(
            "--insecure-bind-any: %s off loopback with --xds-auth none: anyone who reaches"
            " them gets any identity's certificate from pilot's CA",
            ", ".join(exposed),
        )
    grpc_addr, grpc_tls_addr, http_addr = chosen
    return grpc_addr, grpc_tls_addr, http_addr


def _check_config_file(path: Path | None) -> None:
    """A --config that is not there at start, or can never be a registry file, is an error
    at start: a path mistyped would otherwise leave pilot running, unready, for good.
    A file that is there but broken or empty is not: pilot waits for a good version,
    unready, saying so in its log; and a file removed later keeps the last good state."""
    if path is None:
        return
    if not path.exists():
        raise SettingsError(f"--config {path}: no such file")
    if path.is_dir():
        raise SettingsError(f"--config {path}: is a directory, not a registry file")


async def _run_agent(settings: AgentSettings) -> int:
    agent = Agent(settings)
    await _run_until_signalled(agent, lambda: "while starting")
    return agent.exit_status


def _agent(args: argparse.Namespace) -> int:
    """`pilot agent` and its steps (bootstrap, iptables)."""
    if args.agent_step == "iptables":
        return _iptables(args)
    envoy = None
    if args.binary_path is not None and args.agent_step is None:
        envoy = EnvoySettings(
            args.binary_path, args.config_path, args.proxy_log_level, args.concurrency
        )
    settings = agent_settings(
        args.sds_socket,
        args.discovery_address,
        args.trust_domain,
        KeyType(args.key_type),
        envoy=envoy,
        sidecar=args.agent_step == "bootstrap",
        cluster_domain=args.cluster_domain,
        status_port=args.status_port,
    )
    if args.agent_step == "bootstrap":
        print(json.dumps(settings.bootstrap(), indent=2))
        return 0
    return event_loop.run(_run_agent(settings))


def _iptables(args: argparse.Namespace) -> int:
    if args.cleanup:
        removed = agent_iptables.cleanup()
        log.info("removed capture chains: %s", ", ".join(removed) or "none were set")
        return 0
    settings = CaptureSettings(
        proxy_port=args.proxy_port,
        inbound_capture_port=args.inbound_port,
        proxy_uid=args.proxy_uid,
        proxy_gid=args.proxy_uid if args.proxy_gid is None else args.proxy_gid,
        inbound_ports=agent_iptables.parse_ports("-b", args.inbound_ports, wildcard=True),
        exclude_inbound_ports=agent_iptables.parse_ports("-d", args.exclude_inbound) or (),
        exclude_outbound_ports=agent_iptables.parse_ports("-o", args.exclude_outbound) or (),
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


class _Server(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def _run_until_signalled(server: _Server, starting: Callable[[], str]) -> None:
    """Start `server`, run it until SIGINT or SIGTERM, then stop it.

    A signal stops it at any moment, while it starts too: `start` waits for the
    registry's first full state, which a missing or broken file never gives, and
    Ctrl-C must still work then. `starting()` says what a start cut short was at.
    """
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(signum: signal.Signals) -> None:
        if not received.done():
            received.set_result(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    started = asyncio.create_task(server.start(), name="start")
    either: set[asyncio.Future[Any]] = {started, received}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if started.done():
        if started.exception() is not None:
            await server.stop()  # close what did start: left to the collector, grpc complains
        started.result()  # a start that failed raises here (a one-line error in main)
        log.info("stopping on %s", (await received).name)
    else:
        log.info("stopping on %s %s", received.result().name, starting())
        started.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await started
    await server.stop()


async def _run_discovery(settings: Settings) -> None:
    # Imported here: the control plane loads the Kubernetes client, which
    # `pilot agent` and `pilot proxy-status` never need.
    from pilot.app import Discovery  # noqa: PLC0415

    discovery = Discovery(settings)

    def starting() -> str:
        source = discovery.source
        if source is None or not source.synced:
            return "before the registry's first load"
        return "while starting"

    await _run_until_signalled(discovery, starting)


def _client_status(
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


def _proxy_status(args: argparse.Namespace) -> int:
    response = _client_status(args)
    if response is None:
        return 2
    print(tables.formatted(proxy_status_table.status_table(response), args.output))
    return 0


def _proxy_config(args: argparse.Namespace) -> int:
    """Exit 1 when no such proxy is connected (or readable), 2 when pilot cannot be asked."""
    response = _client_status(args, proxy_config.request_for(args.node_id))
    if response is None:
        return 2
    try:
        config = proxy_config.select(response, args.node_id, args.identity)
    except LookupError as error:
        print(f"pilot: error: {args.addr}: {error}", file=sys.stderr)
        return 1
    print(tables.formatted(proxy_config.TABLES[args.kind](config), args.output))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pilot` console script."""
    given = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(_negative_durations_joined(given))
    if args.command == "proxy-status":
        return _proxy_status(args)
    if args.command == "proxy-config":
        return _proxy_config(args)
    try:
        configure_logging(args.log_level, args.log_format)
        if args.command == "agent":
            return _agent(args)
        map_large_buffers()
        event_loop.run(_run_discovery(_settings(args)))
    except (
        LogSpecError,
        EventLoopError,
        LimitSettingError,
        SettingsError,
        SecuritySettingsError,
        CaSetupError,
        OSError,
        KubernetesUnavailable,
        BootstrapError,
        CaptureError,
    ) as error:
        print(f"pilot: error: {error}", file=sys.stderr)
        return 2
    return 0
