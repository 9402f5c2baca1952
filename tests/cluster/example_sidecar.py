"""deploy/example-app's Envoy sidecar, as the API server holds it, laid out for a test.

`example_sidecar` reads the sidecar from the cluster, not from the files: its bootstrap
from the ConfigMap `echo-envoy`, its container from the Deployment `echo`, with the
node flags a kubelet would pass (`$(VAR)`s expanded from the Pod's fieldRefs). Only
what one test machine cannot have is rewritten: each volume's mount path becomes a test
folder (the root file from ConfigMap istio-ca-root-cert, the projected token),
pilot's address becomes loopback while the name Envoy verifies stays the Service's
(`pilot.pilot-system.svc`), and the listeners bind ephemeral loopback ports.
`projected_token` asks TokenRequest for the token the Pod's projected volume names
(its audience and lifetime, bound to the Pod). `expected_view` is what Envoy should
then hold: pilot's clusters and the bootstrap's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.client import Kube, path_of
from tests.support.ca import Token
from tests.support.envoy_view import ClusterView

Json = dict[str, Any]
NAMESPACE = "example"
PILOT_NAME = "pilot.pilot-system.svc"  # deploy/service.yaml's, in the bootstrap
PILOT_TLS_PORT = 15012
XDS_STAT_PREFIX = "xds-grpc"


def _dicts(node: Any) -> Iterator[Json]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _dicts(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dicts(item)


def _field(pod: Json, path: str) -> str:
    value: Any = pod
    for part in path.split("."):
        value = value[part]
    return str(value)


def node_args(container: Json, pod: Json) -> list[str]:
    """--service-node and --service-cluster as the kubelet passes them to `pod`."""
    env = {e["name"]: _field(pod, e["valueFrom"]["fieldRef"]["fieldPath"])
           for e in container["env"]}  # fmt: skip
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], arg) for arg in container["args"]]
    kept: list[str] = []
    for flag in ("--service-node", "--service-cluster"):
        kept += [flag, args[args.index(flag) + 1]]
    return kept


@dataclass
class Sidecar:
    """The sidecar's bootstrap and node flags, its volumes laid out in a folder."""

    bootstrap: Json
    node_args: list[str]
    token_file: Path
    pod: Json
    volume: Json  # the Pod's projected token volume

    @property
    def node_id(self) -> str:
        return self.node_args[self.node_args.index("--service-node") + 1]

    @property
    def claimed(self) -> tuple[str, str]:
        """The NAMESPACE and SERVICE_ACCOUNT its node metadata names."""
        metadata = self.bootstrap["node"]["metadata"]
        return metadata["NAMESPACE"], metadata["SERVICE_ACCOUNT"]

    def write_token(self, token: str) -> None:
        """What the kubelet does: the token, in the file Envoy reads for every stream."""
        self.token_file.write_text(token)

    async def projected_token(self, kube: Kube) -> Token:
        """The token the Pod's projected volume asks the kubelet for."""
        (source,) = self.volume["projected"]["sources"]
        spec = source["serviceAccountToken"]
        namespace = self.pod["metadata"]["namespace"]
        account = self.pod["spec"]["serviceAccountName"]
        audiences, seconds = [spec["audience"]], spec["expirationSeconds"]
        return Token(await kube.token(namespace, account, audiences, seconds, self.pod))


def _envoy(deployment: Json) -> Json:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    envoys: list[Json] = [c for c in containers if c["image"].startswith("envoyproxy/")]
    (envoy,) = envoys
    return envoy


def _mount_folders(bootstrap: Json, container: Json, folder: Path) -> None:
    """Each file the bootstrap names under a volume's mount path, moved to `folder`."""
    mounts = {m["mountPath"].rstrip("/") + "/": folder / m["name"]
              for m in container["volumeMounts"]}  # fmt: skip
    for node in _dicts(bootstrap):
        filename = node.get("filename")
        if isinstance(filename, str):
            prefix = next(p for p in mounts if filename.startswith(p))
            node["filename"] = str(mounts[prefix] / filename.removeprefix(prefix))
            Path(node["filename"]).parent.mkdir(parents=True, exist_ok=True)


def _dial_loopback(bootstrap: Json, tls_port: int) -> Json:
    """pilot on loopback `tls_port`, verified by its Service's name; the Google gRPC config."""
    (grpc_service,) = bootstrap["dynamic_resources"]["ads_config"]["grpc_services"]
    google: Json = grpc_service["google_grpc"]
    assert google["target_uri"] == f"{PILOT_NAME}:{PILOT_TLS_PORT}", "it dials pilot's TLS port"
    assert google["stat_prefix"] == XDS_STAT_PREFIX
    google["target_uri"] = f"127.0.0.1:{tls_port}"
    override = {"grpc.ssl_target_name_override": {"string_value": PILOT_NAME}}
    google["channel_args"] = {"args": override}
    for listener in bootstrap["static_resources"]["listeners"]:
        listener["address"]["socket_address"].update(address="127.0.0.1", port_value=0)
    return google


def _write_root(google: Json, root_pem: str) -> None:
    """What the kubelet mounts from ConfigMap istio-ca-root-cert: the root file."""
    root_file = google["channel_credentials"]["ssl_credentials"]["root_certs"]["filename"]
    Path(root_file).write_text(root_pem)


async def example_sidecar(kube: Kube, pod: Json, folder: Path, tls_port: int) -> Sidecar:
    """`pod`'s sidecar, dialing pilot on loopback `tls_port`, its root file holding what
    ConfigMap istio-ca-root-cert holds in the Pod's namespace."""
    namespace = pod["metadata"]["namespace"]
    configmap = await kube.get(path_of("ConfigMap", namespace, "echo-envoy"))
    bootstrap: Json = yaml.safe_load(configmap["data"]["envoy.yaml"])
    deployment = await kube.get(path_of("Deployment", namespace, "echo"))
    container = _envoy(deployment)
    _mount_folders(bootstrap, container, folder)
    google = _dial_loopback(bootstrap, tls_port)
    root = await kube.get(path_of("ConfigMap", namespace, "istio-ca-root-cert"))
    _write_root(google, root["data"]["root-cert.pem"])
    (credentials,) = google["call_credentials"]
    token_file = Path(credentials["from_plugin"]["typed_config"]["secret_data"]["filename"])
    volumes = pod["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "istio-token"]
    return Sidecar(bootstrap, node_args(container, pod), token_file, pod, volume)


def expected_view(bootstrap: Json, from_pilot: ClusterView) -> ClusterView:
    """pilot's clusters plus the bootstrap's own: STATIC ones with their fixed hosts, EDS
    ones with pilot's endpoints for their service_name."""
    view = dict(from_pilot)
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["type"] == "EDS":
            view[cluster["name"]] = from_pilot[cluster["eds_cluster_config"]["service_name"]]
            continue
        addresses = [
            lb["endpoint"]["address"]["socket_address"]
            for group in cluster["load_assignment"]["endpoints"]
            for lb in group["lb_endpoints"]
        ]
        view[cluster["name"]] = {(a["address"], a["port_value"]): "HEALTHY" for a in addresses}
    return view
