"""The image's HEALTHCHECK asks /ready where the container's `pilot discovery` listens."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pilot import healthcheck


@pytest.mark.parametrize(
    ("argv", "url"),
    [
        (["pilot", "discovery", "--config", "x"], "http://127.0.0.1:15014/ready"),
        (["pilot", "discovery", "--http-addr", "127.0.0.1:9014"], "http://127.0.0.1:9014/ready"),
        (["pilot", "discovery", "--http-addr=10.1.2.3:80"], "http://10.1.2.3:80/ready"),
        (["pilot", "discovery", "--http-addr", "0.0.0.0:1"], "http://127.0.0.1:1/ready"),
        (["pilot", "discovery", "--http-addr", "[::]:2"], "http://[::1]:2/ready"),
        (["pilot", "discovery", "--http-addr", ":3"], "http://127.0.0.1:3/ready"),
        # The last one given wins, as argparse takes it.
        (
            ["p", "--http-addr", "127.0.0.1:1", "--http-addr", "127.0.0.2:2"],
            "http://127.0.0.2:2/ready",
        ),
    ],
)
def test_the_url_follows_the_command_line(argv: list[str], url: str) -> None:
    assert healthcheck.ready_url(healthcheck.http_addr(argv)) == url


def test_a_process_that_does_not_answer_is_unhealthy() -> None:
    # A live process without pilot's flags: the probe asks the default port, where nothing
    # of this test listens, and says so in one line with exit status 1.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pilot.healthcheck", str(sleeper.pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=os.environ | {"no_proxy": "*"},
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.returncode == 1
    assert result.stdout.startswith("unhealthy: http://127.0.0.1:15014/ready")
