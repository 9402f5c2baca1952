"""The sidecar of workload shop/cart that the agent tests bring up in a pod: its
service-account token (TOKEN), the pod's environment (`pod_env`), the agent's folder
with that token and pilot's root (`cart_agent_folder`), the agent's command dialling a
pilot's TLS port (`agent_argv_to`); and `get_from`, a GET from inside a pod.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from pathlib import Path

from tests.integration.sidecar_support import (
    Workload,
    agent_argv,
    agent_folder,
    sidecar_env,
)
from tests.support.pilot_process import PilotProcess
from tests.support.pods import Pod

TOKEN = "sidecar-token-0123456789abcdef"
CART = Workload("shop", "cart", "cart-7d4f9-x2x1z")


def pod_env(ip: str, **extra: str) -> dict[str, str]:
    return sidecar_env(ip, CART, **extra)


def cart_agent_folder(root_pem: str, owner: int | None = None) -> AbstractContextManager[Path]:
    return agent_folder(root_pem, TOKEN, owner)


async def get_from(pod: Pod, url: str) -> tuple[int, str]:
    """GET from inside the pod: (status, body); status 0 when nothing answers."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        "    r = urllib.request.urlopen(sys.argv[1], timeout=5)\n"
        "    print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"
        "except OSError:\n"
        "    print(0)\n"
    )
    status, out, err = await pod.run(sys.executable, "-c", script, url)
    assert status == 0, err
    code, _, body = out.partition("\n")
    return int(code), body


def agent_argv_to(pilot: PilotProcess) -> list[str]:
    return agent_argv(f"localhost:{pilot.tls_port}")
