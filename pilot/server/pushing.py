"""What the gRPC shell needs of the push pipeline, and nothing more.

A stream joins and leaves, reports its subscription events, asks whether a
resource it wants is still being made (a certificate being minted), waits for
the first full state, takes a slot to build and write what it owes from the view
the pipeline gives it, and writes under the send timeout. The FetchClusters call
reads the shared clusters. The shell never reaches into the pipeline's cache,
slots or deadlines: `pilot.push.pipeline.Pipeline` implements this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Protocol

from pilot.protocol.messages import StreamEvent
from pilot.push.pipeline import Subscriber
from pilot.xds.cache import Flavors, ProxyView
from pilot.xds.proxy import ProxyKey


class Pushing(Protocol):
    """The pipeline, as streams and unary calls use it."""

    @property
    def served_types(self) -> frozenset[str]: ...

    # Set once the first full state is built: streams answer nothing before.
    @property
    def ready(self) -> asyncio.Event: ...

    def join(self, subscriber: Subscriber) -> None: ...

    def leave(self, subscriber: Subscriber) -> None: ...

    def on_events(self, subscriber: Subscriber, events: Iterable[StreamEvent]) -> list[str]:
        """The names the events asked for that no generator makes."""
        ...

    def in_the_making(self, type_url: str, name: str, proxy: ProxyKey) -> bool: ...

    def view(self, subscriber: Subscriber) -> ProxyView: ...

    def shared_view(self, flavors: Flavors) -> ProxyView:
        """The shared resources of these flavors, for a caller that is no stream."""
        ...

    def push_slot(self) -> AbstractAsyncContextManager[object]:
        """One of the slots that bound the responses built and written at once."""
        ...

    def writing(
        self, writer: Hashable, on_timeout: Callable[[], None]
    ) -> AbstractContextManager[None]:
        """A write in flight: `on_timeout` if it outlives the send timeout."""
        ...
