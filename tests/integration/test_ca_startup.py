"""`pilot discovery` (and `pilot agent`) refuse to start on unusable CA input, as a user sees it.

Run as a subprocess, the way an operator starts pilot: each case exits 2 with one
`pilot: error: ...` line naming the file, variable or flag and what is wrong with
it, and no traceback. The cases: a `--ca-state-dir` or key file others can read;
a key that is not its certificate's; a certificate that is not a CA or has
expired (self-signed or plugged-in); SECRET_TTL out of range; names that are not
Kubernetes names (CA_TRUSTED_NODE_ACCOUNTS, POD_NAMESPACE, SERVICE_ACCOUNT) and a
trust domain that is no DNS name.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.ca import (
    new_ca,
    utcnow,
    write_plugged_in,
    write_state_dir,
)
from tests.support.deadline import bounded
from tests.support.mesh import simple_mesh, write_mesh

DAY = datetime.timedelta(days=1)


@dataclass
class Start:
    """How to start pilot for one case, and what its error line must say."""

    expected: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    command: str = "discovery"


async def _run(tmp_path: Path, start: Start) -> tuple[int | None, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CA_", "KUBECONFIG", "SECRET_", "POD_", "SERVICE_ACCOUNT"))
    }
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    env |= start.env
    if start.command == "discovery":
        config = tmp_path / "mesh.yaml"
        write_mesh(config, simple_mesh({"a": ["10.0.0.1"]}))
        args = ["--config", str(config), "--grpc-addr", "127.0.0.1:0"]
        args += ["--http-addr", "127.0.0.1:0", "--grpc-tls-addr", "", "--webhook-addr", ""]
        if "--ca-cert-dir" not in start.args and "--ca-state-dir" not in start.args:
            args += ["--ca-state-dir", str(tmp_path / "ca")]
    else:
        args = ["--sds-socket", str(tmp_path / "sds.sock")]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot",
        start.command,
        *args,
        *start.args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        _, err = await bounded(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, err.decode()


def _state_dir_open(tmp_path: Path) -> Start:
    state = write_state_dir(tmp_path / "ca", new_ca("kept root"))
    state.chmod(0o755)
    return Start(
        f"--ca-state-dir {state} is open to its group and others (mode 0755):"
        f" it holds the CA's private key; chmod 700 {state}",
        ["--ca-state-dir", str(state)],
    )


def _state_key_open(tmp_path: Path) -> Start:
    state = write_state_dir(tmp_path / "ca", new_ca("kept root"))
    key = state / "root-key.pem"
    key.chmod(0o644)
    return Start(
        f"{key} is a private key open to its group and others (mode 0644); chmod 600 {key}",
        ["--ca-state-dir", str(state)],
    )


def _state_key_mismatch(tmp_path: Path) -> Start:
    state = write_state_dir(tmp_path / "ca", new_ca("kept root"))
    (state / "root-key.pem").write_bytes(new_ca("another").key_pem)
    return Start(
        f"{state / 'root-key.pem'} is not the key of {state / 'root-cert.pem'}",
        ["--ca-state-dir", str(state)],
    )


def _state_root_expired(tmp_path: Path) -> Start:
    root = new_ca("kept root", valid_for=DAY, starts=utcnow() - 3 * DAY)
    state = write_state_dir(tmp_path / "ca", root)
    return Start(
        f"{state / 'root-cert.pem'} expired at {root.cert.not_valid_after_utc.isoformat()}:"
        f" pilot does not sign with an expired CA; move {state} aside and pilot makes"
        " a new root (workloads must then trust it)",
        ["--ca-state-dir", str(state)],
    )


def _state_root_not_a_ca(tmp_path: Path) -> Start:
    state = write_state_dir(tmp_path / "ca", new_ca("a leaf really", is_ca=False))
    return Start(
        f"{state / 'root-cert.pem'} is not a CA certificate (BasicConstraints CA:TRUE)",
        ["--ca-state-dir", str(state)],
    )


def _plugged_key_open(tmp_path: Path) -> Start:
    plugged = write_plugged_in(tmp_path / "cacerts")
    key = plugged.directory / "ca-key.pem"
    key.chmod(0o604)
    return Start(
        f"{key} is a private key open to others (mode 0604); chmod 600 {key}"
        " (or 640 if its group is pilot's own)",
        ["--ca-cert-dir", str(plugged.directory)],
    )


def _plugged_expired(tmp_path: Path) -> Start:
    root = new_ca("plugged-in root")
    intermediate = new_ca("intermediate", root, valid_for=DAY, starts=utcnow() - 3 * DAY)
    plugged = write_plugged_in(tmp_path / "cacerts", root=root, intermediate=intermediate)
    return Start(
        f"{plugged.directory / 'ca-cert.pem'} expired at"
        f" {intermediate.cert.not_valid_after_utc.isoformat()}: pilot does not sign with an"
        f" expired CA; put valid CA files in {plugged.directory}",
        ["--ca-cert-dir", str(plugged.directory)],
    )


def _plugged_not_a_ca(tmp_path: Path) -> Start:
    root = new_ca("plugged-in root")
    leaf = new_ca("a leaf really", root, is_ca=False)
    plugged = write_plugged_in(tmp_path / "cacerts", root=root, intermediate=leaf)
    return Start(
        f"{plugged.directory / 'ca-cert.pem'} is not a CA certificate (BasicConstraints CA:TRUE)",
        ["--ca-cert-dir", str(plugged.directory)],
    )


CA_FILES: dict[str, Callable[[Path], Start]] = {
    "state-dir-open": _state_dir_open,
    "state-key-open": _state_key_open,
    "state-key-mismatch": _state_key_mismatch,
    "state-root-expired": _state_root_expired,
    "state-root-not-a-ca": _state_root_not_a_ca,
    "plugged-key-open": _plugged_key_open,
    "plugged-expired": _plugged_expired,
    "plugged-not-a-ca": _plugged_not_a_ca,
}

SETTINGS = {
    "secret-ttl-huge": Start(
        "SECRET_TTL=99999999999999999999h is out of range: from 1s to 2160h"
        " (90 days, the most a CA signs for)",
        env={"SECRET_TTL": "99999999999999999999h"},
    ),
    "secret-ttl-sub-second": Start("SECRET_TTL=500ms is out of range", env={"SECRET_TTL": "500ms"}),
    "trusted-account-dotdot": Start(
        "CA_TRUSTED_NODE_ACCOUNTS: namespace '..' is not a valid Kubernetes namespace",
        env={"CA_TRUSTED_NODE_ACCOUNTS": "kube-system/ztunnel,../ztunnel"},
    ),
    "trusted-account-slash": Start(
        "CA_TRUSTED_NODE_ACCOUNTS: 'kube-system/x/y' is not ns/sa",
        env={"CA_TRUSTED_NODE_ACCOUNTS": "kube-system/x/y"},
    ),
    "pod-namespace": Start(
        "POD_NAMESPACE: namespace '../kube-system' is not a valid Kubernetes namespace",
        env={"POD_NAMESPACE": "../kube-system"},
    ),
    "service-account": Start(
        "POD_NAMESPACE / SERVICE_ACCOUNT: service account 'x/y' is not a valid Kubernetes name",
        env={
            "POD_NAMESPACE": "istio-system",
            "SERVICE_ACCOUNT": "x/y",
            "CA_ADDR": "127.0.0.1:1",
            "CA_INSECURE": "true",
        },
    ),
    "trust-domain": Start(
        "--trust-domain: trust domain 'Cluster.Local' is not a valid DNS name",
        args=["--trust-domain", "Cluster.Local"],
    ),
    "agent-identity": Start(
        "POD_NAMESPACE / SERVICE_ACCOUNT: namespace '..' is not a valid Kubernetes namespace",
        env={"POD_NAMESPACE": "..", "SERVICE_ACCOUNT": "x/y"},
        command="agent",
    ),
    "agent-trust-domain": Start(
        "--trust-domain: trust domain 'evil/td' is not a valid DNS name",
        args=["--trust-domain", "evil/td"],
        env={"POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "web"},
        command="agent",
    ),
}


def _assert_one_error_line(code: int | None, stderr: str, expected: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("pilot: error: ")]
    assert len(errors) == 1, stderr
    assert stderr.rstrip("\n").splitlines()[-1] == errors[0], "the error comes last"
    assert expected in errors[0], f"expected {expected!r} in {errors[0]!r}"


@pytest.mark.parametrize("case", CA_FILES, ids=list(CA_FILES))
async def test_unusable_ca_files_stop_pilot_with_one_line(tmp_path: Path, case: str) -> None:
    start = CA_FILES[case](tmp_path)
    code, stderr = await _run(tmp_path, start)
    _assert_one_error_line(code, stderr, f"pilot: error: {start.expected}")
    assert not (tmp_path / "xdg").exists(), "no self-signed root made elsewhere instead"


@pytest.mark.parametrize("case", SETTINGS, ids=list(SETTINGS))
async def test_unusable_settings_stop_pilot_with_one_line(tmp_path: Path, case: str) -> None:
    start = SETTINGS[case]
    code, stderr = await _run(tmp_path, start)
    _assert_one_error_line(code, stderr, f"pilot: error: {start.expected}")
    assert not (tmp_path / "ca").exists(), "refused before any root is made"
