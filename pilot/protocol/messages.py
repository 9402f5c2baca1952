"""The values that cross the sans-I/O boundary: requests in, events and responses out."""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pilot.xds.resource import Resource

# A shared answer's last wire bytes, by (version, nonce, removals; -1 for SotW).
Wire = dict[tuple[str, str, int], bytes]


class ProtocolError(Exception):
    """The client broke the protocol; the shell turns this into INVALID_ARGUMENT."""


class ResourceView(Protocol):
    """What a stream may read of the current resources (one consistent state)."""

    def get(self, type_url: str, name: str) -> Resource | None: ...

    def lookup(self, type_url: str) -> Callable[[str], Resource | None]:
        """`get` for one type, fetched once: a full response looks up thousands of names."""
        ...

    def names(self, type_url: str) -> Collection[str]: ...

    def version(self, type_url: str) -> str: ...

    def pending(self, type_url: str, name: str) -> bool:
        """True while a resource is being made (a secret being minted): not absent, not yet."""
        ...

    def first_answers(self, type_url: str) -> AnswerStore | None:
        """Where streams that read what this one reads of a type share their answers while
        its tables hold what they hold now (None: work each out alone). Never for a type whose
        resources may be in the making (`pending`)."""
        ...


class AnswerStore(Protocol):
    """A memo of answers by subscription, shared by streams that read one table."""

    def get(self, key: Hashable) -> object | None: ...

    def put(self, key: Hashable, answer: object, names: int) -> None:
        """Remember `answer` (covering `names` names) if there is room; else forget it."""
        ...


@dataclass(frozen=True, slots=True)
class SotwRequest:
    """A state-of-the-world DiscoveryRequest, reduced to what the protocol uses."""

    type_url: str
    resource_names: tuple[str, ...] = ()
    version_info: str = ""
    response_nonce: str = ""
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeltaRequest:
    """A DeltaDiscoveryRequest, reduced to what the protocol uses."""

    type_url: str
    subscribe: tuple[str, ...] = ()
    unsubscribe: tuple[str, ...] = ()
    initial_resource_versions: Mapping[str, str] = field(default_factory=dict)
    response_nonce: str = ""
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class SotwResponse:
    """A DiscoveryResponse to write: the resources are shared, pre-encoded values."""

    type_url: str
    version_info: str
    nonce: str
    resources: tuple[Resource, ...]
    wire: Wire | None = field(default=None, compare=False)  # see DeltaResponse.wire


@dataclass(frozen=True, slots=True)
class DeltaResponse:
    """A DeltaDiscoveryResponse to write."""

    type_url: str
    system_version_info: str
    nonce: str
    resources: tuple[Resource, ...]
    removed: tuple[str, ...]
    # Set on a first answer shared by streams that subscribe alike: where the encoder
    # keeps the last wire bytes it made of it, which streams whose nonce is the same
    # (streams that asked alike count alike) send as they are.
    wire: Wire | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Acked:
    """The client applied the response with this nonce."""

    type_url: str
    nonce: str
    version: str


@dataclass(frozen=True, slots=True)
class Nacked:
    """The client rejected the response with this nonce; it keeps its last good state.

    `message` is the client's, one printable line of bounded length
    (`rejections`). `blamed`: the names it says it rejected, having applied the
    response's others when `partial` (empty: the whole response is rejected).
    """

    type_url: str
    nonce: str
    rejected_version: str
    message: str
    blamed: tuple[str, ...] = ()
    partial: bool = False


@dataclass(frozen=True, slots=True)
class StaleNonce:
    """A request answered an older response; only its subscription change counts."""

    type_url: str
    nonce: str


@dataclass(frozen=True, slots=True)
class SubscriptionChanged:
    """The set of names (or wildcard) this stream wants for a type changed."""

    type_url: str
    added: frozenset[str]
    removed: frozenset[str]
    wildcard: bool


@dataclass(frozen=True, slots=True)
class WildcardRefused:
    """The client asked for every resource of a type served by name only; nothing is sent."""

    type_url: str


StreamEvent = Acked | Nacked | StaleNonce | SubscriptionChanged | WildcardRefused
