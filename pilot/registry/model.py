"""Plain values for services and endpoints, independent of where they came from.

A Kubernetes `EndpointSlice` and a legacy `Endpoints` object both become an
`EndpointSet`: groups of endpoints that share a port list. Equality is by
content, so a rewrite with the same content is recognisably "no change".

Every Service and endpoint set comes from one cluster (`cluster`, its cluster
id; "" in tests that need no cluster). A Service of the same name and
namespace in several clusters is one service (`ServiceKey` has no cluster):
the index merges them, and its endpoints come from every cluster.

A `Node` is only what locality needs of a Kubernetes Node: the region and zone
of its `topology.kubernetes.io/*` labels. Endpoints name their node
(`node_name`); the index resolves their locality from it.

A `Pod` is only what auto mTLS needs of a Kubernetes Pod: its IPs, its
service account, whether it runs a sidecar (`security.istio.io/tlsMode:
istio`), its phase and container ports. An endpoint names its pod the way its
object's `targetRef` does (`Endpoint.pod_name`): the index finds the pod by
that name in the endpoint set's own cluster and namespace, and only by address
(in that cluster and namespace) where the endpoint names no Pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

DEFAULT_CLUSTER_ID = "Kubernetes"  # Istio's name for the local cluster (`--cluster-id`)
# `Endpoint.pod_name` of a targetRef to a Pod no pod of the set's namespace can be (one of
# another namespace): the endpoint has no pod, and no pod at its address can claim it.
NO_POD = ""


@dataclass(frozen=True, slots=True, order=True)
class ServiceKey:
    """A Service's identity."""

    namespace: str
    name: str

    def hostname(self, cluster_domain: str) -> str:
        return f"{self.name}.{self.namespace}.svc.{cluster_domain}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One port of a Service; endpoints are matched to it by `name`."""

    name: str
    port: int
    protocol: str = "TCP"
    app_protocol: str = ""


@dataclass(frozen=True, slots=True)
class Service:
    """A Service: its ports are what clusters are built from."""

    key: ServiceKey
    ports: tuple[ServicePort, ...]
    cluster: str = ""  # the cluster id it came from
    # spec.clusterIP, normalised; "" when it has none (headless: "None", or unset).
    cluster_ip: str = ""


@dataclass(frozen=True, slots=True, order=True)
class EndpointSetKey:
    """Identity of an EndpointSlice or a legacy Endpoints object."""

    kind: str
    namespace: str
    name: str
    cluster: str = ""  # the cluster id it came from: two clusters may use the same name


class Health(Enum):
    """What an endpoint's conditions mean for Envoy; not-ready endpoints are left out."""

    HEALTHY = "HEALTHY"
    DRAINING = "DRAINING"


@dataclass(frozen=True, slots=True)
class EndpointPort:
    """A named port number, as an EndpointSlice lists it."""

    name: str
    port: int
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint (usually one pod) with its conditions."""

    addresses: tuple[str, ...]
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    zone: str = ""
    node_name: str = ""  # the Node it runs on, which gives its region (and zone if unset)
    # Its targetRef's Pod, in the set's namespace: None when it names no Pod (a pod at its
    # address in the set's namespace is its), NO_POD when it names one of another namespace.
    pod_name: str | None = None

    @property
    def health(self) -> Health | None:
        if self.ready:
            return Health.HEALTHY
        if self.serving and self.terminating:
            return Health.DRAINING
        return None


@dataclass(frozen=True, slots=True)
class EndpointGroup:
    """Endpoints that share one port list."""

    ports: tuple[EndpointPort, ...]
    endpoints: tuple[Endpoint, ...]

    def port_named(self, name: str) -> int | None:
        for port in self.ports:
            if port.name == name:
                return port.port
        return None


@dataclass(frozen=True, slots=True)
class EndpointSet:
    """An EndpointSlice or legacy Endpoints object, owned by one Service."""

    key: EndpointSetKey
    service: ServiceKey
    groups: tuple[EndpointGroup, ...]

    @property
    def legacy(self) -> bool:
        return self.key.kind == "Endpoints"


@dataclass(frozen=True, slots=True, order=True)
class NodeKey:
    """A Node's identity: Nodes are cluster-scoped, so its cluster and name."""

    cluster: str
    name: str


@dataclass(frozen=True, slots=True)
class Node:
    """The locality a Node's topology labels give (empty: the label is absent)."""

    key: NodeKey
    region: str = ""
    zone: str = ""


@dataclass(frozen=True, slots=True, order=True)
class PodKey:
    """A Pod's identity: its cluster, namespace and name."""

    cluster: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.cluster}/{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Pod:
    """What auto mTLS and PeerAuthentication need of a Pod (kept small: a cluster holds
    many of them)."""

    key: PodKey
    ips: tuple[str, ...]
    service_account: str = "default"
    istio_mtls: bool = False  # labelled security.istio.io/tlsMode: istio (it runs a sidecar)
    phase: str = ""
    ports: tuple[EndpointPort, ...] = ()  # its containers' ports
    # Its labels, sorted (key, value) pairs, for workload selectors (PeerAuthentication);
    # None: too many or malformed to keep, so no selector can be told to match it.
    labels: tuple[tuple[str, str], ...] | None = ()

    @property
    def serves_endpoints(self) -> bool:
        """Whether an endpoint's address can be this pod's: it has an IP and is not done."""
        return bool(self.ips) and self.phase not in {"Succeeded", "Failed"}
