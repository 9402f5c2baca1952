"""A client of a pod's app as a meshless pod or a peer sidecar would be: one GET, one JSON line.

`python -m tests.support.inbound_client HOST PORT [--cert C --key K --root R]`:
plaintext HTTP/1.1, or with `--cert`, TLS with that client certificate and
Istio's ALPN (`--alpn`, default `istio-http/1.1`: what a peer's Envoy offers
for an HTTP/1.1 port; `istio-peer-exchange,istio` for a TCP one),
the server's certificate checked against `--root` (no host name: Istio's are
SPIFFE URIs); `--xfcc` sends a client-cert header of its own (a forgery the
sidecar must replace). Prints `{"status": N, "xfcc": ..., "body": ...}` for an answer,
`{"status": 0, "error": ...}` when the connection or handshake is refused.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys

TIMEOUT = 5.0


def _exchange(sock: socket.socket, host: str, forged: str | None) -> dict[str, object]:
    extra = f"x-forwarded-client-cert: {forged}\r\n" if forged else ""
    request = f"GET /inbound HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
    sock.sendall(request.encode())
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    if not data:
        return {"status": 0, "error": "closed without an answer"}
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return {
        "status": int(lines[0].split()[1]),
        "xfcc": headers.get("x-seen-xfcc", ""),
        "peer": headers.get("x-seen-peer", ""),
        "body": body.decode(errors="replace"),
    }


def main(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--root")
    parser.add_argument("--xfcc", help="send this x-forwarded-client-cert (a forgery)")
    parser.add_argument("--alpn", default="istio-http/1.1", help="what TLS offers")
    args = parser.parse_args(argv)
    try:
        with socket.create_connection((args.host, args.port), timeout=TIMEOUT) as raw:
            if args.cert is None:
                return _exchange(raw, args.host, args.xfcc)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.load_verify_locations(args.root)
            context.load_cert_chain(args.cert, args.key)
            context.set_alpn_protocols(args.alpn.split(","))
            with context.wrap_socket(raw) as tls:
                return _exchange(tls, args.host, args.xfcc)
    except (OSError, ssl.SSLError) as error:
        return {"status": 0, "error": f"{type(error).__name__}: {error}"}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
