"""The example sidecar's way to pilot, run for real: TLS port, root file, projected token.

deploy/example-app's Envoy reaches pilot on 15012 with the Google gRPC client: channel
credentials are pilot's root (a file), call credentials the projected service-account
token (a file, sent as `authorization: Bearer`). Here that very bootstrap (read from the
ConfigMap, not copied) runs against a pilot with `--xds-auth kubernetes` on the
Kubernetes registry and a TLS xDS port. Only what a test machine cannot have is
rewritten: the volumes' mount paths become test folders, pilot's address becomes
loopback (the name Envoy verifies stays `pilot.pilot-system.svc`: pilot runs with the
POD_NAMESPACE deploy/deployment.yaml gives it, so its serving certificate carries that
name), and the listeners bind ephemeral loopback ports. The node id and cluster come
from the sidecar's own command line, $(VAR)s expanded.

* With the token of the account its node metadata names, Envoy gets the mesh's clusters
  and endpoints and its `default` certificate for that account; pilot reviewed exactly
  that token and holds the stream under the token's identity.
* With another account's token pilot refuses the stream (PERMISSION_DENIED); with an
  empty token file or a token TokenReview rejects, UNAUTHENTICATED. Pilot sends nothing
  and mints nothing; Envoy holds no cluster from pilot and says why (log, stats).

Tokens never appear in assertion messages: they are compared into booleans first.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pilot.security.identity import Identity
from pilot.security.xds_auth import XdsAuth
from pilot.server.connection import Connection
from pilot.sources.kubernetes.config import KubernetesSettings
from pilot.xds.proxy import ProxyKey
from tests.harness.envoy_process import EnvoyProcess, wait_until
from tests.integration.ca_support import kube_api
from tests.integration.envoy_view import ClusterView, dynamic_clusters, wait_for_view
from tests.kubeapi import KubeAPIServer
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.pilot import FAST_INFORMER, RunningPilot, _running, _security, _settings

Json = dict[str, Any]
Review = tuple[tuple[str, ...], bool, str | None]  # audiences, authenticated, username

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLE = DEPLOY / "example-app"

# What the kubelet would put in the sidecar's environment (deployment.yaml's fieldRefs).
POD_ENV = {"POD_NAME": "echo-5d9c7b6f4-x2x1z", "POD_NAMESPACE": "example", "POD_IP": "10.244.1.7"}
ECHO_IPS = ("10.244.1.7", "10.244.2.9")  # the echo Deployment's two pods
XDS_STAT_PREFIX = "xds-grpc"
AUDIENCE = "istio-ca"  # the projected token's audience, pilot's --token-audience default
PERMISSION_DENIED, UNAUTHENTICATED = 7, 16


# ------------------------------------------------------------------ the deploy example


def _one(path: Path, kind: str, name: str) -> Json:
    docs: list[Json] = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _example_bootstrap() -> Json:
    configmap = _one(EXAMPLE / "envoy-bootstrap.yaml", "ConfigMap", "echo-envoy")
    bootstrap: Json = yaml.safe_load(configmap["data"]["envoy.yaml"])
    return bootstrap


@functools.cache
def _claimed() -> tuple[str, str]:
    """The NAMESPACE and SERVICE_ACCOUNT the example's node metadata names."""
    metadata = _example_bootstrap()["node"]["metadata"]
    return metadata["NAMESPACE"], metadata["SERVICE_ACCOUNT"]


def _sidecar_container() -> Json:
    pod = _one(EXAMPLE / "deployment.yaml", "Deployment", "echo")["spec"]["template"]["spec"]
    envoys: list[Json] = [c for c in pod["containers"] if c["image"].startswith("envoyproxy/")]
    (envoy,) = envoys
    return envoy


def _pilot_service() -> tuple[str, str, int]:
    """pilot's namespace, the name sidecars dial it by, its TLS xDS port (service.yaml)."""
    svc = _one(DEPLOY / "service.yaml", "Service", "pilot")
    namespace = svc["metadata"]["namespace"]
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "https-xds")
    return namespace, f"pilot.{namespace}.svc", port


def _dicts(node: Any) -> Iterator[Json]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _dicts(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dicts(item)


def _node_args(container: Json) -> list[str]:
    """--service-node and --service-cluster as the sidecar passes them, $(VAR)s expanded."""
    assert {e["name"] for e in container["env"]} == set(POD_ENV)
    args = [re.sub(r"\$\((\w+)\)", lambda m: POD_ENV[m[1]], arg) for arg in container["args"]]
    kept: list[str] = []
    for flag in ("--service-node", "--service-cluster"):
        kept += [flag, args[args.index(flag) + 1]]
    return kept


@dataclass
class Sidecar:
    """The example sidecar's bootstrap and node flags, its volumes laid out in a folder."""

    bootstrap: Json
    node_args: list[str]
    token_file: Path

    @property
    def node_id(self) -> str:
        return self.node_args[self.node_args.index("--service-node") + 1]

    def write_token(self, token: str) -> None:
        """What the kubelet does: the projected token, in the file Envoy reads per stream."""
        self.token_file.write_text(token)


def example_sidecar(folder: Path, tls_port: int, root_pem: str) -> Sidecar:
    """deploy/example-app's sidecar, dialing a pilot on loopback `tls_port`."""
    bootstrap = _example_bootstrap()
    container = _sidecar_container()
    mounts = {
        m["mountPath"].rstrip("/") + "/": folder / m["name"] for m in container["volumeMounts"]
    }
    for node in _dicts(bootstrap):
        filename = node.get("filename")
        if isinstance(filename, str):
            prefix = next(p for p in mounts if filename.startswith(p))
            node["filename"] = str(mounts[prefix] / filename.removeprefix(prefix))
            Path(node["filename"]).parent.mkdir(parents=True, exist_ok=True)
    for listener in bootstrap["static_resources"]["listeners"]:
        listener["address"]["socket_address"].update(address="127.0.0.1", port_value=0)

    (grpc_service,) = bootstrap["dynamic_resources"]["ads_config"]["grpc_services"]
    google = grpc_service["google_grpc"]
    _, name, port = _pilot_service()
    assert google["target_uri"] == f"{name}:{port}", "the example dials pilot's TLS port"
    assert google["stat_prefix"] == XDS_STAT_PREFIX
    google["target_uri"] = f"127.0.0.1:{tls_port}"
    # Loopback instead of the Service's address; the name checked is the Service's.
    google["channel_args"] = {"args": {"grpc.ssl_target_name_override": {"string_value": name}}}
    root_certs = google["channel_credentials"]["ssl_credentials"]["root_certs"]
    Path(root_certs["filename"]).write_text(root_pem)  # the ConfigMap istio-ca-root-cert
    (credentials,) = google["call_credentials"]
    token_file = Path(credentials["from_plugin"]["typed_config"]["secret_data"]["filename"])
    return Sidecar(bootstrap, _node_args(container), token_file)


# ------------------------------------------------------------------ pilot and the mesh


@asynccontextmanager
async def tls_kube_pilot(kubeconfig: Path) -> AsyncIterator[RunningPilot]:
    """pilot on the Kubernetes registry, `--xds-auth kubernetes`, with a TLS xDS port."""
    state = kubeconfig.parent / "ca"
    settings = _settings(
        state,
        grpc_tls_addr="127.0.0.1:0",
        kubernetes=KubernetesSettings(kubeconfig, informer=FAST_INFORMER),
        security=_security(state, xds_auth=XdsAuth.KUBERNETES),
    )
    async with _running(settings, None) as pilot:
        yield pilot


def apply_mesh(srv: KubeAPIServer) -> ClusterView:
    """The example's echo Service as deployed, with its two pods, and a Service in another
    namespace; returns the clusters pilot makes of them."""
    echo = _one(EXAMPLE / "service.yaml", "Service", "echo")
    (port,) = echo["spec"]["ports"]
    namespace = echo["metadata"]["namespace"]
    srv.apply(echo)
    pods = [Ep(ip) for ip in ECHO_IPS]
    srv.apply(endpoint_slice("echo", pods, namespace, ports=((port["name"], port["port"]),)))
    srv.apply(service("alpha", "default", ports=(("http", 80),)))
    srv.apply(endpoint_slice("alpha", [Ep("10.0.0.1")], "default", ports=(("http", 8080),)))
    return {
        cluster_name("echo", port["port"], namespace): {
            (ip, port["port"]): "HEALTHY" for ip in ECHO_IPS
        },
        cluster_name("alpha", 80, "default"): {("10.0.0.1", 8080): "HEALTHY"},
    }


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


@dataclass
class Setup:
    srv: KubeAPIServer
    pilot: RunningPilot
    sidecar: Sidecar
    from_pilot: ClusterView
    workdir: Path

    def envoy(self) -> EnvoyProcess:
        return EnvoyProcess(
            self.sidecar.bootstrap,
            self.workdir,
            "sidecar",
            log_level="warning",
            extra_args=self.sidecar.node_args,
        )

    def connections(self) -> list[Connection]:
        """pilot's streams from this sidecar (identified by its first request)."""
        discovery = self.pilot.discovery
        return [c for c in discovery.connections if c.proxy_id == self.sidecar.node_id]

    def reviews(self, token: str) -> list[tuple[Review, bool]]:
        """Each TokenReview pilot asked for, and whether it was for `token`."""
        return [
            ((tuple(r.audiences), r.authenticated, r.username), r.token == token)
            for r in self.srv.token_reviews
        ]


@pytest.fixture
async def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Setup]:
    # deploy/deployment.yaml gives pilot its namespace: its serving certificate names it.
    monkeypatch.setenv("POD_NAMESPACE", _pilot_service()[0])
    async with kube_api(tmp_path) as (srv, kubeconfig):
        from_pilot = apply_mesh(srv)
        async with tls_kube_pilot(kubeconfig) as pilot:
            security = pilot.discovery.security
            assert security is not None
            tls_port = pilot.discovery.grpc.tls_port
            sidecar = example_sidecar(tmp_path / "volumes", tls_port, security.ca.root_pem)
            yield Setup(srv, pilot, sidecar, from_pilot, tmp_path / "envoy")


# ------------------------------------------------------------------ served


async def test_the_example_sidecar_gets_the_mesh_with_its_token(setup: Setup) -> None:
    namespace, account = _claimed()
    token = setup.srv.add_service_account_token(namespace, account, audiences=(AUDIENCE,))
    setup.sidecar.write_token(token)
    identity = Identity("cluster.local", namespace, account)
    async with setup.envoy() as envoy:
        expected = expected_view(setup.sidecar.bootstrap, setup.from_pilot)
        await wait_for_view(envoy, expected, "the mesh, over the TLS port with the token")

        async def certificate_uris() -> list[str]:
            certificates = (await envoy.certs()).get("certificates", [])
            chains = [cert for entry in certificates for cert in entry.get("cert_chain", [])]
            return [san["uri"] for cert in chains for san in cert.get("subject_alt_names", [])]

        await envoy.wait_for(
            certificate_uris,
            10,
            f"the `default` certificate for {identity.uri}",
            until=lambda uris: identity.uri in uris,
        )
        assert await envoy.stat("control_plane.connected_state") == 1

        (connection,) = setup.connections()
        assert connection.kind.label == "ads-delta"
        assert connection.proxy == ProxyKey(setup.sidecar.node_id, identity.uri), (
            "the stream speaks for the account its token proved"
        )
        reviews = setup.reviews(token)
        assert reviews, "pilot reviewed no token"
        username = f"system:serviceaccount:{namespace}:{account}"
        assert set(reviews) == {(((AUDIENCE,), True, username), True)}, "only this token"


# ------------------------------------------------------------------ refused


@dataclass(frozen=True)
class Refusal:
    code: int
    pilot_says: str  # part of pilot's warning, and of the status Envoy logs
    review: Review | None  # the TokenReview pilot asks for; None: none at all
    account: str | None = None  # the token: this account's (in the claimed namespace)...
    text: str = ""  # ...or else the token file holds this


def _refusals() -> dict[str, Refusal]:
    namespace, account = _claimed()
    return {
        "other-account": Refusal(
            PERMISSION_DENIED,
            f"node metadata claims {namespace}/{account}"
            f" but the credentials are {namespace}/intruder",
            ((AUDIENCE,), True, f"system:serviceaccount:{namespace}:intruder"),
            account="intruder",
        ),
        "empty-token-file": Refusal(
            UNAUTHENTICATED, "xDS streams must carry a service-account token", None
        ),
        "bad-token": Refusal(
            UNAUTHENTICATED, "token rejected", ((AUDIENCE,), False, None), text="not-a-token"
        ),
    }


@pytest.mark.parametrize("case", list(_refusals()))
async def test_the_example_sidecar_is_refused_without_its_own_token(
    setup: Setup, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    refusal = _refusals()[case]
    token = refusal.text
    if refusal.account is not None:
        token = setup.srv.add_service_account_token(
            _claimed()[0], refusal.account, audiences=(AUDIENCE,)
        )
    setup.sidecar.write_token(token)
    caplog.set_level(logging.WARNING, logger="pilot.xds")

    def pilot_refusals() -> int:
        return sum(
            1
            for r in caplog.records
            if r.name == "pilot.xds" and "refused" in r.message and refusal.pilot_says in r.message
        )

    async with setup.envoy() as envoy:
        # Twice: the first stream is refused, and so is Envoy's retry.
        await envoy.wait_for(pilot_refusals, 15, "pilot to refuse twice", until=lambda n: n >= 2)
        closed = f"grpc.{XDS_STAT_PREFIX}.streams_closed_{refusal.code}"
        await envoy.wait_for_stat(closed, lambda n: isinstance(n, int) and n >= 2)
        assert await envoy.stat("control_plane.connected_state") == 0
        assert await envoy.dynamic_active_clusters() == {}
        static = setup.sidecar.bootstrap["static_resources"]["clusters"]
        view = await dynamic_clusters(envoy)
        assert view.keys() == {c["name"] for c in static}, "no cluster from pilot"
        eds = [c["name"] for c in static if c["type"] == "EDS"]
        assert eds, "the example has a cluster whose endpoints come from pilot"
        assert all(view[name] == {} for name in eds), f"endpoints from pilot: {view}"
        log = envoy.log_path.read_text()
        said = f"gRPC config stream to 127.0.0.1:{setup.pilot.discovery.grpc.tls_port} closed:"
        assert f"{said} {refusal.code}, {refusal.pilot_says}" in log, envoy.log_tail()

    discovery = setup.pilot.discovery
    assert sum(discovery.stats.responses.values()) == 0, "pilot sent nothing"
    assert discovery.security is not None
    assert discovery.security.secrets.stats.minted == 0, "and minted nothing"
    await wait_until(lambda: not setup.connections(), 5, "the refused streams to be gone")
    reviews = setup.reviews(token)
    expected = set() if refusal.review is None else {(refusal.review, True)}
    assert set(reviews) == expected
