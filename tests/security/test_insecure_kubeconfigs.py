"""A remote kubeconfig with `insecure-skip-tls-verify: true` is said, and can be refused.

pilot cannot tell such a cluster's API server from whoever is on the path to it, and
that party chooses the cluster's endpoints. The real `pilot discovery` in Kubernetes
mode on a local test API server, a real Envoy on it, and remote API servers on
127.0.0.1 over TLS with certificates from a CA pilot does not know:

* by default the kubeconfig is used: the remote's endpoints reach Envoy, one warning
  names the cluster (once, however often the cluster's objects change), and a gauge
  counts it;
* with `--refuse-insecure-skip-tls-verify` the cluster is never joined: one error
  line names it and says why, its API server is never asked, its endpoints never
  reach Envoy while a verified remote's and the local ones do, and `/ready` and the
  metrics say it is refused;
* a `--remote-kubeconfig` so refused stops pilot at start with one line naming it.
"""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.kubeapi import KubeAPIServer
from tests.security.remote_attackers import Pki, b64, kubeconfig
from tests.support.ca import write_plugged_in
from tests.support.kube_helpers import apply_mesh, ready
from tests.support.many_clusters import (
    Cluster,
    alpha_hosts,
    clusters,
    pilot_with_envoy,
    ready_lines,
    remote_secret,
    wait_for_hosts,
)
from tests.support.pilot_process import PilotProcess

WITHIN = 15.0
REFUSED_FLAG = "--refuse-insecure-skip-tls-verify"
LOCAL = {"127.0.1.1": "Kubernetes"}


@asynccontextmanager
async def tls_remote(pki: Pki, ip: str) -> AsyncIterator[KubeAPIServer]:
    """A remote API server over TLS (its certificate from `pki`'s CA), alpha at `ip`."""
    async with KubeAPIServer(ssl_context=pki.server_context(ssl.CERT_NONE)) as srv:
        apply_mesh(srv, {"alpha": ready(ip)})
        yield srv


def insecure_kubeconfig(srv: KubeAPIServer) -> str:
    return yaml.safe_dump(kubeconfig(srv.url, {"token": "t"}, insecure_skip_tls_verify=True))


def verified_kubeconfig(srv: KubeAPIServer, pki: Pki) -> str:
    ca = b64(pki.ca.cert_pem)
    return yaml.safe_dump(kubeconfig(srv.url, {"token": "t"}, certificate_authority_data=ca))


async def the_line_about(pilot: PilotProcess, level: str, cluster: str) -> str:
    """The one line at `level` naming `cluster`, once logged (fails if none, or more)."""
    await pilot.wait_logged(
        lambda e: e["level"] == level and f"cluster {cluster!r}" in e["msg"],
        f"a {level} line naming cluster {cluster}",
        within=WITHIN,
    )
    [line] = lines_about(pilot, level, cluster)
    return line


def lines_about(pilot: PilotProcess, level: str, cluster: str) -> list[str]:
    """Log lines at `level` naming `cluster` (as pilot quotes a name) and the option."""
    return [
        entry["msg"]
        for entry in pilot.logged(
            lambda e: (
                e["level"] == level
                and f"cluster {cluster!r}" in e["msg"]
                and "insecure-skip-tls-verify" in e["msg"]
            )
        )
    ]


async def metric(pilot: PilotProcess, name: str, labels: str = "") -> float | None:
    _status, body = await pilot.get("/metrics")
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", body, re.M)
    return float(found[1]) if found else None


def _local(found: dict[str, Cluster]) -> Cluster:
    return found["local"]


async def test_an_insecure_kubeconfig_is_used_with_one_warning_naming_the_cluster(
    tmp_path: Path,
) -> None:
    pki = Pki.create(tmp_path / "west-pki", "west")
    async with (
        clusters(tmp_path, "local") as found,
        tls_remote(pki, "127.0.2.1") as west,
        pilot_with_envoy(tmp_path, _local(found)) as (pilot, envoy),
    ):
        _local(found).srv.apply(remote_secret("remotes", {"west": insecure_kubeconfig(west)}))
        await wait_for_hosts(envoy, LOCAL | {"127.0.2.1": "west"}, "west's endpoints")
        warning = await the_line_about(pilot, "warning", "west")
        assert "Secret pilot-system/remotes key west" in warning, warning
        assert await metric(pilot, "pilot_remote_clusters_insecure_skip_tls_verify") == 1
        # The cluster's objects change: the same load, no second line.
        apply_mesh(west, {"alpha": ready("127.0.2.1", "127.0.2.2")})
        await wait_for_hosts(
            envoy, LOCAL | {"127.0.2.1": "west", "127.0.2.2": "west"}, "west's new endpoint"
        )
        assert len(lines_about(pilot, "warning", "west")) == 1
        assert lines_about(pilot, "error", "west") == []


async def test_with_the_refuse_flag_an_insecure_cluster_is_never_joined(tmp_path: Path) -> None:
    west_pki = Pki.create(tmp_path / "west-pki", "west")
    east_pki = Pki.create(tmp_path / "east-pki", "east")
    async with (
        clusters(tmp_path, "local") as found,
        tls_remote(west_pki, "127.0.2.1") as west,
        tls_remote(east_pki, "127.0.3.1") as east,
        pilot_with_envoy(tmp_path, _local(found), REFUSED_FLAG) as (pilot, envoy),
    ):
        kubeconfigs = {
            "west": insecure_kubeconfig(west),
            "east": verified_kubeconfig(east, east_pki),
        }
        _local(found).srv.apply(remote_secret("remotes", kubeconfigs))
        # East came from the same Secret at the same time: west would be here by now.
        await wait_for_hosts(envoy, LOCAL | {"127.0.3.1": "east"}, "east's endpoints")
        error = await the_line_about(pilot, "error", "west")
        assert REFUSED_FLAG in error and "refused" in error, error
        assert lines_about(pilot, "warning", "west") == []
        assert west.requests == [], "pilot asked the refused cluster's API server"
        assert "127.0.2.1" not in await alpha_hosts(envoy)
        assert await ready_lines(pilot) == (
            200,
            [
                "ready",
                "cluster Kubernetes: synced",
                "cluster east: synced",
                "cluster west: refused: insecure-skip-tls-verify",
            ],
        )
        reason = '{reason="insecure_skip_tls_verify"}'
        assert await metric(pilot, "pilot_remote_cluster_refusals_total", reason) == 1
        assert await metric(pilot, "pilot_cluster_synced", '{cluster_id="west"}') == 0
        assert await metric(pilot, "pilot_remote_clusters_insecure_skip_tls_verify") == 0
        # The local cluster is still served: a change there reaches Envoy.
        apply_mesh(_local(found).srv, {"alpha": ready("127.0.1.1", "127.0.1.2")})
        await wait_for_hosts(
            envoy,
            LOCAL | {"127.0.1.2": "Kubernetes", "127.0.3.1": "east"},
            "the local cluster's new endpoint",
        )
        assert len(lines_about(pilot, "error", "west")) == 1


def _discovery(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    mesh = tmp_path / "mesh.yaml"
    mesh.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    ca = write_plugged_in(tmp_path / "ca")
    argv: list[Any] = [
        *(sys.executable, "-m", "pilot", "discovery", "--config", mesh),
        *("--xds-auth", "none", "--grpc-addr", "127.0.0.1:0"),
        *("--grpc-tls-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"),
        *("--webhook-addr", ""),
        *("--ca-cert-dir", ca.directory, "--ca-state-dir", tmp_path / "state"),
        *("--drain-duration", "0s", *extra),
    ]
    return subprocess.run(
        [str(a) for a in argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_refused_remote_kubeconfig_flag_stops_pilot_at_start(tmp_path: Path) -> None:
    flagged = tmp_path / "west.yaml"
    flagged.write_text(
        yaml.safe_dump(
            kubeconfig("https://127.0.0.1:9", {"token": "t"}, insecure_skip_tls_verify=True)
        )
    )
    done = _discovery(tmp_path, "--remote-kubeconfig", f"west={flagged}", REFUSED_FLAG)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("pilot: error: ")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith(f"pilot: error: --remote-kubeconfig west={flagged}: refused")
    assert "insecure-skip-tls-verify" in errors[0] and REFUSED_FLAG in errors[0]
