"""SPIFFE identities as Istio writes them: `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`.

An `Identity` is valid by construction, wherever its parts come from (a token's
user name, a client certificate, ImpersonatedIdentity, node metadata, the
environment): the namespace is a Kubernetes namespace name (a DNS-1123 label),
the service account a Kubernetes object name (a DNS-1123 subdomain), the trust
domain a DNS name. Anything else raises ValueError saying which part and why,
so that no `..`, `/` or other surprise ever reaches a certificate.

A proxy's arrival checks its identity's parts several times over (its claims, its
identity, the secret manager's and the sidecar's reading of it), and the pods of
one workload share one: names that passed a check are remembered (a bounded cache
of valid names only), and so are parsed URIs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_SPIFFE = re.compile(r"spiffe://([^/\s]+)/ns/([^/\s]+)/sa/([^/\s]+)")
_SERVICE_ACCOUNT_USER = re.compile(r"system:serviceaccount:([^:\s]+):([^:\s]+)")

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
MAX_LABEL = 63
MAX_SUBDOMAIN = 253
_SHOWN = 64  # how much of a rejected value a message repeats
# Valid names (and parsed URIs) remembered: a rejected one raises, and is never kept.
REMEMBERED = 4096


def _shown(value: str) -> str:
    """A rejected value for a message: quoted, escaped, and cut short if long."""
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


@functools.lru_cache(maxsize=REMEMBERED)
def check_namespace(namespace: str) -> str:
    """`namespace` if it is a valid Kubernetes namespace name, else ValueError."""
    if len(namespace) > MAX_LABEL or not _DNS1123_LABEL.fullmatch(namespace):
        raise ValueError(
            f"namespace {_shown(namespace)} is not a valid Kubernetes namespace"
            f" (a DNS-1123 label: at most {MAX_LABEL} lowercase letters, digits and '-',"
            " starting and ending with a letter or digit)"
        )
    return namespace


@functools.lru_cache(maxsize=REMEMBERED)
def check_service_account(service_account: str) -> str:
    """`service_account` if it is a valid Kubernetes service account name, else ValueError.

    A DNS-1123 subdomain, as Kubernetes validates object names: dot-separated
    labels of lowercase letters, digits and '-', at most 253 characters in all.
    """
    if len(service_account) > MAX_SUBDOMAIN or not _DNS1123_SUBDOMAIN.fullmatch(service_account):
        raise ValueError(
            f"service account {_shown(service_account)} is not a valid Kubernetes name"
            f" (a DNS-1123 subdomain: at most {MAX_SUBDOMAIN} lowercase letters, digits,"
            " '-' and '.', each dot-separated part starting and ending with a letter or digit)"
        )
    return service_account


@functools.lru_cache(maxsize=REMEMBERED)
def check_trust_domain(trust_domain: str) -> str:
    """`trust_domain` if it is a lowercase DNS name, else ValueError."""
    labels = trust_domain.split(".")
    if (
        len(trust_domain) > MAX_SUBDOMAIN
        or not _DNS1123_SUBDOMAIN.fullmatch(trust_domain)
        or any(len(label) > MAX_LABEL for label in labels)
    ):
        raise ValueError(
            f"trust domain {_shown(trust_domain)} is not a valid DNS name"
            f" (dot-separated labels of at most {MAX_LABEL} lowercase letters, digits and '-',"
            f" each starting and ending with a letter or digit; {MAX_SUBDOMAIN} at most in all)"
        )
    return trust_domain


@dataclass(frozen=True, slots=True, order=True)
class Identity:
    """A workload identity: trust domain, namespace, service account (each checked)."""

    trust_domain: str
    namespace: str
    service_account: str

    def __post_init__(self) -> None:
        check_trust_domain(self.trust_domain)
        check_namespace(self.namespace)
        check_service_account(self.service_account)

    @property
    def uri(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @property
    def account(self) -> str:
        """`ns/sa`, the form CA_TRUSTED_NODE_ACCOUNTS lists."""
        return f"{self.namespace}/{self.service_account}"

    def __str__(self) -> str:
        return self.uri

    @staticmethod
    def parse(uri: str) -> Identity:
        """Parse a SPIFFE URI; raises ValueError when it is not Istio-shaped or not valid."""
        return _parse(uri)

    @classmethod
    def from_username(cls, username: str, trust_domain: str) -> Identity:
        """From a Kubernetes user name `system:serviceaccount:NS:SA`; ValueError otherwise."""
        match = _SERVICE_ACCOUNT_USER.fullmatch(username)
        if match is None:
            raise ValueError(f"{_shown(username)} is not a service account")
        try:
            return cls(trust_domain, *match.groups())
        except ValueError as error:
            raise ValueError(f"{_shown(username)}: {error}") from None


@functools.lru_cache(maxsize=REMEMBERED)
def _parse(uri: str) -> Identity:
    match = _SPIFFE.fullmatch(uri)
    if match is None:
        raise ValueError(
            f"not a SPIFFE identity of the form spiffe://TD/ns/NS/sa/SA: {_shown(uri)}"
        )
    try:
        return Identity(*match.groups())
    except ValueError as error:
        raise ValueError(f"invalid SPIFFE identity {_shown(uri)}: {error}") from None


def check_account(account: str) -> tuple[str, str]:
    """`ns/sa` (CA_TRUSTED_NODE_ACCOUNTS) as (namespace, service account); ValueError otherwise."""
    namespace, slash, service_account = account.partition("/")
    if not slash or "/" in service_account:
        raise ValueError(f"{_shown(account)} is not ns/sa")
    return check_namespace(namespace), check_service_account(service_account)
