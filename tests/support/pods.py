"""Pods as network namespaces: `ip netns`, veth pairs and a bridge, all removed at the end.

`pod_network(count)` makes a namespace of the test's own holding a bridge, and
one namespace per pod, each with loopback up and `eth0` (one end of a veth pair
whose other end is on the bridge) at 198.18.0.N/24: the range reserved for
network benchmarks (RFC 2544), and these addresses exist only inside those
namespaces. The host's own namespace gets nothing but the namespace names (and
the hosts files below).
Whatever happens in the test, on the way out every process still in a pod is
killed and every namespace deleted (which takes its links, bridge and iptables
rules with it); `leftovers()` says what is still there.

`pod_network(names, hosts=...)` gives every pod the same hosts entries (name ->
address, as cluster DNS would answer): `ip netns exec NAME` bind-mounts
/etc/netns/NAME/hosts over /etc/hosts for whatever it runs, so curl, Envoy and
the agent resolve `reviews.ns` there. Each pod also routes SERVICE_RANGE (the
ClusterIPs, 198.19.0.0/16) out of eth0, as a pod's default route would: a
connection to a ClusterIP needs a route before the capture rules rewrite it.
Those files go with the namespaces.

`add_pod_at(network, name, address_of)` adds a pod at another pod's address
(two interfaces with one address on the bridge: a test takes one down).
`add_pod(network, name, routes)` adds one at the lowest free address (a kubelet
starting pods as they come), `remove_pod` deletes one, and `add_node_address` gives
the bridge itself 198.18.0.1: the node, whose side of the bridge a kubelet's probes
come from (`client_socket_in` makes a socket that connects from a namespace).

`socket_in(namespace, host, port)` makes a listening socket inside a pod's
namespace for a server of this process (a socket keeps the namespace it was
made in): the test's in-process API server listens inside the control pod.

`Pod.command(*argv, uid=...)` is the command line that runs `argv` in the pod,
as `uid` if given (`setpriv --reuid --regid --clear-groups`, as Kubernetes'
runAsUser); `Pod.run` runs one to completion.

`require_namespaces()` skips a test, saying why, where the machine cannot make
network namespaces (no `ip`, not root, no permission); under CI=true it fails
instead: CI must run these tests.
"""

from __future__ import annotations

import asyncio
import ctypes
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SUBNET = "198.18.0"  # 198.18.0.0/15 only: never an address that exists outside
PREFIX = 24
BRIDGE = "br0"
NODE_ADDRESS = f"{SUBNET}.1"
SERVICE_RANGE = "198.19.0.0/16"  # ClusterIPs: still inside 198.18.0.0/15
COMMAND_TIMEOUT = 30.0
NETNS_ETC = Path("/etc/netns")  # `ip netns exec` bind-mounts NETNS_ETC/NAME/* over /etc/*
_CLONE_NEWNET = 0x40000000
_RANGE = ipaddress.ip_network("198.18.0.0/15")
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?")  # part of a namespace's name
_HOST_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_MAX_PODS = 250  # 198.18.0.2 ... .251 on one /24


class NamespaceError(RuntimeError):
    """An `ip` command the harness ran failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    if check and result.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def namespaces() -> set[str]:
    """Names `ip netns list` shows."""
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def host_links() -> set[str]:
    """Link names in the host's (this process's) namespace."""
    return {
        line.split()[0].split("@")[0]
        for line in _ip("-br", "link").stdout.splitlines()
        if line.strip()
    }


def _cannot_make_namespaces() -> str | None:
    """Why this machine cannot run the harness, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (Debian: apt-get install iproute2)"
    if shutil.which("setpriv") is None:
        return "no `setpriv` (Debian: util-linux)"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add), and the tests run as a user"
    probe = f"pilot-probe-{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused here: {made.stderr.strip()[:200]}"
    _ip("netns", "delete", probe, check=False)
    return None


def require_namespaces() -> None:
    """Skip (or, under CI=true, fail) unless this machine can make network namespaces."""
    reason = _cannot_make_namespaces()
    if reason is None:
        return
    message = f"pods as network namespaces: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: CI must run these tests)")
    pytest.skip(message)


@dataclass(frozen=True)
class Pod:
    """One pod: its network namespace and its address on the bridge."""

    name: str
    namespace: str
    address: str

    def command(self, *argv: str, uid: int | None = None) -> list[str]:
        """`argv` run in this pod, as `uid` (and the same gid, no other groups) if given."""
        prefix = ["ip", "netns", "exec", self.namespace]
        if uid is not None:
            prefix += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return [*prefix, *argv]

    async def run(self, *argv: str, uid: int | None = None) -> tuple[int, str, str]:
        """Run to completion in the pod (within COMMAND_TIMEOUT): (status, stdout, stderr)."""
        process = await asyncio.create_subprocess_exec(
            *self.command(*argv, uid=uid),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                out, err = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


@dataclass
class PodNetwork:
    """The bridge's namespace and the pods on it."""

    tag: str
    bridge_namespace: str
    pods: dict[str, Pod] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Pod:
        return self.pods[name]

    @property
    def link_prefix(self) -> str:
        """The bridge-side veths' names start with this (unique to this network)."""
        return f"v{self.tag[-6:]}-"

    @property
    def all_namespaces(self) -> list[str]:
        return [self.bridge_namespace, *(pod.namespace for pod in self.pods.values())]


def _in(namespace: str, *args: str) -> None:
    _ip("-n", namespace, *args)


def _make_bridge(network: PodNetwork) -> None:
    _ip("netns", "add", network.bridge_namespace)
    _in(network.bridge_namespace, "link", "set", "lo", "up")
    _in(network.bridge_namespace, "link", "add", BRIDGE, "type", "bridge")
    _in(network.bridge_namespace, "link", "set", BRIDGE, "up")


def check_pods(names: Sequence[str], hosts: Mapping[str, str]) -> None:
    """Refuse, before anything is made, what would not stay inside the harness: a pod name
    that is not a plain name (it becomes a namespace and a path under /etc/netns), a hosts
    entry that is not one name and one address in 198.18.0.0/15."""
    if len(names) > _MAX_PODS or len(set(names)) != len(names):
        raise ValueError(f"pods {list(names)[:5]}...: at most {_MAX_PODS}, each name once")
    for name in names:
        if not _POD_NAME.fullmatch(name):
            raise ValueError(f"pod name {name!r}: lower-case letters, digits, '-' (16 at most)")
    for host, address in hosts.items():
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(f"hosts entry {host!r}: not a host name")
        try:
            inside = ipaddress.ip_address(address) in _RANGE
        except ValueError:
            inside = False
        if not inside:
            raise ValueError(f"hosts entry {host!r} -> {address!r}: not an address in {_RANGE}")


def _write_hosts(namespace: str, hosts: Mapping[str, str]) -> None:
    folder = NETNS_ETC / namespace
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", *(f"{address} {name}" for name, address in hosts.items())]
    (folder / "hosts").write_text("\n".join(lines) + "\n")


def _add_pod(network: PodNetwork, name: str, index: int, hosts: Mapping[str, str]) -> Pod:
    pod = Pod(name, f"{network.tag}-{name}", f"{SUBNET}.{index + 2}")
    _ip("netns", "add", pod.namespace)
    network.pods[name] = pod
    bridge_side = f"{network.link_prefix}{name}"[:15]  # IFNAMSIZ
    # Made inside the pod's namespace, the peer moved to the bridge's: nothing on the host.
    _in(pod.namespace, "link", "add", "eth0", "type", "veth", "peer", "name", bridge_side)
    _in(pod.namespace, "link", "set", bridge_side, "netns", network.bridge_namespace)
    _in(network.bridge_namespace, "link", "set", bridge_side, "master", BRIDGE)
    _in(network.bridge_namespace, "link", "set", bridge_side, "up")
    _in(pod.namespace, "addr", "add", f"{pod.address}/{PREFIX}", "dev", "eth0")
    _in(pod.namespace, "link", "set", "eth0", "up")
    _in(pod.namespace, "link", "set", "lo", "up")
    _in(pod.namespace, "route", "add", SERVICE_RANGE, "dev", "eth0")
    if hosts:
        _write_hosts(pod.namespace, hosts)
    return pod


def _kill_processes(namespace: str) -> None:
    """Every process still in `namespace` (a pod's Envoy, agent, server) is killed."""
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            continue


def _remove(network: PodNetwork) -> None:
    for namespace in network.all_namespaces:
        _kill_processes(namespace)
    for namespace in network.all_namespaces:
        _ip("netns", "delete", namespace, check=False)
        shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)


def leftovers(network: PodNetwork) -> list[str]:
    """The harness's namespaces and links still on this machine (nothing, once removed)."""
    names = namespaces()
    left = [ns for ns in network.all_namespaces if ns in names]
    left += [f"{NETNS_ETC / ns}" for ns in network.all_namespaces if (NETNS_ETC / ns).exists()]
    links = host_links()
    left += [f"link {link}" for link in links if link.startswith(network.link_prefix)]
    return left


@asynccontextmanager
async def pod_network(
    names: Sequence[str], hosts: Mapping[str, str] | None = None
) -> AsyncIterator[PodNetwork]:
    """Pods `names` (198.18.0.2, .3, ... in order) on one bridge, each resolving `hosts`
    (name -> address); all gone on the way out."""
    check_pods(names, hosts or {})
    require_namespaces()
    tag = f"pilot-{secrets.token_hex(3)}"
    network = PodNetwork(tag, f"{tag}-bridge")
    try:
        _make_bridge(network)
        for index, name in enumerate(names):
            _add_pod(network, name, index, hosts or {})
        yield network
    finally:
        _remove(network)


def add_pod_at(
    network: PodNetwork, name: str, address_of: str, hosts: Mapping[str, str] | None = None
) -> Pod:
    """One more pod on the bridge at the address pod `address_of` has (for tests of who may
    answer for an address: take the other's eth0 down first); removed with the network."""
    check_pods([*network.pods, name], hosts or {})
    index = int(network[address_of].address.rsplit(".", 1)[1]) - 2
    return _add_pod(network, name, index, hosts or {})


def add_pod(network: PodNetwork, name: str, routes: Sequence[str] = ()) -> Pod:
    """One more pod on the bridge at the lowest free address, routing `routes` (CIDRs
    inside the pod, such as a cluster's Service range) out of its eth0 as well; removed
    with the network or by `remove_pod`."""
    check_pods([*network.pods, name], {})
    used = {int(pod.address.rsplit(".", 1)[1]) - 2 for pod in network.pods.values()}
    free = [index for index in range(_MAX_PODS) if index not in used]
    if not free:
        raise ValueError(f"pod {name}: all {_MAX_PODS} addresses are taken")
    pod = _add_pod(network, name, free[0], {})
    for route in routes:
        _in(pod.namespace, "route", "add", str(ipaddress.ip_network(route)), "dev", "eth0")
    return pod


def remove_pod(network: PodNetwork, name: str) -> None:
    """Pod `name` gone: its processes killed, its namespace (and veth) deleted."""
    pod = network.pods.pop(name)
    _kill_processes(pod.namespace)
    _ip("netns", "delete", pod.namespace, check=False)
    shutil.rmtree(NETNS_ETC / pod.namespace, ignore_errors=True)


def add_node_address(network: PodNetwork) -> str:
    """The bridge's own address, NODE_ADDRESS, in the bridge's namespace: the node the
    pods' kubelet probes from and their host IP (pods are .2 and up, never .1)."""
    _in(network.bridge_namespace, "addr", "add", f"{NODE_ADDRESS}/{PREFIX}", "dev", BRIDGE)
    return NODE_ADDRESS


def _made_in(namespace: str, make: Callable[[], socket.socket]) -> socket.socket:
    """`make()` run with this thread inside network namespace `namespace`.

    setns(2) moves only the calling thread, and only for the lines between the two
    calls: nothing awaits there, so no other task of the event loop runs in the pod.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            raise NamespaceError(f"setns({namespace}): {os.strerror(ctypes.get_errno())}")
        try:
            return make()
        finally:
            if libc.setns(own, _CLONE_NEWNET) != 0:
                # A thread left in the pod's namespace would make every later socket there.
                os.abort()
    finally:
        os.close(own)
        os.close(target)


def socket_in(namespace: str, host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket made inside network namespace `namespace`."""
    return _made_in(namespace, lambda: socket.create_server((host, port)))


def client_socket_in(namespace: str) -> socket.socket:
    """An unconnected, non-blocking TCP socket made inside network namespace `namespace`:
    it connects from there (a kubelet's probe from the node's side of the bridge)."""
    made = _made_in(namespace, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    made.setblocking(False)
    return made
