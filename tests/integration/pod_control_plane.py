"""Starting pilot and a sidecar in network-namespace pods: what the pod harnesses share.

`start_pilot`: `pilot discovery` in the istiod pod, serving gRPC over TLS with a
plugged-in CA, from the config `source` flags a harness gives (a registry file and
tokens, or a kubeconfig). `start_sidecar`: the capture rules (the init step, as root),
then `pilot agent` as uid 1337 starting Envoy for a workload with its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from tests.integration.agent_process import PILOT
from tests.integration.sidecar_support import (
    PROXY_UID,
    Workload,
    agent_argv,
    agent_folder,
    sidecar_env,
)
from tests.support.ca import write_plugged_in
from tests.support.pilot_process import (
    PilotProcess,
    discovery_command,
    pilot_environment,
    start_command,
)
from tests.support.pod_process import PodProcess, running_in
from tests.support.pods import Pod

PILOT_HOST = "pilot.istio-system.svc"
PILOT_TLS_PORT = 15012


async def start_pilot(
    stack: AsyncExitStack,
    pod: Pod,
    folder: Path,
    source: Sequence[str],
    settings: dict[str, str] | None = None,
) -> PilotProcess:
    """`pilot discovery` in `pod`, stopped when `stack` closes; `settings`: environment."""
    ca = write_plugged_in(folder / "plugged-in-ca")
    tls = ["--grpc-tls-addr", f"{pod.address}:{PILOT_TLS_PORT}"]
    command = pod.command(*discovery_command(folder, list(source), ca.directory, *tls))
    env = pilot_environment(folder, {"POD_NAMESPACE": "istio-system"} | (settings or {}))
    pilot = await start_command(folder, command, env=env, root_pem=ca.root.cert_pem.encode())
    stack.push_async_callback(pilot.stop)
    return pilot


async def start_sidecar(
    stack: AsyncExitStack, pod: Pod, workload: Workload, pilot: PilotProcess, token: str
) -> PodProcess:
    """Capture rules first (the init step, as root), then the agent as uid 1337 (returned,
    once it started Envoy)."""
    status, _, err = await pod.run(str(PILOT), "agent", "iptables")
    assert status == 0, f"pilot agent iptables in pod {pod.name}: {err.strip()[:500]}"
    folder = stack.enter_context(agent_folder(pilot.root_pem.decode(), token, owner=PROXY_UID))
    env = sidecar_env(pod.address, workload)
    argv = agent_argv(f"{PILOT_HOST}:{PILOT_TLS_PORT}")
    return await stack.enter_async_context(
        running_in(pod, argv, "started Envoy", uid=PROXY_UID, cwd=folder, env=env)
    )
