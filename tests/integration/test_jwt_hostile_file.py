"""Hostile RequestAuthentications in the registry file of a real `pilot discovery`: each
is one warning line naming it and the field (a newline in an issuer forges no line),
counted in pilot_config_rejected_total, and the last good version keeps applying; pilot
stays ready.

Hostile here: control characters in an issuer (NUL, a newline starting a forged log
line), a list past its bound, JWKS Envoy would refuse (too big, nested past the JSON
parser's depth, a key not on its curve), and jwksUris that point anywhere but a web
server (a local file, credentials in the URL, Envoy's admin port, istiod's xDS port).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.envoy_process import wait_until
from tests.support.jwt_tokens import ISSUER, SigningKey
from tests.support.mesh import write_mesh
from tests.support.pilot_process import PilotProcess, http_get, start_file_pilot_with_ca

TIMEOUT = 15.0
JWKS = SigningKey().jwks()
HOSTILE_RULES = {
    "newline": {"issuer": "https://a\nforged line: pilot is compromised", "jwks": JWKS},
    "nul": {"issuer": "https://a\x00b", "jwks": JWKS},
    "huge": {"issuer": ISSUER, "jwks": JWKS, "audiences": [f"a{i}" for i in range(5000)]},
    "big-jwks": {"issuer": ISSUER, "jwks": json.dumps({"keys": [], "pad": "x" * 70_000})},
    "deep-jwks": {"issuer": ISSUER, "jwks": "[" * 60_000},
    "off-curve": {
        "issuer": ISSUER,
        "jwks": json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "x": "AQAB", "y": "AQAB"}]}),
    },
    "file": {"issuer": ISSUER, "jwksUri": "file:///etc/shadow"},
    "userinfo": {"issuer": ISSUER, "jwksUri": "https://pilot:secret@keys.example.com/k"},
    "admin": {"issuer": ISSUER, "jwksUri": "http://127.0.0.1:15000/config_dump"},
    "xds": {"issuer": ISSUER, "jwksUri": "https://istiod.istio-system.svc:15012/"},
}


def _ra(name: str, rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"jwtRules": [rule]},
    }


async def _metrics(pilot: PilotProcess) -> str:
    status, body = await pilot.get("/metrics")
    assert status == 200
    return str(body)


async def _issuers(pilot: PilotProcess) -> dict[str, list[str]]:
    listed = await pilot.get_json("/debug/authorizationz")
    return {ra["name"]: ra["issuers"] for ra in listed["requestAuthentications"]}


async def test_hostile_request_authentications_are_refused_in_one_line_each(
    tmp_path: Path,
) -> None:
    mesh = tmp_path / "mesh.yaml"
    good = {"issuer": ISSUER, "jwks": JWKS}
    write_mesh(mesh, [_ra(name, good) for name in HOSTILE_RULES])
    pilot = await start_file_pilot_with_ca(tmp_path, mesh)
    try:
        await wait_until(
            lambda: _issuers(pilot), TIMEOUT, "the good versions",
            until=lambda held: len(held) == len(HOSTILE_RULES),
        )  # fmt: skip
        since = pilot.mark()
        write_mesh(mesh, [_ra(name, rule) for name, rule in HOSTILE_RULES.items()])
        expected = (
            f'pilot_config_rejected_total{{kind="RequestAuthentication"}} {len(HOSTILE_RULES)}.0'
        )
        await wait_until(
            lambda: _metrics(pilot), TIMEOUT, "every hostile one counted",
            until=lambda text: expected in text.splitlines(),
            context=pilot.tail,
        )  # fmt: skip
        warned = pilot.logged(lambda e: "RequestAuthentication shop/" in e["msg"], since)
        named = {name for name in HOSTILE_RULES for e in warned if f"shop/{name}:" in e["msg"]}
        assert named == set(HOSTILE_RULES), [pilot.shown(e) for e in warned]
        assert all(e["level"].upper().startswith("WARN") for e in warned)
        assert not pilot.logged(lambda e: "forged line" in e["msg"] + e["level"], since)
        assert all(int(e["size"]) < 2000 for e in pilot.log[since:]), "a line of unbounded size"
        # The last good version of each keeps applying.
        assert await _issuers(pilot) == {name: [ISSUER] for name in HOSTILE_RULES}
        status, _ = await http_get(f"http://127.0.0.1:{pilot.http_port}/ready")
        assert status == 200
    finally:
        await pilot.stop()
