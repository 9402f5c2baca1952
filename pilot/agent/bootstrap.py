"""The Envoy bootstrap `pilot agent` writes for its sidecar: Istio's, as a pure function.

What Istio's pilot-agent puts in `envoy-rev.json`, reduced to what pilot serves:

- the node: id `sidecar~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN`, cluster
  `POD.NAMESPACE`, metadata NAMESPACE, SERVICE_ACCOUNT, POD_NAME, INSTANCE_IPS,
  INTERCEPTION_MODE (REDIRECT, or NONE for a sidecar without capture rules) and
  ISTIO_VERSION (pilot's version); and, as Istio's agent does, every other
  `ISTIO_META_NAME` variable as metadata NAME, a string (the injector's CLUSTER_ID,
  POD_PORTS, APP_CONTAINERS, WORKLOAD_NAME, OWNER, MESH_ID, NODE_NAME). Those are
  bounded (`node_metadata_from_env`): a name of A-Z, 0-9 and `_` only, at most
  MAX_META_VARIABLES of them, each value at most MAX_META_VALUE bytes; one that is
  not is left out with a warning naming it (never its value). pilot's own keys above
  are never replaced by a variable: discovery reads NAMESPACE and SERVICE_ACCOUNT
  (checked against what the stream proves) and INTERCEPTION_MODE, nothing else;
- ADS to pilot at the discovery address over TLS verified with the agent's root
  (CA_ROOT_CERT) and the address's host name, CDS and LDS over it (`ads`; as
  Istio's bootstrap, `initial_fetch_timeout: 0s` for both: Envoy waits for pilot's
  clusters and listeners before it goes LIVE and answers readiness); the
  stream carries the service-account token from CA_TOKEN_FILE, read by Envoy
  from that file (`file_based_metadata`), so the token is never copied into the
  bootstrap;
- `sds-grpc`, the agent's Unix socket (certificates `default` and `ROOTCA`);
- admin on 127.0.0.1:15000 only; Istio's listeners 0.0.0.0:15090
  (`/stats/prometheus`) and 0.0.0.0:15021 (`/healthz/ready`, answered by
  Envoy's own `/ready`), each passing that one path to the admin API and nothing
  else. The status port 15020 is the agent's own (`pilot.agent.status_port`), not Envoy's.

Every input is checked by `ProxyNode.from_env` (names by Kubernetes' rules, the
IP as an address) before it reaches the node id: a name never carries `~`, a
newline or a path into Envoy's configuration.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pilot.security.identity import Identity

Json = dict[str, Any]
log = logging.getLogger("pilot.agent")

ADMIN_PORT = 15000
PROMETHEUS_PORT = 15090
READINESS_PORT = 15021
XDS_CLUSTER = "xds-grpc"
SDS_CLUSTER = "sds-grpc"
INTERCEPTION_MODES = ("REDIRECT", "NONE")
META_PREFIX = "ISTIO_META_"
MAX_META_VARIABLES = 64
MAX_META_VALUE = 16 * 1024  # bytes: POD_PORTS of a pod with many containers and ports
_META_NAME = re.compile(r"[A-Z0-9_]{1,64}")
HCM = "envoy.filters.network.http_connection_manager"
# A pod name: a DNS-1123 subdomain (what Kubernetes accepts for metadata.name).
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HOST = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?")


class BootstrapError(ValueError):
    """An environment variable or flag the bootstrap needs is missing or unusable."""


@dataclass(frozen=True, slots=True)
class ProxyNode:
    """Who the sidecar is: its pod, address, identity and interception mode."""

    pod_name: str
    ip: str
    identity: Identity
    interception_mode: str = "REDIRECT"
    cluster_domain: str = "cluster.local"
    extra_metadata: tuple[tuple[str, str], ...] = ()  # ISTIO_META_NAME=value: (NAME, value)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], identity: Identity, cluster_domain: str = "cluster.local"
    ) -> ProxyNode:
        """POD_NAME, INSTANCE_IP (or POD_IP), ISTIO_META_INTERCEPTION_MODE, checked.

        Raises BootstrapError naming the variable.
        """
        pod_name = env.get("POD_NAME", "").strip()
        if not pod_name:
            raise BootstrapError("the sidecar's bootstrap needs POD_NAME (the pod's name)")
        if len(pod_name) > 253 or not _POD_NAME.fullmatch(pod_name):
            raise BootstrapError(f"POD_NAME={pod_name[:64]!r} is not a valid pod name")
        ip = (env.get("INSTANCE_IP") or env.get("POD_IP") or "").strip()
        if not ip:
            raise BootstrapError("the sidecar's bootstrap needs INSTANCE_IP (the pod's IP)")
        try:
            ip = str(ipaddress.ip_address(ip))
        except ValueError:
            raise BootstrapError(f"INSTANCE_IP={ip[:64]!r} is not an IP address") from None
        mode = env.get("ISTIO_META_INTERCEPTION_MODE", "REDIRECT").strip().upper()
        if mode not in INTERCEPTION_MODES:
            raise BootstrapError(
                f"ISTIO_META_INTERCEPTION_MODE={mode[:64]!r}:"
                f" one of {', '.join(INTERCEPTION_MODES)}"
            )
        return cls(pod_name, ip, identity, mode, cluster_domain, node_metadata_from_env(env))

    @property
    def namespace(self) -> str:
        return self.identity.namespace

    @property
    def node_id(self) -> str:
        namespace = self.namespace
        return (
            f"sidecar~{self.ip}~{self.pod_name}.{namespace}~{namespace}.svc.{self.cluster_domain}"
        )


def node_metadata_from_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(NAME, value) of each usable ISTIO_META_NAME variable, sorted; the rest warned of."""
    found: list[tuple[str, str]] = []
    for variable in sorted(key for key in env if key.startswith(META_PREFIX)):
        name, value = variable[len(META_PREFIX) :], env[variable]
        if not _META_NAME.fullmatch(name):
            log.warning("an %s* variable with a name that is not [A-Z0-9_]{1,64} is left out"
                        " of the node metadata", META_PREFIX)  # fmt: skip
        elif len(value.encode(errors="replace")) > MAX_META_VALUE:
            log.warning("%s%s is over %d bytes: left out of the node metadata",
                        META_PREFIX, name, MAX_META_VALUE)  # fmt: skip
        elif len(found) >= MAX_META_VARIABLES:
            log.warning("%s%s: over %d %s* variables: left out of the node metadata",
                        META_PREFIX, name, MAX_META_VARIABLES, META_PREFIX)  # fmt: skip
        else:
            found.append((name, value))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class XdsTarget:
    """Where Envoy's ADS goes and what it proves itself with."""

    address: str  # host:port, pilot's TLS port
    root_cert: Path  # the root pilot's certificate must chain to
    token_file: Path | None = None  # sent as `authorization: Bearer`, read by Envoy

    def __post_init__(self) -> None:
        host, sep, port = self.address.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not _HOST.fullmatch(host):
            raise BootstrapError(
                f"--discovery-address {self.address[:64]!r}: expected HOST:PORT for Envoy's xDS"
            )

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]


def _typed(message: str, **fields: Any) -> Json:
    return {"@type": f"type.googleapis.com/{message}", **fields}


def _pilot_version() -> str:
    try:
        return metadata.version("pilot")
    except metadata.PackageNotFoundError:
        return "unknown"


def _node(node: ProxyNode) -> Json:
    own = {
        "NAMESPACE": node.namespace,
        "SERVICE_ACCOUNT": node.identity.service_account,
        "POD_NAME": node.pod_name,
        "INSTANCE_IPS": node.ip,
        "INTERCEPTION_MODE": node.interception_mode,
        "ISTIO_VERSION": _pilot_version(),
    }
    return {
        "id": node.node_id,
        "cluster": f"{node.pod_name}.{node.namespace}",
        "metadata": dict(node.extra_metadata) | own,  # pilot's own keys win
    }


def _ads(target: XdsTarget) -> Json:
    """ADS on a Google gRPC client: TLS verified with the root, the token read from its file."""
    grpc: Json = {
        "target_uri": target.address,
        "stat_prefix": XDS_CLUSTER,
        "channel_credentials": {
            "ssl_credentials": {"root_certs": {"filename": str(target.root_cert.absolute())}}
        },
    }
    if target.token_file is not None:
        grpc["call_credentials"] = [
            {
                "from_plugin": {
                    "name": "envoy.grpc_credentials.file_based_metadata",
                    "typed_config": _typed(
                        "envoy.config.grpc_credential.v3.FileBasedMetadataConfig",
                        secret_data={"filename": str(target.token_file.absolute())},
                        header_key="authorization",
                        header_prefix="Bearer ",
                    ),
                }
            }
        ]
        grpc["credentials_factory_name"] = "envoy.grpc_credentials.file_based_metadata"
    return {
        "api_type": "GRPC",
        "transport_api_version": "V3",
        "set_node_on_first_message_only": True,
        "grpc_services": [{"google_grpc": grpc}],
    }


def _dynamic(target: XdsTarget) -> Json:
    # Istio's 0s: wait for pilot however long it takes. A sidecar that went LIVE on a
    # timeout would answer readiness holding no listener (or no cluster) of pilot's.
    ads = {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
    return {"ads_config": _ads(target), "cds_config": ads, "lds_config": dict(ads)}


def _static_cluster(name: str, address: Json, http2: bool = False) -> Json:
    cluster: Json = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                explicit_http_config={"http2_protocol_options": {}},
            )
        }
    return cluster


def _admin_address() -> Json:
    return {"socket_address": {"address": "127.0.0.1", "port_value": ADMIN_PORT}}


def _one_path_listener(name: str, port: int, path: str, rewrite: str | None) -> Json:
    """0.0.0.0:port passing `path` (and nothing else) to Envoy's admin API."""
    route: Json = {"cluster": "admin"}
    if rewrite is not None:
        route["prefix_rewrite"] = rewrite
    manager = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix=name,
        codec_type="AUTO",
        route_config={
            "virtual_hosts": [
                {
                    "name": "backend",
                    "domains": ["*"],
                    "routes": [{"match": {"path": path}, "route": route}],
                }
            ]
        },
        http_filters=[
            {
                "name": "envoy.filters.http.router",
                "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router"),
            }
        ],
    )
    return {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def bootstrap(node: ProxyNode, target: XdsTarget, sds_socket: Path) -> Json:
    """The sidecar's whole bootstrap, as JSON-ready data."""
    return {
        "node": _node(node),
        "admin": {"address": _admin_address()},
        "dynamic_resources": _dynamic(target),
        "static_resources": {
            "clusters": [
                _static_cluster(SDS_CLUSTER, {"pipe": {"path": str(sds_socket)}}, http2=True),
                _static_cluster("admin", _admin_address()),
            ],
            "listeners": [
                _one_path_listener("prometheus", PROMETHEUS_PORT, "/stats/prometheus", None),
                _one_path_listener("status", READINESS_PORT, "/healthz/ready", "/ready"),
            ],
        },
    }
