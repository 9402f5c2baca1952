"""`pilot discovery --kubeconfig` on the real control plane, as pilot's own ServiceAccount.

`start_discovery` runs the real subprocess (tests.support.pilot_process) with a
kubeconfig for pilot-system/pilot under deploy/'s RBAC (`pilot_kubeconfig`, so every
test also proves that RBAC is enough) and the environment its Deployment gives it:
POD_NAMESPACE=pilot-system, where the Lease `pilot-ca` and the Secret `pilot-ca-secret`
live, SERVICE_ACCOUNT and a POD_NAME of the test's (each replica's Lease identity starts
with it). The CA is a plugged-in one the test wrote, or, given none, the root the
replicas share in that Secret; `shared_root` reads it back.

The cluster outlives each test, and pilots of earlier tests leave the Secret (they
release the Lease on SIGTERM): `forget_shared_root` deletes both, so that a test starts
from what a new cluster has, and cleans up after it. `counter` reads one of pilot's
metrics; `lease_holder` says who holds the Lease.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

from tests.cluster.client import Kube, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.in_cluster import PILOT_ACCOUNT, PILOT_NAMESPACE, pilot_kubeconfig
from tests.support.ca import PluggedIn
from tests.support.pilot_process import (
    PilotProcess,
    discovery_command,
    pilot_environment,
    start_command,
)

SECRET = "pilot-ca-secret"
LEASE = "pilot-ca"
ROOT_KEY = "root-cert.pem"


async def start_discovery(
    kube: Kube,
    plane: ControlPlane,
    folder: Path,
    *flags: str,
    ca: PluggedIn | None = None,
    pod_name: str = "pilot",
) -> PilotProcess:
    """`pilot discovery --kubeconfig` as pilot's ServiceAccount, serving once it logs so."""
    kubeconfig = await pilot_kubeconfig(kube, plane, folder / "kubeconfig")  # makes folder
    env = {"POD_NAMESPACE": PILOT_NAMESPACE, "SERVICE_ACCOUNT": PILOT_ACCOUNT,
           "POD_NAME": pod_name}  # fmt: skip
    source = ["--kubeconfig", str(kubeconfig)]
    command = discovery_command(folder, source, ca.directory if ca else None, *flags)
    root = ca.root.cert_pem.encode() if ca else b""
    pilot = await start_command(folder, command, env=pilot_environment(folder, env), root_pem=root)
    if ca is None:
        pilot.root_pem = await shared_root(kube)
    return pilot


def _object(kind: str, name: str) -> dict[str, object]:
    return {"kind": kind, "metadata": {"name": name, "namespace": PILOT_NAMESPACE}}


async def forget_shared_root(kube: Kube) -> None:
    """Delete the Lease pilot-ca and the Secret pilot-ca-secret (absent ones too)."""
    await kube.delete(_object("Lease", LEASE))
    await kube.delete(_object("Secret", SECRET))


async def shared_secret(kube: Kube) -> dict[str, object] | None:
    """Secret pilot-ca-secret, or None."""
    status, secret = await kube.request("GET", path_of("Secret", PILOT_NAMESPACE, SECRET))
    return secret if status == 200 else None


async def shared_root(kube: Kube) -> bytes:
    """The root certificate (PEM) in Secret pilot-ca-secret."""
    secret = await kube.get(path_of("Secret", PILOT_NAMESPACE, SECRET))
    return base64.b64decode(secret["data"][ROOT_KEY])


async def lease_holder(kube: Kube) -> str:
    """The Lease pilot-ca's holderIdentity ('' when released or absent)."""
    status, lease = await kube.request("GET", path_of("Lease", PILOT_NAMESPACE, LEASE))
    if status != 200:
        return ""
    holder: str = lease.get("spec", {}).get("holderIdentity") or ""
    return holder


async def counter(pilot: PilotProcess, name: str) -> float:
    """One of pilot's counters on /metrics (with or without the `_total` the Prometheus
    client appends), summed over its labels; 0 when absent."""
    status, body = await pilot.get("/metrics")
    assert status == 200, f"/metrics answered {status}"
    samples = re.findall(rf"^{re.escape(name)}(?:_total)?(?:{{[^}}]*}})? (\S+)$", body, re.M)
    return sum(float(value) for value in samples)
