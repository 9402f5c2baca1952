"""RequestAuthentication on real pods through a real Envoy: which tokens reach the app.

One set-up for the module (tests/integration/mesh_pods.py): pod `b` (reviews, a
sidecar) runs an app here (tests/integration/jwt_app) on 9090 that answers with the
headers it received, behind a Service `echo` that pilot gives b an HTTP chain for; pod
`c` (no sidecar) runs the issuer's key server (the same program with `--jwks`) on
8080, publishing an RSA key this test made, and is the client: curl to b's address,
plaintext (bookinfo is PERMISSIVE). Tokens are signed by the test
(tests/support/jwt_tokens). Objects are applied to the test API server pilot watches;
each test waits until b's Envoy holds them, and deletes them after.

Shown on the real Envoy: a valid token passes and is removed before the app (unless
forwardOriginalToken), its payload header reaches the app; forged, expired, `alg:
none`, HS256 signed with the RSA public key, a `kid` naming the key but signed by
another, and a bad token beside a good one are each refused with 401 (a wrong
audience with 403, as Envoy answers it); no token passes with no principal; an ALLOW
on `requestPrincipals` lets in only that token; inline jwks, fromHeaders, fromParams
and fromCookies; outputClaimToHeaders (replacing a header the client sent); a JWKS URL
that does not answer, or answers over TLS with a certificate no system root trusts,
refuses good tokens.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.integration.agent_process import REPO
from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    APP_UID,
    CONVERGE_TIMEOUT,
    REVIEWS,
    Mesh,
    mesh_pods,
    pod_address,
)
from tests.support.ca import issue_leaf, new_ca, pem
from tests.support.envoy_process import wait_until
from tests.support.jwt_tokens import (
    AUDIENCE,
    ISSUER,
    SigningKey,
    claims,
    hs256_with_public_key,
    unsigned,
)
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pod_process import running_in

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

ECHO_PORT = 9090  # b's app that says what it received (Service `echo`)
JWKS_PORT = 8080  # c's key server
SILENT_PORT = 8081  # nothing listens there on c
TLS_PORT = 8443  # c's key server over TLS, its certificate from a root no system trusts
KEY = SigningKey()
OTHER_KEY = SigningKey(kid="other-key")
REVIEWS_SELECTOR = {"matchLabels": {"app": "reviews"}}
JWKS_URI = f"http://{pod_address('c')}:{JWKS_PORT}/jwks.json"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    folder = tmp_path_factory.mktemp("pod-jwt")
    jwks = folder / "jwks.json"
    jwks.write_text(KEY.jwks())  # a public key: nothing secret
    cert, key = _untrusted_certificate(folder, pod_address("c"))
    app = [sys.executable, "-m", "tests.integration.jwt_app"]
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    async with (
        mesh_pods(folder) as running,
        running_in(
            running.pod("b"), [*app, "--port", str(ECHO_PORT)], "serving on", uid=APP_UID, cwd=REPO
        ),
        running_in(
            running.pod("c"),
            [*app, "--port", str(JWKS_PORT), "--jwks", str(jwks)],
            "serving on",
            cwd=REPO,
        ),
        running_in(
            running.pod("c"),
            [*app, "--port", str(TLS_PORT), "--jwks", str(jwks), *tls],
            "serving on",
            cwd=REPO,
        ),
    ):
        echo = service("echo", APP_NAMESPACE, ports=(("http", ECHO_PORT),))
        echo["spec"]["clusterIP"] = "198.19.0.20"
        running.api.apply(echo)
        endpoint = Ep(pod_address("b"), pod=REVIEWS.pod_name)
        running.api.apply(
            endpoint_slice("echo", [endpoint], APP_NAMESPACE, ports=(("http", ECHO_PORT),))
        )
        await wait_inbound(running, lambda text: f"inbound|{ECHO_PORT}||" in text, "echo's chain")
        yield running
        running.assert_nothing_restarted()
        # Every listener pilot sent with jwt_authn was taken: b's Envoy rejected none.
        assert await running.reviews.stat("listener_manager.lds.update_rejected") in (0, None)
        assert await running.reviews.stat("cluster_manager.cds.update_rejected") in (0, None)


def _untrusted_certificate(folder: Path, address: str) -> tuple[Path, Path]:
    """A server certificate for `address` from a root of the test's own (no system trusts
    it); its key written 0600."""
    root = new_ca("jwks test root")
    server_key = ec.generate_private_key(ec.SECP256R1())
    leaf = issue_leaf(root, server_key.public_key(), hosts=[address])
    cert = folder / "jwks-server.pem"
    cert.write_text(pem(leaf) + root.cert_pem)
    key = folder / "jwks-server.key"
    key.touch(mode=0o600)
    key.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": APP_NAMESPACE},
        "spec": spec,
    }


def jwt_rule(**fields: Any) -> dict[str, Any]:
    return {"issuer": ISSUER, "jwksUri": JWKS_URI, "audiences": [AUDIENCE], **fields}


async def inbound_text(mesh: Mesh) -> str:
    return json.dumps((await mesh.reviews.listeners()).get("virtualInbound", {}))


async def wait_inbound(mesh: Mesh, holds: Any, what: str) -> None:
    await wait_until(
        lambda: inbound_text(mesh), CONVERGE_TIMEOUT, f"b's virtualInbound to hold {what}",
        until=holds, context=mesh.reviews.agent.tail,
    )  # fmt: skip


UPDATES = r"^listener_manager\.(listener_in_place_updated|listener_modified)$"
DRAINING = r"^listener_manager\.total_(filter_chains|listeners)_draining$"


async def _updates(mesh: Mesh) -> int:
    return sum((await mesh.reviews.stats(UPDATES)).values())


async def _workers_took(mesh: Mesh, updates_before: int) -> None:
    """Until b's workers serve the listener its config dump shows: the dump changes on
    Envoy's main thread just before the workers take the new chains, and the old ones
    start draining (for the agent's 5 s drain time) once every worker has."""

    async def state() -> tuple[int, int]:
        draining = sum((await mesh.reviews.stats(DRAINING)).values())
        return await _updates(mesh), draining

    await wait_until(
        state, CONVERGE_TIMEOUT, "b's workers to take the new listener",
        until=lambda s: s[0] > updates_before and s[1] > 0, context=mesh.reviews.agent.tail,
    )  # fmt: skip


async def applied(mesh: Mesh, *objects: dict[str, Any]) -> None:
    """Apply the objects; until b's Envoy holds each (by a marker of its own) and its
    workers serve them."""
    before = await _updates(mesh)
    for o in objects:
        mesh.api.apply(o)
    names = [o["metadata"]["name"] for o in objects]
    await wait_inbound(mesh, lambda text: all(_holds(text, o) for o in objects), f"{names}")
    await _workers_took(mesh, before)


def _holds(text: str, o: dict[str, Any]) -> bool:
    named = f'{APP_NAMESPACE}/{o["metadata"]["name"]}"' in text  # in the chains' metadata
    if o["kind"] == "AuthorizationPolicy":
        return named
    return named and all(
        json.dumps(r.get("jwksUri", r["issuer"]))[1:-1] in text for r in o["spec"]["jwtRules"]
    )


async def removed(mesh: Mesh, *objects: dict[str, Any]) -> None:
    for o in objects:
        mesh.api.delete(o["kind"], APP_NAMESPACE, o["metadata"]["name"])
    await wait_inbound(
        mesh, lambda text: "jwt_authn" not in text and "rbac" not in text, "no JWT or RBAC"
    )


async def settled(mesh: Mesh, path: str, headers: Sequence[str], status: int) -> None:
    """`call` until it answers `status`: b's config dump shows a new listener just before
    its workers take it, so the first request after a change may meet the old chains."""
    await wait_until(
        lambda: call(mesh, path, headers), CONVERGE_TIMEOUT, f"{path} to answer {status}",
        until=lambda answer: answer[0] == status, context=mesh.reviews.agent.tail,
    )  # fmt: skip


async def call(
    mesh: Mesh, path: str = "/", headers: Sequence[str] = ()
) -> tuple[int, dict[str, Any]]:
    """c's curl to b's echo app (plaintext, through b's sidecar): status and what the app
    received (empty unless 200)."""
    argv = ["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}"]
    for header in headers:
        argv += ["-H", header]
    argv.append(f"http://{pod_address('b')}:{ECHO_PORT}{path}")
    _, out, _ = await mesh.pod("c").run(*argv)
    body, _, code = out.rpartition("\n")
    status = int(code) if code.strip().isdigit() else 0
    return status, (json.loads(body) if status == 200 else {})


def bearer(token: str) -> list[str]:
    return [f"Authorization: Bearer {token}"]


async def test_valid_token_passes_and_bad_ones_get_401(mesh: Mesh) -> None:
    ra = obj(
        "RequestAuthentication",
        "jwt",
        {
            "selector": REVIEWS_SELECTOR,
            "jwtRules": [
                jwt_rule(
                    outputPayloadToHeader="x-payload",
                    outputClaimToHeaders=[{"header": "x-sub", "claim": "sub"}],
                )
            ],
        },
    )
    await applied(mesh, ra)
    try:
        good = KEY.sign(claims())
        status, seen = await call(mesh, "/good", bearer(good))
        assert status == 200
        assert "authorization" not in seen["headers"], "the token reached the app"
        assert "x-payload" in seen["headers"], "outputPayloadToHeader did not reach the app"
        assert seen["headers"].get("x-sub") == "alice", "outputClaimToHeaders"
        # A client's own x-sub beside the token is replaced by the claim, not joined to it.
        status, seen = await call(mesh, "/spoof", [*bearer(good), "x-sub: admin"])
        assert status == 200 and seen["headers"].get("x-sub") == "alice"
        status, seen = await call(mesh, "/none")
        assert status == 200 and "x-payload" not in seen["headers"]
        hostile = {
            "forged (another key)": OTHER_KEY.sign(claims()),
            "forged with the good kid": OTHER_KEY.sign(claims(), {"kid": KEY.kid}),
            "a kid naming no key": KEY.sign(claims(), {"kid": "../../other"}),
            "expired": KEY.sign(claims(lifetime=-3600)),
            "unknown issuer": KEY.sign(claims(issuer="https://evil.example.com")),
            "alg none": unsigned(claims()),
            "HS256 keyed with the RSA public key": hs256_with_public_key(KEY, claims()),
            "truncated signature": good[:-8],
        }
        for what, token in hostile.items():
            assert (await call(mesh, "/bad", bearer(token)))[0] == 401, what
        # Envoy (and so Istio) answers an audience it does not allow with 403, not 401.
        assert (await call(mesh, "/aud", bearer(KEY.sign(claims(audience="other")))))[0] == 403
        listed = KEY.sign(claims(audience=["other", AUDIENCE]))  # one of a list is enough
        assert (await call(mesh, "/aud", bearer(listed)))[0] == 200
        # A good token and a bad one at once (header and access_token parameter): refused.
        bad = OTHER_KEY.sign(claims())
        assert (await call(mesh, f"/two?access_token={bad}", bearer(good)))[0] == 401
        assert (await call(mesh, f"/two?access_token={good}", bearer(bad)))[0] == 401
        assert (await call(mesh, f"/param?access_token={good}"))[0] == 200  # Istio's default
    finally:
        await removed(mesh, ra)


async def test_allow_on_request_principal_lets_only_that_token_in(mesh: Mesh) -> None:
    ra = obj(
        "RequestAuthentication", "jwt", {"selector": REVIEWS_SELECTOR, "jwtRules": [jwt_rule()]}
    )
    rule = {"from": [{"source": {"requestPrincipals": [f"{ISSUER}/alice"]}}]}
    allow = obj(
        "AuthorizationPolicy", "alice-only", {"selector": REVIEWS_SELECTOR, "rules": [rule]}
    )
    await applied(mesh, ra, allow)
    try:
        assert (await call(mesh, "/alice", bearer(KEY.sign(claims(sub="alice")))))[0] == 200
        assert (await call(mesh, "/bob", bearer(KEY.sign(claims(sub="bob")))))[0] == 403
        assert (await call(mesh, "/anonymous"))[0] == 403
        # The issuer is a URL: its own slashes are not where iss and sub part.
        tricky = KEY.sign(claims(sub="realms/test/alice", issuer="https://issuer.example.com"))
        assert (await call(mesh, "/tricky", bearer(tricky)))[0] == 401  # not our issuer
        claim_rule = {"when": [{"key": "request.auth.claims[groups]", "values": ["admin"]}]}
        by_claim = obj(
            "AuthorizationPolicy", "admins", {"selector": REVIEWS_SELECTOR, "rules": [claim_rule]}
        )
        await applied(mesh, by_claim)
        admin = KEY.sign(claims(sub="carol", groups=["dev", "admin"]))
        assert (await call(mesh, "/admin", bearer(admin)))[0] == 200
        guest = KEY.sign(claims(sub="dave", groups=["dev"]))
        assert (await call(mesh, "/guest", bearer(guest)))[0] == 403
        mesh.api.delete("AuthorizationPolicy", APP_NAMESPACE, "admins")
    finally:
        await removed(mesh, ra, allow)


async def test_without_request_authentication_a_principal_rule_matches_nothing(
    mesh: Mesh,
) -> None:
    rule = {"from": [{"source": {"requestPrincipals": ["*"]}}]}
    allow = obj("AuthorizationPolicy", "any-jwt", {"selector": REVIEWS_SELECTOR, "rules": [rule]})
    await applied(mesh, allow)
    try:
        # No jwt_authn runs: no token is verified, so none gives a principal.
        assert (await call(mesh, "/token", bearer(KEY.sign(claims()))))[0] == 403
        assert (await call(mesh, "/none"))[0] == 403
    finally:
        await removed(mesh, allow)


async def test_inline_jwks_from_headers_and_params(mesh: Mesh) -> None:
    rule = {
        "issuer": ISSUER,
        "jwks": KEY.jwks(),
        "fromHeaders": [{"name": "x-token", "prefix": "Token "}],
        "fromParams": ["tok"],
        "fromCookies": ["session"],
        "forwardOriginalToken": True,
    }
    ra = obj("RequestAuthentication", "inline", {"selector": REVIEWS_SELECTOR, "jwtRules": [rule]})
    await applied(mesh, ra)
    try:
        good, forged = KEY.sign(claims()), OTHER_KEY.sign(claims())
        status, seen = await call(mesh, "/h", [f"x-token: Token {good}"])
        assert status == 200 and seen["headers"].get("x-token") == f"Token {good}", "forwarded"
        assert (await call(mesh, "/h", [f"x-token: Token {forged}"]))[0] == 401
        assert (await call(mesh, f"/p?tok={good}"))[0] == 200
        assert (await call(mesh, f"/p?tok={forged}"))[0] == 401
        assert (await call(mesh, "/c", [f"Cookie: a=b; session={good}"]))[0] == 200
        assert (await call(mesh, "/c", [f"Cookie: session={forged}"]))[0] == 401
        # Only the places named are read: Authorization is the app's business now.
        status, seen = await call(mesh, "/a", bearer(forged))
        assert status == 200 and seen["headers"]["authorization"] == f"Bearer {forged}"
    finally:
        await removed(mesh, ra)


async def test_a_jwks_url_that_does_not_answer_refuses_every_token(mesh: Mesh) -> None:
    silent = f"http://{pod_address('c')}:{SILENT_PORT}/jwks.json"
    ra = obj(
        "RequestAuthentication",
        "silent",
        {"selector": REVIEWS_SELECTOR, "jwtRules": [jwt_rule(jwksUri=silent, timeout="1s")]},
    )
    await applied(mesh, ra)
    try:
        assert (await call(mesh, "/good", bearer(KEY.sign(claims()))))[0] == 401
        assert (await call(mesh, "/none"))[0] == 200
    finally:
        await removed(mesh, ra)


async def test_an_https_jwks_server_no_system_root_trusts_gives_no_keys(mesh: Mesh) -> None:
    """The key server answers over TLS with a certificate for its address, but from a root
    of its own: Envoy checks it against the system's roots, so it takes no keys from it."""
    uri = f"https://{pod_address('c')}:{TLS_PORT}/jwks.json"
    ra = obj(
        "RequestAuthentication",
        "tls",
        {"selector": REVIEWS_SELECTOR, "jwtRules": [jwt_rule(jwksUri=uri)]},
    )
    await applied(mesh, ra)
    try:
        assert (await call(mesh, "/good", bearer(KEY.sign(claims()))))[0] == 401
        cluster = f"jwks|https|{pod_address('c')}|{TLS_PORT}"
        failures = await mesh.reviews.stat(f"cluster.{cluster}.ssl.fail_verify_error")
        assert failures, "the fetch failed, but not on the certificate"
    finally:
        await removed(mesh, ra)


async def test_two_issuers_each_token_given_must_be_valid(mesh: Mesh) -> None:
    """Two rules in two places, istiod's requirement: a bad token alone is refused; beside
    a good token of the other issuer it is let through, as Istio lets it (the good one
    satisfies the requirement), yet gives no principal; a scope claim matches word by
    word (space-delimited)."""
    other_issuer = "https://other.example.com"
    second = {
        "issuer": other_issuer,
        "jwks": OTHER_KEY.jwks(),
        "fromHeaders": [{"name": "x-other-token"}],
    }
    ra = obj(
        "RequestAuthentication",
        "two",
        {"selector": REVIEWS_SELECTOR, "jwtRules": [jwt_rule(), second]},
    )
    scoped = {"when": [{"key": "request.auth.claims[scope]", "values": ["write"]}]}
    allow = obj("AuthorizationPolicy", "writers", {"selector": REVIEWS_SELECTOR, "rules": [scoped]})
    await applied(mesh, ra, allow)
    try:
        first = KEY.sign(claims(scope="read write"))
        other = OTHER_KEY.sign(claims(issuer=other_issuer, scope="read write"))
        forged_other = KEY.sign(claims(issuer=other_issuer))
        assert (await call(mesh, "/one", bearer(first)))[0] == 200
        assert (await call(mesh, "/other", [f"x-other-token: {other}"]))[0] == 200
        both_good = [*bearer(first), f"x-other-token: {other}"]
        assert (await call(mesh, "/both", both_good))[0] == 200
        assert (await call(mesh, "/forged", [f"x-other-token: {forged_other}"]))[0] == 401
        one_bad = [*bearer(first), f"x-other-token: {forged_other}"]
        assert (await call(mesh, "/beside", one_bad))[0] == 200
        only_other = {"from": [{"source": {"requestPrincipals": [f"{other_issuer}/*"]}}]}
        others = obj(
            "AuthorizationPolicy", "others", {"selector": REVIEWS_SELECTOR, "rules": [only_other]}
        )
        await applied(mesh, others)
        try:
            # No scope to write: only a principal of the other issuer lets it in.
            plain = KEY.sign(claims())
            beside = [*bearer(plain), f"x-other-token: {forged_other}"]
            assert (await call(mesh, "/beside", beside))[0] == 403, "a forged token's principal"
            with_other = [*bearer(plain), f"x-other-token: {other}"]
            # Envoy's workers take the new chains just after its config dump shows them.
            await settled(mesh, "/other", with_other, 200)
        finally:
            mesh.api.delete("AuthorizationPolicy", APP_NAMESPACE, "others")
        reader = KEY.sign(claims(scope="read"))
        await wait_inbound(mesh, lambda text: "bookinfo/others" not in text, "no others")
        assert (await call(mesh, "/read", bearer(reader)))[0] == 403
    finally:
        await removed(mesh, ra, allow)
