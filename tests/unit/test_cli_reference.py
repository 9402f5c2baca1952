"""docs/cli.md's reference is what the parser prints now (tools/cli_reference.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "cli_reference.py"


def test_the_committed_reference_is_the_parsers() -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_every_command_and_flag_is_in_it() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for command in ("discovery", "agent", "agent iptables", "proxy-status", "proxy-config routes",
                    "kube-inject"):  # fmt: skip
        assert f"### `pilot {command}`" in text, command
    for flag in ("--grpc-tls-addr", "--remote-kubeconfig", "--status-port", "--identity", "-z",
                 "--proxy-image", "--no-native-sidecars"):  # fmt: skip
        assert flag in text, flag
    assert f"{Path.home()}/" not in text, "a path of this machine"
