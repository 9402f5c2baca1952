"""The sidecar bench's mesh: Services with ClusterIPs, a Pod behind every endpoint, sidecars.

`bench.workload`'s mesh (service i is `svc-NNNN` in `default`, HTTP port 80,
E endpoints) with what a sidecar's listeners and auto mTLS read:

- every Service has a ClusterIP (its route domains, its TCP listener address;
  inside a real API server's service range, clear of its `kubernetes` Service)
  and selects its Pods (label `app`); every EndpointSlice says it is managed by
  the bench (a real API server's EndpointSlice controller leaves it alone);
  every `TCP_EVERY`th also a TCP port (`tcp-db` 5432: a listener
  `CLUSTERIP_5432` of its own, as Istio gives TCP ports);
- every endpoint is a Pod (`targetRef` in the slice; the Pod Running with that
  IP, service account `svc-NNNN`, labels `app` and
  `security.istio.io/tlsMode: istio`, as a pod with an injected sidecar has);
- the sidecars are Pods of the mesh: sidecar j is endpoint j // S of service
  j % S, node id `sidecar~IP~POD.default~default.svc.cluster.local` with the
  metadata `pilot agent` puts in Envoy's bootstrap (ISTIO_VERSION included,
  which istiod asks for). The endpoints sidecars sit on never change (a
  changed endpoint is a replaced Pod, whose sidecar would be gone with it);
- an endpoint change gives one endpoint a fresh address whose Pod already
  exists (it is in the initial mesh), so the change is the EndpointSlice alone;
- a service added (`Addition`) is like a TCP one of the mesh (HTTP 80 and TCP
  5432, its Pods in the initial mesh too): every sidecar is sent its two
  clusters (CDS), their assignments (EDS), its TCP listener (LDS) and route
  configuration 80 with its virtual host (RDS).
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import wire
from bench.workload import Workload
from tests.support.mesh import Ep, as_list, cluster_name, endpoint_slice, service

Obj = dict[str, Any]
TCP_EVERY = 10
TCP_PORT = ("tcp-db", 5432)
HTTP_ROUTE = "80"  # the route configuration of HTTP port 80
NAMESPACE = "default"
TLS_MODE = "security.istio.io/tlsMode"
_VERSION = metadata.version("pilot")
# On a real API server, the EndpointSlice controller leaves slices managed by another alone.
MANAGED_BY = {"endpointslice.kubernetes.io/managed-by": "bench.sidecar"}
# Inside a real API server's service range (tests.cluster's 10.96.0.0/16), clear of its
# `kubernetes` Service (10.96.0.1).
_CLUSTER_IPS = int(ipaddress.IPv4Address("10.96.1.0"))


@dataclass(frozen=True)
class Addition:
    """A service added: its EndpointSlice (applied first), then the Service itself."""

    name: str
    slice: Obj
    service: Obj
    cluster_ip: str

    @property
    def label(self) -> str:
        return f"{self.name} added"

    @property
    def expected(self) -> frozenset[tuple[str, str]]:
        http, tcp = cluster_name(self.name), cluster_name(self.name, TCP_PORT[1])
        return frozenset(
            {
                (wire.CLUSTER, http),
                (wire.CLUSTER, tcp),
                (wire.ENDPOINT, http),
                (wire.ENDPOINT, tcp),
                (wire.LISTENER, f"{self.cluster_ip}_{TCP_PORT[1]}"),
                (wire.ROUTE, HTTP_ROUTE),
            }
        )


class SidecarMesh(Workload):
    """The mesh, its sidecars, A services to add and K endpoint changes, all made up front."""

    def __init__(
        self,
        services: int,
        endpoints: int,
        *,
        sidecars: int,
        additions: int,
        changes: int,
        seed: int,
    ) -> None:
        super().__init__(services, endpoints, seed)
        self.first_changed = math.ceil(sidecars / services)
        if self.first_changed >= endpoints:
            raise ValueError(
                f"{sidecars} sidecars on {services} services leave none of {endpoints} endpoints"
                " a service to change: more --endpoints"
            )
        self.pods: dict[str, Obj] = {}  # by IP
        for i, slice_ in enumerate(self.slices):
            slice_["metadata"]["labels"].update(MANAGED_BY)
            if self._has_tcp(i):
                port = {"name": TCP_PORT[0], "port": TCP_PORT[1], "protocol": "TCP"}
                slice_["ports"].append(port)
            for endpoint in slice_["endpoints"]:
                self._moved(i, endpoint)
        self.sidecars = [self._sidecar(j) for j in range(sidecars)]
        self._initial = list(self.slices)  # changes replace slices, never edit them
        self.additions = [self._addition(services + k) for k in range(additions)]
        self.changes = [self.change() for _ in range(changes)]

    @staticmethod
    def _has_tcp(index: int) -> bool:
        return index % TCP_EVERY == 0

    def _more_clusters(self, service: int) -> tuple[str, ...]:
        return (cluster_name(self.names[service], TCP_PORT[1]),) if self._has_tcp(service) else ()

    def _moved(self, service: int, endpoint: Obj) -> None:
        """The endpoint's address gets a Pod of its own, and the slice names it."""
        (ip,) = endpoint["addresses"]
        added = service >= len(self.names)
        name = _added(service) if added else self.names[service]
        pod = _pod(f"{name}-{len(self.pods)}", ip, name, tcp=added or self._has_tcp(service))
        self.pods[ip] = pod
        endpoint["targetRef"] = {"kind": "Pod", "name": pod["metadata"]["name"]}
        endpoint["targetRef"]["namespace"] = NAMESPACE

    def _sidecar(self, j: int) -> Obj:
        """The node of sidecar j: a Pod of the mesh, as `pilot agent` describes it."""
        ip = self._initial_ip(j % self.services, j // self.services)
        pod = self.pods[ip]["metadata"]["name"]
        account = self.pods[ip]["spec"]["serviceAccountName"]
        return {
            "id": f"sidecar~{ip}~{pod}.{NAMESPACE}~{NAMESPACE}.svc.cluster.local",
            "metadata": {
                "NAMESPACE": NAMESPACE,
                "SERVICE_ACCOUNT": account,
                "POD_NAME": pod,
                "INSTANCE_IPS": ip,
                "INTERCEPTION_MODE": "REDIRECT",
                # As `pilot agent` says it; istiod reads any version not starting 1-9 as
                # the newest (all its features on), and warns when there is none.
                "ISTIO_VERSION": _VERSION,
            },
        }

    def _initial_ip(self, service: int, endpoint: int) -> str:
        return str(self.slices[service]["endpoints"][endpoint]["addresses"][0])

    def _service(self, index: int, name: str) -> Obj:
        ports = [("http", 80), TCP_PORT] if self._has_tcp(index) else [("http", 80)]
        return _with_address(service(name, NAMESPACE, ports=ports), index)

    def _addition(self, index: int) -> Addition:
        name = _added(index)
        ports = (("http", 8080), TCP_PORT)
        endpoints = [Ep(self._fresh_ip()) for _ in range(self.endpoints)]
        slice_ = endpoint_slice(name, endpoints, NAMESPACE, ports=ports)
        slice_["metadata"]["labels"].update(MANAGED_BY)
        for endpoint in slice_["endpoints"]:
            self._moved(index, endpoint)
        obj = _with_address(service(name, NAMESPACE, ports=[("http", 80), TCP_PORT]), index)
        return Addition(name, slice_, obj, _cluster_ip(index))

    def objects(self) -> list[Obj]:
        """The initial mesh: Services, EndpointSlices, and the Pods of every address any
        endpoint will have (the services added and the changes included)."""
        services = [self._service(i, name) for i, name in enumerate(self.names)]
        return [*services, *self._initial, *self.pods.values()]

    def yaml(self) -> str:
        """`objects`, as one `kind: List` document."""
        return as_list(self.objects())

    def write_nodes(self, path: Path) -> None:
        """The sidecars' nodes, one JSON line each, as `bench.clients --nodes` reads them."""
        path.write_text("".join(json.dumps(node) + "\n" for node in self.sidecars))

    def tcp_cluster_ips(self) -> list[str]:
        """The ClusterIPs of the initial mesh's Services with a TCP port."""
        return [_cluster_ip(i) for i in range(self.services) if self._has_tcp(i)]

    @property
    def tcp_services(self) -> int:
        return sum(self._has_tcp(i) for i in range(self.services))


def _added(index: int) -> str:
    return f"added-{index:04d}"


def _cluster_ip(index: int) -> str:
    return str(ipaddress.IPv4Address(_CLUSTER_IPS + 1 + index))


def _with_address(obj: Obj, index: int) -> Obj:
    """A Service with its ClusterIP, the selector of its Pods (label `app`) and their
    HTTP port (8080, as the EndpointSlices say) as its HTTP port's target."""
    obj["spec"]["clusterIP"] = _cluster_ip(index)
    obj["spec"]["selector"] = {"app": obj["metadata"]["name"]}
    for port in obj["spec"]["ports"]:
        if port["name"] == "http":
            port["targetPort"] = 8080
    return obj


def _pod(name: str, ip: str, account: str, *, tcp: bool) -> Obj:
    """A Running Pod with an injected sidecar, as the API server shows it."""
    ports = [{"name": "http", "containerPort": 8080}]
    if tcp:
        ports.append({"name": TCP_PORT[0], "containerPort": TCP_PORT[1]})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": account, TLS_MODE: "istio"},
        },
        "spec": {
            "serviceAccountName": account,
            "containers": [{"name": "app", "image": "app", "ports": ports}],
        },
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }
