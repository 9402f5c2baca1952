"""`pilot discovery`: its flags, and the control plane run until a signal."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pilot import cluster_ids
from pilot.cli.discovery_settings import settings_from_flags
from pilot.cli.flags import Parser, duration, key_type_flag, log_flags, version_flag
from pilot.cli.injection_flags import injection_flags
from pilot.cli.running import run_until_signalled
from pilot.cluster_ids import is_cluster_id, quoted
from pilot.kube.config import EndpointsApi
from pilot.registry.model import DEFAULT_CLUSTER_ID
from pilot.runtime import event_loop
from pilot.runtime.memory import map_large_buffers
from pilot.security.xds_auth import XdsAuth
from pilot.settings import Settings
from pilot.webhook.settings import CONFIGURATION

if TYPE_CHECKING:
    from pilot.app import Discovery

_DISCOVERY_EPILOG = """\
environment:
  PILOT_DEBOUNCE_AFTER       quiet period before a push (default 100ms)
  PILOT_DEBOUNCE_MAX         longest a change waits for a push (default 10s)
  PILOT_ENABLE_EDS_DEBOUNCE  debounce endpoint-only changes too (default true)
  PILOT_PUSH_THROTTLE        responses built and written at once (default 100)
  PILOT_XDS_SEND_TIMEOUT     close a stream whose Envoy stops reading (default 10s, 0: never)
  PILOT_MAX_LOCALITIES       proxy localities with assignment variants of their own (default 100)
  PILOT_MAX_UNVERIFIED_LOCALITIES  the same for streams that proved no identity, a
                             budget of their own (default 10)
  PILOT_OUTBOUND_TRAFFIC_POLICY  where sidecars send traffic to unknown hosts: ALLOW_ANY
                             (PassthroughCluster) or REGISTRY_ONLY (BlackHoleCluster)
                             (default ALLOW_ANY)
  PILOT_MAX_ROUTE_FLAVORS    route configurations built for sidecars whose routes depend
                             on their namespace or labels (default 256; beyond: shared)
  PILOT_PATH_NORMALIZATION   how sidecars normalize HTTP paths before authorization and
                             routing: BASE, MERGE_SLASHES or DECODE_AND_MERGE_SLASHES
                             (default BASE; Istio's NONE is refused)
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
  PILOT_MAX_INJECTION_REVIEWS  sidecar-injection reviews answered at once (default 1000;
                             429 past it)
  PILOT_MAX_INJECTION_BYTES  review bodies held at once (default 67108864; 429 past it)
  PILOT_INJECTION_BODY_TIMEOUT  a review's body must arrive within this (default 10s)
  PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS  remote kubeconfig options allowed
                             (exec,authProvider,tokenFile,clientCertificate,clientKey,
                             certificateAuthority; default none)
"""


def discovery_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    """`pilot discovery`'s flags."""
    discovery = commands.add_parser(
        "discovery",
        help="run the control plane (ADS, CDS, EDS)",
        description="Serve clusters and endpoints to Envoy over xDS (SotW and delta).",
        epilog=_DISCOVERY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    version_flag(discovery)
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
        "--webhook-addr",
        help="the sidecar-injection webhook, HTTPS, POST /inject ('' to disable; default"
        " 0.0.0.0:15017; with --xds-auth none, 127.0.0.1:15017)",
    )
    discovery.add_argument(
        "--injector-webhook-config",
        default=CONFIGURATION,
        help="in Kubernetes mode, the MutatingWebhookConfiguration whose caBundle pilot keeps"
        " at its root (default %(default)s)",
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
        type=duration,
        default="5s",
        help="on SIGTERM, how long streams get to move elsewhere (default %(default)s)",
    )
    discovery.add_argument(
        "--max-connection-age",
        type=duration,
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
    injection_flags(discovery)
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
    log_flags(discovery)


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
        help="where a self-signed root is kept (default $XDG_STATE_HOME/pilot/ca, else"
        " ~/.local/state/pilot/ca)",
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
    key_type_flag(group)
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


class _Discovery:
    """`pilot discovery` for `run_until_signalled`: a start that fails or is cut short
    stops what it started itself, so `stop` has a control plane to stop only once started."""

    def __init__(self, start: Callable[[], Awaitable[Discovery]]) -> None:
        self._start = start
        self.running: Discovery | None = None

    async def start(self) -> None:
        self.running = await self._start()

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop()


async def _run_discovery(settings: Settings) -> None:
    # Imported here: the control plane loads the Kubernetes client, which
    # `pilot agent` and `pilot proxy-status` never need.
    from pilot.app import Core, start_discovery  # noqa: PLC0415

    core = Core(settings)

    def starting() -> str:
        discovery = core.discovery
        if discovery is None or not discovery.source.synced:
            return "before the registry's first load"
        return "while starting"

    await run_until_signalled(_Discovery(lambda: start_discovery(core)), starting)


def run_discovery(args: argparse.Namespace) -> None:
    """`pilot discovery`: its settings checked, then the control plane until a signal."""
    map_large_buffers()
    event_loop.run(_run_discovery(settings_from_flags(args)))
