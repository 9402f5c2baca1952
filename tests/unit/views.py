"""An in-memory ResourceView for driving the protocol machines without a server."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection

from pilot.xds import types
from pilot.xds.cache import AnswerMemo, FirstAnswers
from pilot.xds.resource import Resource


class FakeView:
    """Resources by (type, name) with a version per type, as the cache keeps them."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, Resource]] = {}
        self.versions: dict[str, int] = {}
        self.in_the_making: dict[str, set[str]] = {}
        self.memos: dict[str, AnswerMemo] = {}
        self.share_answers = True  # as the cache does, for every type but secrets

    def put(self, type_url: str, name: str, content: str) -> Resource:
        resource = Resource.from_payload(type_url, name, content.encode())
        self.tables.setdefault(type_url, {})[name] = resource
        self.versions[type_url] = self.versions.get(type_url, 0) + 1
        return resource

    def delete(self, type_url: str, name: str) -> None:
        self.tables.get(type_url, {}).pop(name, None)
        self.versions[type_url] = self.versions.get(type_url, 0) + 1

    def get(self, type_url: str, name: str) -> Resource | None:
        return self.tables.get(type_url, {}).get(name)

    def lookup(self, type_url: str) -> Callable[[str], Resource | None]:
        return functools.partial(self.get, type_url)

    def names(self, type_url: str) -> Collection[str]:
        return self.tables.get(type_url, {}).keys()

    def version(self, type_url: str) -> str:
        return str(self.versions.get(type_url, 0))

    def pending(self, type_url: str, name: str) -> bool:
        return name in self.in_the_making.get(type_url, set())

    def first_answers(self, type_url: str) -> FirstAnswers | None:
        if not self.share_answers or type_url in types.OWNED_TYPES:
            return None
        version = self.versions.get(type_url, 0)
        memo = self.memos.get(type_url)
        if memo is None or memo.version != version:
            memo = self.memos[type_url] = AnswerMemo(version)
        return FirstAnswers(memo, None)


def view_with(*names: str) -> FakeView:
    """A view holding a cluster and an assignment for each name."""
    view = FakeView()
    for name in names:
        view.put(types.CLUSTER, name, f"cluster {name}")
        view.put(types.ENDPOINT, name, f"endpoints {name} v1")
    return view
