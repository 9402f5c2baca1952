"""TokenReview against the cluster's API server: a bearer token becomes a user name.

Kept apart from `authn` because it needs the Kubernetes client, which only
`pilot discovery` in a cluster (or with `--kubeconfig`) loads. An API server that
fails, cannot be reached or does not answer (the client's request timeout) is a
refusal that says so, as any other: the caller's status names it, and it is retried.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubernetes_asyncio import client

from pilot.kube.api_client import CONNECTION_FAILED
from pilot.security.authn import AuthError


class KubernetesTokenReviewer:
    """Implements `TokenReviewer` with the TokenReview API."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._api = client.AuthenticationV1Api(api_client)

    async def review(self, token: str, audiences: Sequence[str]) -> str:
        body = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=list(audiences))
        )
        try:
            result = await self._api.create_token_review(body)
        except client.ApiException as error:
            raise AuthError(f"token review failed: HTTP {error.status} {error.reason}") from error
        except TimeoutError as error:
            raise AuthError("token review failed: the Kubernetes API did not answer") from error
        except CONNECTION_FAILED as error:  # refused or dropped (a timeout is caught above)
            reason = f"no answer from the Kubernetes API ({type(error).__name__})"
            raise AuthError(f"token review failed: {reason}") from error
        status = result.status
        if status is None or not status.authenticated or status.user is None:
            reason = (status.error if status is not None else None) or "token not authenticated"
            raise AuthError(f"token rejected: {reason}")
        if audiences and not set(status.audiences or ()) & set(audiences):
            raise AuthError(f"token is not for audience {', '.join(audiences)}")
        return str(status.user.username)
