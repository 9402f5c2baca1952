"""The /debug page lists every endpoint the debug listener serves, so none is forgotten;
an open page reloads less often when it costs the event loop more.

(The page itself, in a real browser against a real pilot and Envoy, is
tests/integration/test_debug_page.py.)
"""

from __future__ import annotations

from pilot.debug.http import DebugState, debug_routes
from pilot.debug.page import ENDPOINTS, LOOP_SHARE, REFRESH_SECONDS, reload_period
from pilot.debug.proxy_status import LiveProxies
from pilot.push.history import PushHistory
from pilot.registry.index import EndpointIndex
from pilot.xds.cache import ResourceCache

PAGE = {"/", "/debug", "/debug/"}  # the page itself and the way to it
PROBES = {"/ready", "/metrics"}  # served beside /debug on either listener


def test_every_debug_endpoint_is_listed_on_the_page() -> None:
    state = DebugState(LiveProxies([], ResourceCache()), EndpointIndex(), PushHistory())
    served = {route.path for route in debug_routes(state)} - PAGE | PROBES
    listed = {path for path, _about in ENDPOINTS}
    assert served == listed, f"served, not listed: {served - listed}; gone: {listed - served}"


def test_a_page_slow_to_render_is_reloaded_less_often() -> None:
    assert reload_period(0.01) == REFRESH_SECONDS
    slow = reload_period(2.0)
    assert slow > REFRESH_SECONDS and 2.0 / slow <= LOOP_SHARE, "an open page keeps to its share"
