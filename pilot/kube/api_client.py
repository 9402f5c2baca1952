"""The Kubernetes API client pilot builds: every request it makes has an end.

kubernetes_asyncio's requests wait for ever unless the caller names a timeout
(aiohttp's `ClientTimeout()` with nothing set). An API server that accepts a
request and never answers would then hold its caller for ever: a token review
and the stream waiting on it, a Lease renewal, the Lease's release on the way
out (pilot ignored SIGTERM so). Every client pilot makes, for the local cluster
and for remote ones, is a `BoundedApiClient`: a request that names no timeout of
its own gets REQUEST_TIMEOUT. Lists and watches name their own.

`API_FAILED` is what a request through it raises when the API server refuses it,
fails, times out or drops the connection: whoever retries an API call catches
all of these. A dropped connection is an `aiohttp.ClientError` that is not an
`OSError` (ServerDisconnectedError), so catching `ApiException` and `OSError`
alone lets it through.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from kubernetes_asyncio import client

REQUEST_TIMEOUT = 30.0  # seconds, for a request whose caller named none
# No answer: refused, dropped or timed out (TimeoutError is an OSError).
CONNECTION_FAILED: tuple[type[Exception], ...] = (OSError, aiohttp.ClientError)
API_FAILED: tuple[type[Exception], ...] = (client.ApiException, *CONNECTION_FAILED)


class BoundedApiClient(client.ApiClient):
    """`client.ApiClient`, with REQUEST_TIMEOUT for requests that name no timeout."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("_request_timeout"):
            kwargs["_request_timeout"] = REQUEST_TIMEOUT
        return super().request(method, url, *args, **kwargs)
