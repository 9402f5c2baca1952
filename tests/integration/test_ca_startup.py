"""`pilot discovery` (and `pilot agent`) refuse to start on unusable CA input, as a user sees it.

Run as a subprocess, the way an operator starts pilot: each case exits 2 with one
`pilot: error: ...` line naming the variable or flag and what is wrong with it,
and no traceback. The cases: SECRET_TTL out of range; names that are not Kubernetes names
(CA_TRUSTED_NODE_ACCOUNTS, POD_NAMESPACE, SERVICE_ACCOUNT) and a trust domain
that is no DNS name.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.mesh import simple_mesh, write_mesh


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
        args += ["--http-addr", "127.0.0.1:0", "--grpc-tls-addr", ""]
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
        _, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, err.decode()


SETTINGS = {
    "secret-ttl-huge": Start(
        "SECRET_TTL=99999999999999999999h is out of range: from 1s to 2160h"
        " (90 days, the most a CA signs for)",
        env={"SECRET_TTL": "99999999999999999999h"},
    ),
    "secret-ttl-sub-second": Start("SECRET_TTL=500ms is out of range", env={"SECRET_TTL": "500ms"}),
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


@pytest.mark.parametrize("case", SETTINGS, ids=list(SETTINGS))
async def test_unusable_settings_stop_pilot_with_one_line(tmp_path: Path, case: str) -> None:
    start = SETTINGS[case]
    code, stderr = await _run(tmp_path, start)
    _assert_one_error_line(code, stderr, f"pilot: error: {start.expected}")
    assert not (tmp_path / "ca").exists(), "refused before any root is made"
