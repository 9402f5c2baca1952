"""Finding and reaching the Kubernetes API server the way kubectl users expect.

Order: `--kubeconfig PATH`, else `$KUBECONFIG`, else the in-cluster service
account, else `~/.kube/config`. Failing to find or reach a cluster is a
`KubernetesUnavailable` with a one-line reason, not a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from pilot.kube.api_client import API_FAILED, BoundedApiClient
from pilot.kube.config import KubernetesUnavailable

IN_CLUSTER_HOST_ENV = "KUBERNETES_SERVICE_HOST"
DEFAULT_KUBECONFIG = Path("~/.kube/config")
CONNECT_TIMEOUT = 10.0
_UNUSABLE = (ConfigException, OSError, yaml.YAMLError, TypeError, ValueError, AttributeError)


def _kubeconfig_path(flag: Path | None) -> tuple[Path | None, str]:
    """The kubeconfig named by --kubeconfig or $KUBECONFIG, and which of them named it."""
    if flag is not None:
        return flag, "--kubeconfig"
    from_env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return (Path(from_env), "KUBECONFIG") if from_env else (None, "")


def _is_file(path: Path) -> bool:
    return path.is_file()


def _default_kubeconfig() -> Path:
    return DEFAULT_KUBECONFIG.expanduser()


def _nothing_found(default: Path) -> KubernetesUnavailable:
    """Where pilot looked, and the two ways to give it something to serve."""
    return KubernetesUnavailable(
        f"no Kubernetes cluster to watch: no --kubeconfig, KUBECONFIG is unset, not in a"
        f" cluster (no ${IN_CLUSTER_HOST_ENV}) and no {default}; point pilot at a cluster"
        " with --kubeconfig PATH, or serve a registry file with --config PATH"
    )


async def _configure(kubeconfig: Path | None) -> tuple[client.Configuration, str]:
    configuration = client.Configuration()
    path, named_by = _kubeconfig_path(kubeconfig)
    if path is not None and not _is_file(path):
        raise KubernetesUnavailable(f"{named_by} {path}: no such kubeconfig file")
    default = _default_kubeconfig()
    in_cluster = path is None and bool(os.environ.get(IN_CLUSTER_HOST_ENV))
    if path is None and not in_cluster and not _is_file(default):
        raise _nothing_found(default)
    try:
        if path is not None:
            await config.load_kube_config(str(path), client_configuration=configuration)
            return configuration, f"kubeconfig {path}"
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration, "in-cluster service account"
        await config.load_kube_config(str(default), client_configuration=configuration)
        return configuration, f"kubeconfig {default}"
    # kubernetes_asyncio reads a malformed file (empty, a list, broken YAML) with
    # whatever error its code meets first: each means this file is no kubeconfig.
    except _UNUSABLE as error:
        where = f"{named_by} {path}" if path else ("in-cluster config" if in_cluster else default)
        raise KubernetesUnavailable(
            f"no usable Kubernetes configuration in {where}: {_one_line(error)}"
        ) from error


def _one_line(error: Exception) -> str:
    if isinstance(error, (TypeError, AttributeError)):  # the loader met no mapping
        return "not a kubeconfig (empty, or not a mapping of clusters, contexts and users)"
    return " ".join(str(error).split())


async def connect(kubeconfig: Path | None) -> tuple[client.ApiClient, str]:
    """An API client for the configured cluster, checked to answer `/version`."""
    configuration, source = await _configure(kubeconfig)
    api_client = BoundedApiClient(configuration)
    try:
        await client.VersionApi(api_client).get_code(
            _request_timeout=(CONNECT_TIMEOUT, CONNECT_TIMEOUT)
        )
    except API_FAILED as error:
        await api_client.close()
        reason = getattr(error, "reason", None) or error
        raise KubernetesUnavailable(
            f"cannot reach the Kubernetes API server at {configuration.host} ({source}): {reason}"
        ) from error
    return api_client, f"{configuration.host} ({source})"
