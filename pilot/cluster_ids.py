"""The one rule for cluster ids, wherever one comes from (`--cluster-id`,
`--remote-kubeconfig ID=PATH`, a multi-cluster Secret's data key).

A cluster id is 1-63 letters, digits, '.', '_' or '-', starting with a letter or
a digit (Istio's ids are DNS-like labels). The id reaches log lines, `/ready`,
metric labels and Envoy metadata, so nothing else is taken: no control
character (a newline would forge a `/ready` line), no '/', no space.
"""

from __future__ import annotations

import re

CLUSTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
RULE = "a cluster id is 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
_QUOTED_CHARS = 40  # of a refused name shown in a log line


def is_cluster_id(text: str) -> bool:
    """True when `text` follows the rule."""
    return CLUSTER_ID.fullmatch(text) is not None


def quoted(text: str) -> str:
    """`text` safe for a log line: repr (control characters escaped), cut short."""
    if len(text) <= _QUOTED_CHARS:
        return repr(text)
    return f"{text[:_QUOTED_CHARS]!r}... ({len(text)} characters)"
