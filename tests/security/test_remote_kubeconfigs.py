"""Remote clusters are hostile input: a multi-cluster Secret (or a `--remote-kubeconfig`
file) is data, never instructions, and one bad Secret neither stalls nor takes over
the rest.

Each test runs the real `pilot discovery` in Kubernetes mode on a test API server
(POD_NAMESPACE set), with the attacker's servers on 127.0.0.1 (`remote_attackers`):

* kubeconfigs that would run a program (exec), send pilot's own token away
  (tokenFile), present pilot's local key files, or fetch an OIDC issuer's URLs are
  refused with one warning each, and the attacker sees nothing; the honest inline
  token (JSON) and inline client certificate work, and an option the operator lists
  in PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS works;
* inline client keys are never written to a file;
* a 20,000-deep and a 586 KB value, 2,000 keys, and a hung remote delay no other
  Secret's add or removal, and `/ready` keeps answering;
* a second Secret naming a held cluster id does not take it over; a newline in an id
  forges no `/ready` line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pilot.kube.kubeconfig import MAX_NAMED_FILE_BYTES
from tests.kubeapi import KubeAPIServer
from tests.security.remote_attackers import (
    Pki,
    Silent,
    b64,
    kubeconfig,
    recorder,
    silent,
)
from tests.support.ca import write_plugged_in
from tests.support.deadline import bounded
from tests.support.envoy_process import wait_until
from tests.support.kube_helpers import apply_mesh, kube_api, ready
from tests.support.many_clusters import PILOT_NAMESPACE, remote_secret
from tests.support.pilot_process import PilotProcess, http_get, launch

ALPHA = "alpha"
WITHIN = 15.0  # generous: the machine is shared
READY_WITHIN = 1.0  # /ready must always answer within this
# 100 clusters' clients, built one at a time, each loading a TLS context: 11 s under load.
START_ALL_WITHIN = 60.0
REFUSALS = "pilot_remote_cluster_refusals_total"


# ------------------------------------------------------------------ harness


@dataclass
class Remote:
    """A test API server standing for a remote cluster; serves alpha at `ip`."""

    srv: KubeAPIServer
    ip: str

    def kubeconfig(self, **user: Any) -> str:
        return yaml.safe_dump(kubeconfig(self.srv.url, user))


@asynccontextmanager
async def pilot_on_local(
    tmp_path: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[KubeAPIServer, PilotProcess]]:
    """The local test API server (alpha at 127.0.0.1) and pilot in Kubernetes mode on it."""
    async with kube_api(tmp_path / "local") as (local, local_kubeconfig):
        apply_mesh(local, {ALPHA: ready("127.0.0.1")})
        ca = write_plugged_in(tmp_path / "plugged-in-ca")
        pilot = await launch(
            tmp_path,
            ["--kubeconfig", str(local_kubeconfig)],
            ca.directory,
            ca.root.cert_pem.encode(),
            env={"POD_NAMESPACE": PILOT_NAMESPACE, **(env or {})},
        )
        try:
            yield local, pilot
        finally:
            await pilot.stop()


@asynccontextmanager
async def remote(ip: str, **options: Any) -> AsyncIterator[Remote]:
    async with KubeAPIServer(**options) as srv:
        apply_mesh(srv, {ALPHA: ready(ip)})
        yield Remote(srv, ip)


async def alpha_endpoints(pilot: PilotProcess) -> dict[str, set[str]]:
    """Cluster id -> the IPs of alpha's endpoints from it, as pilot's registry holds them."""
    registry = await pilot.get_json("/debug/registryz")
    found: dict[str, set[str]] = {}
    for service in registry["services"]:
        if service["name"] == ALPHA:
            for endpoint_set in service["endpoint_sets"]:
                ips = re.findall(r"\d+\.\d+\.\d+\.\d+", json.dumps(endpoint_set["groups"]))
                found.setdefault(endpoint_set["cluster"], set()).update(ips)
    return found


async def wait_endpoints(pilot: PilotProcess, expected: dict[str, set[str]], what: str) -> None:
    await wait_until(
        lambda: alpha_endpoints(pilot), WITHIN, what, until=lambda seen: seen == expected
    )


def warnings_about(pilot: PilotProcess, origin: str, since: int = 0) -> list[str]:
    return [
        e["msg"]
        for e in pilot.logged(lambda e: e["level"] == "warning" and origin in e["msg"], since)
    ]


async def wait_warned(pilot: PilotProcess, origin: str, what: str) -> str:
    found = await pilot.wait_logged(
        lambda e: e["level"] == "warning" and e["msg"].startswith(origin), what, within=WITHIN
    )
    return found[0]["msg"]


def origin(secret: str, key: str) -> str:
    return f"Secret {PILOT_NAMESPACE}/{secret} key {key}"


async def metric(pilot: PilotProcess, name: str, labels: str = "") -> float:
    _status, body = await pilot.get("/metrics")
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    found = re.search(pattern, body, re.M)
    return float(found[1]) if found else 0.0


@dataclass
class ReadyProber:
    """Asks /ready over and over; keeps the slowest answer and every failure."""

    pilot: PilotProcess
    slowest: float = 0.0
    failures: list[str] = field(default_factory=list)
    probes: int = 0

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                status, _body = await bounded(self.pilot.get("/ready"), 5.0)
                if status != 200:
                    self.failures.append(f"HTTP {status}")
            except (TimeoutError, OSError) as error:
                self.failures.append(type(error).__name__)
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.probes += 1
            await asyncio.sleep(0.05)  # a probe period, not a synchronisation

    def check(self) -> None:
        assert self.probes > 0
        assert self.failures == [], self.failures
        assert self.slowest < READY_WITHIN, f"/ready took {self.slowest:.2f}s"


@asynccontextmanager
async def probing(pilot: PilotProcess) -> AsyncIterator[ReadyProber]:
    prober = ReadyProber(pilot)
    task = asyncio.create_task(prober.run())
    try:
        yield prober
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    prober.check()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def key_files(folder: Path, needle: bytes, written_by_the_test: Path) -> list[Path]:
    """Files under `folder` holding `needle`, but for those the test wrote itself."""
    found = []
    for path in folder.rglob("*"):
        if written_by_the_test in path.parents:
            continue
        try:
            if path.is_file() and needle in path.read_bytes():
                found.append(path)
        except OSError:
            pass
    return found


# ------------------------------------------------------------------ what executes


async def test_exec_token_files_key_paths_and_oidc_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "exec-ran"
    pilot_token = "pilot-own-sa-token-9c1e-must-stay-home"
    token_file = tmp_path / "pilot-token"
    token_file.write_text(pilot_token)
    local_keys = Pki.create(tmp_path / "pilot-local-keys", "local")
    attacker_tls = Pki.create(tmp_path / "attacker-tls", "attacker")
    async with (
        pilot_on_local(tmp_path) as (local, pilot),
        remote("127.0.2.1") as west,
        recorder() as attacker,
        recorder(attacker_tls.server_context(ssl.CERT_OPTIONAL)) as attacker_with_tls,
    ):
        exec_plugin = {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": ["-c", f"open({str(marker)!r}, 'w').write('ran')"],
        }
        oidc = {
            "name": "oidc",
            "config": {
                "client-id": "pilot",
                "client-secret": "s",
                "idp-issuer-url": f"{attacker.url}/issuer",
                "refresh-token": "r",
            },
        }
        hostile = {
            "exec": kubeconfig(attacker.url, {"exec": exec_plugin}),
            "tokenfile": kubeconfig(attacker.url, {"tokenFile": str(token_file)}),
            "keypaths": kubeconfig(
                attacker_with_tls.url,
                {
                    "client-certificate": str(local_keys.folder / "client.pem"),
                    "client-key": str(local_keys.folder / "client-key.pem"),
                },
                insecure_skip_tls_verify=True,
            ),
            "oidc": kubeconfig(attacker.url, {"auth-provider": oidc}),
        }
        refused = {
            "exec": "has exec",
            "tokenfile": "has tokenFile",
            "keypaths": "has client-certificate",
            "oidc": "has auth-provider",
        }
        texts = {key: yaml.safe_dump(doc) for key, doc in hostile.items()}
        local.apply(remote_secret("hostile", texts | {"west": west.kubeconfig()}))
        await wait_endpoints(
            pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "west, the honest key"
        )
        for key, problem in refused.items():
            message = await wait_warned(pilot, origin("hostile", key), f"{key} refused")
            assert problem in message, message
            assert "PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS" in message
            assert len(warnings_about(pilot, origin("hostile", key))) == 1
        # A change elsewhere in the Secret neither retries nor warns again.
        local.apply(remote_secret("hostile", texts))
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}}, "west's key removed")
        assert not marker.exists(), "the exec plugin ran"
        assert attacker.seen == [], [s.path for s in attacker.seen]
        assert attacker_with_tls.seen == []
        assert not any(pilot_token in s.authorization for s in attacker.seen)
        for key in refused:
            assert len(warnings_about(pilot, origin("hostile", key))) == 1
        assert (
            await metric(pilot, "pilot_remote_cluster_refusals_total", '{reason="kubeconfig"}') == 4
        )
        assert (await pilot.get("/ready"))[1].splitlines() == [
            "ready",
            "cluster Kubernetes: synced",
        ]


def test_a_remote_kubeconfig_flag_with_exec_stops_pilot_at_start(tmp_path: Path) -> None:
    marker = tmp_path / "exec-ran"
    plugin = {"command": sys.executable, "args": ["-c", f"open({str(marker)!r}, 'w')"]}
    flagged = tmp_path / "west.yaml"
    flagged.write_text(yaml.safe_dump(kubeconfig("http://127.0.0.1:9", {"exec": plugin})))
    mesh = tmp_path / "mesh.yaml"
    mesh.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    ca = write_plugged_in(tmp_path / "ca")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pilot", "discovery", "--config", str(mesh)),
            *("--xds-auth", "none", "--grpc-addr", "127.0.0.1:0"),
            *("--grpc-tls-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"),
            *("--webhook-addr", ""),
            *("--ca-cert-dir", str(ca.directory), "--ca-state-dir", str(tmp_path / "state")),
            *("--drain-duration", "0s", "--remote-kubeconfig", f"west={flagged}"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert not marker.exists(), "the exec plugin ran"
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("pilot: error: ")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith(f"pilot: error: --remote-kubeconfig west={flagged}: refused")
    assert "has exec" in errors[0]


async def test_inline_client_keys_work_and_never_touch_the_disk(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path / "west-pki", "west")
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    key_body = b"".join(pki.client_key.splitlines()[1:-1])  # the base64 between the lines
    async with (
        pilot_on_local(tmp_path, {"TMPDIR": str(tmpdir)}) as (local, pilot),
        remote("127.0.2.1", ssl_context=pki.server_context(ssl.CERT_REQUIRED)) as west,
    ):
        text = yaml.safe_dump(
            kubeconfig(
                west.srv.url,
                {
                    "client-certificate-data": b64(pki.client_cert),
                    "client-key-data": b64(pki.client_key),
                },
                certificate_authority_data=b64(pki.ca.cert_pem),
            )
        )
        local.apply(remote_secret("remotes", {"west": text}))
        # The server requires a client certificate from its CA: these endpoints prove it.
        await wait_endpoints(
            pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "west over mTLS"
        )
        assert key_files(tmp_path, key_body, pki.folder) == []
        local.delete("Secret", PILOT_NAMESPACE, "remotes")
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}}, "west removed")
        assert key_files(tmp_path, key_body, pki.folder) == []
        assert list(tmpdir.iterdir()) == []


async def test_inline_tokens_work_and_an_allowed_option_works(tmp_path: Path) -> None:
    token_file = tmp_path / "east-token"
    token_file.write_text("east-token-2b7d\n")
    allowed = {"PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS": "tokenFile"}
    async with (
        pilot_on_local(tmp_path, allowed) as (local, pilot),
        remote("127.0.2.1", require_token="west-token-51aa") as west,
        remote("127.0.3.1", require_token="east-token-2b7d") as east,
    ):
        as_json = json.dumps(kubeconfig(west.srv.url, {"token": "west-token-51aa"}))
        from_file = east.kubeconfig(tokenFile=str(token_file))
        local.apply(remote_secret("remotes", {"west": as_json, "east": from_file}))
        await wait_endpoints(
            pilot,
            {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}, "east": {"127.0.3.1"}},
            "west (inline token, JSON) and east (tokenFile, allowed)",
        )


# ------------------------------------------------------------------ size and count


def deep_yaml(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_deep_and_huge_values_stall_nothing(tmp_path: Path) -> None:
    async with (
        pilot_on_local(tmp_path) as (local, pilot),
        remote("127.0.2.1") as west,
        probing(pilot),
    ):
        huge = west.kubeconfig(token="x" * 600_000)  # 586 KB and more
        local.apply(remote_secret("bad", {"deep": deep_yaml(20_000), "huge": huge}))
        await wait_warned(pilot, origin("bad", "deep"), "the deep value refused")
        message = await wait_warned(pilot, origin("bad", "huge"), "the huge value refused")
        assert "PILOT_MAX_REMOTE_KUBECONFIG_BYTES" in message
        # Later Secrets are still applied and removed.
        local.apply(remote_secret("good", {"west": west.kubeconfig()}))
        await wait_endpoints(
            pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "a later Secret"
        )
        local.delete("Secret", PILOT_NAMESPACE, "good")
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}}, "the later Secret removed")
        for key in ("deep", "huge"):
            assert len(warnings_about(pilot, origin("bad", key))) == 1, key


async def test_two_thousand_keys_are_bounded_and_given_back(tmp_path: Path) -> None:
    async with (
        pilot_on_local(tmp_path) as (local, pilot),
        silent() as nowhere,
    ):
        await wait_until(
            lambda: pilot.get("/ready"), WITHIN, "pilot ready", until=lambda a: a[0] == 200
        )
        before = rss_mb(pilot.pid)
        text = yaml.safe_dump(kubeconfig(nowhere.url, {"token": "t"}))
        many = {f"c{n:04d}": text for n in range(2000)}
        async with probing(pilot):
            local.apply(remote_secret("many", many))
            (entry,) = await pilot.wait_logged(
                lambda e: "limit remote_clusters" in e["msg"], "the limit hit", within=WITHIN
            )
            assert "1900 cluster ids past the first 100" in entry["msg"], entry["msg"]
            await wait_until(
                lambda: metric(pilot, "pilot_remote_clusters"),
                START_ALL_WITHIN,
                "100 remote clusters",
                until=lambda n: n == 100,
            )
            hits = await metric(pilot, "pilot_limit_hits_total", '{limit="remote_clusters"}')
            assert hits == 1900
            local.delete("Secret", PILOT_NAMESPACE, "many")
            await wait_until(
                lambda: metric(pilot, "pilot_remote_clusters"),
                WITHIN,
                "no remote cluster",
                until=lambda n: n == 0,
            )
        limit_lines = pilot.logged(lambda e: "limit remote_clusters" in e["msg"])
        assert len(limit_lines) == 1
        await wait_until(
            lambda: asyncio.sleep(0.2, rss_mb(pilot.pid)),
            30.0,
            f"RSS back within 50 MB of {before:.0f} MB",
            until=lambda rss: rss < before + 50,
        )


async def test_the_remote_cluster_limit_admits_the_next_when_one_goes(tmp_path: Path) -> None:
    async with (
        pilot_on_local(tmp_path, {"PILOT_MAX_REMOTE_CLUSTERS": "1"}) as (local, pilot),
        remote("127.0.2.1") as west,
        remote("127.0.3.1") as east,
    ):
        local.apply(remote_secret("first", {"west": west.kubeconfig()}))
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "west")
        local.apply(remote_secret("second", {"east": east.kubeconfig()}))
        (entry,) = await pilot.wait_logged(
            lambda e: "limit remote_clusters" in e["msg"], "east refused by the limit"
        )
        assert origin("second", "east") in entry["msg"]
        assert await alpha_endpoints(pilot) == {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}
        local.delete("Secret", PILOT_NAMESPACE, "first")
        await wait_endpoints(
            pilot, {"Kubernetes": {"127.0.0.1"}, "east": {"127.0.3.1"}}, "east admitted"
        )


# ------------------------------------------------------------------ others stall nobody


async def test_a_hung_remote_delays_no_other_cluster(tmp_path: Path) -> None:
    """A cluster whose start never ends (its start deadline is an hour) holds back no
    other: west comes and goes while the hung one is still being started."""
    never = {"PILOT_REMOTE_CLUSTER_START_TIMEOUT": "1h"}
    async with _hung_and_west(tmp_path, never) as (local, pilot, hung, west):
        local.apply(remote_secret("a-slow", {"slow": _hung_oidc(hung.url)}))
        await wait_until(
            lambda: asyncio.sleep(0.05, hung.connections),
            WITHIN,
            "the issuer called",
            until=lambda n: n > 0,
        )
        local.apply(remote_secret("b-west", {"west": west.kubeconfig()}))
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "west")
        local.delete("Secret", PILOT_NAMESPACE, "b-west")
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}}, "west removed")
        hung_ended = pilot.logged(lambda e: e["msg"].startswith(origin("a-slow", "slow")))
        assert hung_ended == [], "the hung cluster's start ended before west came and went"
        local.delete("Secret", PILOT_NAMESPACE, "a-slow")  # the hung one goes too
        await wait_until(
            lambda: pilot.get("/ready"),
            WITHIN,
            "only the local cluster",
            until=lambda a: a[1].splitlines() == ["ready", "cluster Kubernetes: synced"],
        )


async def test_a_start_that_hangs_times_out_alone(tmp_path: Path) -> None:
    """A cluster whose own start hangs (an allowed auth provider's issuer that never
    answers) is refused after PILOT_REMOTE_CLUSTER_START_TIMEOUT, saying so; a cluster
    added meanwhile comes up; and pilot still stops on SIGTERM."""
    start_timeout = {"PILOT_REMOTE_CLUSTER_START_TIMEOUT": "1s"}
    async with _hung_and_west(tmp_path, start_timeout) as (local, pilot, hung, west):
        local.apply(remote_secret("a-hung", {"hung": _hung_oidc(hung.url)}))
        local.apply(remote_secret("b-west", {"west": west.kubeconfig()}))
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "west")
        refused = await wait_warned(pilot, origin("a-hung", "hung"), "the hung cluster refused")
        assert "not ready within 1s (PILOT_REMOTE_CLUSTER_START_TIMEOUT)" in refused, refused
        assert hung.connections > 0, "the issuer was never asked"
        assert await metric(pilot, "pilot_remote_clusters") == 1


@asynccontextmanager
async def _hung_and_west(
    tmp_path: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[KubeAPIServer, PilotProcess, Silent, Remote]]:
    """pilot allowing auth providers (with `env` too), an issuer that accepts and never
    answers, and a healthy remote cluster `west`; /ready probed throughout."""
    allowed = {"PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS": "authProvider", **(env or {})}
    async with (
        pilot_on_local(tmp_path, allowed) as (local, pilot),
        silent() as hung,
        remote("127.0.2.1") as west,
        probing(pilot),
    ):
        yield local, pilot, hung, west


def _hung_oidc(url: str) -> str:
    """A kubeconfig whose OIDC auth provider's issuer is at `url`."""
    oidc = {
        "name": "oidc",
        "config": {
            "client-id": "pilot",
            "client-secret": "s",
            "idp-issuer-url": url,
            "refresh-token": "r",
        },
    }
    return yaml.safe_dump(kubeconfig(url, {"auth-provider": oidc}))


async def test_files_a_kubeconfig_names_are_regular_and_bounded(tmp_path: Path) -> None:
    """Where the operator allows files, a FIFO nobody writes (it held a worker thread, and
    pilot's exit, for good), a device that never ends, and a file past the bound are each
    refused at once, saying why; a regular file next to them is read; pilot stops on
    SIGTERM."""
    fifo, huge, token = tmp_path / "fifo", tmp_path / "huge", tmp_path / "token"
    os.mkfifo(fifo)
    huge.write_bytes(b"t" * (MAX_NAMED_FILE_BYTES + 1))
    token.write_text("west-token-51aa\n")
    env = {"PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS": "tokenFile,certificateAuthority"}
    async with (
        pilot_on_local(tmp_path, env) as (local, pilot),
        remote("127.0.2.1", require_token="west-token-51aa") as west,
        probing(pilot),
    ):
        server = west.srv.url
        named = {
            "fifo": yaml.safe_dump(kubeconfig(server, {"tokenFile": str(fifo)})),
            "zero": yaml.safe_dump(
                kubeconfig(server, {"token": "t"}, certificate_authority="/dev/zero")
            ),
            "huge": yaml.safe_dump(kubeconfig(server, {"tokenFile": str(huge)})),
            "west": west.kubeconfig(tokenFile=str(token)),
        }
        local.apply(remote_secret("named-files", named))
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "west")
        said = {
            key: await wait_warned(pilot, origin("named-files", key), f"{key} refused")
            for key in ("fifo", "zero", "huge")
        }
        assert "tokenFile is not a regular file" in said["fifo"], said
        assert "certificate-authority is not a regular file" in said["zero"], said
        assert f"tokenFile is larger than {MAX_NAMED_FILE_BYTES} bytes" in said["huge"], said


# ------------------------------------------------------------------ names and claims


async def test_a_later_secret_cannot_take_over_a_cluster_id(tmp_path: Path) -> None:
    async with (
        pilot_on_local(tmp_path) as (local, pilot),
        remote("127.0.2.1") as west,
        remote("127.0.9.1") as attacker,
    ):
        local.apply(remote_secret("remote-west", {"west": west.kubeconfig()}))
        both = {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}
        await wait_endpoints(pilot, both, "west")
        local.apply(remote_secret("aaa-attacker", {"west": attacker.kubeconfig()}))
        message = await wait_warned(pilot, origin("aaa-attacker", "west"), "the claim refused")
        assert origin("remote-west", "west") in message, message
        assert await alpha_endpoints(pilot) == both
        assert (
            await metric(pilot, "pilot_remote_cluster_refusals_total", '{reason="conflict"}') == 1
        )
        # The holder lets go: the next claimant takes over.
        local.delete("Secret", PILOT_NAMESPACE, "remote-west")
        await wait_endpoints(
            pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.9.1"}}, "the next claimant"
        )


async def test_a_newline_in_a_cluster_id_forges_no_ready_line(tmp_path: Path) -> None:
    async with (
        pilot_on_local(tmp_path) as (local, pilot),
        remote("127.0.2.1") as west,
    ):
        forged = "evil\ncluster FORGED: synced"
        local.apply(
            remote_secret("remotes", {forged: west.kubeconfig(), "west": west.kubeconfig()})
        )
        await wait_endpoints(pilot, {"Kubernetes": {"127.0.0.1"}, "west": {"127.0.2.1"}}, "west")
        message = await wait_warned(
            pilot, f"Secret {PILOT_NAMESPACE}/remotes key 'evil\\ncluster", "the bad key"
        )
        assert "\n" not in message
        _status, body = await http_get(f"http://127.0.0.1:{pilot.http_port}/ready")
        assert body.splitlines() == [
            "ready",
            "cluster Kubernetes: synced",
            "cluster west: synced",
        ]
