"""How far pilot trusts a remote cluster's kubeconfig, and how much of them it takes.

Read without loading kubernetes-asyncio (see `config.py`). A remote kubeconfig
(a multi-cluster Secret's value, or a `--remote-kubeconfig` file) is data: by
default only inline credentials are used. `PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS`
(Istio's setting) lists what the operator allows beyond that;
`--refuse-insecure-skip-tls-verify` refuses kubeconfigs that skip verifying their
API server (Istio uses them silently; pilot warns).
"""

from __future__ import annotations

from dataclasses import dataclass

# The options an operator may allow, by the name Istio's setting uses, and what each lets
# a kubeconfig do. Everything else (username/password, proxy-url, unknown auth) is refused.
INSECURE_OPTIONS = {
    "tokenFile": "read a bearer token from a local file",
    "clientCertificate": "read a client certificate from a local file",
    "clientKey": "read a client key from a local file",
    "certificateAuthority": "read CA certificates from a local file",
    "exec": "run a credential plugin program",
    "authProvider": "use an auth provider (OIDC, gcp, azure: may fetch URLs it names)",
}


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """Bounds on remote clusters and the kubeconfig options the operator allows."""

    insecure_options: frozenset[str] = frozenset()  # PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS
    max_clusters: int = 100  # PILOT_MAX_REMOTE_CLUSTERS: remote clusters at once, all sources
    max_kubeconfig_bytes: int = 64 * 1024  # PILOT_MAX_REMOTE_KUBECONFIG_BYTES: one value
    max_secret_bytes: int = 1024 * 1024  # PILOT_MAX_REMOTE_SECRET_BYTES: one Secret's data
    start_timeout: float = 10.0  # PILOT_REMOTE_CLUSTER_START_TIMEOUT: one client's own steps
    # --refuse-insecure-skip-tls-verify: a kubeconfig that skips verifying its API server's
    # certificate is refused (by default it is used, with a warning naming the cluster).
    refuse_insecure_skip_tls_verify: bool = False
