"""Ask pilot's CA for a workload certificate, as a node agent does, and write it out.

`python -m tests.support.mint_client TARGET ROOT TOKEN OUT_DIR`: a new P-256 key
and CSR, Istio's CreateCertificate over TLS to TARGET (checked against ROOT)
with the service-account token, then `OUT_DIR/cert.pem` (the chain pilot
signed) and `OUT_DIR/key.pem` (0600). Prints the chain's first URI SAN.
Run where pilot's TLS port is reachable (inside the pod pilot runs in).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pilot._gen.istio.v1.auth import ca_pb2

CREATE_CERTIFICATE = "/istio.v1.auth.IstioCertificateService/CreateCertificate"


async def mint(target: str, root: bytes, token: str, out: Path) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    credentials = grpc.ssl_channel_credentials(root_certificates=root)
    async with grpc.aio.secure_channel(target, credentials) as channel:
        call = channel.unary_unary(
            CREATE_CERTIFICATE,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        request = ca_pb2.IstioCertificateRequest(csr=csr.decode())
        response = await call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
    chain = "".join(response.cert_chain)
    (out / "cert.pem").write_text(chain)
    key_path = out / "key.pem"
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    leaf = x509.load_pem_x509_certificate(chain.encode())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return str(names.get_values_for_type(x509.UniformResourceIdentifier)[0])


if __name__ == "__main__":
    target, root, token, out = sys.argv[1:5]
    print(asyncio.run(mint(target, Path(root).read_bytes(), token, Path(out))), flush=True)
