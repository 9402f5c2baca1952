"""State-of-the-world stream state machine (StreamAggregatedResources and Stream*).

Rules it implements (see shared/xds-protocol.md):
- Wildcard-capable types (CDS, LDS) always get the full subscribed set; a name
  missing from a response is a deletion on the client. A response goes out on
  the first request, on a subscription change, and whenever the set changes.
- Named types (EDS, SDS) get only what changed or was newly asked for; names
  that do not exist are not answered until they appear.
- ACK/NACK is decided by the nonce and `error_detail`, never by versions; a
  stale nonce still updates the subscription.
- After clusters are (re)sent, their assignments follow even if unchanged.
"""

from __future__ import annotations

from pilot.protocol.answers import FirstAnswer, remembered, shared_first_answer
from pilot.protocol.messages import (
    ProtocolError,
    ResourceView,
    SotwRequest,
    SotwResponse,
    StreamEvent,
    SubscriptionChanged,
    WildcardRefused,
    Wire,
)
from pilot.protocol.stream import StreamCore, TypeState
from pilot.protocol.subscription import SubscriptionDiff
from pilot.xds import types
from pilot.xds.resource import Resource


class SotwStream(StreamCore):
    """Protocol decisions for one state-of-the-world stream."""

    def on_request(self, request: SotwRequest) -> list[StreamEvent]:
        """Take one request; returns what it meant. Responses come from `take_responses`."""
        if not request.type_url:
            raise ProtocolError("DiscoveryRequest.type_url is empty")
        state = self._type_state(request.type_url)
        first = not state.subscription.seen_request
        events = self._note_reply(
            state, request.response_nonce, request.version_info, request.error_message
        )
        diff = state.subscription.replace(request.resource_names)
        self._forget_unsubscribed(state, diff)
        if first or diff.changed:
            events.append(_changed_event(state, diff))
        if diff.wildcard_refused:
            events.append(WildcardRefused(state.type_url))
        _mark_for_request(state, first, diff)
        return events

    def take_responses(self, view: ResourceView) -> list[SotwResponse]:
        """Every response owed right now, in push order; clears the work it covers."""
        responses = []
        for state in self._work_order():
            if state.type_url in types.WILDCARD_TYPES:
                response = self._full_response(state, view)
            else:
                response = self._named_response(state, view)
            state.clear_work()
            if response is not None:
                responses.append(response)
                if state.type_url == types.CLUSTER:
                    self._follow_clusters(r.name for r in response.resources)
        return responses

    def _full_response(self, state: TypeState, view: ResourceView) -> SotwResponse | None:
        full = _full_state(state, view)
        if full.versions == state.sent and not state.answer_required:
            return None
        response = self._respond(state, view, full.updated, full.wire)
        state.sent = dict(full.versions)  # its own: unsubscribing pops from it
        state.record_sent(full.names)
        return response

    def _named_response(self, state: TypeState, view: ResourceView) -> SotwResponse | None:
        answers = view.first_answers(state.type_url) if not state.sent else None
        if answers is not None and _owed_whole(state):
            first = shared_first_answer(state, view, answers)
            if not first.updated:
                return None
            response = self._respond(state, view, first.updated, first.wire)
            state.sent.update(first.versions)
            state.record_sent(first.names)
            return response
        chosen = []
        for name in state.candidates(view):
            resource = view.get(state.type_url, name)
            if resource is None or not state.subscription.wants(name):
                state.sent.pop(name, None)
                continue
            if name in state.must_send or state.sent.get(name) != resource.version:
                chosen.append(resource)
        if not chosen:
            return None
        response = self._respond(state, view, tuple(chosen))
        for resource in chosen:
            state.sent[resource.name] = resource.version
        state.record_sent(tuple(r.name for r in chosen))
        return response

    def _respond(
        self,
        state: TypeState,
        view: ResourceView,
        resources: tuple[Resource, ...],
        wire: Wire | None = None,
    ) -> SotwResponse:
        nonce = self._next_nonce(state)
        state.sent_version = view.version(state.type_url)
        return SotwResponse(state.type_url, state.sent_version, nonce, resources, wire)


def _full_state(state: TypeState, view: ResourceView) -> FirstAnswer:
    """Everything a wildcard-capable type's subscription holds now: the same for every
    stream that subscribes alike, so shared through the view's memo where it has one."""
    key = ("full", state.subscription.wildcard, state.subscription.names)

    def work_out() -> FirstAnswer:
        wanted = sorted(state.wanted_now(view))
        return FirstAnswer.of(tuple(_existing(view, state.type_url, wanted)), ())

    return remembered(view.first_answers(state.type_url), key, work_out)


def _owed_whole(state: TypeState) -> bool:
    """A stream holding nothing is owed every name it subscribes to that exists (its first
    request named them all), as anyone who subscribes alike is."""
    names = state.subscription.names
    return bool(names) and not state.subscription.wildcard and state.must_send >= names


def _mark_for_request(state: TypeState, first: bool, diff: SubscriptionDiff) -> None:
    """Record what this request obliges the server to answer."""
    if state.type_url in types.WILDCARD_TYPES:
        if first or diff.changed:
            state.answer_required = True
        return
    if diff.wildcard_changed and state.subscription.wildcard:
        state.sent.clear()
        state.pending_all = True
    state.must_send |= diff.added
    state.pending |= diff.added


def _changed_event(state: TypeState, diff: SubscriptionDiff) -> SubscriptionChanged:
    return SubscriptionChanged(
        state.type_url, diff.added, diff.removed, state.subscription.wildcard
    )


def _existing(view: ResourceView, type_url: str, names: list[str]) -> list[Resource]:
    found = (view.get(type_url, name) for name in names)
    return [r for r in found if r is not None]
