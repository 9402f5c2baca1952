"""`pilot discovery`'s settings from its flags and Istio's environment variables, each
checked before anything is served: the listen addresses, what --xds-auth none allows,
the token file, --config."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from pilot.builders.settings import BuildSettings
from pilot.cli.injection_flags import inject_settings
from pilot.cli.listen_check import check_address_forms, check_listen_addresses
from pilot.inject.settings import InjectSettings, InjectSettingsError
from pilot.kube.config import (
    EndpointsApi,
    KubernetesSettings,
)
from pilot.limits import limits_from_env
from pilot.security.ca import CaSettings
from pilot.security.certs import KeyType
from pilot.security.settings import SecuritySettings, security_from_env
from pilot.security.xds_auth import XdsAuth
from pilot.settings import (
    Settings,
    SettingsError,
    csds_trusted_accounts_from_env,
    debounce_from_env,
    informer_from_env,
    is_loopback_host,
    outbound_from_env,
    path_normalization_from_env,
    push_from_env,
    remote_from_env,
    remote_kubeconfigs,
    split_host_port,
)
from pilot.webhook.settings import WebhookSettingError, WebhookSettings, webhook_from_env

log = logging.getLogger("pilot")


def _security(args: argparse.Namespace) -> SecuritySettings:
    ca = CaSettings(
        cert_dir=args.ca_cert_dir, state_dir=args.ca_state_dir, trust_domain=args.trust_domain
    )
    xds_auth = XdsAuth(args.xds_auth) if args.xds_auth else None
    settings = security_from_env(ca, KeyType(args.key_type), xds_auth, (args.token_audience,))
    return dataclasses.replace(settings, token_auth_file=_token_auth_file(args))


def _token_auth_file(args: argparse.Namespace) -> Path | None:
    """`--token-auth-file`, where it may be used: Kubernetes mode checks tokens by TokenReview."""
    path: Path | None = args.token_auth_file
    if path is not None and not path.is_file():
        raise SettingsError(f"--token-auth-file {path}: no such file")
    if path is not None and args.config is None:
        raise SettingsError(
            "--token-auth-file: only with --config (in Kubernetes mode"
            " the API server checks tokens)"
        )
    if path is not None and args.kubeconfig is not None:
        raise SettingsError(
            "--token-auth-file and --kubeconfig: tokens are checked one way,"
            " by the file or by TokenReview; give one"
        )
    return path


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """Every flag and variable checked; the ports last, so that a wrong flag is named
    before a port another program holds."""
    settings = _flag_settings(args)
    addresses = (
        settings.grpc_addr,
        settings.grpc_tls_addr,
        settings.http_addr,
        settings.webhook.address,
    )
    listened = zip(_ADDRESS_FLAGS, addresses, strict=True)
    # Every address, --debug-addr's too, must resolve and be free (`pilot.listen_check`).
    check_listen_addresses([*listened, ("--debug-addr", settings.debug_addr or "")])
    return settings


def _flag_settings(args: argparse.Namespace) -> Settings:
    grpc_addr, grpc_tls_addr, http_addr, webhook_addr = _addresses(args)
    settings = Settings(
        grpc_addr=grpc_addr,
        http_addr=http_addr,
        debug_addr=args.debug_addr,
        grpc_tls_addr=grpc_tls_addr,
        plaintext_secrets=args.plaintext_secrets,
        csds_trusted_accounts=csds_trusted_accounts_from_env(),
        limits=limits_from_env(),
        tls_dns_names=tuple(n.strip() for n in args.tls_dns_names.split(",") if n.strip()),
        tls_require_client_cert=args.grpc_tls_require_client_cert,
        drain_duration=args.drain_duration,
        max_connection_age=args.max_connection_age,
        webhook=_webhook(webhook_addr, args.injector_webhook_config),
        inject=_inject(args),
        config=args.config,
        cluster_id=args.cluster_id,
        remote_kubeconfigs=remote_kubeconfigs(args.remote_kubeconfig, args.cluster_id),
        remote=dataclasses.replace(
            remote_from_env(),
            refuse_insecure_skip_tls_verify=args.refuse_insecure_skip_tls_verify,
        ),
        build=BuildSettings(
            args.cluster_domain,
            args.xds_cluster_name,
            args.trust_domain,
            path_normalization_from_env(),
        ),
        outbound=outbound_from_env(),
        debounce=debounce_from_env(),
        push=push_from_env(),
        security=_security(args),
        kubernetes=KubernetesSettings(
            kubeconfig=args.kubeconfig,
            namespaces=tuple(n.strip() for n in args.namespaces.split(",") if n.strip()),
            endpoints_api=EndpointsApi(args.endpoints_api),
            informer=informer_from_env(),
        ),
    )
    _check_config_file(args.config)  # after the flags' own checks: a flag is named first
    return settings


ANY_ADDRESSES = ("0.0.0.0:15010", "0.0.0.0:15012", "0.0.0.0:15014", "0.0.0.0:15017")
LOOPBACK_ADDRESSES = ("127.0.0.1:15010", "127.0.0.1:15012", "127.0.0.1:15014", "127.0.0.1:15017")
_ADDRESS_FLAGS = ("--grpc-addr", "--grpc-tls-addr", "--http-addr", "--webhook-addr")
# The listeners that hand out identities with --xds-auth none (the webhook hands out none).
_TRUSTING_FLAGS = frozenset(_ADDRESS_FLAGS[:3])


def _inject(args: argparse.Namespace) -> InjectSettings:
    try:
        return inject_settings(args)
    except InjectSettingsError as error:
        raise SettingsError(str(error)) from None


def _webhook(address: str, configuration: str) -> WebhookSettings:
    try:
        return webhook_from_env(address, configuration)
    except WebhookSettingError as error:
        raise SettingsError(str(error)) from None


def _trusts_metadata(args: argparse.Namespace) -> bool:
    """Whether streams are who their node metadata says (--xds-auth none, or its default
    with --config): then the CA hands any caller any identity's certificate."""
    if args.xds_auth:
        return XdsAuth(args.xds_auth) is XdsAuth.NONE
    return args.config is not None


def _addresses(args: argparse.Namespace) -> tuple[str, str, str, str]:
    """--grpc-addr, --grpc-tls-addr, --http-addr and --webhook-addr, defaults filled in
    and checked.

    With --xds-auth none pilot binds loopback by default and refuses an address off
    loopback (SettingsError, naming the flag), unless --insecure-bind-any says the
    operator means it: then all interfaces are the default, and pilot warns.
    """
    trusting = _trusts_metadata(args)
    defaults = LOOPBACK_ADDRESSES if trusting and not args.insecure_bind_any else ANY_ADDRESSES
    given = (args.grpc_addr, args.grpc_tls_addr, args.http_addr, args.webhook_addr)
    chosen = tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))
    flagged = [*zip(_ADDRESS_FLAGS, chosen, strict=True), ("--debug-addr", args.debug_addr or "")]
    check_address_forms(flagged)
    exposed = [
        f"{flag} {address}"
        for flag, address in zip(_ADDRESS_FLAGS, chosen, strict=True)
        if address and flag in _TRUSTING_FLAGS and not is_loopback_host(split_host_port(address)[0])
    ]
    if trusting and exposed and not args.insecure_bind_any:
        raise SettingsError(
            f"{exposed[0]}: with --xds-auth none any caller gets any identity's certificate,"
            " so pilot binds loopback only; add --insecure-bind-any to bind off loopback"
        )
    if trusting and exposed:
        log.warning(
            "--insecure-bind-any: %s off loopback with --xds-auth none: anyone who reaches"
            " them gets any identity's certificate from pilot's CA",
            ", ".join(exposed),
        )
    grpc_addr, grpc_tls_addr, http_addr, webhook_addr = chosen
    return grpc_addr, grpc_tls_addr, http_addr, webhook_addr


def _check_config_file(path: Path | None) -> None:
    """A --config that is not there at start, or can never be a registry file, is an error
    at start: a path mistyped would otherwise leave pilot running, unready, for good.
    A file that is there but broken or empty is not: pilot waits for a good version,
    unready, saying so in its log; and a file removed later keeps the last good state."""
    if path is None:
        return
    if not path.exists():
        raise SettingsError(f"--config {path}: no such file")
    if path.is_dir():
        raise SettingsError(f"--config {path}: is a directory, not a registry file")
