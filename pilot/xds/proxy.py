"""Who a proxy is to pilot: the node id it sent and the identity it proved.

Everything pilot ties together per proxy (its workload secrets, the CDS-only
and EDS-only streams of one Envoy, CSDS rows, debug output) is keyed by
`ProxyKey`: two streams claiming one node id under different identities are
two proxies. The identity is what the stream *proved* (a token's TokenReview,
a client certificate, or with `--xds-auth none` its node metadata), as a
SPIFFE URI; None when nothing was proven.

`ProxyAuthenticator` is the seam between the gRPC shell and security: the
shell asks it who a stream is and turns its two refusals into gRPC statuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from pilot.logs import clipped

AuthContext = Mapping[str, Iterable[bytes]]


class ProxyKey(NamedTuple):
    """One proxy: its node id and the SPIFFE URI it proved (None: nothing proven).

    A named tuple, not a dataclass: every stream's arrival hashes its key a few dozen
    times (subscriptions, secrets, the cache's tables), and a tuple hashes in C.
    """

    node_id: str
    identity: str | None

    def __str__(self) -> str:
        # The node id is the client's: escaped and cut short before it reaches a log line.
        return f"{clipped(self.node_id)} ({self.identity or 'no identity'})"


class Unauthenticated(Exception):
    """The stream's credentials are missing or do not check out (UNAUTHENTICATED)."""


class PermissionDenied(Exception):
    """The stream claims an identity its credentials do not carry (PERMISSION_DENIED)."""


class ProxyAuthenticator(Protocol):
    """Decides who an xDS stream speaks for."""

    async def credential(
        self, metadata: Mapping[str, str], auth_context: AuthContext
    ) -> str | None:
        """At stream start: the proven identity (a SPIFFE URI), None if nothing is checked.

        Raises Unauthenticated.
        """
        ...

    def identity_of(self, node: Any, credential: str | None) -> str | None:
        """At the first request: the stream's identity, its node metadata checked against it.

        Raises PermissionDenied.
        """
        ...
