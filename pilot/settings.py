"""Settings for `pilot discovery`, from flags and Istio's environment variables."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pilot.builders.outbound import OutboundSettings, TrafficPolicy
from pilot.builders.path_normalization import PathNormalization
from pilot.builders.settings import BuildSettings
from pilot.cluster_ids import RULE, is_cluster_id, quoted
from pilot.durations import parse_duration
from pilot.inject.settings import InjectSettings
from pilot.kube.config import InformerSettings, KubernetesSettings
from pilot.kube.remote_settings import INSECURE_OPTIONS, RemoteSettings
from pilot.limits import Limits
from pilot.push.settings import DebounceSettings, PushSettings
from pilot.registry.model import DEFAULT_CLUSTER_ID
from pilot.security.settings import SecuritySettings
from pilot.webhook.settings import WebhookSettings


class SettingsError(ValueError):
    """A flag or environment variable has a value pilot cannot use."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the composition root needs, resolved and validated."""

    grpc_addr: str = "0.0.0.0:15010"
    http_addr: str = "0.0.0.0:15014"
    debug_addr: str | None = None
    config: Path | None = None
    cluster_id: str = DEFAULT_CLUSTER_ID  # the local cluster (--cluster-id)
    # --remote-kubeconfig ID=PATH: remote clusters watched from the start, by id.
    remote_kubeconfigs: tuple[tuple[str, Path], ...] = ()
    remote: RemoteSettings = field(default_factory=RemoteSettings)  # PILOT_*REMOTE*
    build: BuildSettings = field(default_factory=BuildSettings)
    outbound: OutboundSettings = field(default_factory=OutboundSettings)  # PILOT_OUTBOUND_*
    debounce: DebounceSettings = field(default_factory=DebounceSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    push: PushSettings = field(default_factory=PushSettings)
    file_poll_interval: float = 0.5
    grpc_tls_addr: str = ""  # the CLI default is 0.0.0.0:15012; empty: no TLS port
    # The CA, SDS and CSDS on the plaintext port too; None: only with --config.
    plaintext_secrets: bool | None = None
    # PILOT_CSDS_TRUSTED_ACCOUNTS: ns/sa that may read every proxy's status over CSDS.
    csds_trusted_accounts: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)  # PILOT_MAX_* (see pilot.limits)
    tls_dns_names: tuple[str, ...] = ()
    tls_require_client_cert: bool = False
    drain_duration: float = 5.0
    freeze_heap: bool = True  # collector.settle() after the initial state
    max_connection_age: float = 1800.0
    webhook: WebhookSettings = field(default_factory=WebhookSettings)  # address '': off
    inject: InjectSettings = field(default_factory=InjectSettings)  # what the webhook injects


def _env_duration(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return parse_duration(raw)
    except ValueError as error:
        raise SettingsError(f"{name}: {error}") from error


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}: expected true or false, got {raw!r}")


def debounce_from_env(env: Mapping[str, str] | None = None) -> DebounceSettings:
    """PILOT_DEBOUNCE_AFTER, PILOT_DEBOUNCE_MAX, PILOT_ENABLE_EDS_DEBOUNCE (Istio's knobs)."""
    env = os.environ if env is None else env
    defaults = DebounceSettings()
    return DebounceSettings(
        after=_env_duration(env, "PILOT_DEBOUNCE_AFTER", defaults.after),
        max_delay=_env_duration(env, "PILOT_DEBOUNCE_MAX", defaults.max_delay),
        eds_debounce=_env_bool(env, "PILOT_ENABLE_EDS_DEBOUNCE", defaults.eds_debounce),
    )


def push_from_env(env: Mapping[str, str] | None = None) -> PushSettings:
    """PILOT_PUSH_THROTTLE, PILOT_XDS_SEND_TIMEOUT, PILOT_MAX_LOCALITIES and
    PILOT_MAX_UNVERIFIED_LOCALITIES."""
    env = os.environ if env is None else env
    defaults = PushSettings()
    raw = env.get("PILOT_PUSH_THROTTLE", str(defaults.throttle))
    if not raw.isdigit() or int(raw) < 1:
        raise SettingsError(f"PILOT_PUSH_THROTTLE: expected a positive integer, got {raw!r}")
    timeout = _env_duration(env, "PILOT_XDS_SEND_TIMEOUT", defaults.send_timeout)
    return PushSettings(
        throttle=int(raw),
        send_timeout=timeout,
        max_localities=_env_count(env, "PILOT_MAX_LOCALITIES", defaults.max_localities),
        max_unverified_localities=_env_count(
            env, "PILOT_MAX_UNVERIFIED_LOCALITIES", defaults.max_unverified_localities
        ),
    )


def _env_count(env: Mapping[str, str], name: str, default: int) -> int:
    """A non-negative integer setting (0: none at all)."""
    raw = env.get(name, str(default))
    if not raw.isdigit():
        raise SettingsError(f"{name}: expected a non-negative integer, got {raw!r}")
    return int(raw)


def outbound_from_env(env: Mapping[str, str] | None = None) -> OutboundSettings:
    """PILOT_OUTBOUND_TRAFFIC_POLICY: ALLOW_ANY (Istio's default) or REGISTRY_ONLY;
    PILOT_MAX_ROUTE_FLAVORS: route configuration flavors held for sidecars at once."""
    env = os.environ if env is None else env
    raw = env.get("PILOT_OUTBOUND_TRAFFIC_POLICY", TrafficPolicy.ALLOW_ANY.value)
    defaults = OutboundSettings()
    flavors = _env_count(env, "PILOT_MAX_ROUTE_FLAVORS", defaults.max_route_flavors)
    try:
        return OutboundSettings(TrafficPolicy(raw.strip().upper()), flavors)
    except ValueError:
        raise SettingsError(
            f"PILOT_OUTBOUND_TRAFFIC_POLICY: expected ALLOW_ANY or REGISTRY_ONLY, got {raw[:64]!r}"
        ) from None


def path_normalization_from_env(env: Mapping[str, str] | None = None) -> PathNormalization:
    """PILOT_PATH_NORMALIZATION: BASE (Istio's default), MERGE_SLASHES or
    DECODE_AND_MERGE_SLASHES; Istio's NONE is refused (authorization paths would be
    matched against paths as the client wrote them)."""
    env = os.environ if env is None else env
    raw = env.get("PILOT_PATH_NORMALIZATION", PathNormalization.BASE.value)
    try:
        return PathNormalization(raw.strip().upper())
    except ValueError:
        pass
    choices = ", ".join(m.value for m in PathNormalization)
    why = (
        ": pilot never matches authorization paths against unnormalized ones"
        if raw.strip().upper() == "NONE"
        else ""
    )
    raise SettingsError(
        f"PILOT_PATH_NORMALIZATION: expected {choices}, got {raw[:64]!r}{why}"
    ) from None


def informer_from_env(env: Mapping[str, str] | None = None) -> InformerSettings:
    """PILOT_MAX_WATCH_EVENT_BYTES: the largest watch event (one line) pilot reads."""
    env = os.environ if env is None else env
    defaults = InformerSettings()
    raw = env.get("PILOT_MAX_WATCH_EVENT_BYTES", str(defaults.max_event_bytes))
    if not raw.isdigit() or int(raw) < 1024:
        raise SettingsError(
            f"PILOT_MAX_WATCH_EVENT_BYTES: expected a number of bytes (1024 or more), got {raw!r}"
        )
    return InformerSettings(max_event_bytes=int(raw))


def split_host_port(address: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 hosts in brackets); raises SettingsError when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingsError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback_host(host: str) -> bool:
    """Whether a listener's or a caller's host names loopback: `localhost` (and names
    under `.localhost`, which resolve there), 127.0.0.0/8 or ::1 (brackets allowed)."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])  # ::1%lo: a zone is allowed
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def csds_trusted_accounts_from_env(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """PILOT_CSDS_TRUSTED_ACCOUNTS: `ns/sa,...` that read every proxy's status over CSDS."""
    env = os.environ if env is None else env
    raw = env.get("PILOT_CSDS_TRUSTED_ACCOUNTS", "")
    accounts = tuple(a.strip() for a in raw.split(",") if a.strip())
    for account in accounts:
        namespace, _, name = account.partition("/")
        if not namespace or not name or "/" in name:
            raise SettingsError(f"PILOT_CSDS_TRUSTED_ACCOUNTS: {account!r} is not ns/sa")
    return accounts


def remote_kubeconfigs(
    given: list[tuple[str, Path]] | None, local_cluster: str
) -> tuple[tuple[str, Path], ...]:
    """`--remote-kubeconfig ID=PATH` values, checked: no id twice, none the local one."""
    seen: set[str] = set()
    for cluster, _path in given or ():
        if not is_cluster_id(cluster):
            raise SettingsError(f"--remote-kubeconfig {quoted(cluster)}: {RULE}")
        if cluster == local_cluster:
            raise SettingsError(
                f"--remote-kubeconfig {cluster}: that is the local cluster's id (--cluster-id)"
            )
        if cluster in seen:
            raise SettingsError(f"--remote-kubeconfig {cluster}: the cluster is given twice")
        seen.add(cluster)
    for cluster, path in given or ():  # the ids first: a file cannot mend a wrong id
        if not path.is_file():
            raise SettingsError(f"--remote-kubeconfig {cluster}={path}: no such file")
    return tuple(given or ())


def _env_positive(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise SettingsError(f"{name}: expected a positive integer, got {raw!r}")
    return int(raw)


def remote_from_env(env: Mapping[str, str] | None = None) -> RemoteSettings:
    """PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS (Istio's), PILOT_MAX_REMOTE_CLUSTERS,
    PILOT_MAX_REMOTE_KUBECONFIG_BYTES, PILOT_MAX_REMOTE_SECRET_BYTES and
    PILOT_REMOTE_CLUSTER_START_TIMEOUT."""
    env = os.environ if env is None else env
    defaults = RemoteSettings()
    name = "PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS"
    options = frozenset(o.strip() for o in env.get(name, "").split(",") if o.strip())
    unknown = sorted(options - INSECURE_OPTIONS.keys())
    if unknown:
        known = ", ".join(sorted(INSECURE_OPTIONS))
        raise SettingsError(f"{name}: unknown option {unknown[0]!r} (known: {known})")
    timeout = _env_duration(env, "PILOT_REMOTE_CLUSTER_START_TIMEOUT", defaults.start_timeout)
    if timeout <= 0:
        raise SettingsError("PILOT_REMOTE_CLUSTER_START_TIMEOUT: must be positive")
    return RemoteSettings(
        insecure_options=options,
        max_clusters=_env_positive(env, "PILOT_MAX_REMOTE_CLUSTERS", defaults.max_clusters),
        max_kubeconfig_bytes=_env_positive(
            env, "PILOT_MAX_REMOTE_KUBECONFIG_BYTES", defaults.max_kubeconfig_bytes
        ),
        max_secret_bytes=_env_positive(
            env, "PILOT_MAX_REMOTE_SECRET_BYTES", defaults.max_secret_bytes
        ),
        start_timeout=timeout,
    )
