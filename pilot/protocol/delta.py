"""Incremental (delta) stream state machine (DeltaAggregatedResources and Delta*).

Rules it implements (see shared/xds-protocol.md):
- Per-resource versions: a resource is sent only when its version differs from
  what the client holds; `initial_resource_versions` seeds that on reconnect,
  and names the client claims that are gone are sent as removed.
- Every name in `resource_names_subscribe` is answered, even if unchanged; a
  subscribed name that does not exist is answered in `removed_resources` and
  stays subscribed, so it is pushed when it appears.
- Unsubscribing forgets what the client holds, so a resubscribe is answered. A
  name unsubscribed while the stream is wildcard is sent again (or removed).
- ACK/NACK by nonce and `error_detail`; stale nonces still change subscriptions.
- After clusters are sent, their assignments follow even if unchanged.
- Removals last: all additions of a push go out before any removal.
- A new wildcard subscription is answered even when there is nothing to send,
  so that the client's initial fetch completes at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pilot.protocol.answers import FirstAnswer, shared_first_answer
from pilot.protocol.messages import (
    DeltaRequest,
    DeltaResponse,
    ProtocolError,
    ResourceView,
    StreamEvent,
    SubscriptionChanged,
    WildcardRefused,
)
from pilot.protocol.stream import StreamCore, TypeState
from pilot.protocol.subscription import WILDCARD, SubscriptionDiff
from pilot.xds import types
from pilot.xds.resource import Resource


class DeltaStream(StreamCore):
    """Protocol decisions for one incremental stream."""

    def on_request(self, request: DeltaRequest) -> list[StreamEvent]:
        """Take one request; returns what it meant. Responses come from `take_responses`."""
        if not request.type_url:
            raise ProtocolError("DeltaDiscoveryRequest.type_url is empty")
        state = self._type_state(request.type_url)
        first = not state.subscription.seen_request
        events = self._note_reply(
            state, request.response_nonce, state.sent_version, request.error_message
        )
        if not first and not request.subscribe and not request.unsubscribe:
            return events  # a bare ACK or NACK, most requests: the subscription stands
        claimed = _seed(state, request.initial_resource_versions) if first else frozenset()
        diff = state.subscription.update(request.subscribe, request.unsubscribe)
        _apply_unsubscribe(state, request.unsubscribe)
        if diff.wildcard_changed and not state.subscription.wildcard:
            _forget_wildcard_only(state)
        if first or diff.changed:
            events.append(
                SubscriptionChanged(
                    state.type_url, diff.added, diff.removed, state.subscription.wildcard
                )
            )
        if diff.wildcard_refused:
            events.append(WildcardRefused(state.type_url))
        _mark_for_request(state, diff, frozenset(request.subscribe) - claimed)
        if first and state.subscription.wildcard:
            state.answer_required = True  # even "nothing": Envoy waits for a first answer
        return events

    def take_responses(self, view: ResourceView) -> list[DeltaResponse]:
        """Every response owed right now; clears the work it covers.

        Make before break: additions go out in push order before any removal,
        so a client never loses something it is about to need.
        """
        changes: list[_Change] = []
        for state in self._work_order():
            change = self._change(state, view)
            # Only a proxy's own resources are ever in the making (a secret being minted).
            in_the_making = (
                {n for n in state.must_send if view.pending(state.type_url, n)}
                if state.must_send and state.type_url in types.OWNED_TYPES
                else None
            )
            state.clear_work()
            if in_the_making:
                state.must_send |= in_the_making
            if change is not None:
                changes.append(change)
                if state.type_url == types.CLUSTER:
                    self._follow_clusters(r.name for r in change.updated)
        return self._in_order(changes, view)

    def _in_order(self, changes: list[_Change], view: ResourceView) -> list[DeltaResponse]:
        """One response per type, unless its removals must wait for a later type's additions."""
        now: list[DeltaResponse] = []
        deferred: list[_Change] = []
        for i, change in enumerate(changes):
            later_adds = any(c.adds for c in changes[i + 1 :])
            if later_adds and change.removed:
                deferred.append(change)
                if change.adds:
                    now.append(self._emit(change.state, view, change.updated, (), change.first))
            else:
                now.append(
                    self._emit(change.state, view, change.updated, change.removed, change.first)
                )
        now.extend(self._emit(c.state, view, (), c.removed) for c in deferred)
        return now

    def _change(self, state: TypeState, view: ResourceView) -> _Change | None:
        answers = view.first_answers(state.type_url) if not state.sent else None
        if answers is not None and _owed_whole(state):
            first = shared_first_answer(state, view, answers)
            if not first.updated and not first.removed and not state.answer_required:
                return None
            return _Change(state, first.updated, first.removed, state.answer_required, first)
        updated: list[Resource] = []
        removed: list[str] = []
        # Locals, not attribute lookups: a first response walks every name of a type.
        lookup, sent, must_send = view.lookup(state.type_url), state.sent, state.must_send
        wildcard, named = state.subscription.wildcard, state.subscription.names
        for name in state.candidates(view):
            resource = lookup(name)
            wanted = wildcard or name in named
            held = sent.get(name)
            if resource is not None and wanted:
                if held != resource.version or name in must_send:
                    updated.append(resource)
            elif wanted and view.pending(state.type_url, name):
                must_send.add(name)  # answered once made, kept out of clear_work
            elif held is not None or (wanted and name in must_send):
                removed.append(name)
                sent.pop(name, None)
        if not updated and not removed and not state.answer_required:
            return None
        return _Change(state, tuple(updated), tuple(removed), state.answer_required)

    def _emit(
        self,
        state: TypeState,
        view: ResourceView,
        updated: tuple[Resource, ...],
        removed: tuple[str, ...],
        first: FirstAnswer | None = None,
    ) -> DeltaResponse:
        nonce = self._next_nonce(state)
        state.sent_version = view.version(state.type_url)
        shared = first if first is not None and updated is first.updated else None
        if shared is not None:
            state.sent.update(shared.versions)  # one C-level copy, not a loop over names
            state.record_sent(shared.names)
        else:
            for resource in updated:
                state.sent[resource.name] = resource.version
            state.record_sent(tuple(r.name for r in updated))
        wire = shared.wire if shared is not None else None
        return DeltaResponse(state.type_url, state.sent_version, nonce, updated, removed, wire)


@dataclass(frozen=True, slots=True)
class _Change:
    """What one type owes a client: resources to send and names to remove."""

    state: TypeState
    updated: tuple[Resource, ...]
    removed: tuple[str, ...]
    required: bool  # answer even if empty (a new wildcard)
    first: FirstAnswer | None = None  # the shared first answer it is, if it is one

    @property
    def adds(self) -> bool:
        return bool(self.updated) or (self.required and not self.removed)


def _owed_whole(state: TypeState) -> bool:
    """Whether a stream holding nothing is owed its whole subscription, as anyone who
    subscribes alike is: a new wildcard (every name, nothing named to remove), or names
    every one of which must be answered (a first request naming them)."""
    subscription = state.subscription
    if subscription.wildcard:
        return state.pending_all and not state.must_send and not subscription.names
    return bool(subscription.names) and state.must_send >= subscription.names


def _seed(state: TypeState, initial_versions: Mapping[str, str]) -> frozenset[str]:
    """What the client says it already holds after a reconnect."""
    for name, version in initial_versions.items():
        state.sent[name] = version
    state.pending |= initial_versions.keys()
    return frozenset(initial_versions)


def _apply_unsubscribe(state: TypeState, unsubscribe: Iterable[str]) -> None:
    """Forget what the client drops; under a wildcard, it still wants it: answer again."""
    for name in unsubscribe:
        if name == WILDCARD or name not in state.sent:
            continue  # never held: nothing to forget
        if state.subscription.wants(name):
            state.sent[name] = ""
            state.pending.add(name)
        else:
            del state.sent[name]


def _forget_wildcard_only(state: TypeState) -> None:
    """Leaving the wildcard: the client drops what it held only through it."""
    state.sent = {n: s for n, s in state.sent.items() if n in state.subscription.names}


def _mark_for_request(state: TypeState, diff: SubscriptionDiff, asked: frozenset[str]) -> None:
    """Record what this request obliges the server to answer.

    `asked` is every name in `resource_names_subscribe` that the client did not
    claim through `initial_resource_versions`: each is answered, even if held.
    """
    if diff.wildcard_changed and state.subscription.wildcard:
        state.pending_all = True
    named = asked - {WILDCARD}
    state.must_send |= named
    state.pending |= named | diff.added
