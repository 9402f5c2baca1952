"""One container of a Pod as a process on this machine: its namespaces, user and mounts.

`Launch` is everything the kubelet decided for a container: the pod's network
namespace, the volumes' host directories and mount paths, the /etc/hosts it resolves
with, its user (runAsUser, runAsGroup, the pod's fsGroup and supplementalGroups as
supplementary groups), its capabilities (the container runtime's default set, minus
`drop`, plus `add`), no_new_privs when allowPrivilegeEscalation is false, its
environment and working directory (workingDir, else `/`), and with
readOnlyRootFilesystem a read-only root (the machine's own, bound over itself and
remounted read-only: only its volumes are writable). `start` runs a command so:

    ip netns exec POD sh -c '[mount --rbind / /;] mount --bind VOLUME PATH ...;
                            mount --bind HOSTS /etc/hosts; [mount -o remount,bind,ro /;]
                            cd DIR; exec setpriv --reuid U --regid G ... -- "$@"' ARGV

`ip netns exec` has already given the shell a mount namespace of its own whose mounts
never reach the host's, so the binds are the container's alone; `setpriv` execs the
command in place, so the process the kubelet signals is the container's. A command
whose first word is `pilot` (bare or a path ending in /pilot: the proxy image's) is the
virtual environment's `pilot` script; other names are looked up on the container's
PATH. `run` runs a command in the same container to completion (exec probes,
postStart hooks), within a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.cluster.pod_volumes import Mount
from tests.support.background_process import BackgroundProcess, LineLog

Obj = dict[str, Any]
# containerd's and CRI-O's default set: what a container gets unless it drops it.
DEFAULT_CAPABILITIES = frozenset({
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
    "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
})  # fmt: skip
STOP_TIMEOUT = 10.0


class ContainerError(RuntimeError):
    """A container this kubelet cannot start (which and why, in one line)."""


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise ContainerError(f"no `{name}` on this machine (Debian: util-linux, iproute2)")
    return found


@dataclass(frozen=True)
class User:
    """Who a container's process is."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def user_of(container: Obj, pod: Obj) -> User:
    """The container's securityContext over the pod's; root when neither says (an image
    with no USER)."""
    pod_context = pod["spec"].get("securityContext", {})
    context = {**pod_context, **container.get("securityContext", {})}
    uid = int(context.get("runAsUser", 0))
    gid = int(context.get("runAsGroup", 0 if "runAsUser" not in context else uid))
    groups = [int(g) for g in pod_context.get("supplementalGroups", [])]
    if "fsGroup" in pod_context:
        groups.insert(0, int(pod_context["fsGroup"]))
    if context.get("runAsNonRoot") and uid == 0:
        raise ContainerError(f"container {container['name']}: runAsNonRoot with uid 0")
    return User(uid, gid, tuple(dict.fromkeys(groups)))


def capabilities_of(container: Obj) -> list[str]:
    """The container's capability set: the runtime's default, minus drop, plus add."""
    asked = container.get("securityContext", {}).get("capabilities", {})
    drop = {name.upper().removeprefix("CAP_") for name in asked.get("drop", [])}
    add = {name.upper().removeprefix("CAP_") for name in asked.get("add", [])}
    kept = set() if "ALL" in drop else DEFAULT_CAPABILITIES - drop
    return sorted(kept | add)


def _setpriv(container: Obj, user: User) -> list[str]:
    capabilities = ",".join(["-all", *(f"+{c.lower()}" for c in capabilities_of(container))])
    groups = f"--groups={','.join(map(str, user.groups))}" if user.groups else "--clear-groups"
    argv = [_tool("setpriv"), f"--reuid={user.uid}", f"--regid={user.gid}", groups,
            "--inh-caps=-all", f"--bounding-set={capabilities}"]  # fmt: skip
    if container.get("securityContext", {}).get("allowPrivilegeEscalation") is False:
        argv.append("--no-new-privs")
    return argv


@dataclass
class ContainerProcess(BackgroundProcess[str]):
    """A running container: its main process and every line it wrote (stdout, stderr)."""

    name: str = ""
    tail_heading: ClassVar[str] = "its last lines"

    async def stop(self, within: float = STOP_TIMEOUT) -> int:
        """SIGTERM, SIGKILL after `within` seconds; the exit status."""
        await self.terminate(within, drain=False)
        assert self.process.returncode is not None
        return self.process.returncode


@dataclass(frozen=True)
class Launch:
    """How to run a command as one container of a pod."""

    container: Obj
    netns: str
    mounts: Sequence[Mount]
    hosts: Path
    user: User
    env: dict[str, str]
    pilot: str  # the virtual environment's `pilot` script
    workdir: str = "/"

    def argv(self, command: Sequence[str]) -> list[str]:
        """The command line that runs `command` as this container."""
        if not command:
            raise ContainerError(f"container {self.container['name']}: no command (no image)")
        first = self.pilot if Path(command[0]).name == "pilot" else command[0]
        mount = _tool("mount")
        lines = ["set -e"]
        read_only_root = self.container.get("securityContext", {}).get("readOnlyRootFilesystem")
        if read_only_root:  # the root bound over itself, made read-only once volumes are in
            lines.append(f"{mount} --rbind / /")
        for item in [*self.mounts, Mount(self.hosts, "/etc/hosts", True)]:
            lines.append(f"{mount} --bind {shlex.quote(str(item.source))} {shlex.quote(item.path)}")
            if item.read_only:
                lines.append(f"{mount} -o remount,bind,ro {shlex.quote(item.path)}")
        if read_only_root:  # only the mount at /: each volume is a mount of its own
            lines.append(f"{mount} -o remount,bind,ro /")
        lines.append(f"cd {shlex.quote(self.workdir)}")
        setpriv = " ".join(shlex.quote(part) for part in _setpriv(self.container, self.user))
        lines.append(f'exec {setpriv} -- "$@"')
        script = "\n".join(lines)
        return [_tool("ip"), "netns", "exec", self.netns, _tool("sh"), "-c", script,
                self.container["name"], first, *command[1:]]  # fmt: skip

    async def start(self, command: Sequence[str]) -> ContainerProcess:
        """The container's main process, started."""
        process = await asyncio.create_subprocess_exec(
            *self.argv(command),
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output = LineLog(process.stdout, str, f"container-{self.container['name']}")
        return ContainerProcess(process, output, self.container["name"])

    async def run(self, command: Sequence[str], within: float) -> tuple[int, str]:
        """`command` in this container to completion: (exit status, its output); -1 when
        it did not end within `within` seconds (it is killed)."""
        process = await asyncio.create_subprocess_exec(
            *self.argv(command),
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(within):
                out, _ = await process.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return -1, f"did not end within {within:g}s"
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace")
