"""The bench's go-control-plane peers: which of its caches a run serves, and their binary.

`bench/gcp` is a Go module (main.go there): a delta ADS server on
go-control-plane's LinearCache or SnapshotCache that replays the resources
pilot sent, as the floor replays its bytes. `bench/gcp/build` builds it once
per machine into the user's cache and prints the binary's path. A run asks for
`--peers`: `auto` (both caches when Go is found, none otherwise, said in the
report), `none`, or a comma-separated list of `linear` and `snapshot`, which
then needs Go.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from bench.procs import ROOT

KINDS = ("linear", "snapshot")
BUILD = ROOT / "bench" / "gcp" / "build"
# Where Go's own archive installs; the build script looks there too.
GO_ARCHIVE = Path("/usr/local/go/bin/go")
LISTENING = "gcp listening on"


def parse(text: str) -> tuple[str, ...] | None:
    """`--peers`: None for `auto`, () for `none`, else the caches named (ValueError if
    one is unknown)."""
    if text == "auto":
        return None
    if text == "none":
        return ()
    kinds = tuple(dict.fromkeys(kind.strip() for kind in text.split(",")))
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"{text!r}: auto, none, or a comma-separated list of {', '.join(KINDS)}")
    return kinds


def go_found() -> bool:
    """Whether Go is on PATH or where its archive installs."""
    return shutil.which("go") is not None or os.access(GO_ARCHIVE, os.X_OK)


@dataclass(frozen=True)
class Peers:
    """The caches a run serves after the floor, the binary serving them, and, when none,
    why (a line of the report)."""

    kinds: tuple[str, ...]
    binary: Path | None = None
    note: str = ""


def tag(kind: str) -> str:
    """A peer's name in the report, logs and errors."""
    return f"gcp-{kind}"


async def resolve(requested: tuple[str, ...] | None) -> Peers:
    """The peers of a run, built if needed. RuntimeError if peers were named but cannot
    be built."""
    if requested == ():
        return Peers((), note="go-control-plane: not run (--peers none)")
    if not go_found():
        if requested is None:
            return Peers((), note="go-control-plane: not run (no Go on PATH nor in /usr/local/go)")
        raise RuntimeError(f"--peers {','.join(requested)}: needs Go (bench/gcp/build)")
    return Peers(requested or KINDS, await build())


async def build() -> Path:
    """Run bench/gcp/build (nothing to do once built; its own output goes to stderr);
    the binary's path. Cancelled, it stops the build and whatever it started."""
    process = await asyncio.create_subprocess_exec(
        str(BUILD), stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    try:
        out, _ = await process.communicate()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    lines = out.decode(errors="replace").splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"bench/gcp/build failed (exit {process.returncode}); see above")
    return Path(lines[-1])
