"""Path DENY and ALLOW on real sidecars under Istio's default normalization (BASE):
every spelling of a denied path an app could take for it is refused, by b's sidecar
alone (from c, no sidecar) and through a's too; other paths reach the app as BASE
normalizes them (the app records the request target it received); an ALLOW's path
lets in only its own spelling; path templates; and one request for each bypass
Istio's security bulletins describe.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.integration.mesh_pods import Mesh
from tests.integration.path_pods import (
    answers,
    hold,
    path_mesh,
    policy,
    release,
    send,
    to_paths,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

# Spellings of /deny and of a path under /admin/ that an app may take for them.
DENY_SPELLINGS = [
    "/deny", "/a/../deny", "/DENY", "/Deny", "//deny", "/%2Fdeny", "/%2fdeny", "/%5Cdeny",
    "/%5cdeny", "\\deny", "/\\deny", "/%64eny", "/deny#frag", "/deny?x=1", "/./deny", "/deny/",
    "/%2e/deny", "/x/..%2Fdeny",
]  # fmt: skip
ADMIN_SPELLINGS = [
    "/admin/x", "/admin//x", "/ADMIN/x", "//admin/x", "/admin%2Fx", "/a/../admin/x",
    "/%61dmin/x", "/admin\\x",
]  # fmt: skip
# Other paths get through, and the app receives them as Envoy's BASE normalization
# leaves them (dot segments resolved, unreserved percent-encodings decoded, a backslash made
# `/`; case, doubled slashes, %2F and %5C kept).
PASSED = {
    "/allowed": "/allowed",
    "/denyx": "/denyx",  # another resource: exact paths, as Istio
    "/x/deny": "/x/deny",
    "/admin": "/admin",  # /admin/* is what lies under /admin/, as Istio
    "/administrator": "/administrator",
    "/a/../allowed": "/allowed",
    "/%61llowed": "/allowed",
    "//allowed": "//allowed",
    "/Allowed%2Fx": "/Allowed%2Fx",
    "/allowed%5Cx": "/allowed%5Cx",
    "/allowed\\x": "/allowed/x",  # a backslash becomes a slash
    "/allowed?q=/deny": "/allowed?q=/deny",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    async with path_mesh(tmp_path_factory.mktemp("pod-paths")) as running:
        yield running


def _refused(found: dict[str, tuple[int, str]]) -> list[str]:
    """Targets that got through to the app (none should)."""
    return [f"{t!r}: {status}, app saw {seen!r}" for t, (status, seen) in found.items() if seen]


async def test_a_deny_holds_against_every_spelling_of_its_paths(mesh: Mesh) -> None:
    deny = policy("deny-paths", "DENY", to_paths("paths", "/deny", "/admin/*"))
    await hold(mesh, deny)
    try:
        for client in ("c", "a"):
            found = await answers(mesh, client, DENY_SPELLINGS + ADMIN_SPELLINGS)
            assert not _refused(found), (client, _refused(found))
            # RBAC refuses them (403); Envoy refuses a fragment itself (400: this Envoy
            # rejects paths with `#`) and closes the connection of a target without a
            # leading slash (0).
            statuses = {t: status for t, (status, _) in found.items()}
            assert statuses.pop("/deny#frag") == 400 and statuses.pop("\\deny") in (0, 400)
            assert set(statuses.values()) == {403}, (client, statuses)
            assert found["/DENY"][0] == found["//deny"][0] == found["/%2Fdeny"][0] == 403
            huge = "/deny/" + "a" * 100_000  # past Envoy's 60 KiB of headers: refused or closed
            ((status, seen),) = (await answers(mesh, client, [huge])).values()
            assert not seen and status in (0, 403, 431), status
            passed = await answers(mesh, client, list(PASSED))
            assert {t: v for t, v in passed.items()} == {
                t: (200, seen) for t, seen in PASSED.items()
            }, client
    finally:
        await release(mesh, deny)


async def test_an_allow_lets_in_only_its_own_spelling(mesh: Mesh) -> None:
    allow = policy("allow-public", "ALLOW", to_paths("paths", "/public", "/static/*", "/marker/*"))
    await hold(mesh, allow)
    try:
        for client in ("c", "a"):
            found = await answers(mesh, client, ["/public", "/public?x=1", "/static/a.css"])
            assert all(status == 200 and seen for status, seen in found.values()), found
            odd = ["/PUBLIC", "//public", "/%2Fpublic", "/public/", "/Static/a.css",
                   "/static/..%2Fsecret", "/static/..%5Csecret", "/private"]  # fmt: skip
            found = await answers(mesh, client, odd)
            assert not _refused(found), (client, _refused(found))
    finally:
        await release(mesh, allow)


async def test_path_templates_deny_and_allow(mesh: Mesh) -> None:
    deny = policy("deny-templates", "DENY", to_paths("paths", "/users/{*}/secret", "/files/{**}"))
    await hold(mesh, deny)
    try:
        found = await answers(mesh, "c", [
            "/users/bob/secret", "/USERS/bob/secret", "/users/bob//secret",
            "/users/a%2Fb/secret", "/files/", "/files/a/b", "//Files/x",
        ])  # fmt: skip
        assert not _refused(found), _refused(found)
        found = await answers(mesh, "c", ["/users/bob/public", "/users/a/b/secret", "/files"])
        assert all(status == 200 for status, _ in found.values()), found
    finally:
        await release(mesh, deny)
    allow = policy(
        "allow-templates",
        "ALLOW",
        to_paths("paths", "/users/{*}/profile", "/docs/{**}", "/marker/*"),
    )
    await hold(mesh, allow)
    try:
        found = await answers(mesh, "c", ["/users/bob/profile", "/docs/a/b.html", "/docs/"])
        assert all(status == 200 for status, _ in found.values()), found
        found = await answers(mesh, "c", [
            "/users/a/b/profile", "/Users/bob/profile", "/users/bob/profile/x",
            "/docs/..%2F..%2Fusers", "/docs", "/users/%2Fx/profile",
        ])  # fmt: skip
        assert not _refused(found), _refused(found)
    finally:
        await release(mesh, allow)


async def test_the_bypasses_of_istios_security_bulletins_are_refused(mesh: Mesh) -> None:
    """One request each that once went through a DENY (or an ALLOW with notPaths):
    CVE-2019-9901 (`..` not normalized), CVE-2021-31920 / ISTIO-SECURITY-2021-005
    (`//`, `%2F`, `%5C`), CVE-2021-39156 / ISTIO-SECURITY-2021-008 (a fragment), the
    case of a path (Istio's best practices), CVE-2021-39155 (the Host header's case)."""
    deny = policy("deny-admin", "DENY", to_paths("paths", "/admin"))
    not_admin = policy("allow-not-admin", "ALLOW", to_paths("notPaths", "/admin"))
    hosts = policy("deny-host", "DENY", [{"to": [{"operation": {"hosts": ["evil.example"]}}]}])
    bypasses = ["/public/../admin", "//admin", "/%2Fadmin", "/%5Cadmin", "/admin#x", "/ADMIN"]
    for policies in ((deny,), (not_admin,)):
        await hold(mesh, *policies)
        try:
            found = await answers(mesh, "c", bypasses)
            assert not _refused(found), (policies[0]["metadata"]["name"], _refused(found))
        finally:
            await release(mesh, *policies)
    await hold(mesh, hosts)
    try:
        for host in ("evil.example", "Evil.Example", "EVIL.EXAMPLE"):
            assert await send(mesh, "c", f"/h-{secrets.token_hex(2)}", host=host) == 403, host
        assert await send(mesh, "c", "/h-ok", host="good.example") == 200
    finally:
        await release(mesh, hosts)
