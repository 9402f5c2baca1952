"""CSDS and `pilot proxy-status`: what each proxy holds, as an operator asks for it.

Most tests drive a delta ADS stream by hand (`Proxy`) against an in-process pilot.
The last one is an operator's whole view of a real rejection: a real Envoy refuses
an assignment a real `pilot discovery` sends, and the README's grpcurl CSDS command,
`pilot proxy-status` and /metrics each say so, while Envoy keeps being served.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from envoy.admin.v3 import config_dump_shared_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.status.v3 import csds_pb2
from prometheus_client.parser import text_string_to_metric_families

from pilot.xds import types
from tests.integration import readme_grpcurl as grpcurl
from tests.integration.delta_proxy import Proxy
from tests.integration.envoy_ads_expectations import expected
from tests.support.cli import run_pilot
from tests.support.deadline import bounded
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.support.envoy_view import dynamic_clusters, wait_for_view
from tests.support.mesh import cluster_name, simple_mesh, write_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca

CSDS = "/envoy.service.status.v3.ClientStatusDiscoveryService"
MESH = {"alpha": ["127.0.0.1"], "beta": ["127.0.0.2"]}


async def _proxy_status(target: str) -> list[dict[str, str]]:
    """`pilot proxy-status --addr TARGET`: each row as {column: cell}."""
    header, rows = (await run_pilot("proxy-status", "--addr", target)).table()
    return [dict(zip(header, row, strict=True)) for row in rows]


async def _fetch(
    channel: grpc.aio.Channel, request: csds_pb2.ClientStatusRequest
) -> csds_pb2.ClientStatusResponse:
    call = channel.unary_unary(
        f"{CSDS}/FetchClientStatus",
        request_serializer=csds_pb2.ClientStatusRequest.SerializeToString,
        response_deserializer=csds_pb2.ClientStatusResponse.FromString,
    )
    response: csds_pb2.ClientStatusResponse = await call(request, timeout=10)
    return response


def _statuses(config: csds_pb2.ClientConfig) -> dict[tuple[str, str], int]:
    return {(c.type_url, c.name): c.config_status for c in config.generic_xds_configs}


@asynccontextmanager
async def _pilot_and_channel(
    tmp_path: Path,
) -> AsyncIterator[tuple[RunningPilot, grpc.aio.Channel]]:
    async with (
        running_pilot(tmp_path, simple_mesh(MESH)) as pilot,
        grpc.aio.insecure_channel(pilot.grpc_target) as channel,
    ):
        yield pilot, channel


async def test_statuses_follow_ack_nack_and_unanswered(tmp_path: Path) -> None:
    alpha, beta, missing = cluster_name("alpha"), cluster_name("beta"), "outbound|1||missing"
    async with _pilot_and_channel(tmp_path) as (_pilot, channel):
        proxy = Proxy(channel, "p1")
        await proxy.reply(await proxy.subscribe(types.CLUSTER, ["*"]))
        await proxy.reply(await proxy.subscribe(types.ENDPOINT, [alpha]))
        rejected = await proxy.subscribe(types.ENDPOINT, [beta, missing])
        await proxy.reply(rejected, error="bad endpoints")
        unanswered = await proxy.subscribe(types.SECRET, ["ROOTCA"])
        expected = {
            (types.CLUSTER, alpha): csds_pb2.SYNCED,
            (types.CLUSTER, beta): csds_pb2.SYNCED,
            (types.ENDPOINT, alpha): csds_pb2.SYNCED,
            (types.ENDPOINT, beta): csds_pb2.ERROR,
            (types.ENDPOINT, missing): csds_pb2.NOT_SENT,
            (types.SECRET, "ROOTCA"): csds_pb2.STALE,
        }

        async def current() -> dict[tuple[str, str], int]:
            (config,) = (await _fetch(channel, csds_pb2.ClientStatusRequest())).config
            return _statuses(config)

        await wait_until(current, 10, "statuses after ACK, NACK, no answer", until=expected.__eq__)
        await proxy.reply(unanswered)
        await wait_until(
            current,
            10,
            "ROOTCA SYNCED once ACKed",
            until=lambda statuses: statuses[(types.SECRET, "ROOTCA")] == csds_pb2.SYNCED,
        )
        (config,) = (await _fetch(channel, csds_pb2.ClientStatusRequest())).config
        errors = {
            c.name: (c.error_state.details, c.client_status)
            for c in config.generic_xds_configs
            if c.error_state.details
        }
        assert errors == {beta: ("bad endpoints", config_dump_shared_pb2.NACKED)}
        assert config.node.id == "p1"


async def test_node_matchers_contents_and_redacted_secrets(tmp_path: Path) -> None:
    async with _pilot_and_channel(tmp_path) as (_pilot, channel):
        first, second = Proxy(channel, "sidecar-a"), Proxy(channel, "gateway-b")
        await first.subscribe(types.ENDPOINT, [cluster_name("alpha")])
        await second.subscribe(types.ENDPOINT, [cluster_name("beta")])
        secret = await first.subscribe(types.SECRET, ["default"])
        await first.reply(secret)
        request = csds_pb2.ClientStatusRequest()
        request.node_matchers.add().node_id.prefix = "sidecar-"
        (config,) = (await _fetch(channel, request)).config
        assert config.node.id == "sidecar-a"
        dumped = {c.name: c for c in config.generic_xds_configs}
        held = secret_pb2.Secret()
        assert dumped["default"].xds_config.Unpack(held)
        assert held.tls_certificate.certificate_chain.inline_bytes.startswith(
            b"-----BEGIN CERTIFICATE"
        )
        assert held.tls_certificate.private_key.inline_string == "[redacted]"
        assert b"PRIVATE KEY" not in config.SerializeToString()
        lean = await _fetch(channel, csds_pb2.ClientStatusRequest(exclude_resource_contents=True))
        assert len(lean.config) == 2
        assert not any(
            c.HasField("xds_config") for cfg in lean.config for c in cfg.generic_xds_configs
        )


async def test_stream_client_status_answers_each_request(tmp_path: Path) -> None:
    async with _pilot_and_channel(tmp_path) as (_pilot, channel):
        await Proxy(channel, "p1").subscribe(types.ENDPOINT, [cluster_name("alpha")])
        call = channel.stream_stream(
            f"{CSDS}/StreamClientStatus",
            request_serializer=csds_pb2.ClientStatusRequest.SerializeToString,
            response_deserializer=csds_pb2.ClientStatusResponse.FromString,
        )()
        for _ in range(2):
            await call.write(csds_pb2.ClientStatusRequest())
            response = await bounded(call.read(), 10)
            assert [c.node.id for c in response.config] == ["p1"]
        await call.done_writing()


async def test_proxy_status_command_prints_one_row_per_proxy(tmp_path: Path) -> None:
    async with _pilot_and_channel(tmp_path) as (pilot, channel):
        proxy = Proxy(channel, "sidecar-1")
        clusters = await proxy.subscribe(types.CLUSTER, ["*"])
        await proxy.reply(clusters, error="nope")
        endpoints = [cluster_name("alpha"), cluster_name("beta")]
        await proxy.reply(await proxy.subscribe(types.ENDPOINT, endpoints))

        async def eds_synced() -> bool:
            (config,) = (await _fetch(channel, csds_pb2.ClientStatusRequest())).config
            eds = [s for (t, _), s in _statuses(config).items() if t == types.ENDPOINT]
            return eds == [csds_pb2.SYNCED] * 2

        await wait_until(eds_synced, 10, "pilot to have taken the EDS ACK")
        (row,) = await _proxy_status(pilot.grpc_target)
        identity = "spiffe://cluster.local/ns/shop/sa/sidecar-1"  # its metadata (--xds-auth none)
        assert row == {
            "NAME": "sidecar-1",
            "IDENTITY": identity,
            "CDS": "ERROR (2/2)",
            "LDS": "-",
            "EDS": "SYNCED (2)",
            "RDS": "-",
            "SDS": "-",
        }


# --- a real Envoy rejects what pilot sends ------------------------------------------

ENVOY_NODE = "sidecar~127.0.0.1~nacking.default~default.svc.cluster.local"
ENVOY_IDENTITY = "spiffe://cluster.local/ns/default/sa/default"  # the example's metadata
# An endpoint address that is a host name, not an IP: pilot passes endpoint addresses
# through as the registry gives them (it checks none), and an EDS cluster's Envoy
# refuses the assignment ("malformed IP address").
NOT_AN_IP = "db.internal"
REJECTED = f"malformed IP address: {NOT_AN_IP}"


def _metrics(text: str) -> dict[str, float]:
    """Every sample on /metrics by name (labels left out: the reject counters have none)."""
    families = text_string_to_metric_families(text)
    return {sample.name: sample.value for family in families for sample in family.samples}


async def _csds(pilot: PilotProcess) -> dict[tuple[str, str], dict[str, object]]:
    """The README's grpcurl CSDS command: ENVOY_NODE's resources by (type URL, name)."""
    result = await grpcurl.run(grpcurl.readme_commands()[grpcurl.CSDS], pilot)
    result.assert_ok()
    [answer] = result.messages()
    [config] = [c for c in answer.get("config", []) if c["node"]["id"] == ENVOY_NODE]
    assert config["client_scope"] == ENVOY_IDENTITY, str(result)
    return {(r["type_url"], r["name"]): r for r in config["generic_xds_configs"]}


def _in_state(resource: dict[str, object], status: str, error: str | None) -> bool:
    """`resource` has this config_status, and an error_state saying `error` (None: none)."""
    state = resource.get("error_state")
    details = str(state.get("details", "")) if isinstance(state, dict) else None
    said = details is None if error is None else details is not None and error in details
    return resource["config_status"] == status and said


async def _until_csds(
    pilot: PilotProcess,
    what: str,
    states: dict[str, tuple[str, str | None]],
    not_at: tuple[str, str] = ("", ""),
) -> dict[tuple[str, str], dict[str, object]]:
    """Wait until each named assignment is in its (config_status, error or None), and the
    assignment `not_at` names (name, version) is at another version."""
    name, version = not_at

    def holds(held: dict[tuple[str, str], dict[str, object]]) -> bool:
        moved = not name or held[(types.ENDPOINT, name)]["version_info"] != version
        return moved and all(_in_state(held[(types.ENDPOINT, n)], *s) for n, s in states.items())

    return await wait_until(lambda: _csds(pilot), 15, what, until=holds)


async def test_a_real_envoys_rejection_shows_in_csds_proxy_status_and_metrics(
    tmp_path: Path,
) -> None:
    alpha, beta = cluster_name("alpha"), cluster_name("beta")
    mesh = {"alpha": ["127.0.0.1"], "beta": ["127.0.0.2"]}
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh(mesh))
    pilot = await start_file_pilot_with_ca(tmp_path, config)
    bootstrap = load_example_bootstrap("envoy-ads-delta.yaml", pilot.grpc_port, ENVOY_NODE)
    try:
        async with EnvoyProcess(bootstrap, tmp_path / "envoy", "nacking") as envoy:
            await wait_for_view(envoy, expected(mesh), "both services")
            held = expected(mesh)

            # pilot takes the host name and sends it; Envoy refuses beta's assignment.
            write_mesh(config, simple_mesh({**mesh, "beta": [NOT_AN_IP]}))
            await envoy.wait_for_stat(f"cluster.{beta}.update_rejected", 1)
            rejected = {beta: ("ERROR", REJECTED), alpha: ("SYNCED", None)}
            resources = await _until_csds(pilot, "beta's assignment NACKed in CSDS", rejected)
            nacked = resources[(types.ENDPOINT, beta)]
            assert nacked["client_status"] == "NACKED"
            assert REJECTED in str(nacked["error_state"])
            clusters = {
                n: r["config_status"] for (t, n), r in resources.items() if t == types.CLUSTER
            }
            assert clusters == {alpha: "SYNCED", beta: "SYNCED"}
            (row,) = await _proxy_status(pilot.target(tls=False))
            assert (row["NAME"], row["IDENTITY"]) == (ENVOY_NODE, ENVOY_IDENTITY)
            assert (row["CDS"], row["EDS"]) == ("SYNCED (2)", "ERROR (1/2)"), row
            metrics = _metrics((await pilot.get("/metrics"))[1])
            assert metrics["pilot_xds_eds_reject"] == 1
            assert metrics["pilot_total_xds_rejects"] == 1
            assert metrics["pilot_xds_cds_reject"] == 0
            logged = pilot.logged(lambda e: "rejected eds" in e["msg"] and REJECTED in e["msg"])
            assert len(logged) == 1, pilot.tail()
            # Envoy keeps what it had: both clusters, beta with its last good endpoint.
            assert await dynamic_clusters(envoy) == held

            # Other resources keep being served, and beta stays rejected meanwhile.
            before = str(resources[(types.ENDPOINT, alpha)]["version_info"])
            mesh["alpha"].append("127.0.0.5")
            write_mesh(config, simple_mesh({**mesh, "beta": [NOT_AN_IP]}))
            held[alpha] = expected(mesh)[alpha]
            await wait_for_view(envoy, held, "alpha's new endpoint, beta as it was")
            what = "alpha's update ACKed, beta still NACKed"
            await _until_csds(pilot, what, rejected, not_at=(alpha, before))
            (row,) = await _proxy_status(pilot.target(tls=False))
            assert row["EDS"] == "ERROR (1/2)", row
            metrics = _metrics((await pilot.get("/metrics"))[1])
            assert metrics["pilot_xds_eds_reject"] == 1

            # A good assignment for beta ends the rejection.
            mesh["beta"] = ["127.0.0.6"]
            write_mesh(config, simple_mesh(mesh))
            await wait_for_view(envoy, expected(mesh), "beta's fixed endpoint")
            synced = {beta: ("SYNCED", None), alpha: ("SYNCED", None)}
            await _until_csds(pilot, "beta SYNCED again", synced)
            (row,) = await _proxy_status(pilot.target(tls=False))
            assert (row["CDS"], row["EDS"]) == ("SYNCED (2)", "SYNCED (2)"), row
    finally:
        await pilot.stop()
