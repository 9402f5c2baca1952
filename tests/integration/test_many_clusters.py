"""Many clusters (Istio's multi-primary model) where the test API server is needed: the
real `pilot discovery` watching a local test API server plus remote ones that go down,
never answer, or number three; a real Envoy reading what it serves. What real API servers
can show (both clusters' endpoints merged, locality, Secrets adding, renaming and
removing clusters, bad keys, refused tokens, a registry file with a remote) is tested on
two of them in tests/cluster/test_remote_clusters.py.

* A remote cluster that goes down keeps its endpoints in Envoy, holds back neither the
  local cluster's changes nor `/ready`, and `/ready` and the metrics say it is down; one
  that never answers holds back nothing either.
* A Secret's changed kubeconfig moves a cluster id to another API server (three servers).
* The local cluster's id, or one given twice, on the command line stops pilot at start.
* A remote kubeconfig's token never shows in pilot's log nor in any debug endpoint.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import yaml

from tests.kubeapi.kubeconfig import kubeconfig_dict
from tests.support.envoy_process import EnvoyProcess, wait_until
from tests.support.kube_helpers import apply_mesh, ready, ready_status
from tests.support.many_clusters import (
    Cluster,
    cluster_metrics,
    clusters,
    pilot_with_envoy,
    ready_lines,
    remote_secret,
    wait_for_hosts,
)
from tests.support.pilot_process import PilotProcess

TOKEN = "tok-REMOTE-7f3a9c-must-never-show"  # a remote kubeconfig's credential


@asynccontextmanager
async def local_and_west(
    tmp_path: Path,
) -> AsyncIterator[tuple[dict[str, Cluster], PilotProcess, EnvoyProcess]]:
    """Two clusters, `local` (pilot's own) and `west` given by `--remote-kubeconfig`,
    and an Envoy on pilot."""
    async with (
        clusters(tmp_path, "local", "west") as found,
        pilot_with_envoy(
            tmp_path,
            found["local"],
            "--remote-kubeconfig",
            f"west={found['west'].kubeconfig}",
        ) as (pilot, envoy),
    ):
        yield found, pilot, envoy


def kubeconfig_text(cluster: Cluster, token: str | None = None) -> str:
    return yaml.safe_dump(kubeconfig_dict(cluster.srv.url, token))


# --------------------------------------------------------------------------- tests


def test_a_remote_id_taken_twice_is_a_start_up_error(tmp_path: Path) -> None:
    for flags, problem in (
        (["--remote-kubeconfig", "Kubernetes=a.yaml"], "the local cluster's id"),
        (["--cluster-id", "east", "--remote-kubeconfig", "east=a.yaml"], "the local cluster's id"),
        (["--remote-kubeconfig", "w=a.yaml", "--remote-kubeconfig", "w=b.yaml"], "given twice"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "pilot", "discovery", "--config", "mesh.yaml", *flags],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("pilot: error: --remote-kubeconfig "), done.stderr
        assert problem in done.stderr


async def test_a_remote_cluster_down_loses_nothing_and_blocks_nothing(tmp_path: Path) -> None:
    async with local_and_west(tmp_path) as (found, pilot, envoy):
        await wait_for_hosts(
            envoy, {"127.0.1.1": "Kubernetes", "127.0.2.1": "west"}, "both clusters"
        )
        await found["west"].srv.stop()
        _status, lines = await wait_until(
            lambda: ready_lines(pilot),
            15.0,
            "/ready to say west is unreachable",
            until=lambda answer: "cluster west: unreachable" in " ".join(answer[1]),
        )
        assert (_status, lines[:2]) == (200, ["ready", "cluster Kubernetes: synced"])
        assert lines[2].startswith("cluster west: unreachable: "), lines
        assert await cluster_metrics(pilot) == {"Kubernetes": 1.0, "west": 0.0, "remote": 1.0}

        # The local cluster's changes still reach Envoy, and west's endpoint stays.
        apply_mesh(found["local"].srv, {"alpha": ready("127.0.1.1", "127.0.1.2")})
        await wait_for_hosts(
            envoy,
            {"127.0.1.1": "Kubernetes", "127.0.1.2": "Kubernetes", "127.0.2.1": "west"},
            "the local change while west is down",
        )


async def test_a_remote_cluster_that_never_answers_does_not_hold_ready(tmp_path: Path) -> None:
    async with clusters(tmp_path, "local", "west") as found:
        nowhere = found["west"]
        await nowhere.srv.stop()  # its port is closed from the start
        async with pilot_with_envoy(
            tmp_path, found["local"], "--remote-kubeconfig", f"west={nowhere.kubeconfig}"
        ) as (pilot, envoy):
            await wait_for_hosts(envoy, {"127.0.1.1": "Kubernetes"}, "the local cluster")
            assert await ready_status(pilot.http_port) == 200
            _status, lines = await wait_until(
                lambda: ready_lines(pilot),
                15.0,
                "/ready to say west is unreachable",
                until=lambda answer: len(answer[1]) == 3 and "unreachable" in answer[1][2],
            )
            assert lines[2].startswith("cluster west: unreachable: "), lines


async def test_a_changed_kubeconfig_moves_a_cluster_to_another_api_server(
    tmp_path: Path,
) -> None:
    """The same id, another API server: its endpoints now come from there. (Three servers;
    adding, renaming and removing clusters through Secrets are tested on real API servers
    in tests/cluster/test_remote_clusters.py.)"""
    async with (
        clusters(tmp_path, "local", "west", "east") as found,
        pilot_with_envoy(tmp_path, found["local"]) as (_pilot, envoy),
    ):
        local = found["local"].srv
        local.apply(remote_secret("remotes", {"west": kubeconfig_text(found["west"])}))
        await wait_for_hosts(
            envoy, {"127.0.1.1": "Kubernetes", "127.0.2.1": "west"}, "west added by a Secret"
        )
        local.apply(remote_secret("remotes", {"west": kubeconfig_text(found["east"])}))
        await wait_for_hosts(
            envoy, {"127.0.1.1": "Kubernetes", "127.0.3.1": "west"}, "west moved to east's server"
        )


DEBUG_PATHS = (
    "/debug/",
    "/debug/syncz",
    "/debug/connections",
    "/debug/edsz",
    "/debug/registryz",
    "/debug/pushz",
    "/debug/tasks",
    "/debug/config_dump?proxyID=node-1",
    "/ready",
    "/metrics",
)


async def test_a_remote_kubeconfig_token_never_shows(tmp_path: Path) -> None:
    async with clusters(tmp_path, "local", "west", "east") as found:
        flagged = tmp_path / "east-kubeconfig.yaml"
        flagged.write_text(kubeconfig_text(found["east"], TOKEN))
        async with pilot_with_envoy(
            tmp_path, found["local"], "--remote-kubeconfig", f"east={flagged}"
        ) as (pilot, envoy):
            secret = {
                "west": kubeconfig_text(found["west"], TOKEN),
                "broken": f"users: [{{user: {{token: {TOKEN}}}}}]\nclusters: 5\n",
            }
            found["local"].srv.apply(remote_secret("remotes", secret))
            await wait_for_hosts(
                envoy,
                {"127.0.1.1": "Kubernetes", "127.0.2.1": "west", "127.0.3.1": "east"},
                "every cluster",
            )
            await pilot.wait_logged(lambda e: "key broken" in e["msg"], "the broken key")
            for path in DEBUG_PATHS:
                status, body = await pilot.get(path)
                assert status == 200, (path, status)
                assert TOKEN not in str(body), path
        # Stopped: the whole log, start to end.
        assert pilot.log
        leaks = [e for e in pilot.log if TOKEN in e["msg"] or TOKEN in e["error"]]
        assert leaks == []
