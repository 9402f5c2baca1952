"""Static service-account tokens for one machine: `--token-auth-file`, with `--config` only.

Without Kubernetes there is no TokenReview, so nothing could prove who `pilot
agent` is. `--token-auth-file FILE` names tokens pilot trusts, in the format of
kube-apiserver's flag of the same name: one CSV line per token,
`TOKEN,USER[,UID[,GROUPS]]`, the user a service account
(`system:serviceaccount:NAMESPACE:NAME`); lines starting with `#` and blank
lines are skipped. The file is read once, at start, and refused (pilot stops,
naming the file and the line) when others may read it, when a line is not a
token and a service account, or when a token is given twice. Kubernetes mode
never reads it: there a token is what the API server says it is.

A token is found by its SHA-256, in one lookup whatever the file's size, then
compared in constant time; no token ever appears in a message.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from pilot.security.authn import AuthError
from pilot.security.identity import Identity
from pilot.security.settings import SecuritySettingsError

MAX_FILE_BYTES = 1024 * 1024
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class TokenFileError(SecuritySettingsError):
    """`--token-auth-file` cannot be used; the message names the file (never a token)."""


class StaticTokenReviewer:
    """Implements `TokenReviewer` from a fixed token -> user name table.

    Tokens are held by their SHA-256, and a token is looked up by its own: one
    hash and one dict lookup per call, however many tokens the file has (a
    caller with any token at all could otherwise have pilot compare it with
    each of them). The time taken depends on the presented token's digest, which
    says nothing about any token pilot holds; the entry found is then compared
    in constant time.
    """

    def __init__(self, users: Mapping[str, str]) -> None:
        self._by_digest = {_digest(token): (token, user) for token, user in users.items()}

    def __len__(self) -> int:
        return len(self._by_digest)

    async def review(self, token: str, audiences: Sequence[str]) -> str:
        found = self._by_digest.get(_digest(token))
        if found is None or not hmac.compare_digest(found[0].encode(), token.encode()):
            raise AuthError("token rejected: not in --token-auth-file")
        return found[1]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _check_private(path: Path) -> bytes:
    try:
        info = path.stat()
        if info.st_mode & stat.S_IROTH:
            raise TokenFileError(f"--token-auth-file {path}: others can read it (chmod o-r)")
        if info.st_size > MAX_FILE_BYTES:
            raise TokenFileError(f"--token-auth-file {path}: larger than {MAX_FILE_BYTES} bytes")
        return path.read_bytes()
    except OSError as error:
        raise TokenFileError(
            f"--token-auth-file {path}: cannot read: {error.strerror or error}"
        ) from None


def _user(path: Path, number: int, fields: list[str], trust_domain: str) -> str:
    where = f"--token-auth-file {path}, line {number}"
    if len(fields) < 2 or not fields[0].strip():
        raise TokenFileError(f"{where}: expected TOKEN,USER[,UID[,GROUPS]]")
    user = fields[1].strip()
    if not user.startswith(SERVICE_ACCOUNT_PREFIX):
        raise TokenFileError(f"{where}: the user must be {SERVICE_ACCOUNT_PREFIX}NAMESPACE:NAME")
    try:
        Identity.from_username(user, trust_domain)
    except ValueError as error:
        raise TokenFileError(f"{where}: {error}") from None
    return user


def load_token_file(path: Path, trust_domain: str) -> StaticTokenReviewer:
    """The tokens of `path`; raises TokenFileError naming the file and line."""
    text = _check_private(path).decode("utf-8", errors="replace")
    users: dict[str, str] = {}
    for number, fields in enumerate(csv.reader(text.splitlines()), start=1):
        if not fields or not "".join(fields).strip() or fields[0].lstrip().startswith("#"):
            continue
        user = _user(path, number, fields, trust_domain)
        token = fields[0].strip()
        if token in users:
            raise TokenFileError(f"--token-auth-file {path}, line {number}: a token given twice")
        users[token] = user
    if not users:
        raise TokenFileError(f"--token-auth-file {path}: no tokens")
    return StaticTokenReviewer(users)
