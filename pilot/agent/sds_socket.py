"""The agent's SDS socket: a private directory, and a socket only its user may open.

Private keys cross this socket, so whoever can connect to it, or replace it
with their own, gets or forges them. Before the agent binds, `prepare` makes
the socket's directory 0700 whatever the umask (missing parents 0755), or
accepts an existing one only if it is a directory of this user that nobody
else can write; anything else is refused with an error naming the directory
and why.

A directory that group or others can write is what a kubelet makes of an
emptyDir (root's, 0777, or 2777 with an fsGroup): the socket cannot live there,
since anyone who can write it could replace the socket. `resolve` then moves the
socket one level down, into a directory of the agent's own, `DIR/agent/NAME`,
made 0700 and checked like any other (one that exists but is not this user's
alone is refused); the bootstrap points Envoy there. In a directory without the
sticky bit a writer could still rename that subdirectory away: what guards it is
that only the sidecar's container mounts the volume (Istio's `workload-socket`).

A socket left by an earlier run is removed; any other file in its place is
refused, never deleted. Once bound, the socket is made 0600
(`SOCKET_MODE`): only Envoy running as the agent's user may connect.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

AGENT_DIRECTORY = "agent"  # the agent's own directory inside a shared one
PRIVATE_DIRECTORY = 0o700
PARENT_DIRECTORY = 0o755
SOCKET_MODE = 0o600


class SocketPathError(OSError):
    """The socket's directory or path is not safe to serve secrets from."""


def resolve(socket: Path) -> Path:
    """Where the socket asked for at `socket` is bound: there, or in DIR/agent when its
    directory DIR exists and group or others can write it (an emptyDir)."""
    try:
        info = socket.parent.stat()
    except OSError:
        return socket  # made private by `prepare`, or refused there with the reason
    if stat.S_ISDIR(info.st_mode) and info.st_mode & 0o022:
        return socket.parent / AGENT_DIRECTORY / socket.name
    return socket


def prepare(socket: Path) -> None:
    """Make (or check) the socket's private directory and clear a stale socket."""
    _make_directories(socket.parent)
    _check_private(socket.parent)
    _remove_stale(socket)


def _make_directories(directory: Path) -> None:
    """Create what is missing of `directory`, top down, with exact modes."""
    missing = []
    for path in (directory, *directory.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    for path in reversed(missing):
        mode = PRIVATE_DIRECTORY if path == directory else PARENT_DIRECTORY
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            continue  # made meanwhile by someone else: checked like any existing directory
        except OSError as error:
            raise SocketPathError(
                f"SDS socket directory {path}: cannot create it: {error.strerror or error}"
            ) from error
        path.chmod(mode)  # mkdir's mode is narrowed by the umask: set it exactly


def _check_private(directory: Path) -> None:
    try:
        info = directory.stat()
    except OSError as error:
        raise SocketPathError(f"SDS socket directory {directory}: {error.strerror}") from error
    if not stat.S_ISDIR(info.st_mode):
        raise SocketPathError(f"SDS socket directory {directory} is not a directory")
    if info.st_uid != os.geteuid():
        raise SocketPathError(
            f"SDS socket directory {directory} belongs to uid {info.st_uid}, not to this"
            f" user ({os.geteuid()}): its owner could replace the socket"
        )
    if info.st_mode & 0o022:
        writers = " and ".join(
            who for who, bit in (("group", 0o020), ("others", 0o002)) if info.st_mode & bit
        )
        raise SocketPathError(
            f"SDS socket directory {directory} is writable by {writers}"
            f" (mode {stat.S_IMODE(info.st_mode):04o}): another user could replace the socket;"
            " use a directory only this user can write (chmod 700)"
        )


def _remove_stale(socket: Path) -> None:
    try:
        info = socket.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise SocketPathError(f"SDS socket path {socket} exists and is not a socket")
    socket.unlink()
