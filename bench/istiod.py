"""Istio's istiod (`pilot-discovery`) as a server of the sidecar bench, on the real API server.

`build` runs tools/istiod/build (istiod from the istio.io/istio module its
go.mod pins: built once per machine, minutes; then a cache hit) and gives the
binary's folder. `start` runs it as tools/istiod/README.md says, on the API
server pilot used: its namespace `istio-system` made first (its CA's Secret
lives there), no webhook configurations to patch, every listener on
127.0.0.1, a mesh config file (`trustDomain: cluster.local`), Istio's
defaults for everything else, debounce included (PILOT_DEBOUNCE_AFTER 100ms,
PILOT_DEBOUNCE_MAX 10s, EDS debounced too); ready once `/ready` answers 200.
The sidecars speak to its plaintext xDS port (`--grpcAddr`).
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import wire
from bench.procs import ROOT, Child
from bench.run import Run, wait_ready
from bench.sidecar_mesh import TCP_PORT, Addition, Obj, SidecarMesh
from tests.cluster.client import Kube
from tests.cluster.control_plane import KUBERNETES_SERVICE_IP, ControlPlane, free_port

BUILD = ROOT / "tools" / "istiod" / "build"
GO_ARCHIVE_BIN = "/usr/local/go/bin"  # where Go's own archive installs (as .ci/run says)
NAMESPACE = "istio-system"
MESH_CONFIG = "trustDomain: cluster.local\n"
_PEER = re.compile(r'"[0-9.]+:[0-9]+"')  # a client's address in a log line: one kind of line
RETRIES = 1000  # per sidecar stream: Envoy retries without end


async def build() -> Path:
    """tools/istiod/build's folder (pilot-discovery, istio-crds.yaml); RuntimeError if it
    fails. Its own output goes to stderr."""
    path = os.environ.get("PATH", "")
    if shutil.which("go") is None:
        path = f"{path}:{GO_ARCHIVE_BIN}"
    process = await asyncio.create_subprocess_exec(
        str(BUILD), stdout=asyncio.subprocess.PIPE, env={**os.environ, "PATH": path}
    )
    out, _ = await process.communicate()
    lines = out.decode(errors="replace").splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"tools/istiod/build failed (exit {process.returncode}); see above")
    return Path(lines[-1])


async def start(
    run: Run, plane: ControlPlane, kube: Kube, binaries: Path, more_env: dict[str, str]
) -> tuple[Child, str, int]:
    """istiod on the plane, once /ready: it, its plaintext xDS address, its HTTP port.
    `more_env`: its environment over Istio's defaults (none by default)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    await kube.create(namespace)
    mesh = run.workdir / "istiod-mesh.yaml"
    mesh.write_text(MESH_CONFIG)
    grpc, http = free_port(), free_port()
    argv = [
        str(binaries / "pilot-discovery"), "discovery",
        "--kubeconfig", str(plane.admin_kubeconfig),
        "--meshConfig", str(mesh),
        "--networksConfig", str(run.workdir / "no-networks.yaml"),  # none: no file there
        "--grpcAddr", f"127.0.0.1:{grpc}",
        "--secureGRPCAddr", f"127.0.0.1:{free_port()}",  # never blank: see the README
        "--monitoringAddr", f"127.0.0.1:{free_port()}",
        "--httpAddr", f"127.0.0.1:{http}",
        "--httpsAddr", f"127.0.0.1:{free_port()}",
        "--ctrlz_port", str(free_port()),
    ]  # fmt: skip
    env = {
        "POD_NAMESPACE": NAMESPACE,
        "POD_NAME": "istiod-bench",
        "VALIDATION_WEBHOOK_CONFIG_NAME": "",
        "INJECTION_WEBHOOK_CONFIG_NAME": "",
        **more_env,
    }
    child = await run.spawn("istiod", argv, env=env, cwd=run.workdir)
    async with run.within("istiod's /ready"):
        if await wait_ready(child, f"http://127.0.0.1:{http}/ready"):
            return child, f"127.0.0.1:{grpc}", http
    raise RuntimeError(f"istiod exited early:\n{child.log_tail()}")


# What istiod sends every sidecar for a service added (seen in a small run of this bench):
# the service's two clusters and their assignments, route configuration 80, and, not
# incrementally, every listener the sidecar has and the clusters that are no Service's.
STATIC_CLUSTERS = ("BlackHoleCluster", "PassthroughCluster", "InboundPassthroughCluster")
INBOUND_HTTP = "inbound|8080||"  # every sidecar's Pod serves 8080 (its Services' HTTP target)
FIXED_LISTENERS = ("0.0.0.0_80", "virtualOutbound", "virtualInbound")
# The API server's own `kubernetes` Service (port 443, TLS: a TCP listener of its own).
KUBERNETES_LISTENER = f"{KUBERNETES_SERVICE_IP}_443"


@dataclass(frozen=True)
class IstiodAddition:
    """A service added, as istiod pushes it: what every sidecar is sent for it."""

    addition: Addition
    listeners: frozenset[str]  # every listener a sidecar holds once the service is in

    @property
    def label(self) -> str:
        return self.addition.label

    @property
    def slice(self) -> Obj:
        return self.addition.slice

    @property
    def service(self) -> Obj:
        return self.addition.service

    @property
    def expected(self) -> frozenset[tuple[str, str]]:
        clusters = [*STATIC_CLUSTERS, INBOUND_HTTP]
        return (
            self.addition.expected
            | {(wire.CLUSTER, name) for name in clusters}
            | {(wire.LISTENER, name) for name in self.listeners}
        )


def additions(mesh: SidecarMesh, added: Sequence[Addition]) -> list[IstiodAddition]:
    """The services added, in turn, on the mesh as istiod has it (without those added
    before it started)."""
    tcp = TCP_PORT[1]
    listeners = {*FIXED_LISTENERS, KUBERNETES_LISTENER}
    listeners |= {f"{address}_{tcp}" for address in mesh.tcp_cluster_ips()}
    found = []
    for addition in added:
        listeners.add(f"{addition.cluster_ip}_{tcp}")
        found.append(IstiodAddition(addition, frozenset(listeners)))
    return found


def log_summary(log: Path) -> str:
    """How many lines istiod logged at error and at warn level (its text format)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "istiod's log: not found"
    errors = sum("\terror\t" in line for line in lines)
    warnings = collections.Counter(
        _PEER.sub('"PEER"', line.split("\twarn\t", 1)[1])[:70]
        for line in lines
        if "\twarn\t" in line
    )
    common = "; ".join(f"{n} x {text!r}" for text, n in warnings.most_common(3))
    return (
        f"istiod's log: {errors} lines at error, {sum(warnings.values())} at warn"
        f"{': ' + common if common else ''}"
    )
