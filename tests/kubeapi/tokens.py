"""TokenReview for the test API server: `TokenReviewer`.

Owns the service-account tokens a test registers, the
`authentication.k8s.io/v1` TokenReview endpoint that maps a bearer token (and
the audiences asked for) to its service account, and the record of every
review answered, so that a test can tell what pilot asked.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiohttp import web

from .store import Obj, bad_request
from .wire import json_response, read_json

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


@dataclass(frozen=True)
class TokenIdentity:
    """The service account a bearer token belongs to (for TokenReview)."""

    namespace: str
    service_account: str
    audiences: list[str] = field(default_factory=lambda: ["istio-ca"])
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def groups(self) -> list[str]:
        return [
            "system:serviceaccounts",
            f"system:serviceaccounts:{self.namespace}",
            "system:authenticated",
        ]


@dataclass(frozen=True)
class TokenReviewRecord:
    """One TokenReview the server answered."""

    token: str
    audiences: list[str]
    authenticated: bool
    username: str | None


class TokenReviewer:
    """Known tokens, the TokenReview handler, and the reviews it answered."""

    def __init__(self) -> None:
        self.tokens: dict[str, TokenIdentity] = {}
        self.reviews: list[TokenReviewRecord] = []

    def add_service_account_token(
        self, namespace: str, service_account: str, audiences: Iterable[str] = ("istio-ca",)
    ) -> str:
        """A new opaque bearer token TokenReview will map to the service account."""
        token = secrets.token_urlsafe(32)
        self.tokens[token] = TokenIdentity(namespace, service_account, list(audiences))
        return token

    async def handle(self, request: web.Request) -> web.Response:
        """POST of a TokenReview: the review back with its status filled in."""
        review = await read_json(request)
        if not isinstance(review, dict):
            raise bad_request("TokenReview must be an object")
        spec = review.get("spec") or {}
        token = str(spec.get("token") or "")
        wanted = list(spec.get("audiences") or [])
        status = self.review(token, wanted)
        user = status.get("user") or {}
        self.reviews.append(
            TokenReviewRecord(
                token, wanted, bool(status.get("authenticated")), user.get("username")
            )
        )
        body = {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        return json_response(body, 201)

    def review(self, token: str, wanted: list[str]) -> Obj:
        """The TokenReview status for token, asked for the `wanted` audiences."""
        identity = self.tokens.get(token)
        if identity is None:
            return {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
        granted = [a for a in identity.audiences if a in wanted] if wanted else identity.audiences
        if wanted and not granted:
            return {"user": {}, "error": "[invalid bearer token, token audiences is invalid]"}
        return {
            "authenticated": True,
            "user": {
                "username": identity.username,
                "uid": identity.uid,
                "groups": identity.groups,
            },
            "audiences": granted,
        }
