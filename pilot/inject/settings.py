"""What the operator chose for every injected pod (flags of `pilot discovery` and
`pilot kube-inject`), and the bounds on what a pod may bring.

Checked once when built: an image, address or level that would reach a container's
command line is refused here, with the flag's name, never in the middle of a review.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass

from pilot.cluster_ids import is_cluster_id


def _version() -> str:
    # The package's own version (as `pilot --version`): the image tag pilot was built as.
    try:
        return importlib.metadata.version("pilot")
    except importlib.metadata.PackageNotFoundError:  # a checkout never installed
        return "unknown"


DEFAULT_PROXY_IMAGE = f"pilot-proxy:{_version()}"
DEFAULT_DISCOVERY_ADDRESS = "pilot.pilot-system.svc:15012"  # the agent's own default
ENVOY_LOG_LEVELS = ("trace", "debug", "info", "warning", "warn", "error", "critical", "off")

# An image reference: registry/path:tag@digest characters only (no space, quote, newline).
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252}):([0-9]{1,5})")
_TRUST_DOMAIN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
MAX_CONCURRENCY = 1024  # Envoy's worker threads: more is a typo, not a machine


def is_image(text: str) -> bool:
    """`text` is an image reference pilot puts into a pod (no space, quote, newline,
    leading `-`; at most 255 characters)."""
    return bool(_IMAGE.fullmatch(text))


class InjectSettingsError(ValueError):
    """A setting that cannot go into a pod; str() names the flag."""


@dataclass(frozen=True)
class InjectSettings:
    """The template's inputs that come from the operator, not from the pod."""

    proxy_image: str = DEFAULT_PROXY_IMAGE  # --proxy-image
    discovery_address: str = DEFAULT_DISCOVERY_ADDRESS  # --injection-discovery-address
    ca_address: str = ""  # --injection-ca-address; "" = discovery_address
    native_sidecars: bool = True  # --native-sidecars / --no-native-sidecars
    proxy_log_level: str = "warning"  # --proxy-log-level
    proxy_concurrency: int = 2  # --proxy-concurrency
    trust_domain: str = "cluster.local"
    cluster_id: str = "Kubernetes"
    # Bounds on the pod (threat checklist: unbounded size or count). Kubernetes itself
    # has no count limit on these, only its 1.5 MiB object; past these, refused.
    max_containers: int = 500  # init containers and containers together
    max_volumes: int = 1000
    max_env: int = 1000  # env entries of one container
    max_proxy_config_bytes: int = 64 * 1024  # the proxy.istio.io/config annotation

    def __post_init__(self) -> None:
        _check(is_image(self.proxy_image), "--proxy-image", self.proxy_image)
        _check(
            _is_address(self.discovery_address),
            "--injection-discovery-address",
            self.discovery_address,
        )
        _check(
            self.ca_address == "" or _is_address(self.ca_address),
            "--injection-ca-address",
            self.ca_address,
        )
        _check(self.proxy_log_level in ENVOY_LOG_LEVELS, "--proxy-log-level", self.proxy_log_level)
        _check(
            0 <= self.proxy_concurrency <= MAX_CONCURRENCY,
            "--proxy-concurrency",
            self.proxy_concurrency,
        )
        _check(
            bool(_TRUST_DOMAIN.fullmatch(self.trust_domain)), "--trust-domain", self.trust_domain
        )
        _check(is_cluster_id(self.cluster_id), "--cluster-id", self.cluster_id)

    @property
    def ca(self) -> str:
        """CA_ADDR: the CA address, the discovery address unless named apart."""
        return self.ca_address or self.discovery_address


def _is_address(text: str) -> bool:
    """host:port with a port 1-65535 and a host of DNS or IP characters only."""
    found = _HOST_PORT.fullmatch(text)
    return found is not None and 1 <= int(found.group(2)) <= 65535


def _check(good: bool, flag: str, value: object) -> None:
    if not good:
        shown = repr(value)[:60]
        raise InjectSettingsError(f"{flag}: {shown} cannot go into an injected pod")
