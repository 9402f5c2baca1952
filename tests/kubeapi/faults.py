"""Faults the test API server injects on a test's say-so: `Faults`.

Owns the switches that make the server misbehave the way a real one can: watches
dropped abruptly or ended cleanly, history compacted (old resourceVersions get 410),
every watch expired with a 410 ERROR event, list requests failing with 500 or
throttled with 429 and a Retry-After, BOOKMARKs sent at a moment the test picks, a
hostile server's raw bytes on open watches (`stream_raw`: garbage lines, a line that
never ends), requests accepted and never answered (`hang`), and connections closed
with a request unanswered (`drop`).
"""

from __future__ import annotations

import asyncio

from .resources import ResourceType
from .store import ApiError, Store
from .watches import Raw, WatchHub


class Faults:
    """The fault switches over one store and its watches."""

    def __init__(self, store: Store, watches: WatchHub) -> None:
        self.store = store
        self.watches = watches
        self._failing_lists: int | None = 0  # None: every list fails
        self._throttled_lists: tuple[int | None, str] = (0, "")  # (how many, Retry-After)
        self._hung: str | None = None  # requests whose path holds this are never answered
        self._unhung = asyncio.Event()
        self._dropping: tuple[str, int] = ("", 0)  # (path part, how many more to drop)

    def drop_watches(self, abrupt: bool = True) -> None:
        """End every open watch: abrupt cuts the connection (a crashed server),
        otherwise the body ends cleanly (a server-side watch timeout)."""
        self.watches.end_all(abrupt)

    def compact(self) -> None:
        """Forget history up to now: watching or paging from an older RV gets 410."""
        self.store.compact()

    def expire_watches(self) -> None:
        """Compact, then end every open watch with a 410 Expired ERROR event."""
        self.compact()
        self.watches.expire_all()

    def fail_lists(self, n: int | None = None) -> None:
        """The next n list requests (all, if None, until fail_lists(0)) get 500."""
        self._failing_lists = n

    def stream_raw(self, data: bytes, times: int = 1, rtype: ResourceType | None = None) -> int:
        """Write `data`, `times` times over, as it is on every open watch (of rtype):
        whatever a hostile API server would. Returns how many watches got it."""
        return self.watches.stream_raw(Raw(data, times), rtype)

    def send_bookmarks(self) -> None:
        """A BOOKMARK now on every open watch that allowed bookmarks."""
        self.watches.bookmark_all()

    def hang(self, path_part: str | None) -> None:
        """Accept every request whose path contains `path_part` and never answer it
        (None: answer again, the held ones too): a server that hangs on some calls."""
        self._hung = path_part
        if path_part is None:
            self._unhung.set()
            self._unhung = asyncio.Event()

    async def hold_if_hung(self, path: str) -> None:
        """Hold this request while `hang` says so: until the client gives up, the
        server stops or `hang(None)`."""
        if self._hung is not None and self._hung in path:
            await self._unhung.wait()

    def drop(self, path_part: str, times: int = 1) -> None:
        """Close the connection on the next `times` requests whose path contains
        `path_part`, unanswered: a server that crashes, or a balancer that resets it."""
        self._dropping = (path_part, times)

    def drops(self, path: str) -> bool:
        """Whether this request is one that `drop` closes the connection on (counted)."""
        part, left = self._dropping
        if left <= 0 or part not in path:
            return False
        self._dropping = (part, left - 1)
        return True

    def throttle_lists(self, n: int | None, retry_after: str = "1") -> None:
        """The next n list requests (all, if None, until throttle_lists(0)) get 429 with
        `Retry-After: retry_after`, as a real server's while its watch cache fills."""
        self._throttled_lists = (n, retry_after)

    def check_list(self) -> None:
        """Raise the injected 429 or 500 if this list request is one that must fail."""
        left, retry_after = self._throttled_lists
        if left is None or left > 0:
            self._throttled_lists = (None if left is None else left - 1, retry_after)
            message = "storage is (re)initializing"
            raise ApiError(429, "TooManyRequests", message, headers={"Retry-After": retry_after})
        if self._failing_lists is None:
            raise _list_failure()
        if self._failing_lists > 0:
            self._failing_lists -= 1
            raise _list_failure()


def _list_failure() -> ApiError:
    return ApiError(500, "InternalError", "Internal error occurred: injected list failure")
