"""The /debug page as an operator sees it: a real Chromium opens what a real pilot serves.

pilot runs as users start it (`pilot discovery --config` on a copy of
examples/mesh.yaml), a real Envoy connects with the example bootstrap, and
the page must show that Envoy SYNCED for CDS and EDS, the example mesh's
size, and the push that follows an edit of the mesh file; every link on it
must answer. A node id is whatever a client sends: one made of HTML must be
shown as text, never run.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.support.browser import chromium_binary, open_page
from tests.support.envoy_process import (
    EXAMPLES_DIR,
    EnvoyProcess,
    load_example_bootstrap,
    wait_until,
)
from tests.support.mesh import cluster_name, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.xds_client import CLUSTER, node

ENVOY_ID = "page-envoy"
XSS = "<script>alert(1)</script>"
# The example bootstrap's node metadata (NAMESPACE, SERVICE_ACCOUNT), as pilot proves it.
ENVOY_IDENTITY = "spiffe://cluster.local/ns/default/sa/default"
NEW_ENDPOINT = {"addresses": ["127.0.0.5"], "conditions": {"ready": True}, "zone": "zone-a"}


@asynccontextmanager
async def example_pilot(tmp_path: Path) -> AsyncIterator[tuple[PilotProcess, Path]]:
    """`pilot discovery --config mesh.yaml` on a copy of the example mesh, and that copy."""
    chromium_binary()  # no browser: fail now, not after starting everything
    config = tmp_path / "mesh.yaml"
    shutil.copyfile(EXAMPLES_DIR / "mesh.yaml", config)
    pilot = await start_file_pilot_with_ca(tmp_path, config)
    try:
        yield pilot, config
    finally:
        await pilot.stop()


def _mesh(config: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load(config.read_text())["items"]
    return items


def _size(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The registry table's rows, counted from the file as kubectl users read it."""
    slices = [o["endpoints"] for o in objects if o["kind"] == "EndpointSlice"]
    subsets = [s for o in objects if o["kind"] == "Endpoints" for s in o["subsets"]]
    legacy = [s.get("addresses", []) + s.get("notReadyAddresses", []) for s in subsets]
    return {
        "Services": str(sum(o["kind"] == "Service" for o in objects)),
        "Endpoint sets": str(sum(o["kind"] in ("EndpointSlice", "Endpoints") for o in objects)),
        "Endpoints": str(sum(map(len, slices)) + sum(map(len, legacy))),
    }


async def _synced(pilot: PilotProcess, node_id: str) -> None:
    """Until pilot's CSDS model has every CDS and EDS resource of `node_id` ACKed."""

    def all_synced(rows: list[dict[str, Any]]) -> bool:
        states = [row["types"] for row in rows if row["proxy"] == node_id]
        return bool(states) and all(set(states[0].get(t, {})) == {"SYNCED"} for t in ("cds", "eds"))

    await wait_until(
        lambda: pilot.get_json("/debug/syncz"), 15, f"{node_id} synced", until=all_synced
    )


async def _push_of(pilot: PilotProcess, service: str) -> None:
    """Until /debug/pushz has a push of `service`'s endpoints that reached a stream."""

    def pushed(records: list[dict[str, Any]]) -> bool:
        return any(service in r["endpoints"]["names"] and r["streams"] > 0 for r in records)

    await wait_until(
        lambda: pilot.get_json("/debug/pushz"), 10, f"a push of {service}", until=pushed
    )


async def test_the_page_shows_a_real_envoy_the_registry_and_the_pushes(tmp_path: Path) -> None:
    async with example_pilot(tmp_path) as (pilot, config):
        bootstrap = load_example_bootstrap("envoy-ads-delta.yaml", pilot.grpc_port, ENVOY_ID)
        (tmp_path / "envoy").mkdir()
        async with EnvoyProcess(bootstrap, tmp_path / "envoy", ENVOY_ID, log_level="warning"):
            await _synced(pilot, ENVOY_ID)
            base = f"http://127.0.0.1:{pilot.http_port}"
            seen = await open_page(f"{base}/")  # the listener's root leads to the page

            [row] = [r for r in seen.table("proxies") if r["Node id"] == ENVOY_ID]
            assert row["Identity"] == ENVOY_IDENTITY, row
            assert row["CDS"].startswith("SYNCED") and row["EDS"].startswith("SYNCED"), row
            assert row["Connections"].endswith("ads-delta"), row
            before = _size(_mesh(config))
            assert seen.pairs("registry") == before

            mesh = _mesh(config)
            [frontend] = [o for o in mesh if o["metadata"]["name"] == "frontend-abc12"]
            frontend["endpoints"].append(NEW_ENDPOINT)
            write_mesh(config, mesh)  # pilot reloads the file and pushes frontend's endpoints
            await _push_of(pilot, "default/frontend")
            seen = await open_page(f"{base}/debug/")
            statuses = {href: (await pilot.get(href))[0] for href, _text in seen.links}

    newest = seen.table("pushes")[0]
    assert newest["What changed"] == "endpoints only: default/frontend", newest
    assert newest["Resources changed"] == "EDS 1", newest
    assert newest["Streams"] == "1", "the push reached the Envoy's one stream"
    assert newest["Build + fan-out"].endswith(" ms"), newest
    first = seen.table("pushes")[-1]
    assert "full (clusters): default/frontend, default/reviews, shop/cart" in first["What changed"]
    after = seen.pairs("registry")
    assert int(after["Endpoints"]) == int(before["Endpoints"]) + 1, after

    linked = {href.partition("?")[0] for href, _ in seen.links}
    for path in ("/debug/syncz", "/debug/connections", "/debug/pushz", "/debug/edsz"):
        assert path in linked, f"{path} is not linked from the page"
    for path in ("/debug/registryz", "/debug/config_dump", "/debug/tasks", "/metrics", "/ready"):
        assert path in linked, f"{path} is not linked from the page"
    assert {href: 200 for href in statuses} == statuses, "every link on the page answers"


async def test_a_node_id_made_of_html_is_shown_as_text(tmp_path: Path) -> None:
    async with (
        example_pilot(tmp_path) as (pilot, _config),
        pilot.client(tls=False, token=None) as client,
    ):
        stream = client.delta_ads(node(XSS))
        await stream.subscribe(CLUSTER, ["*"])
        await stream.ack_until(CLUSTER, [cluster_name("frontend")])
        status, served = await pilot.get("/debug/")
        # A script that ran would hold the browser in its alert() until the deadline: say so now.
        assert status == 200 and XSS not in served, "the page carries the node id as markup"
        seen = await open_page(f"http://127.0.0.1:{pilot.http_port}/debug/")
    assert XSS in [row["Node id"] for row in seen.table("proxies")], seen.text
    assert seen.elements["script"] == 0, "the node id became a <script> element"
    dumps = [href for href, text in seen.links if text == "config_dump"]
    assert dumps == ["/debug/config_dump?proxyID=%3Cscript%3Ealert%281%29%3C%2Fscript%3E"]
