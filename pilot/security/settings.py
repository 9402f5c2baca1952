"""Security settings from flags and Istio's environment variables.

CA_ADDR, CA_ROOT_CERT, CA_INSECURE, CA_TOKEN_FILE (the CA pilot's SDS uses),
CA_TRUSTED_NODE_ACCOUNTS (who may ask for another identity), SECRET_TTL,
SECRET_GRACE_PERIOD_RATIO, and POD_NAMESPACE / SERVICE_ACCOUNT (pilot's own
identity, so that it asks for impersonation only when it must). Names must be
valid Kubernetes names and durations within bounds, else SecuritySettingsError
at start.

A remote CA is always given a root (CA_ROOT_CERT, or the caller's default
path): its chains must verify against it and it is the `ROOTCA` proxies get.
Nothing is trusted on first use, not even over plaintext (`CA_INSECURE=true`
changes the transport only). The root file is read here, so that a missing or
broken one stops start-up with one line naming the variable and the path.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pilot.durations import parse_duration
from pilot.security.ca import MAX_TTL, CaSettings
from pilot.security.ca_client import RemoteCaSettings
from pilot.security.certs import KeyType, load_certificates
from pilot.security.identity import (
    Identity,
    check_account,
    check_namespace,
    check_trust_domain,
)
from pilot.security.secrets import SdsSettings
from pilot.security.xds_auth import XdsAuth

MIN_SECRET_TTL = datetime.timedelta(seconds=1)


class SecuritySettingsError(ValueError):
    """A security flag or environment variable cannot be used."""


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """Everything the CA, the CA client, SDS and xDS authentication need."""

    ca: CaSettings = field(default_factory=CaSettings)
    sds: SdsSettings = field(default_factory=SdsSettings)
    xds_auth: XdsAuth | None = None  # None: none with --config, kubernetes otherwise
    token_audiences: tuple[str, ...] = ("istio-ca",)
    trusted_node_accounts: tuple[str, ...] = ()
    remote_ca: RemoteCaSettings | None = None
    namespace: str = "default"  # pilot's own (POD_NAMESPACE): where the shared root lives
    lease_duration: float = 15.0
    # --token-auth-file (with --config only): tokens trusted without a TokenReview.
    token_auth_file: Path | None = None


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "").strip()
    return Path(value) if value else None


def own_identity(env: Mapping[str, str], trust_domain: str) -> Identity | None:
    """pilot's (or the agent's) own identity from POD_NAMESPACE and SERVICE_ACCOUNT.

    None unless both are set; SecuritySettingsError when they (or the trust
    domain) are not valid names.
    """
    try:
        check_trust_domain(trust_domain)
    except ValueError as error:
        raise SecuritySettingsError(f"--trust-domain: {error}") from error
    namespace = env.get("POD_NAMESPACE", "").strip()
    account = env.get("SERVICE_ACCOUNT", "").strip()
    if not namespace or not account:
        return None
    try:
        return Identity(trust_domain, namespace, account)
    except ValueError as error:
        raise SecuritySettingsError(f"POD_NAMESPACE / SERVICE_ACCOUNT: {error}") from error


def own_namespace(env: Mapping[str, str]) -> str:
    """POD_NAMESPACE (where the shared root lives), `default` when unset."""
    namespace = env.get("POD_NAMESPACE", "").strip() or "default"
    try:
        return check_namespace(namespace)
    except ValueError as error:
        raise SecuritySettingsError(f"POD_NAMESPACE: {error}") from error


def remote_ca_from_env(
    env: Mapping[str, str],
    trust_domain: str,
    default_address: str = "",
    default_root: Path | None = None,
) -> RemoteCaSettings | None:
    """The CA at CA_ADDR (or `default_address`), or None for pilot's own CA.

    TLS verified with the root unless CA_INSECURE=true; the root is CA_ROOT_CERT,
    else `default_root`, and must be a readable PEM certificate either way.
    """
    address = env.get("CA_ADDR", "").strip() or default_address
    if not address:
        return None
    identity = own_identity(env, trust_domain)  # who asks, before who signs
    root = _path(env, "CA_ROOT_CERT") or default_root
    if root is None:
        raise SecuritySettingsError(
            f"CA_ADDR={address}: set CA_ROOT_CERT to the root its certificates must chain to"
            " (needed with CA_INSECURE=true too: no root is taken from the CA)"
        )
    check_root_file(root)
    return RemoteCaSettings(
        address=address,
        root_cert=root,
        insecure=_flag(env, "CA_INSECURE"),
        token_file=_path(env, "CA_TOKEN_FILE"),
        own_identity=identity,
    )


def check_root_file(path: Path) -> None:
    """CA_ROOT_CERT must hold at least one PEM certificate; say which file does not."""
    try:
        pem = path.read_bytes()
    except OSError as error:
        raise SecuritySettingsError(
            f"CA_ROOT_CERT: cannot read the CA root {path.absolute()}: {error.strerror or error}"
        ) from error
    try:
        load_certificates(pem)
    except ValueError:
        raise SecuritySettingsError(
            f"CA_ROOT_CERT: no PEM certificate in {path.absolute()}"
        ) from None


def sds_from_env(env: Mapping[str, str], key_type: KeyType) -> SdsSettings:
    """SECRET_TTL (1s to the CA's 90-day maximum) and SECRET_GRACE_PERIOD_RATIO (0 to 1)."""
    defaults = SdsSettings()
    text = env.get("SECRET_TTL", "24h")
    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise SecuritySettingsError(f"SECRET_TTL: {error}") from error
    # Whole seconds go to the CA (validity_duration): below 1s would ask for its default.
    if not MIN_SECRET_TTL.total_seconds() <= seconds <= MAX_TTL.total_seconds():
        raise SecuritySettingsError(
            f"SECRET_TTL={text.strip()} is out of range: from {_go(MIN_SECRET_TTL)}"
            f" to {_go(MAX_TTL)} (90 days, the most a CA signs for)"
        )
    try:
        ratio = float(env.get("SECRET_GRACE_PERIOD_RATIO", str(defaults.grace_ratio)))
    except ValueError as error:
        raise SecuritySettingsError(f"SECRET_GRACE_PERIOD_RATIO: {error}") from error
    if not 0 < ratio < 1:
        raise SecuritySettingsError(
            f"SECRET_GRACE_PERIOD_RATIO must be between 0 and 1, got {ratio}"
        )
    return SdsSettings(
        key_type=key_type, ttl=datetime.timedelta(seconds=seconds), grace_ratio=ratio
    )


def _go(duration: datetime.timedelta) -> str:
    """A whole number of seconds as a Go duration: `1s`, `2160h`."""
    seconds = int(duration.total_seconds())
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds}s"


def trusted_accounts(env: Mapping[str, str]) -> tuple[str, ...]:
    """CA_TRUSTED_NODE_ACCOUNTS: `ns/sa,ns/sa`, each a valid namespace and service account."""
    accounts = tuple(
        a.strip() for a in env.get("CA_TRUSTED_NODE_ACCOUNTS", "").split(",") if a.strip()
    )
    for account in accounts:
        try:
            check_account(account)
        except ValueError as error:
            raise SecuritySettingsError(f"CA_TRUSTED_NODE_ACCOUNTS: {error}") from error
    return accounts


def security_from_env(
    ca: CaSettings,
    key_type: KeyType,
    xds_auth: XdsAuth | None,
    token_audiences: tuple[str, ...],
    env: Mapping[str, str] | None = None,
) -> SecuritySettings:
    """Combine flags with the environment."""
    env = os.environ if env is None else env
    return SecuritySettings(
        ca=ca,
        sds=sds_from_env(env, key_type),
        xds_auth=xds_auth,
        token_audiences=token_audiences,
        trusted_node_accounts=trusted_accounts(env),
        remote_ca=remote_ca_from_env(env, ca.trust_domain),
        namespace=own_namespace(env),
    )
