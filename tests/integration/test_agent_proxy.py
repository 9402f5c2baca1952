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
import stat
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.integration.cart_sidecar import TOKEN, get_from
from tests.integration.injected_sidecar import (
    PodVolumes,
    injected_env,
    kubelet_volumes,
    proxy_argv,
    read_only_root,
)
from tests.integration.sidecar_support import PROXY_UID, envoy_pid, pilot_in_pod
from tests.support.envoy_process import wait_until
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pod_process import PodProcess, running_in
from tests.support.pods import Pod, leftovers, pod_network

CLUSTER = "outbound|80||reviews.default.svc.cluster.local"


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
