"""`pilot proxy-config` shows a caller no proxy that `pilot proxy-status` hides from it.

Against the shared Kubernetes-mode pilot (`--xds-auth kubernetes`: tokens checked by
TokenReview). Both commands read CSDS, whose rule is `StatusReaders`': a caller sees
the proxies of its own namespace; accounts of pilot's namespace (and trusted ones)
see every proxy; no token is no answer. The victim (ns-b/victim) and the attacker
(ns-a/attacker, with its own token and the victim's node id) each hold their own
certificate. Without a token, proxy-config fails exactly as proxy-status does, on
either port. With its own token the attacker reads only its own proxy behind that
node id: its own SAN, never the victim's, and the victim by identity is "no
proxy", word for word what a node id nobody uses gets. The victim reads only its
own; the operator sees both and must say which. No private key, in any format.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.cli import Output, run_pilot
from tests.support.peers import (
    ATTACKER,
    OPERATOR,
    VICTIM,
    WORKLOAD,
    Account,
    Mesh,
    Route,
    attacker,
    attacks,
    gets_its_secrets,
    victim,
    wait_streams,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

FORMATS = ("table", "json", "yaml")


@dataclass
class Caller:
    """How one account reaches pilot's CSDS from the command line."""

    access: tuple[str, ...]  # --addr, and --root-cert / --token-file as it has them

    async def proxy_status(self) -> Output:
        return await run_pilot("proxy-status", *self.access, "-o", "json")

    async def secrets(self, node_id: str, *extra: str, output: str = "json") -> Output:
        return await run_pilot(
            "proxy-config", "secrets", node_id, *self.access, *extra, "-o", output
        )


@dataclass
class Scene:
    node_id: str  # the victim's, which the attacker uses too
    root_cert: Path
    tokens: dict[Account, Path]
    plaintext: str
    tls: str

    def caller(self, account: Account | None, tls: bool = False) -> Caller:
        access = ["--addr", self.tls if tls else self.plaintext]
        if tls:
            access += ["--root-cert", str(self.root_cert)]
        if account is not None:
            access += ["--token-file", str(self.tokens[account])]
        return Caller(tuple(access))


@pytest_asyncio.fixture(loop_scope="package")
async def scene(mesh: Mesh, tmp_path: Path) -> AsyncIterator[Scene]:
    """The victim and the attacker behind one node id, each holding its own certificate."""
    node_id = mesh.node_id()
    good = victim(mesh, node_id, tls=True, delta=False)
    route = Route("ads-delta-default", "ads", delta=True, names=(WORKLOAD,))
    bad = attacker(mesh, node_id, tls=True, route=route, claims=ATTACKER)
    tokens = {}
    for account in (VICTIM, ATTACKER, OPERATOR):
        tokens[account] = tmp_path / f"{account.namespace}-{account.name}.token"
        tokens[account].write_text(mesh.tokens[account])
    root_cert = tmp_path / "root-cert.pem"
    root_cert.write_bytes(mesh.pilot.root_pem)
    try:
        await gets_its_secrets(good)
        await attacks(mesh, bad, route, mesh.pilot.mark())
        await wait_streams(mesh.pilot, node_id, 2)
        yield Scene(
            node_id, root_cert, tokens, mesh.pilot.target(tls=False), mesh.pilot.target(tls=True)
        )
    finally:
        await bad.close()
        await good.close()


def sans(output: Output) -> list[str]:
    """The SANs of the `default` secrets `-o json` printed."""
    return [r["san"] for r in output.records() if r["resource_name"] == WORKLOAD]


def assert_no_key(output: Output) -> None:
    assert "PRIVATE KEY" not in output.stdout + output.stderr, f"a private key is shown:\n{output}"


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
async def test_without_a_token_it_fails_as_proxy_status_does(scene: Scene, tls: bool) -> None:
    caller = scene.caller(None, tls=tls)
    status = await caller.proxy_status()
    assert status.returncode == 2 and status.stdout == "", str(status)
    assert "UNAUTHENTICATED" in status.stderr and "--token-file" in status.stderr, str(status)
    for kind in ("clusters", "endpoints", "secrets"):
        config = await run_pilot("proxy-config", kind, scene.node_id, *caller.access)
        assert (config.returncode, config.stdout, config.stderr) == (2, "", status.stderr), (
            f"{config}\n--- proxy-status said\n{status.stderr}"
        )


async def test_another_workload_reads_only_its_own_proxy(scene: Scene) -> None:
    caller = scene.caller(ATTACKER)
    listed = [r for r in (await caller.proxy_status()).records() if r["name"] == scene.node_id]
    assert [r["identity"] for r in listed] == [ATTACKER.uri], "proxy-status: the attacker's own"

    for output in FORMATS:
        mine = await caller.secrets(scene.node_id, output=output)
        assert mine.returncode == 0, str(mine)
        assert VICTIM.uri not in mine.stdout, f"the victim's certificate is shown:\n{mine}"
        assert_no_key(mine)
    assert sans(await caller.secrets(scene.node_id)) == [ATTACKER.uri]

    theirs = await caller.secrets(scene.node_id, "--identity", VICTIM.uri)
    nobody = await caller.secrets("no-such-proxy", "--identity", VICTIM.uri)
    assert theirs.returncode == nobody.returncode == 1, f"{theirs}\n{nobody}"
    assert theirs.stdout == nobody.stdout == ""
    assert theirs.stderr.replace(scene.node_id, "ID") == nobody.stderr.replace(
        "no-such-proxy", "ID"
    ), "the victim's proxy must look like no proxy at all"


async def test_the_victim_reads_only_its_own_over_tls(scene: Scene) -> None:
    caller = scene.caller(VICTIM, tls=True)
    listed = [r for r in (await caller.proxy_status()).records() if r["name"] == scene.node_id]
    assert [r["identity"] for r in listed] == [VICTIM.uri]
    mine = await caller.secrets(scene.node_id)
    assert sans(mine) == [VICTIM.uri]
    assert ATTACKER.uri not in mine.stdout
    assert_no_key(mine)


async def test_the_operator_sees_both_and_picks_one(scene: Scene) -> None:
    caller = scene.caller(OPERATOR)
    both = await caller.secrets(scene.node_id)
    assert both.returncode == 1 and both.stdout == "", str(both)
    [line] = both.stderr.splitlines()
    assert "--identity" in line and VICTIM.uri in line and ATTACKER.uri in line, line
    for account in (VICTIM, ATTACKER):
        for output in FORMATS:
            picked = await caller.secrets(scene.node_id, "--identity", account.uri, output=output)
            assert picked.returncode == 0, str(picked)
            assert_no_key(picked)
        assert sans(await caller.secrets(scene.node_id, "--identity", account.uri)) == [account.uri]
