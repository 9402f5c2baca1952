"""pilot's local surfaces, attacked: the debug listener's Host header, and where the
Quick start (`--config`, `--xds-auth none`) listens.

- DNS rebinding: a page on evil.example whose DNS answers 127.0.0.1 makes the
  operator's browser a loopback caller of pilot with `Host: evil.example`. Every
  /debug endpoint, and everything on the `--debug-addr` listener, answers only a Host
  that names loopback or the address the caller connected to: 403 otherwise. /ready
  and /metrics on `--http-addr` answer any Host (probes and scrapers name the pod).
  (Any Host was answered.)
- A `--debug-addr` off loopback is a warning at start. (It was taken without a word.)
- With `--xds-auth none` any caller gets any identity's certificate, so the Quick start
  listens on loopback only; an address off loopback is refused at start (exit 2, one
  line naming the flag to add) unless `--insecure-bind-any` is given, which is a
  warning. (It listened on every interface.)

Every pilot is a real `pilot discovery` subprocess; callers are on this machine, on
loopback or on its own non-loopback address (tests/support/addresses.py).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.addresses import outside_address, url
from tests.support.envoy_process import EXAMPLES_DIR, wait_until
from tests.support.machine_lock import QUICK_START_PORTS, held
from tests.support.pilot_process import (
    pilot_environment,
    start_command,
    start_file_pilot_with_ca,
)
from tests.support.xds_client import CLUSTER, XdsClient, node

MESH = EXAMPLES_DIR / "mesh.yaml"
PROXY = "sidecar~127.0.0.1~rebinding-victim.default~default.svc.cluster.local"
FOREIGN_HOSTS = ("evil.example", "evil.example:15014", "10.255.0.1", "[2001:db8::1]:80")
README_PORTS = (15010, 15012, 15014)  # gRPC, TLS gRPC, HTTP, as the README prints
READY = (200, "ready\ncluster Kubernetes: synced\n")


async def _get(target: str, path: str, host: str, source: str | None = None) -> tuple[int, Any]:
    """GET http://TARGET/PATH with the Host header `host` (as a rebinding browser sends)."""
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(local_addr=(source, 0) if source else None)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        session.get(f"http://{target}{path}", headers={"Host": host}) as reply,
    ):
        return reply.status, await reply.text()


async def _connected_proxy(client: XdsClient, debug: str, source: str | None = None) -> None:
    """A proxy with clusters, so that its config_dump exists; waits until the debug
    listener at `debug` (HOST:PORT) shows it."""
    stream = client.delta_ads(node(PROXY))
    await stream.subscribe(CLUSTER, ["*"])
    await stream.ack(await stream.next_response(10))

    async def listed() -> str:
        return (await _get(debug, "/debug/syncz", debug, source))[1]

    await wait_until(listed, 10, "the proxy in /debug/syncz", until=lambda rows: PROXY in rows)


def _dump(proxy: str = PROXY) -> str:
    return f"/debug/config_dump?proxyID={proxy}"


async def test_the_http_port_answers_debug_only_to_loopback_hosts(tmp_path: Path) -> None:
    pilot = await start_file_pilot_with_ca(tmp_path, MESH)
    try:
        target = f"127.0.0.1:{pilot.http_port}"
        async with XdsClient(pilot.target(tls=False)) as client:
            await _connected_proxy(client, target)
            for host in FOREIGN_HOSTS:
                for path in (_dump(), "/debug/syncz", "/debug/", "/debug/registryz"):
                    status, body = await _get(target, path, host)
                    assert status == 403, f"{path} with Host {host}: HTTP {status}"
                    assert PROXY not in body
                # Probes and scrapers name the pod or a Service: any Host is answered.
                assert await _get(target, "/ready", host) == READY
                status, _ = await _get(target, "/metrics", host)
                assert status == 200
            port = pilot.http_port
            for host in (f"127.0.0.1:{port}", "localhost", f"localhost:{port}", "[::1]:1"):
                status, body = await _get(target, _dump(), host)
                assert status == 200, f"config_dump with Host {host}: HTTP {status}"
                assert PROXY in body
                assert (await _get(target, "/debug/syncz", host))[0] == 200
        refusals = [e for e in pilot.log if "(DNS rebinding?)" in e["msg"]]
        assert refusals and len(refusals) < 5, "refusals are logged, rate-limited"
    finally:
        await pilot.stop()


async def test_a_debug_listener_off_loopback_answers_only_its_own_address(
    tmp_path: Path,
) -> None:
    outside = outside_address()
    listen = f"[{outside}]:0" if ":" in outside else f"{outside}:0"
    pilot = await start_file_pilot_with_ca(tmp_path, MESH, "--debug-addr", listen)
    try:
        warned = [e for e in pilot.log if e["msg"].startswith("--debug-addr")]
        assert len(warned) == 1 and warned[0]["level"] == "warning", pilot.tail()
        assert "reads every proxy's configuration" in warned[0]["msg"]
        own = url(outside, pilot.debug_port, "")[len("http://") :]
        async with XdsClient(pilot.target(tls=False)) as client:
            await _connected_proxy(client, own, outside)
            for host in FOREIGN_HOSTS:
                for path in (_dump(), "/debug/syncz", "/ready", "/metrics"):
                    status, _ = await _get(own, path, host, source=outside)
                    assert status == 403, f"{path} with Host {host}: HTTP {status}"
            for path in (_dump(), "/debug/syncz"):
                status, body = await _get(own, path, own, source=outside)
                assert status == 200, f"{path} with its own address as Host: HTTP {status}"
            assert PROXY in body
    finally:
        await pilot.stop()


async def test_a_debug_listener_on_loopback_refuses_foreign_hosts_without_warning(
    tmp_path: Path,
) -> None:
    pilot = await start_file_pilot_with_ca(tmp_path, MESH, "--debug-addr", "127.0.0.1:0")
    try:
        assert not [e for e in pilot.log if e["msg"].startswith("--debug-addr")]
        target = f"127.0.0.1:{pilot.debug_port}"
        assert (await _get(target, "/debug/syncz", "evil.example"))[0] == 403
        assert (await _get(target, "/debug/syncz", target))[0] == 200
    finally:
        await pilot.stop()


# -- where --xds-auth none listens --------------------------------------------------


def _ports_free(ports: tuple[int, ...]) -> bool:
    """Whether nothing listens on these ports, on any address (the Quick start's own)."""
    for port in ports:
        with socket.socket() as sock:
            # As pilot binds: a listener still refuses it, an earlier test's TIME_WAIT not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def _reachable(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as sock:
        sock.settimeout(5)
        sock.bind((address, 0))
        try:
            sock.connect((address, port))
        except OSError:
            return False
    return True


@pytest.fixture
def quick_start_ports() -> Iterator[None]:
    """The README's fixed ports, this test's alone while it runs (other workers wait)."""
    with held(QUICK_START_PORTS):
        yield


@pytest.mark.usefixtures("quick_start_ports")
async def test_the_quick_start_listens_on_loopback_only(tmp_path: Path) -> None:
    outside = outside_address()
    if not _ports_free(README_PORTS):
        pytest.fail("another process holds 15010, 15012 or 15014: the Quick start cannot run")
    shutil.copytree(EXAMPLES_DIR, tmp_path / "examples")
    # The README's command, exactly (the installed console script is `python -m pilot`).
    command = [sys.executable, "-m", "pilot", "discovery", "--config", "examples/mesh.yaml"]
    env = pilot_environment(tmp_path)
    pilot = await start_command(tmp_path, command, env=env)
    try:
        assert (pilot.grpc_port, pilot.tls_port, pilot.http_port) == README_PORTS
        for port in README_PORTS:
            assert _reachable("127.0.0.1", port), f"127.0.0.1:{port} is not served"
            assert not _reachable(outside, port), f"{outside}:{port} answers off loopback"
        assert await pilot.get("/ready") == READY
    finally:
        await pilot.stop()


async def _exit(command: list[str], folder: Path) -> tuple[int | None, str]:
    """Run pilot; its exit status and stderr, or None if it still runs after 20 s
    (then it is stopped)."""
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=folder,
        env=pilot_environment(folder),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(20):
            _, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        return None, ""
    return process.returncode, err.decode()


@pytest.mark.parametrize(
    "flags",
    [
        ("--grpc-addr", "0.0.0.0:0"),
        ("--http-addr", "[::]:0"),
        ("--grpc-tls-addr", ":0"),
        ("--xds-auth", "none", "--grpc-addr", "0.0.0.0:0"),
    ],
    ids=["grpc", "http", "tls", "explicit-none"],
)
async def test_xds_auth_none_refuses_addresses_off_loopback(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    command = [sys.executable, "-m", "pilot", "discovery", "--config", str(MESH), *flags]
    command += ["--ca-state-dir", str(tmp_path / "ca")]
    code, err = await _exit(command, tmp_path)
    assert code is not None, f"pilot started on {' '.join(flags)} instead of refusing it"
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    flag = flags[-2]
    assert lines[0].startswith(f"pilot: error: {flag} "), lines[0]
    assert "--insecure-bind-any" in lines[0]


async def test_insecure_bind_any_binds_off_loopback_with_a_warning(tmp_path: Path) -> None:
    outside = outside_address()
    pilot = await start_file_pilot_with_ca(
        tmp_path, MESH, "--http-addr", "0.0.0.0:0", "--insecure-bind-any"
    )
    try:
        warned = [e for e in pilot.log if e["msg"].startswith("--insecure-bind-any")]
        assert len(warned) == 1 and warned[0]["level"] == "warning", pilot.tail()
        assert "--http-addr 0.0.0.0:0" in warned[0]["msg"]
        assert _reachable(outside, pilot.http_port)
    finally:
        await pilot.stop()
