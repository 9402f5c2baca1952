"""The cluster's network as the API server sees it: an HTTP CONNECT proxy on loopback
that kube-apiserver's egress selector sends its `cluster` traffic through (webhooks,
among others), and the routes that make a Service's address reach a local process.

In a cluster the API server calls a webhook at its Service: it resolves
`pilot.pilot-system.svc` port 443 to the Service's ClusterIP (its default resolver)
and dials that address, verifying the certificate for the Service's DNS name against
the configuration's caBundle. Here nothing listens on a ClusterIP, so the API server is
started with `--egress-selector-config-file` naming this proxy for `cluster`, and a test
routes `CLUSTER_IP:443` to the port its local pilot listens on (`route`): the API server
still resolves the Service itself and verifies TLS as it would, and the proxy only
carries bytes. A destination with no route is refused (502), as an unreachable address.

The API server reaches the proxy over a Unix socket (HTTP CONNECT over TCP would need
mutual TLS with it). The proxy runs in threads of its own (the control plane is set up
synchronously, once per session), one per connection; every route belongs to the test
that made it.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import yaml

HEADER_LIMIT = 8192
EGRESS_API = "apiserver.k8s.io/v1beta1"


class _Handler(socketserver.BaseRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        client = self.request
        head = _read_head(client)
        target = _connect_target(head)
        route = self.server.network.lookup(target) if target else None
        if route is None:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        try:
            upstream = socket.create_connection(route, timeout=10)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        with upstream:
            upstream.settimeout(None)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            _pipe(client, upstream)


def _read_head(sock: socket.socket) -> bytes:
    """The CONNECT request's head, up to its blank line (bounded)."""
    head = b""
    while b"\r\n\r\n" not in head and len(head) < HEADER_LIMIT:
        chunk = sock.recv(1)  # byte by byte: nothing after the head may be consumed
        if not chunk:
            break
        head += chunk
    return head


def _connect_target(head: bytes) -> tuple[str, int] | None:
    """(host, port) of `CONNECT host:port HTTP/1.1`, else None."""
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) != 3 or parts[0] != "CONNECT":
        return None
    host, _, port = parts[1].rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Carry bytes both ways until both sides are done."""

    def one_way(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=one_way, args=(b, a), daemon=True)
    other.start()
    one_way(a, b)
    other.join()


class _ProxyServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, network: ClusterNetwork) -> None:
        super().__init__(str(path), _Handler)
        self.network = network


class ClusterNetwork:
    """The proxy and its routes: (address, port) in the cluster -> a local port."""

    def __init__(self, socket_path: Path) -> None:
        self._routes: dict[tuple[str, int], tuple[str, int]] = {}
        self._lock = threading.Lock()
        self.socket_path = socket_path
        self._server = _ProxyServer(socket_path, self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (once; a proxy never started only closes its socket)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def lookup(self, target: tuple[str, int]) -> tuple[str, int] | None:
        with self._lock:
            return self._routes.get(target)

    @contextlib.contextmanager
    def route(self, address: str, port: int, local_port: int) -> Iterator[None]:
        """`address:port` reaches 127.0.0.1:`local_port` while in the block."""
        with self._lock:
            self._routes[(address, port)] = ("127.0.0.1", local_port)
        try:
            yield
        finally:
            with self._lock:
                self._routes.pop((address, port), None)

    def egress_config(self, path: Path) -> Path:
        """kube-apiserver's --egress-selector-config-file: `cluster` through this proxy."""
        config = {
            "apiVersion": EGRESS_API,
            "kind": "EgressSelectorConfiguration",
            "egressSelections": [
                {
                    "name": "cluster",
                    "connection": {
                        "proxyProtocol": "HTTPConnect",
                        "transport": {"uds": {"udsName": str(self.socket_path)}},
                    },
                }
            ],
        }
        path.write_text(yaml.safe_dump(config))
        return path
