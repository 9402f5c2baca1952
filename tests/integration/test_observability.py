"""What operators read: /metrics, the /debug endpoints, and logs."""

from __future__ import annotations

import datetime
import json
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from pilot.logs import JsonFormatter, LogSpecError, parse_levels
from pilot.xds import types
from tests.integration.delta_proxy import Proxy
from tests.support.deadline import bounded
from tests.support.envoy_process import wait_until
from tests.support.mesh import cluster_name, simple_mesh, write_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.pilot_process import start_file_pilot_with_ca
from tests.support.proxies import Proxy as Sidecar
from tests.support.sds_secrets import WORKLOAD
from tests.support.xds_client import SECRET, XdsClient, node

MESH = {"alpha": ["127.0.0.1"], "beta": ["127.0.0.2"]}


async def _get(pilot: RunningPilot, path: str, port: int | None = None) -> tuple[int, str]:
    url = f"http://127.0.0.1:{port or pilot.http_port}{path}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    assert match is not None, f"{name}{labels} not in /metrics"
    return float(match.group(1))


async def test_metrics_count_what_pilot_does(tmp_path: Path) -> None:
    async with running_pilot(tmp_path, simple_mesh(MESH)) as pilot:
        async with grpc.aio.insecure_channel(pilot.grpc_target) as grpc_channel:
            proxy = Proxy(grpc_channel, "p1")
            await proxy.reply(await proxy.subscribe(types.CLUSTER, ["*"]))
            endpoints = await proxy.subscribe(types.ENDPOINT, [cluster_name("alpha")])
            await proxy.reply(endpoints, error="no thanks")
            _, before = await _get(pilot, "/metrics")
            assert _metric(before, "pilot_xds") == 1
            assert _metric(before, "pilot_services") == 2
            assert _metric(before, "pilot_xds_pushes", '{type="cds"}') == 1
            await wait_until(
                lambda: pilot.discovery.stats.nacks[types.ENDPOINT], 10, "the NACK to be recorded"
            )
            pilot.write(simple_mesh({"alpha": ["127.0.0.1", "127.0.0.9"], "beta": ["127.0.0.2"]}))
            pushed = await bounded(proxy.call.read(), 10)
            assert pushed.type_url == types.ENDPOINT

            async def metrics() -> str:
                return (await _get(pilot, "/metrics"))[1]

            # The push is counted once written: the client may read it a moment before.
            after = await wait_until(
                metrics, 10, "the second EDS push counted",
                until=lambda text: _metric(text, "pilot_xds_pushes", '{type="eds"}') >= 2,
            )  # fmt: skip
        assert _metric(after, "pilot_xds_pushes", '{type="eds"}') == 2
        assert _metric(after, "pilot_xds_eds_reject") == 1
        assert _metric(after, "pilot_total_xds_rejects") == 1
        assert _metric(after, "pilot_proxy_convergence_time_count") >= 1
        assert _metric(after, "pilot_inbound_updates", '{type="eds"}') >= 3
        assert _metric(after, "pilot_xds_config_size_bytes_count", '{type="eds"}') == 2
        assert "proxy" not in after.split("# HELP")[0]  # no per-proxy labels anywhere
        assert "p1" not in after


async def test_each_certificate_minted_is_timed_in_the_ca_histogram(tmp_path: Path) -> None:
    proxies = [Sidecar.sidecar(f"cart-{i}", "shop", "cart") for i in range(3)]
    async with running_pilot(tmp_path, simple_mesh(MESH)) as pilot:
        _, before = await _get(pilot, "/metrics")
        assert _metric(before, "pilot_sds_ca_request_duration_seconds_count") == 0
        async with XdsClient(pilot.grpc_target) as client:
            for proxy in proxies:
                stream = client.delta_sds(proxy.node())
                await stream.subscribe(SECRET, [WORKLOAD])
                await stream.ack_until(SECRET, [WORKLOAD], 10)
            _, after = await _get(pilot, "/metrics")
    assert _metric(after, "pilot_sds_ca_request_duration_seconds_count") == len(proxies)
    everything = '{le="+Inf"}'
    assert _metric(after, "pilot_sds_ca_request_duration_seconds_bucket", everything) == 3
    assert _metric(after, "pilot_sds_ca_request_duration_seconds_sum") > 0


async def test_debug_endpoints(tmp_path: Path) -> None:
    async with (
        running_pilot(tmp_path, simple_mesh(MESH)) as pilot,
        grpc.aio.insecure_channel(pilot.grpc_target) as channel,
    ):
        proxy = Proxy(channel, "p1")
        await proxy.reply(await proxy.subscribe(types.ENDPOINT, [cluster_name("alpha")]))
        await proxy.reply(await proxy.subscribe(types.SECRET, ["default"]))

        status, body = await _get(pilot, "/debug/connections")
        (connection,) = json.loads(body)
        assert connection["proxy"] == "p1" and connection["stream"] == "ads-delta"
        assert connection["identity"] == "spiffe://cluster.local/ns/shop/sa/p1"

        async def synced() -> Any:
            return json.loads((await _get(pilot, "/debug/syncz"))[1])

        await wait_until(
            synced,
            10,
            "syncz to show both types SYNCED",
            until=lambda s: s and s[0]["types"] == {"eds": {"SYNCED": 1}, "sds": {"SYNCED": 1}},
        )
        status, body = await _get(pilot, f"/debug/edsz?cluster={cluster_name('alpha')}")
        assert status == 200
        assignment = json.loads(body)["assignment"]
        assert assignment["clusterName"] == cluster_name("alpha")
        assert (await _get(pilot, "/debug/edsz?cluster=nope"))[0] == 404
        assert set(json.loads((await _get(pilot, "/debug/edsz"))[1])["clusters"]) == {
            cluster_name("alpha"),
            cluster_name("beta"),
        }
        registry = json.loads((await _get(pilot, "/debug/registryz"))[1])
        assert [s["name"] for s in registry["services"]] == ["alpha", "beta"]
        status, body = await _get(pilot, "/debug/config_dump?proxyID=p1")
        assert status == 200 and "PRIVATE KEY" not in body and "[redacted]" in body
        assert (await _get(pilot, "/debug/config_dump"))[0] == 400
        assert (await _get(pilot, "/debug/config_dump?proxyID=ghost"))[0] == 404

        # Where each of p1's stream tasks waits, by the stream id /debug/connections gives.
        dump = json.loads((await _get(pilot, "/debug/tasks"))[1])
        assert dump["count"] == len(dump["tasks"]) > 0
        mine = {
            t["name"]: t
            for t in dump["tasks"]
            if t["name"].startswith(f"stream-{connection['id']}-")
        }
        assert mine[f"stream-{connection['id']}-reader"]["stack"][0].startswith(
            "pilot/server/connection.py:"
        )
        assert mine[f"stream-{connection['id']}-writer"]["waits_in"].startswith("asyncio/locks.py")
        assert "PRIVATE KEY" not in json.dumps(dump)


def test_log_levels_per_component() -> None:
    assert parse_levels("info,xds:debug,kubernetes:warning") == (
        "INFO",
        {"pilot.xds": "DEBUG", "pilot.sources.kubernetes": "WARNING"},
    )
    assert parse_levels("default:error") == ("ERROR", {})
    with pytest.raises(LogSpecError, match="loud"):
        parse_levels("xds:loud")


def test_json_logs_are_one_object_per_line() -> None:
    record = logging.LogRecord(
        "pilot.xds", logging.WARNING, __file__, 1, "proxy %s rejected", ("p1",), None
    )
    entry = json.loads(JsonFormatter().format(record))
    assert (
        entry["level"] == "warning"
        and entry["scope"] == "pilot.xds"
        and entry["msg"] == "proxy p1 rejected"
    )


async def test_the_debug_listener_opens_on_the_page_and_serves_what_it_links(
    tmp_path: Path,
) -> None:
    """With --debug-addr, `/` there leads to the page (as on Envoy's admin port), and
    /ready and /metrics answer there too, so that every link of the page works."""
    async with running_pilot(tmp_path, simple_mesh(MESH), debug_addr="127.0.0.1:0") as pilot:
        port = pilot.discovery.http.debug_port
        paths = ("/", "/debug", "/debug/", "/debug/pushz", "/ready", "/metrics")
        statuses = {path: (await _get(pilot, path, port))[0] for path in paths}
        _, root = await _get(pilot, "/", port)
    assert statuses == dict.fromkeys(paths, 200)
    assert '<table id="proxies">' in root, "the root is the debug page"


# A text line: "2026-01-02 03:04:05,678 INFO pilot.xds: proxy ... connected ...".
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ pilot[.\w]*: \S")


@pytest.mark.parametrize("log_format", ["json", "text"])
async def test_log_format_flag_shapes_every_line_pilot_writes(
    tmp_path: Path, log_format: str
) -> None:
    """`pilot discovery --log-format json`: from start to exit, every line on stderr is
    one JSON object with time, level, scope and msg; `text` (the default): none is."""
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh(MESH))
    pilot = await start_file_pilot_with_ca(tmp_path, config, "--log-format", log_format)
    try:
        async with XdsClient(pilot.target(tls=False)) as client:
            stream = client.delta_ads(node("p1"))
            await stream.subscribe(types.CLUSTER, ["*"])
            await stream.ack_until(types.CLUSTER, [cluster_name("alpha")])
    finally:
        await pilot.stop()
    # Lines from start-up (serving), from a stream (connected, disconnected), and exit.
    assert any("pilot discovery serving xDS" in e["msg"] for e in pilot.log)
    assert any("proxy p1" in e["msg"] and "disconnected" in e["msg"] for e in pilot.log)
    assert any("stopping on SIGTERM" in e["msg"] for e in pilot.log)
    if log_format == "json":
        assert {e["format"] for e in pilot.log} == {"json"}, pilot.tail(len(pilot.log))
        for entry in pilot.log:
            assert datetime.datetime.fromisoformat(entry["time"]), entry
            assert entry["level"] in ("info", "warning") and entry["scope"].startswith("pilot")
        serving = [e for e in pilot.log if "pilot discovery serving xDS" in e["msg"]]
        assert [(e["level"], e["scope"]) for e in serving] == [("info", "pilot")]
    else:
        assert {e["format"] for e in pilot.log} == {"text"}, pilot.tail(len(pilot.log))
        assert all(TEXT_LINE.match(e["msg"]) for e in pilot.log), pilot.tail(len(pilot.log))
