"""Which RPC a stream came in on, and what that RPC allows.

ADS streams (`fixed_type` None) carry every type; the standalone services
(StreamClusters, DeltaEndpoints, StreamSecrets, ...) carry one. A request for
another type on a fixed-type service breaks the protocol. The flavor says which
EDS config source the stream's clusters carry (see `pilot.xds.flavor`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pilot.logs import clipped
from pilot.protocol.delta import DeltaStream
from pilot.protocol.messages import ProtocolError
from pilot.protocol.sotw import SotwStream
from pilot.xds import types
from pilot.xds.flavor import Flavor


@dataclass(frozen=True, slots=True)
class StreamKind:
    """The RPC of a stream: SotW or delta, aggregated or one type, and its cluster flavor."""

    delta: bool
    fixed_type: str | None  # None: aggregated (ADS), any type
    flavor: Flavor

    @property
    def label(self) -> str:
        base = "ads" if self.fixed_type is None else types.short_name(self.fixed_type)
        return f"{base}-delta" if self.delta else base

    def check(self, type_url: str) -> None:
        """Raise ProtocolError if this RPC does not carry `type_url`."""
        if self.fixed_type is not None and type_url != self.fixed_type:
            raise ProtocolError(
                f"type_url {clipped(type_url)} is not served on the {self.label} service"
            )

    def new_stream(self) -> SotwStream | DeltaStream:
        """A fresh protocol machine for a stream of this kind."""
        return DeltaStream() if self.delta else SotwStream()
