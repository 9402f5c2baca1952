"""`python -m bench.certificate_floor`: the certificates bench's floor, bare grpc.aio and a mint.

What any SDS server written with grpc.aio must at least do for a proxy asking
for its certificate: read the stream's first DeltaDiscoveryRequest, mint (a key
pair and its leaf, with pilot's own CA code, `LocalCa.mint`: one thread, in
batches, as pilot mints), write a DeltaDiscoveryResponse carrying the Secret
`default` (chain and key), then read the stream to its end. The identity is
the node's metadata NAMESPACE/SERVICE_ACCOUNT, taken as given. Nothing else:
no proof of identity, no subscription state, no push pipeline, no cache, no
log line, no rotation. It also answers CreateCertificate, as pilot's CA does
for `pilot agent`: the CSR signed with pilot's own CA code (`LocalCa.sign`, the
same one-thread lane), for one fixed identity, with no token checked.
`bench.certificates` runs the same proxies (or agents) against it after pilot,
to show what of pilot's CPU per certificate is gRPC's and the crypto's, and
what is pilot's own.

Prints `floor listening on PORT` once serving; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from bench import wire
from bench.floor import start_ads_floor
from pilot._gen.istio.v1.auth import ca_pb2
from pilot.runtime import event_loop
from pilot.security.ca import CaSettings, CertificateAuthority
from pilot.security.ca_client import LocalCa
from pilot.security.ca_service import CA_SERVICE
from pilot.security.certs import KeyType, WorkloadCertificate
from pilot.security.identity import Identity

SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
TTL = datetime.timedelta(hours=24)
SIGNING_SLOTS = 4  # as pilot discovery has them
AGENT = Identity("cluster.local", "ns", "agent")  # who the floor signs every CSR for


def _identity(request: wire.DeltaRequest) -> Identity:
    fields = request.node.metadata.fields
    return Identity(
        "cluster.local", fields["NAMESPACE"].string_value, fields["SERVICE_ACCOUNT"].string_value
    )


def _response(certificate: WorkloadCertificate, nonce: int) -> bytes:
    secret = secret_pb2.Secret(name="default")
    secret.tls_certificate.certificate_chain.inline_bytes = certificate.chain_pem
    secret.tls_certificate.private_key.inline_bytes = certificate.key_pem
    response = wire.DeltaResponse(type_url=SECRET, nonce=str(nonce), system_version_info="1")
    resource = response.resources.add(name="default", version=str(certificate.serial))
    resource.resource.Pack(secret)
    return response.SerializeToString()


class CertificateFloor:
    """Each stream's certificate, minted by pilot's own CA code, written once; and each
    CreateCertificate call's CSR, signed by it."""

    def __init__(self, ca: LocalCa) -> None:
        self._ca = ca
        self._written = 0

    async def create_certificate(self, data: bytes, context: Any) -> bytes:
        """An agent's call: its CSR signed, for one identity whoever calls (nothing is
        parsed on the loop: pilot checks the CSR in its signing thread too)."""
        request = ca_pb2.IstioCertificateRequest.FromString(data)
        chain = await self._ca.sign(request.csr.encode(), AGENT, TTL)
        return ca_pb2.IstioCertificateResponse(cert_chain=chain).SerializeToString()

    def ca_handler(self) -> grpc.GenericRpcHandler:
        method = grpc.unary_unary_rpc_method_handler(self.create_certificate)
        return grpc.method_handlers_generic_handler(CA_SERVICE, {"CreateCertificate": method})

    async def handle(self, requests: AsyncIterator[bytes], context: Any) -> None:
        stream = aiter(requests)
        first = wire.DeltaRequest.FromString(await anext(stream))
        certificate = await self._ca.mint(KeyType.EC, _identity(first), TTL)
        self._written += 1
        await context.write(_response(certificate, self._written))
        async for _ in stream:
            pass  # ACKs: the stream stays open, as Envoy's does


async def serve(port: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pilot-certificate-floor-") as folder:
        authority = CertificateAuthority.load(CaSettings(state_dir=Path(folder) / "ca"))
        floor = CertificateFloor(LocalCa(authority, asyncio.Semaphore(SIGNING_SLOTS)))
        server = await start_ads_floor(floor.handle, f"127.0.0.1:{port}", [floor.ca_handler()])
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
        try:
            await stopped.wait()
        finally:
            await server.stop(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.certificate_floor", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        event_loop.run(serve(args.port))  # pilot's loop (PILOT_EVENT_LOOP), as pilot's


if __name__ == "__main__":
    main()
