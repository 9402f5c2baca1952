"""Two proxies behind one node id are two proxies to the operator too.

The victim (ns-b/victim) and a workload using its node id with its own token
(ns-a/attacker) are both connected, each holding a certificate for its own identity.
What an operator reads must show both, told apart by identity: CSDS
(`FetchClientStatus`, as `pilot proxy-status` calls it) two ClientConfigs with the node
id; `/debug/syncz` and `/debug/connections` two rows with `"proxy"` the node id and
`"identity"` each one's SPIFFE URI; `/debug/config_dump` asks which one is meant. No
private key appears in any of them.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.cli import run_pilot
from tests.support.peers import (
    ATTACKER,
    OPERATOR,
    VICTIM,
    WORKLOAD,
    Mesh,
    Peer,
    Route,
    attacker,
    attacks,
    gets_its_secrets,
    rows_for,
    victim,
    wait_streams,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

BOTH = sorted([VICTIM.uri, ATTACKER.uri])


@dataclass
class TwoProxies:
    node_id: str
    victim: Peer
    attacker: Peer


@pytest_asyncio.fixture(loop_scope="package")
async def two(mesh: Mesh) -> AsyncIterator[TwoProxies]:
    """The victim on SotW ADS, the other on delta ADS, both holding their certificates."""
    node_id = mesh.node_id()
    good = victim(mesh, node_id, tls=False, delta=False)
    route = Route("ads-delta-default", "ads", delta=True, names=(WORKLOAD,))
    bad = attacker(mesh, node_id, tls=False, route=route, claims=None)
    try:
        await gets_its_secrets(good)
        await attacks(mesh, bad, route, mesh.pilot.mark())
        await wait_streams(mesh.pilot, node_id, 2)
        yield TwoProxies(node_id, good, bad)
    finally:
        await bad.close()
        await good.close()


async def test_csds_lists_each_proxy_behind_the_node_id(mesh: Mesh, two: TwoProxies) -> None:
    async with mesh.pilot.client(tls=True, token=mesh.tokens[OPERATOR]) as operator:
        status = await operator.client_status([two.node_id], exclude_contents=False)
    configs = [c for c in status.config if c.node.id == two.node_id]
    assert len(configs) == 2, (
        f"CSDS lists {len(configs)} ClientConfig for node id {two.node_id} while two proxies "
        f"({VICTIM} and {ATTACKER}) use it: `pilot proxy-status` shows them as one"
    )
    assert sorted(c.client_scope for c in configs) == BOTH, "each row names its identity"
    assert b"PRIVATE KEY" not in status.SerializeToString(), "CSDS shows a private key"


async def test_proxy_status_shows_both_rows_with_their_identities(
    mesh: Mesh, two: TwoProxies, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(mesh.tokens[OPERATOR])
    target = mesh.pilot.target(tls=False)
    status = await run_pilot("proxy-status", "--addr", target, "--token-file", str(token))
    header, rows = status.table()
    assert header[:2] == ["NAME", "IDENTITY"]
    mine = sorted(row[1] for row in rows if row[0] == two.node_id)
    assert mine == BOTH, f"proxy-status rows for {two.node_id}: {rows}"


@pytest.mark.parametrize("page", ["/debug/syncz", "/debug/connections"])
async def test_debug_rows_tell_the_proxies_apart_by_identity(
    mesh: Mesh, two: TwoProxies, page: str
) -> None:
    rows = rows_for(await mesh.pilot.get_json(page), "proxy", two.node_id)
    identities = sorted(str(row.get("identity")) for row in rows)
    assert identities == BOTH, (
        f"{page} rows for node id {two.node_id} show identities {identities}, "
        f"not one row for each of {BOTH}"
    )
    text = str(rows)
    assert "PRIVATE KEY" not in text, f"{page} shows a private key"


async def test_config_dump_asks_which_proxy_behind_the_node_id(mesh: Mesh, two: TwoProxies) -> None:
    node_id = urllib.parse.quote(two.node_id)
    status, body = await mesh.pilot.get(f"/debug/config_dump?proxyID={node_id}")
    assert status == 409, f"one answer for two proxies: {status} {str(body)[:200]}"
    assert "identity" in body["error"]
    for account in (VICTIM, ATTACKER):
        identity = urllib.parse.quote(account.uri)
        dump = await mesh.pilot.get_json(
            f"/debug/config_dump?proxyID={node_id}&identity={identity}"
        )
        assert dump["identity"] == account.uri
        assert "PRIVATE KEY" not in str(dump), "config_dump shows a private key"
