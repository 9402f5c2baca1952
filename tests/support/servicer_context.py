"""A grpc.aio servicer context as an xDS stream uses it, for driving `Connection.serve`
in process: no credentials, no metadata, writes taken and dropped."""

from __future__ import annotations

from typing import Any


class StubContext:
    """The part of a grpc.aio ServicerContext an xDS stream touches; subclasses say what
    a write or an abort means to their test."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def write(self, _data: bytes) -> None:
        pass

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted {code}: {details}")
