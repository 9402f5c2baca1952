"""The pilot under fuzz: a real `pilot discovery` subprocess and what examples need of it.

Two modes, each started by `tests.support.pilot_process`:

- `file`: `--config` on a copy of examples/mesh.yaml, `--xds-auth none` (identity
  from node metadata);
- `kube`: the test API server (`tests.support.peers.running_mesh`: three Services and
  the tokens of ns-b/victim and ns-a/attacker), `--xds-auth kubernetes`, so every call
  carries a service-account token checked by TokenReview; calls go to the TLS port,
  where pilot serves tokens and keys in Kubernetes mode.

A `Target` lives on a `LoopThread`: the process, its log reader, the `/ready` prober
(a process of its own), and one *resident* proxy, an ADS stream held open throughout
so that CSDS always has a proxy to match node matchers against. Its node id ends in a
run of `a`s, the kind of subject a backtracking regex chokes on. Examples use a
blocking gRPC channel from the test's thread (see `exchange`).

Between examples `settle` waits until only the resident is connected, and
`sync_logs` opens a stream with a fresh node id and waits for pilot to log its
connection: every line pilot logged for the example is then in `pilot.log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from tests.fuzz.calls import Credentials, Header
from tests.fuzz.exchange import Metadata
from tests.fuzz.loop import LoopThread
from tests.fuzz.ready import ReadyProber
from tests.support.ca import sa_token
from tests.support.peers import ATTACKER, VICTIM, running_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.xds_client import CLUSTER, XdsClient, node, sotw_names

ROOT = Path(__file__).resolve().parents[2]
MESH = ROOT / "examples" / "mesh.yaml"
RESIDENT_ID = "fuzz-resident~" + "a" * 23 + "~x"
RESIDENT_METADATA = {"NAMESPACE": "default", "SERVICE_ACCOUNT": "resident"}
WAIT = 10.0  # seconds pilot gets to settle, log, or start a resident
_TASKS = re.compile(r"^pilot_asyncio_tasks\s+([0-9.e+]+)\s*$", re.MULTILINE)
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]


@dataclass
class Target:
    """A running pilot, how to reach it, and the accounts the fuzzer may speak as."""

    mode: str
    loop: LoopThread
    pilot: PilotProcess
    clusters: tuple[str, ...]
    tokens: dict[Credentials, str] = field(repr=False)
    prober: ReadyProber = field(init=False, repr=False)
    channel: grpc.Channel = field(init=False, repr=False)
    _stack: contextlib.AsyncExitStack = field(repr=False, default_factory=contextlib.AsyncExitStack)
    _sync_channel: grpc.aio.Channel | None = field(default=None, repr=False)
    _http: aiohttp.ClientSession | None = field(default=None, repr=False)
    _ids: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    @property
    def grpc_target(self) -> str:
        return self.pilot.target(tls=self.kube)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS trusting pilot's root in Kubernetes mode; None (plaintext) in file mode."""
        return grpc.ssl_channel_credentials(self.pilot.root_pem) if self.kube else None

    @property
    def kube(self) -> bool:
        return self.mode == "kube"

    # -- credentials -------------------------------------------------------------

    def metadata(self, credentials: Credentials | Header) -> Metadata | None:
        """The call metadata for `credentials` (file mode: no token unless asked)."""
        if isinstance(credentials, Header):
            return (("authorization", credentials.value),)
        token = self.tokens.get(credentials)
        return (("authorization", f"Bearer {token}"),) if token else None

    # -- between examples (on the loop) ------------------------------------------------

    async def _get(self, path: str) -> str:
        assert self._http is not None
        url = f"http://127.0.0.1:{self.pilot.http_port}{path}"
        async with self._http.get(url) as reply:
            return await reply.text()

    async def connections(self) -> int:
        """Streams pilot has registered (/debug/connections)."""
        return len(json.loads(await self._get("/debug/connections")))

    async def settle(self, residents: int = 1, within: float = WAIT) -> int:
        """Wait until only `residents` streams are connected; the count (late: more)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            count = await self.connections()
            if count <= residents or loop.time() > deadline:
                return count
            await asyncio.sleep(0.005)  # polling pilot's view of its streams, with a deadline

    async def sync_logs(self) -> bool:
        """Open a stream with a fresh node id; True once pilot logged its connection."""
        node_id = f"fuzz-sync-{next(self._ids)}"
        mark = self.pilot.mark()
        assert self._sync_channel is not None
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self._sync_channel)
        call = stub.DeltaAggregatedResources(metadata=self.metadata(Credentials.DEFAULT))
        try:
            request = discovery_pb2.DeltaDiscoveryRequest(
                node=node(node_id, None if self.kube else RESIDENT_METADATA), type_url=CLUSTER
            )
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.write(request)
            found = await self.pilot.until_logged(
                lambda e: f"proxy {node_id} " in e["msg"] and "connected" in e["msg"], mark, WAIT
            )
            return bool(found)
        finally:
            call.cancel()

    async def tasks(self) -> int:
        """pilot_asyncio_tasks from /metrics (-1 if pilot does not export it)."""
        match = _TASKS.search(await self._get("/metrics"))
        return int(float(match[1])) if match else -1

    def rss(self) -> int:
        """pilot's resident set size in bytes (VmRSS in /proc/PID/status)."""
        for line in Path(f"/proc/{self.pilot.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pilot (pid {self.pilot.pid})")

    # -- lifecycle ------------------------------------------------------------------

    async def _open(self) -> None:
        self.prober = ReadyProber(self.pilot.http_port)
        await self.prober.start()
        credentials = self.channel_credentials()
        if credentials is None:
            self.channel = grpc.insecure_channel(self.grpc_target, options=_CHANNEL_OPTIONS)
            self._sync_channel = grpc.aio.insecure_channel(self.grpc_target)
        else:
            self.channel = grpc.secure_channel(self.grpc_target, credentials, _CHANNEL_OPTIONS)
            self._sync_channel = grpc.aio.secure_channel(self.grpc_target, credentials)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT))
        self._stack.push_async_callback(self._http.close)
        client = XdsClient(
            self.grpc_target, credentials=credentials, token=self.tokens.get(Credentials.DEFAULT)
        )
        self._stack.push_async_callback(client.aclose)
        resident = client.ads(node(RESIDENT_ID, None if self.kube else RESIDENT_METADATA))
        await resident.subscribe(CLUSTER)
        await resident.ack_until(CLUSTER, self.clusters, timeout=WAIT)

    async def aclose(self) -> None:
        with contextlib.suppress(AttributeError):  # not opened
            await self.prober.stop()
            self.channel.close()
        if self._sync_channel is not None:
            await self._sync_channel.close()
        await self._stack.aclose()


async def _file_target(loop: LoopThread, folder: Path) -> Target:
    config = folder / "mesh.yaml"
    shutil.copy(MESH, config)
    pilot = await start_file_pilot_with_ca(folder, config)
    async with XdsClient(pilot.target(tls=False)) as client:
        clusters = tuple(sotw_names(await client.fetch_clusters()))
    target = Target("file", loop, pilot, clusters, {})
    target._stack.push_async_callback(pilot.stop)
    return await _opened(target)


async def _kube_target(loop: LoopThread, folder: Path) -> Target:
    stack = contextlib.AsyncExitStack()
    mesh = await stack.enter_async_context(running_mesh(folder))
    tokens = {
        Credentials.DEFAULT: mesh.tokens[VICTIM],
        Credentials.OTHER: mesh.tokens[ATTACKER],
        Credentials.WRONG_AUDIENCE: sa_token(mesh.srv, "ns-b", "victim", audiences=("other",)),
    }
    target = Target("kube", loop, mesh.pilot, tuple(mesh.barrier_clusters), tokens, _stack=stack)
    return await _opened(target)


async def _opened(target: Target) -> Target:
    try:
        await target._open()
    except BaseException:
        await target.aclose()
        raise
    return target


def start_target(loop: LoopThread, folder: Path, mode: str) -> Target:
    """Start pilot in `mode` ("file" or "kube") on `loop`; `stop_target` when done."""
    folder.mkdir(parents=True, exist_ok=True)
    start = _file_target if mode == "file" else _kube_target
    return loop.run(start(loop, folder), timeout=60)


def stop_target(target: Target) -> None:
    target.loop.run(target.aclose(), timeout=60)
