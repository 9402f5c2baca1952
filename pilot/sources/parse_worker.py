"""Parsing a registry file without stalling the event loop.

libyaml composes a whole document in one C call that holds the GIL (12 s for
10,000 services as `kubectl -o yaml` prints them), and `json.loads` is one call
too, so a thread would stall every stream as surely as the loop itself. A file
larger than `INLINE_BYTES` is parsed by a child process (`python -m
pilot.sources.parse_worker ORIGIN`, the file on its stdin) that writes the
result back as pickles of a few hundred objects each; pilot unpickles them one
at a time, yielding to the loop in between. The child also takes the memory a
huge file costs to parse, and gives it back when it exits.

A small file (the bundled example) is parsed in place: starting an interpreter
would cost more than parsing it.
"""

from __future__ import annotations

import asyncio
import io
import pickle
import sys
from collections.abc import Sequence
from typing import Any

from pilot.registry.model import DEFAULT_CLUSTER_ID
from pilot.sources.file_format import (
    EmptyRegistryFile,
    RegistryFileError,
    RegistryState,
    parse_registry,
)

INLINE_BYTES = 32 * 1024  # parsed on the loop below this: a few ms at most
CHUNK = 500  # objects per pickle: each unpickles in a few ms
FEED_BYTES = 1 << 20
_OK, _FAILED, _EMPTY = "ok", "failed", "empty"


async def parse_off_loop(
    data: bytes, origin: str, cluster: str, cluster_domain: str = "cluster.local"
) -> RegistryState:
    """The file's registry state (`cluster`: the local cluster's id); RegistryFileError if
    it is broken."""
    if len(data) < INLINE_BYTES:
        text = data.decode("utf-8", errors="replace")
        return parse_registry(text, origin, cluster, cluster_domain)
    output = await _run_worker(data, origin, cluster, cluster_domain)
    try:
        return await _unpickled(output)
    except (EOFError, pickle.UnpicklingError) as error:
        raise RegistryFileError(f"{origin}: the parser process answered badly: {error}") from error


async def _run_worker(data: bytes, origin: str, cluster: str, cluster_domain: str) -> bytes:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __name__,
        origin,
        cluster,
        cluster_domain,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        _, output, errors = await asyncio.gather(
            _feed(process, data), process.stdout.read(), process.stderr.read()
        )
        await process.wait()
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    if process.returncode != 0:
        tail = errors.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RegistryFileError(
            f"{origin}: the parser process failed (exit {process.returncode}): {tail[0]}"
        )
    return output


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """The file to the worker a slice at a time: handing asyncio 40 MB at once costs a
    copy of all of it on the loop."""
    stdin = process.stdin
    assert stdin is not None
    view = memoryview(data)
    try:
        for start in range(0, len(view), FEED_BYTES):
            stdin.write(view[start : start + FEED_BYTES])
            await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the worker died: its exit status says so


async def _unpickled(output: bytes) -> RegistryState:
    """Read the worker's answer, one chunk per turn of the loop."""
    reader = io.BytesIO(output)  # one pickle after another, each with its own memo
    status, detail = pickle.load(reader)
    if status == _EMPTY:
        raise EmptyRegistryFile(str(detail))
    if status == _FAILED:
        raise RegistryFileError(str(detail))
    service_chunks, set_chunks = detail
    services = await _load_chunks(reader, service_chunks)
    endpoint_sets = await _load_chunks(reader, set_chunks)
    (pod_chunks,) = pickle.load(reader)  # the pods come after, with their own count
    pods = await _load_chunks(reader, pod_chunks)
    peer_authentications = pickle.load(reader)  # one pickle after the pods: they are few
    (traffic_chunks,) = pickle.load(reader)
    traffic = await _load_chunks(reader, traffic_chunks)
    refused, errors, unsupported = pickle.load(reader)
    (authz_chunks,) = pickle.load(reader)
    authz = await _load_chunks(reader, authz_chunks)
    (jwt_chunks,) = pickle.load(reader)
    jwt = await _load_chunks(reader, jwt_chunks)
    jwt_refused = pickle.load(reader)
    return RegistryState(
        tuple(services),
        tuple(endpoint_sets),
        tuple(peer_authentications),
        pods=tuple(pods),
        traffic=tuple(traffic),
        refused=refused,
        config_errors=errors,
        unsupported=unsupported,
        authorization_policies=tuple(authz),
        request_authentications=tuple(jwt),
        jwt_refused=jwt_refused,
    )


async def _load_chunks(reader: io.BytesIO, count: int) -> list[Any]:
    objects: list[Any] = []
    for _ in range(count):
        objects.extend(pickle.load(reader))
        await asyncio.sleep(0)  # let streams and probes run between chunks
    return objects


def _chunks(objects: Sequence[Any]) -> list[Sequence[Any]]:
    return [objects[i : i + CHUNK] for i in range(0, len(objects), CHUNK)]


def main(argv: list[str]) -> int:
    """The child: the file on stdin, pickles on stdout."""
    origin = argv[0] if argv else "registry file"
    cluster = argv[1] if len(argv) > 1 else DEFAULT_CLUSTER_ID
    domain = argv[2] if len(argv) > 2 else "cluster.local"
    data = sys.stdin.buffer.read()
    out = sys.stdout.buffer
    try:
        state = parse_registry(data.decode("utf-8", errors="replace"), origin, cluster, domain)
    except EmptyRegistryFile:
        pickle.dump((_EMPTY, origin), out)
        return 0
    except RegistryFileError as error:
        pickle.dump((_FAILED, str(error)), out)
        return 0
    services, endpoint_sets = _chunks(state.services), _chunks(state.endpoint_sets)
    pickle.dump((_OK, (len(services), len(endpoint_sets))), out)
    for chunk in (*services, *endpoint_sets):
        pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    pods = _chunks(state.pods)
    pickle.dump((len(pods),), out)
    for chunk in pods:
        pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    pickle.dump(state.peer_authentications, out, protocol=pickle.HIGHEST_PROTOCOL)
    traffic = _chunks(state.traffic)
    pickle.dump((len(traffic),), out)
    for chunk in traffic:
        pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    tail = (state.refused, state.config_errors, state.unsupported)
    pickle.dump(tail, out, protocol=pickle.HIGHEST_PROTOCOL)
    authz = _chunks(state.authorization_policies)
    pickle.dump((len(authz),), out)
    for chunk in authz:
        pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    jwt = _chunks(state.request_authentications)
    pickle.dump((len(jwt),), out)
    for chunk in jwt:
        pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    pickle.dump(state.jwt_refused, out, protocol=pickle.HIGHEST_PROTOCOL)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
