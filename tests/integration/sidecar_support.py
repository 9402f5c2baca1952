"""A sidecar in a pod, as the tests set one up: the agent's folder, environment and command.

`agent_folder` is the agent's working directory with the service-account token and
pilot's root where the agent's defaults look (owned by Envoy's user when asked, since
the agent runs as uid 1337); `sidecar_env` is the pod's environment (Kubernetes'
downward API: namespace, service account, pod name, IP); `agent_argv` is `pilot agent
--binary-path ENVOY` dialling pilot's TLS port, after `check_proxy_can_run` has said
plainly when uid 1337 cannot read the checkout or the virtual environment;
`pilot_in_pod` is `pilot discovery` in a pod on a registry file, its xDS streams
proven by kube-apiserver-style static tokens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pilot.agent.sds_agent import DEFAULT_ROOT_CERT
from tests.integration.agent_process import PILOT
from tests.support.ca import write_plugged_in
from tests.support.envoy_process import find_envoy_binary
from tests.support.pilot_process import (
    PilotProcess,
    discovery_command,
    pilot_environment,
    start_command,
)
from tests.support.pod_process import PodProcess
from tests.support.pods import Pod

PROXY_UID = 1337
TOKEN_FILE = "./var/run/secrets/tokens/istio-token"
_INHERITED_PREFIXES = ("PILOT_", "CA_", "SECRET_", "KUBECONFIG", "POD_", "SERVICE_ACCOUNT")
_STARTED = re.compile(r"started Envoy \(pid (\d+), uid (\d+)\)")


@dataclass(frozen=True)
class Workload:
    """Who a pod is: what Kubernetes' downward API tells its agent."""

    namespace: str
    service_account: str
    pod_name: str

    @property
    def spiffe_id(self) -> str:
        return f"spiffe://cluster.local/ns/{self.namespace}/sa/{self.service_account}"


def sidecar_env(ip: str, workload: Workload, **extra: str) -> dict[str, str]:
    """The agent's environment in a pod at `ip`: none of the shell's own settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    return env | {
        "POD_NAMESPACE": workload.namespace,
        "SERVICE_ACCOUNT": workload.service_account,
        "POD_NAME": workload.pod_name,
        "INSTANCE_IP": ip,
        "CA_TOKEN_FILE": TOKEN_FILE,
        **extra,
    }


@contextmanager
def agent_folder(root_pem: str, token: str, owner: int | None = None) -> Iterator[Path]:
    """The agent's working directory: token and root where its defaults look, owned by it."""
    folder = Path(tempfile.mkdtemp(prefix="sidecar-"))
    try:
        for relative, content in ((TOKEN_FILE, token), (str(DEFAULT_ROOT_CERT), root_pem)):
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        (folder / TOKEN_FILE).chmod(0o600)
        if owner is not None:
            for path in (folder, *folder.rglob("*")):
                os.chown(path, owner, owner)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_proxy_can_run(*paths: str) -> None:
    """uid 1337 runs the agent and Envoy from this virtual environment: say so plainly when
    a directory above it is closed to others (a venv under `mktemp -d`, mode 0700)."""
    for path in paths:
        probe = ["setpriv", f"--reuid={PROXY_UID}", f"--regid={PROXY_UID}", "--clear-groups"]
        done = subprocess.run([*probe, "--", "test", "-r", path], check=False, timeout=10)
        if done.returncode != 0:
            pytest.fail(
                f"uid {PROXY_UID} cannot read {path}: the virtual environment and the"
                " checkout must be readable by others (`.ci/run` makes its venv's directory"
                " 0755)"
            )


def agent_argv(discovery_address: str) -> list[str]:
    """`pilot agent` starting Envoy, its ADS and CA at pilot's TLS address."""
    check_proxy_can_run(str(PILOT), find_envoy_binary())
    return [
        str(PILOT), "agent",
        "--discovery-address", discovery_address,
        "--binary-path", find_envoy_binary(),
    ]  # fmt: skip


def envoy_pid(agent: PodProcess) -> int:
    """The pid of the Envoy the agent says it started (failing, with the agent's last
    lines, if that Envoy is already gone)."""
    match = next(m for line in agent.lines if (m := _STARTED.search(line)))
    pid = int(match[1])
    if not Path(f"/proc/{pid}").exists():
        pytest.fail(f"the agent's Envoy (pid {pid}) is gone; {agent.tail()}")
    return pid


@asynccontextmanager
async def pilot_in_pod(
    pod: Pod, folder: Path, mesh: Path, tokens: Mapping[str, str]
) -> AsyncIterator[PilotProcess]:
    """`pilot discovery` in `pod` on the registry file `mesh`, with a CA of its own;
    `tokens` maps each token to the user it proves (`system:serviceaccount:NS:SA`)."""
    ca = write_plugged_in(folder / "plugged-in-ca")
    token_file = folder / "tokens.csv"
    token_file.write_text("".join(f"{token},{user}\n" for token, user in tokens.items()))
    token_file.chmod(0o600)
    source = [
        "--config",
        str(mesh),
        "--xds-auth",
        "kubernetes",
        "--token-auth-file",
        str(token_file),
    ]
    command = pod.command(*discovery_command(folder, source, ca.directory))
    root = ca.root.cert_pem.encode()
    pilot = await start_command(folder, command, env=pilot_environment(folder), root_pem=root)
    try:
        yield pilot
    finally:
        await pilot.stop()
