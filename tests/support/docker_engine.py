"""A Docker engine of the test's own, and the Dockerfile's base image made without a registry.

`DockerEngine` starts Debian's `dockerd` (package docker.io, installed by `.ci/run`)
on a socket of its own, with no bridge, no iptables rules and no IP forwarding:
containers and builds use the host's network, so nothing is left behind on the
machine's interfaces or firewall, and every address a test uses is loopback. Its
images live in a cache directory (`~/.cache/pilot-tests/docker`), so the base image
is made once per machine; containers and the images a test builds are removed.

`ensure_base_image` gives the Dockerfile's `FROM` image when it cannot be pulled
(no public registry here): a Debian bookworm made by `debootstrap` from the host's
own apt mirror, with python3, venv and pip, `python` on PATH, and the host's
certificate authorities (so that pip in the build stage reaches the package index
as the host's pip does), imported under the `FROM` name.

`unavailable()` says why an engine cannot run here (None when it can); under CI
(`CI` set) a test must not skip for that, it fails. `network_state()` is what a test
compares before and after its engine: the machine's interfaces and firewall rules.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.machine_lock import DOCKER_ENGINE, held

DATA_ROOT = Path("~/.cache/pilot-tests/docker").expanduser()
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
START_TIMEOUT = 60.0
# What python:3.11-slim sets that a bare root filesystem lacks.
IMPORT_CHANGES = ("--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]')


def network_state() -> tuple[str, ...]:
    """The machine's interfaces and firewall rules: a test must leave them as it found them."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    names = sorted(line.split(":")[1].strip() for line in links.stdout.splitlines())
    rules = []
    for table in ("filter", "nat"):
        listed = subprocess.run(
            ["iptables", "-t", table, "-S"], capture_output=True, text=True, check=False
        )
        rules.append(listed.stdout)
    return (*names, *rules)


class EngineError(RuntimeError):
    """A docker command failed; the message has its output."""


def unavailable() -> str | None:
    """Why no Docker engine of our own can start here, or None."""
    missing = [tool for tool in ("dockerd", "docker", "debootstrap") if not shutil.which(tool)]
    if missing:
        return (
            f"{', '.join(missing)} not installed"
            " (apt-get install docker.io debootstrap; .ci/run does)"
        )
    if os.geteuid() != 0:
        return "dockerd and debootstrap need root"
    return None


def debian_mirror() -> str:
    """The host's own Debian mirror, from its apt sources (the first `deb` URI)."""
    for path in APT_SOURCES:
        if not path.is_file():
            continue
        text = path.read_text()
        found = re.search(r"^URIs:\s*(\S+)", text, re.M) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M
        )
        if found:
            return found[1]
    raise EngineError(f"no Debian mirror in {', '.join(map(str, APT_SOURCES))}")


@dataclass
class DockerEngine:
    """A running dockerd of the test's own; `docker(...)` runs the client against it."""

    folder: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.folder / "docker.sock"

    @property
    def env(self) -> dict[str, str]:
        # The legacy builder: the Dockerfile must build without BuildKit.
        return os.environ | {"DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "0"}

    def start(self) -> None:
        DATA_ROOT.mkdir(parents=True, exist_ok=True)
        log = (self.folder / "dockerd.log").open("wb")
        self.process = subprocess.Popen(
            [
                "dockerd",
                f"--data-root={DATA_ROOT}",
                f"--exec-root={self.folder / 'exec'}",
                f"--pidfile={self.folder / 'dockerd.pid'}",
                f"--host=unix://{self.socket}",
                "--bridge=none",
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while self.run("info", check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise EngineError(f"dockerd did not start: {self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._unmount_leftovers()

    def _unmount_leftovers(self) -> None:
        """dockerd leaves its network namespace file mounted under the exec root."""
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        points = [line.split()[1] for line in mounts if len(line.split()) > 1]
        for point in sorted((p for p in points if p.startswith(f"{self.folder}/")), reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)

    def log_tail(self) -> str:
        path = self.folder / "dockerd.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-15:])

    def run(
        self, *args: str, check: bool = True, timeout: float = 600.0
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["docker", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise EngineError(
                f"docker {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
            )
        return result

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False).returncode == 0


@contextlib.contextmanager
def running_engine() -> Iterator[DockerEngine]:
    """A dockerd for the block. Engines share DATA_ROOT (the base image is made once), and
    two daemons on one data root corrupt it: test modules in parallel workers take turns."""
    # A short socket path: unix socket paths are limited to 108 bytes.
    with held(DOCKER_ENGINE), tempfile.TemporaryDirectory(prefix="pilot-docker-") as folder:
        engine = DockerEngine(Path(folder))
        engine.start()
        try:
            yield engine
        finally:
            engine.stop()


# What is not part of a build context, when a test copies the checkout to build from.
NOT_CONTEXT = shutil.ignore_patterns(
    ".git", "__pycache__", "*.egg-info", ".venv", "venv", ".*_cache", ".hypothesis", "build"
)


@contextlib.contextmanager
def engine_for_tests(dockerfile: Path) -> Iterator[DockerEngine]:
    """An engine holding the Dockerfile's base image, for a test module: skipped without
    docker.io, debootstrap or root (failed under CI); it must leave no interface or rule."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the container tests: {reason}")
        pytest.skip(reason)
    before = network_state()
    with running_engine() as running:
        ensure_base_image(running, from_image(dockerfile))
        yield running
    assert network_state() == before, "the Docker engine left an interface or a rule behind"


def from_image(dockerfile: Path) -> str:
    """The image of the Dockerfile's first FROM."""
    found = re.search(r"^FROM\s+(\S+)", dockerfile.read_text(), re.M)
    if not found:
        raise EngineError(f"{dockerfile}: no FROM")
    return found[1]


def ensure_base_image(
    engine: DockerEngine, name: str, packages: Sequence[str] = BASE_PACKAGES
) -> None:
    """`name` in the engine: already there, or made by debootstrap and imported as `name`."""
    if engine.has_image(name):
        return
    with tempfile.TemporaryDirectory(prefix="pilot-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                "bookworm",
                str(rootfs),
                debian_mirror(),
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        shutil.copyfile(HOST_CA_BUNDLE, rootfs / HOST_CA_BUNDLE.relative_to("/"))
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.run(
            ["tar", "-C", str(rootfs), "-c", "."], check=True, capture_output=True, timeout=300
        )
        imported = subprocess.run(
            ["docker", "import", *IMPORT_CHANGES, "-", name],
            input=tar.stdout,
            env=engine.env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        if imported.returncode != 0:
            raise EngineError(f"docker import {name}: {imported.stderr.decode(errors='replace')}")
