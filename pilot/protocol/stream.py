"""What SotW and delta streams share: per-type state, nonces, ACK/NACK, push marking.

A stream holds one `TypeState` per type URL the client asked for. Work is kept
as *marks* (names to reconsider, names that must be answered) rather than as
queued responses, so pending work per stream is bounded by the number of names
and always resolves against the latest resources: latest state wins.

A NACK rejects what the client names in its message, having applied the rest,
when its words say so (`rejections`: Envoy's listeners and clusters); else every
name the response carried. Each rejected name keeps the words for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from pilot.protocol.messages import Acked, Nacked, ResourceView, StaleNonce, StreamEvent
from pilot.protocol.rejections import Rejection, read_rejection
from pilot.protocol.subscription import Subscription, SubscriptionDiff
from pilot.xds import types

MAX_UNACKED = 32  # responses remembered apart while a client ACKs none of them


@dataclass(slots=True)
class TypeState:
    """One stream's view of one type: subscription, outstanding work, replies."""

    type_url: str
    subscription: Subscription = field(default_factory=Subscription)
    pending: set[str] = field(default_factory=set)
    pending_all: bool = False
    must_send: set[str] = field(default_factory=set)
    answer_required: bool = False
    # What the client holds, as far as this stream knows: name -> version. Which
    # response carried each name is kept only until the client answers (`unacked`):
    # one entry per name, not an object, since 1,000 clients x 1,000 names add up.
    sent: dict[str, str] = field(default_factory=dict)
    unacked: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    # Names whose last sent version the client rejected, each with that NACK worded for
    # it (what Envoy said of the name, or of the whole response). Only a later response
    # carrying the name, ACKed, clears one: an ACK of other names does not.
    rejected: dict[str, Nacked] = field(default_factory=dict)
    nonce: str = ""
    nonce_seq: int = 0
    sent_version: str = ""
    acked_seq: int = 0
    acked_version: str = ""
    nack: Nacked | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.pending or self.pending_all or self.must_send or self.answer_required)

    def record_sent(self, names: tuple[str, ...]) -> None:
        """The names of the response just sent (under `nonce_seq`), until it is answered.

        A client that never ACKs cannot grow this: past MAX_UNACKED responses the
        two oldest merge under the newer sequence (a name may then look unACKed
        for a response longer than it is, never ACKed when it is not).
        """
        self.unacked.append((self.nonce_seq, names))
        if len(self.unacked) > MAX_UNACKED:
            (_, older), (seq, newer) = self.unacked[:2]
            self.unacked[:2] = [(seq, older + newer)]

    def settle(self, nack: Nacked | None, rejection: Rejection | None = None) -> None:
        """The client answered the latest response: accepted (`nack` None) or rejected.

        Every name still unanswered shares that fate, unless `rejection` says which
        names the client rejected (each with its own words) and that it applied the
        others. Rejections of names the stream no longer holds are dropped, so
        `rejected` stays within `sent`.
        """
        if nack is None and not self.rejected:  # the usual ACK: nothing to clear
            self.unacked.clear()
            return
        answered = self.unanswered()
        self.unacked.clear()
        blamed = rejection.blamed if rejection is not None else {}
        applied = nack is None or (rejection is not None and rejection.partial)
        for name in answered:
            why = blamed.get(name)
            if why is not None and nack is not None:
                self.rejected[name] = Nacked(
                    nack.type_url, nack.nonce, nack.rejected_version, why, (name,)
                )
            elif applied:
                self.rejected.pop(name, None)
            elif nack is not None:
                self.rejected[name] = nack
        self.rejected = {n: r for n, r in self.rejected.items() if n in self.sent}

    def unanswered(self) -> set[str]:
        """Every name carried by a response the client has not answered yet."""
        return {name for _, names in self.unacked for name in names}

    def sent_seq(self, name: str) -> int:
        """The sequence of the last unanswered response that carried `name` (0: none)."""
        for seq, names in reversed(self.unacked):
            if name in names:
                return seq
        return 0

    def clear_work(self) -> None:
        self.pending.clear()
        self.pending_all = False
        self.must_send.clear()
        self.answer_required = False

    def candidates(self, view: ResourceView) -> list[str]:
        """Names to reconsider now, in a stable order."""
        names = set(self.pending) | self.must_send
        if self.pending_all:
            names |= self.subscription.names | self.sent.keys()
            if self.subscription.wildcard:
                names |= set(view.names(self.type_url))
        return sorted(names)

    def wanted_now(self, view: ResourceView) -> set[str]:
        """Every name this stream subscribes to that exists right now."""
        names = {n for n in self.subscription.names if view.get(self.type_url, n) is not None}
        if self.subscription.wildcard:
            names |= set(view.names(self.type_url))
        return names


class StreamCore:
    """Per-type bookkeeping common to both wire variants; subclasses build responses."""

    def __init__(self) -> None:
        self._types: dict[str, TypeState] = {}
        self._nonce_seq = 0

    # -- queries -------------------------------------------------------------

    def state(self, type_url: str) -> TypeState | None:
        return self._types.get(type_url)

    def type_urls(self) -> list[str]:
        return list(self._types)

    def subscriptions(self) -> list[tuple[str, AbstractSet[str]]]:
        """Per type, the names subscribed to by name (wildcards aside)."""
        return [(type_url, state.subscription.names) for type_url, state in self._types.items()]

    @property
    def has_work(self) -> bool:
        return any(s.has_work for s in self._types.values())

    def owes_now(self, in_the_making: Callable[[str, str], bool]) -> bool:
        """Whether `take_responses` may answer anything now: work other than a proxy's own
        names still being made (`in_the_making(type_url, name)`: a secret being minted),
        which no response can carry until they are made, and their making wakes it."""
        for state in self._types.values():
            if not state.has_work:
                continue
            type_url = state.type_url
            if state.pending_all or state.answer_required or type_url not in types.OWNED_TYPES:
                return True
            if not all(in_the_making(type_url, name) for name in state.pending | state.must_send):
                return True
        return False

    def wants(self, type_url: str, name: str) -> bool:
        state = self._types.get(type_url)
        return state is not None and state.subscription.wants(name)

    # -- inputs from the server side -------------------------------------------

    def on_change(self, type_url: str, names: Iterable[str]) -> bool:
        """Resources of a type changed or went away; returns True if this stream cares."""
        state = self._types.get(type_url)
        if state is None or not state.subscription.seen_request:
            return False
        wanted = {n for n in names if state.subscription.wants(n) or n in state.sent}
        state.pending |= wanted
        return bool(wanted)

    def on_full_change(self, type_url: str) -> bool:
        """Reconsider every name of a type (e.g. after a full rebuild)."""
        state = self._types.get(type_url)
        if state is None or not state.subscription.seen_request:
            return False
        state.pending_all = True
        return True

    def force(self, type_url: str, names: Iterable[str]) -> bool:
        """Answer these names even if the client holds their current version.

        Envoy keeps a (re)sent Cluster warming until it receives its
        ClusterLoadAssignment, even an unchanged one.
        """
        state = self._types.get(type_url)
        if state is None:
            return False
        forced = {n for n in names if state.subscription.wants(n)}
        state.must_send |= forced
        return bool(forced)

    # -- helpers for subclasses ---------------------------------------------

    def _type_state(self, type_url: str) -> TypeState:
        state = self._types.get(type_url)
        if state is None:
            subscription = Subscription(wildcard_allowed=type_url not in types.NAMED_ONLY_TYPES)
            state = self._types[type_url] = TypeState(type_url, subscription)
        return state

    def _next_nonce(self, state: TypeState) -> str:
        self._nonce_seq += 1
        state.nonce_seq = self._nonce_seq
        state.nonce = str(self._nonce_seq)
        return state.nonce

    def _work_order(self) -> Iterator[TypeState]:
        """Types with work, in push order; re-checked as earlier types add work."""
        for type_url in sorted(self._types, key=types.push_rank):
            state = self._types[type_url]
            if state.has_work:
                yield state

    def _follow_clusters(self, cluster_names: Iterable[str]) -> None:
        if types.ENDPOINT in self._types:
            self.force(types.ENDPOINT, cluster_names)

    @staticmethod
    def _note_reply(
        state: TypeState, nonce: str, version: str, error_message: str | None
    ) -> list[StreamEvent]:
        """Match a request against the latest response of its type (ACK, NACK, stale)."""
        if not nonce:
            return []
        if nonce != state.nonce:
            return [StaleNonce(state.type_url, nonce)]
        if error_message is not None:
            rejection = read_rejection(state.type_url, error_message, state.unanswered())
            state.nack = Nacked(
                state.type_url,
                nonce,
                state.sent_version,
                rejection.message,
                tuple(sorted(rejection.blamed)),
                rejection.partial,
            )
            state.settle(state.nack, rejection)
            return [state.nack]
        state.nack = None
        state.acked_seq = state.nonce_seq
        state.acked_version = version
        state.settle(None)  # the latest response is ACKed: so is every one before it
        return [Acked(state.type_url, nonce, version)]

    @staticmethod
    def _forget_unsubscribed(state: TypeState, diff: SubscriptionDiff) -> None:
        for name in diff.removed:
            if not state.subscription.wildcard:
                state.sent.pop(name, None)
