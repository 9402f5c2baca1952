"""A remote cluster's kubeconfig as data: parsed with bounds, checked, and turned into an
API client in memory.

A remote kubeconfig comes from whoever can write a multi-cluster Secret in pilot's
namespace (or from a `--remote-kubeconfig` file), so it must not make pilot run a
program, read a local file or connect anywhere but its `server`. kubernetes-asyncio's
loader does all three (exec plugins, auth providers, `tokenFile` and other file paths)
and writes inline keys to temp files it never removes, so it is not used: `load_credentials`
keeps what a kubeconfig may say (server, inline token, inline client certificate and
key, inline CA, `insecure-skip-tls-verify`, `tls-server-name`) and refuses the rest,
unless the operator lists the option in PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS
(`remote_settings.INSECURE_OPTIONS`). `insecure-skip-tls-verify` is kept as
`RemoteCredentials.insecure`, for the caller to warn about or refuse (`clusters.py`).
`api_client_for` then builds the client's Configuration itself. Key material never
lands on disk: the TLS context reads it from anonymous memory files (`memfd_create`),
closed once the context holds it.

The YAML (or JSON) is parsed with bounds on nesting and aliases, checked on libyaml's
event stream before any document is built (a 20,000-deep value would otherwise blow
Python's recursion limit), and `load_credentials` is meant to run in a worker thread.
Error messages name what was refused, never a value from the kubeconfig beyond a
quoted, shortened name.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from pilot.cluster_ids import quoted
from pilot.kube.api_client import BoundedApiClient
from pilot.kube.config import KubernetesUnavailable

MAX_DEPTH = 20  # a kubeconfig nests 4-5 levels
MAX_ALIASES = 8  # kubeconfigs have none; a few are tolerated, never an alias bomb
MAX_NAMED_FILE_BYTES = 1 << 20  # a file an allowed option names: a token, a CA bundle, a key
ALLOW_SETTING = "PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS"
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)

# kubeconfig field -> the option that allows it; each reads a file, runs a program or
# fetches a URL the kubeconfig chose.
_USER_OPTIONS = {
    "exec": "exec",
    "auth-provider": "authProvider",
    "tokenFile": "tokenFile",
    "client-certificate": "clientCertificate",
    "client-key": "clientKey",
}
_CLUSTER_OPTIONS = {"certificate-authority": "certificateAuthority"}
# Fields no option allows: pilot sends credentials to `server` only, as a bearer token
# or a client certificate.
_USER_REFUSED = {
    "username": "basic auth (username/password) is not supported",
    "password": "basic auth (username/password) is not supported",
}
_CLUSTER_REFUSED = {"proxy-url": "proxy-url is not supported: pilot connects to server only"}


class KubeconfigError(KubernetesUnavailable):
    """A kubeconfig that does not load, or is refused; the message never quotes it."""


@dataclass(frozen=True, slots=True)
class RemoteCredentials:
    """What pilot takes from a remote kubeconfig: where to connect, and how to prove
    who it is. `plugin_document` is set only when the operator allowed `exec` or
    `authProvider` and the kubeconfig uses one: then the library loads that document."""

    server: str
    token: str | None = None
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    plugin_document: Mapping[str, Any] | None = None


# ------------------------------------------------------------------ bounded parsing


def parse_bounded(text: str) -> dict[str, Any]:
    """The kubeconfig document (YAML or JSON): at most MAX_DEPTH deep, MAX_ALIASES
    aliases, one document. Raises KubeconfigError."""
    _check_shape(text)
    try:
        document = yaml.load(text, Loader=_LOADER)  # a safe loader (C or Python)
    except (yaml.YAMLError, ValueError, TypeError):
        raise KubeconfigError("the kubeconfig is not YAML") from None
    if not isinstance(document, dict):
        raise KubeconfigError("the kubeconfig is not a mapping")
    return document


def _check_shape(text: str) -> None:
    """Walk libyaml's events (no recursion, no objects built): refuse deep nesting,
    aliases beyond a few and more than one document."""
    depth = aliases = documents = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, _OPENS):
                depth += 1
                if depth > MAX_DEPTH:
                    raise KubeconfigError(f"the kubeconfig nests deeper than {MAX_DEPTH}")
            elif isinstance(event, _CLOSES):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise KubeconfigError(f"the kubeconfig has more than {MAX_ALIASES} aliases")
            elif isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise KubeconfigError("the kubeconfig has more than one document")
    except yaml.YAMLError:
        raise KubeconfigError("the kubeconfig is not YAML") from None


# ------------------------------------------------------------------ checking


def load_credentials(text: str, allowed: frozenset[str]) -> RemoteCredentials:
    """Parse and check a kubeconfig; read the files it names only where `allowed` says.
    Blocking (parsing, allowed file reads): run it in a worker thread. Raises
    KubeconfigError naming what was refused."""
    document = parse_bounded(text)
    _refuse_unsafe(document, allowed)
    cluster, user = _current(document)
    uses_plugin = any(user.get(field) for field in ("exec", "auth-provider"))
    server = _server(cluster)
    insecure = _flag(cluster, "insecure-skip-tls-verify")  # said whichever path loads it
    if uses_plugin:  # the operator allowed it (else _refuse_unsafe raised)
        return RemoteCredentials(server, insecure=insecure, plugin_document=document)
    return RemoteCredentials(
        server=server,
        token=_token(user),
        ca_pem=_material(cluster, "certificate-authority", "CA"),
        cert_pem=_material(user, "client-certificate", "client certificate"),
        key_pem=_material(user, "client-key", "client key"),
        insecure=insecure,
        tls_server_name=_optional_text(cluster, "tls-server-name"),
    )


def _entries(document: Mapping[str, Any], section: str, field: str) -> dict[str, Any]:
    """`clusters`/`users`/`contexts`: name -> its body (a mapping)."""
    found: dict[str, Any] = {}
    entries = document.get(section) or []
    if not isinstance(entries, list):
        raise KubeconfigError(f"the kubeconfig's {section} is not a list")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get(field) or {}, dict):
            raise KubeconfigError(f"the kubeconfig has a malformed entry in {section}")
        found[str(entry.get("name", ""))] = entry.get(field) or {}
    return found


def _refuse_unsafe(document: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Every user and cluster, used or not (as Istio does): nothing that would read a
    file, run a program or connect elsewhere unless the operator allowed it."""
    sections = (
        ("users", "user", _USER_OPTIONS, _USER_REFUSED),
        ("clusters", "cluster", _CLUSTER_OPTIONS, _CLUSTER_REFUSED),
    )
    for section, field, options, refused in sections:
        for name, body in _entries(document, section, field).items():
            where = f"{field} {quoted(name)}"
            for key, problem in refused.items():
                if body.get(key):
                    raise KubeconfigError(f"refused: {where}: {problem}")
            for key, option in options.items():
                if body.get(key) and option not in allowed:
                    raise KubeconfigError(
                        f"refused: {where} has {key}; pilot uses inline credentials only"
                        f" (allow it with {ALLOW_SETTING}={option})"
                    )


def _current(document: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The current context's cluster and user (the only context, when none is current)."""
    contexts = _entries(document, "contexts", "context")
    name = document.get("current-context")
    if not name and len(contexts) == 1:
        name = next(iter(contexts))
    if not name or str(name) not in contexts:
        raise KubeconfigError("the kubeconfig names no current context")
    context = contexts[str(name)]
    clusters = _entries(document, "clusters", "cluster")
    users = _entries(document, "users", "user")
    cluster_name, user_name = str(context.get("cluster", "")), context.get("user")
    if cluster_name not in clusters:
        raise KubeconfigError("the kubeconfig's current context names no known cluster")
    if user_name is not None and str(user_name) not in users:
        raise KubeconfigError("the kubeconfig's current context names no known user")
    return clusters[cluster_name], users.get(str(user_name), {}) if user_name else {}


def _server(cluster: Mapping[str, Any]) -> str:
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigError("the kubeconfig names no server")
    try:
        parts = urlsplit(server)
    except ValueError:
        raise KubeconfigError("the kubeconfig's server is not a URL") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise KubeconfigError("the kubeconfig's server is not an http(s) URL")
    return server.rstrip("/")


def _optional_text(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise KubeconfigError(f"the kubeconfig's {key} is not a string")
    return value


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise KubeconfigError(f"the kubeconfig's {key} is not true or false")
    return value


def _token(user: Mapping[str, Any]) -> str | None:
    token = _optional_text(user, "token")
    path = _optional_text(user, "tokenFile")
    if token is None and path is not None:  # allowed by the operator (checked above)
        token = _read_file(path, "tokenFile").decode("utf-8", errors="replace").strip()
    if token is not None and any(c in token for c in "\r\n\0"):
        raise KubeconfigError("the kubeconfig's token is not one line")
    return token


def _material(body: Mapping[str, Any], key: str, what: str) -> bytes | None:
    """`KEY-data` (base64 PEM), or the file `KEY` names where the operator allowed it."""
    inline = _optional_text(body, f"{key}-data")
    if inline is not None:
        try:
            return base64.b64decode(inline, validate=True)
        except binascii.Error:
            raise KubeconfigError(f"the kubeconfig's {key}-data is not base64") from None
    path = _optional_text(body, key)
    return _read_file(path, key) if path is not None else None


def _read_file(path: str, key: str) -> bytes:
    """The regular file at `path`, a token or PEM the operator allowed the kubeconfig to
    name, at most MAX_NAMED_FILE_BYTES.

    Opened without waiting and refused unless regular: a FIFO nobody writes held the
    worker thread for good, and with it pilot's exit on SIGTERM; a device such as
    /dev/zero never ends.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as named:
            if not stat.S_ISREG(os.fstat(named.fileno()).st_mode):
                raise KubeconfigError(f"the kubeconfig's {key} is not a regular file")
            data = named.read(MAX_NAMED_FILE_BYTES + 1)
    except OSError as error:
        raise KubeconfigError(f"the kubeconfig's {key} cannot be read ({error.strerror})") from None
    if len(data) > MAX_NAMED_FILE_BYTES:
        raise KubeconfigError(f"the kubeconfig's {key} is larger than {MAX_NAMED_FILE_BYTES} bytes")
    return data


# ------------------------------------------------------------------ the API client


@dataclass
class RemoteClient:
    """An API client for one remote cluster, and what to remove when it closes."""

    api_client: client.ApiClient
    server: str
    private_dir: Path | None = None  # the library's temp files, for an allowed plugin
    insecure: bool = False  # insecure-skip-tls-verify: the API server is not verified

    async def close(self) -> None:
        await self.api_client.close()
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)


def api_client_for(credentials: RemoteCredentials) -> RemoteClient:
    """The client's Configuration built from checked credentials: host, bearer token,
    TLS verification and material, nothing else (no refresh hook, no proxy)."""
    configuration = client.Configuration(host=credentials.server)
    configuration.verify_ssl = not credentials.insecure
    configuration.tls_server_name = credentials.tls_server_name
    if credentials.token:
        configuration.api_key = {"BearerToken": credentials.token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    if credentials.cert_pem is not None and credentials.key_pem is None:
        raise KubeconfigError("the kubeconfig has a client certificate but no client key")
    with _memory_files() as add:
        if credentials.ca_pem is not None:
            configuration.ssl_ca_cert = add(credentials.ca_pem)
        if credentials.cert_pem is not None and credentials.key_pem is not None:
            configuration.cert_file = add(credentials.cert_pem)
            configuration.key_file = add(credentials.key_pem)
        try:
            api_client = BoundedApiClient(configuration)
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            raise KubeconfigError(
                f"the kubeconfig's TLS material does not load ({type(error).__name__})"
            ) from None
    # The TLS context holds the material now; the paths die with the memory files.
    configuration.ssl_ca_cert = configuration.cert_file = configuration.key_file = None
    return RemoteClient(api_client, credentials.server, insecure=credentials.insecure)


async def plugin_api_client(credentials: RemoteCredentials) -> RemoteClient:
    """An allowed exec plugin or auth provider: the library's loader, its temp files in a
    private directory (0700) removed when the client closes."""
    assert credentials.plugin_document is not None
    private = Path(tempfile.mkdtemp(prefix="pilot-remote-"))
    configuration = client.Configuration()
    try:
        await config.load_kube_config_from_dict(
            dict(credentials.plugin_document),
            client_configuration=configuration,
            temp_file_path=str(private),
        )
        return RemoteClient(
            BoundedApiClient(configuration), credentials.server, private, credentials.insecure
        )
    except (ConfigException, ValueError, TypeError, KeyError, AttributeError, OSError) as error:
        shutil.rmtree(private, ignore_errors=True)
        raise KubeconfigError(f"the kubeconfig does not load ({type(error).__name__})") from None
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise


@contextlib.contextmanager
def _memory_files() -> Iterator[Any]:
    """`add(data) -> path`: a file only this process can open, closed on exit.

    memfd_create: anonymous memory, never on a file system; elsewhere a private
    directory (0700) whose 0600 files are removed on exit."""
    fds: list[int] = []
    private: str | None = None

    def add(data: bytes) -> str:
        nonlocal private
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("pilot-remote-tls", os.MFD_CLOEXEC)
            fds.append(fd)
            with open(fd, "wb", closefd=False) as file:
                file.write(data)
            return f"/proc/self/fd/{fd}"
        private = private or tempfile.mkdtemp(prefix="pilot-remote-")
        fd, path = tempfile.mkstemp(dir=private)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return path

    try:
        yield add
    finally:
        for fd in fds:
            os.close(fd)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
