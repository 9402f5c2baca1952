"""SPIFFE identities as Istio writes them: `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPIFFE = re.compile(r"spiffe://([^/\s]+)/ns/([^/\s]+)/sa/([^/\s]+)")
_SERVICE_ACCOUNT_USER = re.compile(r"system:serviceaccount:([^:\s]+):([^:\s]+)")


@dataclass(frozen=True, slots=True, order=True)
class Identity:
    """A workload identity: trust domain, namespace, service account."""

    trust_domain: str
    namespace: str
    service_account: str

    @property
    def uri(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @property
    def account(self) -> str:
        """`ns/sa`, the form CA_TRUSTED_NODE_ACCOUNTS lists."""
        return f"{self.namespace}/{self.service_account}"

    def __str__(self) -> str:
        return self.uri

    @classmethod
    def parse(cls, uri: str) -> Identity:
        """Parse a SPIFFE URI; raises ValueError when it is not Istio-shaped."""
        match = _SPIFFE.fullmatch(uri)
        if match is None:
            raise ValueError(f"not a SPIFFE identity of the form spiffe://TD/ns/NS/sa/SA: {uri!r}")
        return cls(*match.groups())

    @classmethod
    def from_username(cls, username: str, trust_domain: str) -> Identity:
        """From a Kubernetes user name `system:serviceaccount:NS:SA`."""
        match = _SERVICE_ACCOUNT_USER.fullmatch(username)
        if match is None:
            raise ValueError(f"{username!r} is not a service account")
        return cls(trust_domain, *match.groups())
