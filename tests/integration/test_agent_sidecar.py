"""`pilot agent --binary-path` brings a sidecar up; `pilot agent bootstrap` prints its bootstrap.

The bootstrap is what `pilot agent bootstrap` prints, run as a user runs it, and the
real Envoy accepts it (`envoy --mode validate`). Then a pod (tests/support/pods: a
network namespace of its own, so Istio's fixed ports 15000/15021/15090 are the pod's)
runs `pilot discovery` on a registry file, its xDS streams authenticated by token
(`--xds-auth kubernetes --token-auth-file`), and the agent as Envoy's user, uid 1337
(`setpriv`, as a pod's runAsUser), with `--binary-path`: Envoy starts as the agent's
child and uid 1337, dials pilot's TLS port verified with the root, presents the
token from CA_TOKEN_FILE (without it pilot would refuse the stream) and gets its
clusters; 15021 answers readiness and 15090 Prometheus on the pod's address, the
admin API only on loopback. SIGTERM stops Envoy and the agent (exit 0); an Envoy
that dies on its own takes the agent with it (exit 1).

Hostile input: names that are not names (a `~` or a newline in POD_NAME would forge
the node id), an IP that is not one, and a root agent starting Envoy with capture on
are each refused in one line, before anything starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pilot.security.certs import cert_pem, self_signed_root
from tests.integration.agent_process import PILOT
from tests.integration.cart_sidecar import (
    TOKEN,
    agent_argv_to,
    cart_agent_folder,
    get_from,
    pod_env,
)
from tests.integration.sidecar_support import (
    PROXY_UID,
    TOKEN_FILE,
    envoy_pid,
    pilot_in_pod,
)
from tests.support.envoy_process import find_envoy_binary, validate_bootstrap, wait_until
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot_process import PilotProcess
from tests.support.pod_process import PodProcess, running_in
from tests.support.pods import Pod, leftovers, pod_network

CLUSTER = "outbound|80||reviews.default.svc.cluster.local"


def _bootstrap_command(folder: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PILOT), "agent", "--discovery-address", "localhost:15012", "bootstrap"],
        cwd=folder,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _other_root() -> str:
    return cert_pem(self_signed_root("cluster.local")[1])


def test_envoy_accepts_the_bootstrap_the_agent_prints(tmp_path: Path) -> None:
    with cart_agent_folder(_other_root()) as folder:
        result = _bootstrap_command(folder, pod_env("198.18.0.2"))
        assert result.returncode == 0, result.stderr
        bootstrap = json.loads(result.stdout)
        path = tmp_path / "envoy-rev.json"
        path.write_text(result.stdout)
        validate_bootstrap(path)
    node = bootstrap["node"]
    assert node["id"] == "sidecar~198.18.0.2~cart-7d4f9-x2x1z.shop~shop.svc.cluster.local"
    assert node["metadata"]["NAMESPACE"] == "shop"
    assert node["metadata"]["SERVICE_ACCOUNT"] == "cart"
    assert node["metadata"]["INTERCEPTION_MODE"] == "REDIRECT"
    dynamic = bootstrap["dynamic_resources"]
    assert dynamic["cds_config"]["ads"] == {} and dynamic["lds_config"]["ads"] == {}
    # Istio's: no timeout on the first clusters and listeners, so LIVE means pilot's are there.
    assert dynamic["cds_config"]["initial_fetch_timeout"] == "0s"
    assert dynamic["lds_config"]["initial_fetch_timeout"] == "0s"
    assert TOKEN not in result.stdout, "the token was copied into the bootstrap"
    assert str(folder / TOKEN_FILE)[2:] in result.stdout.replace("/./", "/")
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_istio_meta_variables_become_node_metadata_bounded(tmp_path: Path) -> None:
    """Istio's ISTIO_META_NAME=value, as the injector sets them, in the node's metadata;
    pilot's own keys are never replaced, and what is out of bounds is left out with a
    warning that names it (never its value); Envoy accepts the result."""
    pod_ports = '[{"name":"http","containerPort":9080,"protocol":"TCP"}]'
    env = pod_env(
        "198.18.0.2",
        ISTIO_META_CLUSTER_ID="Kubernetes",
        ISTIO_META_POD_PORTS=pod_ports,
        ISTIO_META_OWNER="kubernetes://apis/apps/v1/namespaces/shop/deployments/cart",
        ISTIO_META_NAMESPACE="kube-system",
        ISTIO_META_SERVICE_ACCOUNT="admin",
        ISTIO_META_HUGE="x" * (64 * 1024),
        ISTIO_META_QUOTE='"}, "admin": {"address": "0.0.0.0',
        **{"ISTIO_META_lower-case": "value-never-logged"},
    )
    with cart_agent_folder(_other_root()) as folder:
        result = _bootstrap_command(folder, env)
        assert result.returncode == 0, result.stderr
        path = tmp_path / "envoy-rev.json"
        path.write_text(result.stdout)
        validate_bootstrap(path)
    bootstrap = json.loads(result.stdout)
    metadata = bootstrap["node"]["metadata"]
    assert metadata["CLUSTER_ID"] == "Kubernetes"
    assert json.loads(metadata["POD_PORTS"])[0]["containerPort"] == 9080
    assert metadata["OWNER"].endswith("/deployments/cart")
    assert (metadata["NAMESPACE"], metadata["SERVICE_ACCOUNT"]) == ("shop", "cart")
    assert metadata["QUOTE"] == '"}, "admin": {"address": "0.0.0.0'
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    assert "HUGE" not in metadata and "lower-case" not in metadata
    assert "ISTIO_META_HUGE is over 16384 bytes" in result.stderr
    assert "a name that is not [A-Z0-9_]{1,64}" in result.stderr
    assert "value-never-logged" not in result.stderr and "xxxx" not in result.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"POD_NAME": "cart~1.2.3.4~evil"}, "POD_NAME='cart~1.2.3.4~evil' is not a valid pod name"),
        ({"POD_NAME": "cart\nforged"}, "POD_NAME='cart\\nforged' is not a valid pod name"),
        ({"POD_NAME": ""}, "the sidecar's bootstrap needs POD_NAME (the pod's name)"),
        ({"INSTANCE_IP": "198.18.0.2~x"}, "INSTANCE_IP='198.18.0.2~x' is not an IP address"),
        (
            {"ISTIO_META_INTERCEPTION_MODE": "TPROXY"},
            "ISTIO_META_INTERCEPTION_MODE='TPROXY': one of REDIRECT, NONE",
        ),
    ],
    ids=["tilde", "newline", "missing", "ip", "mode"],
)
def test_names_that_are_not_names_are_refused(override: dict[str, str], message: str) -> None:
    with cart_agent_folder(_other_root()) as folder:
        result = _bootstrap_command(folder, pod_env("198.18.0.2") | override)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"pilot: error: {message}"]


def test_a_root_agent_does_not_start_envoy_with_capture_on() -> None:
    if os.geteuid() != 0:
        pytest.skip(f"the refusal is of root; these tests run as uid {os.geteuid()}")
    with cart_agent_folder(_other_root()) as folder:
        result = subprocess.run(
            [str(PILOT), "agent", "--discovery-address", "localhost:1", "--binary-path",
             find_envoy_binary()],
            cwd=folder, env=pod_env("198.18.0.2"), capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert not (folder / "etc").exists(), "a bootstrap was written"
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("pilot: error: pilot agent runs as root")


def _pilot_in(pod: Pod, folder: Path) -> AbstractAsyncContextManager[PilotProcess]:
    """`pilot discovery` in the pod: a registry file, xDS streams proven by token."""
    mesh = folder / "mesh.yaml"
    write_mesh(mesh, simple_mesh({"reviews": ["198.18.0.9"]}))
    return pilot_in_pod(pod, folder, mesh, {TOKEN: "system:serviceaccount:shop:cart"})


def _ids(pid: int, field: str) -> list[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith(f"{field}:")]
    return [int(value) for value in line.split()[1:]]


def _exists(path: Path) -> bool:
    return path.exists()


@dataclass
class Sidecar:
    """Pod a, pilot inside it, and `pilot agent` (as uid 1337) with the Envoy it started."""

    pod: Pod
    pilot: PilotProcess
    folder: Path
    agent: PodProcess


@asynccontextmanager
async def _sidecar(tmp_path: Path) -> AsyncIterator[Sidecar]:
    """The agent in its pod, once it says it started Envoy; the pod is gone afterwards."""
    async with pod_network(["a"]) as network:
        a = network["a"]
        async with _pilot_in(a, tmp_path) as pilot:
            with cart_agent_folder(pilot.root_pem.decode(), owner=PROXY_UID) as folder:
                env = pod_env(a.address)
                async with running_in(
                    a, agent_argv_to(pilot), "started Envoy", uid=PROXY_UID, cwd=folder, env=env
                ) as agent:
                    yield Sidecar(a, pilot, folder, agent)
    assert leftovers(network) == []


async def test_the_agent_starts_envoy_as_1337_and_envoy_gets_its_clusters_from_pilot(
    tmp_path: Path,
) -> None:
    async with _sidecar(tmp_path) as sidecar:
        a, pilot, folder, agent = sidecar.pod, sidecar.pilot, sidecar.folder, sidecar.agent
        pid = envoy_pid(agent)
        assert _ids(pid, "Uid") == [PROXY_UID] * 4
        assert _ids(pid, "Gid") == [PROXY_UID] * 4
        written = folder / "etc/istio/proxy/envoy-rev.json"
        assert written.stat().st_mode & 0o777 == 0o644
        await wait_until(
            lambda: get_from(a, "http://127.0.0.1:15000/clusters"),
            20,
            f"Envoy to hold {CLUSTER}",
            until=lambda answer: CLUSTER in answer[1],
        )
        await wait_until(
            lambda: get_from(a, f"http://{a.address}:15021/healthz/ready"),
            30,
            "readiness on 15021",
            until=lambda answer: answer[0] == 200,
        )
        # Ready only once pilot's listeners came: Envoy waits for LDS without a timeout.
        _, held = await get_from(a, "http://127.0.0.1:15000/listeners")
        assert "virtualOutbound::0.0.0.0:15001" in held, held
        status, metrics = await get_from(a, f"http://{a.address}:15090/stats/prometheus")
        assert status == 200 and "envoy_cluster_manager" in metrics
        assert (await get_from(a, f"http://{a.address}:15090/clusters"))[0] == 404
        assert (await get_from(a, f"http://{a.address}:15000/ready"))[0] == 0
        # Proven by the token Envoy read from CA_TOKEN_FILE (pilot refuses none).
        node = f"sidecar~{a.address}~cart-7d4f9-x2x1z.shop~shop.svc.cluster.local"
        proven = f"{node} (spiffe://cluster.local/ns/shop/sa/cart) connected"
        assert any(proven in entry["msg"] for entry in pilot.log), pilot.tail()
        code = await agent.stop()
        assert code == 0, agent.tail()
        assert not _exists(Path(f"/proc/{pid}")), "Envoy outlived the agent"
        assert not _exists(folder / "var/run/secrets/workload-spiffe-uds/socket")


async def test_an_envoy_that_dies_takes_the_agent_with_it(tmp_path: Path) -> None:
    async with _sidecar(tmp_path) as sidecar:
        agent = sidecar.agent
        os.kill(envoy_pid(agent), signal.SIGKILL)
        await agent.wait_line("exited with status -9: stopping")
        code = await agent.process.wait()
        assert code == 1, agent.tail()


async def test_envoy_goes_when_the_agent_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the agent no time to stop Envoy: the kernel does (PR_SET_PDEATHSIG)."""
    async with _sidecar(tmp_path) as sidecar:
        pid = envoy_pid(sidecar.agent)
        sidecar.agent.process.kill()
        await sidecar.agent.process.wait()
        await wait_until(lambda: not _exists(Path(f"/proc/{pid}")), 5, "Envoy to go with the agent")
