"""`pilot agent wait`: Istio's `pilot-agent wait`, the classic sidecar's postStart hook.

With `holdApplicationUntilProxyStarts` and no native sidecars, the injector puts
istio-proxy first in `containers` with a postStart hook running `pilot agent wait`:
the kubelet starts the next container only once the hook returns, so the app starts
once Envoy is ready. It polls the agent's `http://localhost:15020/healthz/ready`
(200 only once Envoy is LIVE) every `--periodMillis` until 200 (exit 0) or until
`--timeoutSeconds` have passed (exit 1, one line saying what it saw last). Each
request waits at most `--requestTimeoutMillis`. Only that local URL is asked: the
hook takes no address from anyone.
"""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass

READY_URL = "http://localhost:15020/healthz/ready"


@dataclass(frozen=True, slots=True)
class WaitSettings:
    timeout: float = 60.0  # seconds
    period: float = 0.5  # seconds
    request_timeout: float = 1.0  # seconds
    port: int = 15020


def _ready_status(settings: WaitSettings) -> str:
    """'200', another status, or what went wrong: one GET of /healthz/ready."""
    connection = http.client.HTTPConnection("localhost", settings.port,
                                            timeout=settings.request_timeout)  # fmt: skip
    try:
        connection.request("GET", "/healthz/ready")
        return str(connection.getresponse().status)
    except (OSError, http.client.HTTPException) as error:
        return f"{type(error).__name__}: {error}"[:200]
    finally:
        connection.close()


def wait_until_ready(settings: WaitSettings) -> tuple[bool, str]:
    """(ready?, the last answer) once /healthz/ready answers 200 or the time is up."""
    deadline = time.monotonic() + settings.timeout
    while True:
        last = _ready_status(settings)
        if last == "200":
            return True, last
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, last
        time.sleep(min(settings.period, remaining))  # the poll's period, not a synchronisation
