"""Finding and reaching the Kubernetes API server the way kubectl users expect.

Order: `--kubeconfig PATH`, else `$KUBECONFIG`, else the in-cluster service
account, else `~/.kube/config`. Failing to find or reach a cluster is a
`KubernetesUnavailable` with a one-line reason, not a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from pilot.sources.kubernetes.config import KubernetesUnavailable

IN_CLUSTER_HOST_ENV = "KUBERNETES_SERVICE_HOST"
DEFAULT_KUBECONFIG = Path("~/.kube/config")
CONNECT_TIMEOUT = 10.0


def _kubeconfig_path(flag: Path | None) -> Path | None:
    if flag is not None:
        return flag
    from_env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return Path(from_env) if from_env else None


def _is_file(path: Path) -> bool:
    return path.is_file()


def _default_kubeconfig() -> Path:
    return DEFAULT_KUBECONFIG.expanduser()


async def _configure(kubeconfig: Path | None) -> tuple[client.Configuration, str]:
    configuration = client.Configuration()
    path = _kubeconfig_path(kubeconfig)
    if path is not None and not _is_file(path):
        raise KubernetesUnavailable(f"kubeconfig {path} does not exist")
    try:
        if path is not None:
            await config.load_kube_config(str(path), client_configuration=configuration)
            return configuration, f"kubeconfig {path}"
        if os.environ.get(IN_CLUSTER_HOST_ENV):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration, "in-cluster service account"
        default = _default_kubeconfig()
        await config.load_kube_config(str(default), client_configuration=configuration)
        return configuration, f"kubeconfig {default}"
    except (ConfigException, OSError) as error:
        where = path or "in-cluster config or ~/.kube/config"
        raise KubernetesUnavailable(
            f"no usable Kubernetes configuration ({where}): {error}"
        ) from error


async def connect(kubeconfig: Path | None) -> tuple[client.ApiClient, str]:
    """An API client for the configured cluster, checked to answer `/version`."""
    configuration, source = await _configure(kubeconfig)
    api_client = client.ApiClient(configuration)
    try:
        await client.VersionApi(api_client).get_code(
            _request_timeout=(CONNECT_TIMEOUT, CONNECT_TIMEOUT)
        )
    except (aiohttp.ClientError, TimeoutError, client.ApiException) as error:
        await api_client.close()
        reason = getattr(error, "reason", None) or error
        raise KubernetesUnavailable(
            f"cannot reach the Kubernetes API server at {configuration.host} ({source}): {reason}"
        ) from error
    return api_client, f"{configuration.host} ({source})"
