"""API servers that refuse pilot (HTTP 401 or 403), by cluster: one warning when a
cluster's refusals begin, info lines while they last, one info line when they end.

A remote cluster's kubeconfig may carry a token its API server does not accept (401: it
expired, or another cluster signed it) or an account without the rights pilot asks for
(403). Then every informer of that cluster is refused on every retry, and its retries
go on with backoff (the server may accept them later: a role bound, a token renewed).
The operator is told once per cluster, in a warning naming the cluster and the first
refusal (the server's reason: a 403's names the user, the verb and the resource); the
other informers' refusals and the retries are info lines. Once every informer of the
cluster that was refused has had an answer, an info line says so, and a later refusal
is a warning again. `/ready` and `pilot_cluster_synced` say the cluster is failing
all along.
"""

from __future__ import annotations

import logging

log = logging.getLogger("pilot.sources.kubernetes")

REFUSED = frozenset({401, 403})


class Refusals:
    """Which kinds of each cluster are being refused now."""

    def __init__(self) -> None:
        self._refused: dict[str, set[str]] = {}  # cluster id -> kinds refused

    def refused(self, cluster: str, kind: str, what: str, delay: float) -> None:
        """`kind`'s request to `cluster` was refused (`what`: the request and the server's
        reason); it is retried in `delay` seconds."""
        kinds = self._refused.setdefault(cluster, set())
        first = not kinds
        kinds.add(kind)
        where = _where(cluster, kind)
        if first:
            log.warning(
                "%s: the API server refuses pilot's credentials or permissions (%s); its"
                " watches retry with backoff, logged at info level until it answers",
                where,
                what,
            )
        else:
            informer = f"{where} {kind}" if cluster else kind
            log.info("%s: %s; retrying in %.1fs", informer, what, delay)

    def answered(self, cluster: str, kind: str) -> None:
        """`kind`'s request to `cluster` got an answer: its refusal, if any, is over."""
        kinds = self._refused.get(cluster)
        if not kinds or kind not in kinds:
            return
        kinds.discard(kind)
        if not kinds:
            del self._refused[cluster]
            log.info("%s: the API server answers pilot again", _where(cluster, kind))

    def forget(self, cluster: str) -> None:
        """A cluster no longer watched: its next refusals are news."""
        self._refused.pop(cluster, None)


def _where(cluster: str, kind: str) -> str:
    """What a line is about: the cluster, or for pilot's own watches (no cluster id) the kind."""
    return f"cluster {cluster}" if cluster else kind
