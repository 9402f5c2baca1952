"""Where a connection was headed before iptables redirected it: SO_ORIGINAL_DST, both ends.

`python -m tests.support.original_dst listen PORT...` listens on 0.0.0.0 at each
port and answers every connection with one JSON line, `{"listener": PORT,
"original_dst": "IP:PORT", "peer": "IP:PORT"}`, read with getsockopt(SOL_IP,
SO_ORIGINAL_DST): the address the client dialled, as netfilter's conntrack kept
it. A connection that reached the listener without a redirect has its listener's
own address there. It prints `listening` once every port is bound.

`python -m tests.support.original_dst connect HOST PORT` dials, sends a line and
prints the first line it gets back (the listener's JSON, or an HTTP backend's
status line), or `error: ...`.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
TIMEOUT = 10.0


def original_dst(connection: socket.socket) -> str:
    """IP:PORT the client dialled (a sockaddr_in: family, port, address)."""
    raw = connection.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return f"{socket.inet_ntoa(packed)}:{port}"


def _answer(connection: socket.socket, port: int) -> None:
    with connection:
        peer = "{}:{}".format(*connection.getpeername())
        record = {"listener": port, "original_dst": original_dst(connection), "peer": peer}
        connection.sendall(json.dumps(record).encode() + b"\n")


def _serve(server: socket.socket, port: int) -> None:
    while True:
        connection, _ = server.accept()
        _answer(connection, port)


def listen(ports: list[int]) -> None:
    servers = []
    for port in ports:
        server = socket.create_server(("0.0.0.0", port), reuse_port=False)
        servers.append((server, port))
    threads = [threading.Thread(target=_serve, args=pair, daemon=True) for pair in servers]
    for thread in threads:
        thread.start()
    print("listening", flush=True)
    for thread in threads:
        thread.join()


def connect(host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as connection:
            connection.sendall(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            first = connection.makefile("rb").readline().decode(errors="replace").strip()
    except OSError as error:
        print(f"error: {error}")
        return
    print(first)


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen([int(port) for port in sys.argv[2:]])
    else:
        connect(sys.argv[2], int(sys.argv[3]))
