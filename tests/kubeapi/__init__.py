"""A small Kubernetes API server for tests, spoken to with the real client.

`KubeAPIServer` (server.py) serves list/watch/CRUD/TokenReview over HTTP the way
kube-apiserver does, wiring together the store (store.py), routing (routing.py),
lists (lists.py), watches (watches.py), metadata-only answers (metadata.py),
object requests (objects.py), TokenReview (tokens.py) and injected faults
(faults.py). `write_kubeconfig` (kubeconfig.py) points a client at it;
`python -m tests.kubeapi` runs it standalone (__main__.py).
"""

from .kubeconfig import write_kubeconfig
from .routing import RequestRecord
from .server import KubeAPIServer
from .store import ApiError
from .tokens import TokenIdentity, TokenReviewRecord

__all__ = [
    "ApiError",
    "KubeAPIServer",
    "RequestRecord",
    "TokenIdentity",
    "TokenReviewRecord",
    "write_kubeconfig",
]
