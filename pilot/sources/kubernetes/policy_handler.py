"""The shape every Istio security kind's informer handler shares: parse or report, delete.

PeerAuthentication, AuthorizationPolicy and RequestAuthentication are handled
alike: each object the informer sends is parsed; one that parses goes to the
updater; one that does not is the kind's own to answer (`refused`: skipped and
reported, or a deny-everything stand-in); a deletion names the object by its
namespace ("default" when the API server gives none) and name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from pilot.kube.informer import Obj, WatchFaults
from pilot.registry.updater import RegistryUpdater

# What a parser may raise on hostile input. ConfigError and PolicyError, the kinds' own
# one-line refusals, are ValueErrors.
PARSE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, RecursionError)

P = TypeVar("P")


class PolicyHandler(ABC, Generic[P]):
    """Parses each object of one kind into the updater; `refused` answers a bad one."""

    def __init__(self, updater: RegistryUpdater, cluster: str, faults: WatchFaults) -> None:
        self._updater = updater
        self._cluster = cluster
        self._faults = faults

    def upsert(self, obj: Obj) -> None:
        try:
            parsed = self.parse(obj)
        except PARSE_ERRORS as error:
            self.refused(obj, error)
            return
        self.apply(parsed)

    def delete(self, namespace: str, name: str) -> None:
        self.remove(namespace or "default", name)

    @abstractmethod
    def parse(self, obj: Obj) -> P:
        """The object, checked (raises one of PARSE_ERRORS)."""

    @abstractmethod
    def refused(self, obj: Obj, error: BaseException) -> None:
        """What a bad object does: the kind's own policy (skip, or stand in)."""

    @abstractmethod
    def apply(self, parsed: P) -> None:
        """Hand a good object to the updater."""

    @abstractmethod
    def remove(self, namespace: str, name: str) -> None:
        """Drop the object from the updater."""
