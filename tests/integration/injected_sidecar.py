"""The injected istio-proxy container as a kubelet runs it, for the tests that run one.

`kubelet_volumes` lays a pod's volumes out on the host as a kubelet does (emptyDirs
root's and 0777, the projected token readable by fsGroup 1337 only, the root
certificate's ConfigMap, and a `bin` with Envoy on the proxy image's PATH);
`injected_env` is all the environment the container gets (no HOME); `proxy_argv` is the
injected command with the volumes where they are here; `read_only_root` runs it as
uid 1337 in a mount namespace whose root filesystem is read-only but for the emptyDirs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.integration.agent_process import PILOT
from tests.integration.cart_sidecar import TOKEN
from tests.integration.sidecar_support import PROXY_UID, check_proxy_can_run
from tests.support.envoy_process import find_envoy_binary

VOLUMES = ("workload-socket", "istio-envoy", "istio-data")  # emptyDirs the agent writes


@dataclass(frozen=True)
class PodVolumes:
    """A pod's volumes on the host, as a kubelet lays them out."""

    root: Path

    def __getitem__(self, name: str) -> Path:
        return self.root / name

    @property
    def token(self) -> Path:
        return self["istio-token"] / "istio-token"

    @property
    def root_cert(self) -> Path:
        return self["istiod-ca-cert"] / "root-cert.pem"

    @property
    def path(self) -> str:
        """PATH with Envoy on it, as the proxy image's."""
        return f"{self['bin']}:/usr/local/bin:/usr/bin:/bin"


@contextmanager
def kubelet_volumes(root_pem: str) -> Iterator[PodVolumes]:
    """emptyDirs 0777 and root's; the token readable by fsGroup 1337 only; the root cert."""
    volumes = PodVolumes(Path(tempfile.mkdtemp(prefix="kubelet-pod-")))
    try:
        volumes.root.chmod(0o755)
        for name in VOLUMES:
            volumes[name].mkdir()
            volumes[name].chmod(0o777)  # as kubelet's emptyDir, whatever the umask
        for name in ("istio-token", "istiod-ca-cert", "bin"):
            volumes[name].mkdir(mode=0o755)
        volumes.token.write_text(TOKEN)
        os.chown(volumes.token, 0, PROXY_UID)
        volumes.token.chmod(0o640)
        volumes.root_cert.write_text(root_pem)
        (volumes["bin"] / "envoy").symlink_to(find_envoy_binary())
        yield volumes
    finally:
        shutil.rmtree(volumes.root, ignore_errors=True)


def injected_env(volumes: PodVolumes, ip: str) -> dict[str, str]:
    """Only what an injected pod's container gets (no HOME): `env -i` plus these."""
    return {
        "PATH": volumes.path,
        "POD_NAME": "cart-7d4f9-x2x1z",
        "POD_NAMESPACE": "shop",
        "INSTANCE_IP": ip,
        "SERVICE_ACCOUNT": "cart",
        "HOST_IP": ip,
        "ISTIO_META_INTERCEPTION_MODE": "REDIRECT",
        "ISTIO_META_CLUSTER_ID": "Kubernetes",
        "ISTIO_META_POD_PORTS": '[{"name":"http","containerPort":9080,"protocol":"TCP"}]',
        "ISTIO_META_APP_CONTAINERS": "cart",
        "ISTIO_META_NODE_NAME": "node-1",
        "ISTIO_META_WORKLOAD_NAME": "cart",
        "ISTIO_META_OWNER": "kubernetes://apis/apps/v1/namespaces/shop/deployments/cart",
        "ISTIO_META_MESH_ID": "cluster.local",
        "TRUST_DOMAIN": "cluster.local",
        "CA_TOKEN_FILE": str(volumes.token),
        "CA_ROOT_CERT": str(volumes.root_cert),
        "PROXY_CONFIG": "{}",
    }


def read_only_root(volumes: PodVolumes, argv: Sequence[str]) -> list[str]:
    """`argv` as uid 1337 in a mount namespace where / is read-only, the emptyDirs not."""
    binds = "".join(f"mount --bind {shlex.quote(str(volumes[n]))} {shlex.quote(str(volumes[n]))}; "
                    for n in VOLUMES)  # fmt: skip
    as_proxy = ["setpriv", f"--reuid={PROXY_UID}", f"--regid={PROXY_UID}", "--clear-groups", "--"]
    script = f"set -e; {binds}mount -o remount,bind,ro /; exec {shlex.join([*as_proxy, *argv])}"
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]


def proxy_argv(volumes: PodVolumes, discovery_address: str) -> list[str]:
    """The injected container's command and args, with the volumes where they are here."""
    check_proxy_can_run(str(PILOT), find_envoy_binary())
    return [
        str(PILOT), "agent",
        "--discovery-address", discovery_address,
        "--sds-socket", str(volumes["workload-socket"] / "socket"),
        "--config-path", str(volumes["istio-envoy"]),
        "--proxy-log-level", "warning",
        "--concurrency", "2",
        "proxy", "sidecar",
    ]  # fmt: skip
