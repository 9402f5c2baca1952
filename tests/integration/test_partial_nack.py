"""A partial NACK, as an operator sees it: the rejected listener ERROR, the others SYNCED.

`pilot discovery` (a subprocess) serves three HTTP services to a real Envoy on
the README's sidecar bootstrap (`INTERCEPTION_MODE: NONE`: each listener binds
127.0.0.1 on its service port). The test holds one of those ports itself, so
Envoy cannot bind that listener (as an Envoy run as an ordinary user cannot
bind the Quick start's ports 80 and 443): Envoy applies the others and NACKs
with `Error adding/updating listener(s) 127.0.0.1_PORT: cannot bind ...`.
Then `pilot proxy-config listeners` (every format) marks that listener ERROR
with Envoy's words and the others SYNCED (the ones Envoy's admin lists as
active), `pilot proxy-status` says `ERROR (1/N)`, and the /debug page lists
the one rejected listener with Envoy's message. Once the port is free and the
listener is pushed again (its service removed, then back), all are SYNCED.

Hostile: an xDS client NACKs with a message of about a megabyte holding
newlines, terminal escapes, HTML and names it was never sent. The tables and
the page stay one line per resource, escaped and cut short, and no name it
made up is listed as a resource.
"""

from __future__ import annotations

import html
import re
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.envoy_listener_client import free_port
from tests.support.cli import Output, assert_formats_agree, run_pilot
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.support.mesh import Ep, endpoint_slice, service, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.xds_client import LISTENER, XdsClient, node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

LOCAL = "sidecar~127.0.0.1~local.default~default.svc.cluster.local"
HOSTILE_NODE = "sidecar~10.1.1.7~nacker.default~default.svc.cluster.local"
SERVICES = {"alpha": "10.96.0.21", "beta": "10.96.0.22", "gamma": "10.96.0.23"}
HEADERS = ["ADDRESSES", "PORT", "MATCH", "DESTINATION", "AUTHZ", "NAME", "STATUS", "ERROR"]
FORMATS = ("table", "json", "yaml")
SYNC_TIMEOUT = 30.0


@dataclass
class Mesh:
    """The registry file, the services' ports, and the port the test holds (gamma's)."""

    path: Path
    ports: dict[str, int]

    def write(self, *names: str) -> None:
        objects: list[dict[str, Any]] = []
        for name in names:
            svc = service(name, ports=[("http", self.ports[name])])
            svc["spec"]["clusterIP"] = SERVICES[name]
            objects += [svc, endpoint_slice(name, [Ep("127.0.0.1")], ports=[("http", 1)])]
        write_mesh(self.path, objects)

    def listener(self, name: str) -> str:
        return f"127.0.0.1_{self.ports[name]}"


@dataclass
class Running:
    pilot: PilotProcess
    envoy: EnvoyProcess
    mesh: Mesh
    holder: socket.socket  # listening on gamma's port until a test closes it

    @property
    def addr(self) -> str:
        return self.pilot.target(tls=False)

    async def listeners(self, node_id: str = LOCAL) -> dict[str, Output]:
        """`pilot proxy-config listeners NODE_ID --addr ... -o FORMAT`, in every format."""
        return {
            output: await run_pilot(
                "proxy-config", "listeners", node_id, "--addr", self.addr, "-o", output
            )
            for output in FORMATS
        }

    async def listener_states(self, node_id: str = LOCAL) -> dict[str, tuple[str, str | None]]:
        """Per listener pilot sent: its STATUS and ERROR, as `-o json` prints them."""
        output = await run_pilot(
            "proxy-config", "listeners", node_id, "--addr", self.addr, "-o", "json"
        )
        if output.returncode != 0:
            return {}
        return {r["name"]: (r["status"], r["error"]) for r in output.records()}


@contextmanager
def held_port() -> Iterator[socket.socket]:
    """A loopback port this test listens on, so that Envoy cannot bind it (root or not)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    folder = tmp_path_factory.mktemp("partial-nack")
    with held_port() as holder:
        ports = {"alpha": free_port(), "beta": free_port(), "gamma": holder.getsockname()[1]}
        mesh = Mesh(folder / "mesh.yaml", ports)
        mesh.write(*SERVICES)
        pilot = await start_file_pilot_with_ca(folder, mesh.path)
        try:
            bootstrap = load_example_bootstrap("envoy-sidecar-local.yaml", pilot.grpc_port, LOCAL)
            async with EnvoyProcess(bootstrap, folder / "envoy", "local") as envoy:
                yield Running(pilot, envoy, mesh, holder)
        finally:
            await pilot.stop()


async def _active_listeners(envoy: EnvoyProcess) -> set[str]:
    dump = await envoy.config_dump(resource="dynamic_listeners")
    return {entry["name"] for entry in dump.get("configs", []) if "active_state" in entry}


def _rejected_rows(page: str) -> list[list[str]]:
    """The rows of the page's table of rejected resources, each cell unescaped."""
    table = re.search(r'<table id="rejected">(.*?)</table>', page, re.S)
    assert table is not None, page[:2000]
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)[1:]  # past the header
    return [
        [html.unescape(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in rows
    ]


async def test_only_the_listener_envoy_could_not_bind_is_error(running: Running) -> None:
    mesh = running.mesh
    gamma = mesh.listener("gamma")
    states = await wait_until(
        running.listener_states,
        SYNC_TIMEOUT,
        "gamma's listener ERROR and the others SYNCED",
        until=lambda states: (
            states.get(gamma, ("",))[0] == "ERROR"
            and {s for n, (s, _) in states.items() if n != gamma} == {"SYNCED"}
        ),
    )
    _, why = states[gamma]
    assert why is not None and f"cannot bind '127.0.0.1:{mesh.ports['gamma']}'" in why, why
    assert "Error adding/updating" not in why, "Envoy's words for this listener, not the list"
    synced = {name for name, (status, _) in states.items() if status == "SYNCED"}
    assert {mesh.listener("alpha"), mesh.listener("beta")} <= synced
    assert await _active_listeners(running.envoy) == synced, "SYNCED is what Envoy serves"
    assert all(error is None for name, (_, error) in states.items() if name != gamma)

    records = assert_formats_agree(await running.listeners(), HEADERS)
    assert {r["error"] for r in records if r["name"] == gamma} == {why}
    table = (await running.listeners())["table"]
    [gamma_row] = [line for line in table.stdout.splitlines() if f" {gamma} " in line]
    assert gamma_row.split()[-1] == "use", "Envoy's message ends the row: ...Address already in use"

    status = await run_pilot("proxy-status", "--addr", running.addr)
    headers, rows = status.table()
    [local] = [dict(zip(headers, row, strict=True)) for row in rows if row[0] == LOCAL]
    assert local["LDS"] == f"ERROR (1/{len(states)})", local

    code, page = await running.pilot.get("/debug/?refresh=0")
    assert code == 200
    mine = [row for row in _rejected_rows(page) if row[0] == LOCAL]
    assert [row[1:3] for row in mine] == [["LDS", gamma]], mine
    assert mine[0][3] == why


async def test_a_freed_port_and_a_new_push_make_every_listener_synced(running: Running) -> None:
    mesh = running.mesh
    gamma = mesh.listener("gamma")
    await wait_until(
        running.listener_states,
        SYNC_TIMEOUT,
        "gamma's listener ERROR",
        until=lambda states: states.get(gamma, ("",))[0] == "ERROR",
    )
    running.holder.close()
    mesh.write("alpha", "beta")  # the bad listener removed: the others stay SYNCED
    await wait_until(
        running.listener_states,
        SYNC_TIMEOUT,
        "every listener SYNCED, gamma's gone",
        until=lambda states: bool(states) and gamma not in states and _all_synced(states),
    )
    mesh.write(*SERVICES)  # and pushed again, its port free now
    states = await wait_until(
        running.listener_states,
        SYNC_TIMEOUT,
        "every listener SYNCED, gamma's too",
        until=lambda states: gamma in states and _all_synced(states),
    )
    assert await _active_listeners(running.envoy) == set(states)
    status = await run_pilot("proxy-status", "--addr", running.addr, "-o", "json")
    [local] = [record for record in status.records() if record["name"] == LOCAL]
    assert local["lds"] == f"SYNCED ({len(states)})", local


def _all_synced(states: dict[str, tuple[str, str | None]]) -> bool:
    return set(states.values()) == {("SYNCED", None)}


async def test_a_hostile_nack_stays_one_line_per_resource_and_bounded(running: Running) -> None:
    async with XdsClient(running.addr) as client:
        stream = client.delta_ads(node(HOSTILE_NODE, {"INTERCEPTION_MODE": "NONE"}))
        await stream.subscribe(LISTENER, ["*"])
        response = await stream.expect(LISTENER)
        sent = sorted(r.name for r in response.resources)
        victim = sent[0]
        evil = "\x1b[2J\x1b]0;owned\x07<script>alert(1)</script>\u202e"
        lines = [f"{victim}: {evil}", "ghost_listener: never sent", "FORGED ROW"]
        message = "Error adding/updating listener(s) " + "\n".join(lines) + "\n"
        message += ("y" * 999 + "\n") * 1000  # about a megabyte, past Envoy's own cut
        await stream.nack(response, message)
        states = await wait_until(
            lambda: running.listener_states(HOSTILE_NODE),
            SYNC_TIMEOUT,
            "the NACK recorded",
            until=lambda states: states.get(victim, ("",))[0] == "ERROR",
        )
        assert set(states) == set(sent), "no name the client made up is a resource"
        assert all(len(error or "") < 5000 for _, error in states.values()), "bounded"
        assert all((error or "").isprintable() for _, error in states.values())

        outputs = await running.listeners(HOSTILE_NODE)
        records = outputs["json"].records()
        assert outputs["yaml"].records() == records
        assert {r["name"] for r in records} == set(sent)
        headers, rows = outputs["table"].table()
        assert headers == HEADERS and len(rows) == len(records)
        assert all(row[-1].endswith(" chars)") for row in rows), "Envoy's words cut short"
        table = outputs["table"].stdout
        assert not any(ch in table for ch in "\x1b\x07\u202e"), repr(table[:300])
        assert len(table.splitlines()) == 1 + len(records), "a newline forged a row"
        assert all(len(line) < 2000 for line in table.splitlines())

        code, page = await running.pilot.get("/debug/?refresh=0")
        assert code == 200
        assert "<script>" not in page and "\x1b" not in page
        mine = [row for row in _rejected_rows(page) if row[0] == HOSTILE_NODE]
        assert {row[2] for row in mine} <= set(sent) and victim in {row[2] for row in mine}
        assert all(len(row[3]) < 400 and "\n" not in row[3] for row in mine), mine
        assert len(page) < 200_000
        nacked = await running.pilot.wait_logged(
            lambda entry: HOSTILE_NODE in entry["msg"] and " rejected lds " in entry["msg"],
            "the hostile NACK",
        )
        assert all("\x1b" not in e["msg"] and int(e["size"]) < 5000 for e in nacked), nacked
