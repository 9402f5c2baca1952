"""`pilot agent ... proxy sidecar`: the injected istio-proxy container's command, run as a
kubelet runs it.

A pod (tests/support/pods) runs `pilot discovery` on a registry file; the agent runs as
uid 1337 with only the environment an injected pod gives it (the downward API's names,
CA_ADDR-style settings, PATH; no HOME), Envoy found on PATH, in a mount namespace whose
root filesystem is read-only but for its volumes, each made as a kubelet makes an
emptyDir: root's, 0777. The agent serves SDS from a 0700 directory of its own inside
the socket's volume, the bootstrap it writes points Envoy there, Envoy gets pilot's
clusters and answers readiness on 15021; SIGTERM stops Envoy and the agent exits 0.

Missing or hostile: no Envoy on PATH and no --binary-path is one line and exit 2,
before anything is written.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.integration.agent_process import PILOT
from tests.integration.cart_sidecar import TOKEN, get_from
from tests.integration.sidecar_support import (
    PROXY_UID,
    check_proxy_can_run,
    envoy_pid,
    pilot_in_pod,
)
from tests.support.envoy_process import find_envoy_binary, wait_until
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pod_process import PodProcess, running_in
from tests.support.pods import Pod, leftovers, pod_network

CLUSTER = "outbound|80||reviews.default.svc.cluster.local"
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


@dataclass
class Sidecar:
    pod: Pod
    volumes: PodVolumes
    agent: PodProcess


@asynccontextmanager
async def injected_sidecar(folder: Path) -> AsyncIterator[Sidecar]:
    async with pod_network(["a"]) as network:
        a = network["a"]
        mesh = folder / "mesh.yaml"
        write_mesh(mesh, simple_mesh({"reviews": ["198.18.0.9"]}))
        async with pilot_in_pod(
            a, folder, mesh, {TOKEN: "system:serviceaccount:shop:cart"}
        ) as pilot:
            with kubelet_volumes(pilot.root_pem.decode()) as volumes:
                argv = read_only_root(volumes, proxy_argv(volumes, f"localhost:{pilot.tls_port}"))
                env = injected_env(volumes, a.address)
                async with running_in(a, argv, "started Envoy", env=env) as agent:
                    yield Sidecar(a, volumes, agent)
    assert leftovers(network) == []


def _exists(path: Path) -> bool:
    return path.exists()


def _check_the_written_layout(volumes: PodVolumes, envoy: int) -> None:
    """Envoy from PATH; the socket in a 0700 directory of the agent's inside the 0777
    emptyDir; the bootstrap, in its own emptyDir, pointing Envoy at that socket."""
    command = Path(f"/proc/{envoy}/cmdline").read_bytes().split(b"\0")
    assert command[0] == str(volumes["bin"] / "envoy").encode(), "Envoy was not the one on PATH"
    private = volumes["workload-socket"] / "agent"
    info = private.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (PROXY_UID, 0o700)
    assert stat.S_IMODE(volumes["workload-socket"].stat().st_mode) == 0o777
    assert stat.S_ISSOCK((private / "socket").stat().st_mode)
    bootstrap = json.loads((volumes["istio-envoy"] / "envoy-rev.json").read_text())
    [sds] = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "sds-grpc"]
    [endpoint] = sds["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"]["pipe"]["path"] == str(private / "socket")


async def test_the_injected_command_runs_envoy_from_path_with_its_socket_in_the_emptydir(
    tmp_path: Path,
) -> None:
    async with injected_sidecar(tmp_path) as sidecar:
        a, volumes, agent = sidecar.pod, sidecar.volumes, sidecar.agent
        await wait_until(
            lambda: get_from(a, f"http://{a.address}:15021/healthz/ready"),
            30,
            "readiness on 15021",
            until=lambda answer: answer[0] == 200,
        )
        _, clusters = await get_from(a, "http://127.0.0.1:15000/clusters")
        assert CLUSTER in clusters
        pid = envoy_pid(agent)
        _check_the_written_layout(volumes, pid)
        assert await agent.stop() == 0, agent.tail()
        assert not _exists(Path(f"/proc/{pid}")), "Envoy outlived the agent"
        assert not _exists(volumes["workload-socket"] / "agent" / "socket")
    assert not any("Traceback" in line for line in agent.lines), agent.tail()


def test_no_envoy_on_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with kubelet_volumes("unused") as volumes:
        (volumes["bin"] / "envoy").unlink()
        env = injected_env(volumes, "198.18.0.2") | {"PATH": f"{volumes['bin']}:/nonexistent"}
        result = subprocess.run(
            proxy_argv(volumes, "localhost:15012"),
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert os.listdir(volumes["workload-socket"]) == []
        assert os.listdir(volumes["istio-envoy"]) == []
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "pilot: error: no `envoy` on PATH: install Envoy there or name it with --binary-path"
    ]
