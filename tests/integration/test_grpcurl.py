"""docs/operating.md's "Debugging with grpcurl" commands (the README's operating page), run as
printed with the real grpcurl.

Each `grpcurl` command of the section's ```sh blocks runs against the pilot of the
README's Quick start: its command (`pilot discovery --config examples/mesh.yaml`), read
from the README and run as printed by the installed `pilot` script from the repository
root, with only its addresses changed to ports it picks itself (`127.0.0.1:0`, read back
from its log). The address `localhost:15010` in each grpcurl command is replaced by that
pilot's plaintext port. Removing one of the commands these tests know from the README
fails them, and so does any command that stops working.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.integration.readme_grpcurl import (
    CSDS,
    DEADLINE_EXCEEDED,
    DELTA,
    DESCRIBE_ADS,
    DESCRIBE_REQUEST,
    FETCH_CLUSTERS,
    HEALTH,
    LIST,
    README_ADDRESS,
    Result,
    quick_start_pilot,
    readme_commands,
    run,
    start,
)
from tests.support.served import ADS, SERVICES

CLA = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
FRONTEND = "outbound|80||frontend.default.svc.cluster.local"
FRONTEND_ENDPOINTS = {"127.0.0.1:18080", "127.0.0.2:18080"}
CLUSTERS = {
    FRONTEND,
    "outbound|9080||reviews.default.svc.cluster.local",
    "outbound|9090||reviews.default.svc.cluster.local",
    "outbound|8000||cart.shop.svc.cluster.local",
    "outbound|443||payments.shop.svc.cluster.local",
}


# --- the answers -------------------------------------------------------------------


def _endpoints(assignment: dict[str, Any]) -> set[str]:
    return {
        f"{address['address']}:{address['port_value']}"
        for locality in assignment.get("endpoints", [])
        for lb_endpoint in locality.get("lb_endpoints", [])
        for address in [lb_endpoint["endpoint"]["address"]["socket_address"]]
    }


def check_list(result: Result) -> None:
    result.assert_ok()
    missing = SERVICES - set(result.stdout.split())
    assert not missing, f"{sorted(missing)} not listed:\n{result}"


def check_describe(result: Result) -> None:
    result.assert_ok()
    symbol = result.command.kind.removeprefix("describe ")
    assert result.stdout.startswith(f"{symbol} is a "), str(result)
    if symbol == ADS:
        for rpc in ("StreamAggregatedResources", "DeltaAggregatedResources"):
            assert f"rpc {rpc} ( stream " in result.stdout, f"no {rpc}:\n{result}"
    if result.command.kind == DESCRIBE_REQUEST:
        for field in ("node", "type_url", "resource_names_subscribe"):
            assert f" {field} = " in result.stdout, f"no field {field}:\n{result}"


def check_health(result: Result) -> None:
    result.assert_ok()
    assert result.messages() == [{"status": "SERVING"}], str(result)


def check_fetch_clusters(result: Result) -> None:
    result.assert_ok()
    [response] = result.messages()
    assert response["type_url"] == CLUSTER, str(result)
    resources = response.get("resources", [])
    assert {resource["@type"] for resource in resources} == {CLUSTER}, str(result)
    assert sorted(resource["name"] for resource in resources) == sorted(CLUSTERS), str(result)


def check_other(result: Result) -> None:
    """A command these tests do not know yet must at least work."""
    if "-max-time" in result.command.argv and result.returncode == DEADLINE_EXCEEDED:
        result.assert_hung_up()
    else:
        result.assert_ok()


CHECKS = {
    LIST: check_list,
    DESCRIBE_ADS: check_describe,
    DESCRIBE_REQUEST: check_describe,
    HEALTH: check_health,
    FETCH_CLUSTERS: check_fetch_clusters,
}
CONCURRENT = {DELTA, CSDS}  # run together below: CSDS needs a client connected


# --- the tests -------------------------------------------------------------------------


def test_readme_section_has_the_commands() -> None:
    commands = readme_commands()
    for command in commands.values():
        assert "-plaintext" in command.argv, f"{README_ADDRESS} is plaintext:\n{command.text}"
    assert "-max-time" in commands[DELTA].argv, "the delta stream never ends without -max-time"
    assert commands[DELTA].data()["resource_names_subscribe"] == [FRONTEND]


async def test_readme_commands_answer(tmp_path: Path) -> None:
    """list, describe, health, FetchClusters (and any new one-shot command) as printed."""
    commands = [c for kind, c in readme_commands().items() if kind not in CONCURRENT]
    async with quick_start_pilot(tmp_path) as pilot:
        results = await asyncio.gather(*(run(command, pilot) for command in commands))
    for result in results:
        CHECKS.get(result.command.kind, check_other)(result)


async def test_readme_delta_subscription_and_csds(tmp_path: Path) -> None:
    """The delta EDS subscription by hand; CSDS, run while it is open, lists its node."""
    commands = readme_commands()
    delta, csds = commands[DELTA], commands[CSDS]
    node_id = delta.data()["node"]["id"]
    async with quick_start_pilot(tmp_path) as pilot:
        subscription = await start(delta, pilot)
        first = await subscription.first_message()
        status = await run(csds, pilot)
        streamed = await subscription.result()

    streamed.assert_hung_up()
    [response, *_pushes] = streamed.messages()
    assert response == first
    assert response["type_url"] == CLA, str(streamed)
    [resource] = response["resources"]
    assert resource["name"] == FRONTEND, str(streamed)
    assignment = resource["resource"]
    assert assignment["@type"] == CLA, str(streamed)
    assert assignment["cluster_name"] == FRONTEND, str(streamed)
    assert _endpoints(assignment) == FRONTEND_ENDPOINTS, str(streamed)

    status.assert_ok()
    [answer] = status.messages()
    configs = [c for c in answer.get("config", []) if c.get("node", {}).get("id") == node_id]
    assert len(configs) == 1, f"node {node_id!r} of the open subscription not listed:\n{status}"
    held = [
        resource
        for resource in configs[0].get("generic_xds_configs", [])
        if (resource["type_url"], resource["name"]) == (CLA, FRONTEND)
    ]
    assert len(held) == 1, f"{node_id!r} should hold {FRONTEND}:\n{status}"
    assert held[0]["config_status"] == "STALE", f"grpcurl never ACKs: STALE expected\n{status}"
    excluded = "-d" in csds.argv and bool(csds.data().get("exclude_resource_contents"))
    assert ("xds_config" in held[0]) is not excluded, str(status)
