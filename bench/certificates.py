"""`python -m bench.certificates`: N proxies ask for their certificate at once.

One `pilot discovery --config EMPTY --xds-auth none` subprocess (its own CA,
ECDSA P-256 workload keys). N delta ADS streams from this process, each a
proxy of its own identity (node metadata NAMESPACE/SERVICE_ACCOUNT), subscribe
to the Secret `default` together; the run ends when the last has it. Reported:
time until the last certificate, certificates per second, pilot's CPU per
certificate (user + system, all its threads, from /proc) against a bare mint
done here with `cryptography` alone (key pair, CSR, CSR verification, signing:
the work a certificate cannot do without; CPU time, as pilot's is), and pilot's
`/ready` latency meanwhile (probed every 10 ms by a process of its own: the
event loop's lag). Then the same proxies ask `bench.certificate_floor`, a bare
grpc.aio server that mints with pilot's own CA code and nothing else: its CPU
per certificate is what gRPC and the crypto cost any Python SDS server, and
pilot's over it is what pilot's own machinery costs.

`--via ca` is a rollout through `pilot agent` instead: each of the N agents
has its own token (`--token-auth-file`) and its own key and CSR, made here
beforehand, and calls pilot's CA (CreateCertificate) at once; pilot checks the
token and the CSR and signs; the floor signs the same CSRs with no token. The
same figures.

`--runs K` does all of it K times and ends with each figure's median and range:
on a shared machine one run moves by a fifth or more, the bare mint (the
ratio's denominator) as much as pilot.

Targets (issue 20): >= 1,000 certificates/s on 2 cores, pilot's CPU per
certificate <= 3x the bare mint, `/ready` answering throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Protocol

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2

from bench.pilot_cli import SERVING, newer_flags, serving_ports
from bench.procs import (
    PYTHON,
    Child,
    cpu_seconds,
    log_match,
    read_line_starting,
    spawn,
    wait_idle,
)
from bench.report import percentile
from pilot._gen.istio.v1.auth import ca_pb2
from pilot.security.ca_service import CA_SERVICE
from pilot.security.certs import KeyType, new_key_and_csr, write_private
from tests.fuzz.ready import ReadyProber

SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
PROXIES_PER_CONNECTION = 50  # Envoys each have their own: many connections, as in a mesh
_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel
WAIT = 300.0
RETRIES = 10  # Envoy never gives up; a run that loses a stream 10 times fails


@dataclass(frozen=True)
class Storm:
    """N proxies served by one server: how long, at what CPU, and what was retried."""

    seconds: float  # until the last proxy had its certificate
    cpu: float  # the server's CPU seconds over the same time
    retries: int  # streams opened again after gRPC lost them
    ready: list[float]  # /ready latencies meanwhile (pilot's; the floor has none)


@dataclass(frozen=True)
class Figures:
    proxies: int
    via: str  # "sds" (Envoys' streams) or "ca" (agents' CreateCertificate calls)
    pilot: Storm
    floor: Storm  # bench.certificate_floor: bare grpc.aio and pilot's own CA code
    bare_mint: float  # CPU seconds per certificate, here, single-threaded

    @property
    def per_certificate(self) -> float:
        """pilot's CPU seconds per certificate."""
        return self.pilot.cpu / self.proxies

    @property
    def floor_per_certificate(self) -> float:
        return self.floor.cpu / self.proxies

    def summary(self) -> dict[str, float]:
        """The figures a run is judged by, by the label `render` prints them under."""
        return {
            "certificates per second": self.proxies / self.pilot.seconds,
            "pilot CPU per certificate": self.per_certificate * 1e3,
            "bare mint per certificate": self.bare_mint * 1e3,
            "ratio": self.per_certificate / self.bare_mint,
            "floor CPU per certificate": self.floor_per_certificate * 1e3,
            "floor over the bare mint": self.floor_per_certificate / self.bare_mint,
            "pilot over the floor": self.per_certificate / self.floor_per_certificate,
        }

    def render(self) -> str:
        ready = self.pilot.ready
        lag = (
            f"p99 {percentile(ready, 99) * 1e3:.0f} ms, worst {max(ready) * 1e3:.0f} ms"
            f" ({len(ready)} probes)"
            if ready
            else "no probe answered"
        )
        asking = (
            "proxies asking for `default` at once, ECDSA P-256"
            if self.via == "sds"
            else "agents asking pilot's CA at once (CreateCertificate, each its own key and CSR)"
        )
        figures = self.summary()
        lines = [
            f"{self.proxies:,} {asking} ({self.pilot.retries} streams opened again)",
            f"last certificate after     {self.pilot.seconds:.2f} s",
            f"certificates per second    {figures['certificates per second']:.0f}",
            f"pilot CPU per certificate  {figures['pilot CPU per certificate']:.2f} ms",
            f"bare mint per certificate  {figures['bare mint per certificate']:.2f} ms",
            f"ratio                      {figures['ratio']:.2f}",
            f"/ready meanwhile           {lag}",
            f"floor CPU per certificate  {figures['floor CPU per certificate']:.2f} ms"
            f" ({self.proxies / self.floor.seconds:.0f}/s,"
            f" {self.floor.retries} streams opened again; bare grpc.aio and pilot's CA code)",
            f"floor over the bare mint   {figures['floor over the bare mint']:.2f}",
            f"pilot over the floor       {figures['pilot over the floor']:.2f}",
        ]
        return "\n".join(lines)


def render_runs(runs: list[Figures]) -> str:
    """Each figure's median over the runs, and its range: one run on a shared machine
    moves by a fifth or more, the bare mint (the ratio's denominator) included."""
    summaries = [run.summary() for run in runs]
    lines = [f"median of {len(runs)} runs (lowest-highest):"]
    for label in summaries[0]:
        values = [summary[label] for summary in summaries]
        shown = "{:.0f}" if label == "certificates per second" else "{:.2f}"
        middle, low, high = (shown.format(v) for v in (median(values), min(values), max(values)))
        lines.append(f"{label:<26} {middle} ({low}-{high})")
    return "\n".join(lines)


def bare_mint_seconds(count: int) -> float:
    """CPU seconds per certificate for what any mint must do: keys, CSR, verify, sign.

    CPU time, as pilot's figure is: the machine is shared, and wall time here
    would count what other processes took meanwhile.
    """
    ca_key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "bench")])
    now = datetime.datetime.now(datetime.UTC)
    started = time.process_time()
    for i in range(count):
        key = ec.generate_private_key(ec.SECP256R1())
        san = x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(f"spiffe://cluster.local/ns/ns/sa/sa{i}")]
        )
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([]))
            .add_extension(san, critical=True)
            .sign(key, hashes.SHA256())
        )
        if not csr.is_signature_valid:
            raise RuntimeError("a CSR that does not verify")
        (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(issuer)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(hours=24))
            .add_extension(san, critical=True)
            .sign(ca_key, hashes.SHA256())
        )
    return (time.process_time() - started) / count


def _account(index: int) -> tuple[str, str]:
    """Proxy `index`'s namespace and service account: its identity, whichever way it asks."""
    return f"ns-{index % 50}", f"sa-{index}"


def _node(index: int) -> base_pb2.Node:
    namespace, account = _account(index)
    metadata = struct_pb2.Struct()
    metadata.update({"NAMESPACE": namespace, "SERVICE_ACCOUNT": account})
    node_id = f"sidecar~10.0.0.1~proxy-{index}.ns~ns.svc.cluster.local"
    return base_pb2.Node(id=node_id, metadata=metadata)


class Asker(Protocol):
    async def ask(self, index: int) -> object:
        """Proxy `index`'s certificate, asked for once (an error of gRPC's is raised)."""
        ...


class _Envoys:
    """Envoys asking over ADS: a delta stream each, subscribing to `default`."""

    def __init__(self, channels: list[grpc.aio.Channel]) -> None:
        self._stubs = [ads_pb2_grpc.AggregatedDiscoveryServiceStub(c) for c in channels]

    async def ask(self, index: int) -> object:
        """The stream, once it got `default` (left open, as Envoy's is, until the end)."""
        call = self._stubs[index % len(self._stubs)].DeltaAggregatedResources()
        request = discovery_pb2.DeltaDiscoveryRequest(
            node=_node(index), type_url=SECRET, resource_names_subscribe=["default"]
        )
        await call.write(request)
        while True:
            response = await call.read()
            if not isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
                raise RuntimeError(f"proxy {index}: the stream ended before its certificate")
            if any(r.name == "default" for r in response.resources):
                return call


class _Agents:
    """`pilot agent`s asking pilot's CA: a CreateCertificate each, with the agent's token
    and a CSR made beforehand, here (the agent makes its key: pilot verifies and signs)."""

    def __init__(self, channels: list[grpc.aio.Channel], csrs: list[str]) -> None:
        self._calls = [
            channel.unary_unary(
                f"/{CA_SERVICE}/CreateCertificate",
                request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
                response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
            )
            for channel in channels
        ]
        self._csrs = csrs

    async def ask(self, index: int) -> object:
        request = ca_pb2.IstioCertificateRequest(csr=self._csrs[index], validity_duration=86400)
        metadata = (("authorization", f"Bearer {_token(index)}"),)
        response = await self._calls[index % len(self._calls)](
            request, metadata=metadata, timeout=WAIT
        )
        if not response.cert_chain:
            raise RuntimeError(f"agent {index}: an answer without a chain")
        return None


def _token(index: int) -> str:
    return f"bench-agent-token-{index}"


def _agent_csrs(proxies: int) -> list[str]:
    """Each agent's CSR for its own identity (its key, made here, stays here)."""
    return [new_key_and_csr(KeyType.EC, [_identity(index)])[1].decode() for index in range(proxies)]


def _identity(index: int) -> str:
    return "spiffe://cluster.local/ns/{}/sa/{}".format(*_account(index))


def _token_file(workdir: Path, proxies: int) -> Path:
    """`--token-auth-file`: each agent's token, naming its service account (0600)."""
    lines = [
        "{},system:serviceaccount:{}:{}\n".format(_token(i), *_account(i)) for i in range(proxies)
    ]
    path = workdir / "tokens.csv"
    write_private(path, "".join(lines).encode())
    return path


async def _certificate(asker: Asker, index: int, retried: list[int]) -> object:
    """Proxy `index`'s certificate; a failed stream is opened again, as Envoy does (a
    burst of thousands of new streams loses a few to gRPC)."""
    for attempt in range(RETRIES + 1):
        try:
            return await asker.ask(index)
        except grpc.aio.AioRpcError:
            if attempt == RETRIES:
                raise
            retried.append(index)
            await asyncio.sleep(random.uniform(0, 0.5 * 2**attempt))  # Envoy's backoff
    raise AssertionError("unreachable")


async def _start_pilot(workdir: Path, extra: list[str]) -> tuple[Child, int, int]:
    """pilot on an empty registry file, on ports it picks: it, its gRPC and HTTP ports."""
    config = workdir / "empty.yaml"
    # An explicit empty List: no services (an empty file would be a broken write).
    config.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    argv = [PYTHON, "-m", "pilot", "discovery", "--config", str(config)]
    argv += ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]
    argv += newer_flags(workdir) + extra
    # From the run's folder, not this checkout: `-m` puts the current directory first on
    # sys.path, so PYTHONPATH=OTHER (another checkout's pilot) would otherwise be ignored.
    pilot = await spawn("pilot", argv, workdir / "pilot.log", cwd=workdir)
    try:
        async with asyncio.timeout(60):
            serving = await log_match(pilot, SERVING)
    except BaseException:
        await pilot.stop()
        raise
    return pilot, *serving_ports(serving)


async def measure(proxies: int, mints: int, workdir: Path, via: str = "sds") -> Figures:
    """The proxies against pilot, then against the floor, then the bare mint."""
    if via == "ca":
        csrs = _agent_csrs(proxies)
        extra = ["--token-auth-file", str(_token_file(workdir, proxies))]
        askers: Callable[[list[grpc.aio.Channel]], Asker] = functools.partial(_Agents, csrs=csrs)
    else:
        extra, askers = [], _Envoys
    pilot, grpc_port, http_port = await _start_pilot(workdir, extra)
    try:
        served = await _storm(pilot, grpc_port, proxies, askers, ReadyProber(http_port))
    finally:
        await pilot.stop()
    floor, floor_port = await _start_floor(workdir)
    try:
        floor_served = await _storm(floor, floor_port, proxies, askers, None)
    finally:
        await floor.stop()
    return Figures(proxies, via, served, floor_served, bare_mint_seconds(mints))


async def _start_floor(workdir: Path) -> tuple[Child, int]:
    floor = await spawn(
        "floor", [PYTHON, "-m", "bench.certificate_floor"], workdir / "floor.log", stdout=True
    )
    try:
        async with asyncio.timeout(60):
            port = await read_line_starting(floor, "floor listening on")
    except BaseException:
        await floor.stop()
        raise
    return floor, int(port)


async def _storm(
    server: Child,
    port: int,
    proxies: int,
    askers: Callable[[list[grpc.aio.Channel]], Asker],
    prober: ReadyProber | None,
) -> Storm:
    """Every proxy asks `server` for its certificate at once; until the last has it."""
    count = max(1, proxies // PROXIES_PER_CONNECTION)
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_OPTIONS) for _ in range(count)
    ]
    try:
        await _until_ready(channels[0])
        await wait_idle([server.pid], window=0.2, limit=30)
        if prober is not None:
            await prober.start()
        asker = askers(channels)
        cpu_before, started = cpu_seconds(server.pid), time.monotonic()
        retried: list[int] = []
        async with asyncio.timeout(WAIT):
            calls = await asyncio.gather(*(_certificate(asker, i, retried) for i in range(proxies)))
        seconds, cpu = time.monotonic() - started, cpu_seconds(server.pid) - cpu_before
        ready = prober.latencies_since(started) if prober is not None else []
        for call in calls:
            if call is not None:
                call.cancel()  # type: ignore[attr-defined]
    finally:
        if prober is not None:
            await prober.stop()
        for channel in channels:
            await channel.close(grace=None)
    return Storm(seconds, cpu, len(retried), ready)


async def _until_ready(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(60):
        await channel.channel_ready()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.certificates", description=__doc__)
    parser.add_argument("--proxies", type=int, default=1000, help="(1000)")
    parser.add_argument("--mints", type=int, default=1000, help="bare mints timed (1000)")
    parser.add_argument(
        "--via",
        choices=("sds", "ca"),
        default="sds",
        help="sds: Envoys' SDS streams (the default); ca: `pilot agent`s' CreateCertificate calls",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="pilot, its floor and the bare mint this many times, then each figure's median (1)",
    )
    args = parser.parse_args(argv)
    if min(args.proxies, args.mints, args.runs) < 1:
        parser.error("--proxies, --mints and --runs must be at least 1")
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="pilot-certificates-") as folder:
            runs.append(asyncio.run(measure(args.proxies, args.mints, Path(folder), args.via)))
        print(runs[-1].render(), flush=True)
    if len(runs) > 1:
        print(render_runs(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
