"""`pilot proxy-status`: one row per proxy, from CSDS, like `istioctl proxy-status`.

Also how the command line reaches pilot's CSDS (`Access`, `fetch`, and the
`hint` after a refusal), which `pilot proxy-config` shares. A proxy is a node
id and the identity its streams proved (CSDS `client_scope`), so the identity
is a column of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from envoy.service.status.v3 import csds_pb2

from pilot.debug.csds import CSDS_SERVICE
from pilot.debug.tables import Cell, Table
from pilot.xds import types

# istioctl's order (CDS, LDS, EDS, RDS), then the secrets pilot serves too.
COLUMNS = (
    ("CDS", types.CLUSTER),
    ("LDS", types.LISTENER),
    ("EDS", types.ENDPOINT),
    ("RDS", types.ROUTE),
    ("SDS", types.SECRET),
)


@dataclass(frozen=True)
class Access:
    """How to reach pilot's CSDS: plaintext, or TLS with its root; with a token or not."""

    root_pem: bytes | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_files(cls, root_cert: Path | None, token_file: Path | None) -> Access:
        """Read --root-cert and --token-file (OSError names the file that cannot be read)."""
        root = root_cert.read_bytes() if root_cert is not None else None
        token = token_file.read_text().strip() if token_file is not None else None
        return cls(root, token)

    def channel(self, address: str) -> grpc.Channel:
        if self.root_pem is None:
            return grpc.insecure_channel(address)
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(self.root_pem))

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def fetch(
    address: str,
    access: Access | None = None,
    timeout: float = 10.0,
    request: csds_pb2.ClientStatusRequest | None = None,
) -> csds_pb2.ClientStatusResponse:
    """FetchClientStatus from pilot: `request`, or every proxy without resource contents."""
    access = access or Access()
    if request is None:
        request = csds_pb2.ClientStatusRequest(exclude_resource_contents=True)
    with access.channel(address) as channel:
        call = channel.unary_unary(
            f"/{CSDS_SERVICE}/FetchClientStatus",
            request_serializer=csds_pb2.ClientStatusRequest.SerializeToString,
            response_deserializer=csds_pb2.ClientStatusResponse.FromString,
        )
        response: csds_pb2.ClientStatusResponse = call(
            request, timeout=timeout, metadata=access.metadata
        )
        return response


def hint(code: grpc.StatusCode) -> str:
    """What to try next, for the refusals a Kubernetes-mode pilot gives."""
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return " (in Kubernetes mode CSDS is on pilot's TLS port: --addr HOST:15012 --root-cert)"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return " (present a service-account token: --token-file)"
    return ""


def summarize(configs: Iterable[csds_pb2.ClientConfig.GenericXdsConfig]) -> str | None:
    """One cell: the worst state of a proxy's resources of one type, and how many (None: none)."""
    return summarize_counts(
        Counter(csds_pb2.ConfigStatus.Name(config.config_status) for config in configs)
    )


def summarize_counts(counts: Mapping[str, int]) -> str | None:
    """One cell from how many resources are in each state (keyed SYNCED, STALE, ...)."""
    total = sum(counts.values())
    if not total:
        return None
    for status in ("ERROR", "STALE"):
        if counts.get(status):
            return f"{status} ({counts[status]}/{total})"
    synced = counts.get("SYNCED", 0)
    if synced == 0:
        return f"NOT SENT ({total})"
    not_sent = counts.get("NOT_SENT", 0)
    suffix = f", {not_sent} not sent" if not_sent else ""
    return f"SYNCED ({synced}{suffix})"


def status_table(response: csds_pb2.ClientStatusResponse) -> Table:
    """NAME (node id), IDENTITY (what its streams proved), then a state per type."""
    records = []
    for config in sorted(response.config, key=lambda c: (c.node.id, c.client_scope)):
        record: dict[str, Cell] = {"name": config.node.id, "identity": config.client_scope or None}
        for name, type_url in COLUMNS:
            configs = (c for c in config.generic_xds_configs if c.type_url == type_url)
            record[name.lower()] = summarize(configs)
        records.append(record)
    return Table.of(("NAME", "IDENTITY", *(name for name, _ in COLUMNS)), records)
