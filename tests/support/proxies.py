"""The proxies the SDS and mTLS tests play: node ids, SPIFFE identities, Node messages.

Owns `Proxy` (a node id and the identity its Istio metadata claims, as pilot runs
with `--xds-auth none`) and the naming rules behind it: `spiffe`, `sidecar_id`,
`identity_metadata`.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from google.protobuf import struct_pb2

TRUST_DOMAIN = "cluster.local"


def spiffe(namespace: str, account: str) -> str:
    """The SPIFFE identity pilot gives a proxy of this namespace and service account."""
    return f"spiffe://{TRUST_DOMAIN}/ns/{namespace}/sa/{account}"


def sidecar_id(name: str, namespace: str, ip: str = "127.0.0.1") -> str:
    """An Istio-shaped sidecar node id."""
    return f"sidecar~{ip}~{name}.{namespace}~{namespace}.svc.cluster.local"


def identity_metadata(namespace: str, account: str) -> dict[str, str]:
    """Node metadata that names a proxy's identity (pilot runs with --xds-auth none)."""
    return {"NAMESPACE": namespace, "SERVICE_ACCOUNT": account}


@dataclass(frozen=True)
class Proxy:
    """One proxy as pilot knows it: its node id and the identity its metadata claims."""

    node_id: str
    namespace: str
    account: str

    @classmethod
    def sidecar(cls, name: str, namespace: str, account: str) -> Proxy:
        return cls(sidecar_id(name, namespace), namespace, account)

    @property
    def uri(self) -> str:
        return spiffe(self.namespace, self.account)

    @property
    def metadata(self) -> dict[str, str]:
        return identity_metadata(self.namespace, self.account)

    def node(self) -> base_pb2.Node:
        """The Node an Envoy of this proxy sends on its first request."""
        metadata = struct_pb2.Struct()
        metadata.update(self.metadata)
        return base_pb2.Node(id=self.node_id, cluster=f"{self.namespace}.svc", metadata=metadata)
