"""A small Kubernetes API server for tests, spoken to with the real client.

`KubeAPIServer` (server.py) serves list/watch/CRUD/TokenReview over HTTP the way
kube-apiserver does; `write_kubeconfig` (kubeconfig.py) points a client at it;
`python -m tests.kubeapi` runs it standalone (__main__.py).
"""

from .kubeconfig import write_kubeconfig
from .server import KubeAPIServer, RequestRecord, TokenIdentity, TokenReviewRecord
from .store import ApiError

__all__ = [
    "ApiError",
    "KubeAPIServer",
    "RequestRecord",
    "TokenIdentity",
    "TokenReviewRecord",
    "write_kubeconfig",
]
